#include "common/traffic.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "common/cpu_tiles.h"
#include "common/gpu_tiles.h"
#include "common/int_math.h"
#include "common/masking.h"

namespace ioattn {
namespace {

// How the query blocks of one unit (a K/V stream: one kv head on the CPU, one q head on the
// GPU) walk the key axis. As the CPU kernel packs GQA, a tile holds max(1, block_q / G) query
// positions times the G heads of the kv head. The CPU kernel cuts a tile's visible key range
// into blocks aligned to its end (so it reads exactly the visible keys); the CUDA kernel, like
// FlashAttention-2, aligns key blocks to multiples of block_kv.
struct UnitWalk {
  int64_t q_blocks = 0;       // blocks with at least one visible key
  int64_t steps = 0;          // (query block, key block) pairs visited
  int64_t kv_rows_sum = 0;    // key rows loaded, summed over the query blocks
  int64_t kv_rows_union = 0;  // distinct key rows any block loads
};

UnitWalk walk_unit(const Problem& pr, int64_t group, int64_t bq, int64_t bkv, bool align_to_end) {
  UnitWalk w;
  const int64_t right = effective_window_right(pr.causal, pr.window_right);
  const int64_t positions = std::max<int64_t>(1, bq / std::max<int64_t>(group, 1));
  int64_t union_begin = pr.seqlen_k, union_end = 0;
  for (int64_t p0 = 0; p0 < pr.seqlen_q; p0 += positions) {
    const int64_t p1 = std::min(pr.seqlen_q, p0 + positions) - 1;
    // The band's ends are monotone in the query position, so the block's keys run from the
    // first position's begin to the last position's end.
    const int64_t begin = visible_keys(p0, pr.seqlen_q, pr.seqlen_k, pr.window_left, right).begin;
    const int64_t end = visible_keys(p1, pr.seqlen_q, pr.seqlen_k, pr.window_left, right).end;
    if (end <= begin) continue;
    int64_t first = begin, last = end, blocks = ceil_div(end - begin, bkv);
    if (!align_to_end) {
      first = begin / bkv * bkv;
      last = std::min(pr.seqlen_k, ceil_div(end, bkv) * bkv);
      blocks = ceil_div(end, bkv) - begin / bkv;
    }
    ++w.q_blocks;
    w.steps += blocks;
    w.kv_rows_sum += last - first;
    union_begin = std::min(union_begin, first);
    union_end = std::max(union_end, last);
  }
  w.kv_rows_union = std::max<int64_t>(0, union_end - union_begin);
  return w;
}

struct Sizes {
  double q, o, lse;  // compulsory bytes of the whole problem
  double kv_row;     // bytes of one key row plus one value row, storage dtype
  double s_fp32;     // one fp32 score matrix for all heads
  double s_head;     // one fp32 score matrix of one (batch, q head)
};

Sizes sizes_of(const Problem& pr) {
  Sizes s;
  const double bh = double(pr.batch) * double(pr.heads_q);
  s.q = bh * double(pr.seqlen_q) * double(pr.head_dim) * dtype_bytes(pr.dtype);
  s.o = bh * double(pr.seqlen_q) * double(pr.head_dim_v) * dtype_bytes(pr.dtype);
  s.lse = pr.with_lse ? bh * double(pr.seqlen_q) * 4.0 : 0.0;
  s.kv_row = double(pr.head_dim + pr.head_dim_v) * dtype_bytes(pr.kv_dtype);
  s.s_head = double(pr.seqlen_q) * double(pr.seqlen_k) * 4.0;
  s.s_fp32 = bh * s.s_head;
  return s;
}

void set(BoundaryTraffic* b, double fr, double fw, double sr, double sw) {
  b->flash_read_bytes = fr;
  b->flash_write_bytes = fw;
  b->standard_read_bytes = sr;
  b->standard_write_bytes = sw;
  b->flash_bytes = fr + fw;
  b->standard_bytes = sr + sw;
}

// Capacity a level offers to data that all cores read (see MemoryLevel::partitions).
double shared_capacity(const MemoryLevel& l) { return double(l.size_bytes) / std::max(1, l.partitions); }

// Whether a use hits in a set-associative LRU level, set by set. A use of a line hits when fewer
// than `ways` other lines of its set were touched since its previous use; the lines touched in
// between (the window) are a few buffers. A contiguous buffer of B bytes puts B / way_bytes lines
// into every set (way_bytes = capacity / ways): the floor of that or one more, and which sets get
// one more depends on where the buffer starts, which is not known relative to the other buffers,
// so that is taken as independent per buffer. Where a footprint just exceeds a level this keeps
// what set-by-set LRU keeps (a buffer of 7.5 lines per set in an 8-way level: every set, since
// none gets 9), unlike random placement. The V copy is the exception: a key block's V lines are
// cc column chunks head_keys x chunk_row bytes apart (cpu/flash_kernel.cc, PackRows), so their
// sets are known: chunks whose offsets agree modulo the way size stack in the same sets (1024
// keys at 64 B per key per chunk is exactly one way of a 512 KiB 8-way L2), counted line by line.
class SetOccupancy {
 public:
  // capacity: bytes of the level (a worker's share); ways = 0: fully associative.
  SetOccupancy(double capacity, int ways, double line, double v_stride, double v_key_bytes, int64_t v_chunks)
      : cap_(capacity), ways_(ways), line_(line), v_stride_(v_stride), v_key_bytes_(v_key_bytes), v_chunks_(v_chunks) {
    sets_ = ways > 0 ? std::max<int64_t>(1, int64_t(capacity / (double(ways) * line))) : 1;
    way_bytes_ = double(sets_) * line;
  }

  // Where own indexes `buffers`: the V copy's lines in the window, if any.
  static constexpr size_t kVCopy = size_t(-1);

  // Fraction of the lines of buffers[own] (own = kVCopy: of the V copy's v_keys keys) whose next
  // use hits, with the window's other contiguous buffers and v_keys keys of the V copy touched
  // since the previous use.
  double hit(const std::vector<double>& buffers, size_t own, double v_keys) {
    if (own != kVCopy && buffers[own] <= 0) return 1.0;
    if (ways_ <= 0) return fits(buffers, v_keys);
    // The same windows recur for every tile and block of a shape: remember them.
    std::vector<double> key = buffers;
    key.push_back(double(own));
    key.push_back(v_keys);
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    const double h = compute(buffers, own, v_keys);
    memo_.emplace(std::move(key), h);
    return h;
  }

 private:
  double compute(const std::vector<double>& buffers, size_t own, double v_keys) {
    const Hist& v = v_hist(v_keys);
    // Exact where no set can overflow (at most ways lines in every set: every use hits) or every
    // set does.
    double most = 0, least = 0;
    for (double b : buffers) {
      most += std::ceil(b / way_bytes_);
      least += std::floor(b / way_bytes_);
    }
    size_t kmax = 0;
    for (size_t k = 0; k < v.sets.size(); ++k)
      if (v.sets[k] > 0) kmax = k;
    if (most + double(kmax) <= double(ways_)) return 1.0;
    if (least > double(ways_)) return 0.0;
    double hit = 0;
    if (own == kVCopy) {
      const std::vector<double> u = load(buffers);
      for (size_t k = 1; k < v.lines.size(); ++k) hit += v.lines[k] * at_most(u, ways_ - int(k));
      return hit;
    }
    const double x = buffers[own] / way_bytes_, f = std::floor(x), phi = x - f;
    std::vector<double> others = buffers;
    others.erase(others.begin() + std::ptrdiff_t(own));
    const std::vector<double> u = load(others);
    // The buffer's own lines in the set of a random one of its lines (size-biased: f + 1 with
    // probability (f + 1) phi / x, f otherwise).
    for (int m = int(f); m <= int(f) + 1; ++m) {
      const double pm = (m == int(f) ? f * (1 - phi) : (f + 1) * phi) / x;
      for (size_t k = 0; k < v.sets.size(); ++k) hit += pm * v.sets[k] * at_most(u, ways_ - m - int(k));
    }
    return hit;
  }

  struct Hist {
    std::vector<double> sets;   // [k]: fraction of the sets holding k V lines (the last entry: more than ways)
    std::vector<double> lines;  // [k]: fraction of the V lines lying in such sets
  };

  double fits(const std::vector<double>& buffers, double v_keys) const {
    double bytes = v_keys * v_key_bytes_ * double(v_chunks_);
    for (double b : buffers) bytes += b;
    return bytes <= cap_ ? 1.0 : 0.0;
  }

  // Distribution of the lines per set of independent contiguous buffers, truncated: entry
  // ways + 1 stands for more than ways.
  std::vector<double> load(const std::vector<double>& buffers) const {
    std::vector<double> d(size_t(ways_) + 2, 0.0);
    d[0] = 1;
    for (double b : buffers) {
      const double x = b / way_bytes_, f = std::floor(x), phi = x - f;
      std::vector<double> n(d.size(), 0.0);
      for (size_t i = 0; i < d.size(); ++i) {
        n[std::min(d.size() - 1, i + size_t(f))] += d[i] * (1 - phi);
        n[std::min(d.size() - 1, i + size_t(f) + 1)] += d[i] * phi;
      }
      d = n;
    }
    return d;
  }

  static double at_most(const std::vector<double>& d, int n) {
    double p = 0;
    for (int i = 0; i <= n && i < int(d.size()); ++i) p += d[size_t(i)];
    return p;
  }

  // V lines per set for a run of `keys` consecutive keys: chunk c starts c * stride bytes after
  // chunk 0 and holds keys * v_key_bytes; where the run starts only rotates the sets.
  const Hist& v_hist(double keys) {
    const int64_t nkeys = int64_t(keys);
    auto it = hist_.find(nkeys);
    if (it != hist_.end()) return it->second;
    Hist h;
    h.sets.assign(size_t(ways_) + 2, 0.0);
    h.lines.assign(size_t(ways_) + 2, 0.0);
    const int64_t len = int64_t(std::ceil(double(nkeys) * v_key_bytes_ / line_));
    if (len <= 0 || v_chunks_ <= 0) {
      h.sets[0] = 1;
      return hist_.emplace(nkeys, h).first->second;
    }
    std::vector<int64_t> add(size_t(sets_) + 1, 0);
    int64_t base = 0;
    for (int64_t c = 0; c < v_chunks_; ++c) {
      const int64_t start = int64_t(std::fmod(double(c) * v_stride_ / line_, double(sets_)));
      base += len / sets_;
      const int64_t rem = len % sets_, end = start + rem;
      add[size_t(start)] += 1;
      add[size_t(std::min(end, sets_))] -= 1;
      if (end > sets_) {
        add[0] += 1;
        add[size_t(end - sets_)] -= 1;
      }
    }
    int64_t run = 0;
    const double total = double(len * v_chunks_);
    for (int64_t s = 0; s < sets_; ++s) {
      run += add[size_t(s)];
      const int64_t k = base + run;
      const size_t at = size_t(std::min<int64_t>(k, ways_ + 1));
      h.sets[at] += 1.0 / double(sets_);
      h.lines[at] += double(k) / total;
    }
    return hist_.emplace(nkeys, h).first->second;
  }

