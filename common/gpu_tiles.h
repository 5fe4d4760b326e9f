// The CUDA tile table: one constexpr function that the planner (plan_gpu) and the kernel
// instantiations both call, so the plan that `ioattn plan` prints and the kernel that runs
// cannot disagree (the role of hopper/tile_size.h in FlashAttention). Owned by gpu/.
#pragma once

#include <cstdint>

namespace ioattn {

struct GpuTile {
  int block_q;   // query rows per CTA: 16 rows per warp for m16n8k16
  int block_kv;  // key rows per pipeline stage
  int warps;     // warps per CTA
  int stages;    // K/V shared-memory buffers in the cp.async pipeline
  bool supported;
};

// Shared memory a tile needs: Q tile plus `stages` K and V tiles, 2-byte elements.
constexpr int64_t gpu_tile_smem_bytes(const GpuTile& t, int head_dim) {
  return (int64_t(t.block_q) * head_dim + int64_t(t.stages) * 2 * t.block_kv * head_dim) * 2;
}

constexpr GpuTile gpu_tile(int head_dim) {
  switch (head_dim) {
    case 64: return {128, 128, 4, 2, true};
    case 96: return {128, 64, 4, 2, true};
    case 128: return {128, 64, 4, 2, true};
    case 256: return {128, 64, 8, 2, true};
    default: return {0, 0, 0, 0, false};
  }
}

}  // namespace ioattn
