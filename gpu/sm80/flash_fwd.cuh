// FlashAttention-2 forward for sm_80 and later (mma.sync m16n8k16), one CTA per
// (query block, head, sequence). The CTA stages its Q tile in shared memory, then walks the
// visible key blocks through a `stages`-deep cp.async pipeline of K/V tiles; each warp owns
// block_q / warps query rows and keeps its scores S, probabilities P and output accumulator O in
// registers for the whole walk, so the only shared-memory traffic is ldmatrix reads of Q, K and V.
//
// Per key block and warp (D = 128, 32 rows, 64 keys): S = Q K^T is 2 x 8 x 8 = 128 mma, O += P V
// another 128; the softmax between them is ~6 fp32 ops per score. Blocks that the mask or the
// sequence end cuts are peeled: only they evaluate the visibility rule per element. The unmasked
// bulk runs in a loop of its own whose step is one branch-free block from the first Q K^T MMA to
// the last P V MMA, with the next tile's copies issued between the Q K^T MMAs so that they
// overlap the tensor-core work (bench/results/gpu-forward.md).
//
// Included only by the per-(head dim, dtype) translation units (gpu/fwd_sm80_*.cu).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "common/gpu_tiles.h"
#include "common/masking.h"
#include "common/online_softmax.h"
#include "common/params.h"
#include "gpu/score_rows.cuh"
#include "gpu/sm80/launch.h"
#include "gpu/sm80/primitives.cuh"

