// Flash attention at the CPU's innermost boundary (L1d-L2), by walking the CPU kernel's own loop
// nest (cpu/flash_kernel.cc, RunTileBlocks / RunPanel / AccumulatePv) for one unit. Each tile runs
// its key blocks; each block runs panels of 48 query rows; a panel scores S^T = K Q^T in chunks of
// `vecs` row vectors (the K block streams past each chunk), runs the softmax over its S^T
// (block_kv x 48 floats), rescales its O rows and accumulates P V one V column chunk
// (panel_cols wide) at a time, with `rows`-row groups of P^T passing over the chunk. Every reuse
// below is decided by the footprint between two uses against the L1 capacity (an LRU cache keeps
// a cyclically reused set exactly when it fits); P V's, where most of the reuse is, key by key
// (PvWalk). The counts are lines filled, as cachegrind counts.
#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "common/int_math.h"
#include "common/masking.h"
#include "common/traffic_cpu.h"

namespace ioattn::traffic_detail {
namespace {

struct PvGroup {
  int64_t a, e;    // keys all the group's rows see, relative to the block
  int64_t l0, l1;  // the S^T lines (within a key's row) its floats lie in
  int64_t rows;
};

struct PvFills {
  double first = 0, later = 0;  // lines filled in the first column chunk, and in each later one
};

// |[a0, a1) U [b0, b1)|, taking the hull when the two overlap or touch.
double union_len(int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
  const int64_t na = std::max<int64_t>(0, a1 - a0), nb = std::max<int64_t>(0, b1 - b0);
  if (na == 0 || nb == 0) return double(na + nb);
  return double(na + nb - std::max<int64_t>(0, std::min(a1, b1) - std::max(a0, b0)));
}

// The hull [k0, k1) of the keys groups [from, to) walk, and their rows added to rows0.
struct GroupRun {
  int64_t k0 = 0, k1 = 0;
  double rows = 0;
};

GroupRun group_run(const std::vector<PvGroup>& fg, size_t from, size_t to, double rows0) {
  GroupRun r;
  r.rows = rows0;
  for (size_t b = from; b < to; ++b) {
    r.k0 = b == from ? fg[b].a : std::min(r.k0, fg[b].a);
    r.k1 = b == from ? fg[b].e : std::max(r.k1, fg[b].e);
    r.rows += double(fg[b].rows);
  }
  return r;
}

// P V's fills of V and S^T lines in one panel-step. Each use is decided by its LRU stack distance:
// in a fully associative LRU cache of `cap` lines a use hits exactly when fewer than `cap` distinct
// lines were touched since the line's previous use, so a footprint that overflows the capacity
// loses only the uses whose own window overflows, not the whole panel. The passes run column chunk
// by column chunk and, within a chunk, group by group (AccumulatePv): a pass loads its rows' O
// lines, walks its keys [a, e) touching per key `vl` lines of the V chunk and the S^T lines
// [l0, l1], and stores the O lines. Each distance below counts the lines the passes between two
// uses touch: exact for panels whose groups all see the same keys, the hull of the groups' key
// ranges where a mask makes them differ. With the level's ways given, the window is judged set by
// set instead (SetOccupancy: the V chunk, S^T and O lines spread over the sets): an 8-way L1 keeps
// a window of a little over 512 lines wherever no set gets a ninth, which the fully associative
// rule loses whole (S=256, D=64 and D=128 at a 256-key block: one group's V chunk and S^T lines
// are 256 + 256 lines, the whole L1). Left out: O lines that the rescale touched and P V's earlier
// chunks evicted are filled twice, which depends on which rows' max grew (1-4% of the L1 traffic
// in the line-level simulation, bench/traffic/l1_sim.py, which rescales every row).
class PvWalk {
 public:
  // nk: keys of the block (the softmax walks all of them); st_row: S^T lines per key (mp floats);
  // st_chunk: S^T lines one column chunk's passes touch; o_panel: lines of the panel's O rows (the
  // rescale between the softmax and P V walks them all, as on a tile's first block where every
  // row's max grows from -inf); vl: lines per key of a V column chunk (and per row of an O chunk).
  PvWalk(const std::vector<PvGroup>& fg, double nk, double st_row, double st_chunk, double o_panel, double vl,
         SetOccupancy& l1)
      : fg_(fg), nk_(nk), st_row_(st_row), st_chunk_(st_chunk), o_panel_(o_panel), vl_(vl), l1_(l1) {}

