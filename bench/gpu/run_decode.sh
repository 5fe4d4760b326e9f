#!/usr/bin/env bash
# One call on the GPU machine for the split-KV decode: GPU tests, compute-sanitizer (memcheck,
# racecheck, synccheck) over the [sanitize] cases, the decode benchmark beside PyTorch's SDPA
# backends, and Nsight Compute's DRAM bytes for the Sk = 128k shapes. Binaries are built
# elsewhere (this machine's glibc is older than the device's) and carried:
#
#   IOATTN_PREBUILT=DIR bench/gpu/run_decode.sh
#       DIR holds test_gpu_inference, test_gpu_forward, bench_gpu_decode and the shared
#       libraries they need (libhwy.so.1); run from the repository root.
#   IOATTN_STEPS="test sanitize bench ncu"   which steps to run (default: all four)
#
# Everything printed also lands in $OUT (default ./out).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$root/out}
mkdir -p "$OUT"
bin=$(cd "${IOATTN_PREBUILT:?set IOATTN_PREBUILT to the folder of prebuilt binaries}" && pwd)
export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
steps=${IOATTN_STEPS:-test sanitize bench ncu}
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/device.txt"

if [[ " $steps " == *" test "* ]]; then
  for t in test_gpu_inference test_gpu_forward; do
    "$bin/$t" >"$OUT/$t.txt" 2>&1
    rc=$?
    echo "== $t: exit $rc"
    tail -2 "$OUT/$t.txt"
    [[ $rc -eq 0 ]] || status=1
  done
fi

if [[ " $steps " == *" sanitize "* ]]; then
  for tool in memcheck racecheck synccheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/test_gpu_inference" "[sanitize]" >"$OUT/sanitize_$tool.txt" 2>&1
    rc=$?
    echo "== $tool: exit $rc"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test case" "$OUT/sanitize_$tool.txt" | tail -2
    [[ $rc -eq 0 ]] || status=1
  done
fi

if [[ " $steps " == *" bench "* ]]; then
  "$bin/bench_gpu_decode" | tee "$OUT/bench_decode.jsonl" || status=1
  PYTHONUNBUFFERED=1 python3 "$root/bench/gpu/compare_decode.py" --ours "$OUT/bench_decode.jsonl" \
    --json "$OUT/bench_decode_peers.json" | tee "$OUT/bench_decode_table.md" || status=1
fi

if [[ " $steps " == *" ncu "* ]]; then
  # --clock-control none: the card runs at its own clocks, as in the timed runs.
  for hkv in 32 8; do
    ncu --clock-control none -k regex:decode_kernel -c 1 \
      --metrics dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
      "$bin/bench_gpu_decode" --seqlen-k 131072 --kv-heads "$hkv" --iters 1 --warmup 0 >"$OUT/ncu_decode_hkv$hkv.txt" 2>&1 || status=1
    echo "== ncu Hkv=$hkv"
    grep -E "dram__|gpu__time|sm__warps" "$OUT/ncu_decode_hkv$hkv.txt"
  done
fi
exit $status
