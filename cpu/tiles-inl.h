// The kernel's compile-time shapes (register tiles, panels, decode blocks) and the micro-kernels
// that run them: S^T = K Q^T and O += P V on register tiles, with every remainder shape tabulated.
// Per-target code: included by cpu/flash_kernel.cc once for every Highway target.
#if defined(IOATTN_CPU_TILES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef IOATTN_CPU_TILES_INL_H_
#undef IOATTN_CPU_TILES_INL_H_
#else
#define IOATTN_CPU_TILES_INL_H_
#endif

#include <array>
#include <utility>

#include "common/cpu_tiles.h"
#include "common/int_math.h"
#include "hwy/highway.h"

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

constexpr size_t AlignBytes(size_t x) { return (x + 63) / 64 * 64; }

// Decode mode (DecodeRange) takes calls whose sequences have at most kDecodeRows query rows
// per kv head: decode's G heads of one token (G = 4 for Hq = 32 over Hkv = 8) or a couple of
// speculative tokens. Its cost per key grows with the rows (2 x rows x D multiply-adds) while the
// packed path's register tile wants 16+ rows. kDecodeKeys positions form one softmax block: the
// block's K and V for all heads (32 x 8 x 512 bytes = 128 KiB in f16) wait in L2, where
// LineQueue puts them, between the score pass and P V. 32 keys halve the per-block costs (the
// softmax's max and sum reductions, the rescale of O, the row pointers) against 16; 64 no longer
// fits the wait in L2 beside the other heads' blocks.
constexpr int64_t kDecodeRows = cpu_decode_max_rows;
constexpr int64_t kDecodeKeys = cpu_decode_block_keys;
static_assert(kDecodeKeys <= kSumChunk, "decode's P V sums one block from zero, so a block is one partial sum");
// Score rows are kDecodeStride floats apart: whole vectors, so the softmax loads past the
// block's last key (and masks) instead of running a scalar tail.
constexpr int64_t kDecodeStride = round_up(kDecodeKeys, kLanes);
// Decode's query rows go through the score and P V tiles 4 at a time (4 rows x 4 keys of
// accumulators in the score step).
constexpr int kDecodeRowChunk = 4;

// Micro-kernels.

// Register tiles hold their accumulators in named vectors, up to four per row, not in arrays:
// scalable vectors (SVE) cannot be array elements. MulAddRow is one row's step: a_c += b * x_c
// for the first C of them.
template <int C>
HWY_INLINE void MulAddRow(VF b, VF x0, VF x1, VF x2, VF x3, VF& a0, VF& a1, VF& a2, VF& a3) {
  static_assert(1 <= C && C <= 4, "a row holds one to four accumulators");
  a0 = hn::MulAdd(b, x0, a0);
  if constexpr (C > 1) a1 = hn::MulAdd(b, x1, a1);
  if constexpr (C > 2) a2 = hn::MulAdd(b, x2, a2);
  if constexpr (C > 3) a3 = hn::MulAdd(b, x3, a3);
}

// The first C of x0..x3 loaded from p, lanes apart; the rest zero (never read).
template <int C>
HWY_INLINE void LoadRow(DF df, const float* p, int64_t stride, VF& x0, VF& x1, VF& x2, VF& x3) {
  x0 = hn::Load(df, p);
  x1 = C > 1 ? hn::Load(df, p + stride) : hn::Zero(df);
  x2 = C > 2 ? hn::Load(df, p + 2 * stride) : hn::Zero(df);
  x3 = C > 3 ? hn::Load(df, p + 3 * stride) : hn::Zero(df);
}

// o[c * lanes ...] += a_c for the first C accumulators of a row.
template <int C>
HWY_INLINE void AddRowTo(DF df, float* o, VF a0, VF a1, VF a2, VF a3) {
  hn::Store(hn::Add(hn::Load(df, o), a0), df, o);
  if constexpr (C > 1) hn::Store(hn::Add(hn::Load(df, o + kLanes), a1), df, o + kLanes);
  if constexpr (C > 2) hn::Store(hn::Add(hn::Load(df, o + 2 * kLanes), a2), df, o + 2 * kLanes);
  if constexpr (C > 3) hn::Store(hn::Add(hn::Load(df, o + 3 * kLanes), a3), df, o + 3 * kLanes);
}

// One score vector: x = a * scale stored at s and, with kMax, folded into the running max m.
template <bool kMax>
HWY_INLINE void StoreScaled(DF df, VF a, VF vscale, float* s, VF& m) {
  const VF x = hn::Mul(a, vscale);
  hn::Store(x, df, s);
  if constexpr (kMax) m = hn::Max(m, x);
}

