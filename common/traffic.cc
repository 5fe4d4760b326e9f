#include "common/traffic.h"

#include <algorithm>

#include "common/int_math.h"
#include "common/masking.h"
#include "common/traffic_parts.h"

namespace ioattn {
namespace traffic_detail {

UnitWalk walk_unit(const Problem& pr, int64_t group, int64_t bq, int64_t bkv, bool align_to_end) {
  UnitWalk w;
  const int64_t right = effective_window_right(pr.causal, pr.window_right);
  const int64_t positions = std::max<int64_t>(1, bq / std::max<int64_t>(group, 1));
  int64_t union_begin = pr.seqlen_k, union_end = 0;
  for (int64_t p0 = 0; p0 < pr.seqlen_q; p0 += positions) {
    const int64_t p1 = std::min(pr.seqlen_q, p0 + positions) - 1;
    // The band's ends are monotone in the query position, so the block's keys run from the
    // first position's begin to the last position's end.
    const int64_t begin = visible_keys(p0, pr.seqlen_q, pr.seqlen_k, pr.window_left, right).begin;
    const int64_t end = visible_keys(p1, pr.seqlen_q, pr.seqlen_k, pr.window_left, right).end;
    if (end <= begin) continue;
    int64_t first = begin, last = end, blocks = ceil_div(end - begin, bkv);
    if (!align_to_end) {
      first = begin / bkv * bkv;
      last = std::min(pr.seqlen_k, round_up(end, bkv));
      blocks = ceil_div(end, bkv) - begin / bkv;
    }
    ++w.q_blocks;
    w.steps += blocks;
    w.kv_rows_sum += last - first;
    union_begin = std::min(union_begin, first);
    union_end = std::max(union_end, last);
  }
  w.kv_rows_union = std::max<int64_t>(0, union_end - union_begin);
  return w;
}

Sizes sizes_of(const Problem& pr) {
  Sizes s;
  const double bh = double(pr.batch) * double(pr.heads_q);
  s.q = bh * double(pr.seqlen_q) * double(pr.head_dim) * dtype_bytes(pr.dtype);
  s.o = bh * double(pr.seqlen_q) * double(pr.head_dim_v) * dtype_bytes(pr.dtype);
  s.lse = pr.with_lse ? bh * double(pr.seqlen_q) * 4.0 : 0.0;
  s.kv_row = double(pr.head_dim + pr.head_dim_v) * dtype_bytes(pr.kv_dtype);
  s.s_head = double(pr.seqlen_q) * double(pr.seqlen_k) * 4.0;
  s.s_fp32 = bh * s.s_head;
  return s;
}

void set_traffic(BoundaryTraffic* b, double fr, double fw, double sr, double sw) {
  b->flash_read_bytes = fr;
  b->flash_write_bytes = fw;
  b->standard_read_bytes = sr;
  b->standard_write_bytes = sw;
  b->flash_bytes = fr + fw;
  b->standard_bytes = sr + sw;
}

double shared_capacity(const MemoryLevel& l) { return double(l.size_bytes) / std::max(1, l.partitions); }

}  // namespace traffic_detail

StandardPasses cpu_baseline_passes() {
  StandardPasses p;
  p.s_reads = 2;   // the softmax's read (its in-place write finds the lines present), the PV sgemm's read
  p.s_writes = 2;  // the beta = 0 zeroing pass, then the QK^T accumulation into S
  p.staged_fp32_copies = true;
  p.name = "project baseline (bench/lib: fp32 copies, sgemm beta=0 zeroing + QK^T, in-place softmax, sgemm PV)";
  return p;
}

StandardPasses pytorch_math_passes(bool causal) {
  if (!causal) return pytorch_math_passes();
  // Nsight Compute's kernel list (bench/traffic/samples/gpu/math_*_causal.txt) shows what the mask
  // adds: a boolean tril of Sq x Sk built once, turned into one fp32 additive mask (kernels 4-8),
  // and one elementwise kernel per call that reads S and the mask, broadcast over the heads, and
  // writes the masked S: one more read and one more write of S, plus the mask read once per head
  // where it does not stay in L2 (67 MB at S=4096, read 16 times: the 7.4 reads measured there)
  // and once where it does (4 MB at S=1024: the 71.5 MB that kernel read at H=16, S=1024, D=128).
  StandardPasses p = pytorch_math_passes();
  p.s_reads += 1;
  p.s_writes += 1.05;  // and the fp32 mask's writes, 4-6% of an S at S=4096 over 16 heads
  p.broadcast_mask_bytes = 4;
  p.name = "PyTorch MATH, is_causal (the non-causal passes plus the additive mask's pass)";
  return p;
}

StandardPasses pytorch_math_passes() {
  StandardPasses p;
  p.s_reads = 5.45;
  p.s_writes = 3.71;
  p.fp32_upcast = true;
  p.name = "PyTorch MATH (calibrated on the H=16, S=4096, D=128 Nsight Compute measurement)";
  return p;
}

TrafficReport predict_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw) {
  return predict_traffic(pr, plan, hw, StandardPasses{});
}

TrafficReport predict_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw,
                              const StandardPasses& standard) {
  return predict_traffic(pr, plan, hw, standard, TrafficOptions{});
}

TrafficReport predict_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw,
                              const StandardPasses& standard, const TrafficOptions& options) {
  TrafficReport rep = hw.kind == DeviceKind::gpu && hw.levels.size() >= 3
                          ? traffic_detail::gpu_traffic(pr, plan, hw, standard)
                          : traffic_detail::cpu_traffic(pr, plan, hw, standard, options);
  rep.hardware = hw.name;
  if (!rep.levels.empty()) {
    rep.flash_dram_bytes = rep.levels.back().flash_bytes;
    rep.standard_dram_bytes = rep.levels.back().standard_bytes;
  }
  rep.flops = forward_flops(pr);
  double peak_gflops = hw.fma_gflops_per_core * hw.cores;
  if (hw.kind == DeviceKind::gpu && pr.dtype != DType::f32 && hw.tensor_tflops > 0)
    peak_gflops = hw.tensor_tflops * 1e3;
  const double bw = hw.dram().bandwidth_gbs * 1e9;
  const double compute_s = peak_gflops > 0 ? rep.flops / (peak_gflops * 1e9) : 0.0;
  rep.flash_roofline_s = std::max(compute_s, bw > 0 ? rep.flash_dram_bytes / bw : 0.0);
  rep.standard_roofline_s = std::max(compute_s, bw > 0 ? rep.standard_dram_bytes / bw : 0.0);
  return rep;
}

}  // namespace ioattn