  double cap_;
  int ways_;
  double line_, v_stride_, v_key_bytes_;
  int64_t v_chunks_;
  int64_t sets_ = 1;
  double way_bytes_ = 0;
  std::map<int64_t, Hist> hist_;
  std::map<std::vector<double>, double> memo_;
};

// ---- CPU ----------------------------------------------------------------------------------
// Flash attention at the innermost boundary (L1d-L2), by walking the CPU kernel's own loop nest
// (cpu/flash_kernel.cc, RunTileBlocks / RunPanel / AccumulatePv) for one unit. Each tile runs its
// key blocks; each block runs panels of 48 query rows; a panel scores S^T = K Q^T in chunks of
// `vecs` row vectors (the K block streams past each chunk), runs the softmax over its S^T
// (block_kv x 48 floats), rescales its O rows and accumulates P V one V column chunk
// (panel_cols wide) at a time, with `rows`-row groups of P^T passing over the chunk. Every reuse
// below is decided by the footprint between two uses against the L1 capacity (an LRU cache keeps
// a cyclically reused set exactly when it fits); P V's, where most of the reuse is, key by key
// (pv_fills). The counts are lines filled, as cachegrind counts.
// The constants mirror the kernel's: kCpuPanelRows is its kPanelRows; the register tile is
// common/cpu_tiles.h's, which the kernel and the planner share.
constexpr int64_t kCpuPanelRows = 48;
constexpr double kLine = 64;

double round_up_d(double a, double m) { return std::ceil(a / m) * m; }

struct CpuKernelShape {
  int64_t lanes, score_vecs, pv_rows, panel_cols;
};

// The score kernel's row vectors per chunk; the P V kernel's rows and V panel width (its own tile
// since 964956b: 6 x 4 vectors on AVX-512, 64 columns; 6 x 2 on AVX2).
CpuKernelShape cpu_kernel_shape(const HardwareProfile& hw) {
  const int64_t lanes = std::max(4, hw.simd_bits / 32);
  const CpuRegisterTile t = cpu_register_tile(hw.simd_bits), pv = cpu_pv_register_tile(hw.simd_bits);
  return {lanes, t.vecs, pv.rows, pv.vecs * lanes};
}

// P V's fills of V and S^T lines in one panel-step. Each use is decided by its LRU stack distance:
// in a fully associative LRU cache of `cap` lines a use hits exactly when fewer than `cap` distinct
// lines were touched since the line's previous use, so a footprint that overflows the capacity
// loses only the uses whose own window overflows, not the whole panel. The passes run column chunk
// by column chunk and, within a chunk, group by group (AccumulatePv): a pass loads its rows' O
// lines, walks its keys [a, e) touching per key `vl` lines of the V chunk and the S^T lines
// [l0, l1], and stores the O lines. Each distance below counts the lines the passes between two
// uses touch: exact for panels whose groups all see the same keys, the hull of the groups' key
// ranges where a mask makes them differ. Against a line-level LRU simulation of this loop nest
// (bench/traffic/l1_sim.py, fully associative) at the 18 f32 one-head cachegrind shapes of the
// 2026-12-02 plans, the V and S^T fills agree within 5% (12% at S=256, D=128 causal). With the
// level's ways given, the window is judged set by set instead (SetOccupancy: the V chunk, S^T and
// O lines spread over the sets): an 8-way L1 keeps a window of a little over 512 lines wherever
// no set gets a ninth, which the fully associative rule loses whole (S=256, D=64 and D=128 at a
// 256-key block: one group's V chunk and S^T lines are 256 + 256 lines, the whole L1; the
// simulation's 8-way run fills 28% fewer V and S^T lines there). Left out: O lines that the
// rescale touched and P V's earlier chunks evicted are filled twice, which depends on which rows'
// max grew (1-4% of the L1 traffic in the simulation, which rescales every row).
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

// nk: keys of the block (the softmax walks all of them); st_row: S^T lines per key (mp floats);
// st_chunk: S^T lines one column chunk's passes touch; o_panel: lines of the panel's O rows (the
// rescale between the softmax and P V walks them all, as on a tile's first block where every row's
// max grows from -inf); vl: lines per key of a V column chunk (and per row of an O chunk).
PvFills pv_fills(const std::vector<PvGroup>& fg, double nk, double st_row, double st_chunk, double o_panel, double vl,
                 SetOccupancy& l1) {
  PvFills f;
  // A use with these lines touched since the previous one (its own kind counted without the line
  // itself, then with it): V, S^T and O lines; own 0 for a V line, 1 for an S^T line.
  auto hit = [&](double v, double st, double o, size_t own) {
    std::vector<double> lines = {v, st, o};
    lines[own] += 1;
    for (double& x : lines) x *= kLine;
    return l1.hit(lines, own, 0);
  };
  const size_t n = fg.size();
  for (size_t i = 0; i < n; ++i) {
    const PvGroup& g = fg[i];
    const PvGroup* p = i > 0 ? &fg[i - 1] : nullptr;
    // Hull of the keys the groups before g walk in this chunk, and their rows.
    int64_t before0 = 0, before1 = 0;
    double rows_before = 0;
    for (size_t b = 0; b < i; ++b) {
      before0 = b == 0 ? fg[b].a : std::min(before0, fg[b].a);
      before1 = b == 0 ? fg[b].e : std::max(before1, fg[b].e);
      rows_before += double(fg[b].rows);
    }
    // Keys the previous group also walked: their V lines (and the S^T lines the two groups share)
    // were last used one pass ago. Between the two uses at key j: p's keys after j and g's keys
    // before j (their V lines and each group's S^T lines) and both groups' O lines.
    const int64_t k0 = p ? std::max(g.a, p->a) : g.a, k1 = p ? std::max(k0, std::min(g.e, p->e)) : g.a;
    const double lg = double(g.l1 - g.l0 + 1), lp = p ? double(p->l1 - p->l0 + 1) : 0.0;
    double near_hits = 0;
    for (int64_t j = k0; j < k1; ++j) {
      near_hits += hit(vl * double(p->e - 1 - g.a), lp * double(p->e - 1 - j) + lg * double(j - g.a),
                       vl * double(p->rows + g.rows), 0);
    }
    // V: every key the previous group did not walk is new to this chunk.
    const double v_miss = vl * (double(g.e - g.a) - near_hits);
    f.first += v_miss;
    f.later += v_miss;
    for (int64_t l = g.l0; l <= g.l1; ++l) {
      const bool shared = p && l >= p->l0 && l <= p->l1;
      if (shared) {
        f.first += double(k1 - k0) - near_hits;
        f.later += double(k1 - k0) - near_hits;
      }
      // The other keys' line l was last used in the previous chunk by the last group covering it
      // (q), or, in the first chunk, by the softmax's second pass, which walks S^T one row vector
      // (half a line) at a time over all nk keys.
      size_t q = i;
      for (size_t b = i; b < n; ++b)
        if (l >= fg[b].l0 && l <= fg[b].l1) q = b;
      int64_t after0 = 0, after1 = 0;
      double rows_after = double(fg[q].rows);
      for (size_t b = q + 1; b < n; ++b) {
        after0 = b == q + 1 ? fg[b].a : std::min(after0, fg[b].a);
        after1 = b == q + 1 ? fg[b].e : std::max(after1, fg[b].e);
        rows_after += double(fg[b].rows);
      }
      // First chunk: after line l's use at key j the softmax walks all keys of the lines after l
      // and line l's keys after j, the rescale walks o_panel, and P V walks line l's keys before j
      // ((nk - 1 - j) + (j - a) lines of l), the lower lines over the keys of the groups before g
      // that cover them, and the V keys before j.
      double lower = 0;
      for (int64_t m = 0; m < l; ++m) {
        int64_t c0 = 0, c1 = 0;
        bool any = false;
        for (size_t b = 0; b < i; ++b) {
          if (m < fg[b].l0 || m > fg[b].l1) continue;
          c0 = any ? std::min(c0, fg[b].a) : fg[b].a;
          c1 = any ? std::max(c1, fg[b].e) : fg[b].e;
          any = true;
        }
        lower += any ? double(c1 - c0) : 0.0;
      }
      const double st_first = std::max(0.0, st_row - 1 - double(l)) * nk + (nk - 1 - double(g.a)) + lower;
      for (int64_t j = g.a; j < g.e; ++j) {
        if (shared && j >= k0 && j < k1) continue;
        const double v_cur = i > 0 ? union_len(before0, before1, g.a, j) : double(j - g.a);
        const double v_prev =
            q + 1 < n ? union_len(after0, after1, j + 1, fg[q].e) : double(std::max<int64_t>(0, fg[q].e - 1 - j));
        f.first += 1.0 - hit(vl * v_cur, st_first, o_panel, 1);
        // Later chunks: between the use by q in the previous chunk and this one, every group's S^T
        // lines once (st_chunk), the previous chunk's V keys after j (all of them if a group after
        // q walks them), this chunk's V keys before j (likewise for the groups before g), and the
        // O lines of the passes from q to the end of the previous chunk and up to g in this one.
        f.later += 1.0 - hit(vl * (v_prev + v_cur), st_chunk - 1, vl * (rows_after + rows_before + double(g.rows)), 1);
      }
    }
  }
  return f;
}

// Bytes one panel-step (one panel of a tile against one key block of nk keys starting at j0)
// moves across L1d-L2. lo/hi: each panel row's visible keys, relative to j0.
double cpu_flash_panel_l1(const CpuKernelShape& ks, double l1, int ways, double dp, double dvp, double nk,
                          const std::vector<int64_t>& lo, const std::vector<int64_t>& hi) {
  const int64_t pr = int64_t(lo.size());
  const double mp = round_up_d(double(pr), double(ks.lanes));
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
  // 4. P V. A group of `rows` P^T rows runs the register tile over the keys all its rows see,
  // [a, e); the keys only some rows see go row by row (each such key: one V row of Dv floats).
  const int64_t groups = (pr + ks.pv_rows - 1) / ks.pv_rows;
  std::vector<PvGroup> fg;  // the groups that run the register tile, in order
  bool uniform = true;      // every group runs it over the same keys
  double row_keys = 0;
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
      row_keys += fast ? double(n - (ge - ga)) : double(n);
    }
    uniform &= fast && (fg.empty() || (ga == fg.front().a && ge == fg.front().e));
    // The S^T lines of a key's row ([key][mp], rows starting on lines) the group's floats lie in.
    if (fast) fg.push_back({ga, ge, (r0 * 4) / int64_t(kLine), (r1 * 4 - 1) / int64_t(kLine), r1 - r0});
  }
  const double cc = std::ceil(dvp / double(ks.panel_cols));
  const double chunk_row = double(ks.panel_cols) * 4;  // one key of a V column chunk
  bytes += row_keys * dvp * 4;
  if (fg.empty()) return bytes;
  int64_t span0 = fg.front().a, span1 = fg.front().e;
  for (const PvGroup& g : fg) {
    span0 = std::min(span0, g.a);
    span1 = std::max(span1, g.e);
  }
  // S^T lines one column chunk reads: per key, the lines from the first to the last group
  // that sees it.
  double st_lines = uniform ? double(span1 - span0) * double((pr * 4 - 1) / int64_t(kLine) + 1) : 0.0;
  for (int64_t j = span0; j < span1 && !uniform; ++j) {
    int64_t l0 = -1, l1 = -1;
    for (const PvGroup& g : fg) {
      if (g.a <= j && j < g.e) {
        if (l0 < 0) l0 = g.l0;
        l1 = g.l1;
      }
    }
    if (l0 >= 0) st_lines += double(l1 - l0 + 1);
  }
  SetOccupancy sets(std::floor(l1 / kLine) * kLine, ways, kLine, 0, 0, 0);
  const PvFills f = pv_fills(fg, nk, mp * 4 / kLine, st_lines, double(pr) * dvp * 4 / kLine, chunk_row / kLine, sets);
  bytes += (f.first + (cc - 1) * f.later) * kLine;
  return bytes;
}

