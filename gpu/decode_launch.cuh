// Entry points of the decode kernel, one explicit specialization per (storage type, head dim) in
// its own translation unit (gpu/decode_d<D>.cu), as the sm80 forward does.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/gpu_tiles.h"
#include "common/params.h"

namespace ioattn::gpu::decode {

// Split partials, fp32: row r (of kGpuDecodeMaxRows) of (split, sequence b, kv head hk) is
// index ((split * B + b) * Hkv + hk) * kGpuDecodeMaxRows + r; O holds head_dim values per row,
// unnormalized, m is the running max in the log2 domain, l the sum of exp2(s - m).
struct Partials {
  float* o = nullptr;
  float* m = nullptr;
  float* l = nullptr;
  int splits = 1;
};

inline int64_t partial_rows(const AttnParams& p, int splits) {
  return int64_t(splits) * p.batch * p.heads_kv * kGpuDecodeMaxRows;
}

// Shared memory of the head dim's decode tile, from the table.
constexpr int64_t decode_smem_bytes(int head_dim) { return gpu_tile_smem_bytes(gpu_decode_tile(head_dim), head_dim); }

// Grants the split kernel its shared memory on the current device; called before the KV-cache
// append, so that a failure leaves the cache as it was.
template <class Elem, int D>
cudaError_t prepare_decode();

// Launches the split kernel on p.stream (prepare_decode first): with part.splits == 1 it writes
// out and lse, else the partials. Elem is __half or __nv_bfloat16.
template <class Elem, int D>
cudaError_t launch_decode(const AttnParams& p, const Partials& part);

// Folds the partials of every split, in split order, into out and lse.
template <class Elem>
cudaError_t launch_merge(const AttnParams& p, const Partials& part);

}  // namespace ioattn::gpu::decode
