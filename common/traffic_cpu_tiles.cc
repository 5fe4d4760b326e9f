// Past L1: what a level (one worker's share of it) loses inside a tile, where the L1 rules
// (traffic_cpu_l1.cc) count every use. Per key block, each panel reads the block's K rows (the
// score pass reads all of them), writes its S^T and reads the V keys its rows see; per tile, each
// block reads every panel's Q^T and O rows. The reuses, with the lines touched between them (the
// windows):
//  (a) a K row and an S^T line from one visible panel of a block to the next: the K block, the
//      S^T, the previous panel's V keys and O rows and one chunk of Q^T rows (the first score
//      chunk); a V line likewise, with this panel's Q^T and O rows instead of the chunk;
//  (b) a panel's Q^T and O rows from the last block the panel saw to the next (or from the tile's
//      packing of Q^T, which reads the tile's Q rows, and zeroing of O): the tile's whole Q^T and
//      O, the S^T, and the K and V keys of the blocks walked in between (the earlier block's
//      from the next panel on, the later block's up to this panel).
// Head mode reads K/V from the per-head copy, whose first read per block the copy's residency rule
// counts. Tile mode packs each block into one of two buffers, the next block a slice per panel
// while this one computes (RunTileBlocks); that adds, per tile and split:
//  (c) the packing's writes, which fill the buffer lines the block before last read (the windows
//      of (a) and (b) then also hold the slices being packed: the caller's rows and the buffer);
//  (d) the first read of each packed slice, by the block's first visible panel: in between, the
//      panels after the slice's of the block before, and the later slices' packing;
//  (e) the tile's buffers again at its start (Q^T packed, O zeroed, the first two blocks packed)
//      where the tile before evicted them: returned apart (tile_refill), the first tile of a unit
//      being cold on a worker that starts with it.
// And in both modes (f): the O rows read for the output after the panel's last block (the rest of
// that block and the blocks after it, and the rows written out before, in between).
// A use whose window overflows its set is filled again (SetOccupancy). In tile mode V is taken as
// contiguous (its panels are block_kv x chunk bytes apart: aliasing needs block_kv near a
// multiple of the way size over the chunk bytes, 1024 keys at 64 B per chunk on zen3's L2).
#include <algorithm>
#include <cmath>

#include "common/int_math.h"
#include "common/masking.h"
#include "common/traffic_cpu.h"

namespace ioattn::traffic_detail {
namespace {

struct PanelUse {
  bool visible = false;
  int64_t v0 = 0, v1 = 0;  // the V keys its rows see, relative to the block
};

// One tile's key blocks (aligned to the end of its visible keys) and what each panel sees of them.
struct TileBlocks {
  int64_t rows = 0, nb = 0, panels = 0, lanes = 0;
  double mp = 0, qt_tile = 0, o_tile = 0, q_src = 0, out_rows = 0;
  std::vector<int64_t> keys;               // [block]: its keys
  std::vector<std::vector<PanelUse>> use;  // [block][panel]

  double panel_rows(int64_t i) const { return double(std::min(rows, (i + 1) * kCpuPanelRows) - i * kCpuPanelRows); }
  double panel_mp(int64_t i) const {
    return double(round_up(std::min(rows, (i + 1) * kCpuPanelRows) - i * kCpuPanelRows, lanes));
  }
  bool any_visible(int64_t k, int64_t from, int64_t to) const {
    for (int64_t i = from; i < to; ++i)
      if (use[size_t(k)][size_t(i)].visible) return true;
    return false;
  }
};

// Tile mode's pipeline: during block b (of a split ending at kb1) the next block is packed a
// slice of ceil(keys / panels) keys before each panel after the first, the last slice after them.
struct Pipeline {
  const TileBlocks& t;
  int64_t kb0, kb1;
  bool head_mode;

