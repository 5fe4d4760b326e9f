#!/usr/bin/env bash
# On the GPU machine: Nsight Compute DRAM and L2 bytes of one forward, for ioattn's CUDA kernel
# (bench/gpu/bench_gpu_forward: B = 16384 / S, hidden 2048, bf16) and for PyTorch's unfused MATH
# path (bench/traffic/sdpa_math.py: B = 1, hidden 2048, bf16), written as samples for
# bench/traffic/samples/gpu/ (one file per point: the "ioattn-ncu" line, then ncu's CSV).
#   OUT=dir [IMPLS="ioattn math"] [MATH_SEQLENS="1024 ... 16384"] bench/traffic/gpu_ncu.sh BIN_DIR
# BIN_DIR holds bench_gpu_forward and the shared libraries it needs. IMPLS picks what is measured:
# ioattn's kernel, PyTorch's MATH path, or both (the default). ncu's default cache control
# flushes the caches before the profiled kernel, so every measurement starts cold, as the model.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "${1:?usage: gpu_ncu.sh BIN_DIR}" && pwd)
out=${OUT:-$here/samples/gpu}
mkdir -p "$out"
impls=" ${IMPLS:-ioattn math} "
export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
command -v ncu >/dev/null || PATH=$PATH:/usr/local/cuda/bin
metrics=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
ncu_base=(ncu --clock-control none --metrics "$metrics" --csv --print-units base)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.log"
ncu --version | tail -1 | tee -a "$out/device.log"
for d in 64 128; do
  [[ $impls == *" ioattn "* ]] || break
  for c in 0 1; do
    for s in 1024 2048 4096 8192 16384; do
      name=ioattn_s${s}_d${d}$([[ $c == 1 ]] && echo _causal)
      {
        echo "ioattn-ncu impl=ioattn batch=$((16384 / s)) heads=$((2048 / d)) seqlen=$s dim=$d causal=$c dtype=bf16"
        # The first of the binary's 6 launches: the kernel is the forward's only launch.
        "${ncu_base[@]}" --launch-count 1 "$bin/bench_gpu_forward" --seqlen "$s" --head-dim "$d" --causal "$c" --iters 1 2>&1
      } >"$out/$name.txt"
      grep -h '"dram__bytes_read.sum"' "$out/$name.txt" | tail -1 | cut -c1-60 >/dev/null || echo "$name: no ncu rows"
      echo "$name done"
    done
  done
done
for d in 64 128; do
  [[ $impls == *" math "* ]] || break
  for c in 0 1; do
    for s in ${MATH_SEQLENS:-1024 2048 4096 8192 16384}; do
      name=math_s${s}_d${d}$([[ $c == 1 ]] && echo _causal)
      {
        echo "ioattn-ncu impl=math batch=1 heads=$((2048 / d)) seqlen=$s dim=$d causal=$c dtype=bf16"
        "${ncu_base[@]}" --nvtx --nvtx-include "sdpa/" python3 "$here/sdpa_math.py" --seqlen "$s" --dim "$d" --causal "$c" 2>&1
      } >"$out/$name.txt"
      echo "$name done"
    done
  done
done
