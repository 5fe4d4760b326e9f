// Split-KV decode (flash-decoding) for sm_80 and later, one CTA per (key split, kv head,
// sequence). The CTA owns the G x Sq query rows that read one kv head (GQA packing), stacked
// position-major (row r is query r / G of head hk * G + r % G, so every row's visible key range
// is nondecreasing in r) into one 16-row m16n8k16 A tile, so each K/V byte crosses HBM once per
// step whatever G is. K/V stream through a 3-stage cp.async pipeline of 64-key tiles (16-byte
// copies, the loads of two tiles in flight while the third is used); each warp takes 16 keys of
// a tile and keeps its own online-softmax state over them, so the warps never wait on each other
// inside the walk. At the end the four warp states merge in warp order with the header's merge
// rule, and the CTA writes either the output (one split) or its (O, m, l) partial.
//
// Per tile and warp at D = 128: S = Q K^T is 8 k16 steps x 2 n8 tiles = 16 mma, O += P V another
// 16, for 16 keys: the math is ~10% of what the memory time allows (gpu_tiles.h).
//
// Included only by the per-head-dim translation units (gpu/decode_d*.cu).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "common/gpu_tiles.h"
#include "common/masking.h"
#include "common/online_softmax.h"
#include "common/params.h"
#include "gpu/decode_launch.cuh"
#include "gpu/elem_convert.cuh"
#include "gpu/score_rows.cuh"
#include "gpu/sm80/flash_fwd.cuh"
#include "gpu/sm80/primitives.cuh"

namespace ioattn::gpu::decode {

template <int D>
struct DecodeShape {
  static constexpr GpuTile tile = gpu_decode_tile(D);
  static constexpr int rows = tile.block_q, block_kv = tile.block_kv, warps = tile.warps, stages = tile.stages;
  static constexpr int threads = warps * 32;
  static constexpr int warp_keys = block_kv / warps;
  static constexpr int pitch = gpu_tile_row_pitch(D);
  static constexpr int64_t smem_bytes = gpu_tile_smem_bytes(tile, D);
  static constexpr int min_ctas = smem_bytes * 2 <= 227 * 1024 ? 2 : 1;
  static_assert(tile.supported && rows == 16 && warp_keys == 16 && D % 16 == 0,
                "one m16 tile of rows, one k16 slice of keys per warp");
  static_assert(stages >= 2, "the pipeline overlaps the next tiles' copies with this tile's math");
  // The warps' (O, m, l) states are merged through the K/V buffers once the walk is done.
  static_assert(int64_t(warps) * rows * (D + 2) * 4 <= int64_t(stages) * 2 * block_kv * pitch * 2,
                "merge scratch must fit in the K/V stages");
};

// The CTA's share of the problem: the G x Sq query rows that read kv head hk of sequence b, the
// key blocks of its split, and its shared tiles (Q, then `stages` K buffers, then as many V
// buffers).
template <class Elem, int D>
struct DecodeCta {
  using Shape = DecodeShape<D>;
  static constexpr int Rows = Shape::rows, BN = Shape::block_kv, P = Shape::pitch, Threads = Shape::threads;
  static constexpr int Stages = Shape::stages, Warps = Shape::warps;

  Elem* sQ;
  Elem* sK;
  Elem* sV;
  int split;
  int64_t hk, b;
  SeqSpan seq;
  int group, rows;
  // The visible key ranges of the first and the last row, which bound all rows' ranges.
  KeyRange first, last;
  int64_t my_begin;  // first key block of this split
  int n_tiles;
  const Elem* k;
  const Elem* v;
  // An aggregate: decode_kernel computes the fields, the split's key blocks included.

  // Row r is query r / group of this query head.
  __device__ __forceinline__ int64_t head_of(int r) const { return hk * group + r % group; }

