#!/usr/bin/env bash
# From nothing to `ioattn demo`: install dependencies, build Release, run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DIOATTN_BUILD_TESTS=OFF -DIOATTN_BUILD_BENCH=OFF
cmake --build build --target ioattn_cli
build/tools/ioattn demo "$@"
