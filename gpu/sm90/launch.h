// Entry points of the sm_90a flash forward, one explicit specialization per (storage type, head
// dim) in its own translation unit (gpu/fwd_sm90_d<D>_<type>.cu), compiled for sm_90a only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/gpu_tiles.h"
#include "common/params.h"

namespace ioattn::gpu::sm90 {

// Shared memory the head dim's tile needs, from the table: what the dispatcher compares with the
// device's opt-in limit before choosing this path.
constexpr int64_t flash_fwd_smem_bytes(int head_dim) {
  return gpu_tile_sm90_smem_bytes(gpu_tile_sm90(head_dim), head_dim);
}

// The persistent grid indexes its work tiles (query block, query head, sequence) with ints, and
// t + gridDim.x must not wrap: what the dispatcher checks before choosing this path. No request
// that fits in memory comes near the limit.
inline bool flash_fwd_tiles_fit(const AttnParams& p) {
  const int64_t block_q = gpu_tile_sm90(int(p.head_dim)).block_q;
  return (p.seqlen_q + block_q - 1) / block_q * p.heads_q * p.batch <= (int64_t(1) << 30);
}

// What the persistent grid is sized by: the SM count (one CTA each at most) and the L2 size (the
// tile order's sections), read once per device by the caller.
struct DeviceGrid {
  int sms;
  int64_t l2_bytes;
};

// Launches on p.stream; returns the first error of the TMA descriptors, the attribute or the
// launch. Elem is __half or __nv_bfloat16.
template <class Elem, int D>
cudaError_t launch_flash_fwd(const AttnParams& p, const DeviceGrid& dev);

}  // namespace ioattn::gpu::sm90
