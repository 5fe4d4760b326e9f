// The CPU rules of the traffic model: cpu_traffic walks the hierarchy boundary by boundary, the
// flash kernel's tile, head and decode modes and the project's standard baseline (OpenBLAS sgemm
// passes). The kernel's loop nest at L1d-L2 is traffic_cpu_l1.cc's, the reuse inside a tile past
// L1 traffic_cpu_tiles.cc's.
#include "common/traffic_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/cpu_tiles.h"
#include "common/int_math.h"
#include "common/masking.h"

namespace ioattn::traffic_detail {
namespace {

// ---- OpenBLAS sgemm at L1d-L2 -------------------------------------------------------------
// GotoBLAS's loop nest (driver/level3/level3.c), column-major C (M x N) = A (M x K) B (K x N):
// K in blocks of up to q (a remainder between q and 2q is halved), M in blocks of up to p
// (likewise); per K block B is packed (read + written) in chunks that the kernel consumes at
// once, per M block A is packed; the kernel computes kernel_m x kernel_n tiles with the
// kernel_n-column B chunk held while the packed A block streams past it, so A crosses L1 once
// per chunk of kernel_n columns unless A and the chunk fit together. Where one A micro-panel
// and the B chunk do not fit in half of L1, the B chunk is read again for every micro-panel of
// rows after the first. Later M blocks re-read the packed B; every K block reads C.
struct GemmL1 {
  double reads = 0, writes = 0;
};

// The next block of a dimension with `rest` left: up to cap, a remainder between cap and 2 cap
// halved.
int64_t gemm_block(int64_t rest, int64_t cap, int64_t unroll) {
  if (rest >= 2 * cap) return cap;
  if (rest > cap) return round_up(rest / 2, unroll);
  return rest;
}

std::vector<int64_t> gemm_blocks(int64_t n, int64_t cap, int64_t unroll) {
  std::vector<int64_t> out;
  for (int64_t x = 0; x < n; x += out.back()) out.push_back(gemm_block(n - x, cap, unroll));
  return out;
}

GemmL1 sgemm_l1(int64_t M, int64_t N, int64_t K, double l1, const GemmBlocking& g) {
  GemmL1 t;
  const double n = double(N);
  for (int64_t kl : gemm_blocks(K, g.q, g.unroll)) {
    const double kd = double(kl);
    t.reads += double(M) * n * 4 + kd * n * 4;  // C, and B's source read by the packing
    t.writes += kd * n * 4;                     // packed B
    const std::vector<int64_t> mblocks = gemm_blocks(M, g.p, g.unroll);
    for (int64_t mi : mblocks) {
      const double a = double(mi) * kd * 4;
      t.reads += a;   // A's source, read by the packing
      t.writes += a;  // packed A
      t.reads += a + double(g.kernel_n) * kd * 4 <= l1 ? a : a * std::ceil(n / double(g.kernel_n));
      if (double(g.kernel_m + g.kernel_n) * kd * 4 > l1 / 2)
        t.reads += std::max(0.0, std::ceil(double(mi) / double(g.kernel_m)) - 1) * kd * n * 4;
    }
    t.reads += double(mblocks.size() - 1) * kd * n * 4;
  }
  return t;
}

// Whether each worker's first unit of a call fills head mode's scratch at a level past L1: always
// in a cold call; in the steady state of repeated calls where the scratch (`scratch` bytes) and one
// unit's caller tensors (`unit_io`: Q, K, V and O, which the calls stream between the previous
// call's last use of a scratch line and this call's first) overflow the worker's share. At S = 512,
// D = 64 on a 512 KiB L2 the copy and the tile's buffers (426 KiB) fit but not with the caller's
// tensors, and every call fills the copy again (its write misses are the same in a second call).
bool first_unit_fills(bool cold, double scratch, double unit_io, double share) {
  return cold || scratch + unit_io > share;
}

// What the starts of a call's units cost a level past L1: every unit but each worker's first
// refills its first tile's buffers after the unit before (first_tile); each worker's first unit
// fills what it touches where first_unit_fills says so.
double unit_starts(bool fills, double units, double active, double first_tile, double touched) {
  return std::max(0.0, units - active) * first_tile + (fills ? active * touched : 0.0);
}

// Head mode's copies written across a level past L1, in copies. Each worker packs every unit into
// the same scratch: where the copy fits the worker's share beside the tile's buffers (`fits`), the
// next unit's packing overwrites lines still held and only each worker's first unit fills its
// copy, where first_unit_fills says so; otherwise every unit's copy is evicted below. On a
// 260 MiB L3 the 4 MiB copy at S = 4096 stays, and counting it per unit would put flash above
// standard there.
double head_copies_written(bool fits, bool fills, double units, double active) {
  return fits ? (fills ? std::min(units, active) : 0.0) : units;
}

// Bytes read and written across one boundary.
struct Flow {
  double reads = 0, writes = 0;
};

// What cpu_traffic derives once from the problem, the plan and the hardware.
struct CpuCall {
  Sizes sz;
  int64_t group = 1, rows = 0, lanes = 4;
  UnitWalk w;
  double units = 0, splits = 1, q_flash = 0, partials = 0, workers = 1, active = 1;
  double kv_streamed = 0, kv_once = 0, kv_unit = 0, unit_io = 0;
  double kv_head = 0, kv_std_per_qhead = 0, kv_std_per_kvhead = 0;
  CpuKernelShape ks{};
  double dvq = 0, packed_row = 0, head_copy = 0;
  bool head_mode = false, decode = false;
  double mp_max = 0;   // rows of the largest tile, padded to the vector width
  double tile_ws = 0;  // a packed tile's scratch (decode: the planner's working set)
  double head_ws = 0;  // head mode's tile scratch (no per-block buffers)
};

void set_scratch(const Problem& pr, const Plan& plan, CpuCall* c) {
  c->mp_max =
      double(round_up(std::max<int64_t>(1, plan.block_q / std::max<int64_t>(c->group, 1)) * c->group, c->lanes));
  // A packed tile's scratch is what the kernel allocates (MakeGeometry): Q^T and O, two K/V
  // block buffers, one panel's S^T (block_kv x 48 floats) and the per-row scalars; not the
  // planner's working set, which counts block_q x block_kv scores. Decode keeps the planner's.
  c->tile_ws = c->decode
                   ? double(plan.working_set_bytes)
                   : 4.0 * (c->mp_max * (double(plan.head_dim_padded > 0 ? plan.head_dim_padded : pr.head_dim) +
                                         double(round_up(pr.head_dim_v, c->lanes))) +
                            double(plan.block_kv) * (2.0 * (double(pr.head_dim) + c->dvq) + double(kCpuPanelRows))) +
                         8.0 * c->mp_max;
  const double dpw = plan.head_dim_padded > 0 ? plan.head_dim_padded : double(pr.head_dim);
  const double dvpw = double(round_up(pr.head_dim_v, c->lanes));
  c->head_ws = 4.0 * (c->mp_max * (dpw + dvpw) + double(plan.block_kv) * double(kCpuPanelRows)) + 8.0 * c->mp_max;
}

CpuCall cpu_call(const Problem& pr, const Plan& plan, const HardwareProfile& hw) {
  CpuCall c;
  c.sz = sizes_of(pr);
  c.group = pr.heads_kv > 0 ? pr.heads_q / pr.heads_kv : 1;
  c.rows = c.group * pr.seqlen_q;
  c.w = walk_unit(pr, c.group, std::max(1, plan.block_q), std::max(1, plan.block_kv), true);
  c.units = double(pr.batch) * double(pr.heads_kv);
  c.splits = std::max(1, plan.kv_splits);
  // A split re-reads its query block and writes an (O, m, l) partial that the merge reads back.
  c.q_flash = c.sz.q * c.splits;
  c.partials = c.splits > 1 ? 2.0 * c.units * double(c.rows) * c.splits * (double(pr.head_dim_v) + 2) * 4 : 0.0;
  c.kv_streamed = c.units * double(c.w.kv_rows_sum) * c.sz.kv_row;  // K/V once per query block
  c.kv_once = c.units * double(c.w.kv_rows_union) * c.sz.kv_row;    // K/V once per unit
  c.kv_unit = double(c.w.kv_rows_union) * c.sz.kv_row / c.splits;   // one worker's slice
  c.unit_io = (c.sz.q + c.sz.o) / std::max(1.0, c.units) + double(c.w.kv_rows_union) * c.sz.kv_row;
  c.workers = std::max(1, plan.workers);
  // Standard: one (batch, q head) per worker at a time, S of that head materialized.
  c.kv_head = double(pr.seqlen_k) * c.sz.kv_row;
  c.kv_std_per_qhead = double(pr.batch) * double(pr.heads_q) * c.kv_head;
  c.kv_std_per_kvhead = double(pr.batch) * double(pr.heads_kv) * c.kv_head;
  // A cold call's scratch crosses every outer boundary once, on the workers that get work.
  c.active = std::min<double>(c.workers, std::max<int64_t>(1, plan.work_items > 0 ? plan.work_items : 1));
  // The CPU kernel's head mode (cpu/flash_kernel.cc, DecideShape): when every worker gets two
  // or more whole heads of two or more query blocks each (one worker: any head with two blocks)
  // and no key split, a task is a whole (sequence, kv head) whose K/V is converted once into an
  // fp32 copy ([key][D] and V in panels of the P V tile's columns) that all its query blocks stream.
  c.lanes = std::max(4, hw.simd_bits / 32);
  c.ks = cpu_kernel_shape(hw);
  c.dvq = double(round_up(pr.head_dim_v, c.ks.panel_cols));
  c.packed_row = (double(plan.head_dim_padded > 0 ? plan.head_dim_padded : pr.head_dim) + c.dvq) * 4.0;
  c.head_copy = double(c.w.kv_rows_union) * c.packed_row;
  const double tiles = c.units * double(c.w.q_blocks);
  const CpuCallMode mode = cpu_call_mode({plan.rows_per_unit, plan.kv_splits, tiles, c.units, c.workers, c.head_copy});
  c.head_mode = mode == CpuCallMode::head;
  c.decode = mode == CpuCallMode::decode;
  set_scratch(pr, plan, &c);
  return c;
}

// Flash at L1d-L2. The output (and the split partials) are the writes; every other fill is
// counted as a read, scratch included (its lines are filled, then read).
Flow cpu_flash_l1(const Problem& pr, const Plan& plan, const CpuCall& c, const MemoryLevel& inner,
                  const TrafficOptions& opt) {
  Flow f;
  if (c.decode) {
    // Decode mode (DecodeRange) reads every K and V row of its split once, straight from
    // the cache, and keeps the few query rows' Q, S^T and O in L1.
    f.reads = c.q_flash + c.kv_streamed + c.partials / 2;
  } else {
    f.reads =
        c.units * cpu_flash_unit_l1(pr, plan, c.ks, double(inner.size_bytes), opt.cache_ways, c.head_mode).total() -
        c.sz.o - c.partials / 2;
  }
  f.writes = c.sz.o + c.sz.lse + c.partials / 2;
  return f;
}

// Flash past L1 in tile and decode modes. The K/V slices of the units being processed
// concurrently (one per worker sharing this level) stay here across the unit's query blocks if
// they fit next to each worker's scratch. If not, what the scratch leaves of the worker's share
// still keeps that many bytes of the slice from one query block to the next, and only the rest
// streams in again: cachegrind shows K/V re-reads 2.85 times per head at S=1024, D=64 over four
// query blocks, not 4 (the all-or-nothing rule was 25-30% high there; docs/traffic.md).
Flow cpu_flash_tile_mode(const Problem& pr, const Plan& plan, const CpuCall& c, const MemoryLevel& inner,
                         double free_bytes, double share, const TrafficOptions& opt, double* prev_flash_kv) {
  const double kept = c.kv_unit > 0 ? std::min(1.0, free_bytes / c.kv_unit) : 1.0;
  const double kv = std::min(*prev_flash_kv, c.kv_once + std::max(0.0, c.kv_streamed - c.kv_once) * (1.0 - kept));
  *prev_flash_kv = kv;
  Flow f;
  f.reads = c.q_flash + kv + c.partials / 2;
  f.writes = c.sz.o + c.sz.lse + c.partials / 2;
  if (c.decode) {
    f.reads += opt.cold_scratch ? c.active * c.tile_ws : 0.0;
  } else {
    // Inside each tile, and the tile's buffers again where the tile before evicted them
    // (cpu_tile_refills): every tile but each worker's first, which fills what it touches.
    SetOccupancy occ(share, opt.cache_ways, double(inner.line_bytes), 0, 0, 0);
    const TileRefills t = cpu_tile_refills(pr, plan, c.ks, occ, false);
    f.reads += c.units * (t.inside + t.tile_refill) +
               unit_starts(opt.cold_scratch, c.units, c.active, t.first_tile, t.touched);
  }
  return f;
}

// The fraction of a head-mode copy line kept over a window holding `keys` keys of the copy and
// the other buffers `others`.
struct CopyKeeper {
  SetOccupancy& occ;
  double head_dim, dvq;