namespace ioattn::gpu::sm80 {

// The tile a kernel is compiled for. The literals come from each instantiation unit and are
// checked there against gpu_tile(D), the table the planner reads.
template <int D, int BlockQ, int BlockKv, int Warps, int Stages>
struct FwdShape {
  static constexpr int head_dim = D;
  static constexpr int block_q = BlockQ, block_kv = BlockKv, warps = Warps, stages = Stages;
  static constexpr GpuTile tile{BlockQ, BlockKv, Warps, Stages, true};
  static constexpr int threads = warps * 32;
  static constexpr int warp_rows = block_q / warps;
  static constexpr int m_tiles = warp_rows / 16;  // m16 tiles per warp
  static constexpr int s_tiles = block_kv / 8;    // n8 tiles of S
  static constexpr int o_tiles = D / 8;           // n8 tiles of O
  static constexpr int pitch = gpu_tile_row_pitch(D);
  static constexpr int64_t smem_bytes = gpu_tile_smem_bytes(tile, D);
  static constexpr int min_ctas = smem_bytes * 2 <= 227 * 1024 ? 2 : 1;
  static constexpr bool matches(const GpuTile& t) {
    return t.supported && t.block_q == BlockQ && t.block_kv == BlockKv && t.warps == Warps && t.stages == Stages;
  }
  static_assert(warp_rows % 16 == 0 && block_kv % 16 == 0 && D % 16 == 0, "tile must tile m16n8k16");
  static_assert(stages >= 2, "the pipeline overlaps the next tile's copy with this tile's math");
};

// Copies `rows` rows of D elements into a pitched shared tile; row r comes from
// base + row_offset(r), rows at or past `valid_rows` are zero-filled (never read). The general
// form: one accessor call per 16-byte chunk (paged K/V, and D = 96, whose 12-chunk rows do not
// divide the CTA's threads).
template <int D, int Threads, int Rows, class Elem, class RowOffset>
__device__ __forceinline__ void load_tile(Elem* smem, const Elem* base, int valid_rows, RowOffset row_offset) {
  constexpr int chunks_per_row = D / 8, pitch = gpu_tile_row_pitch(D);
  constexpr int chunks = Rows * chunks_per_row;
  static_assert(chunks % Threads == 0, "each thread copies the same number of chunks");
#pragma unroll
  for (int i = 0; i < chunks / Threads; ++i) {
    int c = int(threadIdx.x) + i * Threads;
    // Opaque to the optimizer: otherwise it hoists every chunk's row offset out of the key loop
    // (16 or more 64-bit values kept live across the whole walk) and the accumulators spill.
    // Recomputing them costs a few integer ops per 16-byte copy.
    asm volatile("" : "+r"(c));
    const int r = c / chunks_per_row, col = (c % chunks_per_row) * 8;
    const bool valid = r < valid_rows;
    const Elem* src = valid ? base + row_offset(r) + col : base;
    cp_async_16(smem_addr(smem + r * pitch + col), src, valid);
  }
}

// Rows at base + r * stride whose 16-byte chunks the CTA's threads cover whole
// (Threads % (D / 8) == 0): a thread copies one column of rows r0, r0 + R, r0 + 2R, ...
// (R = Threads * 8 / D), so one pointer stepped by R rows serves all its chunks and each copy
// costs a compare and a 64-bit add, against ~20 integer ops when every chunk re-derives its row
// (load_tile). Other head dims (D = 96: 12 chunks per row) take load_tile.
template <int D, int Threads>
inline constexpr bool kRowsCover = Threads % (D / 8) == 0;

template <int D, int Threads, int Rows, class Elem>
__device__ __forceinline__ void load_tile_strided(Elem* smem, const Elem* base, int valid_rows, int64_t stride) {
  if constexpr (kRowsCover<D, Threads>) {
    constexpr int chunks_per_row = D / 8, pitch = gpu_tile_row_pitch(D), R = Threads / chunks_per_row;
    static_assert(Rows % R == 0, "each thread copies the same number of chunks");
    int tid = int(threadIdx.x);
    // Opaque, as in load_tile: the per-thread offset is rederived per tile instead of held live
    // across the key loop.
    asm volatile("" : "+r"(tid));
    const int r0 = tid / chunks_per_row, col = (tid % chunks_per_row) * 8;
    const Elem* src = base + r0 * stride + col;
    const uint32_t dst = smem_addr(smem + r0 * pitch + col);
#pragma unroll
    for (int i = 0; i < Rows / R; ++i) {
      const bool valid = r0 + i * R < valid_rows;
      cp_async_16(dst + i * R * pitch * 2, valid ? src : base, valid);
      src += R * stride;
    }
  } else {
    load_tile<D, Threads, Rows>(smem, base, valid_rows, [&](int r) { return int64_t(r) * stride; });
  }
}

// acc[mt][2 np] and acc[mt][2 np + 1] += a[mt] B for every m16 tile, where B is the k16 x n16
// fragment pair that one ldmatrix x4 reads at addr (transposed for V, whose rows are keys).
template <class Ops, bool Trans, int MT, int N>
__device__ __forceinline__ void mma_n16(float (&acc)[MT][N][4], int np, const uint32_t (&a)[MT][4], uint32_t addr) {
  uint32_t b[4];
  if constexpr (Trans)
    ldmatrix_x4_trans(b, addr);
  else
    ldmatrix_x4(b, addr);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    Ops::mma(acc[mt][2 * np], a[mt], b[0], b[1]);
    Ops::mma(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
  }
}

// The CTA's share of the problem and its shared tiles: Q, then `stages` K buffers, then as many
// V buffers. Tiles are walked from the last key block down (tile index i is key block
// n_end - 1 - i), so the blocks the causal diagonal or the sequence end cut come first and the
// unmasked bulk runs after them (FlashAttention-2's order).
template <class Elem, class Shape>
struct FwdCta {
  static constexpr int D = Shape::head_dim, BM = Shape::block_q, BN = Shape::block_kv, P = Shape::pitch;
  static constexpr int Threads = Shape::threads, Stages = Shape::stages;

  Elem* sQ;
  Elem* sK;
  Elem* sV;
  int64_t b, h;
  SeqSpan seq;
  int64_t m0;  // first query row
  int64_t hk;
  int rows_here;
  // Key blocks any row of this query block sees, [n_begin, n_end), and the inner range that
  // every row sees whole, [n_full_begin, n_full_end).
  int n_begin, n_end, n_full_begin, n_full_end, n_tiles;
  const Elem* k;
  const Elem* v;
  // Without a block table, key row j sits at row 0 + j * stride (common/params.h).
  const Elem* k_row0;
  const Elem* v_row0;