  PvFills run() {
    PvFills f;
    for (size_t i = 0; i < fg_.size(); ++i) group(i, &f);
    return f;
  }

 private:
  // The keys [k0, k1) group i shares with the group before it, and how many of their uses hit.
  struct Near {
    int64_t k0, k1;
    double hits;
  };

  // A use with these lines touched since the previous one (its own kind counted without the line
  // itself, then with it): V, S^T and O lines; own 0 for a V line, 1 for an S^T line.
  double hit(double v, double st, double o, size_t own) {
    std::vector<double> lines = {v, st, o};
    lines[own] += 1;
    for (double& x : lines) x *= kLine;
    return l1_.hit(lines, own, 0);
  }

  // Keys the previous group also walked: their V lines (and the S^T lines the two groups share)
  // were last used one pass ago. Between the two uses at key j: p's keys after j and g's keys
  // before j (their V lines and each group's S^T lines) and both groups' O lines.
  Near near(size_t i) {
    const PvGroup& g = fg_[i];
    const PvGroup* p = i > 0 ? &fg_[i - 1] : nullptr;
    const int64_t k0 = p ? std::max(g.a, p->a) : g.a, k1 = p ? std::max(k0, std::min(g.e, p->e)) : g.a;
    const double lg = double(g.l1 - g.l0 + 1), lp = p ? double(p->l1 - p->l0 + 1) : 0.0;
    double near_hits = 0;
    for (int64_t j = k0; j < k1; ++j) {
      near_hits += hit(vl_ * double(p->e - 1 - g.a), lp * double(p->e - 1 - j) + lg * double(j - g.a),
                       vl_ * double(p->rows + g.rows), 0);
    }
    return {k0, k1, near_hits};
  }

  void group(size_t i, PvFills* f) {
    const PvGroup& g = fg_[i];
    // Hull of the keys the groups before g walk in this chunk, and their rows.
    const GroupRun before = group_run(fg_, 0, i, 0);
    const Near nr = near(i);
    // V: every key the previous group did not walk is new to this chunk.
    const double v_miss = vl_ * (double(g.e - g.a) - nr.hits);
    f->first += v_miss;
    f->later += v_miss;
    for (int64_t l = g.l0; l <= g.l1; ++l) line(i, l, nr, before, f);
  }

  // The last group from i on covering S^T line l.
  size_t last_cover(size_t i, int64_t l) const {
    size_t q = i;
    for (size_t b = i; b < fg_.size(); ++b)
      if (l >= fg_[b].l0 && l <= fg_[b].l1) q = b;
    return q;
  }

  // The lower S^T lines P V walks before group i: each over the keys of the groups before i that
  // cover it.
  double lower_lines(size_t i, int64_t l) const {
    double lower = 0;
    for (int64_t m = 0; m < l; ++m) {
      int64_t c0 = 0, c1 = 0;
      bool any = false;
      for (size_t b = 0; b < i; ++b) {
        if (m < fg_[b].l0 || m > fg_[b].l1) continue;
        c0 = any ? std::min(c0, fg_[b].a) : fg_[b].a;
        c1 = any ? std::max(c1, fg_[b].e) : fg_[b].e;
        any = true;
      }
      lower += any ? double(c1 - c0) : 0.0;
    }
    return lower;
  }

