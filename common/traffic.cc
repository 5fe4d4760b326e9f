#include "common/traffic.h"

#include <algorithm>
#include <cmath>

#include "common/masking.h"

namespace ioattn {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// How the query blocks of one unit (a K/V stream: one kv head on the CPU, one q head on the
// GPU) walk the key axis. As the CPU kernel packs GQA, a tile holds max(1, block_q / G) query
// positions times the G heads of the kv head. The CPU kernel cuts a tile's visible key range
// into blocks aligned to its end (so it reads exactly the visible keys); the CUDA kernel, like
// FlashAttention-2, aligns key blocks to multiples of block_kv.
struct UnitWalk {
  int64_t q_blocks = 0;     // blocks with at least one visible key
  int64_t steps = 0;        // (query block, key block) pairs visited
  int64_t kv_rows_sum = 0;  // key rows loaded, summed over the query blocks
  int64_t kv_rows_union = 0;  // distinct key rows any block loads
};

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
      last = std::min(pr.seqlen_k, ceil_div(end, bkv) * bkv);
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

struct Sizes {
  double q, o, lse;      // compulsory bytes of the whole problem
  double kv_row;         // bytes of one key row plus one value row, storage dtype
  double s_fp32;         // one fp32 score matrix for all heads
  double s_head;         // one fp32 score matrix of one (batch, q head)
};

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

void set(BoundaryTraffic* b, double fr, double fw, double sr, double sw) {
  b->flash_read_bytes = fr;
  b->flash_write_bytes = fw;
  b->standard_read_bytes = sr;
  b->standard_write_bytes = sw;
  b->flash_bytes = fr + fw;
  b->standard_bytes = sr + sw;
}

// Capacity a level offers to data that all cores read (see MemoryLevel::partitions).
double shared_capacity(const MemoryLevel& l) { return double(l.size_bytes) / std::max(1, l.partitions); }

// ---- CPU ----------------------------------------------------------------------------------
// Flash, innermost boundary (L1d-L2), per (query block, key block) step of one worker: the
// source K/V rows are read and packed to fp32; Q K^T streams K once per query panel; P V
// streams whichever operand does not stay in L1 once per register strip of the other; the score block is written, read and rewritten as P
// by the softmax unless it fits L1; P V likewise; the O accumulator is read and written once
// per step unless it fits L1. Anything that fits in half of L1 (the other half holds the
// micro-kernel's streaming operand) crosses once.
double cpu_flash_scratch_step(const Plan& plan, const Problem& pr, const HardwareProfile& hw, double level_bytes) {
  const double lanes = std::max(4, hw.simd_bits / 32);
  const double dp = plan.head_dim_padded;
  const double dvp = std::ceil(double(pr.head_dim_v) / lanes) * lanes;
  const double bq = plan.block_q, bkv = plan.block_kv, rr = plan.reg_rows, rc = plan.reg_cols;
  const double half = level_bytes / 2;
  const double k_blk = bkv * dp * 4, v_blk = bkv * dvp * 4, q_blk = bq * dp * 4;
  const double s_blk = bq * bkv * 4, o_blk = bq * dvp * 4;
  double bytes = 0;
  if (k_blk + v_blk > half) bytes += k_blk + v_blk;  // the packed copies spill once
  // S^T = K Q^T as the CPU kernel runs it: one panel of reg_cols query rows stays in L1 while
  // the K block streams past it, once per panel.
  bytes += k_blk + rc * dp * 4 <= half ? k_blk + q_blk : std::ceil(bq / rc) * k_blk + q_blk;
  if (s_blk > half) bytes += 3 * s_blk;
  bytes += v_blk + rr * dvp * 4 <= half ? v_blk
                                        : std::min(std::ceil(bq / rr) * v_blk + s_blk, std::ceil(dvp / rc) * s_blk + v_blk);
  if (o_blk > half) bytes += 2 * o_blk;
  return bytes;
}

TrafficReport cpu_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw, const StandardPasses& sp,
                          const TrafficOptions& opt) {
  TrafficReport rep;
  const Sizes sz = sizes_of(pr);
  const int64_t group = pr.heads_kv > 0 ? pr.heads_q / pr.heads_kv : 1;
  const int64_t rows = group * pr.seqlen_q;
  const UnitWalk w = walk_unit(pr, group, std::max(1, plan.block_q), std::max(1, plan.block_kv), true);
  const double units = double(pr.batch) * double(pr.heads_kv);
  const double splits = std::max(1, plan.kv_splits);
  // A split re-reads its query block and writes an (O, m, l) partial that the merge reads back.
  const double q_flash = sz.q * splits;
  const double partials = splits > 1 ? 2.0 * units * double(rows) * splits * (double(pr.head_dim_v) + 2) * 4 : 0.0;
  const double kv_streamed = units * double(w.kv_rows_sum) * sz.kv_row;  // K/V once per query block
  const double kv_once = units * double(w.kv_rows_union) * sz.kv_row;    // K/V once per unit
  const double kv_unit = double(w.kv_rows_union) * sz.kv_row / splits;   // one worker's slice
  const double workers = std::max(1, plan.workers);

  // Standard: one (batch, q head) per worker at a time, S of that head materialized.
  const double kv_head = double(pr.seqlen_k) * sz.kv_row;
  const double kv_std_per_qhead = double(pr.batch) * double(pr.heads_q) * kv_head;
  const double kv_std_per_kvhead = double(pr.batch) * double(pr.heads_kv) * kv_head;
  // The baseline's per-head fp32 copies of Q, K, V and O (StandardPasses::staged_fp32_copies).
  const double copy_head = sp.staged_fp32_copies ? 4.0 * double(pr.seqlen_q * (pr.head_dim + pr.head_dim_v) +
                                                                pr.seqlen_k * (pr.head_dim + pr.head_dim_v))
                                                 : 0.0;
  const double copies = double(pr.batch) * double(pr.heads_q) * copy_head;
  // A cold call's scratch crosses every outer boundary once, on the workers that get work.
  const double active = std::min<double>(workers, std::max<int64_t>(1, plan.work_items > 0 ? plan.work_items : 1));

  // The CPU kernel's head mode (cpu/flash_kernel.cc, DecideShape): when every worker gets two
  // or more whole heads of two or more query blocks each (one worker: any head with two blocks)
  // and no key split, a task is a whole (sequence, kv head) whose K/V is converted once into an
  // fp32 copy ([key][D] and V in 16-column panels) that all its query blocks stream.
  const double lanes_f = std::max(4, hw.simd_bits / 32);
  const double panel_cols = 2 * lanes_f;  // the PV register tile's columns: one V panel
  const double dvq = std::ceil(double(pr.head_dim_v) / panel_cols) * panel_cols;
  const double packed_row = (double(plan.head_dim_padded > 0 ? plan.head_dim_padded : pr.head_dim) + dvq) * 4.0;
  const double head_copy = double(w.kv_rows_union) * packed_row;
  const double block_buffers = 2.0 * double(plan.block_kv) * packed_row;  // double-buffered K/V blocks
  const double tiles = units * double(w.q_blocks);
  const bool head_mode = plan.kv_splits <= 1 && tiles >= 2 * units &&
                         (workers == 1 || units >= 2 * workers) && head_copy <= double(int64_t(64) << 20);
  double prev_flash_kv = kv_streamed, prev_std_kv = kv_std_per_qhead;
  double best_share = 0;  // the largest per-worker share of the levels inside the current boundary
  for (size_t b = 0; b + 1 < hw.levels.size(); ++b) {
    const MemoryLevel& inner = hw.levels[b];
    BoundaryTraffic bt;
    bt.name = inner.name + "-" + hw.levels[b + 1].name;
    const double sharing = std::min<double>(inner.shared_by, workers);
    const double cap = shared_capacity(inner);
    double fr, fw;
    if (b == 0) {
      const double per_unit_steps = double(w.steps);
      const double avg_rows = w.steps > 0 ? double(w.kv_rows_sum) / double(w.steps) : 0.0;
      fr = q_flash + units * per_unit_steps *
                         (avg_rows * sz.kv_row + cpu_flash_scratch_step(plan, pr, hw, double(inner.size_bytes)));
      fw = sz.o + sz.lse + partials / 2;
      fr += partials / 2;
    } else {
      // The K/V slices of the units being processed concurrently (one per worker sharing this
      // level) stay here across the unit's query blocks if they fit next to each worker's
      // scratch. If not, what the scratch leaves of the worker's share still keeps that many
      // bytes of the slice from one query block to the next, and only the rest streams in again:
      // cachegrind shows K/V re-reads 2.85 times per head at S=1024, D=64 over four query
      // blocks, not 4 (the all-or-nothing rule was 25-30% high there; docs/traffic.md).
      const double free_bytes = std::max(0.0, cap / sharing - double(plan.working_set_bytes));
      if (!head_mode) {
        const double kept = kv_unit > 0 ? std::min(1.0, free_bytes / kv_unit) : 1.0;
        const double kv = std::min(prev_flash_kv, kv_once + std::max(0.0, kv_streamed - kv_once) * (1.0 - kept));
        prev_flash_kv = kv;
        fr = q_flash + kv + partials / 2 + (opt.cold_scratch ? active * double(plan.working_set_bytes) : 0.0);
        fw = sz.o + sz.lse + partials / 2;
      } else {
        // Head mode: the caller's K/V is read once per unit and written as one fp32 copy, which
        // every query block then streams; the same "what the scratch leaves" rule says how much
        // of the copy each block still finds here. The per-block buffers are not allocated.
        const double ws = std::max(0.0, double(plan.working_set_bytes) - block_buffers);
        const double left = std::max(0.0, cap / sharing - ws);
        const double kept = head_copy > 0 ? std::min(1.0, left / head_copy) : 1.0;
        fr = q_flash + kv_once + units * double(w.kv_rows_sum) * packed_row * (1.0 - kept) +
             (opt.cold_scratch ? active * (ws + head_copy) : 0.0);
        fw = sz.o + sz.lse + units * head_copy;
      }
      // A working set larger than this level's per-worker share spills: its per-step traffic
      // then crosses this boundary as it crosses L1d-L2. Only if it fits no level between: a
      // working set that stays in L2 never reaches an L3 whose per-core share is smaller
      // (Neoverse V1: 1 MiB L2, 32 MiB L3 over 64 cores).
      best_share = std::max(best_share, cap / sharing);
      if (double(plan.working_set_bytes) > best_share) {
        fr += units * double(w.steps) * cpu_flash_scratch_step(plan, pr, hw, best_share);
      }
    }
    // Standard: S of one head per worker; if those (and the head's K/V) fit this level, the S
    // passes stay inside it; K/V of a kv head is read once for its G q heads if it stays.
    const bool s_resident = sharing * (sz.s_head + kv_head + copy_head) <= cap;
    // At L1d-L2 the two GEMMs also stream their L2-resident operand through L1 once per
    // register-tile panel of the other (GotoBLAS blocking), as the flash kernel's tiles do.
    double gemm_l1 = 0;
    if (b == 0) {
      const double sq = double(pr.seqlen_q), sk = double(pr.seqlen_k), d = double(pr.head_dim), dv = double(pr.head_dim_v);
      const double rr = std::max(1, plan.reg_rows), rc = std::max(1, plan.reg_cols);
      auto gemm = [&](double m, double n, double k) {
        return 4.0 * std::min(m * k * std::ceil(n / rc) + k * n, k * n * std::ceil(m / rr) + m * k);
      };
      gemm_l1 = double(pr.batch) * double(pr.heads_q) * (gemm(sq, sk, d) + gemm(sq, dv, sk));
    }
    const double s_reads = s_resident ? 0.0 : sp.s_reads * sz.s_fp32;
    const double s_writes = s_resident ? 0.0 : sp.s_writes * sz.s_fp32;
    const bool kv_resident = sharing * kv_head <= cap;
    const double kv_std = std::min(prev_std_kv, kv_resident ? kv_std_per_kvhead : kv_std_per_qhead);
    prev_std_kv = kv_std;
    // The copies are written (a write-allocating pass) and read back by the GEMMs or by the
    // final conversion of O; S's passes evict them in between unless S stays. A cold call also
    // fills S and the copies on first touch where they do stay.
    const double copies_crossing = s_resident ? (opt.cold_scratch ? sharing * copy_head : 0.0) : copies;
    const double s_first_touch = s_resident && opt.cold_scratch ? sharing * sz.s_head : 0.0;
    set(&bt, fr, fw, sz.q + kv_std + s_reads + gemm_l1 + copies_crossing,
        sz.o + sz.lse + s_writes + copies_crossing + s_first_touch);
    rep.levels.push_back(bt);
  }
  return rep;
}