  // Issues the Q tile and the first Stages - 1 K/V tiles, one commit group each. Query rows,
  // and key rows without a block table, are affine in the row index (the accessors of
  // common/params.h): one accessor call per tile gives row 0 and the rest step by the seq
  // stride. Paged keys go through the accessor row by row.
  __device__ __forceinline__ void prologue(const AttnParams& p, const Elem* q) const {
    load_tile_strided<D, Threads, BM>(sQ, q + q_offset(p, b, seq, m0, h), rows_here, p.q_seq_stride);
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < Stages - 1; ++s) {
      if (s < n_tiles) load_kv(p, s);
      cp_async_commit();
    }
  }

  __device__ __forceinline__ void load_kv(const AttnParams& p, int tile_index) const {
    const int buf = tile_index % Stages;
    const int64_t n0 = int64_t(n_end - 1 - tile_index) * BN;
    const int valid = int(seq.seqlen_k - n0 < BN ? seq.seqlen_k - n0 : BN);
    Elem* k_dst = sK + buf * BN * P;
    Elem* v_dst = sV + buf * BN * P;
    if (p.block_table) {
      load_tile<D, Threads, BN>(k_dst, k, valid, [&](int r) { return k_offset(p, b, seq, n0 + r, hk); });
      load_tile<D, Threads, BN>(v_dst, v, valid, [&](int r) { return v_offset(p, b, seq, n0 + r, hk); });
    } else {
      load_tile_strided<D, Threads, BN>(k_dst, k_row0 + n0 * p.k_seq_stride, valid, p.k_seq_stride);
      load_tile_strided<D, Threads, BN>(v_dst, v_row0 + n0 * p.v_seq_stride, valid, p.v_seq_stride);
    }
  }

  // Waits for tile ti, then refills with tile ti + Stages - 1 the buffer that iteration ti - 1
  // read, which every warp has left once past the barrier.
  __device__ __forceinline__ void next_tile(const AttnParams& p, int ti) const {
    cp_async_wait<Stages - 2>();
    __syncthreads();
    if (ti + Stages - 1 < n_tiles) load_kv(p, ti + Stages - 1);
    cp_async_commit();
  }
};

// One warp's walk over the CTA's key tiles. The warp owns Shape::warp_rows query rows and keeps
// their output accumulator O, running max and row sums in registers for the whole walk; per
// tile the scores S, probabilities P and their fragments are locals of one step.
template <class Elem, class Shape>
struct FwdWarp {
  using Ops = ElemOps<Elem>;
  static constexpr int D = Shape::head_dim, BN = Shape::block_kv, MT = Shape::m_tiles;
  static constexpr int NT = Shape::s_tiles, OT = Shape::o_tiles, P = Shape::pitch;
  static constexpr int Threads = Shape::threads, Stages = Shape::stages;
  // The next tile's copies, when a step issues them itself (copy_chunk(c), c < kCopyChunks: K
  // then V, kCopyRows rows apart), spread over its Q K^T loop: kCopiesPerKd per k16 slice of D,
  // between MMAs that leave the issue slots free (one HMMA per ~6 cycles).
  static constexpr bool kStepCopies = kRowsCover<D, Threads>;
  static constexpr int kCopyRows = Threads / (D / 8);
  static constexpr int kCopyChunksPerTile = BN / kCopyRows;
  static constexpr int kCopyChunks = kStepCopies ? 2 * kCopyChunksPerTile : 0;
  static constexpr int kCopiesPerKd = (kCopyChunks + D / 16 - 1) / (D / 16);

  using Cta = FwdCta<Elem, Shape>;
  int warp, lane, g, t, warp_row0;
  ScoreMode mode;
  // The warp's output accumulator O, running maxima and row sums: arrays of the kernel's own,
  // passed in by reference, so that the scalars above stay registers from the start.
  using OAcc = float[MT][OT][4];
  using RowVals = float[MT][2];
  // Lane address offsets of the ldmatrix x4 patterns (see primitives.cuh for the fragments):
  // A from Q: row lane % 16, column (lane / 16) * 8; B from K (two n8 tiles, one k16): row
  // (lane % 8) + (lane / 16) * 8, column ((lane / 8) % 2) * 8; B from V, transposed: key row
  // (lane % 8) + ((lane / 8) % 2) * 8, column (lane / 16) * 8.
  uint32_t q_lane;
  int k_lane, v_lane;

