// The prefill tile pipeline: pack a K/V block while the previous one computes, then per 48-row
// panel score, softmax, rescale and accumulate P V.
// Per-target code: included by cpu/flash_kernel.cc once for every Highway target.
#if defined(IOATTN_CPU_PREFILL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef IOATTN_CPU_PREFILL_INL_H_
#undef IOATTN_CPU_PREFILL_INL_H_
#else
#define IOATTN_CPU_PREFILL_INL_H_
#endif

#include <algorithm>
#include <limits>

#include "cpu/softmax-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ioattn::cpu {
namespace HWY_NAMESPACE {

// O rows += P V over the block, each row over exactly its visible keys [lo_r, hi_r).
// masked: some row of the panel does not see every key [0, nk) of the block; otherwise every
// group is fast over all nk keys, without reading the rows' ranges (their float-to-int
// conversions cost more than the unmasked panel's P V bookkeeping otherwise needs).
void AccumulatePv(const Geometry& g, const Panel& pn, int64_t nk, bool masked, const Scratch& w) {
  const int64_t vecs_total = g.Dvp / kLanes;
  auto row_pv = [&](int64_t r, int64_t a, int64_t e) {
    if (a >= e) return;
    for (int64_t v = 0; v < vecs_total; v += kRowVecs) {
      const int64_t c = std::min<int64_t>(kRowVecs, vecs_total - v);
      kRowPv[size_t(c - 1)](w.st + (r - pn.row0), pn.mp, w.vpack, w.vstride, a, e, v, w.o + r * g.Dvp + v * kLanes);
    }
  };
  // Keys every row of a group sees go through the register tile; the rest row by row. Column
  // chunks outermost: one chunk of the V panel (block_kv x 64 bytes) stays in L1 while every
  // group of the panel's P^T (also L1) passes over it.
  constexpr int64_t kGroups = kPanelRows / kPvTile.rows;
  SharedKeys shared[kGroups];
  for (int64_t gi = 0; gi * kPvTile.rows < pn.rows; ++gi) {
    const int64_t r0 = pn.row0 + gi * kPvTile.rows, nr = std::min<int64_t>(kPvTile.rows, pn.row0 + pn.rows - r0);
    shared[gi] = masked ? IntersectRowRanges(w.lo, w.hi, r0, r0 + nr, nk) : SharedKeys{0, nk, true};
  }
  for (int64_t v = 0; v < vecs_total; v += kPvTile.vecs) {
    const int64_t nc = std::min<int64_t>(kPvTile.vecs, vecs_total - v);
    const float* panel = w.vpack + (v / kPvTile.vecs) * w.vstride;
    for (int64_t gi = 0; gi * kPvTile.rows < pn.rows; ++gi) {
      const SharedKeys& k = shared[gi];
      if (!k.fast) continue;
      const int64_t r0 = pn.row0 + gi * kPvTile.rows, nr = std::min<int64_t>(kPvTile.rows, pn.row0 + pn.rows - r0);
      // The next call's O: the next group's rows, or the panel's first rows in the next columns.
      const bool last_group = r0 + nr >= pn.row0 + pn.rows;
      const float* o_next =
          w.o + (last_group ? pn.row0 * g.Dvp + (v + kPvTile.vecs) * kLanes : (r0 + nr) * g.Dvp + v * kLanes);
      kPv[size_t(nc - 1)][size_t(nr - 1)](w.st + k.a * pn.mp + (r0 - pn.row0), pn.mp, panel + k.a * kPanelCols,
                                          k.e - k.a, w.o + r0 * g.Dvp + v * kLanes, g.Dvp, o_next);
    }
  }
  for (int64_t gi = 0; masked && gi * kPvTile.rows < pn.rows; ++gi) {
    const int64_t r0 = pn.row0 + gi * kPvTile.rows, nr = std::min<int64_t>(kPvTile.rows, pn.row0 + pn.rows - r0);
    ForRowRemainders(w.lo, w.hi, r0, r0 + nr, shared[gi], row_pv);
  }
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
void PackRows(const AttnParams& p, const Geometry& g, const Tile& t, int64_t j0, int64_t lo, int64_t hi, float* kpack,
              float* vpack, int64_t vstride, const Scratch& w) {
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
    if (capped)
      SoftmaxBlock<true, true, false>(pn, kb, ke, p.softcap, w);
    else
      SoftmaxBlock<true, false, false>(pn, kb, ke, p.softcap, w);
  } else {
    if (capped)
      SoftmaxBlock<false, true, false>(pn, kb, ke, p.softcap, w);
    else
      SoftmaxBlock<false, false, true>(pn, kb, ke, p.softcap, w);
  }
  RescaleRows(w, pn.row0, pn.row0 + pn.rows, g.Dvp);
  AccumulatePv(g, pn, nk, masked, w);
}

// Runs the blocks [blk_begin, blk_end) of the tile (block k covers keys
// [max(U0, U1 - (nb - k) * block_kv), U1 - (nb - 1 - k) * block_kv)) and leaves the
// unnormalized state in w.o, w.m, w.l. In head mode the keys were packed once for the whole
// (sequence, kv head) into w.head_k / w.head_v; otherwise each block is packed here, the next one
// while this one computes.
void RunTileBlocks(const AttnParams& p, const Geometry& g, const Tile& t, int64_t u0, int64_t u1, int64_t nb,
                   int64_t blk_begin, int64_t blk_end, const Scratch& w) {
  ResetState(w, t.mp, g.Dvp);
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
    ClampRowRanges(w, t.mp, j0, nk);
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
      pn.mp = round_up(pn.rows, kLanes);
      bool masked = false, any_visible = false;
      for (int64_t r = pn.row0; r < pn.row0 + pn.rows; ++r) {
        masked |= w.lo[r] != 0.f || w.hi[r] != static_cast<float>(nk);
        any_visible |= w.lo[r] < w.hi[r];
      }
      // A panel that sees none of the block keeps its state exactly (alpha 1, p 0): skip it.
      if (any_visible)
        RunPanel(p, g, t, pn, nk, masked, pf0, pf_count, cw);
      else
        PrefetchRows(p, g, t, pf0, pf_count);
    }
    if (pipeline) {
      int64_t lo, hi;
      slice_range(panels - 1, &lo, &hi);
      PackRows(p, g, t, nj0, lo, hi, w.kbuf[1 - cur], w.vbuf[1 - cur], w.vstride, w);
    }
  }
}

