// One call's geometry, the per-worker scratch carved from one allocation, tiles, and the
// writes of a tile's finished rows.
// Per-target code: included by cpu/flash_kernel.cc once for every Highway target.
#if defined(IOATTN_CPU_SCRATCH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef IOATTN_CPU_SCRATCH_INL_H_
#undef IOATTN_CPU_SCRATCH_INL_H_
#else
#define IOATTN_CPU_SCRATCH_INL_H_
#endif

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/online_softmax.h"
#include "common/params.h"
#include "cpu/convert-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ioattn::cpu {
namespace HWY_NAMESPACE {

// Geometry of one call and the per-worker scratch carved from one allocation.

// Regions of a worker's scratch, each 64-byte aligned.
enum Region {
  kQt,
  kQrow,
  kK0,
  kK1,
  kV0,
  kV1,
  kHeadK,
  kHeadV,
  kVtmp,
  kSt,
  kO,
  kM,
  kL,
  kAlpha,
  kMref,
  kMblk,
  kLo,
  kHi,
  kRowLo,
  kRowHi,
  kVRows,
  kViews,
  kRegions
};

struct Scratch {
  float* qt;
  float* qrow;   // Q rows of one panel, [lanes][D], before PrepareTile transposes them into qt
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
  int64_t Dvq = 0;           // Dv rounded up to whole V panels
  int64_t pos_per_tile = 0;  // query positions per tile
  int64_t rows_max = 0;      // pos_per_tile * G
  int64_t mp_max = 0;        // rows_max rounded up to the vector: the rows of Q^T and of O
  int64_t block_kv = 0;
  int64_t splits = 1;
  int64_t prefetch_blocks = 1;  // decode: software prefetch distance in softmax blocks
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
  g.Dvp = round_up(g.Dv, kLanes);
  g.Dvq = round_up(g.Dv, kPanelCols);
  g.G = p.heads_q / p.heads_kv;
  g.decode = decode_positions > 0;
  g.pos_per_tile = g.decode ? decode_positions : std::max<int64_t>(1, plan.block_q / g.G);
  g.rows_max = g.pos_per_tile * g.G;
  // Decode's Q is stored in whole row chunks (DecodeQ).
  g.mp_max = round_up(g.rows_max, g.decode ? std::max<int64_t>(kLanes, kDecodeRowChunk) : kLanes);
  g.block_kv = std::max(1, plan.block_kv);
  g.splits = std::max(1, plan.kv_splits);
  g.prefetch_blocks = std::clamp(plan.decode_prefetch_blocks, 0, cpu_decode_max_prefetch_blocks);
  g.head_mode = head_mode;
  g.head_keys = head_keys;
  g.heads_kv = g.decode ? p.heads_kv : 1;
  const size_t f = sizeof(float);
  const size_t rows = size_t(g.mp_max), bk = size_t(g.block_kv);
  size_t bytes[kRegions] = {};
  bytes[kQt] = rows * size_t(g.D) * f;
  bytes[kQrow] = size_t(kLanes) * size_t(g.D) * f;
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
    const bool per_head =
        r == kQt || r == kSt || r == kO || r == kM || r == kL || r == kAlpha || r == kMref || r == kMblk || r == kVRows;
    g.head_bytes[r] = per_head ? AlignBytes(bytes[r]) : 0;
    g.off[r] = at;
    at += per_head ? size_t(g.heads_kv) * g.head_bytes[r] : AlignBytes(bytes[r]);
  }
  g.worker_bytes = at;
  // Rounded to whole vectors: the merge loads each partial's O rows with aligned loads, and
  // decode tiles can have any row count (2 x rows_max floats of m and l need not fill one).
  g.partial_floats = round_up(g.rows_max * g.Dvp + 2 * g.rows_max, kLanes);
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
  t.mp = round_up(t.rows, kLanes);
  return t;
}

int64_t QueryBlocks(const Geometry& g, const SeqSpan& s) { return (s.seqlen_q + g.pos_per_tile - 1) / g.pos_per_tile; }

