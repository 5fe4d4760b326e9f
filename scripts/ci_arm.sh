#!/usr/bin/env bash
# AArch64: cross-builds the library, the CLI and the CPU tests with Debian's cross compiler
# against arm64 multiarch packages, and runs the tests under qemu-user. On AArch64 the kernels are
# compiled for NEON (AArch64's baseline, so Highway builds no scalar fallback there) and for the
# fixed-width SVE_256 and SVE2_128 targets (CMakeLists.txt says why not the scalable ones); qemu's
# SVE vector length picks which one runs. Installs what it needs, as root.
set -euo pipefail
cd "$(dirname "$0")/.."
IOATTN_CI_T0=${IOATTN_CI_T0:-$(date +%s)}  # scripts/test.sh's start when it calls this
step() { printf '\n==== %s (at %d s) ====\n' "$*" "$(($(date +%s) - IOATTN_CI_T0))"; }

step "AArch64 cross build, tests under qemu-user"
# No package-list refresh after adding the architecture: setup.sh refreshes before it installs
# anything it finds missing.
dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
scripts/setup.sh g++-aarch64-linux-gnu qemu-user libhwy-dev:arm64 libopenblas-dev:arm64 libgomp1:arm64
# Debian's catch2 package is not multi-arch: installing catch2:arm64 would replace the host's, so
# its files are unpacked beside the build instead.
deps="$PWD/build-arm/deps"
if [[ ! -f "$deps/usr/lib/cmake/Catch2/Catch2Config.cmake" ]]; then
  mkdir -p "$deps"
  (cd "$deps" && apt-get download catch2:arm64 && dpkg -x catch2_*_arm64.deb .)
fi

cmake -S . -B build-arm -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
  -DCMAKE_PREFIX_PATH="$deps/usr" -DIOATTN_CUDA=OFF -DIOATTN_THREADING=openmp -DIOATTN_SANITIZE= \
  -DIOATTN_SIMD_TARGETS=all -DIOATTN_BUILD_TESTS=ON -DIOATTN_BUILD_BENCH=OFF -DIOATTN_FUZZ=OFF
# Everything whose code differs by architecture: the kernels and their dispatch, the threading,
# the host detection, the C ABI. Left to the x86 stages (the same scalar code on every
# architecture, 5.5 minutes of CI under qemu): the CLI suites (test_cli, test_contract_cli), the
# planner, traffic model and outline (test_planner, test_traffic, test_traffic_measured,
# test_outline) and the .npy reader (test_npy).
arm_tests="test_cpu_forward test_cpu_edge test_cpu_threads test_cpu_decode test_inference_cpu test_api_validation
           test_contract_sweep test_concurrency test_faults test_fuzz_regressions test_hardware"
# shellcheck disable=SC2086 # one target per word
cmake --build build-arm -j "$(nproc)" --target ioattn_cli $arm_tests
ctest --test-dir build-arm --output-on-failure --no-tests=error -j "$(nproc)" -R "^($(echo $arm_tests | tr ' ' '|'))\$"
qemu-aarch64 -L / build-arm/tools/ioattn hw | grep -q "Highway target NEON" ||
  { echo "ci_arm: the aarch64 host profile does not report the NEON target" >&2; exit 1; }

# The SVE targets: qemu's default SVE length (512 bits) matches neither, so the runs above were
# NEON. A 128-bit length dispatches SVE2_128 (Neoverse V2, N2) and 256 bits SVE_256 (Neoverse V1);
# the suites that loop over targets run that one alone (IOATTN_TEST_TARGETS), NEON having run
# above. Emulated SVE is slow, so SVE2_128 skips the profile-plan sweep (NEON ran those plans at
# the same vector width) and SVE_256 runs the non-finite and edge sweeps only. Each argument
# after the target is a test binary, optionally followed by its Catch2 filter.
sve_run() {
  local bytes=$1 target=$2
  shift 2
  QEMU_CPU="max,sve-default-vector-length=$bytes" qemu-aarch64 -L / build-arm/tools/ioattn hw |
    grep -q "Highway target $target" || { echo "ci_arm: SVE length $bytes bytes does not dispatch $target" >&2; exit 1; }
  local t cmd
  for t in "$@"; do
    read -r -a cmd <<<"$t"
    echo "-- $t on $target"
    QEMU_CPU="max,sve-default-vector-length=$bytes" IOATTN_SOURCE_DIR="$PWD" IOATTN_TEST_TARGETS=$target \
      qemu-aarch64 -L / "build-arm/tests/${cmd[0]}" "${cmd[@]:1}"
  done
}
sve_run 16 SVE2_128 test_cpu_edge "test_cpu_forward ~[plans]" test_cpu_decode
sve_run 32 SVE_256 test_cpu_edge