struct UnitL1 {
  double tiles = 0, packing = 0, steps = 0;  // per tile (and split), K/V packing, panel-steps
  double total() const { return tiles + packing + steps; }
};

// The visible key range of each of a tile's rows (query position p0 + r / group) and their
// union [u0, u1) over the rows that see any key (u1 <= u0 when none does).
struct TileKeys {
  std::vector<int64_t> begin, end;
  int64_t u0, u1;
};
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

// One unit's (a (sequence, kv head)'s) L1d-L2 bytes of the packed kernel. Per tile (and key
// split): Q read and packed as Q^T, O zeroed, then written out (or as a split partial that the
// merge reads back); per key block in tile mode (or once per unit in head mode): K/V read and
// packed to f32. Then every panel-step above.
UnitL1 cpu_flash_unit_l1(const Problem& pr, const Plan& plan, const CpuKernelShape& ks, double l1, int ways,
                         bool head_mode) {
  const int64_t group = pr.heads_kv > 0 ? std::max<int64_t>(1, pr.heads_q / pr.heads_kv) : 1;
  const int64_t positions = std::max<int64_t>(1, plan.block_q / group);
  const int64_t bkv = std::max(1, plan.block_kv);
  const int64_t splits = std::max(1, plan.kv_splits);
  const int64_t right = effective_window_right(pr.causal, pr.window_right);
  const double eb = dtype_bytes(pr.dtype), kb = dtype_bytes(pr.kv_dtype);
  const double dp = plan.head_dim_padded > 0 ? plan.head_dim_padded : round_up_d(double(pr.head_dim), double(ks.lanes));
  const double dvp = round_up_d(double(pr.head_dim_v), double(ks.lanes));
  const double dvq = round_up_d(double(pr.head_dim_v), double(ks.panel_cols));
  const double kv_src = double(pr.head_dim + pr.head_dim_v) * kb, kv_packed = (dp + dvq) * 4;
  UnitL1 u;
  std::map<std::vector<int64_t>, double> seen;  // panel shape -> bytes
  int64_t union_begin = pr.seqlen_k, union_end = 0;
  for (int64_t p0 = 0; p0 < pr.seqlen_q; p0 += positions) {
    const int64_t npos = std::min(positions, pr.seqlen_q - p0), rows = npos * group;
    const TileKeys tk = tile_keys(pr, p0, rows, group, right);
    const std::vector<int64_t>&vb = tk.begin, &ve = tk.end;
    const int64_t u0 = tk.u0, u1 = tk.u1;
    const double mp = round_up_d(double(rows), double(ks.lanes));
    const double tile_in = double(rows) * double(pr.head_dim) * eb + mp * dp * 4 + mp * dvp * 4;
    const double tile_out = double(rows) * (dvp * 4 + double(pr.head_dim_v) * eb);
    if (u1 <= u0) {
      u.tiles += tile_in + tile_out;
      continue;
    }
    union_begin = std::min(union_begin, u0);
    union_end = std::max(union_end, u1);
    const int64_t nb = (u1 - u0 + bkv - 1) / bkv;
    // A split writes its (O, m, l) partial and the merge reads it back.
    u.tiles +=
        double(splits) * tile_in + tile_out + (splits > 1 ? 2.0 * double(splits) * double(rows) * (dvp + 2) * 4 : 0.0);
    for (int64_t k = 0; k < nb; ++k) {
      const int64_t j0 = std::max(u0, u1 - (nb - k) * bkv), j1 = u1 - (nb - 1 - k) * bkv;
      const double nk = double(j1 - j0);
      if (!head_mode) u.packing += nk * (kv_src + kv_packed);
      for (int64_t r0 = 0; r0 < rows; r0 += kCpuPanelRows) {
        const int64_t r1 = std::min(rows, r0 + kCpuPanelRows);
        std::vector<int64_t> lo(static_cast<size_t>(r1 - r0)), hi(static_cast<size_t>(r1 - r0));
        bool any = false;
        for (int64_t r = r0; r < r1; ++r) {
          lo[size_t(r - r0)] = std::clamp<int64_t>(vb[size_t(r)] - j0, 0, j1 - j0);
          hi[size_t(r - r0)] = std::clamp<int64_t>(ve[size_t(r)] - j0, lo[size_t(r - r0)], j1 - j0);
          any |= lo[size_t(r - r0)] < hi[size_t(r - r0)];
        }
        if (!any) continue;
        // Panels with the same keys and masks cost the same (every unmasked panel of a block
        // length): evaluate each shape once.
        std::vector<int64_t> key(lo);
        key.insert(key.end(), hi.begin(), hi.end());
        key.push_back(j1 - j0);
        auto it = seen.find(key);
        if (it == seen.end()) it = seen.emplace(std::move(key), cpu_flash_panel_l1(ks, l1, ways, dp, dvp, nk, lo, hi)).first;
        u.steps += it->second;
      }
    }
  }
  if (head_mode && union_end > union_begin) u.packing += double(union_end - union_begin) * (kv_src + kv_packed);
  return u;
}

// Past L1: what a level (one worker's share of it) loses inside a tile, where the L1 rules above
// count every use. Per key block, each panel reads the block's K rows (the score pass reads all of
// them), writes its S^T and reads the V keys its rows see; per tile, each block reads every
// panel's Q^T and O rows. The reuses, with the lines touched between them (the windows):
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
struct TileRefills {
  double inside = 0;        // (a)-(d) and (f), summed over the unit's tiles
  double tile_refill = 0;   // (e) for the unit's tiles after its first
  double first_tile = 0;    // (e) for its first tile
  double touched = 0;       // tile mode: bytes of scratch a tile touches (the most over the unit's tiles)
};