  double during(int64_t b) const { return !head_mode && b + 1 < kb1 ? double(t.keys[size_t(b + 1)]) : 0.0; }
  double before(int64_t b, int64_t i) const {
    const double n = during(b);
    return std::min(n, double(i) * std::ceil(n / double(t.panels)));
  }
};

// What a tile leaves for the next one's start: its last block's keys, its O and output rows,
// its S^T.
struct TileEnd {
  double last_keys = 0, o = 0, out = 0, st = 0;
};
// What a tile's start refills: its Q^T and O, the caller's Q rows it reads, and (tile mode) the
// keys of the first two blocks it packs.
struct TileStart {
  double qt = 0, o = 0, q_src = 0, firsts = 0;
};

// Keys whose K rows and V lines were walked between two uses, and the longest block among them.
struct Walked {
  double between = 0, st_keys = 0;
  void add(double keys) {
    between += keys;
    st_keys = std::max(st_keys, keys);
  }
};

class TileRefillWalk {
 public:
  TileRefillWalk(const Problem& pr, const Plan& plan, const CpuKernelShape& ks, SetOccupancy& sets, bool head_mode)
      : pr_(pr), ks_(ks), sets_(sets), head_mode_(head_mode) {
    group_ = pr.heads_kv > 0 ? std::max<int64_t>(1, pr.heads_q / pr.heads_kv) : 1;
    positions_ = std::max<int64_t>(1, plan.block_q / group_);
    bkv_ = std::max(1, plan.block_kv);
    splits_ = head_mode ? 1 : std::max(1, plan.kv_splits);
    right_ = effective_window_right(pr.causal, pr.window_right);
    dp_ = plan.head_dim_padded > 0 ? plan.head_dim_padded : double(round_up(pr.head_dim, ks.lanes));
    dvp_ = double(round_up(pr.head_dim_v, ks.lanes));
    const double dvq = double(round_up(pr.head_dim_v, ks.panel_cols));
    k_key_ = double(pr.head_dim) * 4;
    v_key_ = dvq * 4;
    src_key_ = double(pr.head_dim + pr.head_dim_v) * dtype_bytes(pr.kv_dtype);
    q_chunk_ = double(ks.score_vecs * ks.lanes) * dp_ * 4;
    union0_ = pr.seqlen_k;
  }

  TileRefills run() {
    for (int64_t p0 = 0; p0 < pr_.seqlen_q; p0 += positions_) tile(p0);
    // A unit's first tile follows the last tile of the unit before (its shape: this unit's last
    // tile's) and, in head mode, the packing of this unit's copy (the caller's rows read, the copy
    // written).
    if (!first_) {
      const double copy = head_mode_ ? double(union1_ - union0_) * (src_key_ + k_key_ + v_key_) : 0.0;
      out_.first_tile = refill(first_start_, prev_end_, {copy});
    }
    return out_;
  }

 private:
  double v_copy(double v_keys) const { return head_mode_ ? v_keys : 0.0; }

  // V keys in a window: the copy's (head mode), or a contiguous buffer appended to w (tile mode).
  std::vector<double> with_v(std::vector<double> w, double v_keys) const {
    if (!head_mode_) w.push_back(v_keys * v_key_);
    return w;
  }

  // K/V walked in a window: the copy's K rows (head mode), or both block buffers and the caller's
  // rows packed into them (tile mode).
  void push_kv(std::vector<double>* w, double walked, double packed) const {
    if (head_mode_) {
      w->push_back(walked * k_key_);
    } else {
      w->push_back(std::min(2.0 * double(bkv_), walked + packed) * (k_key_ + v_key_));
      w->push_back(packed * src_key_);
    }
  }

  // Q^T: the rest of the tile before's last block (its K and V, S^T), its output (O and the
  // caller's rows), and half this tile's Q rows (those read before the row's). O: the output,
  // this tile's Q rows and Q^T. S^T: likewise. The buffers: both, as the tile before's last two
  // blocks read them, with the rest of it and the first block's rows. `before`: what else came
  // in between.
  double refill(const TileStart& t, const TileEnd& e, const std::vector<double>& before) {
    std::vector<double> qw = {t.qt, e.o, e.out, t.q_src / 2, e.st, e.last_keys * k_key_};
    std::vector<double> ow = {t.o, e.out, t.q_src, t.qt};
    std::vector<double> sw = {e.st, e.o, e.out, t.q_src, t.qt};
    for (auto* w : {&qw, &ow, &sw}) w->insert(w->end(), before.begin(), before.end());
    if (!head_mode_) qw.push_back(e.last_keys * v_key_);
    double r = t.qt * (1 - sets_.hit(qw, 0, v_copy(e.last_keys))) + t.o * (1 - sets_.hit(ow, 0, 0)) +
               e.st * (1 - sets_.hit(sw, 0, 0));
    if (!head_mode_) {
      const double bufs = std::min(2.0 * double(bkv_), std::max(t.firsts, 2 * e.last_keys));
      std::vector<double> bw = {bufs * k_key_, bufs * v_key_, t.qt, e.o, e.out, t.q_src, e.st, t.firsts * src_key_ / 2};
      bw.insert(bw.end(), before.begin(), before.end());
      r += t.firsts * (k_key_ * (1 - sets_.hit(bw, 0, 0)) + v_key_ * (1 - sets_.hit(bw, 1, 0)));
    }
    return r;
  }