  __device__ __forceinline__ FwdWarp(const AttnParams& p, const FwdCta<Elem, Shape>& c)
      : warp(int(threadIdx.x) / 32),
        lane(int(threadIdx.x) % 32),
        g(lane / 4),
        t(lane % 4),
        warp_row0(warp * Shape::warp_rows),
        mode(p) {
    q_lane = smem_addr(c.sQ + (warp_row0 + lane % 16) * P + (lane / 16) * 8);
    k_lane = ((lane % 8) + (lane / 16) * 8) * P + ((lane / 8) % 2) * 8;
    v_lane = ((lane % 8) + ((lane / 8) % 2) * 8) * P + (lane / 16) * 8;
  }

  __device__ __forceinline__ static void clear(OAcc& o, RowVals& row_max, RowVals& row_sum) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int d = 0; d < OT; ++d) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.f;
      row_max[mt][0] = row_max[mt][1] = softmax::neg_inf();
      row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }
  }

  // S = Q K^T over the tile's keys, with the step's copies issued between the MMAs.
  template <class CopyChunk>
  __device__ __forceinline__ void qk_scores(float (&s)[MT][NT][4], uint32_t k_base, CopyChunk& copy_chunk) const {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NT; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
    for (int kd = 0; kd < D / 16; ++kd) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(qa[mt], q_lane + (mt * 16 * P + kd * 16) * 2);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) mma_n16<Ops, false>(s, np, qa, k_base + (np * 16 * P + kd * 16) * 2);