  // Group i's fills of S^T line l, key by key.
  void line(size_t i, int64_t l, const Near& nr, const GroupRun& before, PvFills* f) {
    const PvGroup& g = fg_[i];
    const PvGroup* p = i > 0 ? &fg_[i - 1] : nullptr;
    const size_t n = fg_.size();
    const bool shared = p && l >= p->l0 && l <= p->l1;
    if (shared) {
      f->first += double(nr.k1 - nr.k0) - nr.hits;
      f->later += double(nr.k1 - nr.k0) - nr.hits;
    }
    // The other keys' line l was last used in the previous chunk by the last group covering it
    // (q), or, in the first chunk, by the softmax's second pass, which walks S^T one row vector
    // (half a line) at a time over all nk keys.
    const size_t q = last_cover(i, l);
    const GroupRun after = group_run(fg_, q + 1, n, double(fg_[q].rows));
    // First chunk: after line l's use at key j the softmax walks all keys of the lines after l
    // and line l's keys after j, the rescale walks o_panel, and P V walks line l's keys before j
    // ((nk - 1 - j) + (j - a) lines of l), the lower lines over the keys of the groups before g
    // that cover them, and the V keys before j.
    const double st_first = std::max(0.0, st_row_ - 1 - double(l)) * nk_ + (nk_ - 1 - double(g.a)) + lower_lines(i, l);
    for (int64_t j = g.a; j < g.e; ++j) {
      if (shared && j >= nr.k0 && j < nr.k1) continue;
      const double v_cur = i > 0 ? union_len(before.k0, before.k1, g.a, j) : double(j - g.a);
      const double v_prev =
          q + 1 < n ? union_len(after.k0, after.k1, j + 1, fg_[q].e) : double(std::max<int64_t>(0, fg_[q].e - 1 - j));
      f->first += 1.0 - hit(vl_ * v_cur, st_first, o_panel_, 1);
      // Later chunks: between the use by q in the previous chunk and this one, every group's S^T
      // lines once (st_chunk), the previous chunk's V keys after j (all of them if a group after
      // q walks them), this chunk's V keys before j (likewise for the groups before g), and the
      // O lines of the passes from q to the end of the previous chunk and up to g in this one.
      f->later +=
          1.0 - hit(vl_ * (v_prev + v_cur), st_chunk_ - 1, vl_ * (after.rows + before.rows + double(g.rows)), 1);
    }
  }

  const std::vector<PvGroup>& fg_;
  double nk_, st_row_, st_chunk_, o_panel_, vl_;
  SetOccupancy& l1_;
};

// The groups of `rows` P^T rows of a panel: a group runs the register tile over the keys all its
// rows see, [a, e); the keys only some rows see go row by row (each such key: one V row).
struct PvGroups {
  std::vector<PvGroup> fast;  // the groups that run the register tile, in order
  bool uniform = true;        // every group runs it over the same keys
  double row_keys = 0;        // keys that go row by row, summed over the rows
};

PvGroups pv_groups(const CpuKernelShape& ks, double nk, const std::vector<int64_t>& lo,
                   const std::vector<int64_t>& hi) {
  const int64_t pr = int64_t(lo.size());
  const int64_t groups = ceil_div(pr, ks.pv_rows);
  PvGroups out;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t r0 = g * ks.pv_rows, r1 = std::min(pr, r0 + ks.pv_rows);
    int64_t ga = 0, ge = int64_t(nk);
    bool empty = false;
    for (int64_t r = r0; r < r1; ++r) {
      empty |= lo[size_t(r)] >= hi[size_t(r)];
      ga = std::max(ga, lo[size_t(r)]);
      ge = std::min(ge, hi[size_t(r)]);
    }
    const bool fast = !empty && ga < ge;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = std::max<int64_t>(0, hi[size_t(r)] - lo[size_t(r)]);
      out.row_keys += fast ? double(n - (ge - ga)) : double(n);
    }
    out.uniform &= fast && (out.fast.empty() || (ga == out.fast.front().a && ge == out.fast.front().e));
    // The S^T lines of a key's row ([key][mp], rows starting on lines) the group's floats lie in.
    if (fast) out.fast.push_back({ga, ge, (r0 * 4) / int64_t(kLine), (r1 * 4 - 1) / int64_t(kLine), r1 - r0});
  }
  return out;
}

// S^T lines one column chunk reads: per key, the lines from the first to the last group that
// sees it.
double st_chunk_lines(const PvGroups& pg, int64_t pr) {
  const std::vector<PvGroup>& fg = pg.fast;
  int64_t span0 = fg.front().a, span1 = fg.front().e;
  for (const PvGroup& g : fg) {
    span0 = std::min(span0, g.a);
    span1 = std::max(span1, g.e);
  }
  double st_lines = pg.uniform ? double(span1 - span0) * double((pr * 4 - 1) / int64_t(kLine) + 1) : 0.0;
  for (int64_t j = span0; j < span1 && !pg.uniform; ++j) {
    int64_t l0 = -1, l1 = -1;
    for (const PvGroup& g : fg) {
      if (g.a <= j && j < g.e) {
        if (l0 < 0) l0 = g.l0;
        l1 = g.l1;
      }
    }
    if (l0 >= 0) st_lines += double(l1 - l0 + 1);
  }
  return st_lines;
}