  // The tile at query position p0: false where none of its rows sees a key.
  bool tile_blocks(int64_t p0, TileBlocks* t) {
    t->rows = std::min(positions_, pr_.seqlen_q - p0) * group_;
    t->lanes = ks_.lanes;
    t->mp = double(round_up(t->rows, ks_.lanes));
    const TileKeys tk = tile_keys(pr_, p0, t->rows, group_, right_);
    const int64_t u0 = tk.u0, u1 = tk.u1;
    if (u1 <= u0) return false;
    union0_ = std::min(union0_, u0);
    union1_ = std::max(union1_, u1);
    t->nb = ceil_div(u1 - u0, bkv_);
    t->panels = ceil_div(t->rows, kCpuPanelRows);
    t->qt_tile = t->mp * dp_ * 4;
    t->o_tile = t->mp * dvp_ * 4;
    t->q_src = double(t->rows) * double(pr_.head_dim) * dtype_bytes(pr_.dtype);
    t->out_rows = double(t->rows) * double(pr_.head_dim_v) * dtype_bytes(pr_.dtype);
    t->use.assign(static_cast<size_t>(t->nb), std::vector<PanelUse>(static_cast<size_t>(t->panels)));
    t->keys.assign(static_cast<size_t>(t->nb), 0);
    for (int64_t k = 0; k < t->nb; ++k) {
      const int64_t j0 = std::max(u0, u1 - (t->nb - k) * bkv_), j1 = u1 - (t->nb - 1 - k) * bkv_;
      t->keys[size_t(k)] = j1 - j0;
      for (int64_t i = 0; i < t->panels; ++i) {
        PanelUse& u = t->use[size_t(k)][size_t(i)];
        u.v0 = j1 - j0;
        for (int64_t r = i * kCpuPanelRows; r < std::min(t->rows, (i + 1) * kCpuPanelRows); ++r) {
          const int64_t lo = std::clamp<int64_t>(tk.begin[size_t(r)] - j0, 0, j1 - j0);
          const int64_t hi = std::clamp<int64_t>(tk.end[size_t(r)] - j0, lo, j1 - j0);
          if (lo >= hi) continue;
          u.visible = true;
          u.v0 = std::min(u.v0, lo);
          u.v1 = std::max(u.v1, hi);
        }
      }
    }
    return true;
  }

  void tile(int64_t p0) {
    TileBlocks t;
    if (!tile_blocks(p0, &t)) return;
    for (int64_t split = 0; split < splits_; ++split) {
      const int64_t kb0 = split * t.nb / splits_, kb1 = (split + 1) * t.nb / splits_;
      if (kb0 >= kb1) continue;
      run_split(t, Pipeline{t, kb0, kb1, head_mode_});
    }
  }

  void run_split(const TileBlocks& t, const Pipeline& s) {
    double inside = 0;
    for (int64_t k = s.kb0; k < s.kb1; ++k) block(t, s, k, &inside);
    double st_keys = 0;
    for (int64_t k = s.kb0; k < s.kb1; ++k) st_keys = std::max(st_keys, double(t.keys[size_t(k)]));
    for (int64_t i = 0; i < t.panels; ++i) output_read(t, s, st_keys, i, &inside);
    tile_start(t, s, st_keys);
    out_.inside += inside;
    first_ = false;
  }

  void block(const TileBlocks& t, const Pipeline& s, int64_t k, double* inside) {
    // Tile mode: the slice of the next block packed before each panel after the first.
    const double slice = std::ceil(s.during(k) / double(t.panels));
    const double slice_bytes = slice * (src_key_ + k_key_ + v_key_);
    // (a) From one visible panel of the block to the next.
    int64_t prev = -1;
    for (int64_t i = 0; i < t.panels; ++i) {
      if (!t.use[size_t(k)][size_t(i)].visible) continue;
      if (prev >= 0) *inside += panel_to_panel(t, k, prev, i, slice_bytes);
      prev = i;
    }
    // (b) Each visible panel's Q^T and O rows since their previous use.
    for (int64_t i = 0; i < t.panels; ++i)
      if (t.use[size_t(k)][size_t(i)].visible) *inside += panel_since(t, s, k, i);
    if (head_mode_ || k == s.kb0) return;
    // (c) and (d): block k's slices, packed during block k - 1 (slice s before its panel s + 1).
    const double sl = std::ceil(double(t.keys[size_t(k)]) / double(t.panels));
    for (int64_t sidx = 0; sidx < t.panels && double(sidx) * sl < double(t.keys[size_t(k)]); ++sidx)
      packed_slice(t, s.kb0, k, sidx, inside);
  }

