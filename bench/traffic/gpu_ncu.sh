#!/usr/bin/env bash
# On the GPU machine: Nsight Compute DRAM and L2 bytes of one forward, for ioattn's CUDA kernel
# (bench/gpu/bench_gpu_forward: B = 16384 / S, hidden 2048, bf16) and for PyTorch's unfused MATH
# path (bench/traffic/sdpa_math.py: B = 1, hidden 2048, bf16), written as samples for
# bench/traffic/samples/gpu/ (one file per point: the "ioattn-ncu" line, then ncu's CSV).
#   OUT=dir [IMPLS="ioattn math abi"] [SEQLENS="1024 ... 16384"] [MATH_SEQLENS="1024 ... 16384"]
#     [MATH_POINTS="S:D:CAUSAL ..."] [ABI_POINTS="B:H:S:D:CAUSAL ..."] [SPLIT=1]
#     bench/traffic/gpu_ncu.sh BIN_DIR
# BIN_DIR holds bench_gpu_forward (and, for abi, gpu_abi_run) and the shared libraries they need.
# IMPLS picks what is measured: ioattn's kernel, PyTorch's MATH path (the default: both), and
# `abi`: one ioattn_forward call through the public C ABI with the library's own plan
# (bench/traffic/gpu_abi_run, every kernel of the process summed), at ABI_POINTS (default: six
# shapes with B = 1 among them, whose planned grids may leave SMs idle); SEQLENS the ioattn
# grid's lengths; MATH_POINTS, when given, replaces MATH's grid by those points. SPLIT=1 adds the L2 tag-stage
# lookups split by source (the SMs' L1/TEX, the other L2 partition through the fabric) and by
# operation, and the L1/TEX side's global and local sectors (loads, stores, cp.async: the CUDA
# kernel spills) and those it sends to and takes from the crossbar, for docs/traffic.md's
# "What lts__t_bytes counts": each name is kept only where this ncu knows it (--query-metrics),
# so a counter missing on another chip costs a row, not the run. ncu's default cache control
# flushes the caches before the profiled kernel (and before each replay pass), so every
# measurement starts cold, as the model.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "${1:?usage: gpu_ncu.sh BIN_DIR}" && pwd)
out=${OUT:-$here/samples/gpu}
mkdir -p "$out"
impls=" ${IMPLS:-ioattn math} "
export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
command -v ncu >/dev/null || PATH=$PATH:/usr/local/cuda/bin
metrics=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
if [[ ${SPLIT:-0} == 1 ]]; then
  known=$(ncu --query-metrics 2>/dev/null; ncu --query-metrics-mode suffix --query-metrics 2>/dev/null)
  grep -oE '(lts__t_(sectors|requests)|l1tex__m|l1tex__t_sectors_pipe_lsu_mem_(global|local))[a-z0-9_]*' <<<"$known" | sort -u >"$out/ncu_l2_metrics.list"
  # A query that printed nothing usable: keep the two per-source counters NVIDIA documents for
  # the partitioned L2 (GA100 and later) rather than drop the split.
  grep -q lts__t_bytes <<<"$known" || known="lts__t_sectors_srcunit_tex lts__t_sectors_srcunit_ltcfabric"
  for m in lts__t_sectors lts__t_requests lts__t_sectors_srcunit_tex lts__t_sectors_srcunit_ltcfabric \
    lts__t_sectors_srcnode_gpc lts__t_sectors_srcnode_fbp lts__t_sectors_op_read lts__t_sectors_op_write \
    lts__t_sectors_srcunit_tex_op_read lts__t_sectors_srcunit_tex_op_write lts__t_sectors_srcunit_tex_op_atom \
    lts__t_sectors_srcunit_tex_op_red lts__t_sectors_srcunit_tex_lookup_hit lts__t_sectors_srcunit_tex_lookup_miss \
    lts__t_sectors_srcunit_ltcfabric_op_read lts__t_sectors_srcunit_ltcfabric_op_write \
    lts__t_sectors_srcunit_ltcfabric_lookup_hit lts__t_sectors_srcunit_ltcfabric_lookup_miss \
    lts__t_requests_srcunit_tex lts__t_requests_srcunit_ltcfabric \
    l1tex__m_xbar2l1tex_read_sectors l1tex__m_l1tex2xbar_write_sectors l1tex__t_sectors_pipe_lsu_mem_global_op_ld \
    l1tex__t_sectors_pipe_lsu_mem_global_op_st l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts \
    l1tex__m_xbar2l1tex_read_sectors_mem_lg_op_ld l1tex__m_xbar2l1tex_read_sectors_mem_global_op_ldgsts_cache_access \
    l1tex__m_l1tex2xbar_write_sectors_mem_lg_op_st l1tex__t_sectors_pipe_lsu_mem_local_op_ld \
    l1tex__t_sectors_pipe_lsu_mem_local_op_st; do
    if grep -qE "(^|[[:space:]])$m\.sum([[:space:]]|$)" <<<"$known" || grep -qE "(^|[[:space:]])$m([[:space:]]|$)" <<<"$known"; then
      metrics+=,$m.sum
    else
      echo "ncu does not know $m: left out"
    fi
  done
fi
ncu_base=(ncu --clock-control none --metrics "$metrics" --csv --print-units base)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.log"
ncu --version | tail -1 | tee -a "$out/device.log"
echo "metrics: $metrics" | tee -a "$out/device.log"
for d in 64 128; do
  [[ $impls == *" ioattn "* ]] || break
  for c in 0 1; do
    for s in ${SEQLENS:-1024 2048 4096 8192 16384}; do
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
math_points=${MATH_POINTS:-}
if [[ -z $math_points ]]; then
  for d in 64 128; do
    for c in 0 1; do
      for s in ${MATH_SEQLENS:-1024 2048 4096 8192 16384}; do math_points+=" $s:$d:$c"; done
    done
  done
fi
for point in $math_points; do
  [[ $impls == *" math "* ]] || break
  IFS=: read -r s d c <<<"$point"
  name=math_s${s}_d${d}$([[ $c == 1 ]] && echo _causal)
  {
    echo "ioattn-ncu impl=math batch=1 heads=$((2048 / d)) seqlen=$s dim=$d causal=$c dtype=bf16"
    "${ncu_base[@]}" --nvtx --nvtx-include "sdpa/" python3 "$here/sdpa_math.py" --seqlen "$s" --dim "$d" --causal "$c" 2>&1
  } >"$out/$name.txt"
  echo "$name done"
done
for point in ${ABI_POINTS:-1:16:1024:128:0 1:16:1024:128:1 1:16:4096:128:0 1:32:4096:64:0 4:16:4096:128:0 1:16:16384:128:0}; do
  [[ $impls == *" abi "* ]] || break
  IFS=: read -r b h s d c <<<"$point"
  name=abi_b${b}_h${h}_s${s}_d${d}$([[ $c == 1 ]] && echo _causal)
  {
    echo "ioattn-ncu impl=ioattn batch=$b heads=$h seqlen=$s dim=$d causal=$c dtype=bf16 via=abi"
    "${ncu_base[@]}" "$bin/gpu_abi_run" --batch "$b" --heads "$h" --seqlen "$s" --dim "$d" --causal "$c" 2>&1
  } >"$out/$name.txt"
  echo "$name done"
done
