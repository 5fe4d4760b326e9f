// The CPU flash-attention forward (FlashAttention-2 on a CPU core's caches), written once with
// Highway and compiled for every x86 target; flash_forward dispatches once per call.
//
// Work decomposition. A tile is (sequence b, kv head hk, a block of query positions), and the
// G = Hq / Hkv query heads that share hk are stacked into its rows (row r = position
// pos0 + r / G, head hk * G + r % G), so every K/V block is converted and streamed once for all
// G heads: for decode (Sq = 1) a tile is the G heads of one token, and each K/V byte of the cache
// is read once per step. Three task shapes, chosen per call (DecideShape):
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
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/flash_kernel.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "common/alloc.h"
#include "common/cpu_tiles.h"
#include "common/online_softmax.h"
#include "cpu/flash_kernel.h"
#include "cpu/threading.h"
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ioattn::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr int64_t kLanes = static_cast<int64_t>(hn::MaxLanes(DF()));
constexpr CpuRegisterTile kTile = cpu_register_tile(static_cast<int>(kLanes) * 32);
constexpr CpuRegisterTile kPvTile = cpu_pv_register_tile(static_cast<int>(kLanes) * 32);
// Row PV (keys only some rows of a group see): one row, kRowVecs vector accumulators. 4 chains
// keep the FMA ports half busy; these keys are a thin edge of the block (the causal diagonal).
constexpr int kRowVecs = 4;
// Width of a packed V panel: the PV kernel's columns.
constexpr int64_t kPanelCols = kPvTile.vecs * kLanes;

// Rows [row0, row0 + rows) of a tile, processed together per key block; mp = rows rounded up
// to the vector (the stride of the panel's S^T). 48 rows: a whole number of the score kernel's
// row vectors (AVX2 2 x 8, AVX-512 3 x 16) and of the PV kernel's rows (6).
struct Panel {
  int64_t row0, rows, mp;
};
constexpr int64_t kPanelRows = 48;
static_assert(kPanelRows % (kTile.vecs * kLanes) == 0, "panel not a whole score tile");
static_assert(kPanelRows % kPvTile.rows == 0, "panel not a whole PV tile");

constexpr int64_t kSumChunk = cpu_sum_chunk_keys;

constexpr int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
constexpr size_t AlignBytes(size_t x) { return (x + 63) / 64 * 64; }

// Decode mode (DecodeRange) takes calls whose sequences have at most kDecodeRows query rows
// per kv head: decode's G heads of one token (G = 4 for Hq = 32 over Hkv = 8) or a couple of
// speculative tokens. Its cost per key grows with the rows (2 x rows x D multiply-adds) while the
// packed path's register tile wants 16+ rows. kDecodeKeys positions form one softmax block: the
// block's K and V for all heads (32 x 8 x 512 bytes = 128 KiB in f16) wait in L2, where
// LineQueue puts them, between the score pass and P V. 32 keys halve the per-block costs (the
// softmax's max and sum reductions, the rescale of O, the row pointers) against 16: -8.5%
// instructions. While the queue prefetched into L1, 32 and 64 measured no faster than 16 (the
// larger block's lines were evicted from the 48 KiB L1 before use); with the queue filling L2,
// 32 beat 16 in every paired run (below), and 64 did not (H200 host, one pass: 53-69% of the
// paired read against 64-78% for 16).
constexpr int64_t kDecodeRows = cpu_decode_max_rows;
constexpr int64_t kDecodeKeys = cpu_decode_block_keys;
static_assert(kDecodeKeys <= kSumChunk, "decode's P V sums one block from zero, so a block is one partial sum");
// Score rows are kDecodeStride floats apart: whole vectors, so the softmax loads past the
// block's last key (and masks) instead of running a scalar tail.
constexpr int64_t kDecodeStride = RoundUp(kDecodeKeys, kLanes);
// Decode's query rows go through the score and P V tiles 4 at a time (4 rows x 4 keys of
// accumulators in the score step).
constexpr int kDecodeRowChunk = 4;

// ---------------------------------------------------------------------------------------------
// Micro-kernels.

// S^T[key r][row vector c] = sum_d K[r][d] * Q^T[c][d]. kp: the first of R packed f32 key rows
// (stride D); qt: the first of C Q^T panels ([d][lanes] each, panel stride D * lanes); st: row r
// of S^T, stride mp.
// The register loops carry `#pragma GCC unroll`: without it GCC kept acc[R][C] as a stack array
// outside the hot loop, zeroing or loading it there and storing it through the stack at the end
// (ScoreTile<8, 3> on AVX-512: 216 instructions per call, 142 with the pragma; PvTile<6, 4>:
// 252 -> 180), about 2-5% of a call at D = 64.
// Stored scores are already multiplied by `scale` (the softmax's x = s * scale * log2 e, or s *
// scale under softcap: the same single rounded multiply SoftmaxBlock used to do on its first pass).
// kMax: also folds the R keys' scores into the running block max of each row vector (mx, C
// vectors), so an unmasked panel's softmax needs no pass of its own to find the max: 2 vector ops
// per score vector here (multiply, max) instead of a pass of load, multiply, store, max and the
// NaN test (5 vector ops and a store), against the tile's D FMAs per score vector.
template <int R, int C, bool kMax>
void ScoreTile(const float* kp, const float* qt, int64_t D, float* st, int64_t mp, float scale, float* mx) {
  const DF df;
  VF acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = hn::Zero(df);
  const int64_t panel = D * kLanes;
  for (int64_t d = 0; d < D; ++d) {
    VF qv[C];
    for (int c = 0; c < C; ++c) qv[c] = hn::Load(df, qt + c * panel + d * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const VF kb = hn::Set(df, kp[r * D + d]);
      for (int c = 0; c < C; ++c) acc[r][c] = hn::MulAdd(kb, qv[c], acc[r][c]);
    }
  }
  const VF vscale = hn::Set(df, scale);
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    VF m;
    if constexpr (kMax) m = hn::Load(df, mx + c * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const VF x = hn::Mul(acc[r][c], vscale);
      hn::Store(x, df, st + r * mp + c * kLanes);
      if constexpr (kMax) m = hn::Max(m, x);
    }
    if constexpr (kMax) hn::Store(m, df, mx + c * kLanes);
  }
}

// O[r][c * lanes ...] += sum_j P^T[j][r] * V[j][c * lanes ...] for R rows, C vectors, n keys.
// p: P^T at (first key, first row), stride mp; vp: the V panel of these columns at the first key
// ([key][kPanelCols], so the loads are one contiguous stream); o: O at (first row, first column).
// o_next: the O block of the next call, requested now: O lives in L2 (the tile's rows x Dv, 520
// KiB at 1040 x 128), and the 24 accumulators' loads waited on it at the start of every call,
// 9% of this kernel's samples at D = 128 (block_kv = 96: 1152 FMA cycles per call), while a
// call is long enough for the next one's 24 lines to arrive.
// The keys are summed in partials of kSumChunk from zero in the registers, each then added to O
// (common/cpu_tiles.h, cpu_sum_chunk_keys, says why).
template <int R, int C>
void PvTile(const float* p, int64_t mp, const float* vp, int64_t n, float* o, int64_t dvp, const float* o_next) {
  const DF df;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) __builtin_prefetch(o_next + r * dvp + c * kLanes, 1, 3);
  for (int64_t j0 = 0; j0 < n; j0 += kSumChunk) {
    VF acc[R][C];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = hn::Zero(df);
    const int64_t j1 = std::min(n, j0 + kSumChunk);
    for (int64_t j = j0; j < j1; ++j) {
      VF vv[C];
      const float* v = vp + j * kPanelCols;
      for (int c = 0; c < C; ++c) vv[c] = hn::Load(df, v + c * kLanes);
      const float* pj = p + j * mp;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const VF pb = hn::Set(df, pj[r]);
        for (int c = 0; c < C; ++c) acc[r][c] = hn::MulAdd(pb, vv[c], acc[r][c]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) {
        float* oc = o + r * dvp + c * kLanes;
        hn::Store(hn::Add(hn::Load(df, oc), acc[r][c]), df, oc);
      }
  }
}

// One row, keys [j0, j1), C vectors from vector v0 of the row. p: this row's P^T column (stride
// mp); vpack: all V panels (panel stride vstride).
template <int C>
void RowPvChunk(const float* p, int64_t mp, const float* vpack, int64_t vstride, int64_t j0, int64_t j1,
                int64_t v0, float* o) {
  const DF df;
  const float* vbase[C];
  for (int c = 0; c < C; ++c) vbase[c] = vpack + (v0 + c) / kPvTile.vecs * vstride + (v0 + c) % kPvTile.vecs * kLanes;
  for (int64_t k0 = j0; k0 < j1; k0 += kSumChunk) {
    VF acc[C];
    for (int c = 0; c < C; ++c) acc[c] = hn::Zero(df);
    for (int64_t j = k0; j < std::min(j1, k0 + kSumChunk); ++j) {
      const VF pb = hn::Set(df, p[j * mp]);
      for (int c = 0; c < C; ++c) acc[c] = hn::MulAdd(pb, hn::Load(df, vbase[c] + j * kPanelCols), acc[c]);
    }
    for (int c = 0; c < C; ++c) hn::Store(hn::Add(hn::Load(df, o + c * kLanes), acc[c]), df, o + c * kLanes);
  }
}

using ScoreFn = void (*)(const float*, const float*, int64_t, float*, int64_t, float, float*);
using PvFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, const float*);
using RowPvFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t, float*);

// Tables of every (rows, vectors) remainder shape, indexed [vectors - 1][rows - 1], so block
// edges run the same code as the bulk with fewer registers instead of a scalar tail.
template <int C, bool kMax, size_t... I>
constexpr std::array<ScoreFn, sizeof...(I)> ScoreRowsTable(std::index_sequence<I...>) {
  return {&ScoreTile<static_cast<int>(I) + 1, C, kMax>...};
}
template <int C, size_t... I>
constexpr std::array<PvFn, sizeof...(I)> PvRowsTable(std::index_sequence<I...>) {
  return {&PvTile<static_cast<int>(I) + 1, C>...};
}
template <bool kMax, size_t... C>
constexpr auto ScoreTable(std::index_sequence<C...>) {
  return std::array<std::array<ScoreFn, kTile.rows>, sizeof...(C)>{
      ScoreRowsTable<static_cast<int>(C) + 1, kMax>(std::make_index_sequence<kTile.rows>())...};
}
template <size_t... C>
constexpr auto PvTable(std::index_sequence<C...>) {
  return std::array<std::array<PvFn, kPvTile.rows>, sizeof...(C)>{
      PvRowsTable<static_cast<int>(C) + 1>(std::make_index_sequence<kPvTile.rows>())...};
}
template <size_t... C>
constexpr std::array<RowPvFn, sizeof...(C)> RowPvTable(std::index_sequence<C...>) {
  return {&RowPvChunk<static_cast<int>(C) + 1>...};
}

