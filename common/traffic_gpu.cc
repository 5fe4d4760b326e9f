// The GPU rules of the traffic model: the CUDA kernel's flash traffic and the unfused standard
// passes at smem-L2 and L2-HBM, and what the L2 slices look up.
#include <algorithm>
#include <cmath>

#include "common/gpu_tiles.h"
#include "common/int_math.h"
#include "common/masking.h"
#include "common/traffic_parts.h"

namespace ioattn::traffic_detail {
namespace {

// What the L2 slices look up (lts__t_bytes), by source, as Nsight Compute splits it on the H200
// (bench/traffic/samples/gpu/split-2026-12-03): lookups of the SMs' own requests
// (lts__t_sectors_srcunit_tex) and lookups that one L2 partition forwards to the other through
// the L2 fabric (srcunit_ltcfabric). On a partitioned L2 (GA100, GH100: MemoryLevel::partitions)
// an SM's request is looked up in the partition wired to its GPC; an address homed in the other
// partition, (P - 1) / P of them (the hash spreads addresses evenly), is forwarded to its home
// when the near partition has no copy. The near partition keeps a copy of far data once read,
// for every kind of load (cp.async.cg included), so only a partition's first read of a far line
// crosses the fabric; stores cross it every time (they go to the home). Measured for the CUDA
// kernel: fabric reads 147-184 MB where these first touches come to 168 MB, fabric writes
// 0.49-0.50 x the SMs' write sectors; the fabric is 2.8-16% of its lookups, 27% of MATH's
// (which touches most bytes once). Looking every cp.async.cg request of the CUDA kernel up a
// second time at its home is refuted by the same samples: at S = 16384 D = 128 the fabric
// carried 23.8M of 862M sectors.
double far_share(const MemoryLevel& l2) { return double(std::max(1, l2.partitions) - 1) / std::max(1, l2.partitions); }

// Fabric lookups of `unique` bytes read n times by CTAs spread over the SMs: every partition's
// first read of a line homed elsewhere (n readers reach min(n, P) partitions).
double first_touch_fabric(double unique, double n, const MemoryLevel& l2) {
  return unique * far_share(l2) * std::min(n, double(std::max(1, l2.partitions)));
}

// The CUDA prefill kernel's cp.async.cg reads (Q, K, V: 16 bytes a thread) as the SMs' side of
// the H200 counts them: l1tex__m_xbar2l1tex_read_sectors = 1.500-1.501 x the sectors the kernel's
// tiles hold at S = 16384 (1.502-1.516 at S = 1024), srcunit_tex reads 1.473-1.516 x, at all 8
// split points (D = 64 and 128, causal or not), the excess growing with the tile steps (half a
// K+V tile pair per step), not with the CTAs. The L1TEX tag stage counts 1.125 x
// (l1tex__t_sectors_pipe_lsu_mem_global_op_ld). Why the crossbar carries half as much again is
// not settled (docs/traffic.md, "What lts__t_bytes counts"): a measured ratio of this kernel on
// this chip, not a derived one, so the decode kernel and the split-KV merge (no samples) are
// counted at one lookup per requested sector.
constexpr double kCudaCopyReadSectors = 1.5;

// The CUDA forward's epilogue stores O from the MMA accumulators: the 4 lanes that hold a row's
// 8 adjacent columns store one bf16 pair each, 16 contiguous bytes per row per instruction
// (gpu/sm80/flash_fwd.cuh), so every 32-byte sector of O is two store requests: the split
// samples' l1tex__t_sectors_pipe_lsu_mem_global_op_st is 2.00 x O's sectors at every point.
constexpr double kCudaOutStoreBytes = 16;

// The sm_90a prefill (plan.kernel "sm90") moves its tiles by TMA, whole boxes with no per-thread
// requests: the crossbar's reads equal its tiles' sectors and its O store writes each sector once
// (l1tex__m_xbar2l1tex_read_sectors and l1tex2xbar_write_sectors on an H100 at all 20 points of
// bench/traffic/samples/gpu/sm90-half-l2-2026-12-07), so it is counted at one lookup per sector.
bool moves_by_tma(const Plan& plan) { return plan.kernel == "sm90"; }

// The flash kernel's K/V streams and compulsory bytes.
struct GpuFlash {
  Sizes sz;
  UnitWalk w;
  double splits, units, q_flash, partials, kv_per_cta_sum, kv_unit, kv_once;
};

GpuFlash gpu_flash(const Problem& pr, const Plan& plan) {
  GpuFlash c;
  c.sz = sizes_of(pr);
  c.w = walk_unit(pr, 1, std::max(1, plan.block_q), std::max(1, plan.block_kv), false);
  c.splits = std::max(1, plan.kv_splits);
  // K/V streams: one per (batch, q head) for the prefill kernel; the decode kernel's CTA serves
  // the G query heads of a kv head, so one per (batch, kv head) there (plan.units; ncu on the
  // H200: GQA decode reads each K/V byte once, bench/results/gpu-decode.md).
  const double streams = plan.units > 0 ? double(plan.units) : double(pr.batch) * double(pr.heads_q);
  c.units = streams * c.splits;  // one K/V stream each
  c.q_flash = c.sz.q * c.splits;
  c.partials = c.splits > 1
                   ? 2.0 * double(pr.batch * pr.heads_q * pr.seqlen_q) * c.splits * (double(pr.head_dim_v) + 2) * 4
                   : 0.0;
  c.kv_per_cta_sum = streams * double(c.w.kv_rows_sum) * c.sz.kv_row;
  c.kv_unit = double(c.w.kv_rows_union) * c.sz.kv_row / c.splits;
  c.kv_once = c.units * c.kv_unit;
  return c;
}

// Standard attention's GEMM operands: elements, bytes per element, reads per operand (once per
// output tile across it) and the broadcast mask.
struct GpuOperands {
  double bh, eb, kb, q_el, o_el, k_el, v_el, qe, ke;
  double q_reads, k_reads, v_reads, p_reads, gemm_reads, mask;
};

double tile_reads(int64_t n, int tile) { return std::ceil(double(n) / std::max(1, tile)); }

GpuOperands gpu_operands(const Problem& pr, const StandardPasses& sp) {
  GpuOperands op;
  op.bh = double(pr.batch * pr.heads_q);
  op.eb = dtype_bytes(pr.dtype);
  op.kb = dtype_bytes(pr.kv_dtype);
  op.q_el = op.bh * double(pr.seqlen_q) * pr.head_dim;
  op.o_el = op.bh * double(pr.seqlen_q) * pr.head_dim_v;
  op.k_el = op.bh * double(pr.seqlen_k) * pr.head_dim;
  op.v_el = op.bh * double(pr.seqlen_k) * pr.head_dim_v;
  op.qe = sp.fp32_upcast ? 4.0 : op.eb;
  op.ke = sp.fp32_upcast ? 4.0 : op.kb;
  op.q_reads = tile_reads(pr.seqlen_k, sp.qk_tile_k);
  op.k_reads = tile_reads(pr.seqlen_q, sp.qk_tile_q);
  op.v_reads = tile_reads(pr.seqlen_q, sp.pv_tile_q);
  op.p_reads = tile_reads(pr.head_dim_v, sp.pv_tile_d);
  op.gemm_reads = op.q_el * op.qe * op.q_reads + op.k_el * op.ke * op.k_reads + op.v_el * op.ke * op.v_reads;
  op.mask = sp.broadcast_mask_bytes * double(pr.seqlen_q) * double(pr.seqlen_k);  // one, all heads read it
  return op;
}

// smem-L2: every CTA loads its Q tile once and every visible K/V block once; O (and LSE) go
// out once. Standard: each GEMM operand is read once per output tile across it, and every pass
// over S goes through.
BoundaryTraffic gpu_inner(const HardwareProfile& hw, const StandardPasses& sp, const GpuFlash& c,
                          const GpuOperands& op) {
  BoundaryTraffic inner;
  inner.name = hw.levels[0].name + "-" + hw.levels[1].name;
  const Sizes& sz = c.sz;
  // The fp32 prologue and epilogue: Q, K, V converted (read, written in fp32), Q and K scaled
  // (read, written), O written by the P V GEMM in fp32 and converted (read, written).
  const double up_reads =
      sp.fp32_upcast ? op.q_el * op.eb + (op.k_el + op.v_el) * op.kb + (op.q_el + op.k_el) * 4 + op.o_el * 4 : 0.0;
  const double up_writes =
      sp.fp32_upcast ? (op.q_el + op.k_el + op.v_el) * 4 + (op.q_el + op.k_el) * 4 + op.o_el * 4 : 0.0;
  // s_reads counts P's first read by the P V GEMM; each further tile column reads it again.
  const double s_traffic_reads = (sp.s_reads + op.p_reads - 1) * sz.s_fp32;
  set_traffic(&inner, c.q_flash + c.kv_per_cta_sum + c.partials / 2, sz.o + sz.lse + c.partials / 2,
              op.gemm_reads + s_traffic_reads + op.bh * op.mask + up_reads,
              sz.o + sz.lse + sp.s_writes * sz.s_fp32 + up_writes);
  return inner;
}

// L2 lookups: the SMs' requests in sectors plus the fabric's. Flash: the sm_80 prefill kernel's
// copies at kCudaCopyReadSectors, O's sectors stored in halves (the sm_90a kernel's TMA, the
// decode kernel's epilogue and the split-KV merge at one per sector), and the fabric for each
// partition's first read of Q and of a head's K/V (read by `readers` CTAs on average) and for
// every store. The zero-byte copies that the unmasked loop issues past the last tile (src-size 0)
// add nothing: the SM-side excess is the same 1.5 x per tile at causal and non-causal points,
// whose tiles per CTA differ (129 and 256 at S = 16384) while each CTA issues one zero-byte tile.
void gpu_lookups(const Problem& pr, const Plan& plan, const MemoryLevel& l2, const GpuFlash& c, const GpuOperands& op,
                 const BoundaryTraffic& inner, TrafficReport* rep) {
  const Sizes& sz = c.sz;
  const int64_t group = pr.heads_kv > 0 ? std::max<int64_t>(1, pr.heads_q / pr.heads_kv) : 1;
  const bool copies = c.splits == 1 && !gpu_decode_rows(group, pr.seqlen_q) && !moves_by_tma(plan);
  const double out_requests = copies ? sz.o * 32 / kCudaOutStoreBytes : sz.o;
  const double write_requests = out_requests + sz.lse + c.partials / 2;
  const double readers = c.kv_once > 0 ? c.kv_per_cta_sum / c.kv_once : 0.0;
  rep->flash_l2_fabric_bytes = first_touch_fabric(sz.q, c.splits, l2) + first_touch_fabric(c.kv_once, readers, l2) +
                               first_touch_fabric(c.partials / 2, 1, l2) + far_share(l2) * write_requests;
  rep->flash_l2_lookup_bytes =
      (copies ? kCudaCopyReadSectors : 1.0) * inner.flash_read_bytes + write_requests + rep->flash_l2_fabric_bytes;
  // Standard: the GEMM operands, P in P V and the broadcast mask are re-read through
  // L1-cacheable loads; every other pass touches each byte once, its first touch crossing the
  // fabric for far lines. The SMs' side is the smem-L2 boundary itself.
  const double shared_reads = op.gemm_reads + (op.p_reads - 1) * sz.s_fp32 + op.bh * op.mask;
  rep->standard_l2_fabric_bytes =
      first_touch_fabric(op.q_el * op.qe, op.q_reads, l2) + first_touch_fabric(op.k_el * op.ke, op.k_reads, l2) +
      first_touch_fabric(op.v_el * op.ke, op.v_reads, l2) + first_touch_fabric(sz.s_fp32, op.p_reads, l2) +
      first_touch_fabric(op.mask, op.bh, l2) + far_share(l2) * (inner.standard_bytes - shared_reads - sz.s_fp32);
  rep->standard_l2_lookup_bytes = inner.standard_bytes + rep->standard_l2_fabric_bytes;
}

// Key rows the first `nblocks` query blocks of a unit load, key blocks aligned to block_kv.
double first_blocks_rows(const Problem& pr, int64_t bq, int64_t bkv, int64_t nblocks) {
  const int64_t right = effective_window_right(pr.causal, pr.window_right);
  const int64_t last = std::min(pr.seqlen_q, nblocks * bq) - 1;
  const int64_t begin = visible_keys(0, pr.seqlen_q, pr.seqlen_k, pr.window_left, right).begin / bkv * bkv;
  const int64_t end =
      std::min(pr.seqlen_k, round_up(visible_keys(last, pr.seqlen_q, pr.seqlen_k, pr.window_left, right).end, bkv));
  return double(std::max<int64_t>(0, end - begin));
}

// The flash kernel's K/V reads across L2-HBM. The L2 keeps one copy per partition of data every
// SM reads, so K/V sees cap = size / partitions. CTAs run in waves of `workers` resident CTAs in
// grid order (query block fastest, as FlashAttention-2's grid): the heads of one wave share their
// K/V in L2 if it fits (W <= cap). A head whose CTAs straddle a wave boundary needs its K/V again
// in the next wave; it is still there only if the wave's other K/V plus the wave's Q/O traffic fit.
double gpu_kv_reads(const Problem& pr, const Plan& plan, const GpuFlash& c, double cap) {
  const Sizes& sz = c.sz;
  const double resident = std::max(1, plan.workers);
  const double q_blocks = std::max<int64_t>(1, c.w.q_blocks);
  const double total_ctas = c.units * q_blocks;
  const double w_active = std::min(c.units, std::max(1.0, resident / q_blocks)) * c.kv_unit;
  const double qo_wave = resident * plan.block_q * double(pr.head_dim + pr.head_dim_v) * dtype_bytes(pr.dtype);
  double kv_reads;
  if (sz.q + c.kv_once + sz.o <= cap) {
    kv_reads = c.kv_once;
  } else {
    // Waves spanned, summed over units: one per unit plus, for each wave boundary that cuts a
    // unit's run of CTAs, the K/V its CTAs in the next wave read again. The CUDA kernel, like
    // FlashAttention-2, runs a unit's query blocks from the last to the first (m_block =
    // gridDim.x - 1 - blockIdx.x), so those are its FIRST query blocks: the whole K/V without
    // a mask, only the prefix they see under a causal one (measured: 1.04x K/V causal against
    // 1.26x without, H=16, S=16384, D=128; the whole-unit rule was 20% high causal).
    const int64_t bq = std::max(1, plan.block_q), bkv = std::max(1, plan.block_kv);
    double reread_rows = 0;
    for (double k = 1; k * resident < total_ctas; ++k) {
      const double issued = std::fmod(k * resident, q_blocks);
      if (issued != 0) reread_rows += first_blocks_rows(pr, bq, bkv, int64_t(q_blocks - issued));
    }
    const double per_wave = w_active + qo_wave <= cap ? c.kv_once : c.kv_once + reread_rows * sz.kv_row / c.splits;
    if (w_active <= cap) {
      kv_reads = per_wave;
    } else {
      // The wave's K/V does not fit: the fraction cap / W of re-uses hits, the rest is re-read.
      kv_reads = per_wave + std::max(0.0, c.kv_per_cta_sum - per_wave) * (1.0 - cap / w_active);
    }
  }
  return std::min(kv_reads, c.kv_per_cta_sum);
}

// L2-HBM: the flash kernel's reads (gpu_kv_reads) and writes, and the standard passes.
BoundaryTraffic gpu_outer(const Problem& pr, const Plan& plan, const HardwareProfile& hw, const StandardPasses& sp,
                          const GpuFlash& c, const GpuOperands& op) {
  const Sizes& sz = c.sz;
  const MemoryLevel& l2 = hw.levels[1];
  const double cap = shared_capacity(l2);
  const double flash_reads = c.q_flash + gpu_kv_reads(pr, plan, c, cap) + c.partials / 2;
  // Dirty lines still in L2 when the kernel ends are never written back during it: the
  // output's share of the traffic stream, applied to the capacity, stays behind.
  const double out_bytes = sz.o + sz.lse + c.partials / 2;
  const double dirty_end = std::min(out_bytes, cap * out_bytes / (flash_reads + out_bytes));
  const double flash_writes = out_bytes - dirty_end;

  // Standard on the GPU: each pass is a kernel over all heads, so S stays in L2 only if the
  // whole S does.
  const bool s_resident = sz.s_fp32 <= cap;
  const double std_kv = double(pr.batch * pr.heads_q) * double(pr.seqlen_k) * sz.kv_row;
  // A mask shared by every (batch, head) is read once per head, from HBM only if it does not stay.
  const double mask_reads = s_resident ? 0.0 : (op.mask <= cap ? op.mask : double(pr.batch * pr.heads_q) * op.mask);
  const double std_reads = sz.q + std_kv + (s_resident ? 0.0 : sp.s_reads * sz.s_fp32) + mask_reads;
  const double std_out = sz.o + sz.lse + (s_resident ? 0.0 : sp.s_writes * sz.s_fp32);
  const double std_dirty = std::min(std_out, cap * std_out / (std_reads + std_out));
  BoundaryTraffic outer;
  outer.name = l2.name + "-" + hw.levels.back().name;
  set_traffic(&outer, flash_reads, flash_writes, std_reads, std_out - std_dirty);
  return outer;
}

}  // namespace

TrafficReport gpu_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw, const StandardPasses& sp) {
  TrafficReport rep;
  const GpuFlash c = gpu_flash(pr, plan);
  const GpuOperands op = gpu_operands(pr, sp);
  const BoundaryTraffic inner = gpu_inner(hw, sp, c, op);
  rep.levels.push_back(inner);
  gpu_lookups(pr, plan, hw.levels[1], c, op, inner, &rep);
  rep.levels.push_back(gpu_outer(pr, plan, hw, sp, c, op));
  return rep;
}

}  // namespace ioattn::traffic_detail
