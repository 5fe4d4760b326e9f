// The compile-time shape of one sm_90a forward instantiation: its tile (checked against
// gpu_tile_sm90, the planner's table), the swizzled shared-memory layouts that TMA writes and
// wgmma reads, the two warpgroup MMAs and the shared storage with the pipeline's barriers.
//
// Q and K tiles are K-major (D contiguous) in 128-byte swizzle atoms of 8 rows x 64 elements, the
// layout a TMA box of 64 columns writes and the A/B descriptors of Q K^T read. V is read as the B
// operand of P V, (N = D) x (K = keys), whose contiguous dimension is N: it is staged MN-major,
// atoms of 64 D-columns x 8 keys, which is again what a TMA box of the row-major V writes. A D
// that is not a multiple of 64 (96) takes the 64-byte swizzle, atoms of 32 columns: the widest
// that tiles its rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

// cute/tensor.hpp first: the atom headers do not compile on their own (copy_if).
// clang-format off
#include <cute/tensor.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
// clang-format on

#include "common/gpu_tiles.h"
#include "common/params.h"
#include "gpu/sm90/launch.h"

namespace ioattn::gpu::sm90 {

using namespace cute;

// CuTe's name for a storage type: its MMA atoms and TMA formats are keyed by CUTLASS's 16-bit
// types, which have the CUDA types' layout.
template <class Elem>
using CuteElem = std::conditional_t<std::is_same_v<Elem, __nv_bfloat16>, cutlass::bfloat16_t, cutlass::half_t>;

template <class Elem, int D, int BlockQ, int BlockKv, int ConsumerWgs, int Stages>
struct FwdTraits {
  using T = CuteElem<Elem>;
  static constexpr int head_dim = D, block_q = BlockQ, block_kv = BlockKv, stages = Stages;
  static constexpr int consumer_wgs = ConsumerWgs;
  static constexpr int threads = (ConsumerWgs + 1) * 128;
  static constexpr GpuTileSm90 tile{BlockQ, BlockKv, ConsumerWgs, Stages, true};
  static constexpr bool matches(const GpuTileSm90& t) {
    return t.supported && t.block_q == BlockQ && t.block_kv == BlockKv && t.consumer_wgs == ConsumerWgs &&
           t.stages == Stages;
  }
  static_assert(BlockQ == 64 * ConsumerWgs, "each consumer warpgroup owns the 64 rows of one wgmma");
  static_assert(D % 32 == 0 && BlockKv % 64 == 0, "whole swizzle atoms in both tile directions");
  static_assert(Stages >= 2, "the producer fills one stage while the consumers read another");

  // Registers after setmaxnreg: the producer keeps the minimum, the consumers take the rest of the
  // 64K file (24 x 128 + 240 x 256 = 64512 for two consumer warpgroups).
  static constexpr int producer_regs = 24;
  static constexpr int consumer_regs = ConsumerWgs == 2 ? 240 : 160;

  using AtomLayout = Layout<Shape<Int<ConsumerWgs>, _1, _1>>;
  using MmaQK = decltype(make_tiled_mma(SM90::GMMA::ss_op_selector<T, T, float, Shape<_64, Int<BlockKv>, Int<D>>>(),
                                        AtomLayout{}));
  using MmaPV = decltype(make_tiled_mma(SM90::GMMA::rs_op_selector<T, T, float, Shape<_64, Int<D>, Int<BlockKv>>,
                                                                   SM90::GMMA::Major::K, SM90::GMMA::Major::MN>(),
                                        AtomLayout{}));

  using AtomK = std::conditional_t<D % 64 == 0, SM90::GMMA::Layout_K_SW128_Atom<T>, SM90::GMMA::Layout_K_SW64_Atom<T>>;
  using AtomMN =
      std::conditional_t<D % 64 == 0, SM90::GMMA::Layout_MN_SW128_Atom<T>, SM90::GMMA::Layout_MN_SW64_Atom<T>>;
  using SmemQ = decltype(tile_to_shape(AtomK{}, Shape<Int<BlockQ>, Int<D>>{}));
  using SmemKStage = decltype(tile_to_shape(AtomK{}, Shape<Int<BlockKv>, Int<D>>{}));
  using SmemK = decltype(tile_to_shape(AtomK{}, Shape<Int<BlockKv>, Int<D>, Int<Stages>>{}));
  // V's atoms run along the keys first, so that each atom-wide slice of D is one TMA box of
  // block_kv rows (in D-first order a box would hold 8 keys).
  using SmemVStage = decltype(tile_to_shape(AtomMN{}, Shape<Int<D>, Int<BlockKv>>{}, Step<_2, _1>{}));
  using SmemV = decltype(tile_to_shape(AtomMN{}, Shape<Int<D>, Int<BlockKv>, Int<Stages>>{}, Step<_2, _1, _3>{}));

