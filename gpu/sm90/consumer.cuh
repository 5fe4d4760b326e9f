// A consumer warpgroup's walk over the CTA's key tiles: S = Q K^T by wgmma with both operands in
// shared memory, the online softmax in registers, O += P V by wgmma with P in registers, then the
// log-sum-exp and the normalized O, which leaves through a shared staging slice and a TMA store
// where the tile has room for one, else straight from the accumulator. Each warpgroup owns 64
// query rows; each thread two of them (g and g + 8 of its warp's 16).
#pragma once

#include <cutlass/arch/barrier.h>

#include <cute/tensor.hpp>

#include "common/online_softmax.h"
#include "common/params.h"
#include "gpu/primitives.cuh"
#include "gpu/score_rows.cuh"
#include "gpu/sm90/kernel_traits.cuh"
#include "gpu/sm90/pipeline.cuh"
#include "gpu/sm90/softmax.cuh"

namespace ioattn::gpu::sm90 {

// Ping-pong between the two consumer warpgroups: each issues its GEMMs only on its turn and hands
// the turn over once they are issued, so one warpgroup's softmax runs while the other's GEMMs
// hold the tensor cores, instead of both doing softmax at once with the tensor cores idle. Turn
// w is named barrier kTurnBarrier + w (CUTLASS's user range), 256 threads: warpgroup w waits on
// it, the other arrives. Warpgroup 1 hands warpgroup 0 the first turn (turn_start) and warpgroup
// 0 takes the turn that warpgroup 1's last GEMMs hand back (turn_end), so every wait has exactly
// one arrival in the CTA's lifetime.
inline constexpr uint32_t kTurnBarrier = 0;
inline constexpr uint32_t kTurnThreads = 256;
// One more named barrier per consumer warpgroup, for its O staging (after the turns' two).
inline constexpr uint32_t kStageBarrier = kTurnBarrier + 2;

__device__ __forceinline__ void turn_wait(int wg) {
  cutlass::arch::NamedBarrier::sync(kTurnThreads, kTurnBarrier + uint32_t(wg));
}
__device__ __forceinline__ void turn_pass(int wg) {
  cutlass::arch::NamedBarrier::arrive(kTurnThreads, kTurnBarrier + uint32_t(1 - wg));
}
__device__ __forceinline__ void turn_start(int wg) {
  if (wg == 1) turn_pass(1);
}
__device__ __forceinline__ void turn_end(int wg) {
  if (wg == 0) turn_wait(0);
}

template <class Elem, class Kt>
struct Consumer {
  static_assert(Kt::consumer_wgs == 2, "the ping-pong turns are between two consumer warpgroups");
  static constexpr int D = Kt::head_dim, BM = Kt::block_q, BN = Kt::block_kv, Stages = Kt::stages;
  static constexpr int NT = BN / 8, OT = D / 8;
  using Softmax = RowSoftmax<NT>;

  int tc, lane, t, wg;
  int row0;  // the CTA-local row of the thread's first row; the second is row0 + 8
  // Key blocks that every row of this warpgroup sees whole, [full_begin, full_end): no mask.
  int full_begin, full_end;
  ScoreMode mode;

