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

// S^T[key r][row vector c] = sum_d K[r][d] * Q^T[c][d]. kp: the first of R packed f32 key rows
// (stride D); qt: the first of C Q^T panels ([d][lanes] each, panel stride D * lanes); st: row r
// of S^T, stride mp.
// The register loops carry `#pragma GCC unroll`: without it GCC keeps acc[R][C] as a stack array
// outside the hot loop, zeroing or loading it there and storing it through the stack at the end.
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
// KiB at 1040 x 128), the accumulators' loads would wait on it at the start of every call, and
// a call (1152 FMA cycles at block_kv = 96, D = 128) is long enough for the next one's lines.
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

}  // namespace HWY_NAMESPACE
}  // namespace ioattn::cpu
HWY_AFTER_NAMESPACE();

#endif  // IOATTN_CPU_TILES_INL_H_