  // Issues Q (Rows x D / 8 chunks; padding rows are zero-filled and never stored) and the first
  // Stages - 1 K/V tiles, one commit group each.
  __device__ __forceinline__ void prologue(const AttnParams& p, const Elem* q) const {
    for (int c = int(threadIdx.x); c < Rows * D / 8; c += Threads) {
      const int r = c / (D / 8), col = (c % (D / 8)) * 8;
      const bool valid = r < rows;
      const Elem* src = valid ? q + q_offset(p, b, seq, r / group, head_of(r)) + col : q;
      sm80::cp_async_16(sm80::smem_addr(sQ + r * P + col), src, valid);
    }
    sm80::cp_async_commit();
#pragma unroll
    for (int s = 0; s < Stages - 1; ++s) {
      if (s < n_tiles) load_kv(p, s);
      sm80::cp_async_commit();
    }
  }

  __device__ __forceinline__ void load_kv(const AttnParams& p, int tile_index) const {
    const int buf = tile_index % Stages;
    const int64_t n0 = (my_begin + tile_index) * BN;
    const int valid = int(seq.seqlen_k - n0 < BN ? seq.seqlen_k - n0 : BN);
    Elem* k_dst = sK + buf * BN * P;
    Elem* v_dst = sV + buf * BN * P;
    if (p.block_table) {
      sm80::load_tile<D, Threads, BN>(k_dst, k, valid, [&](int r) { return k_offset(p, b, seq, n0 + r, hk); });
      sm80::load_tile<D, Threads, BN>(v_dst, v, valid, [&](int r) { return v_offset(p, b, seq, n0 + r, hk); });
    } else {
      sm80::load_tile<D, Threads, BN>(k_dst, k + k_offset(p, b, seq, n0, hk), valid,
                                      [&](int r) { return int64_t(r) * p.k_seq_stride; });
      sm80::load_tile<D, Threads, BN>(v_dst, v + v_offset(p, b, seq, n0, hk), valid,
                                      [&](int r) { return int64_t(r) * p.v_seq_stride; });
    }
  }

  // After the walk the K/V stages are free and hold the warps' (O, m, l) states for the merge.
  struct Scratch {
    float* o;
    float* m;
    float* l;
  };
  __device__ __forceinline__ Scratch scratch() const {
    float* sO = reinterpret_cast<float*>(sK);
    float* sM = sO + Warps * Rows * D;
    return {sO, sM, sM + Warps * Rows};
  }

  // Merges the warps' states in warp order with the header's merge rule and writes either the
  // output and its log-sum-exp (one split) or this split's (O, m, l) partial.
  __device__ __forceinline__ void merge_and_store(const AttnParams& p, const Partials& part) const {
    const Scratch sc = scratch();
    auto exp2_fn = [](float x) { return fast_exp2(x); };
    Elem* out = static_cast<Elem*>(p.out);
    const int64_t partial_row = ((int64_t(split) * gridDim.z + b) * gridDim.y + hk) * Rows;
    for (int e = int(threadIdx.x); e < rows * D; e += Threads) {
      const int r = e / D, c = e % D;
      float m = softmax::neg_inf(), l = 0.f, acc = 0.f;
#pragma unroll
      for (int w = 0; w < Warps; ++w) {
        const softmax::MergeWeights mw = softmax::merge(m, l, sc.m[w * Rows + r], sc.l[w * Rows + r], exp2_fn);
        acc = acc * mw.weight_a + sc.o[(w * Rows + r) * D + c] * mw.weight_b;
        m = mw.m;
        l = mw.l;
      }
      if (part.splits == 1) {
        const int64_t i = r / group, h = head_of(r);
        out[o_offset(p, b, seq, i, h) + c] = from_f32<Elem>(acc * softmax::output_scale(l));
        if (p.lse && c == 0)
          p.lse[lse_offset(p, b, seq, i, h)] = softmax::row_lse(softmax::max_for_exp(m), l, softmax::Domain::log2);
      } else {
        part.o[(partial_row + r) * D + c] = acc;
        if (c == 0) {
          part.m[partial_row + r] = m;
          part.l[partial_row + r] = l;
        }
      }
    }
  }
};

// One warp's walk: it takes 16 keys of every tile (keys kw .. kw + 15) against all the CTA's
// rows and keeps its own online-softmax state (O, row max, row sums) over them in registers.
template <class Elem, int D>
struct DecodeWarp {
  using Shape = DecodeShape<D>;
  using Ops = sm80::ElemOps<Elem>;
  static constexpr int Rows = Shape::rows, BN = Shape::block_kv, P = Shape::pitch, Stages = Shape::stages;
  static constexpr int OT = D / 8;