#pragma unroll
      for (int c = kd * kCopiesPerKd; c < (kd + 1) * kCopiesPerKd; ++c)
        if (c < kCopyChunks) copy_chunk(c);
    }
  }

  // -inf for the keys outside each row's visible range, in a tile (first key n0) that the mask
  // or the sequence end cuts.
  __device__ __forceinline__ void mask_scores(const AttnParams& p, const Cta& cta, float (&s)[MT][NT][4],
                                              int n0) const {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const KeyRange keys = visible_keys(p, cta.seq, cta.m0 + warp_row0 + mt * 16 + g + hr * 8);
        // The row's visible range relative to this tile, clamped into [0, BN]: 32-bit compares
        // per element.
        const int lo = int(keys.begin - n0 < 0 ? 0 : keys.begin - n0 > BN ? BN : keys.begin - n0);
        const int hi = int(keys.end - n0 < 0 ? 0 : keys.end - n0 > BN ? BN : keys.end - n0);
        mask_outside(s[mt], hr, t, lo, hi);
      }
  }

  // Online softmax (common/online_softmax.h), the max half: the quad of lanes sharing a row
  // agrees on its max, which reduces pairwise (dependency depth log2(2 * NT) instead of 2 * NT:
  // with two warps per scheduler the chain's latency is not hidden). Sets each row's rescale
  // factor and the m_ref its exponent subtracts; returns the exponent's multiplier k_exp.
  __device__ __forceinline__ float update_max(RowVals& row_max, float (&s)[MT][NT][4], float k, bool use_fused,
                                              float (&factor)[MT][2], float (&m_ref)[MT][2]) const {
    bool small = true;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) update_row_max(row_max[mt], s[mt], k, factor[mt], m_ref[mt], small);
    // A warp whose maxima left the fused form's range takes the two-step form (to_two_step). The
    // common case thus keeps one straight-line block from here to the end of P V, inside which
    // the compiler issues the exponentials, conversions and O rescale between the P V MMAs.
    float k_exp = k;
    if (use_fused && !__all_sync(0xffffffffu, small)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) to_two_step(s[mt], k, m_ref[mt]);
      k_exp = 1.f;
    }
    return k_exp;
  }

  // The probabilities are exponentiated, summed into the row sums and packed into P V's A
  // fragments.
  __device__ __forceinline__ void exponentiate(RowVals& row_sum, const float (&s)[MT][NT][4], float k_exp,
                                               const float (&m_ref)[MT][2], const float (&factor)[MT][2],
                                               uint32_t (&pa)[BN / 16][MT][4]) const {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        row_sum[mt][hr] *= factor[mt][hr];
#pragma unroll
        for (int kn = 0; kn < BN / 16; ++kn) {
          float pe[2][2];
          row_sum[mt][hr] += exp_slice(s[mt], kn, hr, k_exp, m_ref[mt][hr], pe);
          pa[kn][mt][hr] = pack_pair<Elem>(pe[0][0], pe[0][1]);
          pa[kn][mt][2 + hr] = pack_pair<Elem>(pe[1][0], pe[1][1]);
        }
      }
  }

  // One key block. Masked: the block is cut by the mask or the sequence end, so each element's
  // visibility is evaluated. FusedOnly: the specialization of the unmasked bulk for the common
  // mode (positive scale, no softcap), without the softcap and scale branches; every other
  // combination runs the general form, which tests those flags at run time.
  template <bool Masked, bool FusedOnly, class CopyChunk>
  __device__ __forceinline__ void step(const AttnParams& p, const Cta& cta, OAcc& o, RowVals& row_max, RowVals& row_sum,
                                       int tile_index, CopyChunk&& copy_chunk) const {
    const bool use_softcap = !FusedOnly && mode.softcap;
    const bool use_fused = FusedOnly || mode.fused;
    const int buf = tile_index % Stages;
    const int n0 = (cta.n_end - 1 - tile_index) * BN;
    const uint32_t k_base = smem_addr(cta.sK + buf * BN * P + k_lane);
    const uint32_t v_base = smem_addr(cta.sV + buf * BN * P + v_lane);

    float s[MT][NT][4];
    qk_scores(s, k_base, copy_chunk);
    const float k = mode.to_log2(s, use_softcap, use_fused);
    if constexpr (Masked) mask_scores(p, cta, s, n0);

    float factor[MT][2], m_ref[MT][2];
    const float k_exp = update_max(row_max, s, k, use_fused, factor, m_ref);
    uint32_t pa[BN / 16][MT][4];
    exponentiate(row_sum, s, k_exp, m_ref, factor, pa);
    // O takes the rescale factor unconditionally (exactly 1 unless the max grew, so the result
    // is the same as skipping it): a warp-uniform skip branch would split the block in which
    // the compiler overlaps the exponentials with the first MMAs.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) rescale_rows(o[mt], factor[mt]);
#pragma unroll
    for (int kn = 0; kn < BN / 16; ++kn)
#pragma unroll
      for (int dp = 0; dp < OT / 2; ++dp) mma_n16<Ops, true>(o, dp, pa[kn], v_base + (kn * 16 * P + dp * 16) * 2);
  }

  // The unmasked bulk in the common mode with affine K/V rows, from tile ti on: every tile
  // after the first is whole (only the highest key block can reach past the sequence end), so a
  // copy is all rows or, past the last tile, none. Each thread keeps pointers to its own chunk
  // column in the tile being computed and steps them down one block per iteration; with no next
  // tile it re-reads the current one with zero bytes (zero-fill into the buffer that no warp
  // reads any more, which keeps the copies free of a branch). Returns the first tile after it.
  __device__ __forceinline__ int walk_bulk_with_copies(const AttnParams& p, const Cta& cta, OAcc& o, RowVals& row_max,
                                                       RowVals& row_sum, int ti) const {
    constexpr int R = kCopyRows;
    int tid = int(threadIdx.x);
    asm volatile("" : "+r"(tid));
    const int r0 = tid / (D / 8), col = (tid % (D / 8)) * 8;
    const int64_t k_block = int64_t(BN) * p.k_seq_stride, v_block = int64_t(BN) * p.v_seq_stride;
    const int64_t row = int64_t(cta.n_end - 1 - ti) * BN + r0;
    const Elem* k_cur = cta.k_row0 + row * p.k_seq_stride + col;
    const Elem* v_cur = cta.v_row0 + row * p.v_seq_stride + col;
    const uint32_t dst0 = smem_addr(cta.sK + r0 * P + col);
    constexpr uint32_t kv_gap = uint32_t(Stages) * BN * P * 2;  // sV - sK in bytes
    for (const int ti_end = cta.n_end - cta.n_full_begin; ti < ti_end; ++ti) {
      cp_async_wait<Stages - 2>();
      __syncthreads();
      const int next = ti + Stages - 1;
      const bool exists = next < cta.n_tiles;
      const uint32_t dst = dst0 + uint32_t((next % Stages) * BN * P * 2);
      const Elem* k_src = exists ? k_cur - (Stages - 1) * k_block : k_cur;
      const Elem* v_src = exists ? v_cur - (Stages - 1) * v_block : v_cur;
      step<false, true>(p, cta, o, row_max, row_sum, ti, [&](int c) {
        if (c < kCopyChunksPerTile) {
          cp_async_16(dst + c * R * P * 2, k_src + c * R * p.k_seq_stride, exists);
        } else {
          const int i = c - kCopyChunksPerTile;
          cp_async_16(dst + kv_gap + i * R * P * 2, v_src + i * R * p.v_seq_stride, exists);
        }
      });
      cp_async_commit();
      k_cur -= k_block;
      v_cur -= v_block;
    }
    return ti;
  }

  // All tiles. The unmasked bulk in the common mode (fused exponent, affine K/V rows) runs as
  // its own loop, whose step also issues the next tile's copies where the CTA's threads cover
  // whole rows; masked tiles and the other modes copy before the step.
  __device__ __forceinline__ void walk(const AttnParams& p, const Cta& cta, OAcc& o, RowVals& row_max,
                                       RowVals& row_sum) const {
    const bool hot = mode.fused && !p.block_table;
    auto nothing = [](int) {};
    int ti = 0;
    while (ti < cta.n_tiles) {
      const int n = cta.n_end - 1 - ti;
      const bool full = n >= cta.n_full_begin && n < cta.n_full_end;
      if (full && hot) {
        if constexpr (kStepCopies) {
          ti = walk_bulk_with_copies(p, cta, o, row_max, row_sum, ti);
        } else {
          for (const int ti_end = cta.n_end - cta.n_full_begin; ti < ti_end; ++ti) {
            cta.next_tile(p, ti);
            step<false, true>(p, cta, o, row_max, row_sum, ti, nothing);
          }
        }
      } else {
        cta.next_tile(p, ti);
        if (full)
          step<false, false>(p, cta, o, row_max, row_sum, ti, nothing);
        else
          step<true, false>(p, cta, o, row_max, row_sum, ti, nothing);
        ++ti;
      }
    }
    cp_async_wait<0>();
  }

  // Normalizes the warp's rows of O by their row sums and stores them, and their log-sum-exp
  // (log2 domain) where asked.
  __device__ __forceinline__ void store_output(const AttnParams& p, const Cta& cta, const OAcc& o,
                                               const RowVals& row_max, const RowVals& row_sum) const {
    Elem* out = static_cast<Elem*>(p.out);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const float l = quad_sum(row_sum[mt][hr]);
        const int64_t row = cta.m0 + warp_row0 + mt * 16 + g + hr * 8;
        if (row >= cta.seq.seqlen_q) continue;
        const float inv = softmax::output_scale(l);
        Elem* dst = out + o_offset(p, cta.b, cta.seq, row, cta.h) + 2 * t;
#pragma unroll
        for (int d = 0; d < OT; ++d)
          *reinterpret_cast<uint32_t*>(dst + d * 8) =
              pack_pair<Elem>(o[mt][d][2 * hr] * inv, o[mt][d][2 * hr + 1] * inv);
        if (p.lse && t == 0) {
          p.lse[lse_offset(p, cta.b, cta.seq, row, cta.h)] =
              softmax::row_lse(softmax::max_for_exp(row_max[mt][hr]), l, softmax::Domain::log2);
        }
      }
  }
};