  // (a) Panel i's K, S^T and V reuse after panel prev of block k.
  double panel_to_panel(const TileBlocks& t, int64_t k, int64_t prev, int64_t i, double slice_bytes) {
    const double nk = double(t.keys[size_t(k)]);
    const PanelUse& u = t.use[size_t(k)][size_t(i)];
    const PanelUse& q = t.use[size_t(k)][size_t(prev)];
    const double hull = double(std::max(u.v1, q.v1) - std::min(u.v0, q.v0));
    const double st = nk * std::max(t.panel_mp(i), t.panel_mp(prev)) * 4, o_prev = t.panel_rows(prev) * dvp_ * 4;
    const std::vector<double> kw = with_v({nk * k_key_, st, o_prev, q_chunk_, slice_bytes}, double(q.v1 - q.v0));
    std::vector<double> vw = {nk * k_key_, st, o_prev, t.panel_mp(i) * dp_ * 4, t.panel_rows(i) * dvp_ * 4,
                              slice_bytes};
    vw = with_v(vw, hull);
    return nk * k_key_ * (1 - sets_.hit(kw, 0, v_copy(double(q.v1 - q.v0)))) +
           nk * t.panel_mp(i) * 4 * (1 - sets_.hit(kw, 1, v_copy(double(q.v1 - q.v0)))) +
           double(u.v1 - u.v0) * v_key_ *
               (1 - sets_.hit(vw, head_mode_ ? SetOccupancy::kVCopy : vw.size() - 1, v_copy(hull)));
  }

  // (b) Panel i's Q^T and O rows at block k since the last block before it that the panel saw.
  double panel_since(const TileBlocks& t, const Pipeline& s, int64_t k, int64_t i) {
    int64_t last = -1;
    for (int64_t b = k - 1; b >= s.kb0 && last < 0; --b)
      if (t.use[size_t(b)][size_t(i)].visible) last = b;
    Walked walked;
    if (last >= 0 && t.any_visible(last, i + 1, t.panels)) walked.add(double(t.keys[size_t(last)]));
    for (int64_t b = last + 1; b < k; ++b)
      if (t.any_visible(b, 0, t.panels)) walked.add(double(t.keys[size_t(b)]));
    if (t.any_visible(k, 0, i)) walked.add(double(t.keys[size_t(k)]));
    // Tile mode: the keys packed meanwhile (the caller's rows read, the other buffer written).
    double packed = last < 0 ? double(t.keys[size_t(s.kb0)]) : s.during(last) - s.before(last, i);
    for (int64_t b = last + 1; b < k; ++b) packed += s.during(b);
    packed += s.before(k, i);
    std::vector<double> w = {t.qt_tile, t.o_tile};
    if (walked.between > 0) w.push_back(walked.st_keys * double(kCpuPanelRows) * 4);
    if (last < 0) w.push_back(t.q_src);
    push_kv(&w, walked.between, packed);
    return t.panel_mp(i) * dp_ * 4 * (1 - sets_.hit(w, 0, v_copy(walked.between))) +
           t.panel_rows(i) * dvp_ * 4 * (1 - sets_.hit(w, 1, v_copy(walked.between)));
  }

  // (c) and (d) for slice sidx of block k.
  void packed_slice(const TileBlocks& t, int64_t kb0, int64_t k, int64_t sidx, double* inside) {
    const double nk = double(t.keys[size_t(k)]);
    const double nkp = double(t.keys[size_t(k - 1)]), sl = std::ceil(nk / double(t.panels));
    const double in_slice = std::min(sl, nk - double(sidx) * sl);
    const double later = std::max(0.0, nk - double(sidx + 1) * sl), done = double(sidx) * sl;
    double qo_after = 0, qo_before = 0;
    for (int64_t i = 0; i < t.panels; ++i) {
      if (!t.use[size_t(k - 1)][size_t(i)].visible) continue;
      (i > sidx ? qo_after : qo_before) += t.panel_mp(i) * dp_ * 4 + t.panel_rows(i) * dvp_ * 4;
    }
    const double st = nkp * double(kCpuPanelRows) * 4;
    // (d) From the write to block k's first read: the rest of block k - 1 and the later slices.
    const bool rest = t.any_visible(k - 1, sidx + 1, t.panels);
    std::vector<double> rw = {nk * k_key_, nk * v_key_, qo_after, later * src_key_};
    if (rest) {
      rw.push_back(nkp * (k_key_ + v_key_));
      rw.push_back(st);
    }
    *inside += in_slice * (k_key_ * (1 - sets_.hit(rw, 0, 0)) + v_key_ * (1 - sets_.hit(rw, 1, 0)));
    // (c) From block k - 2's reads of these buffer lines to the write: block k - 1 up to the
    // slice and the slices before it. Blocks kb0 and kb0 + 1 are the tile's (e).
    if (k >= kb0 + 2) {
      const std::vector<double> ww = {nk * k_key_, nk * v_key_,    qo_before, nkp * (k_key_ + v_key_),
                                      st,          done * src_key_};
      *inside += in_slice * (k_key_ * (1 - sets_.hit(ww, 0, 0)) + v_key_ * (1 - sets_.hit(ww, 1, 0)));
    }
  }