constexpr auto kScore = ScoreTable<false>(std::make_index_sequence<kTile.vecs>());
constexpr auto kScoreMax = ScoreTable<true>(std::make_index_sequence<kTile.vecs>());
constexpr auto kPv = PvTable(std::make_index_sequence<kPvTile.vecs>());
constexpr auto kRowPv = RowPvTable(std::make_index_sequence<kRowVecs>());

// ---------------------------------------------------------------------------------------------
// Conversion of a caller's row into f32 scratch: f16/bf16 are widened with PromoteTo (exact), so
// the micro-kernels only ever see f32.

void RowToF32(const void* base, int64_t offset, DType type, int64_t n, float* dst) {
  const DF df;
  int64_t i = 0;
  if (type == DType::f32) {
    std::memcpy(dst, static_cast<const float*>(base) + offset, size_t(n) * sizeof(float));
    return;
  }
  if (type == DType::f16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto* src = static_cast<const hwy::float16_t*>(base) + offset;
    for (; i + kLanes <= n; i += kLanes) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, src + i)), df, dst + i);
  } else {
    const hn::Rebind<hwy::bfloat16_t, DF> db;
    const auto* src = static_cast<const hwy::bfloat16_t*>(base) + offset;
    for (; i + kLanes <= n; i += kLanes) hn::StoreU(hn::PromoteTo(df, hn::LoadU(db, src + i)), df, dst + i);
  }
  for (; i < n; ++i) dst[i] = load_as_f32(base, offset + i, type);
}

// ---------------------------------------------------------------------------------------------
// Geometry of one call and the per-worker scratch carved from one allocation.

// Regions of a worker's scratch, each 64-byte aligned.
enum Region { kQt, kQrow, kK0, kK1, kV0, kV1, kHeadK, kHeadV, kVtmp, kSt, kO, kM, kL, kAlpha, kMref, kMblk, kLo, kHi, kRowLo, kRowHi, kVRows, kViews, kRegions };

struct Scratch {
  float* qt;
  float* qrow;
  float* kpack;  // the block being computed: K rows [key][D] and V panels (panel stride vstride)
  float* vpack;
  int64_t vstride;
  float* kbuf[2];  // double buffer: the next block is packed while this one computes
  float* vbuf[2];
  float* head_k;  // head mode: all keys of one (sequence, kv head), packed once
  float* head_v;
  float* vtmp;
  float* st;
  float* o;
  float *m, *l, *alpha, *mref, *mblk, *lo, *hi;
  int64_t *row_lo, *row_hi;
  const void** vrows;  // decode: the current key block's V rows in the cache
};

struct Geometry {
  int64_t D = 0, Dv = 0, Dvp = 0, G = 0;
  int64_t Dvq = 0;  // Dv rounded up to whole V panels
  int64_t pos_per_tile = 0;  // query positions per tile
  int64_t rows_max = 0;      // pos_per_tile * G
  int64_t mp_max = 0;        // rows_max rounded up to the vector: the rows of Q^T and of O
  int64_t block_kv = 0;
  int64_t splits = 1;
  // Head mode: a task is a whole (sequence, kv head) whose K/V is packed once and read by all of
  // its query tiles; head_keys is the longest sequence's key count (the head buffers' rows).
  bool head_mode = false;
  int64_t head_keys = 0;
  // Decode mode (DecodeTask): every sequence's query rows fit one tile of at most kDecodeRows
  // rows; a task is a (sequence, split) over ALL kv heads, which keep their state side by side
  // (heads_kv copies of Q, S^T, O, m, l: region r of head hk at off[r] + hk * head_bytes[r]).
  bool decode = false;
  int64_t heads_kv = 1;
  size_t head_bytes[kRegions] = {};
  size_t off[kRegions] = {};
  size_t worker_bytes = 0;
  int64_t partial_floats = 0;  // O (rows_max x Dvp), m and l (rows_max each) of one (tile, split)
};

// decode_positions > 0 selects decode mode with that many query positions per tile.
Geometry MakeGeometry(const AttnParams& p, const Plan& plan, bool head_mode, int64_t head_keys,
                      int64_t decode_positions = 0) {
  Geometry g;
  g.D = p.head_dim;
  g.Dv = p.head_dim_v;
  g.Dvp = RoundUp(g.Dv, kLanes);
  g.Dvq = RoundUp(g.Dv, kPanelCols);
  g.G = p.heads_q / p.heads_kv;
  g.decode = decode_positions > 0;
  g.pos_per_tile = g.decode ? decode_positions : std::max<int64_t>(1, plan.block_q / g.G);
  g.rows_max = g.pos_per_tile * g.G;
  // Decode's Q is stored in whole row chunks (DecodeQ).
  g.mp_max = RoundUp(g.rows_max, g.decode ? std::max<int64_t>(kLanes, kDecodeRowChunk) : kLanes);
  g.block_kv = std::max(1, plan.block_kv);
  g.splits = std::max(1, plan.kv_splits);
  g.head_mode = head_mode;
  g.head_keys = head_keys;
  g.heads_kv = g.decode ? p.heads_kv : 1;
  const size_t f = sizeof(float);
  const size_t rows = size_t(g.mp_max), bk = size_t(g.block_kv);
  size_t bytes[kRegions] = {};
  bytes[kQt] = rows * size_t(g.D) * f;
  bytes[kQrow] = size_t(g.D) * f;
  const bool packs = !head_mode && !g.decode;
  bytes[kK0] = bytes[kK1] = packs ? bk * size_t(g.D) * f : 0;
  bytes[kV0] = bytes[kV1] = packs ? bk * size_t(g.Dvq) * f : 0;
  bytes[kHeadK] = head_mode ? size_t(head_keys) * size_t(g.D) * f : 0;
  bytes[kHeadV] = head_mode ? size_t(head_keys) * size_t(g.Dvq) * f : 0;
  bytes[kVtmp] = size_t(g.Dvq) * f;
  bytes[kSt] = (g.decode ? size_t(kDecodeStride) * rows : bk * size_t(kPanelRows)) * f;
  bytes[kO] = rows * size_t(g.Dvp) * f;
  for (int r : {kM, kL, kAlpha, kMref, kMblk, kLo, kHi}) bytes[r] = rows * f;
  bytes[kRowLo] = bytes[kRowHi] = rows * sizeof(int64_t);
  bytes[kVRows] = g.decode ? size_t(kDecodeKeys) * sizeof(const void*) : 0;
  bytes[kViews] = g.decode ? size_t(g.heads_kv) * sizeof(Scratch) : 0;
  size_t at = 0;
  for (int r = 0; r < kRegions; ++r) {
    const bool per_head = r == kQt || r == kSt || r == kO || r == kM || r == kL || r == kAlpha || r == kMref ||
                          r == kMblk || r == kVRows;
    g.head_bytes[r] = per_head ? AlignBytes(bytes[r]) : 0;
    g.off[r] = at;
    at += per_head ? size_t(g.heads_kv) * g.head_bytes[r] : AlignBytes(bytes[r]);
  }
  g.worker_bytes = at;
  // Rounded to whole vectors: the merge loads each partial's O rows with aligned loads, and
  // decode tiles can have any row count (2 x rows_max floats of m and l need not fill one).
  g.partial_floats = RoundUp(g.rows_max * g.Dvp + 2 * g.rows_max, kLanes);
  return g;
}

// hk: which kv head's copy of the per-head regions (decode mode; 0 otherwise).
Scratch CarveScratch(const Geometry& g, unsigned char* base, int64_t hk = 0) {
  auto at = [&](Region r) { return base + g.off[r] + size_t(hk) * g.head_bytes[r]; };
  Scratch w;
  w.qt = reinterpret_cast<float*>(at(kQt));
  w.qrow = reinterpret_cast<float*>(at(kQrow));
  w.kbuf[0] = w.kpack = reinterpret_cast<float*>(at(kK0));
  w.kbuf[1] = reinterpret_cast<float*>(at(kK1));
  w.vbuf[0] = w.vpack = reinterpret_cast<float*>(at(kV0));
  w.vbuf[1] = reinterpret_cast<float*>(at(kV1));
  w.vstride = g.block_kv * kPanelCols;
  w.head_k = reinterpret_cast<float*>(at(kHeadK));
  w.head_v = reinterpret_cast<float*>(at(kHeadV));
  w.vtmp = reinterpret_cast<float*>(at(kVtmp));
  w.st = reinterpret_cast<float*>(at(kSt));
  w.o = reinterpret_cast<float*>(at(kO));
  w.m = reinterpret_cast<float*>(at(kM));
  w.l = reinterpret_cast<float*>(at(kL));
  w.alpha = reinterpret_cast<float*>(at(kAlpha));
  w.mref = reinterpret_cast<float*>(at(kMref));
  w.mblk = reinterpret_cast<float*>(at(kMblk));
  w.lo = reinterpret_cast<float*>(at(kLo));
  w.hi = reinterpret_cast<float*>(at(kHi));
  w.row_lo = reinterpret_cast<int64_t*>(at(kRowLo));
  w.row_hi = reinterpret_cast<int64_t*>(at(kRowHi));
  w.vrows = reinterpret_cast<const void**>(at(kVRows));
  return w;
}

// One tile's rows: where they are and which keys they see.
struct Tile {
  int64_t b, hk, pos0, npos;
  SeqSpan seq;
  int64_t rows, mp;  // rows = npos * G; mp = rows rounded up to the vector
};