  double kept(double keys, const std::vector<double>& others) const {
    std::vector<double> cw = {keys * head_dim * 4};
    cw.insert(cw.end(), others.begin(), others.end());
    return (head_dim * occ.hit(cw, 0, keys) + dvq * occ.hit(cw, SetOccupancy::kVCopy, keys)) / (head_dim + dvq);
  }
};

// The unit's first tile, since the packing: for a key a fraction f into the copy, the caller's rows
// after it (1 - f of them) were read to pack the rest; averaged over the tile's keys (8 points).
double first_tile_kept(const Problem& pr, const CopyKeeper& keep, const std::vector<double>& packing, int64_t t0,
                       double all, double union_keys, double src_key) {
  constexpr int kSteps = 8;
  const int64_t right = effective_window_right(pr.causal, pr.window_right);
  const double u0 = double(visible_keys(0, pr.seqlen_q, pr.seqlen_k, pr.window_left, right).begin);
  double fresh_kept = 0;
  for (int i = 0; i < kSteps; ++i) {
    const double key = double(t0) + (double(i) + 0.5) / kSteps * all;
    std::vector<double> since = packing;
    since.push_back(std::max(0.0, union_keys - (key - u0)) * src_key);
    fresh_kept += keep.kept(union_keys, since) / kSteps;
  }
  return fresh_kept;
}

// Head mode: copies of the copy's lines each unit reads again past L1. A key's K row and V lines
// are read by one tile and again by the next; in between come the rest of the copy, the tile's
// buffers (Q^T and O, one panel's S^T), its output rows and the next tile's Q rows, so the copy
// stays as far as that window fits its sets (cachegrind: 4.2 passes over K and over V for 4 blocks
// at S=1024, D=64, where the copy alone is the whole 512 KiB LL). The unit's first tile reads the
// copy right after packing it: in between the copy, the caller's K/V rows packed after the key,
// the Q rows read, Q^T written and O zeroed. The per-block buffers are not allocated.
double head_copy_reads(const Problem& pr, const Plan& plan, const CpuCall& c, SetOccupancy& occ) {
  const CopyKeeper keep{occ, double(pr.head_dim), c.dvq};
  const double dpw = plan.head_dim_padded > 0 ? plan.head_dim_padded : double(pr.head_dim);
  const double dvpw = double(round_up(pr.head_dim_v, c.lanes));
  const double union_keys_d = double(c.w.kv_rows_union), src_key = c.sz.kv_row;
  const double tile_rows = std::min(c.mp_max, double(c.group * pr.seqlen_q));
  const std::vector<double> packing = {c.mp_max * dpw * 4, c.mp_max * dvpw * 4,
                                       tile_rows * double(pr.head_dim) * dtype_bytes(pr.dtype)};
  std::vector<double> between = packing;
  between.push_back(double(plan.block_kv) * double(kCpuPanelRows) * 4);
  between.push_back(tile_rows * double(pr.head_dim_v) * dtype_bytes(pr.dtype));
  // Per tile: the keys the tile before also streamed were last read by it, the copy in
  // between being that tile's keys; the others (and the first tile's) since the packing or
  // longer ago, the whole copy in between.
  const int64_t per_tile = std::max<int64_t>(1, plan.block_q / std::max<int64_t>(c.group, 1));
  const int64_t right_w = effective_window_right(pr.causal, pr.window_right);
  double copy_reads = 0;
  int64_t prev0 = 0, prev1 = 0;
  for (int64_t p0 = 0; p0 < pr.seqlen_q; p0 += per_tile) {
    const int64_t t0 = visible_keys(p0, pr.seqlen_q, pr.seqlen_k, pr.window_left, right_w).begin;
    const int64_t t1 =
        visible_keys(std::min(pr.seqlen_q, p0 + per_tile) - 1, pr.seqlen_q, pr.seqlen_k, pr.window_left, right_w).end;
    if (t1 <= t0) continue;
    const double all = double(t1 - t0);
    const double common = p0 == 0 ? 0.0 : double(std::max<int64_t>(0, std::min(t1, prev1) - std::max(t0, prev0)));
    const double fresh_kept =
        p0 == 0 ? first_tile_kept(pr, keep, packing, t0, all, union_keys_d, src_key) : keep.kept(union_keys_d, between);
    copy_reads += common * (1.0 - keep.kept(double(prev1 - prev0), between)) + (all - common) * (1.0 - fresh_kept);
    prev0 = t0;
    prev1 = t1;
  }
  return copy_reads;
}

// Flash past L1 in head mode: the caller's K/V is read once per unit and written as one fp32
// copy, which every query block then streams from its first key to its last (head_copy_reads).
Flow cpu_flash_head_mode(const Problem& pr, const Plan& plan, const CpuCall& c, const MemoryLevel& inner, double share,
                         const TrafficOptions& opt) {
  SetOccupancy occ(share, opt.cache_ways, double(inner.line_bytes),
                   double(c.w.kv_rows_union) * double(c.ks.panel_cols) * 4, double(c.ks.panel_cols) * 4,
                   int64_t(c.dvq / double(c.ks.panel_cols)));
  Flow f;
  f.reads = c.q_flash + c.kv_once + c.units * c.packed_row * head_copy_reads(pr, plan, c, occ);
  // Inside a tile, what this level (or a larger one inside it) loses of the K/V block from
  // panel to panel, of S^T, and of the panels' Q^T and O rows from block to block, and at a
  // tile's start what the tile before evicted of its buffers (cpu_tile_refills), set by set:
  // the V copy's column chunks lie head_keys x chunk bytes apart. The Q^T and O rows are
  // used by every block, so the copy's stream alone does not evict them (the line-level
  // simulation, l1_sim.py --l2, refills Q^T and O for 3% of the copy's re-read bytes at S=2048,
  // D=64, 312x128).
  const TileRefills t = cpu_tile_refills(pr, plan, c.ks, occ, true);
  const bool fills = first_unit_fills(opt.cold_scratch, c.head_copy + c.head_ws, c.unit_io, share);
  f.reads += c.units * (t.inside + t.tile_refill) + unit_starts(fills, c.units, c.active, t.first_tile, c.head_ws);
  f.writes =
      c.sz.o + c.sz.lse + head_copies_written(c.head_copy + c.head_ws <= share, fills, c.units, c.active) * c.head_copy;
  return f;
}

// Flash at a boundary past L1; best_share: the largest per-worker share of the levels inside it.
Flow cpu_flash_outer(const Problem& pr, const Plan& plan, const CpuCall& c, const MemoryLevel& inner, double sharing,
                     const TrafficOptions& opt, double* best_share, double* prev_flash_kv) {
  const double cap = shared_capacity(inner);
  const double free_bytes = std::max(0.0, cap / sharing - c.tile_ws);
  const double share = std::max(*best_share, cap / sharing);
  Flow f = c.head_mode ? cpu_flash_head_mode(pr, plan, c, inner, share, opt)
                       : cpu_flash_tile_mode(pr, plan, c, inner, free_bytes, share, opt, prev_flash_kv);
  // Decode: a working set larger than this level's per-worker share spills: its per-step
  // traffic then crosses this boundary as it crosses L1d-L2. Only if it fits no level between:
  // a working set that stays in L2 never reaches an L3 whose per-core share is smaller
  // (Neoverse V1: 1 MiB L2, 32 MiB L3 over 64 cores). The packed modes' reuse inside a tile
  // is decided use by use above (the same "no level between" through `share`).
  *best_share = share;
  if (c.decode && double(plan.working_set_bytes) > *best_share) {
    f.reads += c.units * cpu_flash_unit_l1(pr, plan, c.ks, *best_share, opt.cache_ways, c.head_mode).steps;
  }
  return f;
}

// Standard at L1d-L2, which holds no head's S: the baseline's own loop nest, per (batch, q head).
// Its compulsory Q, K, V reads and O writes in the storage type; the fp32 staging copies written
// and the O copy read back; the two beta = 0 zeroing passes (S, and O for the P V sgemm); the
// softmax's read of S; and each sgemm's traffic (sgemm_l1: C, packing, the kernel's streams),
// which includes the Q K^T accumulation pass over S and the P V sgemm's read of P.
Flow cpu_standard_l1(const Problem& pr, const CpuCall& c, const StandardPasses& sp, const MemoryLevel& inner) {
  const double heads = double(pr.batch) * double(pr.heads_q);
  const int64_t sq = pr.seqlen_q, sk = pr.seqlen_k, d = pr.head_dim, dv = pr.head_dim_v;
  const double l1 = double(inner.size_bytes);
  const GemmL1 g1 = sgemm_l1(sk, sq, d, l1, sp.gemm), g2 = sgemm_l1(dv, sq, sk, l1, sp.gemm);
  const double staged_w = sp.staged_fp32_copies ? 4.0 * double(sq * d + sk * (d + dv)) : 0.0;
  const double staged_r = sp.staged_fp32_copies ? 4.0 * double(sq * dv) : 0.0;
  const double beta = 4.0 * double(sq * sk + sq * dv);
  return {c.sz.q + c.kv_std_per_qhead + heads * (staged_r + double(sq * sk) * 4 + g1.reads + g2.reads),
          c.sz.o + c.sz.lse + heads * (staged_w + beta + g1.writes + g2.writes)};
}

// The standard baseline's per-head buffers in a level past L1: the GEMMs' operands (the fp32
// copies where the baseline stages them, else the caller's tensors) and OpenBLAS's packed blocks.
struct StdBuffers {
  double qc, kc, vc, oc;
  double packed_b1, packed_a1, packed_b2, packed_a2;
  double m_block1, m_blocks1;  // the Q K^T sgemm's first block of key rows, and its blocks
  double k_blocks2_later;      // the P V sgemm's blocks of keys after the first
};

// The first block and the number of blocks gemm_blocks cuts n into.
struct BlockCount {
  int64_t first, count;
};

BlockCount block_count(int64_t n, int64_t cap, int64_t unroll) {
  BlockCount b{0, 0};
  for (int64_t x = 0; x < n; ++b.count) {
    const int64_t m = gemm_block(n - x, cap, unroll);
    if (b.count == 0) b.first = m;
    x += m;
  }
  return b;
}

StdBuffers std_buffers(const Problem& pr, const StandardPasses& sp) {
  StdBuffers s;
  const double sq_d = double(pr.seqlen_q), sk_d = double(pr.seqlen_k);
  const double qe = sp.staged_fp32_copies ? 4.0 : dtype_bytes(pr.dtype),
               ke = sp.staged_fp32_copies ? 4.0 : dtype_bytes(pr.kv_dtype);
  s.qc = sq_d * double(pr.head_dim) * qe;
  s.kc = sk_d * double(pr.head_dim) * ke;
  s.vc = sk_d * double(pr.head_dim_v) * ke;
  s.oc = sq_d * double(pr.head_dim_v) * qe;
  const double packed_q = sq_d * double(pr.head_dim) * 4;
  const BlockCount m_blocks = block_count(pr.seqlen_k, sp.gemm.p, sp.gemm.unroll);
  const BlockCount k_blocks2 = block_count(pr.seqlen_k, sp.gemm.q, sp.gemm.unroll);
  s.m_block1 = double(m_blocks.first);
  s.m_blocks1 = double(m_blocks.count);
  s.k_blocks2_later = double(k_blocks2.count - 1);
  s.packed_b1 = packed_q;
  s.packed_a1 = s.m_block1 * double(pr.head_dim) * 4;
  s.packed_b2 = double(k_blocks2.first) * sq_d * 4;
  s.packed_a2 = double(pr.head_dim_v) * double(k_blocks2.first) * 4;
  return s;
}

// Standard at a boundary past L1, one (batch, q head) per worker at a time, phase by phase: the
// copies are written, beta = 0 zeroes S, the Q K^T sgemm packs the Q and K copies and accumulates
// into S, the softmax rewrites S in place, the P V sgemm packs P block by block and V, and O is
// converted out. S stays in this level if it fits next to what the Q K^T sgemm keeps live (the
// two copies and its packed blocks); then its passes stay inside (a cold call fills it once).
Flow cpu_standard_outer(const Problem& pr, const CpuCall& c, const StandardPasses& sp, const TrafficOptions& opt,
                        double cap_w, double sharing, double kv_std) {
  const Sizes& sz = c.sz;
  const StdBuffers s = std_buffers(pr, sp);
  const double sq_d = double(pr.seqlen_q);
  const double gemm1_live = sz.s_head + s.qc + s.kc + s.packed_b1 + s.packed_a1;
  const bool s_resident = sz.s_head <= cap_w && gemm1_live <= cap_w;
  const double s_reads = s_resident ? 0.0 : sp.s_reads * sz.s_fp32;
  const double s_writes = s_resident ? 0.0 : sp.s_writes * sz.s_fp32;
  // The copies are written (a write-allocating pass) and read back by the packing or by the
  // final conversion of O; S's zeroing pass evicts the Q and K copies in between unless S fits
  // with them, and V's waits through the whole Q K^T sgemm. A cold call fills what stays once.
  const double heads = double(pr.batch) * double(pr.heads_q);
  double copies_crossing = 0;
  if (sp.staged_fp32_copies) {
    const double cold = opt.cold_scratch ? 1.0 : 0.0;
    copies_crossing = heads * ((s.qc + s.kc) * (s.qc + s.kc + s.vc + sz.s_head <= cap_w ? cold : 2.0) +
                               s.vc * (gemm1_live + s.vc <= cap_w ? cold : 2.0) + s.oc * (s_resident ? cold : 1.0));
  }
  const double s_first_touch = s_resident && opt.cold_scratch ? sharing * sz.s_head : 0.0;
  // Inside the sgemms (GemmBlocking): the Q K^T sgemm reads the packed Q copy again for each
  // block of p key rows after the first unless it stays next to that block's rows of S; the
  // P V sgemm reads O (its C) again for each block of q keys after the first unless O stays
  // next to the packed block of P; a cold call fills OpenBLAS's packing buffer once.
  const double gemm_outer =
      heads * ((s.packed_b1 + s.m_block1 * sq_d * 4 > cap_w ? (s.m_blocks1 - 1) * s.packed_b1 : 0.0) +
               (s.oc + s.packed_b2 > cap_w ? s.k_blocks2_later * s.oc : 0.0)) +
      (opt.cold_scratch ? sharing * std::max(s.packed_a1 + s.packed_b1, s.packed_a2 + s.packed_b2) : 0.0);
  return {sz.q + kv_std + s_reads + copies_crossing / 2 + gemm_outer,
          sz.o + sz.lse + s_writes + copies_crossing / 2 + s_first_touch};
}

}  // namespace

CpuKernelShape cpu_kernel_shape(const HardwareProfile& hw) {
  const int64_t lanes = std::max(4, hw.simd_bits / 32);
  const CpuRegisterTile t = cpu_register_tile(hw.simd_bits), pv = cpu_pv_register_tile(hw.simd_bits);
  return {lanes, t.vecs, pv.rows, pv.vecs * lanes};
}

TrafficReport cpu_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw, const StandardPasses& sp,
                          const TrafficOptions& opt) {
  TrafficReport rep;
  const CpuCall c = cpu_call(pr, plan, hw);
  double prev_flash_kv = c.kv_streamed, prev_std_kv = c.kv_std_per_qhead;
  double best_share = 0;  // the largest per-worker share of the levels inside the current boundary
  for (size_t b = 0; b + 1 < hw.levels.size(); ++b) {
    const MemoryLevel& inner = hw.levels[b];
    BoundaryTraffic bt;
    bt.name = inner.name + "-" + hw.levels[b + 1].name;
    const double sharing = std::min<double>(inner.shared_by, c.workers);
    const double cap = shared_capacity(inner);
    const Flow flash = b == 0 ? cpu_flash_l1(pr, plan, c, inner, opt)
                              : cpu_flash_outer(pr, plan, c, inner, sharing, opt, &best_share, &prev_flash_kv);
    // K/V of a kv head is read once for its G q heads if it stays.
    const bool kv_resident = sharing * c.kv_head <= cap;
    const double kv_std = std::min(prev_std_kv, kv_resident ? c.kv_std_per_kvhead : c.kv_std_per_qhead);
    prev_std_kv = kv_std;
    const Flow standard =
        b == 0 ? cpu_standard_l1(pr, c, sp, inner) : cpu_standard_outer(pr, c, sp, opt, cap / sharing, sharing, kv_std);
    set_traffic(&bt, flash.reads, flash.writes, standard.reads, standard.writes);
    rep.levels.push_back(bt);
  }
  return rep;
}

}  // namespace ioattn::traffic_detail
