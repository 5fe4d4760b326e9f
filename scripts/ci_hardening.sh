#!/usr/bin/env bash
# CI's hardening stage (scripts/test.sh calls it after the ASan+UBSan run):
#   1. ThreadSanitizer over the CPU tests that exercise concurrency and the C ABI;
#   2. each libFuzzer harness for a bounded time from the checked-in corpus, after replaying
#      every recorded finding.
# Works on a fresh Debian 12: installs clang and compiler-rt (libFuzzer) from apt when missing.
#
# IOATTN_FUZZ_SECONDS (default 20) bounds each harness; IOATTN_TSAN_TESTS lists the test
# executables run under TSan (default below; "all" builds and runs the whole suite).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
fuzz_seconds=${IOATTN_FUZZ_SECONDS:-20}
# The CPU suite's large numeric grids gain nothing from TSan (they run one caller) and run
# 5-15x slower under it; these are the tests where threads meet.
tsan_tests=${IOATTN_TSAN_TESTS:-test_concurrency test_faults test_api_validation test_fuzz_regressions test_inference_cpu test_cpu_threads}
IOATTN_CI_T0=${IOATTN_CI_T0:-$(date +%s)}  # scripts/test.sh's start when it calls this
step() { printf '\n==== %s (at %d s) ====\n' "$*" "$(($(date +%s) - IOATTN_CI_T0))"; }

have_libfuzzer() {
  local probe
  probe=$(mktemp -d)
  printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$probe/p.cc"
  clang++ -fsanitize=fuzzer,address,undefined "$probe/p.cc" -o "$probe/p" >/dev/null 2>&1
  local rc=$?
  rm -rf "$probe"
  return $rc
}

if ! command -v clang++ >/dev/null 2>&1 || ! have_libfuzzer; then
  step "installing clang and compiler-rt (libFuzzer, sanitizer runtimes)"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clang libclang-rt-14-dev
  have_libfuzzer || { echo "clang cannot link -fsanitize=fuzzer even after installing compiler-rt" >&2; exit 1; }
fi

step "ThreadSanitizer: $tsan_tests"
# Sequential threading: libgomp and Debian's libtbb are not built with TSan, so races inside
# their schedulers are invisible and their hand-offs between threads show up as false reports.
# The library's shared state (dispatch, planner, hardware detection, thread-local errors) is
# exercised by the tests' own 16+ concurrent callers instead. Races do not depend on the SIMD
# target, so only this CPU's best is compiled (IOATTN_SIMD_TARGETS=native); the ASan stage runs
# every target.
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIOATTN_SANITIZE=thread \
  -DIOATTN_SIMD_TARGETS=native -DIOATTN_THREADING=sequential -DIOATTN_CUDA=OFF -DIOATTN_BUILD_TESTS=ON -DIOATTN_BUILD_BENCH=OFF -DIOATTN_FUZZ=OFF
if [ "$tsan_tests" = all ]; then
  cmake --build build-tsan -j "$jobs"
  tsan_regex='.*'
else
  # shellcheck disable=SC2086 # one target per word
  cmake --build build-tsan -j "$jobs" --target $tsan_tests
  tsan_regex="^($(echo $tsan_tests | tr ' ' '|'))\$"
fi
# TSan's shadow memory needs a fixed layout; kernels with 32-bit mmap randomization break it,
# so ASLR is turned off for the test processes.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" IOATTN_CONCURRENCY_SECONDS=${IOATTN_CONCURRENCY_SECONDS:-5} \
  setarch "$(uname -m)" -R ctest --test-dir build-tsan --output-on-failure --no-tests=error -j "$jobs" -R "$tsan_regex"

step "libFuzzer harnesses, ${fuzz_seconds}s each"
# The kernels of this CPU's best target only (IOATTN_SIMD_TARGETS=native), the ones a fuzzing run
# dispatches to: compiling the other four copies with clang's instrumentation took 2 of this
# stage's 4 minutes on 2 cores.
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIOATTN_FUZZ=ON \
  -DIOATTN_SIMD_TARGETS=native -DIOATTN_SANITIZE= -DIOATTN_CUDA=OFF -DIOATTN_THREADING=sequential -DIOATTN_BUILD_TESTS=OFF -DIOATTN_BUILD_BENCH=OFF
cmake --build build-fuzz -j "$jobs" --target fuzz_api fuzz_npy fuzz_args
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for name in api npy args; do
  bin=build-fuzz/fuzz/fuzz_$name
  if [ -d "fuzz/regressions/$name" ] && [ -n "$(ls -A "fuzz/regressions/$name")" ]; then
    "$bin" "fuzz/regressions/$name"/* 2>&1 | tail -n 1
  fi
  # New inputs go to a scratch corpus; the checked-in one stays small and is only read.
  mkdir -p "$work/$name"
  if ! "$bin" -max_total_time="$fuzz_seconds" -print_final_stats=1 -max_len=4096 -timeout=10 \
    -artifact_prefix="$work/$name-" "$work/$name" "fuzz/corpus/$name" >"$work/$name.log" 2>&1; then
    tail -n 60 "$work/$name.log"
    mkdir -p build-fuzz/findings
    cp "$work/$name"-* build-fuzz/findings/ 2>/dev/null || true
    echo "fuzz_$name found a failure; the input is in build-fuzz/findings/ (add it to fuzz/regressions/$name/)" >&2
    exit 1
  fi
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added)' "$work/$name.log" |
    sed "s/^/fuzz_$name /"
done

step "hardening passed"
