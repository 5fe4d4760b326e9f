#!/usr/bin/env bash
# Fills .deps/ (git-ignored) with what scripts/gpu_run.sh needs on the GPU machine, which reaches
# no package registry: Debian 12's Highway, nlohmann-json and OpenBLAS as .deb files (that
# machine's Ubuntu image lacks Highway 1.0), and the pure-Python wheels its python3 lacks
# (nanobind and scikit-build-core to build the extension and the stable-ABI wheel, pytest), and
# the pinned nvidia-cutlass wheel whose headers the sm_90a kernels build on (scripts/gpu_run.sh
# unpacks it there). Run here, then carry ".deps/debs" and ".deps/wheels" in the device call
# (.deps/cutlass, the unpacked headers, is 27 MB of the 64 MB a call carries). For the CPU peers
# on that host (bench/peers/run.sh with LLAMA_CPP_TARBALL), also ".deps/peers": the llama.cpp
# the llama-cpp-python sdist vendors, less its models, docs, tools, tests and GPU backends
# (4 MB of the sdist's 74).
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
# shellcheck disable=SC2016 # the pattern matches run.sh's literal ${...}
lcp=$(sed -n 's/^LCP_VER=\${LLAMA_CPP_PYTHON_VERSION:-\([0-9.]*\)}$/\1/p' "$root/bench/peers/run.sh")
mkdir -p "$root/.deps/peers"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-binary llama-cpp-python --no-deps "llama-cpp-python==$lcp" -d "$tmp"
tar -xzf "$tmp/llama_cpp_python-$lcp.tar.gz" -C "$tmp"
v=llama_cpp_python-$lcp/vendor/llama.cpp
tar -C "$tmp" -cJf "$root/.deps/peers/llama-cpp-src.tar.xz" \
  --exclude="$v/models" --exclude="$v/docs" --exclude="$v/tools" --exclude="$v/benches" --exclude="$v/tests" \
  --exclude="$v/ggml/src/ggml-cuda" --exclude="$v/ggml/src/ggml-vulkan" --exclude="$v/ggml/src/ggml-sycl" \
  --exclude="$v/ggml/src/ggml-metal" --exclude="$v/ggml/src/ggml-opencl" --exclude="$v/ggml/src/ggml-cann" \
  --exclude="$v/ggml/src/ggml-musa" "$v" "llama_cpp_python-$lcp/CHANGELOG.md"
