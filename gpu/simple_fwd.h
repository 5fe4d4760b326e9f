// The portable CUDA forward: one warp per query row, fp32 arithmetic on the CUDA cores, any
// storage type, any element strides, Dv != D, any head dim up to kSimpleMaxHeadDim. It is the
// f32 storage path, the path of head dims without a tensor-core tile, and the fallback for
// half-precision layouts the tensor-core kernel cannot copy with 16-byte cp.async (row strides
// not multiples of 8 elements, misaligned pointers, Dv != D) or tiles a device cannot hold.
// Correct, not fast: every query row re-reads its keys from L2.
#pragma once

#include <cuda_runtime.h>

#include "common/gpu_tiles.h"
#include "common/params.h"

namespace ioattn::gpu {

// Largest head dim (q/k and v) the portable path holds in registers: 8 values per lane.
constexpr int kSimpleMaxHeadDim = kGpuPortableMaxHeadDim;

cudaError_t launch_simple_fwd(const AttnParams& p);

}  // namespace ioattn::gpu