  // O's staging: one 64 x D slice per consumer warpgroup, laid out as Q (a TMA box of each slice
  // writes its rows), where gpu_tile_sm90_stages_o leaves room for it.
  static constexpr bool stage_o = gpu_tile_sm90_stages_o(tile, D);
  using SmemOSlice = decltype(tile_to_shape(AtomK{}, Shape<_64, Int<D>>{}));
  static constexpr int o_slice_elems = int(cosize_v<SmemOSlice>);

  static constexpr uint32_t q_bytes = BlockQ * D * sizeof(T);
  static constexpr uint32_t kv_bytes = BlockKv * D * sizeof(T);  // one of K or V, one stage

  // The tiles first, each a whole number of 1 KiB swizzle periods; then the barriers: q_full and
  // per stage k_full and v_full (the producer's transactions), q_empty and per stage k_empty and
  // v_empty (the consumers' releases: K is free once S is computed, a GEMM before V is; Q once the
  // work tile's last S is); then O's staging slices, where there are any.
  template <bool Staged, int Elems>
  struct OStage {
    alignas(1024) T o[Elems];
  };
  template <int Elems>
  struct OStage<false, Elems> {};
  struct Storage {
    alignas(1024) T q[cosize_v<SmemQ>];
    alignas(1024) T k[cosize_v<SmemK>];
    alignas(1024) T v[cosize_v<SmemV>];
    alignas(1024) uint64_t q_full;
    uint64_t q_empty;
    uint64_t k_full[Stages], v_full[Stages], k_empty[Stages], v_empty[Stages];
    OStage<stage_o, ConsumerWgs * o_slice_elems> o;  // last: empty where O is not staged
  };
  // The dynamic allocation: the storage plus the slack that aligns it to 1 KiB (the runtime only
  // promises 16 bytes).
  static constexpr int64_t smem_bytes = int64_t(sizeof(Storage)) + 1024;
  static_assert(smem_bytes == gpu_tile_sm90_smem_bytes(tile, D), "storage disagrees with the planner's table");
};

// Global views whose modes match the shared layouts: Q and K (rows, D, heads, batch), V
// transposed (D, rows, heads, batch), each with the request's element strides and D contiguous.
template <class Elem, int D>
auto gmem_q(const AttnParams& p) {
  return make_tensor(make_gmem_ptr(static_cast<const CuteElem<Elem>*>(p.q)),
                     make_layout(make_shape(int(p.seqlen_q), Int<D>{}, int(p.heads_q), int(p.batch)),
                                 make_stride(p.q_seq_stride, _1{}, p.q_head_stride, p.q_batch_stride)));
}
template <class Elem, int D>
auto gmem_k(const AttnParams& p) {
  return make_tensor(make_gmem_ptr(static_cast<const CuteElem<Elem>*>(p.k)),
                     make_layout(make_shape(int(p.seqlen_k), Int<D>{}, int(p.heads_kv), int(p.batch)),
                                 make_stride(p.k_seq_stride, _1{}, p.k_head_stride, p.k_batch_stride)));
}
template <class Elem, int D>
auto gmem_o(const AttnParams& p) {
  return make_tensor(make_gmem_ptr(static_cast<CuteElem<Elem>*>(p.out)),
                     make_layout(make_shape(int(p.seqlen_q), Int<D>{}, int(p.heads_q), int(p.batch)),
                                 make_stride(p.o_seq_stride, _1{}, p.o_head_stride, p.o_batch_stride)));
}
template <class Elem, int D>
auto gmem_vt(const AttnParams& p) {
  return make_tensor(make_gmem_ptr(static_cast<const CuteElem<Elem>*>(p.v)),
                     make_layout(make_shape(Int<D>{}, int(p.seqlen_k), int(p.heads_kv), int(p.batch)),
                                 make_stride(_1{}, p.v_seq_stride, p.v_head_stride, p.v_batch_stride)));
}

// The TMA descriptors, built on the host per call (they hold the base pointers) and passed
// to the kernel as __grid_constant__ parameters.
template <class Kt, class Elem>
auto make_tma_q(const AttnParams& p) {
  return make_tma_copy(SM90_TMA_LOAD{}, gmem_q<Elem, Kt::head_dim>(p), typename Kt::SmemQ{});
}
template <class Kt, class Elem>
auto make_tma_k(const AttnParams& p) {
  return make_tma_copy(SM90_TMA_LOAD{}, gmem_k<Elem, Kt::head_dim>(p), typename Kt::SmemKStage{});
}
template <class Kt, class Elem>
auto make_tma_v(const AttnParams& p) {
  return make_tma_copy(SM90_TMA_LOAD{}, gmem_vt<Elem, Kt::head_dim>(p), typename Kt::SmemVStage{});
}
// O's store descriptor, one warpgroup's 64 rows per box; a tile without O staging gets none.
template <class Kt, class Elem>
auto make_tma_o(const AttnParams& p) {
  if constexpr (Kt::stage_o)
    return make_tma_copy(SM90_TMA_STORE{}, gmem_o<Elem, Kt::head_dim>(p), typename Kt::SmemOSlice{});
  else
    return 0;
}

}  // namespace ioattn::gpu::sm90
