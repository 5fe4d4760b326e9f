// A work tile's share of the problem and the producer side of the CTA's K/V pipeline.
//
// Both roles derive the same key-tile range from each work tile, so the producer issues exactly
// the tiles the consumers wait for and no copy is in flight when the CTA exits. Key tiles are
// walked from the last key block down (key tile i is key block n_end - 1 - i), so the blocks the
// causal diagonal or the sequence end cut come first, as in the sm_80 kernel.
//
// Barriers, all in shared memory and initialized once per CTA: q_full and, per stage s,
// k_full[s] and v_full[s] complete when their TMA transactions land (one producer arrival
// carrying the byte count); q_empty, k_empty[s] and v_empty[s] complete when every consumer warp
// has finished reading that operand (one arrival per warp, after the wgmma that read it has
// retired). The K/V ring runs on across the CTA's work tiles: both sides step a Ring once per key
// tile, so its stage and its round's parity stay in step with the barriers without re-arming
// them. The consumers release K a GEMM before V (consumer.cuh), so the producer, which issues K
// then V per key tile, has the next K in flight while they still read this V. Q is released after
// a work tile's last S = Q K^T, so the producer loads the next work tile's Q and first K/V stages
// while the consumers finish the last P V and store O.
//
// A producer wait names the parity of the round before the one it refills; on a fresh barrier
// that is the phase before the first, which an mbarrier reports complete, so the first round
// (and the first Q) needs no special case.
#pragma once

#include <cutlass/arch/barrier.h>

#include <cute/arch/cluster_sm90.hpp>

#include "common/masking.h"
#include "common/params.h"
#include "gpu/sm90/kernel_traits.cuh"
#include "gpu/sm90/schedule.cuh"

namespace ioattn::gpu::sm90 {

using Barrier = cutlass::arch::ClusterTransactionBarrier;

template <class Kt>
struct CtaWork {
  static constexpr int BM = Kt::block_q, BN = Kt::block_kv;
  int64_t b, h, hk;
  SeqSpan seq;
  int m_block;
  int64_t m0;  // first query row
  int rows_here;
  // Key blocks any row of this query block sees, [n_begin, n_end).
  int n_begin, n_end, n_tiles;

  __device__ __forceinline__ CtaWork(const AttnParams& p, const TileCoord& c)
      : b(c.b), h(c.h), hk(kv_head_of(p, c.h)), seq(sequence(p, c.b)), m_block(c.m_block), m0(int64_t(c.m_block) * BM) {
    rows_here = int(seq.seqlen_q - m0 < BM ? seq.seqlen_q - m0 : BM);
    // visible_keys' begin and end are nondecreasing in the row, so the first and last rows bound
    // the others.
    const KeyRange first = visible_keys(p, seq, m0);
    const KeyRange last = visible_keys(p, seq, m0 + rows_here - 1);
    n_begin = int(first.begin / BN);
    n_end = int((last.end + BN - 1) / BN);
    n_tiles = n_end > n_begin ? n_end - n_begin : 0;
  }
};

// A position in the K/V ring: the stage of a key tile and the parity of that stage's round.
template <int Stages>
struct Ring {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == Stages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

template <class Kt>
__device__ __forceinline__ void init_barriers(typename Kt::Storage& st) {
  Barrier::init(&st.q_full, 1);
  Barrier::init(&st.q_empty, Kt::consumer_wgs * 4);
#pragma unroll
  for (int s = 0; s < Kt::stages; ++s) {
    Barrier::init(&st.k_full[s], 1);
    Barrier::init(&st.v_full[s], 1);
    Barrier::init(&st.k_empty[s], Kt::consumer_wgs * 4);
    Barrier::init(&st.v_empty[s], Kt::consumer_wgs * 4);
  }
  cutlass::arch::fence_barrier_init();
}

// The producer's part of one work tile: one thread issues every copy. Q is reloaded once all
// consumer warps have released the previous work tile's (q_phase counts the Q loads); a stage's K
// (V) is refilled once they have released the K (V) of its previous round.
template <class Kt, class TmaQ, class TmaK, class TmaV>
__device__ __forceinline__ void produce(const AttnParams& p, const CtaWork<Kt>& w, typename Kt::Storage& st,
                                        const TmaQ& tma_q, const TmaK& tma_k, const TmaV& tma_v, Ring<Kt::stages>& ring,
                                        uint32_t& q_phase) {
  constexpr int D = Kt::head_dim, BM = Kt::block_q, BN = Kt::block_kv;
  if (w.n_tiles == 0) return;  // the consumers write zeros without waiting for anything
  Tensor sQ = make_tensor(make_smem_ptr(st.q), typename Kt::SmemQ{});
  Tensor sK = make_tensor(make_smem_ptr(st.k), typename Kt::SmemK{});
  Tensor sV = make_tensor(make_smem_ptr(st.v), typename Kt::SmemV{});

  Tensor mQ = tma_q.get_tma_tensor(make_shape(int(p.seqlen_q), Int<D>{}, int(p.heads_q), int(p.batch)));
  Tensor mK = tma_k.get_tma_tensor(make_shape(int(p.seqlen_k), Int<D>{}, int(p.heads_kv), int(p.batch)));
  Tensor mV = tma_v.get_tma_tensor(make_shape(Int<D>{}, int(p.seqlen_k), int(p.heads_kv), int(p.batch)));
  const int b = int(w.b), h = int(w.h), hk = int(w.hk);
  Tensor gQ = local_tile(mQ(_, _, h, b), Shape<Int<BM>, Int<D>>{}, make_coord(w.m_block, 0));  // (BM, D)
  Tensor gK = local_tile(mK(_, _, hk, b), Shape<Int<BN>, Int<D>>{}, make_coord(_, 0));         // (BN, D, n)
  Tensor gV = local_tile(mV(_, _, hk, b), Shape<Int<D>, Int<BN>>{}, make_coord(0, _));         // (D, BN, n)

  auto [tQg, tQs] = tma_partition(tma_q, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
  auto [tKg, tKs] = tma_partition(tma_k, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto [tVg, tVs] = tma_partition(tma_v, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));

  Barrier::wait(&st.q_empty, q_phase ^ 1);
  Barrier::arrive_and_expect_tx(&st.q_full, Kt::q_bytes);
  copy(tma_q.with(st.q_full), tQg, tQs);
  q_phase ^= 1;
  for (int i = 0; i < w.n_tiles; ++i) {
    const int s = ring.stage, n = w.n_end - 1 - i;
    Barrier::wait(&st.k_empty[s], ring.phase ^ 1);
    Barrier::arrive_and_expect_tx(&st.k_full[s], Kt::kv_bytes);
    copy(tma_k.with(st.k_full[s]), tKg(_, n), tKs(_, s));
    Barrier::wait(&st.v_empty[s], ring.phase ^ 1);
    Barrier::arrive_and_expect_tx(&st.v_full[s], Kt::kv_bytes);
    copy(tma_v.with(st.v_full[s]), tVg(_, n), tVs(_, s));
    ring.advance();
  }
}

}  // namespace ioattn::gpu::sm90