// Bytes one panel-step (one panel of a tile against one key block of nk keys starting at j0)
// moves across L1d-L2. lo/hi: each panel row's visible keys, relative to j0.
double cpu_flash_panel_l1(const CpuKernelShape& ks, double l1, int ways, double dp, double dvp, double nk,
                          const std::vector<int64_t>& lo, const std::vector<int64_t>& hi) {
  const int64_t pr = int64_t(lo.size());
  const double mp = double(round_up(pr, ks.lanes));
  const double kblk = nk * dp * 4, st = nk * mp * 4;
  // 1. Scores: the K block (nk x D floats) streams past every chunk of `vecs` row vectors unless
  // it stays in L1 next to the chunk's Q^T and one line per key of S^T; each chunk's Q^T is read
  // once; S^T's lines are written (filled) once: the previous panel's K stream evicted them.
  const double chunks = std::ceil(mp / double(ks.lanes) / double(ks.score_vecs));
  const double q_chunk = double(ks.score_vecs * ks.lanes) * dp * 4;
  double bytes = (kblk + q_chunk + nk * kLine <= l1 ? kblk : chunks * kblk) + mp * dp * 4 + st;
  // 2. Softmax: two passes over S^T. The score pass's K stream left S^T outside L1 (unless K and
  // S^T fit together); the second pass finds it in L1 only if all of S^T fits.
  bytes += kblk + st <= l1 ? 0.0 : (st <= l1 ? st : 2 * st);
  // 3. O rows: read once (by the rescale where the max grew, else by the P V tile's load).
  bytes += double(pr) * dvp * 4;
  // 4. P V, group by group (pv_groups): the row-by-row keys read one V row of Dv floats each.
  const PvGroups pg = pv_groups(ks, nk, lo, hi);
  const double cc = std::ceil(dvp / double(ks.panel_cols));
  const double chunk_row = double(ks.panel_cols) * 4;  // one key of a V column chunk
  bytes += pg.row_keys * dvp * 4;
  if (pg.fast.empty()) return bytes;
  const double st_lines = st_chunk_lines(pg, pr);
  SetOccupancy sets(std::floor(l1 / kLine) * kLine, ways, kLine, 0, 0, 0);
  const PvFills f =
      PvWalk(pg.fast, nk, mp * 4 / kLine, st_lines, double(pr) * dvp * 4 / kLine, chunk_row / kLine, sets).run();
  bytes += (f.first + (cc - 1) * f.later) * kLine;
  return bytes;
}

// One unit's (a (sequence, kv head)'s) L1d-L2 bytes of the packed kernel. Per tile (and key
// split): Q read and packed as Q^T, O zeroed, then written out (or as a split partial that the
// merge reads back); per key block in tile mode (or once per unit in head mode): K/V read and
// packed to f32. Then every panel-step (cpu_flash_panel_l1).
class UnitL1Walk {
 public:
  UnitL1Walk(const Problem& pr, const Plan& plan, const CpuKernelShape& ks, double l1, int ways, bool head_mode)
      : pr_(pr), ks_(ks), l1_(l1), ways_(ways), head_mode_(head_mode) {
    group_ = pr.heads_kv > 0 ? std::max<int64_t>(1, pr.heads_q / pr.heads_kv) : 1;
    positions_ = std::max<int64_t>(1, plan.block_q / group_);
    bkv_ = std::max(1, plan.block_kv);
    splits_ = std::max(1, plan.kv_splits);
    right_ = effective_window_right(pr.causal, pr.window_right);
    union_begin_ = pr.seqlen_k;
    eb_ = dtype_bytes(pr.dtype);
    const double kb = dtype_bytes(pr.kv_dtype);
    dp_ = plan.head_dim_padded > 0 ? plan.head_dim_padded : double(round_up(pr.head_dim, ks.lanes));
    dvp_ = double(round_up(pr.head_dim_v, ks.lanes));
    const double dvq = double(round_up(pr.head_dim_v, ks.panel_cols));
    kv_src_ = double(pr.head_dim + pr.head_dim_v) * kb;
    kv_packed_ = (dp_ + dvq) * 4;
  }

  UnitL1 run() {
    for (int64_t p0 = 0; p0 < pr_.seqlen_q; p0 += positions_) tile(p0);
    if (head_mode_ && union_end_ > union_begin_)
      u_.packing += double(union_end_ - union_begin_) * (kv_src_ + kv_packed_);
    return u_;
  }