// ---------------------------------------------------------------------------------------------
// 2^d for the softmax exponent d = x - m <= 0 (or NaN, which only poisoned rows see), ~1.2 ULP.
// d = n + f with n = round(d) and f = d - n exact (Sterbenz) in [-1/2, 1/2]; 2^f is a degree-6
// polynomial (minimax for relative error on [-1/2, 1/2], 1.9e-9 in exact arithmetic, 1.19 ULP
// in fp32 Horner: measured over 2M points against 2^f in double), and 2^n is added into the
// exponent field. Below 2^-125 the result flushes to 0: such a term is under 2^-101 of the row
// max's own term (exactly 1), so it cannot change l or O in fp32. d = 0 gives exactly 1.
// Why not hwy::Exp: in the natural domain it needs a two-constant Cody-Waite reduction and
// a range split for the scale, 30 vector ops per 8 scores against 13 here; the softmax was
// 12-14% of the kernel's time at D = 128 and about twice that share at D = 64.
HWY_INLINE VF Exp2NonPositive(DF df, VF d) {
  const VF n = hn::Round(d);
  const VF f = hn::Sub(d, n);
  VF p = hn::Set(df, 1.5345809515565634e-4f);
  p = hn::MulAdd(p, f, hn::Set(df, 1.3399930903688073e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 9.618489071726799e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 5.550328642129898e-2f));
  p = hn::MulAdd(p, f, hn::Set(df, 2.4022646248340607e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 6.931471824645996e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 1.f));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  // AVX-512's vscalefps multiplies by 2^n in one instruction: exact, so the same bits as the
  // exponent-field add below while the result is normal (d >= -125), in 1 vector op instead of
  // 3 (convert, shift, add), and the flush rides on its zero-mask: 10 ops in all instead of 13.
  // The mask is "not less than" (unordered-true) so that a NaN d still yields NaN.
  const __mmask16 keep = _mm512_cmp_ps_mask(d.raw, _mm512_set1_ps(-125.f), _CMP_NLT_UQ);
  return VF{_mm512_maskz_scalef_ps(keep, p.raw, n.raw)};
#else
  // 2^n is built as a float and multiplied in, not added into p's exponent field: a NaN d
  // converts to an arbitrary integer (x86 saturates +NaN to INT_MAX), and adding that to p's
  // bits can make a finite number, while NaN times any 2^n stays NaN. Exact, so the same bits
  // as the exponent add for d >= -125 (n + 127 >= 2 is a normal exponent); one integer add more.
  const hn::RebindToSigned<DF> di;
  const auto pow2n = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127))));
  return hn::IfThenZeroElse(hn::Lt(d, hn::Set(df, -125.f)), hn::Mul(p, pow2n));
#endif
}

// Online softmax of one block, vectorized over query rows (S^T is [key][row]), in the log2
// domain of common/online_softmax.h (as the CUDA kernel): scores are x = s * scale * log2(e)
// (one rounded multiply by a constant, done by ScoreTile as it stores S^T; with softcap
// c * log2(e) * tanh(s * scale / c)), the running max m and the exponent 2^(x - m) live in that
// domain, and the LSE converts back. Pass 1 caps the scores, hides masked ones, and takes the
// block max per row; then the header's scalar rules give each row its new max and rescale
// factor; pass 2 exponentiates in place (S^T becomes P^T) and accumulates l.
// kMaxDone (unmasked, no softcap): ScoreTile already left the block max in w.mblk and pass 1 has
// nothing else to do, so it is skipped; NaN, which x86's max may drop, is then caught by pass 2
// instead: a NaN score makes its p, so the row's sum, NaN (and only a NaN score or a +inf max,
// already poisoned, can), and the row's m and rescale factor become NaN before O is rescaled,
// as pass 1 would have made them.
// Keys [kb, ke) of the block: the rest are hidden from every row of the panel.
template <bool kMasked, bool kSoftcap, bool kMaxDone>
void SoftmaxBlock(const Panel& pn, int64_t kb, int64_t ke, float softcap, const Scratch& w) {
  static_assert(!kMaxDone || (!kMasked && !kSoftcap), "the score kernel's max is of unmasked, uncapped scores");
  const DF df;
  const VF vcap = hn::Set(df, softcap);
  const VF vcap_log2 = hn::Set(df, softcap * softmax::kLog2e);
  const VF neg_inf = hn::Set(df, -INFINITY);
  const VF pos_inf = hn::Set(df, INFINITY);
  const VF nan = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
  // Locals: through the structs the compiler reloads the base and stride after every store.
  const int64_t mp = pn.mp, row0 = pn.row0;
  float* const st = w.st;
  for (int64_t r0 = row0; !kMaxDone && r0 < row0 + mp; r0 += kLanes) {
    VF mx = neg_inf, saw_nan = hn::Zero(df);
    const VF lo = hn::Load(df, w.lo + r0), hi = hn::Load(df, w.hi + r0);
    float* sp = st + kb * mp + (r0 - row0);
    for (int64_t j = kb; j < ke; ++j, sp += mp) {
      VF s = hn::Load(df, sp);
      if (kSoftcap) s = hn::Mul(vcap_log2, hn::Tanh(df, hn::Div(s, vcap)));
      if (kMasked) {
        const VF jf = hn::Set(df, static_cast<float>(j));
        s = hn::IfThenElse(hn::And(hn::Ge(jf, lo), hn::Lt(jf, hi)), s, neg_inf);
      }
      if (kSoftcap || kMasked) hn::Store(s, df, sp);
      mx = hn::Max(mx, s);
      saw_nan = hn::Or(saw_nan, hn::VecFromMask(df, hn::IsNaN(s)));
    }
    // NaN is never masked away (x86 max drops it), and an infinite score makes the reference's
    // exp(inf - inf) NaN: both make the row's max NaN, which the rescale factor then carries
    // into O and l.
    const auto poisoned = hn::Or(hn::MaskFromVec(saw_nan), hn::Eq(mx, pos_inf));
    hn::Store(hn::IfThenElse(poisoned, nan, mx), df, w.mblk + r0);
  }
  for (int64_t r = row0; r < row0 + mp; ++r) {
    const float m_old = w.m[r], m_blk = kMaxDone && w.mblk[r] == INFINITY ? std::numeric_limits<float>::quiet_NaN()
                                                                           : w.mblk[r];
    const float m_new = std::isnan(m_old) || std::isnan(m_blk) ? std::numeric_limits<float>::quiet_NaN()
                                                              : std::max(m_old, m_blk);
    w.alpha[r] = softmax::rescale_factor(m_old, m_new, [](float x) { return std::exp2(x); });
    w.m[r] = m_new;
    w.mref[r] = softmax::max_for_exp(m_new);
  }
  for (int64_t r0 = row0; r0 < row0 + mp; r0 += kLanes) {
    const VF mref = hn::Load(df, w.mref + r0);
    VF sum = hn::Zero(df);
    float* sp = st + kb * mp + (r0 - row0);
    for (int64_t j0 = kb; j0 < ke; j0 += kSumChunk) {
      VF part = hn::Zero(df);
      for (int64_t j = j0; j < std::min(ke, j0 + kSumChunk); ++j, sp += mp) {
        const VF pj = Exp2NonPositive(df, hn::Sub(hn::Load(df, sp), mref));
        hn::Store(pj, df, sp);
        part = hn::Add(part, pj);
      }
      sum = hn::Add(sum, part);
    }
    VF alpha = hn::Load(df, w.alpha + r0);
    if (kMaxDone) {
      const auto saw_nan = hn::IsNaN(sum);
      alpha = hn::IfThenElse(saw_nan, nan, alpha);
      hn::Store(alpha, df, w.alpha + r0);
      hn::Store(hn::IfThenElse(saw_nan, nan, hn::Load(df, w.m + r0)), df, w.m + r0);
    }
    hn::Store(hn::MulAdd(hn::Load(df, w.l + r0), alpha, sum), df, w.l + r0);
  }
}

// O rows += P V over the block, each row over exactly its visible keys [lo_r, hi_r).
// masked: some row of the panel does not see every key [0, nk) of the block; otherwise every
// group is fast over all nk keys, without reading the rows' ranges (48 rows x 2 conversions,
// twice, were 2% of the kernel at D = 128 non-causal).
void AccumulatePv(const Geometry& g, const Panel& pn, int64_t nk, bool masked, const Scratch& w) {
  const int64_t vecs_total = g.Dvp / kLanes;
  auto row_range = [&](int64_t r0, int64_t r1, int64_t a, int64_t e) {
    if (a >= e) return;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t v = 0; v < vecs_total; v += kRowVecs) {
        const int64_t c = std::min<int64_t>(kRowVecs, vecs_total - v);
        kRowPv[size_t(c - 1)](w.st + (r - pn.row0), pn.mp, w.vpack, w.vstride, a, e, v,
                              w.o + r * g.Dvp + v * kLanes);
      }
    }
  };
  // Keys every row of a group sees go through the register tile; the rest row by row. Column
  // chunks outermost: one chunk of the V panel (block_kv x 64 bytes) stays in L1 while every
  // group of the panel's P^T (also L1) passes over it.
  constexpr int64_t kGroups = kPanelRows / kPvTile.rows;
  int64_t a[kGroups], e[kGroups];
  bool fast[kGroups];
  for (int64_t gi = 0; gi * kPvTile.rows < pn.rows; ++gi) {
    const int64_t r0 = pn.row0 + gi * kPvTile.rows, nr = std::min<int64_t>(kPvTile.rows, pn.row0 + pn.rows - r0);
    a[gi] = 0;
    e[gi] = nk;
    fast[gi] = true;
    if (!masked) continue;
    e[gi] = std::numeric_limits<int64_t>::max();
    bool any_empty = false;
    for (int64_t r = r0; r < r0 + nr; ++r) {
      const int64_t lo = static_cast<int64_t>(w.lo[r]), hi = static_cast<int64_t>(w.hi[r]);
      any_empty |= lo >= hi;
      a[gi] = std::max(a[gi], lo);
      e[gi] = std::min(e[gi], hi);
    }
    fast[gi] = !any_empty && a[gi] < e[gi];
  }
  for (int64_t v = 0; v < vecs_total; v += kPvTile.vecs) {
    const int64_t nc = std::min<int64_t>(kPvTile.vecs, vecs_total - v);
    const float* panel = w.vpack + (v / kPvTile.vecs) * w.vstride;
    for (int64_t gi = 0; gi * kPvTile.rows < pn.rows; ++gi) {
      if (!fast[gi]) continue;
      const int64_t r0 = pn.row0 + gi * kPvTile.rows, nr = std::min<int64_t>(kPvTile.rows, pn.row0 + pn.rows - r0);
      // The next call's O: the next group's rows, or the panel's first rows in the next columns.
      const bool last_group = r0 + nr >= pn.row0 + pn.rows;
      const float* o_next = w.o + (last_group ? pn.row0 * g.Dvp + (v + kPvTile.vecs) * kLanes
                                              : (r0 + nr) * g.Dvp + v * kLanes);
      kPv[size_t(nc - 1)][size_t(nr - 1)](w.st + a[gi] * pn.mp + (r0 - pn.row0), pn.mp, panel + a[gi] * kPanelCols,
                                          e[gi] - a[gi], w.o + r0 * g.Dvp + v * kLanes, g.Dvp, o_next);
    }
  }
  for (int64_t gi = 0; masked && gi * kPvTile.rows < pn.rows; ++gi) {
    const int64_t r0 = pn.row0 + gi * kPvTile.rows, nr = std::min<int64_t>(kPvTile.rows, pn.row0 + pn.rows - r0);
    for (int64_t r = r0; r < r0 + nr; ++r) {
      const int64_t lo = static_cast<int64_t>(w.lo[r]), hi = static_cast<int64_t>(w.hi[r]);
      if (!fast[gi]) {
        row_range(r, r + 1, lo, hi);
        continue;
      }
      row_range(r, r + 1, lo, a[gi]);
      row_range(r, r + 1, e[gi], hi);
    }
  }
}