  __device__ __forceinline__ Consumer(const AttnParams& p, const CtaWork<Kt>& w)
      : tc(int(threadIdx.x) - 128), lane(int(threadIdx.x) % 32), t(lane % 4), wg(tc / 128), mode(p) {
    const int warp = (tc % 128) / 32;
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

  // This warp's reads of one operand of a stage are done (the wgmma that read it has retired);
  // the producer refills it once all consumer warps say so.
  __device__ __forceinline__ void release(uint64_t* empty) const {
    __syncwarp();
    if (lane == 0) cutlass::arch::ClusterBarrier::arrive(empty);
  }

  // Scores of tile i (first key n0) to P, choosing the mask and mode specialization: the
  // choices are uniform across the warpgroup.
  template <class SFrag, class PFrag>
  __device__ __forceinline__ void tile_softmax(const AttnParams& p, const CtaWork<Kt>& w, Softmax& sm,
                                               const SFrag& s_frag, int i, float (&factor)[2], PFrag& p_frag) const {
    const int n = w.n_end - 1 - i;
    const bool full = n >= full_begin && n < full_end;
    const int64_t n0 = int64_t(n) * BN;
    if (full && mode.fused)
      scores_to_p<false, true>(p, w, sm, s_frag, n0, factor, p_frag);
    else if (full)
      scores_to_p<false, false>(p, w, sm, s_frag, n0, factor, p_frag);
    else
      scores_to_p<true, false>(p, w, sm, s_frag, n0, factor, p_frag);
  }

  // The whole walk, then the output. The softmax of tile i runs while the tensor cores do P V of
  // tile i - 1: each step issues S_i = Q K_i^T and O += P_{i-1} V_{i-1} as two wgmma groups,
  // waits for the first, exponentiates S_i into a second P fragment, waits for the second, and
  // only then rescales O by tile i's factor, which P_{i-1} V_{i-1} was summed without. The sums
  // are the same, in the same order, as a walk without the overlap. Each step's GEMMs are issued
  // on this warpgroup's turn (turn_wait, turn_pass), once their operands have landed, so the
  // turn is never held while waiting for the producer. `ring` enters at this work tile's first
  // key tile and leaves past its last; q_phase counts the Q loads waited for.
  template <class TmaO>
  __device__ __forceinline__ void run(const AttnParams& p, const CtaWork<Kt>& w, typename Kt::Storage& st,
                                      Ring<Stages>& ring, uint32_t& q_phase, const TmaO& tma_o) const {
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
    // P in the A-fragment layout of P V: per k16 slice (2 x 2 x 2) elements, compact. tOrP is
    // what the P V in flight reads; tOrPn receives the next tile's.
    using PLayout = Layout<Shape<Shape<_2, _2, _2>, _1, Int<BN / 16>>>;
    Tensor tOrP = make_tensor<typename Kt::T>(PLayout{});
    Tensor tOrPn = make_tensor<typename Kt::T>(PLayout{});
    static_assert(size(decltype(tSrS){}) == 4 * NT && size(decltype(tOrO){}) == 4 * OT, "m64 accumulators");
    clear(tOrO);
    Softmax sm;

    auto issue_qk = [&](int s) {
      warpgroup_fence_operand(tSrS);
      warpgroup_arrive();
      mma_qk.accumulate_ = SM90::GMMA::ScaleOut::Zero;
#pragma unroll
      for (int kb = 0; kb < size<2>(tSrQ); ++kb) {
        cute::gemm(mma_qk, tSrQ(_, _, kb), tSrK(_, _, kb, s), tSrS);
        mma_qk.accumulate_ = SM90::GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
    };
    auto issue_pv = [&](int s) {
      warpgroup_fence_operand(tOrP);
      warpgroup_fence_operand(tOrO);
      warpgroup_arrive();
#pragma unroll
      for (int kb = 0; kb < size<2>(tOrP); ++kb) cute::gemm(mma_pv, tOrP(_, _, kb), tOrV(_, _, kb, s), tOrO);
      warpgroup_commit_batch();
    };

    // k walks the key tiles whose S is computed, v lags it by one: the tile whose P V is.
    Ring<Stages> k = ring, v = ring;
    if (w.n_tiles > 0) {
      Barrier::wait(&st.q_full, q_phase);
      q_phase ^= 1;
      Barrier::wait(&st.k_full[k.stage], k.phase);
      turn_wait(wg);
      issue_qk(k.stage);
      turn_pass(wg);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tSrS);
      release(&st.k_empty[k.stage]);
      if (w.n_tiles == 1) release(&st.q_empty);
      k.advance();
      float factor[2];  // O is still zero: nothing to rescale
      tile_softmax(p, w, sm, tSrS, 0, factor, tOrP);
    }
    for (int i = 1; i < w.n_tiles; ++i) {
      Barrier::wait(&st.k_full[k.stage], k.phase);
      Barrier::wait(&st.v_full[v.stage], v.phase);
      turn_wait(wg);
      issue_qk(k.stage);
      issue_pv(v.stage);
      turn_pass(wg);
      warpgroup_wait<1>();  // groups retire in order: S_i is ready, P_{i-1} V_{i-1} may not be
      warpgroup_fence_operand(tSrS);
      release(&st.k_empty[k.stage]);
      if (i == w.n_tiles - 1) release(&st.q_empty);
      k.advance();
      float factor[2];
      tile_softmax(p, w, sm, tSrS, i, factor, tOrPn);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      warpgroup_fence_operand(tOrP);
      release(&st.v_empty[v.stage]);
      v.advance();
#pragma unroll
      for (int d = 0; d < OT; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) tOrO(4 * d + e) *= factor[e / 2];
#pragma unroll
      for (int j = 0; j < size(tOrP); ++j) tOrP(j) = tOrPn(j);
    }
    if (w.n_tiles > 0) {
      Barrier::wait(&st.v_full[v.stage], v.phase);
      turn_wait(wg);
      issue_pv(v.stage);
      turn_pass(wg);
      warpgroup_wait<0>();
      warpgroup_fence_operand(tOrO);
      release(&st.v_empty[v.stage]);
      v.advance();
    }
    ring = v;
    float l[2];  // the rows' sums, whole across each quad
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) l[hr] = quad_sum(sm.row_sum[hr]);
    store_lse(p, w, sm, l);
    if constexpr (Kt::stage_o)
      store_output_staged(p, w, l, tOrO, st, tma_o);
    else
      store_output(p, w, l, tOrO);
  }

