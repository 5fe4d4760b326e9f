// One call from its plan to its outputs: the task shape, the parallel loop over tasks, and the
// merge of split-KV partials in split order.
// Per-target code: included by cpu/flash_kernel.cc once for every Highway target.
#if defined(IOATTN_CPU_SCHEDULE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef IOATTN_CPU_SCHEDULE_INL_H_
#undef IOATTN_CPU_SCHEDULE_INL_H_
#else
#define IOATTN_CPU_SCHEDULE_INL_H_
#endif

#include <algorithm>
#include <cstring>
#include <string>

#include "common/alloc.h"
#include "common/planner.h"
#include "cpu/decode-inl.h"
#include "cpu/prefill-inl.h"
#include "cpu/threading.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ioattn::cpu {
namespace HWY_NAMESPACE {

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

// What every task of one call reads: the request, its geometry, the tile order, and the scratch
// (one block per worker, then the split partials, [tile][split]).
struct Call {
  const AttnParams& p;
  const Geometry& g;
  TileIndex index;
  unsigned char* scratch;
  float* partials;  // null without key splits

  unsigned char* WorkerBase(int worker) const { return scratch + size_t(worker) * g.worker_bytes; }
};

// Head mode's task-th head in (sequence, kv head) order; sequences without query rows have none.
void RunHeadTask(const Call& c, int64_t task, int worker) {
  int64_t b = 0, seen = 0;
  for (;; ++b) {
    if (QueryBlocks(c.g, sequence(c.p, b)) == 0) continue;
    if (task < seen + c.p.heads_kv) break;
    seen += c.p.heads_kv;
  }
  RunHead(c.p, c.g, b, task - seen, CarveScratch(c.g, c.WorkerBase(worker)));
}

// Decode mode's task: split `split` of sequence b over all kv heads.
void RunDecodeTask(const Call& c, int64_t task, int worker) {
  const int64_t b = task / c.g.splits, split = task % c.g.splits;
  if (QueryBlocks(c.g, sequence(c.p, b)) == 0) return;
  DecodeTask(c.p, c.g, b, split, c.WorkerBase(worker), c.partials, c.index.tiles_before[b]);
}

// Tile mode's task: one split of one tile.
void RunTileTask(const Call& c, int64_t task, int worker) {
  const int64_t tile_index = task / c.g.splits, split = task % c.g.splits;
  RunTile(c.p, c.g, c.index.Get(tile_index), split, CarveScratch(c.g, c.WorkerBase(worker)),
          c.partials ? c.partials + task * c.g.partial_floats : nullptr);
}

// Merges the splits of one tile in split order (fixed, so the result is the same for any thread
// count) with the header's merge rule, then writes the rows.
void MergeTile(const Call& c, int64_t tile_index, int worker) {
  const DF df;
  const Geometry& g = c.g;
  const Scratch w = CarveScratch(g, c.WorkerBase(worker));
  const Tile t = c.index.Get(tile_index);
  const float* first = c.partials + tile_index * g.splits * g.partial_floats;
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
      for (int64_t col = 0; col < g.Dvp; col += kLanes)
        hn::Store(hn::MulAdd(hn::Load(df, ob + col), wb, hn::Mul(hn::Load(df, o + col), wa)), df, o + col);
      m = mw.m;
      l = mw.l;
    }
    WriteRow(c.p, g, t, r, o, m, l);
  }
}

Status FlashForward(const AttnParams& p, const Plan& plan) {
  if (p.batch == 0 || p.heads_q == 0) return Status::ok();
  const CallShape shape = DecideShape(p, plan);
  const Geometry& g = shape.g;
  if (shape.n_tiles == 0) return Status::ok();
  const int workers = shape.workers;
  ScratchPtr<int64_t> tiles_before = scratch_array<int64_t>(size_t(p.batch) + 1);
  ScratchPtr<unsigned char> scratch = scratch_array<unsigned char>(g.worker_bytes * size_t(workers));
  ScratchPtr<float> partials;
  const size_t partial_floats = size_t(shape.n_tiles * g.splits) * size_t(g.partial_floats);
  if (g.splits > 1) partials = scratch_array<float>(partial_floats);
  if (!tiles_before || !scratch || (g.splits > 1 && !partials)) {
    return Status::out_of_memory(
        "CPU forward: could not allocate " +
        std::to_string(g.worker_bytes * size_t(workers) + (g.splits > 1 ? partial_floats * sizeof(float) : 0)) +
        " bytes of scratch (workers=" + std::to_string(workers) + ", kv_splits=" + std::to_string(g.splits) + ")");
  }
  tiles_before[0] = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    tiles_before[b + 1] = tiles_before[b] + QueryBlocks(g, sequence(p, b)) * p.heads_kv;
  const Call call{p, g, TileIndex{&p, &g, tiles_before.get()}, scratch.get(), partials.get()};
  const auto task = g.head_mode ? &RunHeadTask : g.decode ? &RunDecodeTask : &RunTileTask;
  parallel_for(shape.n_tasks, workers, [&](int64_t i, int worker) { task(call, i, worker); });
  if (g.splits == 1) return Status::ok();
  parallel_for(shape.n_tiles, workers, [&](int64_t i, int worker) { MergeTile(call, i, worker); });
  return Status::ok();
}

size_t ScratchBytes(const AttnParams& p, const Plan& plan) {
  const CallShape c = DecideShape(p, plan);
  return c.g.worker_bytes * size_t(c.workers) + size_t(p.batch + 1) * sizeof(int64_t) +
         (c.g.splits > 1 ? size_t(c.n_tiles * c.g.splits * c.g.partial_floats) * sizeof(float) : 0);
}

}  // namespace HWY_NAMESPACE
}  // namespace ioattn::cpu
HWY_AFTER_NAMESPACE();

#endif  // IOATTN_CPU_SCHEDULE_INL_H_