 private:
  void tile(int64_t p0) {
    const int64_t npos = std::min(positions_, pr_.seqlen_q - p0), rows = npos * group_;
    const TileKeys tk = tile_keys(pr_, p0, rows, group_, right_);
    const int64_t u0 = tk.u0, u1 = tk.u1;
    const double mp = double(round_up(rows, ks_.lanes));
    const double tile_in = double(rows) * double(pr_.head_dim) * eb_ + mp * dp_ * 4 + mp * dvp_ * 4;
    const double tile_out = double(rows) * (dvp_ * 4 + double(pr_.head_dim_v) * eb_);
    if (u1 <= u0) {
      u_.tiles += tile_in + tile_out;
      return;
    }
    union_begin_ = std::min(union_begin_, u0);
    union_end_ = std::max(union_end_, u1);
    const int64_t nb = ceil_div(u1 - u0, bkv_);
    // A split writes its (O, m, l) partial and the merge reads it back.
    u_.tiles += double(splits_) * tile_in + tile_out +
                (splits_ > 1 ? 2.0 * double(splits_) * double(rows) * (dvp_ + 2) * 4 : 0.0);
    for (int64_t k = 0; k < nb; ++k) {
      const int64_t j0 = std::max(u0, u1 - (nb - k) * bkv_), j1 = u1 - (nb - 1 - k) * bkv_;
      const double nk = double(j1 - j0);
      if (!head_mode_) u_.packing += nk * (kv_src_ + kv_packed_);
      for (int64_t r0 = 0; r0 < rows; r0 += kCpuPanelRows) panel(tk, r0, std::min(rows, r0 + kCpuPanelRows), j0, j1);
    }
  }

  void panel(const TileKeys& tk, int64_t r0, int64_t r1, int64_t j0, int64_t j1) {
    std::vector<int64_t> lo(static_cast<size_t>(r1 - r0)), hi(static_cast<size_t>(r1 - r0));
    bool any = false;
    for (int64_t r = r0; r < r1; ++r) {
      lo[size_t(r - r0)] = std::clamp<int64_t>(tk.begin[size_t(r)] - j0, 0, j1 - j0);
      hi[size_t(r - r0)] = std::clamp<int64_t>(tk.end[size_t(r)] - j0, lo[size_t(r - r0)], j1 - j0);
      any |= lo[size_t(r - r0)] < hi[size_t(r - r0)];
    }
    if (!any) return;
    // Panels with the same keys and masks cost the same (every unmasked panel of a block
    // length): evaluate each shape once.
    std::vector<int64_t> key(lo);
    key.insert(key.end(), hi.begin(), hi.end());
    key.push_back(j1 - j0);
    auto it = seen_.find(key);
    if (it == seen_.end())
      it = seen_.emplace(std::move(key), cpu_flash_panel_l1(ks_, l1_, ways_, dp_, dvp_, double(j1 - j0), lo, hi)).first;
    u_.steps += it->second;
  }

  const Problem& pr_;
  const CpuKernelShape& ks_;
  double l1_;
  int ways_;
  bool head_mode_;
  int64_t group_, positions_, bkv_, splits_, right_;
  double eb_, dp_, dvp_, kv_src_, kv_packed_;
  UnitL1 u_;
  std::map<std::vector<int64_t>, double> seen_;  // panel shape -> bytes
  int64_t union_begin_ = 0, union_end_ = 0;
};

}  // namespace

TileKeys tile_keys(const Problem& pr, int64_t p0, int64_t rows, int64_t group, int64_t right) {
  TileKeys t{std::vector<int64_t>(static_cast<size_t>(rows)), std::vector<int64_t>(static_cast<size_t>(rows)),
             pr.seqlen_k, 0};
  for (int64_t r = 0; r < rows; ++r) {
    const KeyRange k = visible_keys(p0 + r / group, pr.seqlen_q, pr.seqlen_k, pr.window_left, right);
    t.begin[size_t(r)] = k.begin;
    t.end[size_t(r)] = k.end;
    if (k.end > k.begin) {
      t.u0 = std::min(t.u0, k.begin);
      t.u1 = std::max(t.u1, k.end);
    }
  }
  return t;
}

UnitL1 cpu_flash_unit_l1(const Problem& pr, const Plan& plan, const CpuKernelShape& ks, double l1, int ways,
                         bool head_mode) {
  return UnitL1Walk(pr, plan, ks, l1, ways, head_mode).run();
}

}  // namespace ioattn::traffic_detail