// Two CTAs per SM where the tile leaves room (4 warps, <= 113 KB): 8 warps keep the tensor
// cores fed while another CTA's warps wait on their barrier or copies.
template <class Elem, class Shape>
__global__ void __launch_bounds__(Shape::threads, Shape::min_ctas)
    flash_fwd_kernel(const __grid_constant__ AttnParams p) {
  using Cta = FwdCta<Elem, Shape>;
  constexpr int BM = Shape::block_q, BN = Shape::block_kv, P = Shape::pitch;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Elem* sQ = reinterpret_cast<Elem*>(smem_raw);
  Elem* sK = sQ + BM * P;
  Elem* sV = sK + Shape::stages * BN * P;

  const int64_t b = blockIdx.z, h = blockIdx.y;
  // Heaviest query blocks (most visible keys under a causal mask) launch first, so the last wave
  // holds the short ones.
  const int m_block = int(gridDim.x) - 1 - int(blockIdx.x);
  const SeqSpan seq = sequence(p, b);
  const int64_t m0 = int64_t(m_block) * BM;
  if (m0 >= seq.seqlen_q) return;
  const int64_t hk = kv_head_of(p, h);
  const int rows_here = int(seq.seqlen_q - m0 < BM ? seq.seqlen_q - m0 : BM);

  // visible_keys' begin and end are nondecreasing in the row, so the first and last rows bound
  // the others.
  const KeyRange first = visible_keys(p, seq, m0);
  const KeyRange last = visible_keys(p, seq, m0 + rows_here - 1);
  const int n_begin = int(first.begin / BN);
  const int n_end = int((last.end + BN - 1) / BN);
  const int n_full_begin = int((last.begin + BN - 1) / BN);
  const int n_full_end = int(first.end / BN);
  const int n_tiles = n_end > n_begin ? n_end - n_begin : 0;

  const Elem* q = static_cast<const Elem*>(p.q);
  const Elem* k = static_cast<const Elem*>(p.k);
  const Elem* v = static_cast<const Elem*>(p.v);
  const Elem* k_row0 = p.block_table ? k : k + k_offset(p, b, seq, 0, hk);
  const Elem* v_row0 = p.block_table ? v : v + v_offset(p, b, seq, 0, hk);
  const Cta cta{sQ,      sK,    sV,           b,          h,       seq, m0, hk,     rows_here,
                n_begin, n_end, n_full_begin, n_full_end, n_tiles, k,   v,  k_row0, v_row0};
  cta.prologue(p, q);
  using Warp = FwdWarp<Elem, Shape>;
  const Warp warp(p, cta);
  float o[Shape::m_tiles][Shape::o_tiles][4];
  float row_max[Shape::m_tiles][2], row_sum[Shape::m_tiles][2];
  Warp::clear(o, row_max, row_sum);
  warp.walk(p, cta, o, row_max, row_sum);
  warp.store_output(p, cta, o, row_max, row_sum);
}

// Host side of one instantiation: the tile literals are the instantiation unit's, asserted equal
// to the planner's table. The caller has checked Shape's shared memory against the device.
template <class Elem, int D, int BlockQ, int BlockKv, int Warps, int Stages>
cudaError_t launch_tile(const AttnParams& p) {
  using Shape = FwdShape<D, BlockQ, BlockKv, Warps, Stages>;
  static_assert(Shape::matches(gpu_tile(D)), "instantiated tile differs from gpu_tile(D), the planner's table");
  static_assert(Shape::smem_bytes == flash_fwd_smem_bytes(D), "shared-memory size disagrees with the table");
  auto kernel = flash_fwd_kernel<Elem, Shape>;
  // Per call rather than once: the attribute belongs to the current device's context.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Shape::smem_bytes));
  if (err != cudaSuccess) return err;
  const dim3 grid(unsigned((p.seqlen_q + BlockQ - 1) / BlockQ), unsigned(p.heads_q), unsigned(p.batch));
  kernel<<<grid, Shape::threads, Shape::smem_bytes, static_cast<cudaStream_t>(p.stream)>>>(p);
  return cudaGetLastError();
}

}  // namespace ioattn::gpu::sm80