  using Cta = DecodeCta<Elem, D>;
  using OAcc = float[OT][4];
  int warp, lane, g, t, kw;
  // Scores in the log2 domain, exactly as the prefill kernel (gpu/sm80/flash_fwd.cuh) takes
  // them: raw scores with a fused exponent FFMA when there is no softcap and the scale is
  // positive, the two-step form when |m| reaches 2^22 (pytorch issue 121558).
  ScoreMode mode;
  // The warp's row key ranges, output accumulator O, row maxima and row sums are arrays of the
  // kernel's own, passed in by reference, so that the scalars here stay registers from the start.
  // ldmatrix x4 lane offsets (primitives.cuh): A from Q rows lane % 16; B from this warp's 16
  // keys, two n8 tiles; V transposed for the P V product.
  uint32_t q_lane;
  int k_lane, v_lane;

  __device__ __forceinline__ DecodeWarp(const AttnParams& p)
      : warp(int(threadIdx.x) / 32),
        lane(int(threadIdx.x) % 32),
        g(lane / 4),
        t(lane % 4),
        kw(warp * Shape::warp_keys),
        mode(p) {}

  // Lane g holds rows g and g + 8 of the tile; padding rows take the last real row's keys, so
  // the masks never see a row without a query.
  __device__ __forceinline__ void row_ranges(const AttnParams& p, const Cta& cta, KeyRange (&row_keys)[2]) const {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = g + 8 * hr < cta.rows ? g + 8 * hr : cta.rows - 1;
      row_keys[hr] = visible_keys(p, cta.seq, r / cta.group);
    }
  }

  // The ldmatrix lane offsets above; after row_ranges, as the kernel orders them.
  __device__ __forceinline__ void set_lanes(const Cta& cta) {
    q_lane = sm80::smem_addr(cta.sQ + (lane % 16) * P + (lane / 16) * 8);
    k_lane = (kw + (lane % 8) + (lane / 16) * 8) * P + ((lane / 8) % 2) * 8;
    v_lane = (kw + (lane % 8) + ((lane / 8) % 2) * 8) * P + (lane / 16) * 8;
  }

