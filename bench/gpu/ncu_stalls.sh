#!/usr/bin/env bash
# On the GPU machine: Nsight Compute issue-stall breakdown, tensor-pipe and MUFU use of ioattn's
# forward kernel beside a PyTorch SDPA backend's kernels on the same shape (hidden 2048,
# B = 16384 / S, bf16), to find where the remaining gap to that peer goes.
#   bench/gpu/ncu_stalls.sh BIN_DIR [S D CAUSAL [flash|cudnn]]
# BIN_DIR holds bench_gpu_forward + its libs; the peer defaults to flash (FlashAttention-2). On
# Hopper the wgmma pipe (sm__pipe_tensor_op_gmma_*) is reported where this ncu knows it: the hmma
# counter does not see wgmma.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "${1:?usage: ncu_stalls.sh BIN_DIR [S D CAUSAL [flash|cudnn]]}" && pwd)
s=${2:-4096} d=${3:-128} causal=${4:-0} peer=${5:-flash}
export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
stalls=""
for r in barrier long_scoreboard short_scoreboard math_pipe_throttle mio_throttle wait not_selected selected \
         no_instruction dispatch_stall lg_throttle branch_resolving membar drain misc imc_miss tex_throttle; do
  stalls="$stalls,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
metrics="sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
metrics="$metrics,sm__cycles_elapsed.avg,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active"
metrics="$metrics,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
metrics="$metrics,smsp__inst_executed_op_ldsm.sum,gpu__time_duration.sum$stalls"
gmma=sm__pipe_tensor_op_gmma_cycles_active
ncu --query-metrics 2>/dev/null | grep -q "^$gmma" && metrics="$metrics,$gmma.avg.pct_of_peak_sustained_active"
# Each kernel's header line (its name), then its metrics as "name value".
filter() { grep -E "^\s+(sm|smsp|launch|gpu)__|Context [0-9]+, Stream" | awk '/Context/ {print "--", $1; next} {print $1, $NF}'; }
echo "=== ioattn S=$s D=$d causal=$causal"
ncu --clock-control none --metrics "$metrics" --launch-count 1 \
  "$bin/bench_gpu_forward" --seqlen "$s" --head-dim "$d" --causal "$causal" --iters 1 2>&1 | filter
echo "=== PyTorch SDPA $peer S=$s D=$d causal=$causal (every kernel of one call)"
ncu --clock-control none --metrics "$metrics" --nvtx --nvtx-include "sdpa/" \
  python3 "$here/sdpa_one.py" "$s" "$d" "$causal" "$peer" 2>&1 | filter