// Column c of ScoreTile's accumulators (a0..a7: rows 0..7) scaled into S^T rows mp apart.
template <int R, bool kMax>
HWY_INLINE void StoreScoreColumn(DF df, VF vscale, float* st, int64_t mp, float* mx, VF a0, VF a1, VF a2, VF a3, VF a4,
                                 VF a5, VF a6, VF a7) {
  VF m = kMax ? hn::Load(df, mx) : hn::Zero(df);
  StoreScaled<kMax>(df, a0, vscale, st, m);
  if constexpr (R > 1) StoreScaled<kMax>(df, a1, vscale, st + mp, m);
  if constexpr (R > 2) StoreScaled<kMax>(df, a2, vscale, st + 2 * mp, m);
  if constexpr (R > 3) StoreScaled<kMax>(df, a3, vscale, st + 3 * mp, m);
  if constexpr (R > 4) StoreScaled<kMax>(df, a4, vscale, st + 4 * mp, m);
  if constexpr (R > 5) StoreScaled<kMax>(df, a5, vscale, st + 5 * mp, m);
  if constexpr (R > 6) StoreScaled<kMax>(df, a6, vscale, st + 6 * mp, m);
  if constexpr (R > 7) StoreScaled<kMax>(df, a7, vscale, st + 7 * mp, m);
  if constexpr (kMax) hn::Store(m, df, mx);
}

// S^T[key r][row vector c] = sum_d K[r][d] * Q^T[c][d]. kp: the first of R packed f32 key rows
// (stride D); qt: the first of C Q^T panels ([d][lanes] each, panel stride D * lanes); st: row r
// of S^T, stride mp.
// Stored scores are already multiplied by `scale` (the softmax's x = s * scale * log2 e, or s *
// scale under softcap: the same single rounded multiply SoftmaxBlock used to do on its first pass).
// kMax: also folds the R keys' scores into the running block max of each row vector (mx, C
// vectors), so an unmasked panel's softmax needs no pass of its own to find the max: 2 vector ops
// per score vector here (multiply, max) instead of a pass of load, multiply, store, max and the
// NaN test (5 vector ops and a store), against the tile's D FMAs per score vector.
template <int R, int C, bool kMax>
void ScoreTile(const float* kp, const float* qt, int64_t D, float* st, int64_t mp, float scale, float* mx) {
  static_assert(1 <= R && R <= 8, "the named accumulators cover 8 rows");
  const DF df;
  const VF z = hn::Zero(df);
  VF a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z, a20 = z, a21 = z, a22 = z, a23 = z,
     a30 = z, a31 = z, a32 = z, a33 = z, a40 = z, a41 = z, a42 = z, a43 = z, a50 = z, a51 = z, a52 = z, a53 = z,
     a60 = z, a61 = z, a62 = z, a63 = z, a70 = z, a71 = z, a72 = z, a73 = z;
  const int64_t panel = D * kLanes;
  for (int64_t d = 0; d < D; ++d) {
    VF q0, q1, q2, q3;
    LoadRow<C>(df, qt + d * kLanes, panel, q0, q1, q2, q3);
    MulAddRow<C>(hn::Set(df, kp[0 * D + d]), q0, q1, q2, q3, a00, a01, a02, a03);
    if constexpr (R > 1) MulAddRow<C>(hn::Set(df, kp[1 * D + d]), q0, q1, q2, q3, a10, a11, a12, a13);
    if constexpr (R > 2) MulAddRow<C>(hn::Set(df, kp[2 * D + d]), q0, q1, q2, q3, a20, a21, a22, a23);
    if constexpr (R > 3) MulAddRow<C>(hn::Set(df, kp[3 * D + d]), q0, q1, q2, q3, a30, a31, a32, a33);
    if constexpr (R > 4) MulAddRow<C>(hn::Set(df, kp[4 * D + d]), q0, q1, q2, q3, a40, a41, a42, a43);
    if constexpr (R > 5) MulAddRow<C>(hn::Set(df, kp[5 * D + d]), q0, q1, q2, q3, a50, a51, a52, a53);
    if constexpr (R > 6) MulAddRow<C>(hn::Set(df, kp[6 * D + d]), q0, q1, q2, q3, a60, a61, a62, a63);
    if constexpr (R > 7) MulAddRow<C>(hn::Set(df, kp[7 * D + d]), q0, q1, q2, q3, a70, a71, a72, a73);
  }
  const VF vscale = hn::Set(df, scale);
  StoreScoreColumn<R, kMax>(df, vscale, st + 0 * kLanes, mp, mx + 0 * kLanes, a00, a10, a20, a30, a40, a50, a60, a70);
  if constexpr (C > 1)
    StoreScoreColumn<R, kMax>(df, vscale, st + 1 * kLanes, mp, mx + 1 * kLanes, a01, a11, a21, a31, a41, a51, a61, a71);
  if constexpr (C > 2)
    StoreScoreColumn<R, kMax>(df, vscale, st + 2 * kLanes, mp, mx + 2 * kLanes, a02, a12, a22, a32, a42, a52, a62, a72);
  if constexpr (C > 3)
    StoreScoreColumn<R, kMax>(df, vscale, st + 3 * kLanes, mp, mx + 3 * kLanes, a03, a13, a23, a33, a43, a53, a63, a73);
}