// ---- GPU ----------------------------------------------------------------------------------
TrafficReport gpu_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw, const StandardPasses& sp) {
  TrafficReport rep;
  const Sizes sz = sizes_of(pr);
  const UnitWalk w = walk_unit(pr, 1, std::max(1, plan.block_q), std::max(1, plan.block_kv), false);
  const double splits = std::max(1, plan.kv_splits);
  const double units = double(pr.batch) * double(pr.heads_q) * splits;  // one K/V stream each
  const double q_flash = sz.q * splits;
  const double partials = splits > 1 ? 2.0 * double(pr.batch * pr.heads_q * pr.seqlen_q) * splits * (double(pr.head_dim_v) + 2) * 4 : 0.0;
  const double kv_per_cta_sum = double(pr.batch * pr.heads_q) * double(w.kv_rows_sum) * sz.kv_row;
  const double kv_unit = double(w.kv_rows_union) * sz.kv_row / splits;
  const double kv_once = units * kv_unit;

  // smem-L2: every CTA loads its Q tile once and every visible K/V block once; O (and LSE) go
  // out once. Standard: the two GEMMs on 128x128 output tiles re-read their operands once per
  // tile row/column, and every pass over S goes through.
  BoundaryTraffic inner;
  inner.name = hw.levels[0].name + "-" + hw.levels[1].name;
  const double bh = double(pr.batch * pr.heads_q);
  const double tiles_q = std::ceil(double(pr.seqlen_q) / 128), tiles_k = std::ceil(double(pr.seqlen_k) / 128);
  const double eb = dtype_bytes(pr.dtype), kb = dtype_bytes(pr.kv_dtype);
  const double gemm_reads = bh * (double(pr.seqlen_q) * pr.head_dim * eb * tiles_k +
                                  double(pr.seqlen_k) * pr.head_dim * kb * tiles_q +
                                  double(pr.seqlen_k) * pr.head_dim_v * kb * tiles_q);
  set(&inner, q_flash + kv_per_cta_sum + partials / 2, sz.o + sz.lse + partials / 2,
      gemm_reads + sp.s_reads * sz.s_fp32, sz.o + sz.lse + sp.s_writes * sz.s_fp32);
  rep.levels.push_back(inner);

  // L2-HBM. The L2 keeps one copy per partition of data every SM reads, so K/V sees
  // cap = size / partitions. CTAs run in waves of `workers` resident CTAs in grid order (query
  // block fastest, as FlashAttention-2's grid): the heads of one wave share their K/V in L2 if
  // it fits (W <= cap). A head whose CTAs straddle a wave boundary needs its K/V again in the
  // next wave; it is still there only if the wave's other K/V plus the wave's Q/O traffic fit.
  const MemoryLevel& l2 = hw.levels[1];
  const double cap = shared_capacity(l2);
  const double resident = std::max(1, plan.workers);
  const double q_blocks = std::max<int64_t>(1, w.q_blocks);
  const double total_ctas = units * q_blocks;
  const double w_active = std::min(units, std::max(1.0, resident / q_blocks)) * kv_unit;
  const double qo_wave = resident * plan.block_q * double(pr.head_dim + pr.head_dim_v) * eb;
  double kv_reads;
  if (sz.q + kv_once + sz.o <= cap) {
    kv_reads = kv_once;
  } else {
    // Waves spanned, summed over units: one per unit plus, for each wave boundary that cuts a
    // unit's run of CTAs, the K/V its CTAs in the next wave read again. The CUDA kernel, like
    // FlashAttention-2, runs a unit's query blocks from the last to the first (m_block =
    // gridDim.x - 1 - blockIdx.x), so those are its FIRST query blocks: the whole K/V without
    // a mask, only the prefix they see under a causal one (measured: 1.04x K/V causal against
    // 1.26x without, H=16, S=16384, D=128; the whole-unit rule was 20% high causal).
    const int64_t bq = std::max(1, plan.block_q), bkv = std::max(1, plan.block_kv);
    const int64_t right = effective_window_right(pr.causal, pr.window_right);
    auto first_blocks_rows = [&](int64_t nblocks) {
      const int64_t last = std::min(pr.seqlen_q, nblocks * bq) - 1;
      const int64_t begin = visible_keys(0, pr.seqlen_q, pr.seqlen_k, pr.window_left, right).begin / bkv * bkv;
      const int64_t end = std::min(pr.seqlen_k, ceil_div(visible_keys(last, pr.seqlen_q, pr.seqlen_k, pr.window_left, right).end, bkv) * bkv);
      return double(std::max<int64_t>(0, end - begin));
    };
    double reread_rows = 0;
    for (double k = 1; k * resident < total_ctas; ++k) {
      const double issued = std::fmod(k * resident, q_blocks);
      if (issued != 0) reread_rows += first_blocks_rows(int64_t(q_blocks - issued));
    }
    const double per_wave = w_active + qo_wave <= cap ? kv_once : kv_once + reread_rows * sz.kv_row / splits;
    if (w_active <= cap) {
      kv_reads = per_wave;
    } else {
      // The wave's K/V does not fit: the fraction cap / W of re-uses hits, the rest is re-read.
      kv_reads = per_wave + std::max(0.0, kv_per_cta_sum - per_wave) * (1.0 - cap / w_active);
    }
  }
  kv_reads = std::min(kv_reads, kv_per_cta_sum);
  const double flash_reads = q_flash + kv_reads + partials / 2;
  // Dirty lines still in L2 when the kernel ends are never written back during it: the
  // output's share of the traffic stream, applied to the capacity, stays behind.
  const double out_bytes = sz.o + sz.lse + partials / 2;
  const double dirty_end = std::min(out_bytes, cap * out_bytes / (flash_reads + out_bytes));
  const double flash_writes = out_bytes - dirty_end;

  // Standard on the GPU: each pass is a kernel over all heads, so S stays in L2 only if the
  // whole S does.
  const bool s_resident = sz.s_fp32 <= cap;
  const double std_kv = double(pr.batch * pr.heads_q) * double(pr.seqlen_k) * sz.kv_row;
  const double std_reads = sz.q + std_kv + (s_resident ? 0.0 : sp.s_reads * sz.s_fp32);
  const double std_out = sz.o + sz.lse + (s_resident ? 0.0 : sp.s_writes * sz.s_fp32);
  const double std_dirty = std::min(std_out, cap * std_out / (std_reads + std_out));
  BoundaryTraffic outer;
  outer.name = l2.name + "-" + hw.levels.back().name;
  set(&outer, flash_reads, flash_writes, std_reads, std_out - std_dirty);
  rep.levels.push_back(outer);
  return rep;
}

}  // namespace

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
  // 7.4 reads and 4.75 writes of an fp32 S at H=16 S=4096 D=128, H=32 S=4096 D=64 and H=16
  // S=16384 D=128 (bench/traffic/samples/gpu/math_*_causal.txt): about two more reads and one
  // more write than without the mask, for building the boolean tril mask, turning it into an
  // additive one and adding it to S.
  StandardPasses p;
  p.s_reads = 7.42;
  p.s_writes = 4.76;
  p.name = "PyTorch MATH, is_causal (calibrated on the causal Nsight Compute samples)";
  return p;
}

