// The CUDA tile table: one constexpr function that the planner (plan_gpu) and the kernel
// instantiations both call, so the plan that `ioattn plan` prints and the kernel that runs
// cannot disagree (the role of hopper/tile_size.h in FlashAttention). Each kernel instantiation
// static_asserts that its template tile is gpu_tile(head_dim).
#pragma once

#include <cstdint>

namespace ioattn {

// The portable CUDA kernel (gpu/simple_fwd.cu, one warp per query row) holds a row of q and of
// the output accumulator in registers, 8 values per lane of 32: head dims up to 256. Head dims
// without a tile below run there.
constexpr int kGpuPortableMaxHeadDim = 256;

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
// against 16 rows per warp. D = 64 holds the same 64 + 128 with block_kv = 128, which halves the
// per-key-block softmax, barrier and pipeline overhead against 64 keys (and is FlashAttention-2's
// own D = 64 tile); ptxas spills 96 bytes, which costs less than the halved overhead except at
// short causal S, where the wider diagonal block masks more. D = 256 cannot afford 32 rows
// (256 + ...), so 8 warps of 16 rows. 8 warps of 16 rows at two CTAs per SM (128 registers)
// would double the K/V ldmatrix traffic per FLOP, which twice the warps do not buy back.
// Shared memory: D=64 92 KB, D=96 80 KB, D=128 104 KB (two CTAs per SM on an H100/H200, 227 KB),
// D=256 202 KB (one CTA; larger than an A100's 163 KB opt-in: the launcher then falls back).
constexpr GpuTile gpu_tile(int head_dim) {
  switch (head_dim) {
    case 64: return {128, 128, 4, 2, true};
    case 96: return {128, 64, 4, 2, true};
    case 128: return {128, 64, 4, 2, true};
    case 256: return {128, 64, 8, 2, true};
    default: return {0, 0, 0, 0, false};
  }
}

// The sm_90a forward (gpu/sm90/): a producer warpgroup feeds K/V tiles by TMA and two consumer
// warpgroups each own 64 query rows (the M of one wgmma), so block_q = 128. Registers per
// consumer thread after setmaxnreg (240): S is 64 x block_kv / 128 = block_kv / 2 fp32 and O
// D / 2 fp32, so block_kv = 128 leaves S = 64 and O = 64 at D = 128 with room for P (32) and the
// softmax; 128 keys per tile also halve the per-tile barrier and softmax overhead against 64.
// Shared memory: Q and `stages` K and V tiles, swizzled without padding (the 128-byte swizzle
// that TMA writes and wgmma reads), plus one 1 KiB block for the pipeline's barriers and one for
// aligning the tiles to the swizzle's 1 KiB period (O's staging buffer comes on top where it fits,
// gpu_tile_sm90_stages_o). D = 128: 32 + 2 x 2 x 32 + 2 = 162 KiB (one
// CTA per SM: the 384 threads' registers are the limit anyway); D = 64 affords a third stage,
// 16 + 3 x 2 x 16 + 2 = 114 KiB. D = 256 halves block_kv: O alone is 128 registers, and with S
// (32) and P (16) of two key tiles in flight about 200 of the 240 are taken; 128 keys would put
// S at 64 and shared memory at 64 + 2 x 2 x 64 + 2 = 322 KiB. With 64 keys: 64 + 2 x 2 x 32 + 2
// = 194 KiB of the 227 KiB a block may opt into. D = 96 takes D = 128's tile: 24 + 2 x 2 x 24 + 2
// = 122 KiB, its rows in 64-byte swizzle atoms (96 columns are three 32-column atoms, not whole
// 64-column ones).
struct GpuTileSm90 {
  int block_q;       // query rows per CTA: 64 per consumer warpgroup
  int block_kv;      // key rows per pipeline stage
  int consumer_wgs;  // consumer warpgroups; one more warpgroup produces
  int stages;        // K/V shared-memory buffers between the producer and the consumers
  bool supported;
};

inline constexpr int kGpuSm90SmemOverhead = 2048;  // barriers + alignment of the tiles to 1 KiB

// Hopper's opt-in maximum of shared memory per thread block (227 KiB).
inline constexpr int64_t kGpuSmemPerBlockMax = 227 * 1024;

// Q and the K/V ring, with the barriers and alignment.
constexpr int64_t gpu_tile_sm90_operand_bytes(const GpuTileSm90& t, int head_dim) {
  return (int64_t(t.block_q) + int64_t(t.stages) * 2 * t.block_kv) * head_dim * 2 + kGpuSm90SmemOverhead;
}

// O leaves through shared memory, one TMA store per consumer warpgroup, where the tile leaves room
// for a block_q x D staging buffer: a store then takes one instruction of one thread instead of
// D / 8 four-byte stores of every consumer thread, and its writes run while the warpgroup starts
// the next work tile. D = 256's operands take 194 of the 227 KiB, so there the consumers store O
// from registers.
constexpr bool gpu_tile_sm90_stages_o(const GpuTileSm90& t, int head_dim) {
  return gpu_tile_sm90_operand_bytes(t, head_dim) + int64_t(t.block_q) * head_dim * 2 <= kGpuSmemPerBlockMax;
}

constexpr int64_t gpu_tile_sm90_smem_bytes(const GpuTileSm90& t, int head_dim) {
  return gpu_tile_sm90_operand_bytes(t, head_dim) +
         (gpu_tile_sm90_stages_o(t, head_dim) ? int64_t(t.block_q) * head_dim * 2 : 0);
}

constexpr GpuTileSm90 gpu_tile_sm90(int head_dim) {
  switch (head_dim) {
    case 64: return {128, 128, 2, 3, true};
    case 96: return {128, 128, 2, 2, true};
    case 128: return {128, 128, 2, 2, true};
    case 256: return {128, 64, 2, 2, true};
    default: return {0, 0, 0, 0, false};
  }
}

// Decode (gpu/decode.cuh): a CTA owns the G x Sq query rows that share one kv head (GQA
// packing), so each K/V byte is read once per step. The rows are one m16n8k16 A tile: up to 16
// rows cost the same 2 * D / 16 mma per key as one row, and at 4.8 TB/s the H200 streams
// 9.4 G keys/s of D = 128 (512 B of K and V each), 77 TFLOP/s of padded mma, ~10% of the
// mma.sync peak. Beyond 16 rows a second A tile would double the registers of O, while the
// prefill kernel's 128-row tiles then waste less. Each of the 4 warps takes 16 of a stage's 64
// keys (one k16 slice of P V). Bytes in flight: 4.8 TB/s x ~600 ns of HBM latency = 2.9 MB,
// 22 KB per SM; two stages ahead of the math hold 2 x 64 x 512 B = 64 KB per CTA at D = 128.
inline constexpr int kGpuDecodeMaxRows = 16;

constexpr bool gpu_decode_rows(int64_t group, int64_t seqlen_q) { return group * seqlen_q <= kGpuDecodeMaxRows; }

// Shared memory as gpu_tile_smem_bytes: D = 64 56 KiB, 96 81 KiB, 128 106 KiB (two CTAs per SM
// on an H200: 2 x (106 + 1) KiB < 228 KiB), 256 206 KiB (one).
constexpr GpuTile gpu_decode_tile(int head_dim) {
  switch (head_dim) {
    case 64:
    case 96:
    case 128:
    case 256: return {kGpuDecodeMaxRows, 64, 4, 3, true};
    default: return {0, 0, 0, 0, false};
  }
}

}  // namespace ioattn