  // -inf for the keys outside each row's visible range, in a tile the mask or the sequence end
  // cuts.
  __device__ __forceinline__ void mask_scores(const Cta& cta, const KeyRange (&row_keys)[2], float (&s)[2][4],
                                              int tile_index) const {
    const int64_t n0 = (cta.my_begin + tile_index) * BN + kw;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int64_t lo64 = row_keys[hr].begin - n0, hi64 = row_keys[hr].end - n0;
      const int lo = int(lo64 < 0 ? 0 : lo64 > 16 ? 16 : lo64);
      const int hi = int(hi64 < 0 ? 0 : hi64 > 16 ? 16 : hi64);
      mask_outside(s, hr, t, lo, hi);
    }
  }

  // Online softmax (common/online_softmax.h): the quad of lanes sharing a row agrees on its
  // max; the row sum stays per lane until the end. Replaces the scores by their
  // probabilities and sets each row's rescale factor.
  __device__ __forceinline__ void softmax_update(float (&row_max)[2], float (&row_sum)[2], float (&s)[2][4], float kmul,
                                                 float (&factor)[2]) const {
    auto exp2_fn = [](float x) { return fast_exp2(x); };
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float m = fmaxf(fmaxf(s[0][2 * hr], s[0][2 * hr + 1]), fmaxf(s[1][2 * hr], s[1][2 * hr + 1])) * kmul;
      m = fmaxf(row_max[hr], m);
      m = quad_max(m);
      factor[hr] = softmax::rescale_factor(row_max[hr], m, exp2_fn);
      row_max[hr] = m;
    }
    const bool small = fabsf(softmax::max_for_exp(row_max[0])) < ScoreMode::kFusedLimit &&
                       fabsf(softmax::max_for_exp(row_max[1])) < ScoreMode::kFusedLimit;
    auto exponentiate = [&](auto arg) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const float m_ref = softmax::max_for_exp(row_max[hr]);
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pe = fast_exp2(arg(s[n][2 * hr + e], m_ref));
            s[n][2 * hr + e] = pe;
            sum += pe;
          }
        row_sum[hr] = row_sum[hr] * factor[hr] + sum;
      }
    };
    if (mode.fused && __all_sync(0xffffffffu, small))
      exponentiate([kmul](float x, float m_ref) { return fmaf(x, kmul, -m_ref); });
    else  // __fmul_rn: rounded like the max, never contracted into an FMA
      exponentiate([kmul](float x, float m_ref) { return __fmul_rn(x, kmul) - m_ref; });
  }

  // One tile: S = Q K^T over the warp's keys, the online softmax, O += P V.
  template <bool Masked>
  __device__ __forceinline__ void step(const Cta& cta, const KeyRange (&row_keys)[2], OAcc& o, float (&row_max)[2],
                                       float (&row_sum)[2], int tile_index) const {
    const int buf = tile_index % Stages;
    const uint32_t k_base = sm80::smem_addr(cta.sK + buf * BN * P + k_lane);
    const uint32_t v_base = sm80::smem_addr(cta.sV + buf * BN * P + v_lane);

    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kd = 0; kd < D / 16; ++kd) {
      uint32_t qa[4], kb[4];
      sm80::ldmatrix_x4(qa, q_lane + kd * 16 * 2);
      sm80::ldmatrix_x4(kb, k_base + kd * 16 * 2);
      Ops::mma(s[0], qa, kb[0], kb[1]);
      Ops::mma(s[1], qa, kb[2], kb[3]);
    }
    const float kmul = mode.to_log2(s, mode.softcap, mode.fused);
    if constexpr (Masked) mask_scores(cta, row_keys, s, tile_index);

    float factor[2];
    softmax_update(row_max, row_sum, s, kmul, factor);
    if (__any_sync(0xffffffffu, factor[0] != 1.f || factor[1] != 1.f)) rescale_rows(o, factor);

    const uint32_t pa[4] = {pack_pair<Elem>(s[0][0], s[0][1]), pack_pair<Elem>(s[0][2], s[0][3]),
                            pack_pair<Elem>(s[1][0], s[1][1]), pack_pair<Elem>(s[1][2], s[1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t vb[4];
      sm80::ldmatrix_x4_trans(vb, v_base + dp * 16 * 2);
      Ops::mma(o[2 * dp], pa, vb[0], vb[1]);
      Ops::mma(o[2 * dp + 1], pa, vb[2], vb[3]);
    }
  }

  __device__ __forceinline__ void walk(const AttnParams& p, const Cta& cta, const KeyRange (&row_keys)[2], OAcc& o,
                                       float (&row_max)[2], float (&row_sum)[2]) const {
    // The loop bounds are read once, here: read through cta inside the loop, they change where
    // the compiler places the tile arithmetic.
    const int n_tiles = cta.n_tiles;
    const int64_t my_begin = cta.my_begin;
    const KeyRange first = cta.first, last = cta.last;
    for (int ti = 0; ti < n_tiles; ++ti) {
      sm80::cp_async_wait<Stages - 2>();
      __syncthreads();
      // The buffer refilled here was last read in iteration ti - 1, which every warp has left.
      if (ti + Stages - 1 < n_tiles) cta.load_kv(p, ti + Stages - 1);
      sm80::cp_async_commit();
      // Whole tile visible to every row: the rows' ranges are nondecreasing, so the last row's
      // begin and the first row's end bound them all.
      const int64_t n0 = (my_begin + ti) * BN;
      if (n0 >= last.begin && n0 + BN <= first.end)
        step<false>(cta, row_keys, o, row_max, row_sum, ti);
      else
        step<true>(cta, row_keys, o, row_max, row_sum, ti);
    }
  }

  // The warp's rows (row sums reduced over the quad) into the merge scratch, at slot `warp`.
  __device__ __forceinline__ void stash_state(const Cta& cta, const OAcc& o, const float (&row_max)[2],
                                              const float (&row_sum)[2]) const {
    const typename DecodeCta<Elem, D>::Scratch sc = cta.scratch();
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = g + 8 * hr;
      const float l = quad_sum(row_sum[hr]);
      if (t == 0) {
        sc.m[warp * Rows + r] = row_max[hr];
        sc.l[warp * Rows + r] = l;
      }
      float* dst = sc.o + ((warp * Rows + r) * D + 2 * t);
#pragma unroll
      for (int d = 0; d < OT; ++d)
        *reinterpret_cast<float2*>(dst + d * 8) = make_float2(o[d][2 * hr], o[d][2 * hr + 1]);
    }
  }
};