// The caller's K/V rows are usually far apart (stride Hkv x D elements: one 4 KiB page per row
// at Hkv = 8, D = 128), which defeats the hardware prefetchers' in-page streams, so copying a row
// waits a full memory latency: per-tile packing took 12-17% of the kernel at S = 2048-4096. Head
// mode packs each head once; per-tile packing prefetches the next block a few rows per score
// step, and within a copy loop kPrefetchRows rows ahead (a tile's first block has no
// predecessor to hide its misses behind).
constexpr int64_t kPrefetchRows = 8;

void PrefetchRow(const void* base, int64_t offset, DType type, int64_t n) {
  const int64_t eb = dtype_bytes(type);
  const char* row = static_cast<const char*>(base) + offset * eb;
  for (int64_t byte = 0; byte < n * eb; byte += 64) __builtin_prefetch(row + byte, 0, 3);
  __builtin_prefetch(row + n * eb - 1, 0, 3);
}

void PrefetchRows(const AttnParams& p, const Geometry& g, const Tile& t, int64_t j0, int64_t n) {
  for (int64_t j = j0; j < j0 + n; ++j) {
    PrefetchRow(p.k, k_offset(p, t.b, t.seq, j, t.hk), p.kv_dtype, g.D);
    PrefetchRow(p.v, v_offset(p, t.b, t.seq, j, t.hk), p.kv_dtype, g.Dv);
  }
}

// Converts keys [j0 + lo, j0 + hi) of the block starting at j0 to f32 in the micro-kernels'
// layouts: K rows [key][D] contiguous, V in panels of the PV kernel's columns,
// [panel][key][kPanelCols] (panel stride vstride), zero padded past Dv, so the PV loads walk one
// stream.
void PackRows(const AttnParams& p, const Geometry& g, const Tile& t, int64_t j0, int64_t lo, int64_t hi,
              float* kpack, float* vpack, int64_t vstride, const Scratch& w) {
  const DF df;
  std::fill(w.vtmp + g.Dv, w.vtmp + g.Dvq, 0.f);
  const bool f32 = p.kv_dtype == DType::f32;
  for (int64_t j = lo; j < hi; ++j) {
    if (j + kPrefetchRows < hi) PrefetchRows(p, g, t, j0 + j + kPrefetchRows, 1);
    const int64_t ko = k_offset(p, t.b, t.seq, j0 + j, t.hk), vo = v_offset(p, t.b, t.seq, j0 + j, t.hk);
    RowToF32(p.k, ko, p.kv_dtype, g.D, kpack + j * g.D);
    float* vdst = vpack + j * kPanelCols;
    int64_t c = 0;
    if (f32) {
      const float* vrow = static_cast<const float*>(p.v) + vo;
      for (; c + kLanes <= g.Dv; c += kLanes)
        hn::Store(hn::LoadU(df, vrow + c), df, vdst + c / kPanelCols * vstride + c % kPanelCols);
      for (int64_t e = c; e < g.Dvq; ++e) w.vtmp[e] = e < g.Dv ? vrow[e] : 0.f;
    } else {
      RowToF32(p.v, vo, p.kv_dtype, g.Dv, w.vtmp);
    }
    for (; c < g.Dvq; c += kLanes)
      hn::Store(hn::Load(df, w.vtmp + c), df, vdst + c / kPanelCols * vstride + c % kPanelCols);
  }
}

// One panel of rows against the packed block: S^T = K Q^T, online softmax, rescale, O += P V.
// The panel's S^T (block_kv x 48 floats: 18 KiB at block_kv = 96) stays in L1 between the three
// steps, while the tile's Q^T and O are streamed once per block; so block_q (how many rows
// share one packed K/V block) is not bounded by the size of S^T. Meanwhile it prefetches keys
// [pf0, pf0 + pf_count) of the next block, a few rows per score step: issued in one burst, most
// of a slice's ~250 line requests found the miss buffers full and were dropped.
void RunPanel(const AttnParams& p, const Geometry& g, const Tile& t, const Panel& pn, int64_t nk, bool masked,
              int64_t pf0, int64_t pf_count, const Scratch& w) {
  const DF df;
  const int64_t vec0 = pn.row0 / kLanes, nvec = pn.mp / kLanes;
  // A masked panel scores and exponentiates only keys [kb, ke), those some row of it sees: on a
  // causal diagonal the block runs on up to block_kv - 1 keys past the panel's last row, which
  // no row sees (P V already skipped them; the score kernel and the softmax did not).
  int64_t kb = 0, ke = nk;
  if (masked) {
    kb = nk;
    ke = 0;
    for (int64_t r = pn.row0; r < pn.row0 + pn.rows; ++r) {
      if (w.lo[r] >= w.hi[r]) continue;
      kb = std::min(kb, static_cast<int64_t>(w.lo[r]));
      ke = std::max(ke, static_cast<int64_t>(w.hi[r]));
    }
  }
  // Row-vector chunks outermost: one chunk of Q^T (D x 2 vectors: 8 KiB at D = 128) stays in L1
  // while the block's K rows stream past it (6 broadcasts, 24 bytes, per 12 FMAs).
  const int64_t groups = (ke - kb + kTile.rows - 1) / kTile.rows;
  const int64_t steps = groups * ((nvec + kTile.vecs - 1) / kTile.vecs);
  const int64_t pf_per_step = (pf_count + steps - 1) / std::max<int64_t>(steps, 1);
  const bool capped = p.softcap > 0.f;
  const float scale = capped ? p.scale : p.scale * softmax::kLog2e;
  const bool max_in_tile = !masked && !capped;
  const auto& score = max_in_tile ? kScoreMax : kScore;
  if (max_in_tile) std::fill(w.mblk + pn.row0, w.mblk + pn.row0 + pn.mp, -INFINITY);
  int64_t step = 0;
  for (int64_t c = 0; c < nvec; c += kTile.vecs) {
    const int64_t nc = std::min<int64_t>(kTile.vecs, nvec - c);
    for (int64_t j = kb; j < ke; j += kTile.rows, ++step) {
      const int64_t done = step * pf_per_step;
      PrefetchRows(p, g, t, pf0 + done, std::max<int64_t>(0, std::min(pf_per_step, pf_count - done)));
      const int64_t nr = std::min<int64_t>(kTile.rows, ke - j);
      score[size_t(nc - 1)][size_t(nr - 1)](w.kpack + j * g.D, w.qt + (vec0 + c) * g.D * kLanes, g.D,
                                            w.st + j * pn.mp + c * kLanes, pn.mp, scale, w.mblk + pn.row0 + c * kLanes);
    }
  }
  if (masked) {
    if (capped) SoftmaxBlock<true, true, false>(pn, kb, ke, p.softcap, w);
    else SoftmaxBlock<true, false, false>(pn, kb, ke, p.softcap, w);
  } else {
    if (capped) SoftmaxBlock<false, true, false>(pn, kb, ke, p.softcap, w);
    else SoftmaxBlock<false, false, true>(pn, kb, ke, p.softcap, w);
  }
  for (int64_t r = pn.row0; r < pn.row0 + pn.rows; ++r) {
    if (w.alpha[r] == 1.f) continue;
    const VF a = hn::Set(df, w.alpha[r]);
    float* o = w.o + r * g.Dvp;
    for (int64_t c = 0; c < g.Dvp; c += kLanes) hn::Store(hn::Mul(hn::Load(df, o + c), a), df, o + c);
  }
  AccumulatePv(g, pn, nk, masked, w);
}

