// A consumer warpgroup's walk over the CTA's key tiles: S = Q K^T by wgmma with both operands in
// shared memory, the online softmax in registers, O += P V by wgmma with P in registers, then the
// normalized O and the log-sum-exp written straight from the accumulator. Each warpgroup owns 64
// query rows; each thread two of them (g and g + 8 of its warp's 16).
#pragma once

#include <cute/tensor.hpp>

#include "common/online_softmax.h"
#include "common/params.h"
#include "gpu/score_rows.cuh"
#include "gpu/sm80/primitives.cuh"
#include "gpu/sm90/kernel_traits.cuh"
#include "gpu/sm90/pipeline.cuh"
#include "gpu/sm90/softmax.cuh"

namespace ioattn::gpu::sm90 {

template <class Elem, class Kt>
struct Consumer {
  static constexpr int D = Kt::head_dim, BM = Kt::block_q, BN = Kt::block_kv, Stages = Kt::stages;
  static constexpr int NT = BN / 8, OT = D / 8;
  using Softmax = RowSoftmax<NT>;

  int tc, lane, t;
  int row0;  // the CTA-local row of the thread's first row; the second is row0 + 8
  // Key blocks that every row of this warpgroup sees whole, [full_begin, full_end): no mask.
  int full_begin, full_end;
  ScoreMode mode;

  __device__ __forceinline__ Consumer(const AttnParams& p, const CtaWork<Kt>& w)
      : tc(int(threadIdx.x) - 128), lane(int(threadIdx.x) % 32), t(lane % 4), mode(p) {
    const int wg = tc / 128, warp = (tc % 128) / 32;
    row0 = wg * 64 + warp * 16 + lane / 4;
    const int wg_first = wg * 64 < w.rows_here ? wg * 64 : w.rows_here - 1;
    const int wg_last = wg * 64 + 63 < w.rows_here ? wg * 64 + 63 : w.rows_here - 1;
    const KeyRange first = visible_keys(p, w.seq, w.m0 + wg_first);
    const KeyRange last = visible_keys(p, w.seq, w.m0 + wg_last);
    full_begin = int((last.begin + BN - 1) / BN);
    full_end = int(first.end / BN);
  }

  // -inf for the keys outside each row's visible range in a tile (first key n0) that the mask or
  // the sequence end cuts.
  __device__ __forceinline__ void mask_scores(const AttnParams& p, const CtaWork<Kt>& w, float (&s)[NT][4],
                                              int64_t n0) const {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const KeyRange keys = visible_keys(p, w.seq, w.m0 + row0 + hr * 8);
      const int lo = int(keys.begin - n0 < 0 ? 0 : keys.begin - n0 > BN ? BN : keys.begin - n0);
      const int hi = int(keys.end - n0 < 0 ? 0 : keys.end - n0 > BN ? BN : keys.end - n0);
      mask_outside(s, hr, t, lo, hi);
    }
  }

  // Scores of one tile to P, with O's rescale factors. FusedOnly: the unmasked bulk in the common
  // mode (positive scale, no softcap), without the mode's branches.
  template <bool Masked, bool FusedOnly, class SFrag, class PFrag>
  __device__ __forceinline__ void scores_to_p(const AttnParams& p, const CtaWork<Kt>& w, Softmax& sm,
                                              const SFrag& s_frag, int64_t n0, float (&factor)[2],
                                              PFrag& p_frag) const {
    const bool use_softcap = !FusedOnly && mode.softcap;
    const bool use_fused = FusedOnly || mode.fused;
    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = s_frag(4 * n + e);
    const float k = mode.to_log2(s, use_softcap, use_fused);
    if constexpr (Masked) mask_scores(p, w, s, n0);
    float m_ref[2];
    const float k_exp = sm.update_max(s, k, use_fused, factor, m_ref);
    sm.template exponentiate<Elem>(s, k_exp, m_ref, factor, p_frag);
  }