// O[r][c * lanes ...] += sum_j P^T[j][r] * V[j][c * lanes ...] for R rows, C vectors, n keys.
// p: P^T at (first key, first row), stride mp; vp: the V panel of these columns at the first key
// ([key][kPanelCols], so the loads are one contiguous stream); o: O at (first row, first column).
// o_next: the O block of the next call, requested now: O lives in L2 (the tile's rows x Dv, 520
// KiB at 1040 x 128), the accumulators' loads would wait on it at the start of every call, and
// a call (1152 FMA cycles at block_kv = 96, D = 128) is long enough for the next one's lines.
// The keys are summed in partials of kSumChunk from zero in the registers, each then added to O
// (common/cpu_tiles.h, cpu_sum_chunk_keys, says why).
template <int R, int C>
void PvTile(const float* p, int64_t mp, const float* vp, int64_t n, float* o, int64_t dvp, const float* o_next) {
  static_assert(1 <= R && R <= 6, "the named accumulators cover 6 rows");
  const DF df;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) __builtin_prefetch(o_next + r * dvp + c * kLanes, 1, 3);
  const VF z = hn::Zero(df);
  for (int64_t j0 = 0; j0 < n; j0 += kSumChunk) {
    VF a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z, a20 = z, a21 = z, a22 = z, a23 = z,
       a30 = z, a31 = z, a32 = z, a33 = z, a40 = z, a41 = z, a42 = z, a43 = z, a50 = z, a51 = z, a52 = z, a53 = z;
    const int64_t j1 = std::min(n, j0 + kSumChunk);
    for (int64_t j = j0; j < j1; ++j) {
      VF v0, v1, v2, v3;
      LoadRow<C>(df, vp + j * kPanelCols, kLanes, v0, v1, v2, v3);
      const float* pj = p + j * mp;
      MulAddRow<C>(hn::Set(df, pj[0]), v0, v1, v2, v3, a00, a01, a02, a03);
      if constexpr (R > 1) MulAddRow<C>(hn::Set(df, pj[1]), v0, v1, v2, v3, a10, a11, a12, a13);
      if constexpr (R > 2) MulAddRow<C>(hn::Set(df, pj[2]), v0, v1, v2, v3, a20, a21, a22, a23);
      if constexpr (R > 3) MulAddRow<C>(hn::Set(df, pj[3]), v0, v1, v2, v3, a30, a31, a32, a33);
      if constexpr (R > 4) MulAddRow<C>(hn::Set(df, pj[4]), v0, v1, v2, v3, a40, a41, a42, a43);
      if constexpr (R > 5) MulAddRow<C>(hn::Set(df, pj[5]), v0, v1, v2, v3, a50, a51, a52, a53);
    }
    AddRowTo<C>(df, o + 0 * dvp, a00, a01, a02, a03);
    if constexpr (R > 1) AddRowTo<C>(df, o + 1 * dvp, a10, a11, a12, a13);
    if constexpr (R > 2) AddRowTo<C>(df, o + 2 * dvp, a20, a21, a22, a23);
    if constexpr (R > 3) AddRowTo<C>(df, o + 3 * dvp, a30, a31, a32, a33);
    if constexpr (R > 4) AddRowTo<C>(df, o + 4 * dvp, a40, a41, a42, a43);
    if constexpr (R > 5) AddRowTo<C>(df, o + 5 * dvp, a50, a51, a52, a53);
  }
}

// One row, keys [j0, j1), C vectors from vector v0 of the row. p: this row's P^T column (stride
// mp); vpack: all V panels (panel stride vstride).
template <int C>
void RowPvChunk(const float* p, int64_t mp, const float* vpack, int64_t vstride, int64_t j0, int64_t j1, int64_t v0,
                float* o) {
  const DF df;
  const float* vbase[4];
  for (int c = 0; c < C; ++c) vbase[c] = vpack + (v0 + c) / kPvTile.vecs * vstride + (v0 + c) % kPvTile.vecs * kLanes;
  const VF z = hn::Zero(df);
  for (int64_t k0 = j0; k0 < j1; k0 += kSumChunk) {
    VF a0 = z, a1 = z, a2 = z, a3 = z;
    for (int64_t j = k0; j < std::min(j1, k0 + kSumChunk); ++j) {
      const VF pb = hn::Set(df, p[j * mp]);
      const VF x0 = hn::Load(df, vbase[0] + j * kPanelCols);
      const VF x1 = C > 1 ? hn::Load(df, vbase[1] + j * kPanelCols) : z;
      const VF x2 = C > 2 ? hn::Load(df, vbase[2] + j * kPanelCols) : z;
      const VF x3 = C > 3 ? hn::Load(df, vbase[3] + j * kPanelCols) : z;
      MulAddRow<C>(pb, x0, x1, x2, x3, a0, a1, a2, a3);
    }
    AddRowTo<C>(df, o, a0, a1, a2, a3);
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

}  // namespace HWY_NAMESPACE
}  // namespace ioattn::cpu
HWY_AFTER_NAMESPACE();

#endif  // IOATTN_CPU_TILES_INL_H_
