#!/usr/bin/env bash
# From nothing to a passed test suite: install dependencies, check the source layout rules
# (scripts/check_layout.py) and formatting (scripts/check_format.sh), then build and test every
# configuration CI guards: the Release build (OpenMP, CUDA compiled when nvcc is present: GPU
# tests skip visibly without a device), the oneTBB threading backend, ASan+UBSan, ThreadSanitizer
# and bounded fuzzing (scripts/ci_hardening.sh), the AArch64 cross build under qemu-user with its
# SVE targets (scripts/ci_arm.sh), and the installed package consumed by a tiny CMake project. The
# Release stage builds the tests against Debian 12's Catch2 2, the ASan stage against Catch2 3.
#
# Every configure names each option the stage relies on, so a build directory left by another
# command (scripts/demo.sh's tests-off cache was one) cannot turn a stage into a no-op, and every
# ctest fails when it runs no test.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's header says when it began, counted from the start of this script (the stage
# scripts it calls count from the same moment), so CI's log shows where its time goes.
export IOATTN_CI_T0=${IOATTN_CI_T0:-$(date +%s)}
scripts/setup.sh
jobs=$(nproc)
step() { printf '\n==== %s (at %d s) ====\n' "$*" "$(($(date +%s) - IOATTN_CI_T0))"; }

step "source layout: file and function sizes, include edges, clang-format"
# Before any build: no file in common/, cpu/ or gpu/ over 700 lines nor function over 120; common/
# includes nothing from cpu/ or gpu/, tools/ nothing from cpu/, gpu/, bench/ or fuzz/; every C,
# C++ and CUDA source as clang-format leaves it.
python3 scripts/check_layout.py
scripts/setup.sh clang-format
scripts/check_format.sh

step "Release, OpenMP, CUDA=AUTO"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DIOATTN_CUDA=AUTO -DIOATTN_THREADING=openmp -DIOATTN_SIMD_TARGETS=all \
  -DIOATTN_SANITIZE= -DIOATTN_BUILD_TESTS=ON -DIOATTN_BUILD_BENCH=ON -DIOATTN_FUZZ=OFF
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure --no-tests=error -j "$jobs"

# Plans follow the caches, so a machine with other caches runs other blocks, splits and shapes:
# the whole suite again under the plans of a 512 KiB-L2 AVX2 server core and of a small Arm core
# (IOATTN_HW_PROFILE, docs/api.md), whatever machine CI runs on.
for profile in zen3 rpi5; do
  step "Release suite under the $profile profile's plans"
  IOATTN_HW_PROFILE=$profile ctest --test-dir build --output-on-failure --no-tests=error -j "$jobs"
done

step "oneTBB threading backend"
cmake -S . -B build-tbb -G Ninja -DCMAKE_BUILD_TYPE=Release -DIOATTN_THREADING=tbb -DIOATTN_CUDA=OFF -DIOATTN_SIMD_TARGETS=all \
  -DIOATTN_SANITIZE= -DIOATTN_BUILD_TESTS=ON -DIOATTN_BUILD_BENCH=OFF -DIOATTN_FUZZ=OFF
# Only the tests whose code paths go through the threading runtime: the rest of the suite is
# identical under either backend, and skipping it keeps CI's 2-core budget for the sanitizers.
tbb_tests="test_cpu_forward test_cpu_edge test_cpu_threads test_cpu_decode test_inference_cpu test_concurrency test_faults test_api_validation"
# shellcheck disable=SC2086 # one target per word
cmake --build build-tbb -j "$jobs" --target $tbb_tests
ctest --test-dir build-tbb --output-on-failure --no-tests=error -j "$jobs" -R "^(${tbb_tests// /|})\$"

step "ASan + UBSan, tests against Catch2 3"
# Optimized with line tables only (-g1): full debug info doubled this stage's build time on 2 cores.
# Only the SIMD targets this CPU runs are compiled (IOATTN_SIMD_TARGETS=host): the suite runs every
# target the CPU supports either way, and the instrumented copy of the kernels for a target it
# cannot run was a fifth of the stage's compile on an AVX2 machine.
# The whole suite builds and runs here against Catch2 3 (scripts/ci_catch2v3.sh), the Release
# stage's against Debian 12's Catch2 2: both versions are proven without a build of their own.
catch2v3=$(scripts/ci_catch2v3.sh)
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g1 -DIOATTN_SANITIZE=address -DIOATTN_SIMD_TARGETS=host \
  -DIOATTN_CUDA=OFF -DIOATTN_THREADING=openmp -DIOATTN_BUILD_TESTS=ON -DIOATTN_BUILD_BENCH=OFF -DIOATTN_FUZZ=OFF \
  -DCMAKE_PREFIX_PATH="$catch2v3" -DCatch2_DIR="$catch2v3/lib/cmake/Catch2"
grep -q "^Catch2_DIR:[A-Z]*=$catch2v3/lib/cmake/Catch2\$" build-asan/CMakeCache.txt ||
  { echo "test.sh: the ASan stage did not pick Catch2 3 from $catch2v3" >&2; exit 1; }
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure --no-tests=error -j "$jobs"

scripts/ci_hardening.sh

# The AArch64 kernels (NEON), cross-built and run under qemu-user; an Arm host's native build above
# already covers them.
if [[ "$(uname -m)" == x86_64 ]]; then
  scripts/ci_arm.sh
fi

step "Python package: pip install (CPU), pytest with torch and transformers from PyPI"
# A virtual environment of this checkout's own; PyPI's torch wheel (with its CUDA libraries, about
# 3 GB) runs on the CPU here. The build reuses build-python/ between runs; CUDA is left to the GPU
# machine (scripts/gpu_run.sh), which saves this stage the nvcc compile.
python3 -c 'import sysconfig, os, venv; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
  2>/dev/null || scripts/setup.sh python3-dev python3-venv
[[ -x build-pyvenv/bin/python ]] || python3 -m venv build-pyvenv
build-pyvenv/bin/pip install -q --upgrade pip
build-pyvenv/bin/pip install -q numpy pytest torch transformers
build-pyvenv/bin/pip install -q . --config-settings=cmake.define.IOATTN_CUDA=OFF
IOATTN_CLI="$PWD/build/tools/ioattn" build-pyvenv/bin/python -m pytest python/tests -q

step "installed package: find_package(ioattn CONFIG) and pkg-config"
rm -rf build-install-prefix build-consumer
cmake --install build --prefix "$PWD/build-install-prefix"
cmake -S tests/consumer -B build-consumer -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build-install-prefix"
cmake --build build-consumer
LD_LIBRARY_PATH="$PWD/build-install-prefix/lib" build-consumer/consumer
PKG_CONFIG_PATH="$PWD/build-install-prefix/lib/pkgconfig" pkg-config --cflags --libs ioattn

step "all configurations passed"