  // (f) Panel i's O rows read for the output (or the split's partial), since the panel's last
  // block: the rest of that block and the blocks after it, and the rows written out before.
  void output_read(const TileBlocks& t, const Pipeline& s, double st_keys, int64_t i, double* inside) {
    int64_t lb = -1;
    for (int64_t k = s.kb1 - 1; k >= s.kb0 && lb < 0; --k)
      if (t.use[size_t(k)][size_t(i)].visible) lb = k;
    if (lb < 0) return;
    double qt_after = 0, kv_after = 0, packed = s.during(lb) - s.before(lb, i + 1);
    for (int64_t k = lb; k < s.kb1; ++k) {
      const int64_t from = k == lb ? i + 1 : 0;
      for (int64_t j = from; j < t.panels; ++j)
        if (t.use[size_t(k)][size_t(j)].visible) qt_after += t.panel_mp(j) * dp_ * 4;
      if (t.any_visible(k, from, t.panels)) kv_after += double(t.keys[size_t(k)]);
      if (k > lb) packed += s.during(k);
    }
    const double before = double(i * kCpuPanelRows) * double(pr_.head_dim_v) * dtype_bytes(pr_.dtype);
    std::vector<double> w = {t.o_tile, qt_after, before, kv_after > 0 ? st_keys * double(kCpuPanelRows) * 4 : 0.0};
    push_kv(&w, kv_after, packed);
    *inside += t.panel_rows(i) * dvp_ * 4 * (1 - sets_.hit(w, 0, v_copy(kv_after)));
  }

  // (e) The tile's buffers at its start, against the tile before (TileEnd): its O rows were
  // just read for the output and its S^T and Q^T used in its last block. Tile mode also packs
  // its first two blocks into the buffers the tile before read last.
  void tile_start(const TileBlocks& t, const Pipeline& s, double st_keys) {
    const TileEnd here{double(t.keys[size_t(s.kb1 - 1)]), t.o_tile, t.out_rows, st_keys * double(kCpuPanelRows) * 4};
    double firsts = 0;  // tile mode: keys of the first two blocks, packed at the start
    for (int64_t k = s.kb0; k < std::min(s.kb1, s.kb0 + 2); ++k) firsts += double(t.keys[size_t(k)]);
    const TileStart start{t.qt_tile, t.o_tile, t.q_src, firsts};
    if (first_)
      first_start_ = start;
    else
      out_.tile_refill += refill(start, prev_end_, {});
    prev_end_ = here;
    if (head_mode_) return;
    // What a worker's first tile touches for the first time: the buffers of its blocks (block
    // kb0 + 2n in the first, kb0 + 2n + 1 in the second) and S^T as far as its longest block.
    double buf[2] = {0, 0};
    for (int64_t k = s.kb0; k < s.kb1; ++k)
      buf[(k - s.kb0) % 2] = std::max(buf[(k - s.kb0) % 2], double(t.keys[size_t(k)]));
    out_.touched =
        std::max(out_.touched, t.qt_tile + t.o_tile + here.st + (buf[0] + buf[1]) * (k_key_ + v_key_) + 8 * t.mp);
  }

  const Problem& pr_;
  const CpuKernelShape& ks_;
  SetOccupancy& sets_;
  bool head_mode_;
  int64_t group_, positions_, bkv_, splits_, right_;
  double dp_, dvp_, k_key_, v_key_, src_key_, q_chunk_;
  TileRefills out_;
  bool first_ = true;
  TileEnd prev_end_;
  TileStart first_start_;
  int64_t union0_ = 0, union1_ = 0;
};

}  // namespace

TileRefills cpu_tile_refills(const Problem& pr, const Plan& plan, const CpuKernelShape& ks, SetOccupancy& sets,
                             bool head_mode) {
  return TileRefillWalk(pr, plan, ks, sets, head_mode).run();
}

}  // namespace ioattn::traffic_detail