// Runs the blocks [blk_begin, blk_end) of the tile (block k covers keys
// [max(U0, U1 - (nb - k) * block_kv), U1 - (nb - 1 - k) * block_kv)) and leaves the
// unnormalized state in w.o, w.m, w.l. In head mode the keys were packed once for the whole
// (sequence, kv head) into w.head_k / w.head_v; otherwise each block is packed here, the next one
// while this one computes.
void RunTileBlocks(const AttnParams& p, const Geometry& g, const Tile& t, int64_t u0, int64_t u1, int64_t nb,
                   int64_t blk_begin, int64_t blk_end, const Scratch& w) {
  for (int64_t r = 0; r < t.mp; ++r) {
    w.m[r] = softmax::neg_inf();
    w.l[r] = 0.f;
  }
  std::fill(w.o, w.o + t.mp * g.Dvp, 0.f);
  if (blk_begin >= blk_end) return;
  auto block_start = [&](int64_t k) { return std::max(u0, u1 - (nb - k) * g.block_kv); };
  auto block_end = [&](int64_t k) { return u1 - (nb - 1 - k) * g.block_kv; };
  if (!g.head_mode) {
    const int64_t j0 = block_start(blk_begin), nk = block_end(blk_begin) - j0;
    PrefetchRows(p, g, t, j0, std::min(kPrefetchRows, nk));
    PackRows(p, g, t, j0, 0, nk, w.kbuf[0], w.vbuf[0], w.vstride, w);
  }
  const int64_t panels = (t.rows + kPanelRows - 1) / kPanelRows;
  for (int64_t k = blk_begin; k < blk_end; ++k) {
    const int64_t cur = (k - blk_begin) % 2;
    const int64_t j0 = block_start(k), nk = block_end(k) - j0;
    Scratch cw = w;
    if (g.head_mode) {
      cw.kpack = w.head_k + j0 * g.D;
      cw.vpack = w.head_v + j0 * kPanelCols;
      cw.vstride = g.head_keys * kPanelCols;
    } else {
      cw.kpack = w.kbuf[cur];
      cw.vpack = w.vbuf[cur];
    }
    // Software pipeline over the next block (not in head mode): before panel i its slice i is
    // prefetched (a few rows per score step) and its slice i - 1, prefetched one panel of
    // arithmetic ago, is packed into the other buffer.
    const bool pipeline = !g.head_mode && k + 1 < blk_end;
    const int64_t nj0 = pipeline ? block_start(k + 1) : 0;
    const int64_t nnk = pipeline ? block_end(k + 1) - nj0 : 0;
    const int64_t slice = (nnk + panels - 1) / panels;
    auto slice_range = [&](int64_t i, int64_t* lo, int64_t* hi) {
      *lo = std::min(nnk, i * slice);
      *hi = std::min(nnk, (i + 1) * slice);
    };
    for (int64_t r = 0; r < t.mp; ++r) {
      const int64_t lo = std::clamp<int64_t>(w.row_lo[r] - j0, 0, nk);
      const int64_t hi = std::clamp<int64_t>(w.row_hi[r] - j0, lo, nk);
      w.lo[r] = static_cast<float>(lo);
      w.hi[r] = static_cast<float>(hi);
    }
    for (int64_t i = 0; i < panels; ++i) {
      int64_t lo, hi;
      slice_range(i, &lo, &hi);
      const int64_t pf0 = nj0 + lo, pf_count = hi - lo;
      if (pipeline && i > 0) {
        slice_range(i - 1, &lo, &hi);
        PackRows(p, g, t, nj0, lo, hi, w.kbuf[1 - cur], w.vbuf[1 - cur], w.vstride, w);
      }
      Panel pn;
      pn.row0 = i * kPanelRows;
      pn.rows = std::min(kPanelRows, t.rows - pn.row0);
      pn.mp = RoundUp(pn.rows, kLanes);
      bool masked = false, any_visible = false;
      for (int64_t r = pn.row0; r < pn.row0 + pn.rows; ++r) {
        masked |= w.lo[r] != 0.f || w.hi[r] != static_cast<float>(nk);
        any_visible |= w.lo[r] < w.hi[r];
      }
      // A panel that sees none of the block keeps its state exactly (alpha 1, p 0): skip it.
      if (any_visible) RunPanel(p, g, t, pn, nk, masked, pf0, pf_count, cw);
      else PrefetchRows(p, g, t, pf0, pf_count);
    }
    if (pipeline) {
      int64_t lo, hi;
      slice_range(panels - 1, &lo, &hi);
      PackRows(p, g, t, nj0, lo, hi, w.kbuf[1 - cur], w.vbuf[1 - cur], w.vstride, w);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Decode mode: K/V stream straight from the cache. Packing would convert each key to f32 into
// scratch and read it back, and score with a register tile whose 16 query rows are mostly empty
// at G = 4; here each K row is loaded once, widened in registers (PromoteTo, exact) and dotted
// with every row of its head, and each V row is loaded once per column chunk while it sits in
// L1, so every byte of the cache crosses the memory bus once.
//
// Arithmetic (D = Dv = 128, f16, G = 4): a key of one head is 256 + 256 bytes and costs
// 4 x 128 multiply-adds for the scores plus as many for P V, 4 flops per byte. At AVX-512 that
// is 64 vector FMAs per key and head, 32 cycles on two FMA ports: 512 bytes per 32 cycles is
// ~40 GB/s per core at 2.5 GHz, so a core can outrun its DRAM stream (~12 GB/s on the Xeon
// dev VM) if nothing else costs more than the FMAs. Two things used to: a horizontal sum per
// (key, row) (10 shuffles and adds each, more than the key's 8 FMAs per row at AVX-512), and a
// softmax vectorized over the 4 rows of a head (12 of 16 lanes idle). Now the dot products of
// kGroupKeys = lanes consecutive keys are reduced together by a transposed tree (DecodeScore,
// lanes - 1 pairwise-sum steps of 3 ops per lanes keys: under 3 ops per key and row instead of
// 10) whose result is one vector of the keys' scores, and the softmax runs along the keys.
template <class T>
HWY_INLINE VF LoadWide(const T* p) {
  const DF df;
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else {
    const hn::Rebind<T, DF> dt;
    return hn::PromoteTo(df, hn::LoadU(dt, p));
  }
}

template <class T>
constexpr DType kDTypeOf = std::is_same_v<T, float> ? DType::f32
                           : std::is_same_v<T, hwy::float16_t> ? DType::f16
                                                                : DType::bf16;

// The transposed reduction needs a power-of-two lane count that divides the softmax block;
// elsewhere (scalable vectors wider than 16 lanes) each key is reduced on its own.
constexpr bool kTreeReduce = kLanes >= 2 && kLanes <= kDecodeKeys && (kLanes & (kLanes - 1)) == 0;
constexpr int64_t kGroupKeys = kTreeReduce ? kLanes : 1;
// x86 below AVX-512 has 16 vector registers, AVX-512 and Arm 32. The score step keeps
// 4 rows x kStepKeys accumulators (8 or 16) plus kStepKeys K vectors live, the P V tile
// 4 rows x kDecodeColVecs accumulators plus as many V vectors and a broadcast.
constexpr bool kWideRegisterFile = !(HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3);
constexpr int kStepKeys = !kTreeReduce ? 1 : kLanes >= 4 && kWideRegisterFile ? 4 : 2;
constexpr int kDecodeColVecs = kWideRegisterFile ? 4 : 2;

// Lanes of a's pairwise sums, then b's: one level of the transposed reduction. Applied to
// neighbours level by level, lanes vectors become one whose lane i is the sum of vector i.
// (A template found by argument-dependent lookup: the single-lane target has no ConcatEven and
// never instantiates it.)
template <class D>
HWY_INLINE hn::Vec<D> PairSums(D d, hn::Vec<D> a, hn::Vec<D> b) {
  return Add(ConcatEven(d, b, a), ConcatOdd(d, b, a));
}

// Decode's Q: rows in chunks of kDecodeRowChunk, each chunk D x kDecodeRowChunk floats laid out
// [d / lanes][row][lanes] for the whole vectors of D, then [row][tail] for the rest. The score
// loop then reads every row of its chunk from one pointer at fixed offsets: with a pointer per
// row, its four K rows, the prefetch queue's cursor and the loop counters wanted more than x86's
// 15 free general registers, and GCC parked the K row pointers in vector registers (a vmovq back
// before every load, the hottest instructions of the loop in perf).
void DecodeQ(const float* row, int64_t r, int64_t D, float* qt) {
  const int64_t dv = D / kLanes * kLanes, rr = r % kDecodeRowChunk;
  float* chunk = qt + (r - rr) * D;
  for (int64_t d = 0; d < dv; d += kLanes)
    std::memcpy(chunk + kDecodeRowChunk * d + rr * kLanes, row + d, size_t(kLanes) * sizeof(float));
  std::memcpy(chunk + kDecodeRowChunk * dv + rr * (D - dv), row + dv, size_t(D - dv) * sizeof(float));
}

// Software prefetch of the next softmax block: a head's K and V rows of block n + 1 (32 x 512
// bytes at D = 128 in f16) are requested while the same head computes block n, a few lines per
// inner step of the score and P V loops (per_step = lines / steps, 2 at AVX-512 and D = 128),
// so the requests overlap the arithmetic instead of queueing behind each other. Measured on the
// Xeon VM (f16, 1 GiB cache): without software prefetch one core read 5.3 GB/s against 10-12
// for a plain read of the same pattern (compute and memory taking turns: 1 / (1/16 + 1/12));
// with this queue 8.5-9.7, and 2 threads 60-80% of a paired plain read (bench_decode of_read%).
// Variants that measured worse: a burst of the whole block's prefetches at its start (stalled
// on the 16 L1 fill buffers, 85% of samples on the prefetches), 3 lines per step (the queue
// then competes with the current block's L2 hits), the next head's rows of the current block
// on top (in-L2 runs 12.7 -> 10.5 GB/s), two blocks ahead (same within noise). All heads of
// the next block in position order measured -5 points while the queue filled L1 (16-key
// blocks, prefetcht0: 128 KiB per block through a 48 KiB L1); into L2 it is now the default
// where a position's heads are contiguous (DecodeRange).
// The requests are prefetcht2 (into L2), not prefetcht0: the lines are used a block later, after
// all other heads' blocks have passed through L1, so L1 never kept them anyway, and a synthetic
// stream with this access order and arithmetic ran 66-82% of a paired plain read with t2
// against 56-65% with t0 (H200 host's Xeon, 1 and 2 threads; nta: 22%). With 32-key blocks,
// bench_decode at 2 threads (f16 and bf16, 0.5-1 GiB caches, three alternated passes): dev VM
// 70-79% of the paired read against 66-74% for t0 and 16 keys (t2 alone: 70-75%); H200 host,
// one pass, 17-20 GB/s against 16-18.
struct LineQueue {
  const char* const* rows;
  int64_t nrows, row_bytes, per_step;
  // The line being issued and the end of its row, as integers (the last step may pass the
  // cache's end): a compare and an add per line, each row's pointer read once. Hot decode
  // (1 thread, L2-resident, f16) against a row index and byte count re-adding rows[row] per
  // line: Zen 4 EPYC VM G = 1 62 -> 56.6 cycles per key and kv head, G = 4 unchanged; H200
  // host's Xeon G = 4 +3-4%. From DRAM 1.00x at G = 4 on both.
  int64_t row = 0;
  uintptr_t at = 0, stop = 0;
  HWY_INLINE void Issue() {
    for (int64_t n = 0; n < per_step; ++n) {
      if (at >= stop) {
        if (row == nrows) return;
        at = reinterpret_cast<uintptr_t>(rows[row++]);
        stop = at + uintptr_t(row_bytes);
      }
      __builtin_prefetch(reinterpret_cast<const void*>(at), 0, 1);
      at += 64;
    }
  }
};

// s[r * kDecodeStride + i] = K_i . Q_r for the kGroupKeys keys krows[i] and R query rows. q: the
// chunk's rows in DecodeQ's layout, so that one pointer serves all rows. kStepKeys keys share
// each Q load; their sums are folded in registers to one vector per row, and the group's
// kGroupKeys / kStepKeys such vectors per row are folded once at the end. The tail of D past the
// last whole vector is scalar.
template <class T, int R>
void DecodeScore(const T* const* krows, const float* q, int64_t D, float* s, LineQueue& pq) {
  const DF df;
  constexpr int64_t kSteps = kGroupKeys / kStepKeys;
  const int64_t dv = D / kLanes * kLanes;
  VF part[R][kSteps];
  // A local copy stays in registers; through the reference every step stored its cursor back.
  LineQueue lq = pq;
  for (int64_t step = 0; step < kSteps; ++step) {
    const T* kr[kStepKeys];
    VF acc[R][kStepKeys];
#pragma GCC unroll 16
    for (int k = 0; k < kStepKeys; ++k) {
      kr[k] = krows[step * kStepKeys + k];
      for (int r = 0; r < R; ++r) acc[r][k] = hn::Zero(df);
    }
    for (int64_t d = 0; d < dv; d += kLanes) {
      lq.Issue();
      VF kv[kStepKeys];
#pragma GCC unroll 16
      for (int k = 0; k < kStepKeys; ++k) kv[k] = LoadWide(kr[k] + d);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const VF qv = hn::LoadU(df, q + kDecodeRowChunk * d + r * kLanes);
        for (int k = 0; k < kStepKeys; ++k) acc[r][k] = hn::MulAdd(kv[k], qv, acc[r][k]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      if constexpr (kStepKeys == 4) {
        part[r][step] = PairSums(df, PairSums(df, acc[r][0], acc[r][1]), PairSums(df, acc[r][2], acc[r][3]));
      } else if constexpr (kStepKeys == 2) {
        part[r][step] = PairSums(df, acc[r][0], acc[r][1]);
      } else {
        part[r][step] = acc[r][0];
      }
    }
  }
  pq = lq;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    if constexpr (kTreeReduce) {
      for (int64_t n = kSteps; n > 1; n /= 2)
        for (int64_t i = 0; i < n / 2; ++i) part[r][i] = PairSums(df, part[r][2 * i], part[r][2 * i + 1]);
      hn::StoreU(part[r][0], df, s + r * kDecodeStride);
    } else {
      s[r * kDecodeStride] = hn::GetLane(hn::SumOfLanes(df, part[r][0]));
    }
  }
  if (dv == D) return;
  for (int r = 0; r < R; ++r)
    for (int64_t i = 0; i < kGroupKeys; ++i) {
      float x = 0.f;
      for (int64_t e = dv; e < D; ++e)
        x += load_as_f32(krows[i], e, kDTypeOf<T>) * q[kDecodeRowChunk * dv + r * (D - dv) + (e - dv)];
      s[r * kDecodeStride + i] += x;
    }
}

template <class T>
void DecodeScoreRows(int R, const T* const* krows, const float* q, int64_t D, float* s, LineQueue& pq) {
  switch (R) {
    case 1: return DecodeScore<T, 1>(krows, q, D, s, pq);
    case 2: return DecodeScore<T, 2>(krows, q, D, s, pq);
    case 3: return DecodeScore<T, 3>(krows, q, D, s, pq);
    default: return DecodeScore<T, 4>(krows, q, D, s, pq);
  }
}

// Online softmax of one decode block along its keys, row by row (S is [row][key], stride
// kDecodeStride), with SoftmaxBlock's rules and log2 domain: key i of row r is visible iff
// lo[r] <= i < hi[r] (hi <= the block's key count, so lanes past it are masked too); NaN and +inf
// poison the row's max; the exponent is taken against max_for_exp of the new max.
template <bool kSoftcap>
void DecodeSoftmax(int64_t rows, float scale, float softcap, const Scratch& w, const float* lo, const float* hi) {
  const DF df;
  constexpr int64_t kVecs = kDecodeStride / kLanes;
  const VF vscale = hn::Set(df, kSoftcap ? scale : scale * softmax::kLog2e);
  const VF vcap = hn::Set(df, softcap);
  const VF vcap_log2 = hn::Set(df, softcap * softmax::kLog2e);
  const VF neg_inf = hn::Set(df, -INFINITY);
  const VF iota = hn::Iota(df, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = w.st + r * kDecodeStride;
    const VF vlo = hn::Set(df, lo[r]), vhi = hn::Set(df, hi[r]);
    VF x[kVecs];
    VF mx = neg_inf, saw_nan = hn::Zero(df);
    for (int64_t v = 0; v < kVecs; ++v) {
      VF s = hn::Mul(hn::Load(df, sr + v * kLanes), vscale);
      if (kSoftcap) s = hn::Mul(vcap_log2, hn::Tanh(df, hn::Div(s, vcap)));
      const VF key = hn::Add(iota, hn::Set(df, static_cast<float>(v * kLanes)));
      x[v] = hn::IfThenElse(hn::And(hn::Ge(key, vlo), hn::Lt(key, vhi)), s, neg_inf);
      mx = hn::Max(mx, x[v]);
      saw_nan = hn::Or(saw_nan, hn::VecFromMask(df, hn::IsNaN(x[v])));
    }
    float m_blk = hn::GetLane(hn::MaxOfLanes(df, mx));
    if (!hn::AllFalse(df, hn::MaskFromVec(saw_nan)) || m_blk == INFINITY) m_blk = std::numeric_limits<float>::quiet_NaN();
    const float m_old = w.m[r];
    const float m_new = std::isnan(m_old) || std::isnan(m_blk) ? std::numeric_limits<float>::quiet_NaN()
                                                              : std::max(m_old, m_blk);
    const float alpha = softmax::rescale_factor(m_old, m_new, [](float e) { return std::exp2(e); });
    const VF mref = hn::Set(df, softmax::max_for_exp(m_new));
    VF sum = hn::Zero(df);
    for (int64_t v = 0; v < kVecs; ++v) {
      const VF pv = Exp2NonPositive(df, hn::Sub(x[v], mref));
      hn::Store(pv, df, sr + v * kLanes);
      sum = hn::Add(sum, pv);
    }
    w.alpha[r] = alpha;
    w.m[r] = m_new;
    w.l[r] = w.l[r] * alpha + hn::GetLane(hn::SumOfLanes(df, sum));
  }
}

// O[r][col + c * lanes ...] += sum_{j in [a, e)} P[r][j] * V_j[col + c * lanes ...] for R rows
// and C vectors of columns, V rows read from the cache (vrows[j]). p: P at row 0 of the chunk
// (row stride kDecodeStride); o: O at the chunk's first row (stride dvp).
template <class T, int R, int C>
void DecodePv(const void* const* vrows, int64_t a, int64_t e, const float* p, int64_t col, float* o, int64_t dvp,
              LineQueue& pq) {
  const DF df;
  VF acc[R][C];
  LineQueue lq = pq;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = hn::Zero(df);
  for (int64_t j = a; j < e; ++j) {
    lq.Issue();
    const T* v = static_cast<const T*>(vrows[j]) + col;
    VF vv[C];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) vv[c] = LoadWide(v + c * kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const VF pb = hn::Set(df, p[r * kDecodeStride + j]);
      for (int c = 0; c < C; ++c) acc[r][c] = hn::MulAdd(pb, vv[c], acc[r][c]);
    }
  }
  pq = lq;
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float* oc = o + r * dvp + col + c * kLanes;
      hn::Store(hn::Add(hn::Load(df, oc), acc[r][c]), df, oc);
    }
}

template <class T, int C>
void DecodePvRows(int R, const void* const* vrows, int64_t a, int64_t e, const float* p, int64_t col, float* o,
                  int64_t dvp, LineQueue& pq) {
  switch (R) {
    case 1: return DecodePv<T, 1, C>(vrows, a, e, p, col, o, dvp, pq);
    case 2: return DecodePv<T, 2, C>(vrows, a, e, p, col, o, dvp, pq);
    case 3: return DecodePv<T, 3, C>(vrows, a, e, p, col, o, dvp, pq);
    default: return DecodePv<T, 4, C>(vrows, a, e, p, col, o, dvp, pq);
  }
}

// Rows [r0, r0 + R) += P V over keys [a, e) of the block, every column of Dv.
template <class T>
void DecodePvRange(const Geometry& g, int R, int64_t r0, int64_t a, int64_t e, const Scratch& w,
                   LineQueue& pq) {
  if (a >= e) return;
  const int64_t full = g.Dv / kLanes * kLanes;
  const float* p = w.st + r0 * kDecodeStride;
  float* o = w.o + r0 * g.Dvp;
  int64_t col = 0;
  for (; col + kDecodeColVecs * kLanes <= full; col += kDecodeColVecs * kLanes)
    DecodePvRows<T, kDecodeColVecs>(R, w.vrows, a, e, p, col, o, g.Dvp, pq);
  for (; col < full; col += kLanes) DecodePvRows<T, 1>(R, w.vrows, a, e, p, col, o, g.Dvp, pq);
  for (; col < g.Dv; ++col)
    for (int64_t r = 0; r < R; ++r) {
      float part = 0.f;
      for (int64_t j = a; j < e; ++j) part += p[r * kDecodeStride + j] * load_as_f32(w.vrows[j], col, kDTypeOf<T>);
      o[r * g.Dvp + col] += part;
    }
}

// One decode task: keys [kb, ke) of sequence b (its split's whole key range) for ALL kv heads,
// in softmax blocks of kDecodeKeys positions from kb, head by head within a block. State per
// head (ws[hk]) follows RunTileBlocks' rules: a hidden key's score is -inf by select, and P V
// gives each row only the keys it sees, so a NaN in a hidden V row never reaches it.
template <class T>
void DecodeRange(const AttnParams& p, const Geometry& g, int64_t b, const SeqSpan& seq, int64_t rows, int64_t kb,
                 int64_t ke, const Scratch* ws) {
  const T* kbase = static_cast<const T*>(p.k);
  const T* vbase = static_cast<const T*>(p.v);
  const bool capped = p.softcap > 0.f;
  const Scratch& w0 = ws[0];
  // Head 0's rows at the block's positions and the next block's (the row lookup, paged or not,
  // once per position); head hk's are hk head strides further.
  const T *kpos[kDecodeStride], *vpos[kDecodeKeys], *knext[kDecodeKeys], *vnext[kDecodeKeys];
  const T* krows[kDecodeStride];
  const char* ahead[2 * kDecodeKeys];
  const int64_t row_bytes = std::max(g.D, g.Dv) * int64_t(sizeof(T));
  const bool whole_positions = g.D == g.Dv && p.k_head_stride == g.D && p.v_head_stride == g.Dv;
  // Inner steps of one head's block (a full block): the score loop's vector steps per key group
  // and P V's keys per column chunk, per chunk of rows.
  const int64_t chunks = (rows + kDecodeRowChunk - 1) / kDecodeRowChunk;
  const int64_t steps = std::max<int64_t>(
      1, chunks * ((kDecodeKeys / kStepKeys) * (g.D / kLanes) +
                   kDecodeKeys * (g.Dv / (kDecodeColVecs * kLanes) + g.Dv % (kDecodeColVecs * kLanes) / kLanes)));
  for (int64_t j0 = kb; j0 < ke; j0 += kDecodeKeys) {
    const int64_t nk = std::min(kDecodeKeys, ke - j0);
    bool any_visible = false;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t lo = std::clamp<int64_t>(w0.row_lo[r] - j0, 0, nk);
      const int64_t hi = std::clamp<int64_t>(w0.row_hi[r] - j0, lo, nk);
      w0.lo[r] = static_cast<float>(lo);
      w0.hi[r] = static_cast<float>(hi);
      any_visible |= lo < hi;
    }
    // Rows that see none of the block keep their state exactly (alpha 1, p 0).
    if (!any_visible) continue;
    // Lanes past the block's last key score a copy of it, then the softmax masks them.
    for (int64_t i = 0; i < kDecodeStride; ++i) kpos[i] = kbase + k_offset(p, b, seq, j0 + std::min(i, nk - 1), 0);
    for (int64_t i = 0; i < nk; ++i) vpos[i] = vbase + v_offset(p, b, seq, j0 + i, 0);
    const int64_t nn = std::clamp<int64_t>(ke - j0 - kDecodeKeys, 0, kDecodeKeys);
    for (int64_t i = 0; i < nn; ++i) {
      knext[i] = kbase + k_offset(p, b, seq, j0 + kDecodeKeys + i, 0);
      vnext[i] = vbase + v_offset(p, b, seq, j0 + kDecodeKeys + i, 0);
    }
    // When a position's heads lie side by side (head stride = row length, as in [S][Hkv][D]
    // caches and their pages), one queue walks the whole next block in address order, K then V
    // of each position (Hkv x D elements each), paced over all heads' inner steps of this block:
    // DRAM then sees two ascending streams, as a plain read does, instead of each head's rows
    // 2 KiB apart revisited Hkv times. Dev VM, 2 threads, f16 B = 8 (1 GiB), paired against the
    // plain read, 10 alternations: 73.7% -> 80.3% (median of per-round ratios 1.09); bf16 B = 4:
    // 81.8% -> 90.5% (1.13); one thread unchanged (0.99). Two blocks ahead measured 0.95x of one.
    // Otherwise each head queues its own rows of the next block.
    // next_block_queue: the next block's rows from head offsets koff / voff, `bytes` each,
    // spread over `over_steps` inner steps.
    auto next_block_queue = [&](int64_t koff, int64_t voff, int64_t bytes, int64_t over_steps) {
      for (int64_t i = 0; i < nn; ++i) {
        ahead[2 * i] = reinterpret_cast<const char*>(knext[i] + koff);
        ahead[2 * i + 1] = reinterpret_cast<const char*>(vnext[i] + voff);
      }
      return LineQueue{ahead, 2 * nn, bytes, (2 * nn * ((bytes + 63) / 64) + over_steps - 1) / over_steps};
    };
    LineQueue block_queue{};
    if (whole_positions) block_queue = next_block_queue(0, 0, g.heads_kv * row_bytes, steps * g.heads_kv);
    for (int64_t hk = 0; hk < g.heads_kv; ++hk) {
      const Scratch& w = ws[hk];
      const int64_t koff = hk * p.k_head_stride, voff = hk * p.v_head_stride;
      LineQueue head_queue{};
      if (!whole_positions) head_queue = next_block_queue(koff, voff, row_bytes, steps);
      LineQueue& pq = whole_positions ? block_queue : head_queue;
      for (int64_t i = 0; i < kDecodeStride; ++i) krows[i] = kpos[i] + koff;
      for (int64_t i = 0; i < nk; ++i) w.vrows[i] = vpos[i] + voff;
      for (int64_t i = 0; i < nk; i += kGroupKeys)
        for (int64_t r0 = 0; r0 < rows; r0 += kDecodeRowChunk) {
          const int R = static_cast<int>(std::min<int64_t>(kDecodeRowChunk, rows - r0));
          DecodeScoreRows<T>(R, krows + i, w.qt + r0 * g.D, g.D, w.st + r0 * kDecodeStride + i, pq);
        }
      if (capped) DecodeSoftmax<true>(rows, p.scale, p.softcap, w, w0.lo, w0.hi);
      else DecodeSoftmax<false>(rows, p.scale, p.softcap, w, w0.lo, w0.hi);
      const DF df;
      for (int64_t r = 0; r < rows; ++r) {
        if (w.alpha[r] == 1.f) continue;
        const VF a = hn::Set(df, w.alpha[r]);
        float* o = w.o + r * g.Dvp;
        for (int64_t c = 0; c < g.Dvp; c += kLanes) hn::Store(hn::Mul(hn::Load(df, o + c), a), df, o + c);
      }
      // Keys every row of a chunk sees go through the chunk's register tile; the rest row by row.
      for (int64_t r0 = 0; r0 < rows; r0 += kDecodeRowChunk) {
        const int R = static_cast<int>(std::min<int64_t>(kDecodeRowChunk, rows - r0));
        int64_t a = 0, e = nk;
        bool fast = true;
        for (int64_t r = r0; r < r0 + R; ++r) {
          const int64_t lo = static_cast<int64_t>(w0.lo[r]), hi = static_cast<int64_t>(w0.hi[r]);
          fast &= lo < hi;
          a = std::max(a, lo);
          e = std::min(e, hi);
        }
        fast &= a < e;
        if (fast) DecodePvRange<T>(g, R, r0, a, e, w, pq);
        for (int64_t r = r0; r < r0 + R; ++r) {
          const int64_t lo = static_cast<int64_t>(w0.lo[r]), hi = static_cast<int64_t>(w0.hi[r]);
          if (!fast) {
            DecodePvRange<T>(g, 1, r, lo, hi, w, pq);
            continue;
          }
          DecodePvRange<T>(g, 1, r, lo, a, w, pq);
          DecodePvRange<T>(g, 1, r, e, hi, w, pq);
        }
      }
    }
  }
}