  // The whole walk, then the output.
  __device__ __forceinline__ void run(const AttnParams& p, const CtaWork<Kt>& w, typename Kt::Storage& st) const {
    typename Kt::MmaQK mma_qk;
    typename Kt::MmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(tc);
    auto thr_pv = mma_pv.get_thread_slice(tc);
    Tensor sQ = make_tensor(make_smem_ptr(st.q), typename Kt::SmemQ{});
    Tensor sK = make_tensor(make_smem_ptr(st.k), typename Kt::SmemK{});
    Tensor sV = make_tensor(make_smem_ptr(st.v), typename Kt::SmemV{});
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);  // (MMA, MMA_M, MMA_K) descriptors
    Tensor tSrK = thr_qk.partition_fragment_B(sK);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tOrV = thr_pv.partition_fragment_B(sV);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<BM>, Int<BN>>{});
    Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<BM>, Int<D>>{});
    // P in the A-fragment layout of P V: per k16 slice (2 x 2 x 2) elements, compact.
    Tensor tOrP = make_tensor<typename Kt::T>(Layout<Shape<Shape<_2, _2, _2>, _1, Int<BN / 16>>>{});
    static_assert(size(decltype(tSrS){}) == 4 * NT && size(decltype(tOrO){}) == 4 * OT, "m64 accumulators");
    clear(tOrO);
    Softmax sm;

    if (w.n_tiles > 0) Barrier::wait(&st.q_full, 0);
    for (int i = 0; i < w.n_tiles; ++i) {
      const int s = i % Stages, n = w.n_end - 1 - i;
      const uint32_t phase = (i / Stages) & 1;
      Barrier::wait(&st.k_full[s], phase);
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      mma_qk.accumulate_ = SM90::GMMA::ScaleOut::Zero;
#pragma unroll
      for (int kb = 0; kb < size<2>(tSrQ); ++kb) {
        cute::gemm(mma_qk, tSrQ(_, _, kb), tSrK(_, _, kb, s), tSrS);
        mma_qk.accumulate_ = SM90::GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);

      float factor[2];
      const bool full = n >= full_begin && n < full_end;
      const int64_t n0 = int64_t(n) * BN;
      if (full && mode.fused)
        scores_to_p<false, true>(p, w, sm, tSrS, n0, factor, tOrP);
      else if (full)
        scores_to_p<false, false>(p, w, sm, tSrS, n0, factor, tOrP);
      else
        scores_to_p<true, false>(p, w, sm, tSrS, n0, factor, tOrP);
        // O takes the factor unconditionally: exactly 1 unless the max grew.
#pragma unroll
      for (int d = 0; d < OT; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) tOrO(4 * d + e) *= factor[e / 2];

      Barrier::wait(&st.v_full[s], phase);
      warpgroup_fence_operand(tOrP);
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
#pragma unroll
      for (int kb = 0; kb < size<2>(tOrP); ++kb) cute::gemm(mma_pv, tOrP(_, _, kb), tOrV(_, _, kb, s), tOrO);
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      // This warp's reads of stage s are done; the stage refills once all consumer warps say so.
      __syncwarp();
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&st.kv_empty[s]);
    }
    store_output(p, w, sm, tOrO);
  }

  // Normalizes the thread's two rows of O by their row sums and stores them, and their
  // log-sum-exp where asked.
  template <class OFrag>
  __device__ __forceinline__ void store_output(const AttnParams& p, const CtaWork<Kt>& w, const Softmax& sm,
                                               const OFrag& o) const {
    Elem* out = static_cast<Elem*>(p.out);
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float l = quad_sum(sm.row_sum[hr]);
      const int64_t row = w.m0 + row0 + hr * 8;
      if (row >= w.seq.seqlen_q) continue;
      const float inv = softmax::output_scale(l);
      Elem* dst = out + o_offset(p, w.b, w.seq, row, w.h) + 2 * t;
#pragma unroll
      for (int d = 0; d < OT; ++d)
        *reinterpret_cast<uint32_t*>(dst + d * 8) =
            sm80::ElemOps<Elem>::pack(o(4 * d + 2 * hr) * inv, o(4 * d + 2 * hr + 1) * inv);
      if (p.lse && t == 0)
        p.lse[lse_offset(p, w.b, w.seq, row, w.h)] =
            softmax::row_lse(softmax::max_for_exp(sm.row_max[hr]), l, softmax::Domain::log2);
    }
  }
};

}  // namespace ioattn::gpu::sm90