template <class Elem, int D>
__global__ void __launch_bounds__(DecodeShape<D>::threads, DecodeShape<D>::min_ctas)
    decode_kernel(const __grid_constant__ AttnParams p, const __grid_constant__ Partials part) {
  using Shape = DecodeShape<D>;
  using Cta = DecodeCta<Elem, D>;
  constexpr int BN = Shape::block_kv, P = Shape::pitch;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Elem* sQ = reinterpret_cast<Elem*>(smem_raw);
  Elem* sK = sQ + Shape::rows * P;
  Elem* sV = sK + Shape::stages * BN * P;

  const int split = int(blockIdx.x);
  const int64_t hk = blockIdx.y, b = blockIdx.z;
  const SeqSpan seq = sequence(p, b);
  const int group = int(p.heads_q / p.heads_kv);
  const int rows = group * int(seq.seqlen_q);
  if (rows == 0) return;

  // Key blocks of this split: the blocks the rows' union [first.begin, last.end) touches, cut
  // into part.splits near-equal contiguous runs (the split count comes from the plan, the cut
  // from the sequence: both fixed for a given problem and device).
  const KeyRange first = visible_keys(p, seq, 0);
  const KeyRange last = visible_keys(p, seq, seq.seqlen_q - 1);
  const int64_t blocks_begin = first.begin / BN;
  const int64_t blocks_end = last.end > first.begin ? (last.end + BN - 1) / BN : blocks_begin;
  const int64_t blocks = blocks_end - blocks_begin;
  const int64_t my_begin = blocks_begin + blocks * split / part.splits;
  const int n_tiles = int(blocks_begin + blocks * (split + 1) / part.splits - my_begin);

  const Elem* q = static_cast<const Elem*>(p.q);
  const Elem* k = static_cast<const Elem*>(p.k);
  const Elem* v = static_cast<const Elem*>(p.v);
  const Cta cta{sQ, sK, sV, split, hk, b, seq, group, rows, first, last, my_begin, n_tiles, k, v};
  cta.prologue(p, q);

  using Warp = DecodeWarp<Elem, D>;
  Warp warp(p);
  KeyRange row_keys[2];
  warp.row_ranges(p, cta, row_keys);
  float o[D / 8][4];
  float row_max[2] = {softmax::neg_inf(), softmax::neg_inf()}, row_sum[2] = {0.f, 0.f};
#pragma unroll
  for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  warp.set_lanes(cta);
  warp.walk(p, cta, row_keys, o, row_max, row_sum);
  sm80::cp_async_wait<0>();
  __syncthreads();
  // The warps' states go through shared memory and merge in warp order.
  warp.stash_state(cta, o, row_max, row_sum);
  __syncthreads();
  cta.merge_and_store(p, part);
}

template <class Elem, int D>
cudaError_t prepare_decode_tile() {
  using Shape = DecodeShape<D>;
  static_assert(Shape::smem_bytes == decode_smem_bytes(D), "shared-memory size disagrees with the table");
  // Per call rather than once: the attribute belongs to the current device's context.
  return cudaFuncSetAttribute(decode_kernel<Elem, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              int(Shape::smem_bytes));
}

template <class Elem, int D>
cudaError_t launch_decode_tile(const AttnParams& p, const Partials& part) {
  using Shape = DecodeShape<D>;
  const dim3 grid(unsigned(part.splits), unsigned(p.heads_kv), unsigned(p.batch));
  decode_kernel<Elem, D><<<grid, Shape::threads, Shape::smem_bytes, static_cast<cudaStream_t>(p.stream)>>>(p, part);
  return cudaGetLastError();
}

}  // namespace ioattn::gpu::decode
