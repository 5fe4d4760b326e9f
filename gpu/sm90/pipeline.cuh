// The CTA's share of the problem and the producer side of its K/V pipeline.
//
// Both roles derive the same key-tile range from the request, so the producer issues exactly the
// tiles the consumers wait for and no copy is in flight when the CTA exits. Tiles are walked from
// the last key block down (tile index i is key block n_end - 1 - i), so the blocks the causal
// diagonal or the sequence end cut come first, as in the sm_80 kernel.
//
// Barriers, all in shared memory: q_full and, per stage s, k_full[s] and v_full[s] complete when
// their TMA transactions land (one producer arrival carrying the byte count); k_empty[s] and
// v_empty[s] complete when every consumer warp has finished reading that operand of stage s (one
// arrival per warp, after the wgmma that read it has retired). Tile i uses stage i % Stages in
// its (i / Stages)-th round, whose parity is what the waits name. The consumers release K a GEMM
// before V (consumer.cuh), so the producer, which issues K then V per tile, has the next K in
// flight while they still read this V.
#pragma once

#include <cutlass/arch/barrier.h>

#include <cute/arch/cluster_sm90.hpp>

#include "common/masking.h"
#include "common/params.h"
#include "gpu/sm90/kernel_traits.cuh"

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

  __device__ __forceinline__ explicit CtaWork(const AttnParams& p)
      : b(blockIdx.z),
        h(blockIdx.y),
        hk(kv_head_of(p, blockIdx.y)),
        seq(sequence(p, blockIdx.z)),
        // Heaviest query blocks (most visible keys under a causal mask) launch first.
        m_block(int(gridDim.x) - 1 - int(blockIdx.x)),
        m0(int64_t(m_block) * BM) {
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

template <class Kt>
__device__ __forceinline__ void init_barriers(typename Kt::Storage& st) {
  Barrier::init(&st.q_full, 1);
#pragma unroll
  for (int s = 0; s < Kt::stages; ++s) {
    Barrier::init(&st.k_full[s], 1);
    Barrier::init(&st.v_full[s], 1);
    Barrier::init(&st.k_empty[s], Kt::consumer_wgs * 4);
    Barrier::init(&st.v_empty[s], Kt::consumer_wgs * 4);
  }
  cutlass::arch::fence_barrier_init();
}

// The producer: one thread issues every copy. A stage's K (V) is refilled once all consumer warps
// have released the K (V) of its previous round; Q is loaded once, ahead of the first K tile.
template <class Kt, class TmaQ, class TmaK, class TmaV>
__device__ __forceinline__ void produce(const AttnParams& p, const CtaWork<Kt>& w, typename Kt::Storage& st,
                                        const TmaQ& tma_q, const TmaK& tma_k, const TmaV& tma_v) {
  constexpr int D = Kt::head_dim, BM = Kt::block_q, BN = Kt::block_kv, Stages = Kt::stages;
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

  Barrier::arrive_and_expect_tx(&st.q_full, Kt::q_bytes);
  copy(tma_q.with(st.q_full), tQg, tQs);
  for (int i = 0; i < w.n_tiles; ++i) {
    const int s = i % Stages, n = w.n_end - 1 - i;
    const uint32_t previous_round = ((i / Stages) - 1) & 1;
    if (i >= Stages) Barrier::wait(&st.k_empty[s], previous_round);
    Barrier::arrive_and_expect_tx(&st.k_full[s], Kt::kv_bytes);
    copy(tma_k.with(st.k_full[s]), tKg(_, n), tKs(_, s));
    if (i >= Stages) Barrier::wait(&st.v_empty[s], previous_round);
    Barrier::arrive_and_expect_tx(&st.v_full[s], Kt::kv_bytes);
    copy(tma_v.with(st.v_full[s]), tVg(_, n), tVs(_, s));
  }
}

}  // namespace ioattn::gpu::sm90