TileRefills cpu_tile_refills(const Problem& pr, const Plan& plan, const CpuKernelShape& ks, SetOccupancy& sets,
                             bool head_mode) {
  const int64_t group = pr.heads_kv > 0 ? std::max<int64_t>(1, pr.heads_q / pr.heads_kv) : 1;
  const int64_t positions = std::max<int64_t>(1, plan.block_q / group);
  const int64_t bkv = std::max(1, plan.block_kv);
  const int64_t splits = head_mode ? 1 : std::max(1, plan.kv_splits);
  const int64_t right = effective_window_right(pr.causal, pr.window_right);
  const double dp = plan.head_dim_padded > 0 ? plan.head_dim_padded : round_up_d(double(pr.head_dim), double(ks.lanes));
  const double dvp = round_up_d(double(pr.head_dim_v), double(ks.lanes));
  const double dvq = round_up_d(double(pr.head_dim_v), double(ks.panel_cols));
  const double k_key = double(pr.head_dim) * 4, v_key = dvq * 4;
  const double src_key = double(pr.head_dim + pr.head_dim_v) * dtype_bytes(pr.kv_dtype);
  const double q_chunk = double(ks.score_vecs * ks.lanes) * dp * 4;
  const size_t kV = SetOccupancy::kVCopy;
  struct PanelUse {
    bool visible = false;
    int64_t v0 = 0, v1 = 0;  // the V keys its rows see, relative to the block
  };
  TileRefills out;
  bool first = true;
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
  TileEnd prev_end;
  TileStart first_start;
  int64_t union0 = pr.seqlen_k, union1 = 0;
  // Q^T: the rest of the tile before's last block (its K and V, S^T), its output (O and the
  // caller's rows), and half this tile's Q rows (those read before the row's). O: the output,
  // this tile's Q rows and Q^T. S^T: likewise. The buffers: both, as the tile before's last two
  // blocks read them, with the rest of it and the first block's rows. `before`: what else came
  // in between.
  auto v_copy = [&](double v_keys) { return head_mode ? v_keys : 0.0; };
  auto refill = [&](const TileStart& t, const TileEnd& e, const std::vector<double>& before) {
    std::vector<double> qw = {t.qt, e.o, e.out, t.q_src / 2, e.st, e.last_keys * k_key};
    std::vector<double> ow = {t.o, e.out, t.q_src, t.qt};
    std::vector<double> sw = {e.st, e.o, e.out, t.q_src, t.qt};
    for (auto* w : {&qw, &ow, &sw}) w->insert(w->end(), before.begin(), before.end());
    if (!head_mode) qw.push_back(e.last_keys * v_key);
    double r = t.qt * (1 - sets.hit(qw, 0, v_copy(e.last_keys))) + t.o * (1 - sets.hit(ow, 0, 0)) +
               e.st * (1 - sets.hit(sw, 0, 0));
    if (!head_mode) {
      const double bufs = std::min(2.0 * double(bkv), std::max(t.firsts, 2 * e.last_keys));
      std::vector<double> bw = {bufs * k_key, bufs * v_key, t.qt, e.o, e.out, t.q_src, e.st, t.firsts * src_key / 2};
      bw.insert(bw.end(), before.begin(), before.end());
      r += t.firsts * (k_key * (1 - sets.hit(bw, 0, 0)) + v_key * (1 - sets.hit(bw, 1, 0)));
    }
    return r;
  };
  for (int64_t p0 = 0; p0 < pr.seqlen_q; p0 += positions) {
    const int64_t rows = std::min(positions, pr.seqlen_q - p0) * group;
    const double mp = round_up_d(double(rows), double(ks.lanes));
    const TileKeys tk = tile_keys(pr, p0, rows, group, right);
    const std::vector<int64_t>&vb = tk.begin, &ve = tk.end;
    const int64_t u0 = tk.u0, u1 = tk.u1;
    if (u1 <= u0) continue;
    union0 = std::min(union0, u0);
    union1 = std::max(union1, u1);
    const int64_t nb = (u1 - u0 + bkv - 1) / bkv, panels = (rows + kCpuPanelRows - 1) / kCpuPanelRows;
    const double qt_tile = mp * dp * 4, o_tile = mp * dvp * 4;
    const double q_src = double(rows) * double(pr.head_dim) * dtype_bytes(pr.dtype);
    const double out_rows = double(rows) * double(pr.head_dim_v) * dtype_bytes(pr.dtype);
    std::vector<std::vector<PanelUse>> use(static_cast<size_t>(nb), std::vector<PanelUse>(static_cast<size_t>(panels)));
    std::vector<int64_t> keys(static_cast<size_t>(nb));
    for (int64_t k = 0; k < nb; ++k) {
      const int64_t j0 = std::max(u0, u1 - (nb - k) * bkv), j1 = u1 - (nb - 1 - k) * bkv;
      keys[size_t(k)] = j1 - j0;
      for (int64_t i = 0; i < panels; ++i) {
        PanelUse& u = use[size_t(k)][size_t(i)];
        u.v0 = j1 - j0;
        for (int64_t r = i * kCpuPanelRows; r < std::min(rows, (i + 1) * kCpuPanelRows); ++r) {
          const int64_t lo = std::clamp<int64_t>(vb[size_t(r)] - j0, 0, j1 - j0);
          const int64_t hi = std::clamp<int64_t>(ve[size_t(r)] - j0, lo, j1 - j0);
          if (lo >= hi) continue;
          u.visible = true;
          u.v0 = std::min(u.v0, lo);
          u.v1 = std::max(u.v1, hi);
        }
      }
    }
    auto panel_rows = [&](int64_t i) { return double(std::min(rows, (i + 1) * kCpuPanelRows) - i * kCpuPanelRows); };
    auto panel_mp = [&](int64_t i) { return round_up_d(panel_rows(i), double(ks.lanes)); };
    auto any_visible = [&](int64_t k, int64_t from, int64_t to) {
      for (int64_t i = from; i < to; ++i)
        if (use[size_t(k)][size_t(i)].visible) return true;
      return false;
    };
    // Tile mode's pipeline: during block b (of a split ending at kb1) the next block is packed a
    // slice of ceil(keys / panels) keys before each panel after the first, the last slice after them.
    int64_t kb1 = 0;
    auto packed_during = [&](int64_t b) { return !head_mode && b + 1 < kb1 ? double(keys[size_t(b + 1)]) : 0.0; };
    auto packed_before = [&](int64_t b, int64_t i) {
      const double n = packed_during(b);
      return std::min(n, double(i) * std::ceil(n / double(panels)));
    };
    // V keys in a window: the copy's (head mode), or a contiguous buffer appended to w (tile mode).
    auto with_v = [&](std::vector<double> w, double v_keys) {
      if (!head_mode) w.push_back(v_keys * v_key);
      return w;
    };
    for (int64_t split = 0; split < splits; ++split) {
      const int64_t kb0 = split * nb / splits;
      kb1 = (split + 1) * nb / splits;
      if (kb0 >= kb1) continue;
      double inside = 0;
      for (int64_t k = kb0; k < kb1; ++k) {
        const double nk = double(keys[size_t(k)]);
        // Tile mode: the slice of the next block packed before each panel after the first.
        const double next = !head_mode && k + 1 < kb1 ? double(keys[size_t(k + 1)]) : 0.0;
        const double slice = std::ceil(next / double(panels));
        const double slice_bytes = slice * (src_key + k_key + v_key);
        // (a) From one visible panel of the block to the next.
        int64_t prev = -1;
        for (int64_t i = 0; i < panels; ++i) {
          const PanelUse& u = use[size_t(k)][size_t(i)];
          if (!u.visible) continue;
          if (prev >= 0) {
            const PanelUse& q = use[size_t(k)][size_t(prev)];
            const double hull = double(std::max(u.v1, q.v1) - std::min(u.v0, q.v0));
            const double st = nk * std::max(panel_mp(i), panel_mp(prev)) * 4, o_prev = panel_rows(prev) * dvp * 4;
            const std::vector<double> kw = with_v({nk * k_key, st, o_prev, q_chunk, slice_bytes}, double(q.v1 - q.v0));
            std::vector<double> vw = {nk * k_key, st, o_prev, panel_mp(i) * dp * 4, panel_rows(i) * dvp * 4, slice_bytes};
            vw = with_v(vw, hull);
            inside += nk * k_key * (1 - sets.hit(kw, 0, v_copy(double(q.v1 - q.v0)))) +
                      nk * panel_mp(i) * 4 * (1 - sets.hit(kw, 1, v_copy(double(q.v1 - q.v0)))) +
                      double(u.v1 - u.v0) * v_key * (1 - sets.hit(vw, head_mode ? kV : vw.size() - 1, v_copy(hull)));
          }
          prev = i;
        }
        // (b) Each visible panel's Q^T and O rows since their previous use.
        for (int64_t i = 0; i < panels; ++i) {
          if (!use[size_t(k)][size_t(i)].visible) continue;
          int64_t last = -1;
          for (int64_t b = k - 1; b >= kb0 && last < 0; --b)
            if (use[size_t(b)][size_t(i)].visible) last = b;
          double between = 0, st_keys = 0;  // keys whose K rows and V lines were walked in between; the longest block
          auto walked = [&](int64_t b) {
            between += double(keys[size_t(b)]);
            st_keys = std::max(st_keys, double(keys[size_t(b)]));
          };
          if (last >= 0 && any_visible(last, i + 1, panels)) walked(last);
          for (int64_t b = last + 1; b < k; ++b)
            if (any_visible(b, 0, panels)) walked(b);
          if (any_visible(k, 0, i)) walked(k);
          // Tile mode: the keys packed meanwhile (the caller's rows read, the other buffer written).
          double packed = last < 0 ? double(keys[size_t(kb0)]) : packed_during(last) - packed_before(last, i);
          for (int64_t b = last + 1; b < k; ++b) packed += packed_during(b);
          packed += packed_before(k, i);
          std::vector<double> w = {qt_tile, o_tile};
          if (between > 0) w.push_back(st_keys * double(kCpuPanelRows) * 4);
          if (last < 0) w.push_back(q_src);
          if (head_mode) {
            w.push_back(between * k_key);
          } else {
            w.push_back(std::min(2.0 * double(bkv), between + packed) * (k_key + v_key));
            w.push_back(packed * src_key);
          }
          inside += panel_mp(i) * dp * 4 * (1 - sets.hit(w, 0, v_copy(between))) +
                    panel_rows(i) * dvp * 4 * (1 - sets.hit(w, 1, v_copy(between)));
        }
        if (head_mode || k == kb0) continue;
        // (c) and (d): block k's slices, packed during block k - 1 (slice s before its panel s + 1).
        const double nkp = double(keys[size_t(k - 1)]), sl = std::ceil(nk / double(panels));
        for (int64_t sidx = 0; sidx < panels && double(sidx) * sl < nk; ++sidx) {
          const double in_slice = std::min(sl, nk - double(sidx) * sl);
          const double later = std::max(0.0, nk - double(sidx + 1) * sl), done = double(sidx) * sl;
          double qo_after = 0, qo_before = 0;
          for (int64_t i = 0; i < panels; ++i) {
            if (!use[size_t(k - 1)][size_t(i)].visible) continue;
            (i > sidx ? qo_after : qo_before) += panel_mp(i) * dp * 4 + panel_rows(i) * dvp * 4;
          }
          const double st = nkp * double(kCpuPanelRows) * 4;
          // (d) From the write to block k's first read: the rest of block k - 1 and the later slices.
          const bool rest = any_visible(k - 1, sidx + 1, panels);
          std::vector<double> rw = {nk * k_key, nk * v_key, qo_after, later * src_key};
          if (rest) {
            rw.push_back(nkp * (k_key + v_key));
            rw.push_back(st);
          }
          inside += in_slice * (k_key * (1 - sets.hit(rw, 0, 0)) + v_key * (1 - sets.hit(rw, 1, 0)));
          // (c) From block k - 2's reads of these buffer lines to the write: block k - 1 up to the
          // slice and the slices before it. Blocks kb0 and kb0 + 1 are the tile's (e).
          if (k >= kb0 + 2) {
            const std::vector<double> ww = {nk * k_key, nk * v_key, qo_before, nkp * (k_key + v_key), st, done * src_key};
            inside += in_slice * (k_key * (1 - sets.hit(ww, 0, 0)) + v_key * (1 - sets.hit(ww, 1, 0)));
          }
        }
      }
      // (f) The O rows read for the output (or the split's partial), since the panel's last block:
      // the rest of that block and the blocks after it, and the rows written out before.
      double st_keys = 0;
      for (int64_t k = kb0; k < kb1; ++k) st_keys = std::max(st_keys, double(keys[size_t(k)]));
      for (int64_t i = 0; i < panels; ++i) {
        int64_t lb = -1;
        for (int64_t k = kb1 - 1; k >= kb0 && lb < 0; --k)
          if (use[size_t(k)][size_t(i)].visible) lb = k;
        if (lb < 0) continue;
        double qt_after = 0, kv_after = 0, packed = packed_during(lb) - packed_before(lb, i + 1);
        for (int64_t k = lb; k < kb1; ++k) {
          const int64_t from = k == lb ? i + 1 : 0;
          for (int64_t j = from; j < panels; ++j)
            if (use[size_t(k)][size_t(j)].visible) qt_after += panel_mp(j) * dp * 4;
          if (any_visible(k, from, panels)) kv_after += double(keys[size_t(k)]);
          if (k > lb) packed += packed_during(k);
        }
        const double before = double(i * kCpuPanelRows) * double(pr.head_dim_v) * dtype_bytes(pr.dtype);
        std::vector<double> w = {o_tile, qt_after, before, kv_after > 0 ? st_keys * double(kCpuPanelRows) * 4 : 0.0};
        if (head_mode) {
          w.push_back(kv_after * k_key);
        } else {
          w.push_back(std::min(2.0 * double(bkv), kv_after + packed) * (k_key + v_key));
          w.push_back(packed * src_key);
        }
        inside += panel_rows(i) * dvp * 4 * (1 - sets.hit(w, 0, v_copy(kv_after)));
      }
      // (e) The tile's buffers at its start, against the tile before (TileEnd): its O rows were
      // just read for the output and its S^T and Q^T used in its last block. Tile mode also packs
      // its first two blocks into the buffers the tile before read last.
      const TileEnd here{double(keys[size_t(kb1 - 1)]), o_tile, out_rows, st_keys * double(kCpuPanelRows) * 4};
      double firsts = 0;  // tile mode: keys of the first two blocks, packed at the start
      for (int64_t k = kb0; k < std::min(kb1, kb0 + 2); ++k) firsts += double(keys[size_t(k)]);
      const TileStart start{qt_tile, o_tile, q_src, firsts};
      if (first)
        first_start = start;
      else
        out.tile_refill += refill(start, prev_end, {});
      prev_end = here;
      if (!head_mode) {
        // What a worker's first tile touches for the first time: the buffers of its blocks (block
        // kb0 + 2n in the first, kb0 + 2n + 1 in the second) and S^T as far as its longest block.
        double buf[2] = {0, 0};
        for (int64_t k = kb0; k < kb1; ++k) buf[(k - kb0) % 2] = std::max(buf[(k - kb0) % 2], double(keys[size_t(k)]));
        out.touched = std::max(out.touched, qt_tile + o_tile + here.st + (buf[0] + buf[1]) * (k_key + v_key) + 8 * mp);
      }
      out.inside += inside;
      first = false;
    }
  }
  // A unit's first tile follows the last tile of the unit before (its shape: this unit's last
  // tile's) and, in head mode, the packing of this unit's copy (the caller's rows read, the copy
  // written).
  if (!first) {
    const double copy = head_mode ? double(union1 - union0) * (src_key + k_key + v_key) : 0.0;
    out.first_tile = refill(first_start, prev_end, {copy});
  }
  return out;
}