// Writes row r's normalized output (rounded to the storage type) and its lse.
void WriteRow(const AttnParams& p, const Geometry& g, const Tile& t, int64_t r, const float* o, float m,
              float l) {
  const DF df;
  const int64_t pos = t.pos0 + r / g.G, h = t.hk * g.G + r % g.G;
  const int64_t oo = o_offset(p, t.b, t.seq, pos, h);
  const float inv = softmax::output_scale(l);
  int64_t c = 0;
  if (p.io_dtype == DType::f32) {
    float* out = static_cast<float*>(p.out) + oo;
    const VF vinv = hn::Set(df, inv);
    for (; c + kLanes <= g.Dv; c += kLanes) hn::StoreU(hn::Mul(hn::Load(df, o + c), vinv), df, out + c);
  }
  for (; c < g.Dv; ++c) store_from_f32(p.out, oo + c, p.io_dtype, o[c] * inv);
  if (p.lse) p.lse[lse_offset(p, t.b, t.seq, pos, h)] = softmax::row_lse(m, l, softmax::Domain::log2);
}

// ---------------------------------------------------------------------------------------------
// The task list: tiles ordered (sequence, kv head, query block from the LAST), so with dynamic
// hand-out the long causal tiles start first and the short ones fill the tail.

Tile MakeTile(const AttnParams& p, const Geometry& g, int64_t b, int64_t hk, int64_t q_block) {
  Tile t;
  t.b = b;
  t.hk = hk;
  t.seq = sequence(p, b);
  t.pos0 = q_block * g.pos_per_tile;
  t.npos = std::min(g.pos_per_tile, t.seq.seqlen_q - t.pos0);
  t.rows = t.npos * g.G;
  t.mp = RoundUp(t.rows, kLanes);
  return t;
}