// Packs Q^T and the rows' visible ranges; returns the union [u0, u1) and the block count.
// decode: Q row-major ([row][D], for the decode path) instead of in Q^T panels. A panel's rows
// are converted into w.qrow first and then transposed a d at a time, one gather and one full
// store each: storing each row's elements straight into the panel wrote one float per cache
// line, 128 partial lines per row, and cost more than the row's conversion.
void PrepareTile(const AttnParams& p, const Geometry& g, const Tile& t, const Scratch& w, bool decode, int64_t* u0,
                 int64_t* u1, int64_t* nb) {
  *u0 = std::numeric_limits<int64_t>::max();
  *u1 = std::numeric_limits<int64_t>::min();
  const DF df;
  const hn::RebindToSigned<DF> di;
  const auto row_starts = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(g.D)));
  for (int64_t r0 = 0; r0 < t.mp; r0 += kLanes) {
    for (int64_t r = r0; r < r0 + kLanes; ++r) {
      float* row = decode ? w.qrow : w.qrow + (r - r0) * g.D;
      if (r >= t.rows) {
        if (!decode) std::fill(row, row + g.D, 0.f);
        w.row_lo[r] = w.row_hi[r] = 0;
        continue;
      }
      const int64_t pos = t.pos0 + r / g.G, h = t.hk * g.G + r % g.G;
      RowToF32(p.q, q_offset(p, t.b, t.seq, pos, h), p.io_dtype, g.D, row);
      if (decode) DecodeQ(row, r, g.D, w.qt);
      const KeyRange keys = visible_keys(p, t.seq, pos);
      w.row_lo[r] = keys.begin;
      w.row_hi[r] = keys.end;
      if (keys.end > keys.begin) {
        *u0 = std::min(*u0, keys.begin);
        *u1 = std::max(*u1, keys.end);
      }
    }
    if (decode) continue;
    float* panel = w.qt + r0 * g.D;
    for (int64_t d = 0; d < g.D; ++d) hn::Store(hn::GatherIndex(df, w.qrow + d, row_starts), df, panel + d * kLanes);
  }
  *nb = *u1 > *u0 ? (*u1 - *u0 + g.block_kv - 1) / g.block_kv : 0;
}

// Writes row r's normalized output (rounded to the storage type) and its lse.
void WriteRow(const AttnParams& p, const Geometry& g, const Tile& t, int64_t r, const float* o, float m, float l) {
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

// A tile's running state before its first block: m = -inf, l = 0, O = 0 for its mp rows.
void ResetState(const Scratch& w, int64_t mp, int64_t dvp) {
  for (int64_t r = 0; r < mp; ++r) {
    w.m[r] = softmax::neg_inf();
    w.l[r] = 0.f;
  }
  std::fill(w.o, w.o + mp * dvp, 0.f);
}

// Each row's visible keys [row_lo, row_hi) as offsets into the block of nk keys from j0, into
// w.lo / w.hi (floats: the softmax compares them with key indices in vector lanes); true when any
// of the rows sees a key of the block.
bool ClampRowRanges(const Scratch& w, int64_t rows, int64_t j0, int64_t nk) {
  bool any_visible = false;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t lo = std::clamp<int64_t>(w.row_lo[r] - j0, 0, nk);
    const int64_t hi = std::clamp<int64_t>(w.row_hi[r] - j0, lo, nk);
    w.lo[r] = static_cast<float>(lo);
    w.hi[r] = static_cast<float>(hi);
    any_visible |= lo < hi;
  }
  return any_visible;
}

// Keys [a, e) of the block that every row of [r0, r1) sees (their ranges' intersection): those go
// through a register tile for all the rows at once; fast is false when some row sees none.
struct SharedKeys {
  int64_t a, e;
  bool fast;
};

SharedKeys IntersectRowRanges(const float* row_lo, const float* row_hi, int64_t r0, int64_t r1, int64_t nk) {
  SharedKeys k{0, nk, true};
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t lo = static_cast<int64_t>(row_lo[r]), hi = static_cast<int64_t>(row_hi[r]);
    k.fast &= lo < hi;
    k.a = std::max(k.a, lo);
    k.e = std::min(k.e, hi);
  }
  k.fast &= k.a < k.e;
  return k;
}

// What each row of [r0, r1) sees beyond the shared keys, as ranges for row_pv(r, begin, end): the
// whole of its range where the rows share none, else the parts before and after the shared keys.
template <class RowPv>
void ForRowRemainders(const float* row_lo, const float* row_hi, int64_t r0, int64_t r1, const SharedKeys& k,
                      RowPv&& row_pv) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t lo = static_cast<int64_t>(row_lo[r]), hi = static_cast<int64_t>(row_hi[r]);
    if (!k.fast) {
      row_pv(r, lo, hi);
      continue;
    }
    row_pv(r, lo, k.a);
    row_pv(r, k.e, hi);
  }
}

// A finished tile's rows: normalized into the output (part null), or its unnormalized (O, m, l)
// as a split's partial for the merge.
void FinishTile(const AttnParams& p, const Geometry& g, const Tile& t, const Scratch& w, float* part) {
  if (!part) {
    for (int64_t r = 0; r < t.rows; ++r) WriteRow(p, g, t, r, w.o + r * g.Dvp, w.m[r], w.l[r]);
    return;
  }
  std::memcpy(part, w.o, size_t(t.rows * g.Dvp) * sizeof(float));
  std::memcpy(part + g.rows_max * g.Dvp, w.m, size_t(t.rows) * sizeof(float));
  std::memcpy(part + g.rows_max * g.Dvp + g.rows_max, w.l, size_t(t.rows) * sizeof(float));
}

}  // namespace HWY_NAMESPACE
}  // namespace ioattn::cpu
HWY_AFTER_NAMESPACE();

#endif  // IOATTN_CPU_SCRATCH_INL_H_
