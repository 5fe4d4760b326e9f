#!/usr/bin/env bash
# Fills .deps/ (git-ignored) with what scripts/gpu_run.sh needs on the GPU machine, which reaches
# no package registry: Debian 12's Highway, nlohmann-json and OpenBLAS as .deb files (that
# machine's Ubuntu image lacks Highway 1.0), and the pure-Python wheels its python3 lacks
# (nanobind and scikit-build-core to build the extension and the stable-ABI wheel, pytest), and
# the pinned nvidia-cutlass wheel whose headers the sm_90a kernels build on (scripts/gpu_run.sh
# unpacks it there). Run here, then carry ".deps/debs" and ".deps/wheels" in the device call
# (.deps/cutlass, the unpacked headers, is 27 MB of the 64 MB a call carries).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.deps/debs" "$root/.deps/wheels"
(cd "$root/.deps/debs" && apt-get download libhwy-dev libhwy1 nlohmann-json3-dev libopenblas-dev \
  libopenblas-pthread-dev libopenblas0 libopenblas0-pthread)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 -d "$root/.deps/wheels" nanobind scikit-build-core pathspec pytest pluggy \
  iniconfig packaging
python3 -m pip download -q --no-deps --only-binary=:all: -d "$root/.deps/wheels" \
  "nvidia-cutlass==$("$root/scripts/cutlass_headers.sh" --version)"