// ---- OpenBLAS sgemm at L1d-L2 -------------------------------------------------------------
// GotoBLAS's loop nest (driver/level3/level3.c), column-major C (M x N) = A (M x K) B (K x N):
// K in blocks of up to q (a remainder between q and 2q is halved), M in blocks of up to p
// (likewise); per K block B is packed (read + written) in chunks that the kernel consumes at
// once, per M block A is packed; the kernel computes kernel_m x kernel_n tiles with the
// kernel_n-column B chunk held while the packed A block streams past it, so A crosses L1 once
// per chunk of kernel_n columns unless A and the chunk fit together. Where one A micro-panel
// and the B chunk do not fit in half of L1, the B chunk is read again for every micro-panel of
// rows after the first. Later M blocks re-read the packed B; every K block reads C.
struct GemmL1 {
  double reads = 0, writes = 0;
};

std::vector<int64_t> gemm_blocks(int64_t n, int64_t cap, int64_t unroll) {
  std::vector<int64_t> out;
  for (int64_t x = 0; x < n;) {
    int64_t m = n - x;
    if (m >= 2 * cap)
      m = cap;
    else if (m > cap)
      m = (m / 2 + unroll - 1) / unroll * unroll;
    out.push_back(m);
    x += m;
  }
  return out;
}

GemmL1 sgemm_l1(int64_t M, int64_t N, int64_t K, double l1, const GemmBlocking& g) {
  GemmL1 t;
  const double n = double(N);
  for (int64_t kl : gemm_blocks(K, g.q, g.unroll)) {
    const double kd = double(kl);
    t.reads += double(M) * n * 4 + kd * n * 4;  // C, and B's source read by the packing
    t.writes += kd * n * 4;                     // packed B
    const std::vector<int64_t> mblocks = gemm_blocks(M, g.p, g.unroll);
    for (int64_t mi : mblocks) {
      const double a = double(mi) * kd * 4;
      t.reads += a;   // A's source, read by the packing
      t.writes += a;  // packed A
      t.reads += a + double(g.kernel_n) * kd * 4 <= l1 ? a : a * std::ceil(n / double(g.kernel_n));
      if (double(g.kernel_m + g.kernel_n) * kd * 4 > l1 / 2)
        t.reads += std::max(0.0, std::ceil(double(mi) / double(g.kernel_m)) - 1) * kd * n * 4;
    }
    t.reads += double(mblocks.size() - 1) * kd * n * 4;
  }
  return t;
}

// Whether each worker's first unit of a call fills head mode's scratch at a level past L1: always
// in a cold call; in the steady state of repeated calls where the scratch (`scratch` bytes) and one
// unit's caller tensors (`unit_io`: Q, K, V and O, which the calls stream between the previous
// call's last use of a scratch line and this call's first) overflow the worker's share. At S = 512,
// D = 64 on a 512 KiB L2 the copy and the tile's buffers (426 KiB) fit but not with the caller's
// tensors, and every call fills the copy again (its write misses are the same in a second call).
bool first_unit_fills(bool cold, double scratch, double unit_io, double share) {
  return cold || scratch + unit_io > share;
}

// What the starts of a call's units cost a level past L1: every unit but each worker's first
// refills its first tile's buffers after the unit before (first_tile); each worker's first unit
// fills what it touches where first_unit_fills says so.
double unit_starts(bool fills, double units, double active, double first_tile, double touched) {
  return std::max(0.0, units - active) * first_tile + (fills ? active * touched : 0.0);
}

// Head mode's copies written across a level past L1, in copies. Each worker packs every unit into
// the same scratch: where the copy fits the worker's share beside the tile's buffers (`fits`), the
// next unit's packing overwrites lines still held and only each worker's first unit fills its
// copy, where first_unit_fills says so; otherwise every unit's copy is evicted below. On a
// 260 MiB L3 the 4 MiB copy at S = 4096 stays, and counting it per unit would put flash above
// standard there.
double head_copies_written(bool fits, bool fills, double units, double active) {
  return fits ? (fills ? std::min(units, active) : 0.0) : units;
}