// One tile (or split of one) from its prepared state to its output or partial.
void RunTile(const AttnParams& p, const Geometry& g, const Tile& t, int64_t split, const Scratch& w, float* part) {
  int64_t u0, u1, nb;
  PrepareTile(p, g, t, w, false, &u0, &u1, &nb);
  RunTileBlocks(p, g, t, u0, u1, nb, split * nb / g.splits, (split + 1) * nb / g.splits, w);
  FinishTile(p, g, t, w, part);
}

// Head mode: one (sequence b, kv head hk) whose keys are packed once into w.head_k / w.head_v,
// then every query tile of it against that copy.
void RunHead(const AttnParams& p, const Geometry& g, int64_t b, int64_t hk, const Scratch& w) {
  const Tile head = MakeTile(p, g, b, hk, 0);
  PrefetchRows(p, g, head, 0, std::min(kPrefetchRows, head.seq.seqlen_k));
  PackRows(p, g, head, 0, 0, head.seq.seqlen_k, w.head_k, w.head_v, g.head_keys * kPanelCols, w);
  const int64_t nq = QueryBlocks(g, head.seq);
  for (int64_t q = 0; q < nq; ++q) RunTile(p, g, MakeTile(p, g, b, hk, q), 0, w, nullptr);
}

}  // namespace HWY_NAMESPACE
}  // namespace ioattn::cpu
HWY_AFTER_NAMESPACE();

#endif  // IOATTN_CPU_PREFILL_INL_H_
