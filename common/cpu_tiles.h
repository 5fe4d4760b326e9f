// The CPU register tile, shared by the planner (plan_cpu) and the Highway kernels so that block
// sizes are whole multiples of what the micro-kernels consume.
//
// Both micro-kernels of cpu/flash_kernel.cc have the same shape: `rows` scalars broadcast, times
// `vecs` vectors loaded, into rows x vecs accumulators.
//  * scores, S^T = K Q^T: rows are keys (broadcast from K rows), vectors run over query rows
//    (Q^T is packed so a vector holds one element of `lanes` query rows);
//  * output, O += P V: rows are query rows (broadcast from P), vectors run over the V columns.
// Why this many accumulators: an FMA has 4 cycles of latency and two FMA ports on Zen 3 / Skylake,
// so 4 x 2 = 8 independent accumulator chains must be in flight to keep both ports busy; more
// than 8 also hides the broadcast and load latency. The register file bounds it from above.
#pragma once

namespace ioattn {

struct CpuRegisterTile {
  int rows;  // scalars broadcast per step (keys in the score kernel, query rows in the PV kernel)
  int vecs;  // vectors loaded per step (query-row vectors, or V-column vectors)
};

// simd_bits: width of the dispatched target (128 SSE4/NEON, 256 AVX2, 512 AVX-512).
// AVX2 has 16 vector registers: 6 rows x 2 vectors = 12 accumulators + 2 loads + 1 broadcast
// = 15; 12 >= 8 chains in flight. AVX-512 has 32: 8 rows x 3 vectors = 24 accumulators + 3 loads
// + 1 broadcast = 28. The 128-bit targets keep the AVX2 shape (16 registers as well).
constexpr CpuRegisterTile cpu_register_tile(int simd_bits) {
  return simd_bits >= 512 ? CpuRegisterTile{8, 3} : CpuRegisterTile{6, 2};
}

constexpr int cpu_float_lanes(int simd_bits) { return simd_bits / 32; }

// The P V kernel's own shape (the score kernel and the planner keep cpu_register_tile). AVX-512:
// 6 rows x 4 vectors = 24 accumulators + 4 V loads + 1 broadcast = 29 registers, 64 columns, so
// Dv = 64 and 128 are whole tiles; the 8 x 3 tile (48 columns) split Dv = 128 into 3 + 3 + 2
// vectors and Dv = 64 into 3 + 1, and the 8 x 1 remainder (8 chains, 9 loads per 8 FMAs) ran a
// quarter of the D = 64 P V work at about half speed. Per key it loads 4 + 6 = 10 operands for
// 24 FMAs (8 x 3: 11). The 48-row panel is 8 groups of 6 rows. AVX2 and narrower keep 6 x 2.
constexpr CpuRegisterTile cpu_pv_register_tile(int simd_bits) {
  return simd_bits >= 512 ? CpuRegisterTile{6, 4} : CpuRegisterTile{6, 2};
}

// Block sizes: the kernels run any block_q and block_kv, the edges through the remainder shapes
// of their tables (a panel of fewer than 48 rows scores with fewer row vectors, a block that is
// not a whole number of score steps ends on a shorter one). plan_cpu rounds block_q to
// lcm(rows, G), whole query positions, and block_kv to vecs x lanes (48 on AVX-512, 16 on AVX2).
// Keys per partial sum of P V and of the row sum l: a partial starts from zero, takes up to this
// many terms at its own magnitude, then adds into the running totals once. Summed straight into
// O, each small term rounds at the ulp of the row's total, an error growing with sqrt(keys) once
// one large score dominates a row; partials keep it to that of a blocked f32 sum. 128 makes a
// planned key block (96-128 keys) one partial: one add per accumulator per block.
constexpr int cpu_sum_chunk_keys = 128;

// Decode: when a sequence's query rows (G heads x Sq positions) number at most this many, the
// kernel streams K/V straight from the cache, one task per (sequence, key split) over all kv
// heads (cpu/flash_kernel.cc, DecodeRange); the planner then splits the key axis to give the
// cores batch x splits tasks. 8 rows: 2 x 8 x D FMA lanes per key still run faster than a
// core's share of DRAM delivers the key's 4 x D bytes (f16), see the kernel's arithmetic.
constexpr int cpu_decode_max_rows = 8;
// Whether a unit of rows_per_unit query rows (per sequence and kv head) runs in decode mode.
constexpr bool cpu_decode_mode(int64_t rows_per_unit) {
  return rows_per_unit > 0 && rows_per_unit <= cpu_decode_max_rows;
}
// How the CPU kernel runs a call:
//  * decode: every sequence's query rows per kv head fit cpu_decode_max_rows; a task is a
//    (sequence, key split) over all kv heads, streaming K/V straight from the cache;
//  * head: a task is a whole (sequence, kv head) whose K/V is converted once into an fp32 copy
//    that all its query tiles stream, which saves (tiles per head - 1) strided passes over it;
//  * tile: a task is one query tile (or one key split of it) that packs each K/V block it reads.
enum class CpuCallMode { decode, head, tile };

// What the mode rule reads, each as its caller counts it (the kernel from the call's sequences,
// the traffic model from the problem's).
struct CpuCallFacts {
  int64_t rows_per_unit = 0;  // query rows per (sequence, kv head), the longest sequence's
  int64_t kv_splits = 1;
  double tiles = 0;  // query tiles over all units
  double units = 0;  // (sequence, kv head) units with a query
  double workers = 1;
  double head_copy_bytes = 0;  // one unit's fp32 K/V copy in head mode
};

// The CPU kernels' largest head dim (D and Dv): scratch rows and the register tiles' column
// chunks are sized for it.
constexpr int64_t cpu_max_head_dim = 512;

// Head mode's copy per worker at most: a 16k-key head at D = Dv = 512. Longer heads run in tile
// mode, whose scratch does not grow with the sequence.
constexpr int64_t cpu_max_head_copy_bytes = int64_t(64) << 20;

// Head mode when every worker gets at least two whole heads and a head has two or more query
// tiles on average; decode and few-head problems keep per-tile tasks (and key splits), which
// expose more parallelism. The mode changes where K/V is read from, never a result bit.
constexpr CpuCallMode cpu_call_mode(const CpuCallFacts& f) {
  if (cpu_decode_mode(f.rows_per_unit)) return CpuCallMode::decode;
  const bool head = f.kv_splits <= 1 && f.tiles >= 2 * f.units && (f.workers == 1 || f.units >= 2 * f.workers) &&
                    f.head_copy_bytes <= double(cpu_max_head_copy_bytes);
  return head ? CpuCallMode::head : CpuCallMode::tile;
}

// Decode's softmax block (keys per online-softmax step, all kv heads at once; the kernel's
// comment on kDecodeKeys says why 32) and the unit its key splits are cut in.
constexpr int cpu_decode_block_keys = 32;
// A decode split keeps at least this many keys: its (O, m, l) partial, G x Hkv rows x Dv floats
// (16 KiB at Hq = 32, Hkv = 8, D = 128), is written once and merged once, against the split's
// 256 x Hkv x (D + Dv) cache elements (1 MiB in f16): under 2% of its traffic.
constexpr int cpu_decode_min_split_keys = 256;
// Decode's software prefetch runs this many softmax blocks ahead of the block being computed
// (0: none, the hardware prefetchers alone). One block is the cache-derived default: a block of
// every kv head (64 KiB at Hkv = 8, D = 128, f16) arrives in L2 while the previous one is
// computed. How far ahead pays, if at all, is what the prefetchers of each core decide, so
// `ioattn tune` measures it (common/calibration.h).
constexpr int cpu_decode_default_prefetch_blocks = 1;
constexpr int cpu_decode_max_prefetch_blocks = 2;
// Bytes of K and V in one decode block: cpu_decode_block_keys positions of every kv head.
constexpr int64_t cpu_decode_block_bytes(int64_t heads_kv, int64_t head_dim, int64_t head_dim_v, int64_t elem_bytes) {
  return int64_t(cpu_decode_block_keys) * heads_kv * (head_dim + head_dim_v) * elem_bytes;
}

}  // namespace ioattn