TrafficReport cpu_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw, const StandardPasses& sp,
                          const TrafficOptions& opt) {
  TrafficReport rep;
  const Sizes sz = sizes_of(pr);
  const int64_t group = pr.heads_kv > 0 ? pr.heads_q / pr.heads_kv : 1;
  const int64_t rows = group * pr.seqlen_q;
  const UnitWalk w = walk_unit(pr, group, std::max(1, plan.block_q), std::max(1, plan.block_kv), true);
  const double units = double(pr.batch) * double(pr.heads_kv);
  const double splits = std::max(1, plan.kv_splits);
  // A split re-reads its query block and writes an (O, m, l) partial that the merge reads back.
  const double q_flash = sz.q * splits;
  const double partials = splits > 1 ? 2.0 * units * double(rows) * splits * (double(pr.head_dim_v) + 2) * 4 : 0.0;
  const double kv_streamed = units * double(w.kv_rows_sum) * sz.kv_row;  // K/V once per query block
  const double kv_once = units * double(w.kv_rows_union) * sz.kv_row;    // K/V once per unit
  const double kv_unit = double(w.kv_rows_union) * sz.kv_row / splits;   // one worker's slice
  const double unit_io = (sz.q + sz.o) / std::max(1.0, units) + double(w.kv_rows_union) * sz.kv_row;
  const double workers = std::max(1, plan.workers);

  // Standard: one (batch, q head) per worker at a time, S of that head materialized.
  const double kv_head = double(pr.seqlen_k) * sz.kv_row;
  const double kv_std_per_qhead = double(pr.batch) * double(pr.heads_q) * kv_head;
  const double kv_std_per_kvhead = double(pr.batch) * double(pr.heads_kv) * kv_head;
  // A cold call's scratch crosses every outer boundary once, on the workers that get work.
  const double active = std::min<double>(workers, std::max<int64_t>(1, plan.work_items > 0 ? plan.work_items : 1));

  // The CPU kernel's head mode (cpu/flash_kernel.cc, DecideShape): when every worker gets two
  // or more whole heads of two or more query blocks each (one worker: any head with two blocks)
  // and no key split, a task is a whole (sequence, kv head) whose K/V is converted once into an
  // fp32 copy ([key][D] and V in panels of the P V tile's columns) that all its query blocks stream.
  const double lanes_f = std::max(4, hw.simd_bits / 32);
  const CpuKernelShape ks = cpu_kernel_shape(hw);
  const double dvq = round_up_d(double(pr.head_dim_v), double(ks.panel_cols));
  const double packed_row = (double(plan.head_dim_padded > 0 ? plan.head_dim_padded : pr.head_dim) + dvq) * 4.0;
  const double head_copy = double(w.kv_rows_union) * packed_row;
  const double tiles = units * double(w.q_blocks);
  const CpuCallMode mode = cpu_call_mode({plan.rows_per_unit, plan.kv_splits, tiles, units, workers, head_copy});
  const bool head_mode = mode == CpuCallMode::head;
  const bool decode = mode == CpuCallMode::decode;
  double prev_flash_kv = kv_streamed, prev_std_kv = kv_std_per_qhead;
  double best_share = 0;  // the largest per-worker share of the levels inside the current boundary
  for (size_t b = 0; b + 1 < hw.levels.size(); ++b) {
    const MemoryLevel& inner = hw.levels[b];
    BoundaryTraffic bt;
    bt.name = inner.name + "-" + hw.levels[b + 1].name;
    const double sharing = std::min<double>(inner.shared_by, workers);
    const double cap = shared_capacity(inner);
    double fr, fw;
    if (b == 0) {
      if (decode) {
        // Decode mode (DecodeRange) reads every K and V row of its split once, straight from
        // the cache, and keeps the few query rows' Q, S^T and O in L1.
        fr = q_flash + kv_streamed + partials / 2;
      } else {
        fr = units * cpu_flash_unit_l1(pr, plan, ks, double(inner.size_bytes), opt.cache_ways, head_mode).total() - sz.o -
             partials / 2;
      }
      // The output (and the split partials) are the writes; every other fill is counted as a
      // read, scratch included (its lines are filled, then read).
      fw = sz.o + sz.lse + partials / 2;
    } else {
      // The K/V slices of the units being processed concurrently (one per worker sharing this
      // level) stay here across the unit's query blocks if they fit next to each worker's
      // scratch. If not, what the scratch leaves of the worker's share still keeps that many
      // bytes of the slice from one query block to the next, and only the rest streams in again:
      // cachegrind shows K/V re-reads 2.85 times per head at S=1024, D=64 over four query
      // blocks, not 4 (the all-or-nothing rule was 25-30% high there; docs/traffic.md).
      // A packed tile's scratch is what the kernel allocates (MakeGeometry): Q^T and O, two K/V
      // block buffers, one panel's S^T (block_kv x 48 floats) and the per-row scalars; not the
      // planner's working set, which counts block_q x block_kv scores. Decode keeps the planner's.
      const double mp_max = round_up_d(double(std::max<int64_t>(1, plan.block_q / std::max<int64_t>(group, 1)) * group),
                                       lanes_f);
      const double tile_ws =
          decode ? double(plan.working_set_bytes)
                 : 4.0 * (mp_max * (double(plan.head_dim_padded > 0 ? plan.head_dim_padded : pr.head_dim) +
                                    round_up_d(double(pr.head_dim_v), lanes_f)) +
                          double(plan.block_kv) * (2.0 * (double(pr.head_dim) + dvq) + double(kCpuPanelRows))) +
                       8.0 * mp_max;
      const double free_bytes = std::max(0.0, cap / sharing - tile_ws);
      const double share = std::max(best_share, cap / sharing);
      if (!head_mode) {
        const double kept = kv_unit > 0 ? std::min(1.0, free_bytes / kv_unit) : 1.0;
        const double kv = std::min(prev_flash_kv, kv_once + std::max(0.0, kv_streamed - kv_once) * (1.0 - kept));
        prev_flash_kv = kv;
        fr = q_flash + kv + partials / 2;
        fw = sz.o + sz.lse + partials / 2;
        if (decode) {
          fr += opt.cold_scratch ? active * tile_ws : 0.0;
        } else {
          // Inside each tile, and the tile's buffers again where the tile before evicted them
          // (cpu_tile_refills): every tile but each worker's first, which fills what it touches.
          SetOccupancy occ(share, opt.cache_ways, double(inner.line_bytes), 0, 0, 0);
          const TileRefills t = cpu_tile_refills(pr, plan, ks, occ, false);
          fr += units * (t.inside + t.tile_refill) +
                unit_starts(opt.cold_scratch, units, active, t.first_tile, t.touched);
        }
      } else {
        // Head mode: the caller's K/V is read once per unit and written as one fp32 copy, which
        // every query block then streams from its first key to its last. A key's K row and V lines
        // are read by one tile and again by the next; in between come the rest of the copy, the
        // tile's buffers (Q^T and O, one panel's S^T), its output rows and the next tile's Q rows,
        // so the copy stays as far as that window fits its sets (cachegrind: 4.2 passes over K and
        // over V for 4 blocks at S=1024, D=64, where the copy alone is the whole 512 KiB LL). The
        // unit's first tile reads the copy right after packing it: in between the copy, the
        // caller's K/V rows packed after the key, the Q rows read, Q^T written and O zeroed. The
        // per-block buffers are not allocated.
        const double dpw = plan.head_dim_padded > 0 ? plan.head_dim_padded : double(pr.head_dim);
        const double dvpw = round_up_d(double(pr.head_dim_v), lanes_f);
        const double ws = 4.0 * (mp_max * (dpw + dvpw) + double(plan.block_kv) * double(kCpuPanelRows)) + 8.0 * mp_max;
        SetOccupancy occ(share, opt.cache_ways, double(inner.line_bytes),
                         double(w.kv_rows_union) * double(ks.panel_cols) * 4, double(ks.panel_cols) * 4,
                         int64_t(dvq / double(ks.panel_cols)));
        const double union_keys_d = double(w.kv_rows_union), src_key = sz.kv_row;
        const double tile_rows = std::min(mp_max, double(group * pr.seqlen_q));
        // The fraction of a copy line kept over a window holding `keys` keys of the copy and the
        // other buffers `others`.
        auto copy_kept = [&](double keys, const std::vector<double>& others) {
          std::vector<double> cw = {keys * double(pr.head_dim) * 4};
          cw.insert(cw.end(), others.begin(), others.end());
          return (double(pr.head_dim) * occ.hit(cw, 0, keys) + dvq * occ.hit(cw, SetOccupancy::kVCopy, keys)) /
                 (double(pr.head_dim) + dvq);
        };
        const std::vector<double> packing = {mp_max * dpw * 4, mp_max * dvpw * 4,
                                             tile_rows * double(pr.head_dim) * dtype_bytes(pr.dtype)};
        std::vector<double> between = packing;
        between.push_back(double(plan.block_kv) * double(kCpuPanelRows) * 4);
        between.push_back(tile_rows * double(pr.head_dim_v) * dtype_bytes(pr.dtype));
        // Per tile: the keys the tile before also streamed were last read by it, the copy in
        // between being that tile's keys; the others (and the first tile's) since the packing or
        // longer ago, the whole copy in between.
        const int64_t per_tile = std::max<int64_t>(1, plan.block_q / std::max<int64_t>(group, 1));
        const int64_t right_w = effective_window_right(pr.causal, pr.window_right);
        double copy_reads = 0;
        int64_t prev0 = 0, prev1 = 0;
        for (int64_t p0 = 0; p0 < pr.seqlen_q; p0 += per_tile) {
          const int64_t t0 = visible_keys(p0, pr.seqlen_q, pr.seqlen_k, pr.window_left, right_w).begin;
          const int64_t t1 = visible_keys(std::min(pr.seqlen_q, p0 + per_tile) - 1, pr.seqlen_q, pr.seqlen_k,
                                          pr.window_left, right_w).end;
          if (t1 <= t0) continue;
          const double all = double(t1 - t0);
          const double common = p0 == 0 ? 0.0 : double(std::max<int64_t>(0, std::min(t1, prev1) - std::max(t0, prev0)));
          double fresh_kept = 0;
          if (p0 == 0) {
            // Since the packing: for a key a fraction f into the copy, the caller's rows after it
            // (1 - f of them) were read to pack the rest; averaged over the tile's keys (8 points).
            constexpr int kSteps = 8;
            const double u0 = double(visible_keys(0, pr.seqlen_q, pr.seqlen_k, pr.window_left, right_w).begin);
            for (int i = 0; i < kSteps; ++i) {
              const double key = double(t0) + (double(i) + 0.5) / kSteps * all;
              std::vector<double> since = packing;
              since.push_back(std::max(0.0, union_keys_d - (key - u0)) * src_key);
              fresh_kept += copy_kept(union_keys_d, since) / kSteps;
            }
          } else {
            fresh_kept = copy_kept(union_keys_d, between);
          }
          copy_reads += common * (1.0 - copy_kept(double(prev1 - prev0), between)) + (all - common) * (1.0 - fresh_kept);
          prev0 = t0;
          prev1 = t1;
        }
        fr = q_flash + kv_once + units * packed_row * copy_reads;
        // Inside a tile, what this level (or a larger one inside it) loses of the K/V block from
        // panel to panel, of S^T, and of the panels' Q^T and O rows from block to block, and at a
        // tile's start what the tile before evicted of its buffers (cpu_tile_refills), set by set:
        // the V copy's column chunks lie head_keys x chunk bytes apart. The Q^T and O rows are
        // used by every block, so the copy's stream alone does not evict them: the rule this
        // replaces, which refilled them per tile wherever the copy outgrew the level, was 9 points
        // high at S=2048, D=64, 312x128, where the line-level simulation (l1_sim.py --l2) refills
        // Q^T and O for 3% of the copy's re-read bytes.
        const TileRefills t = cpu_tile_refills(pr, plan, ks, occ, true);
        const bool fills = first_unit_fills(opt.cold_scratch, head_copy + ws, unit_io, share);
        fr += units * (t.inside + t.tile_refill) + unit_starts(fills, units, active, t.first_tile, ws);
        fw = sz.o + sz.lse + head_copies_written(head_copy + ws <= share, fills, units, active) * head_copy;
      }
      // Decode: a working set larger than this level's per-worker share spills: its per-step
      // traffic then crosses this boundary as it crosses L1d-L2. Only if it fits no level between:
      // a working set that stays in L2 never reaches an L3 whose per-core share is smaller
      // (Neoverse V1: 1 MiB L2, 32 MiB L3 over 64 cores). The packed modes' reuse inside a tile
      // is decided use by use above (the same "no level between" through `share`).
      best_share = share;
      if (decode && double(plan.working_set_bytes) > best_share) {
        fr += units * cpu_flash_unit_l1(pr, plan, ks, best_share, opt.cache_ways, head_mode).steps;
      }
    }
    // Standard, one (batch, q head) per worker at a time, phase by phase: the copies are written,
    // beta = 0 zeroes S, the Q K^T sgemm packs the Q and K copies and accumulates into S, the
    // softmax rewrites S in place, the P V sgemm packs P block by block and V, and O is converted
    // out. S stays in this level if it fits next to what the Q K^T sgemm keeps live (the two
    // copies and its packed blocks); then its passes stay inside (a cold call fills it once).
    // K/V of a kv head is read once for its G q heads if it stays.
    const double cap_w = cap / sharing;
    const double sq_d = double(pr.seqlen_q), sk_d = double(pr.seqlen_k);
    // The GEMMs' operands: the fp32 copies where the baseline stages them, else the caller's tensors.
    const double qe = sp.staged_fp32_copies ? 4.0 : dtype_bytes(pr.dtype),
                 ke = sp.staged_fp32_copies ? 4.0 : dtype_bytes(pr.kv_dtype);
    const double qc = sq_d * double(pr.head_dim) * qe, kc = sk_d * double(pr.head_dim) * ke;
    const double vc = sk_d * double(pr.head_dim_v) * ke, oc = sq_d * double(pr.head_dim_v) * qe;
    const double packed_q = sq_d * double(pr.head_dim) * 4;
    const double m_block1 = double(gemm_blocks(pr.seqlen_k, sp.gemm.p, sp.gemm.unroll).front());
    const std::vector<int64_t> k_blocks2 = gemm_blocks(pr.seqlen_k, sp.gemm.q, sp.gemm.unroll);
    const double packed_b1 = packed_q, packed_a1 = m_block1 * double(pr.head_dim) * 4;
    const double packed_b2 = double(k_blocks2.front()) * sq_d * 4,
                 packed_a2 = double(pr.head_dim_v) * double(k_blocks2.front()) * 4;
    const double gemm1_live = sz.s_head + qc + kc + packed_b1 + packed_a1;
    const bool s_resident = sz.s_head <= cap_w && gemm1_live <= cap_w;
    const double s_reads = s_resident ? 0.0 : sp.s_reads * sz.s_fp32;
    const double s_writes = s_resident ? 0.0 : sp.s_writes * sz.s_fp32;
    const bool kv_resident = sharing * kv_head <= cap;
    const double kv_std = std::min(prev_std_kv, kv_resident ? kv_std_per_kvhead : kv_std_per_qhead);
    prev_std_kv = kv_std;
    // The copies are written (a write-allocating pass) and read back by the packing or by the
    // final conversion of O; S's zeroing pass evicts the Q and K copies in between unless S fits
    // with them, and V's waits through the whole Q K^T sgemm. A cold call fills what stays once.
    const double heads = double(pr.batch) * double(pr.heads_q);
    double copies_crossing = 0;
    if (sp.staged_fp32_copies) {
      const double cold = opt.cold_scratch ? 1.0 : 0.0;
      copies_crossing = heads * ((qc + kc) * (qc + kc + vc + sz.s_head <= cap_w ? cold : 2.0) +
                                 vc * (gemm1_live + vc <= cap_w ? cold : 2.0) + oc * (s_resident ? cold : 1.0));
    }
    const double s_first_touch = s_resident && opt.cold_scratch ? sharing * sz.s_head : 0.0;
    // Inside the sgemms (GemmBlocking): the Q K^T sgemm reads the packed Q copy again for each
    // block of p key rows after the first unless it stays next to that block's rows of S; the
    // P V sgemm reads O (its C) again for each block of q keys after the first unless O stays
    // next to the packed block of P; a cold call fills OpenBLAS's packing buffer once.
    const double m_blocks1 = double(gemm_blocks(pr.seqlen_k, sp.gemm.p, sp.gemm.unroll).size());
    const double gemm_outer =
        heads * ((packed_b1 + m_block1 * sq_d * 4 > cap_w ? (m_blocks1 - 1) * packed_b1 : 0.0) +
                 (oc + packed_b2 > cap_w ? double(k_blocks2.size() - 1) * oc : 0.0)) +
        (opt.cold_scratch ? sharing * std::max(packed_a1 + packed_b1, packed_a2 + packed_b2) : 0.0);
    if (b == 0) {
      // L1d-L2 holds no head's S: the baseline's own loop nest, per (batch, q head). Its compulsory
      // Q, K, V reads and O writes in the storage type; the fp32 staging copies written and the O
      // copy read back; the two beta = 0 zeroing passes (S, and O for the P V sgemm); the softmax's
      // read of S; and each sgemm's traffic (sgemm_l1: C, packing, the kernel's streams), which
      // includes the Q K^T accumulation pass over S and the P V sgemm's read of P.
      const int64_t sq = pr.seqlen_q, sk = pr.seqlen_k, d = pr.head_dim, dv = pr.head_dim_v;
      const double l1 = double(inner.size_bytes);
      const GemmL1 g1 = sgemm_l1(sk, sq, d, l1, sp.gemm), g2 = sgemm_l1(dv, sq, sk, l1, sp.gemm);
      const double staged_w = sp.staged_fp32_copies ? 4.0 * double(sq * d + sk * (d + dv)) : 0.0;
      const double staged_r = sp.staged_fp32_copies ? 4.0 * double(sq * dv) : 0.0;
      const double beta = 4.0 * double(sq * sk + sq * dv);
      set(&bt, fr, fw, sz.q + kv_std_per_qhead + heads * (staged_r + double(sq * sk) * 4 + g1.reads + g2.reads),
          sz.o + sz.lse + heads * (staged_w + beta + g1.writes + g2.writes));
    } else {
      set(&bt, fr, fw, sz.q + kv_std + s_reads + copies_crossing / 2 + gemm_outer,
          sz.o + sz.lse + s_writes + copies_crossing / 2 + s_first_touch);
    }
    rep.levels.push_back(bt);
  }
  return rep;
}

