// The CPU flash-attention forward (FlashAttention-2 on a CPU core's caches), written once with
// Highway and compiled for every x86 target; flash_forward dispatches once per call.
//
// Work decomposition. A tile is (sequence b, kv head hk, a block of query positions), and the
// G = Hq / Hkv query heads that share hk are stacked into its rows (row r = position
// pos0 + r / G, head hk * G + r % G), so every K/V block is converted and streamed once for all
// G heads: for decode (Sq = 1) a tile is the G heads of one token, and each K/V byte of the cache
// is read once per step. Three task shapes, chosen per call by cpu_call_mode (common/cpu_tiles.h):
//  * decode mode, when each sequence has at most cpu_decode_max_rows rows per kv head (Sq = 1
//    or 2 at G = 4): a task is a (sequence, key split) over ALL kv heads, reading K/V straight
//    from the cache in its own order, position by position (DecodeRange explains why); the
//    rest of this comment describes the two packed shapes, which share one arithmetic:
//  * head mode, when every worker gets two or more heads with several tiles each: a task is a
//    whole (b, hk); its keys are converted once into f32 scratch and all its tiles stream that
//    copy (contiguous, so the hardware prefetchers follow it);
//  * tile mode otherwise (decode, few heads): a task is (tile, split); each block is packed by the
//    tile, the next block while this one computes. With kv_splits > 1 the key range is cut into
//    contiguous runs of blocks whose (O, m, l) partials are merged in split order afterwards
//    (flash-decoding), so short-query problems still fill every core.
//
// Per key block (block_kv keys) and per 48-row panel of the tile:
//   1. S^T = K Q^T with the register tile of common/cpu_tiles.h: `rows` keys broadcast from the
//      packed K rows times `vecs` vectors of query rows from Q^T, packed once per tile in panels
//      of one vector of rows ([row vector][d][lanes]). S^T is [key][row]: one vector holds one
//      key's score for `lanes` query rows, so the row-wise softmax needs no horizontal reduction.
//   2. Online softmax (common/online_softmax.h): block max per row, rescale factor only where the
//      max grew, p = exp(s - max_for_exp(m)), running sum l.
//   3. O += P V with the register tile cpu_pv_register_tile: `rows` query rows broadcast from
//      P^T times `vecs` vectors of V columns from V packed in column panels of that width. O
//      stays unnormalized until the last block (FlashAttention-2's deferred normalization): one
//      multiply by 1/l per output element.
//
// Memory per worker, D = Dv = 128, block_kv = 96, 192-row tile (AVX2): the panel's S^T is
// 96 x 48 x 4 = 18 KiB and stays in L1 through steps 1-3; step 1 keeps one Q^T chunk (2 vectors
// x D = 8 KiB) in L1 while 6 K rows at a time stream from L2, step 3 one V chunk (96 keys x
// 64 bytes = 6 KiB) while the panel's groups pass over it. Per block the tile holds K and V
// (48 KiB each), Q^T and O (96 KiB each) and S^T: about 310 KiB of a 512 KiB L2, so K/V come
// from L3/DRAM once per block and tile, and everything else from L2 or L1.
//
// Masking. The tile's union of visible keys [U0, U1) is cut into blocks aligned to its END, so a
// causal diagonal falls in the last block only; blocks outside the union are never visited, nor
// are panels that see none of a block. A panel where every row sees every key of the block runs
// the unmasked softmax; otherwise the masked one sets hidden scores to -inf (a select, never a
// multiply, so NaN in a hidden K row cannot leak). In P V, each group of rows runs the fast tile
// over the keys all of its rows see, and every row adds the keys only it sees by itself: a
// hidden key's V row is never touched, so a NaN there stays out of rows that cannot see it
// (0 * NaN would not). Keys past Sk are never read.
//
// Error contract. Accumulation is fp32 FMA throughout. The softmax runs in the log2 domain of
// common/online_softmax.h: exponentials are Exp2NonPositive (~1.2 ULP, flushing below 2^-125,
// see there), scalar rescale and merge factors std::exp2 through the header's rules, and the
// LSE converts back to the natural log. P V and the row sum l add up partials of
// cpu_sum_chunk_keys keys, so their rounding grows with keys / 128, as a blocked f32 sum's does.
// Softcap uses hwy::Tanh (max error 4 ULP). Scores are dot * (scale * log2 e) in that order,
// stored, and both the max and exp's argument read the stored value (no fused x * scale - max,
// the NaN of pytorch issue 121558); NaN scores are detected explicitly and carried through the
// running max. The result is within the FlashAttention-2 tolerance rule of docs/testing.md
// against the fp64 reference.
// clang-format off: foreach_target.h must follow HWY_TARGET_INCLUDE, before the other includes.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_kernel.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include "cpu/flash_kernel.h"
#include "cpu/schedule-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ioattn::cpu {
namespace HWY_NAMESPACE {

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }
int TargetBits() { return static_cast<int>(kLanes) * 32; }

}  // namespace HWY_NAMESPACE
}  // namespace ioattn::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ioattn::cpu {

HWY_EXPORT(FlashForward);
HWY_EXPORT(TargetName);
HWY_EXPORT(ScratchBytes);
HWY_EXPORT(TargetBits);

Status flash_forward(const AttnParams& p, const Plan& plan) { return HWY_DYNAMIC_DISPATCH(FlashForward)(p, plan); }

size_t flash_scratch_bytes(const AttnParams& p, const Plan& plan) {
  return HWY_DYNAMIC_DISPATCH(ScratchBytes)(p, plan);
}

std::string flash_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

int flash_target_bits() { return HWY_DYNAMIC_DISPATCH(TargetBits)(); }

}  // namespace ioattn::cpu
#endif  // HWY_ONCE
