#!/usr/bin/env bash
# One call on the GPU machine: build, GPU tests, compute-sanitizer memcheck and racecheck, and the
# benchmark beside PyTorch's SDPA backends. Everything printed also lands in $OUT (default
# ./out): gpu_test.txt, sanitize.txt, bench_ioattn.jsonl, bench_table.md, bench_peers.json.
#
#   scripts/gpu_run.sh                  build here (Debian packages carried in .deps/debs are
#                                       unpacked into a prefix: Highway, nlohmann_json, OpenBLAS)
#   IOATTN_PREBUILT=DIR scripts/gpu_run.sh
#                                       run binaries built elsewhere: DIR holds test_gpu_forward,
#                                       bench_gpu_forward and the shared libraries they need
#   IOATTN_STEPS="test sanitize bench"  which steps to run (default: all three)
#   IOATTN_MAX_SEQLEN=16384             longest benchmark sequence
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
steps=${IOATTN_STEPS:-test sanitize bench}
max_seqlen=${IOATTN_MAX_SEQLEN:-16384}
status=0

if [[ -n "${IOATTN_PREBUILT:-}" ]]; then
  bin=$(cd "$IOATTN_PREBUILT" && pwd)
  export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  test_bin=$bin/test_gpu_forward
  bench_bin=$bin/bench_gpu_forward
else
  prefix=/tmp/ioattn-deps
  mkdir -p "$prefix"
  for deb in "$root"/.deps/debs/*.deb; do
    [[ -e "$deb" ]] && dpkg -x "$deb" "$prefix"
  done
  libdir=$prefix/usr/lib/x86_64-linux-gnu
  export LD_LIBRARY_PATH="$libdir:$libdir/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  build=$root/build-device
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DIOATTN_CUDA=ON \
    -DIOATTN_CUDA_ARCHITECTURES=90a -DIOATTN_THREADING=openmp -DCMAKE_PREFIX_PATH="$prefix/usr" \
    -DBLAS_LIBRARIES="$libdir/openblas-pthread/libopenblas.so" 2>&1 | tee "$OUT/build.txt" | tail -3
  ninja -C "$build" test_gpu_forward bench_gpu_forward 2>&1 | tee -a "$OUT/build.txt" | tail -5 || exit 1
  test_bin=$build/tests/test_gpu_forward
  bench_bin=$build/bench/gpu/bench_gpu_forward
fi

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/device.txt"
git -C "$root" log -1 --format='commit %H %cd' 2>/dev/null | tee -a "$OUT/device.txt"

if [[ " $steps " == *" test "* ]]; then
  echo "== GPU tests"
  "$test_bin" 2>&1 | tee "$OUT/gpu_test.txt" | tail -25 || status=1
fi

if [[ " $steps " == *" sanitize "* ]]; then
  echo "== compute-sanitizer over the [sanitize] cases"
  : >"$OUT/sanitize.txt"
  for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$test_bin" "[sanitize]" >>"$OUT/sanitize.txt" 2>&1
    rc=$?
    echo "$tool: exit $rc" | tee -a "$OUT/sanitize.txt"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test cases" "$OUT/sanitize.txt" | tail -2
    [[ $rc -eq 0 ]] || status=1
  done
fi

if [[ " $steps " == *" bench "* ]]; then
  echo "== benchmark"
  "$bench_bin" --max-seqlen "$max_seqlen" | tee "$OUT/bench_ioattn.jsonl" || status=1
  PYTHONUNBUFFERED=1 python3 "$root/bench/gpu/compare.py" --ours "$OUT/bench_ioattn.jsonl" \
    --json "$OUT/bench_peers.json" --max-seqlen "$max_seqlen" | tee "$OUT/bench_table.md" || status=1
fi
exit $status
