#!/usr/bin/env bash
# From nothing to `ioattn demo`: install dependencies, build Release, run the demo. The build has
# a directory of its own (build-demo), since its cache turns the tests off and scripts/test.sh
# must never inherit that.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release -DIOATTN_BUILD_TESTS=OFF -DIOATTN_BUILD_BENCH=OFF
cmake --build build-demo --target ioattn_cli
build-demo/tools/ioattn demo "$@"