int64_t QueryBlocks(const Geometry& g, const SeqSpan& s) { return (s.seqlen_q + g.pos_per_tile - 1) / g.pos_per_tile; }

struct TileIndex {
  const AttnParams* p;
  const Geometry* g;
  const int64_t* tiles_before;  // [batch + 1]: tiles of the sequences before b

  Tile Get(int64_t index) const {
    const int64_t b = std::upper_bound(tiles_before, tiles_before + p->batch + 1, index) - tiles_before - 1;
    const int64_t nq = QueryBlocks(*g, sequence(*p, b));
    const int64_t local = index - tiles_before[b];
    return MakeTile(*p, *g, b, local / nq, nq - 1 - local % nq);
  }
};

// Packs Q^T and the rows' visible ranges; returns the union [u0, u1) and the block count.
// decode: Q row-major ([row][D], for the decode path) instead of in Q^T panels.
void PrepareTile(const AttnParams& p, const Geometry& g, const Tile& t, const Scratch& w, bool decode, int64_t* u0,
                 int64_t* u1, int64_t* nb) {
  *u0 = std::numeric_limits<int64_t>::max();
  *u1 = std::numeric_limits<int64_t>::min();
  float* row = w.qrow;
  for (int64_t r = 0; r < t.mp; ++r) {
    float* panel = w.qt + (r / kLanes) * g.D * kLanes + r % kLanes;
    if (r >= t.rows) {
      if (!decode)
        for (int64_t d = 0; d < g.D; ++d) panel[d * kLanes] = 0.f;
      w.row_lo[r] = w.row_hi[r] = 0;
      continue;
    }
    const int64_t pos = t.pos0 + r / g.G, h = t.hk * g.G + r % g.G;
    if (decode) {
      RowToF32(p.q, q_offset(p, t.b, t.seq, pos, h), p.io_dtype, g.D, row);
      DecodeQ(row, r, g.D, w.qt);
    } else {
      RowToF32(p.q, q_offset(p, t.b, t.seq, pos, h), p.io_dtype, g.D, row);
      for (int64_t d = 0; d < g.D; ++d) panel[d * kLanes] = row[d];
    }
    const KeyRange keys = visible_keys(p, t.seq, pos);
    w.row_lo[r] = keys.begin;
    w.row_hi[r] = keys.end;
    if (keys.end > keys.begin) {
      *u0 = std::min(*u0, keys.begin);
      *u1 = std::max(*u1, keys.end);
    }
  }
  *nb = *u1 > *u0 ? (*u1 - *u0 + g.block_kv - 1) / g.block_kv : 0;
}

// How a call runs: the geometry (with the mode) and the work counts.
struct CallShape {
  Geometry g;
  int64_t n_tiles = 0, n_heads = 0, n_tasks = 0;
  int workers = 1;
};

// The mode comes from the rule the traffic model shares (cpu_call_mode); the geometry and task
// counts follow from it.
CallShape DecideShape(const AttnParams& p, const Plan& plan) {
  CallShape c;
  const int64_t G = p.heads_q / p.heads_kv;
  int64_t max_sq = 0;
  for (int64_t b = 0; b < p.batch; ++b) max_sq = std::max(max_sq, sequence(p, b).seqlen_q);
  const Geometry g0 = MakeGeometry(p, plan, false, 0);
  int64_t head_keys = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const SeqSpan s = sequence(p, b);
    const int64_t nq = QueryBlocks(g0, s);
    c.n_tiles += nq * p.heads_kv;
    if (nq > 0) c.n_heads += p.heads_kv;
    head_keys = std::max(head_keys, s.seqlen_k);
  }
  const int64_t want = std::max(plan.workers, 1);
  const int64_t head_bytes = head_keys * (g0.D + g0.Dvq) * int64_t(sizeof(float));
  const CpuCallMode mode = cpu_call_mode({G * std::max<int64_t>(max_sq, 1), g0.splits, double(c.n_tiles),
                                          double(c.n_heads), double(want), double(head_bytes)});
  if (mode == CpuCallMode::decode) {
    c = CallShape{};
    // Decode mode: one tile per (sequence, kv head), tasks (sequence, split) over all kv heads.
    c.g = MakeGeometry(p, plan, false, 0, std::max<int64_t>(max_sq, 1));
    for (int64_t b = 0; b < p.batch; ++b)
      if (sequence(p, b).seqlen_q > 0) c.n_tiles += p.heads_kv;
    c.n_heads = c.n_tiles;
    c.n_tasks = p.batch * c.g.splits;
    c.workers = static_cast<int>(std::min<int64_t>(std::max(plan.workers, 1), std::max<int64_t>(c.n_tasks, 1)));
    return c;
  }
  const bool head_mode = mode == CpuCallMode::head;
  c.g = head_mode ? MakeGeometry(p, plan, true, head_keys) : g0;
  c.n_tasks = head_mode ? c.n_heads : c.n_tiles * c.g.splits;
  c.workers = static_cast<int>(std::min<int64_t>(want, std::max<int64_t>(c.n_tasks, 1)));
  return c;
}