// ---- GPU ----------------------------------------------------------------------------------
// What the L2 slices look up (lts__t_bytes), by source, as Nsight Compute splits it on the H200
// (bench/traffic/samples/gpu/split-2026-12-03): lookups of the SMs' own requests
// (lts__t_sectors_srcunit_tex) and lookups that one L2 partition forwards to the other through
// the L2 fabric (srcunit_ltcfabric). On a partitioned L2 (GA100, GH100: MemoryLevel::partitions)
// an SM's request is looked up in the partition wired to its GPC; an address homed in the other
// partition, (P - 1) / P of them (the hash spreads addresses evenly), is forwarded to its home
// when the near partition has no copy. The near partition keeps a copy of far data once read,
// for every kind of load (cp.async.cg included), so only a partition's first read of a far line
// crosses the fabric; stores cross it every time (they go to the home). Measured for the CUDA
// kernel: fabric reads 147-184 MB where these first touches come to 168 MB, fabric writes
// 0.49-0.50 x the SMs' write sectors; the fabric is 2.8-16% of its lookups, 27% of MATH's
// (which touches most bytes once). 1f30c9f's rule, that every cp.async.cg
// request of the CUDA kernel is looked up a second time at its home, is refuted by the same
// samples: at S = 16384 D = 128 the fabric carried 23.8M of 862M sectors.
double far_share(const MemoryLevel& l2) { return double(std::max(1, l2.partitions) - 1) / std::max(1, l2.partitions); }

// Fabric lookups of `unique` bytes read n times by CTAs spread over the SMs: every partition's
// first read of a line homed elsewhere (n readers reach min(n, P) partitions).
double first_touch_fabric(double unique, double n, const MemoryLevel& l2) {
  return unique * far_share(l2) * std::min(n, double(std::max(1, l2.partitions)));
}

// The CUDA prefill kernel's cp.async.cg reads (Q, K, V: 16 bytes a thread) as the SMs' side of
// the H200 counts them: l1tex__m_xbar2l1tex_read_sectors = 1.500-1.501 x the sectors the kernel's
// tiles hold at S = 16384 (1.502-1.516 at S = 1024), srcunit_tex reads 1.473-1.516 x, at all 8
// split points (D = 64 and 128, causal or not), the excess growing with the tile steps (half a
// K+V tile pair per step), not with the CTAs. The L1TEX tag stage counts 1.125 x
// (l1tex__t_sectors_pipe_lsu_mem_global_op_ld). Why the crossbar carries half as much again is
// not settled (docs/traffic.md, "What lts__t_bytes counts"): a measured ratio of this kernel on
// this chip, not a derived one, so the decode kernel and the split-KV merge (no samples) are
// counted at one lookup per requested sector.
constexpr double kCudaCopyReadSectors = 1.5;

// The CUDA forward's epilogue stores O from the MMA accumulators: the 4 lanes that hold a row's
// 8 adjacent columns store one bf16 pair each, 16 contiguous bytes per row per instruction
// (gpu/sm80/flash_fwd.cuh), so every 32-byte sector of O is two store requests: the split
// samples' l1tex__t_sectors_pipe_lsu_mem_global_op_st is 2.00 x O's sectors at every point.
constexpr double kCudaOutStoreBytes = 16;