  // The log-sum-exp of the thread's two rows (sums l), where asked.
  __device__ __forceinline__ void store_lse(const AttnParams& p, const CtaWork<Kt>& w, const Softmax& sm,
                                            const float (&l)[2]) const {
    if (!p.lse || t != 0) return;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int64_t row = w.m0 + row0 + hr * 8;
      if (row < w.seq.seqlen_q)
        p.lse[lse_offset(p, w.b, w.seq, row, w.h)] =
            softmax::row_lse(softmax::max_for_exp(sm.row_max[hr]), l[hr], softmax::Domain::log2);
    }
  }

  // Stores the thread's two rows of normalized O straight from the accumulators.
  template <class OFrag>
  __device__ __forceinline__ void store_output(const AttnParams& p, const CtaWork<Kt>& w, const float (&l)[2],
                                               const OFrag& o) const {
    Elem* out = static_cast<Elem*>(p.out);
    const float inv[2] = {softmax::output_scale(l[0]), softmax::output_scale(l[1])};
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int64_t row = w.m0 + row0 + hr * 8;
      if (row >= w.seq.seqlen_q) continue;
      Elem* dst = out + o_offset(p, w.b, w.seq, row, w.h) + 2 * t;
#pragma unroll
      for (int d = 0; d < OT; ++d)
        *reinterpret_cast<uint32_t*>(dst + d * 8) =
            pack_pair<Elem>(o(4 * d + 2 * hr) * inv[hr], o(4 * d + 2 * hr + 1) * inv[hr]);
    }
  }

  // Writes the warpgroup's 64 rows of normalized O into its staging slice, then one thread stores
  // the slice with TMA, which clips the rows past the sequence's end. That thread first waits
  // until its previous store has read the slice; the stage barrier orders the other threads'
  // writes after that wait, and their proxy fence and a second barrier put the writes before the
  // store.
  template <class OFrag, class TmaO>
  __device__ __forceinline__ void store_output_staged(const AttnParams& p, const CtaWork<Kt>& w, const float (&l)[2],
                                                      const OFrag& o, typename Kt::Storage& st,
                                                      const TmaO& tma_o) const {
    const bool issuer = tc % 128 == 0;
    Tensor sO = make_tensor(make_smem_ptr(st.o.o + wg * Kt::o_slice_elems), typename Kt::SmemOSlice{});  // (64, D)
    const float inv[2] = {softmax::output_scale(l[0]), softmax::output_scale(l[1])};
    if (issuer) cute::tma_store_wait<0>();
    cutlass::arch::NamedBarrier::sync(128, kStageBarrier + uint32_t(wg));
    const int r = row0 - wg * 64;  // the thread's first row within the slice
#pragma unroll
    for (int hr = 0; hr < 2; ++hr)
#pragma unroll
      for (int d = 0; d < OT; ++d)
        *reinterpret_cast<uint32_t*>(&sO(r + hr * 8, d * 8 + 2 * t)) =
            pack_pair<Elem>(o(4 * d + 2 * hr) * inv[hr], o(4 * d + 2 * hr + 1) * inv[hr]);
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(128, kStageBarrier + uint32_t(wg));
    if (issuer && wg * 64 < w.rows_here) {
      Tensor mO = tma_o.get_tma_tensor(make_shape(int(p.seqlen_q), Int<D>{}, int(p.heads_q), int(p.batch)));
      Tensor gO = local_tile(mO(_, _, int(w.h), int(w.b)), Shape<_64, Int<D>>{},
                             make_coord(w.m_block * Kt::consumer_wgs + wg, 0));  // (64, D)
      auto [tOg, tOs] = tma_partition(tma_o, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sO), group_modes<0, 2>(gO));
      copy(tma_o, tOs, tOg);
      cute::tma_store_arrive();
    }
  }
};

}  // namespace ioattn::gpu::sm90
