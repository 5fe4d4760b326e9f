#!/usr/bin/env bash
# The CPU ceilings report (bench/results/cpu-ceilings.md): builds the three binaries and runs
#   1. `ioattn bench --ceilings` with AVX-512 and with AVX2 where the machine runs them (the
#      clock, the FMA probe against cores x FMA/cycle x lanes x 2 x clock, the read methods);
#   2. bench_cpu's ceilings and headline forward (f32, S = 4096, D = 128 causal and not, D = 64);
#   3. bench_decode's ceilings and headline (f16 cache, B = 8, Sk = 32k);
#   4. `ioattn tune` into a scratch file, then the headline forward and decode again under it, so
#      the untuned and the calibrated figures come from one run (issue 26 reports both).
# IOATTN_BUILD_DIR (default build-ceilings) names the build: configured CPU-only when it has no
# cache yet, an existing one (the GPU machine's build-device) kept as configured. IOATTN_NUM_THREADS
# the threads (default all cores). Output goes to stdout; the results file records what it was run on.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${IOATTN_BUILD_DIR:-build-ceilings}
step() { printf '\n==== %s ====\n' "$*"; }

[[ -f "$build/CMakeCache.txt" ]] ||
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DIOATTN_CUDA=OFF -DIOATTN_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --target ioattn_cli bench_cpu bench_decode

step "machine"
lscpu | grep -E 'Model name|CPU family|Model:|Stepping|Thread|Core|Socket|Hypervisor|L1d|L2|L3' || true
uptime

# A target the machine or build lacks is refused before anything is measured.
for target in AVX3 AVX2; do
  step "ceilings, $target"
  "$build/tools/ioattn" bench --ceilings --target "$target" || echo "($target: not run here)"
done

forward='flash/D:128/S:4096/causal:./threads:[0-9]+/f32|flash/D:64/S:4096/causal:0/threads:[0-9]+/f32'
decode='BM_Decode/f16/B:8/Sk:32768/'
step "bench_cpu: ceilings and the headline forward"
"$build/bench/bench_cpu" --benchmark_filter="ceiling|$forward"

step "bench_decode: ceilings and the headline decode"
"$build/bench/bench_decode" --benchmark_filter="ceiling|$decode"

tune_file=$(mktemp --suffix=.json)
trap 'rm -f "$tune_file"' EXIT
step "ioattn tune"
"$build/tools/ioattn" tune --tune-file "$tune_file"
step "calibrated: the headline forward and decode beside their ceilings"
IOATTN_TUNE_FILE=$tune_file "$build/bench/bench_cpu" --benchmark_filter="ceiling/fma|$forward"
IOATTN_TUNE_FILE=$tune_file "$build/bench/bench_decode" --benchmark_filter="ceiling|$decode"