TrafficReport gpu_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw, const StandardPasses& sp) {
  TrafficReport rep;
  const Sizes sz = sizes_of(pr);
  const UnitWalk w = walk_unit(pr, 1, std::max(1, plan.block_q), std::max(1, plan.block_kv), false);
  const double splits = std::max(1, plan.kv_splits);
  // K/V streams: one per (batch, q head) for the prefill kernel; the decode kernel's CTA serves
  // the G query heads of a kv head, so one per (batch, kv head) there (plan.units; ncu on the
  // H200: GQA decode reads each K/V byte once, bench/results/gpu-decode.md).
  const double streams = plan.units > 0 ? double(plan.units) : double(pr.batch) * double(pr.heads_q);
  const double units = streams * splits;  // one K/V stream each
  const double q_flash = sz.q * splits;
  const double partials =
      splits > 1 ? 2.0 * double(pr.batch * pr.heads_q * pr.seqlen_q) * splits * (double(pr.head_dim_v) + 2) * 4 : 0.0;
  const double kv_per_cta_sum = streams * double(w.kv_rows_sum) * sz.kv_row;
  const double kv_unit = double(w.kv_rows_union) * sz.kv_row / splits;
  const double kv_once = units * kv_unit;
  const MemoryLevel& l2 = hw.levels[1];

  // smem-L2: every CTA loads its Q tile once and every visible K/V block once; O (and LSE) go
  // out once. Standard: each GEMM operand is read once per output tile across it, and every pass
  // over S goes through.
  BoundaryTraffic inner;
  inner.name = hw.levels[0].name + "-" + hw.levels[1].name;
  const double bh = double(pr.batch * pr.heads_q);
  const double eb = dtype_bytes(pr.dtype), kb = dtype_bytes(pr.kv_dtype);
  const double q_el = bh * double(pr.seqlen_q) * pr.head_dim, o_el = bh * double(pr.seqlen_q) * pr.head_dim_v;
  const double k_el = bh * double(pr.seqlen_k) * pr.head_dim, v_el = bh * double(pr.seqlen_k) * pr.head_dim_v;
  const double qe = sp.fp32_upcast ? 4.0 : eb, ke = sp.fp32_upcast ? 4.0 : kb;
  auto per_tile = [](int64_t n, int tile) { return std::ceil(double(n) / std::max(1, tile)); };
  const double q_reads = per_tile(pr.seqlen_k, sp.qk_tile_k), k_reads = per_tile(pr.seqlen_q, sp.qk_tile_q);
  const double v_reads = per_tile(pr.seqlen_q, sp.pv_tile_q), p_reads = per_tile(pr.head_dim_v, sp.pv_tile_d);
  const double gemm_reads = q_el * qe * q_reads + k_el * ke * k_reads + v_el * ke * v_reads;
  const double mask = sp.broadcast_mask_bytes * double(pr.seqlen_q) * double(pr.seqlen_k);  // one, all heads read it
  // The fp32 prologue and epilogue: Q, K, V converted (read, written in fp32), Q and K scaled
  // (read, written), O written by the P V GEMM in fp32 and converted (read, written).
  const double up_reads = sp.fp32_upcast ? q_el * eb + (k_el + v_el) * kb + (q_el + k_el) * 4 + o_el * 4 : 0.0;
  const double up_writes = sp.fp32_upcast ? (q_el + k_el + v_el) * 4 + (q_el + k_el) * 4 + o_el * 4 : 0.0;
  // s_reads counts P's first read by the P V GEMM; each further tile column reads it again.
  const double s_traffic_reads = (sp.s_reads + p_reads - 1) * sz.s_fp32;
  set(&inner, q_flash + kv_per_cta_sum + partials / 2, sz.o + sz.lse + partials / 2,
      gemm_reads + s_traffic_reads + bh * mask + up_reads, sz.o + sz.lse + sp.s_writes * sz.s_fp32 + up_writes);
  rep.levels.push_back(inner);

  // L2 lookups: the SMs' requests in sectors plus the fabric's. Flash: the prefill kernel's copies
  // at kCudaCopyReadSectors, O's sectors stored in halves (the decode kernel's epilogue and the
  // split-KV merge have no samples), and the fabric for each partition's first read of Q and of a
  // head's K/V (read by `readers` CTAs on average) and for every store. The zero-byte copies that
  // the unmasked loop issues past the last tile (src-size 0) add nothing: the SM-side excess is
  // the same 1.5 x per tile at causal and non-causal points, whose tiles per CTA differ (129 and
  // 256 at S = 16384) while each CTA issues one zero-byte tile.
  const int64_t group = pr.heads_kv > 0 ? std::max<int64_t>(1, pr.heads_q / pr.heads_kv) : 1;
  const bool prefill = splits == 1 && !gpu_decode_rows(group, pr.seqlen_q);
  const double out_requests = prefill ? sz.o * 32 / kCudaOutStoreBytes : sz.o;
  const double write_requests = out_requests + sz.lse + partials / 2;
  const double readers = kv_once > 0 ? kv_per_cta_sum / kv_once : 0.0;
  rep.flash_l2_fabric_bytes = first_touch_fabric(sz.q, splits, l2) + first_touch_fabric(kv_once, readers, l2) +
                              first_touch_fabric(partials / 2, 1, l2) + far_share(l2) * write_requests;
  rep.flash_l2_lookup_bytes = (prefill ? kCudaCopyReadSectors : 1.0) * inner.flash_read_bytes + write_requests +
                              rep.flash_l2_fabric_bytes;
  // Standard: the GEMM operands, P in P V and the broadcast mask are re-read through
  // L1-cacheable loads; every other pass touches each byte once, its first touch crossing the
  // fabric for far lines. The SMs' side is the smem-L2 boundary itself.
  const double shared_reads = gemm_reads + (p_reads - 1) * sz.s_fp32 + bh * mask;
  rep.standard_l2_fabric_bytes = first_touch_fabric(q_el * qe, q_reads, l2) + first_touch_fabric(k_el * ke, k_reads, l2) +
                                 first_touch_fabric(v_el * ke, v_reads, l2) + first_touch_fabric(sz.s_fp32, p_reads, l2) +
                                 first_touch_fabric(mask, bh, l2) +
                                 far_share(l2) * (inner.standard_bytes - shared_reads - sz.s_fp32);
  rep.standard_l2_lookup_bytes = inner.standard_bytes + rep.standard_l2_fabric_bytes;

  // L2-HBM. The L2 keeps one copy per partition of data every SM reads, so K/V sees
  // cap = size / partitions. CTAs run in waves of `workers` resident CTAs in grid order (query
  // block fastest, as FlashAttention-2's grid): the heads of one wave share their K/V in L2 if
  // it fits (W <= cap). A head whose CTAs straddle a wave boundary needs its K/V again in the
  // next wave; it is still there only if the wave's other K/V plus the wave's Q/O traffic fit.
  const double cap = shared_capacity(l2);
  const double resident = std::max(1, plan.workers);
  const double q_blocks = std::max<int64_t>(1, w.q_blocks);
  const double total_ctas = units * q_blocks;
  const double w_active = std::min(units, std::max(1.0, resident / q_blocks)) * kv_unit;
  const double qo_wave = resident * plan.block_q * double(pr.head_dim + pr.head_dim_v) * eb;
  double kv_reads;
  if (sz.q + kv_once + sz.o <= cap) {
    kv_reads = kv_once;
  } else {
    // Waves spanned, summed over units: one per unit plus, for each wave boundary that cuts a
    // unit's run of CTAs, the K/V its CTAs in the next wave read again. The CUDA kernel, like
    // FlashAttention-2, runs a unit's query blocks from the last to the first (m_block =
    // gridDim.x - 1 - blockIdx.x), so those are its FIRST query blocks: the whole K/V without
    // a mask, only the prefix they see under a causal one (measured: 1.04x K/V causal against
    // 1.26x without, H=16, S=16384, D=128; the whole-unit rule was 20% high causal).
    const int64_t bq = std::max(1, plan.block_q), bkv = std::max(1, plan.block_kv);
    const int64_t right = effective_window_right(pr.causal, pr.window_right);
    auto first_blocks_rows = [&](int64_t nblocks) {
      const int64_t last = std::min(pr.seqlen_q, nblocks * bq) - 1;
      const int64_t begin = visible_keys(0, pr.seqlen_q, pr.seqlen_k, pr.window_left, right).begin / bkv * bkv;
      const int64_t end = std::min(
          pr.seqlen_k, ceil_div(visible_keys(last, pr.seqlen_q, pr.seqlen_k, pr.window_left, right).end, bkv) * bkv);
      return double(std::max<int64_t>(0, end - begin));
    };
    double reread_rows = 0;
    for (double k = 1; k * resident < total_ctas; ++k) {
      const double issued = std::fmod(k * resident, q_blocks);
      if (issued != 0) reread_rows += first_blocks_rows(int64_t(q_blocks - issued));
    }
    const double per_wave = w_active + qo_wave <= cap ? kv_once : kv_once + reread_rows * sz.kv_row / splits;
    if (w_active <= cap) {
      kv_reads = per_wave;
    } else {
      // The wave's K/V does not fit: the fraction cap / W of re-uses hits, the rest is re-read.
      kv_reads = per_wave + std::max(0.0, kv_per_cta_sum - per_wave) * (1.0 - cap / w_active);
    }
  }
  kv_reads = std::min(kv_reads, kv_per_cta_sum);
  const double flash_reads = q_flash + kv_reads + partials / 2;
  // Dirty lines still in L2 when the kernel ends are never written back during it: the
  // output's share of the traffic stream, applied to the capacity, stays behind.
  const double out_bytes = sz.o + sz.lse + partials / 2;
  const double dirty_end = std::min(out_bytes, cap * out_bytes / (flash_reads + out_bytes));
  const double flash_writes = out_bytes - dirty_end;

  // Standard on the GPU: each pass is a kernel over all heads, so S stays in L2 only if the
  // whole S does.
  const bool s_resident = sz.s_fp32 <= cap;
  const double std_kv = double(pr.batch * pr.heads_q) * double(pr.seqlen_k) * sz.kv_row;
  // A mask shared by every (batch, head) is read once per head, from HBM only if it does not stay.
  const double mask_reads = s_resident ? 0.0 : (mask <= cap ? mask : double(pr.batch * pr.heads_q) * mask);
  const double std_reads = sz.q + std_kv + (s_resident ? 0.0 : sp.s_reads * sz.s_fp32) + mask_reads;
  const double std_out = sz.o + sz.lse + (s_resident ? 0.0 : sp.s_writes * sz.s_fp32);
  const double std_dirty = std::min(std_out, cap * std_out / (std_reads + std_out));
  BoundaryTraffic outer;
  outer.name = l2.name + "-" + hw.levels.back().name;
  set(&outer, flash_reads, flash_writes, std_reads, std_out - std_dirty);
  rep.levels.push_back(outer);
  return rep;
}

}  // namespace

StandardPasses cpu_baseline_passes() {
  StandardPasses p;
  p.s_reads = 2;   // the softmax's read (its in-place write finds the lines present), the PV sgemm's read
  p.s_writes = 2;  // the beta = 0 zeroing pass, then the QK^T accumulation into S
  p.staged_fp32_copies = true;
  p.name = "project baseline (bench/lib: fp32 copies, sgemm beta=0 zeroing + QK^T, in-place softmax, sgemm PV)";
  return p;
}

StandardPasses pytorch_math_passes(bool causal) {
  if (!causal) return pytorch_math_passes();
  // Nsight Compute's kernel list (bench/traffic/samples/gpu/math_*_causal.txt) shows what the mask
  // adds: a boolean tril of Sq x Sk built once, turned into one fp32 additive mask (kernels 4-8),
  // and one elementwise kernel per call that reads S and the mask, broadcast over the heads, and
  // writes the masked S: one more read and one more write of S, plus the mask read once per head
  // where it does not stay in L2 (67 MB at S=4096, read 16 times: the 7.4 reads measured there)
  // and once where it does (4 MB at S=1024: the 71.5 MB that kernel read at H=16, S=1024, D=128).
  StandardPasses p = pytorch_math_passes();
  p.s_reads += 1;
  p.s_writes += 1.05;  // and the fp32 mask's writes, 4-6% of an S at S=4096 over 16 heads
  p.broadcast_mask_bytes = 4;
  p.name = "PyTorch MATH, is_causal (the non-causal passes plus the additive mask's pass)";
  return p;
}

StandardPasses pytorch_math_passes() {
  StandardPasses p;
  p.s_reads = 5.45;
  p.s_writes = 3.71;
  p.fp32_upcast = true;
  p.name = "PyTorch MATH (calibrated on the H=16, S=4096, D=128 Nsight Compute measurement)";
  return p;
}

TrafficReport predict_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw) {
  return predict_traffic(pr, plan, hw, StandardPasses{});
}

TrafficReport predict_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw,
                              const StandardPasses& standard) {
  return predict_traffic(pr, plan, hw, standard, TrafficOptions{});
}

TrafficReport predict_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw,
                              const StandardPasses& standard, const TrafficOptions& options) {
  TrafficReport rep = hw.kind == DeviceKind::gpu && hw.levels.size() >= 3
                          ? gpu_traffic(pr, plan, hw, standard)
                          : cpu_traffic(pr, plan, hw, standard, options);
  rep.hardware = hw.name;
  if (!rep.levels.empty()) {
    rep.flash_dram_bytes = rep.levels.back().flash_bytes;
    rep.standard_dram_bytes = rep.levels.back().standard_bytes;
  }
  rep.flops = forward_flops(pr);
  double peak_gflops = hw.fma_gflops_per_core * hw.cores;
  if (hw.kind == DeviceKind::gpu && pr.dtype != DType::f32 && hw.tensor_tflops > 0)
    peak_gflops = hw.tensor_tflops * 1e3;
  const double bw = hw.dram().bandwidth_gbs * 1e9;
  const double compute_s = peak_gflops > 0 ? rep.flops / (peak_gflops * 1e9) : 0.0;
  rep.flash_roofline_s = std::max(compute_s, bw > 0 ? rep.flash_dram_bytes / bw : 0.0);
  rep.standard_roofline_s = std::max(compute_s, bw > 0 ? rep.standard_dram_bytes / bw : 0.0);
  return rep;
}

}  // namespace ioattn