StandardPasses pytorch_math_passes() {
  StandardPasses p;
  p.s_reads = 5.45;
  p.s_writes = 3.71;
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
  TrafficReport rep = hw.kind == DeviceKind::gpu && hw.levels.size() >= 3 ? gpu_traffic(pr, plan, hw, standard)
                                                                          : cpu_traffic(pr, plan, hw, standard, options);
  rep.hardware = hw.name;
  if (!rep.levels.empty()) {
    rep.flash_dram_bytes = rep.levels.back().flash_bytes;
    rep.standard_dram_bytes = rep.levels.back().standard_bytes;
  }
  rep.flops = forward_flops(pr);
  double peak_gflops = hw.fma_gflops_per_core * hw.cores;
  if (hw.kind == DeviceKind::gpu && pr.dtype != DType::f32 && hw.tensor_tflops > 0) peak_gflops = hw.tensor_tflops * 1e3;
  const double bw = hw.dram().bandwidth_gbs * 1e9;
  const double compute_s = peak_gflops > 0 ? rep.flops / (peak_gflops * 1e9) : 0.0;
  rep.flash_roofline_s = std::max(compute_s, bw > 0 ? rep.flash_dram_bytes / bw : 0.0);
  rep.standard_roofline_s = std::max(compute_s, bw > 0 ? rep.standard_dram_bytes / bw : 0.0);
  return rep;
}

}  // namespace ioattn