// One tile (or split of one) from its prepared state to its output or partial.
void RunTile(const AttnParams& p, const Geometry& g, const Tile& t, int64_t split, const Scratch& w, float* part) {
  int64_t u0, u1, nb;
  PrepareTile(p, g, t, w, false, &u0, &u1, &nb);
  RunTileBlocks(p, g, t, u0, u1, nb, split * nb / g.splits, (split + 1) * nb / g.splits, w);
  if (!part) {
    for (int64_t r = 0; r < t.rows; ++r) WriteRow(p, g, t, r, w.o + r * g.Dvp, w.m[r], w.l[r]);
    return;
  }
  std::memcpy(part, w.o, size_t(t.rows * g.Dvp) * sizeof(float));
  std::memcpy(part + g.rows_max * g.Dvp, w.m, size_t(t.rows) * sizeof(float));
  std::memcpy(part + g.rows_max * g.Dvp + g.rows_max, w.l, size_t(t.rows) * sizeof(float));
}

// One decode task (decode mode): split `split` of sequence b for all kv heads, leaving the
// outputs, or the partials of tiles tile0 + hk (layout as in tile mode: [tile][split]).
void DecodeTask(const AttnParams& p, const Geometry& g, int64_t b, int64_t split, unsigned char* base,
                float* partials, int64_t tile0) {
  Scratch* ws = reinterpret_cast<Scratch*>(base + g.off[kViews]);
  int64_t u0 = 0, u1 = 0, nb = 0;
  for (int64_t hk = 0; hk < g.heads_kv; ++hk) {
    ws[hk] = CarveScratch(g, base, hk);
    const Tile t = MakeTile(p, g, b, hk, 0);
    PrepareTile(p, g, t, ws[hk], true, &u0, &u1, &nb);
    for (int64_t r = 0; r < t.mp; ++r) {
      ws[hk].m[r] = softmax::neg_inf();
      ws[hk].l[r] = 0.f;
    }
    std::fill(ws[hk].o, ws[hk].o + t.mp * g.Dvp, 0.f);
  }
  const Tile t0 = MakeTile(p, g, b, 0, 0);
  // The visible keys [u0, u1) are cut into splits of whole softmax blocks, as even as blocks
  // allow: a split's time is its share of the keys and the call waits for the longest (block_kv's
  // 1008-key units, which only the packed path uses, had cut one 4096-key sequence 1072 / 3024).
  const int64_t blocks = u1 > u0 ? (u1 - u0 + kDecodeKeys - 1) / kDecodeKeys : 0;
  const int64_t kb = u0 + split * blocks / g.splits * kDecodeKeys;
  const int64_t ke = std::min(u1, u0 + (split + 1) * blocks / g.splits * kDecodeKeys);
  if (blocks > 0 && kb < ke) {
    switch (p.kv_dtype) {
      case DType::f16: DecodeRange<hwy::float16_t>(p, g, b, t0.seq, t0.rows, kb, ke, ws); break;
      case DType::bf16: DecodeRange<hwy::bfloat16_t>(p, g, b, t0.seq, t0.rows, kb, ke, ws); break;
      default: DecodeRange<float>(p, g, b, t0.seq, t0.rows, kb, ke, ws); break;
    }
  }
  for (int64_t hk = 0; hk < g.heads_kv; ++hk) {
    const Scratch& w = ws[hk];
    const Tile t = MakeTile(p, g, b, hk, 0);
    if (!partials) {
      for (int64_t r = 0; r < t.rows; ++r) WriteRow(p, g, t, r, w.o + r * g.Dvp, w.m[r], w.l[r]);
      continue;
    }
    float* part = partials + ((tile0 + hk) * g.splits + split) * g.partial_floats;
    std::memcpy(part, w.o, size_t(t.rows * g.Dvp) * sizeof(float));
    std::memcpy(part + g.rows_max * g.Dvp, w.m, size_t(t.rows) * sizeof(float));
    std::memcpy(part + g.rows_max * g.Dvp + g.rows_max, w.l, size_t(t.rows) * sizeof(float));
  }
}

Status FlashForward(const AttnParams& p, const Plan& plan) {
  if (p.batch == 0 || p.heads_q == 0) return Status::ok();
  const CallShape shape = DecideShape(p, plan);
  const Geometry& g = shape.g;
  if (shape.n_tiles == 0) return Status::ok();
  const int64_t n_tiles = shape.n_tiles, n_tasks = shape.n_tasks;
  const int workers = shape.workers;
  ScratchPtr<int64_t> tiles_before = scratch_array<int64_t>(size_t(p.batch) + 1);
  ScratchPtr<unsigned char> scratch = scratch_array<unsigned char>(g.worker_bytes * size_t(workers));
  ScratchPtr<float> partials;
  const size_t partial_floats = size_t(n_tiles * g.splits) * size_t(g.partial_floats);
  if (g.splits > 1) partials = scratch_array<float>(partial_floats);
  if (!tiles_before || !scratch || (g.splits > 1 && !partials)) {
    return Status::out_of_memory("CPU forward: could not allocate " +
                                 std::to_string(g.worker_bytes * size_t(workers) +
                                                (g.splits > 1 ? partial_floats * sizeof(float) : 0)) +
                                 " bytes of scratch (workers=" + std::to_string(workers) +
                                 ", kv_splits=" + std::to_string(g.splits) + ")");
  }
  tiles_before[0] = 0;
  for (int64_t b = 0; b < p.batch; ++b) tiles_before[b + 1] = tiles_before[b] + QueryBlocks(g, sequence(p, b)) * p.heads_kv;
  if (g.head_mode) {
    // Tasks are whole heads, in (sequence, kv head) order; sequences without query rows have none.
    parallel_for(n_tasks, workers, [&](int64_t task, int worker) {
      const Scratch w = CarveScratch(g, scratch.get() + size_t(worker) * g.worker_bytes);
      int64_t b = 0, seen = 0;
      for (;; ++b) {
        if (QueryBlocks(g, sequence(p, b)) == 0) continue;
        if (task < seen + p.heads_kv) break;
        seen += p.heads_kv;
      }
      const int64_t hk = task - seen;
      const Tile head = MakeTile(p, g, b, hk, 0);
      PrefetchRows(p, g, head, 0, std::min(kPrefetchRows, head.seq.seqlen_k));
      PackRows(p, g, head, 0, 0, head.seq.seqlen_k, w.head_k, w.head_v, g.head_keys * kPanelCols, w);
      const int64_t nq = QueryBlocks(g, head.seq);
      for (int64_t q = 0; q < nq; ++q) RunTile(p, g, MakeTile(p, g, b, hk, q), 0, w, nullptr);
    });
    return Status::ok();
  }
  const TileIndex index{&p, &g, tiles_before.get()};
  if (g.decode) {
    parallel_for(n_tasks, workers, [&](int64_t task, int worker) {
      const int64_t b = task / g.splits, split = task % g.splits;
      if (QueryBlocks(g, sequence(p, b)) == 0) return;
      DecodeTask(p, g, b, split, scratch.get() + size_t(worker) * g.worker_bytes, g.splits > 1 ? partials.get() : nullptr,
                 tiles_before[b]);
    });
  } else {
    parallel_for(n_tasks, workers, [&](int64_t task, int worker) {
    const Scratch w = CarveScratch(g, scratch.get() + size_t(worker) * g.worker_bytes);
    const int64_t tile_index = task / g.splits, split = task % g.splits;
    RunTile(p, g, index.Get(tile_index), split, w, g.splits > 1 ? partials.get() + task * g.partial_floats : nullptr);
    });
  }
  if (g.splits == 1) return Status::ok();

  // Merge the splits of each tile in split order (fixed, so the result is the same for any
  // thread count), with the header's merge rule.
  parallel_for(n_tiles, workers, [&](int64_t tile_index, int worker) {
    const DF df;
    const Scratch w = CarveScratch(g, scratch.get() + size_t(worker) * g.worker_bytes);
    const Tile t = index.Get(tile_index);
    const float* first = partials.get() + tile_index * g.splits * g.partial_floats;
    for (int64_t r = 0; r < t.rows; ++r) {
      float* o = w.o + r * g.Dvp;
      std::memcpy(o, first + r * g.Dvp, size_t(g.Dvp) * sizeof(float));
      float m = first[g.rows_max * g.Dvp + r], l = first[g.rows_max * g.Dvp + g.rows_max + r];
      for (int64_t s = 1; s < g.splits; ++s) {
        const float* part = first + s * g.partial_floats;
        const float m_b = part[g.rows_max * g.Dvp + r], l_b = part[g.rows_max * g.Dvp + g.rows_max + r];
        const softmax::MergeWeights mw = softmax::merge(m, l, m_b, l_b, [](float x) { return std::exp2(x); });
        const VF wa = hn::Set(df, mw.weight_a), wb = hn::Set(df, mw.weight_b);
        const float* ob = part + r * g.Dvp;
        for (int64_t c = 0; c < g.Dvp; c += kLanes)
          hn::Store(hn::MulAdd(hn::Load(df, ob + c), wb, hn::Mul(hn::Load(df, o + c), wa)), df, o + c);
        m = mw.m;
        l = mw.l;
      }
      WriteRow(p, g, t, r, o, m, l);
    }
  });
  return Status::ok();
}

size_t ScratchBytes(const AttnParams& p, const Plan& plan) {
  const CallShape c = DecideShape(p, plan);
  return c.g.worker_bytes * size_t(c.workers) + size_t(p.batch + 1) * sizeof(int64_t) +
         (c.g.splits > 1 ? size_t(c.n_tiles * c.g.splits * c.g.partial_floats) * sizeof(float) : 0);
}

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
