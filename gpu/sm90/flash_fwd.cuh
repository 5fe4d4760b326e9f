// FlashAttention forward for sm_90a, warp-specialized and persistent: a grid of at most one CTA
// per SM, each of (consumer_wgs + 1) warpgroups, walks a static sequence of work tiles (query
// block, head, sequence; gpu/sm90/schedule.cuh orders them). Warpgroup 0 produces: one thread
// issues the TMA copies of each work tile's Q tile and of its K/V tiles into a `stages`-deep ring
// of swizzled shared buffers, each completing on an mbarrier. The other warpgroups consume: each
// owns 64 query rows, runs S = Q K^T and O += P V on wgmma with P kept in registers, and the
// online softmax between them (gpu/sm90/consumer.cuh). setmaxnreg moves the producer's registers
// to the consumers. Both roles walk the same work tiles and step the same pipeline state
// (gpu/sm90/pipeline.cuh), so the producer's loads for the next work tile overlap the consumers'
// last P V and O stores of this one.
// O leaves through a shared staging buffer and a TMA store per consumer warpgroup where the tile
// has room for it (gpu_tile_sm90_stages_o), else straight from the accumulators.
//
// Why persistent: with one CTA per work tile, each CTA paid its launch, barrier setup, first Q and
// K round trip to HBM and its O stores with nothing to hide them behind, since one CTA fills an
// SM. Here only the first work tile of a CTA pays the first three; the next Q and K/V stages load
// under the last P V and the O stores. That weighs most where a work tile has few key tiles.
// Wave quantization of equal tiles stays; under a causal mask the order's alternating rounds
// keep the static split even where the hardware's dispatch of the old grid did not
// (bench/results/gpu-sm90-persist-2026-12-07.md).
//
// Included only by the per-(head dim, dtype) translation units (gpu/fwd_sm90_*.cu), which CMake
// compiles for sm_90a alone.
#pragma once

#include <cuda_runtime.h>
#include <cutlass/arch/reg_reconfig.h>

#include "common/gpu_tiles.h"
#include "common/params.h"
#include "gpu/sm90/consumer.cuh"
#include "gpu/sm90/kernel_traits.cuh"
#include "gpu/sm90/launch.h"
#include "gpu/sm90/pipeline.cuh"
#include "gpu/sm90/schedule.cuh"

namespace ioattn::gpu::sm90 {

// One CTA per SM: the producer's and consumers' registers fill the file (kernel_traits.cuh).
// The register cap of __launch_bounds__(threads, 1) is what lets setmaxnreg take effect.
template <class Elem, class Kt, class TmaQ, class TmaK, class TmaV, class TmaO>
__global__ void __launch_bounds__(Kt::threads, 1)
    flash_fwd_kernel(const __grid_constant__ AttnParams p, const __grid_constant__ TileSchedule sched,
                     const __grid_constant__ TmaQ tma_q, const __grid_constant__ TmaK tma_k,
                     const __grid_constant__ TmaV tma_v, const __grid_constant__ TmaO tma_o) {
  extern __shared__ unsigned char smem_raw[];
  // The swizzle that TMA writes and wgmma reads repeats every 1 KiB of shared address space; the
  // allocation carries the slack to align to it.
  const uintptr_t base = reinterpret_cast<uintptr_t>(smem_raw);
  auto& st = *reinterpret_cast<typename Kt::Storage*>((base + 1023) & ~uintptr_t(1023));
  const int warp = int(threadIdx.x) / 32;
  if (warp == 0 && cute::elect_one_sync()) {
    init_barriers<Kt>(st);
    cute::prefetch_tma_descriptor(tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(tma_v.get_tma_descriptor());
    if constexpr (Kt::stage_o) cute::prefetch_tma_descriptor(tma_o.get_tma_descriptor());
  }
  __syncthreads();

  Ring<Kt::stages> ring;
  uint32_t q_phase = 0;
  if (warp < 4) {
    cutlass::arch::warpgroup_reg_dealloc<Kt::producer_regs>();
    if (warp == 0 && cute::elect_one_sync())
      for (int t = int(blockIdx.x); t < sched.tiles; t += int(gridDim.x))
        produce<Kt>(p, CtaWork<Kt>(p, sched.tile(t)), st, tma_q, tma_k, tma_v, ring, q_phase);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Kt::consumer_regs>();
    const int wg = warp / 4 - 1;
    turn_start(wg);
    for (int t = int(blockIdx.x); t < sched.tiles; t += int(gridDim.x)) {
      const CtaWork<Kt> w(p, sched.tile(t));
      const Consumer<Elem, Kt> consumer(p, w);
      consumer.run(p, w, st, ring, q_phase, tma_o);
    }
    turn_end(wg);
    // The staging buffer must outlive the last O store's reads of it.
    if constexpr (Kt::stage_o)
      if (int(threadIdx.x) % 128 == 0) cute::tma_store_wait<0>();
  }
}

// Host side of one instantiation: the tile literals are the instantiation unit's, asserted equal
// to the planner's table. The caller has checked the shared memory against the device, the
// strides against what a TMA descriptor can address and the tile count (flash_fwd_tiles_fit).
template <class Elem, int D, int BlockQ, int BlockKv, int ConsumerWgs, int Stages>
cudaError_t launch_tile(const AttnParams& p, const DeviceGrid& dev) {
  using Kt = FwdTraits<Elem, D, BlockQ, BlockKv, ConsumerWgs, Stages>;
  static_assert(Kt::matches(gpu_tile_sm90(D)), "instantiated tile differs from gpu_tile_sm90(D), the planner's table");
  static_assert(Kt::smem_bytes == flash_fwd_smem_bytes(D), "shared-memory size disagrees with the table");
  const auto tma_q = make_tma_q<Kt, Elem>(p);
  const auto tma_k = make_tma_k<Kt, Elem>(p);
  const auto tma_v = make_tma_v<Kt, Elem>(p);
  const auto tma_o = make_tma_o<Kt, Elem>(p);
  auto kernel = flash_fwd_kernel<Elem, Kt, decltype(tma_q), decltype(tma_k), decltype(tma_v), decltype(tma_o)>;
  // Per call rather than once: the attribute belongs to the current device's context.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Kt::smem_bytes));
  if (err != cudaSuccess) return err;
  const TileSchedule sched = make_schedule(p, BlockQ, D, dev.sms, dev.l2_bytes);
  kernel<<<sched.ctas, Kt::threads, Kt::smem_bytes, static_cast<cudaStream_t>(p.stream)>>>(p, sched, tma_q, tma_k,
                                                                                           tma_v, tma_o);
  return cudaGetLastError();
}

}  // namespace ioattn::gpu::sm90
