// The CUDA tile table: one constexpr function that the planner (plan_gpu) and the kernel
// instantiations both call, so the plan that `ioattn plan` prints and the kernel that runs
// cannot disagree (the role of hopper/tile_size.h in FlashAttention). Each kernel instantiation
// static_asserts that its template tile is gpu_tile(head_dim). Owned by gpu/.
#pragma once

#include <cstdint>

namespace ioattn {

struct GpuTile {
  int block_q;   // query rows per CTA; each warp owns block_q / warps rows (16 per m16n8k16 tile)
  int block_kv;  // key rows per pipeline stage
  int warps;     // warps per CTA
  int stages;    // K/V shared-memory buffers in the cp.async pipeline
  bool supported;
};

// Shared-memory row pitch in elements: one 16-byte chunk of padding per row. The pitch in 16-byte
// units is then odd (9, 13, 17, 33 for D = 64, 96, 128, 256), so the eight rows one ldmatrix
// phase reads land in eight distinct 16-byte bank groups: conflict-free for every D, D = 96 too,
// where a 128-byte XOR swizzle would not tile the 12-chunk row.
constexpr int gpu_tile_row_pitch(int head_dim) { return head_dim + 8; }

// Shared memory a tile needs: the Q tile plus `stages` K and V tiles, 2-byte elements.
constexpr int64_t gpu_tile_smem_bytes(const GpuTile& t, int head_dim) {
  return (int64_t(t.block_q) + int64_t(t.stages) * 2 * t.block_kv) * gpu_tile_row_pitch(head_dim) * 2;
}

// Register budget per thread (255 max) drives the shapes: a warp with 32 query rows holds
// O = 32*D/32 = D fp32 and S = 32*block_kv/32 = block_kv fp32 per lane. D = 128: 128 + 64 with
// 32 rows per warp (4 warps x 32 = 128 rows), which halves the K/V shared-memory reads per FLOP
// against 16 rows per warp; D = 64 with block_kv = 128 would hold S = 128 and spills, so 64 keys
// and a third stage. D = 256 cannot afford 32 rows (256 + ...), so 8 warps of 16 rows.
// Measured on the H200 (bench/results/gpu-forward.md): 8 warps of 16 rows at two CTAs per SM
// (128 registers) ran slower at D = 64 (242 vs 257 TFLOP/s) and at D = 128 with 32 keys (253 vs
// 317): twice the warps did not buy back twice the K/V ldmatrix traffic per FLOP.
// Shared memory: D=64 74 KB, D=96 80 KB, D=128 104 KB (two CTAs per SM on an H100/H200, 227 KB),
// D=256 202 KB (one CTA; larger than an A100's 163 KB opt-in: the launcher then falls back).
constexpr GpuTile gpu_tile(int head_dim) {
  switch (head_dim) {
    case 64: return {128, 64, 4, 3, true};
    case 96: return {128, 64, 4, 2, true};
    case 128: return {128, 64, 4, 2, true};
    case 256: return {128, 64, 8, 2, true};
    default: return {0, 0, 0, 0, false};
  }
}

}  // namespace ioattn
