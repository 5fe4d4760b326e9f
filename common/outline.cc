#include "common/outline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/cpu_tiles.h"
#include "common/int_math.h"

namespace ioattn {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string num(int64_t v) { return std::to_string(v); }

// Largest finite value of the storage type: what an unshifted exp would have to stay under.
const char* dtype_range(DType t) {
  return t == DType::f16 ? "65504 (f16)" : t == DType::bf16 ? "3.4e38 (bf16)" : "3.4e38 (f32)";
}

}  // namespace

std::string format_bytes(double bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return fmt("%.4g", bytes) + " " + units[u];
}

std::string format_ratio(double standard_bytes, double flash_bytes) {
  if (!(flash_bytes > 0)) return "n/a";
  return fmt("%.3g", standard_bytes / flash_bytes) + "x";
}

DesignOutline designOutline(const Problem& pr, const Plan& plan, const HardwareProfile& hw) {
  const TrafficReport t = predict_traffic(pr, plan, hw);
  DesignOutline o;
  const bool gpu = plan.backend == BackendKind::cuda;

  std::string traffic = "Predicted bytes per boundary on " + hw.name + ", flash vs standard (S and P materialized in fp32):";
  for (const BoundaryTraffic& b : t.levels) {
    traffic += " " + b.name + " " + format_bytes(b.flash_bytes) + " vs " + format_bytes(b.standard_bytes) + " (" +
               format_ratio(b.standard_bytes, b.flash_bytes) + ");";
  }
  const double s_bytes = double(pr.batch * pr.heads_q) * double(pr.seqlen_q) * double(pr.seqlen_k) * 4.0;
  // CPU decode mode (cpu/flash_kernel.cc, DecodeRange) runs none of the packed blocks: per kv
  // head its few query rows keep fp32 Q, a 32-key score block and O, and K/V stream from the
  // cache in 32-key blocks over all kv heads, one block prefetched into L2 ahead of use.
  const bool cpu_decode = !gpu && cpu_decode_mode(plan.rows_per_unit);
  const int64_t rows = plan.rows_per_unit;
  const int64_t key_block = cpu_decode ? cpu_decode_block_keys : plan.block_kv;
  const double decode_state = 4.0 * double(pr.heads_kv) * double(rows) *
                              double(pr.head_dim + cpu_decode_block_keys + pr.head_dim_v);
  const double decode_block =
      double(cpu_decode_block_bytes(pr.heads_kv, pr.head_dim, pr.head_dim_v, dtype_bytes(pr.kv_dtype)));
  const std::string state_level =
      decode_state <= double(hw.levels.front().size_bytes) ? hw.levels.front().name : plan.target_level;
  traffic += " the score matrix alone is " + format_bytes(s_bytes) + ", which flash attention never writes; it keeps " +
             (cpu_decode ? "each worker's " + num(rows) + "x" + num(cpu_decode_block_keys) + " score block per kv head in " +
                               state_level + " and reads every K/V byte of the cache once"
                         : std::string(gpu ? "each CTA's" : "each worker's") + " " + num(plan.block_q) + "x" +
                               num(plan.block_kv) + " score tile in " + plan.target_level) +
             ".";
  o.memoryTraffic = traffic;

  const int64_t q_blocks = plan.block_q > 0 ? ceil_div(rows, plan.block_q) : 0;
  if (cpu_decode) {
    o.tiling = "decode mode (" + num(rows) + " query rows per kv head, at most " + num(cpu_decode_max_rows) +
               "): one task per sequence and key split runs all " + num(pr.heads_kv) + " kv heads, whose rows keep fp32 Q, " +
               "scores and O in " + format_bytes(decode_state) + " (" + state_level + "), and reads K and V straight from the " +
               std::string(dtype_name(pr.kv_dtype)) + " cache in " + num(cpu_decode_block_keys) + "-key blocks (" +
               format_bytes(decode_block) + " of K/V per block, the next one prefetched into " + plan.target_level +
               " in address order), with no packed copy; " + num(plan.work_items) + " tasks (kv_splits=" +
               num(plan.kv_splits) + ", splits of whole blocks) on " + num(plan.workers) + " workers. The planner's " +
               "packed blocks, block_q=" + num(plan.block_q) + " x block_kv=" + num(plan.block_kv) + " (" +
               format_bytes(double(plan.working_set_bytes)) + " of fp32 copies in the " +
               format_bytes(double(plan.target_level_bytes)) + " per-core " + plan.target_level +
               "), apply only to calls with more than " + num(cpu_decode_max_rows) + " query rows per kv head.";
  } else if (gpu) {
    o.tiling = "block_q=" + num(plan.block_q) + ", block_kv=" + num(plan.block_kv) + " (" + num(plan.warps) + " warps, " +
               num(plan.stages) + " K/V stages, head dim padded to " + num(plan.head_dim_padded) + ") from the constexpr " +
               "tile table: the Q tile plus the K/V stages take " + format_bytes(double(plan.working_set_bytes)) + " of the " +
               format_bytes(double(plan.target_level_bytes)) + " shared memory per block, so " + num(plan.ctas_per_sm) +
               " CTAs fit per SM and " + num(plan.workers) + " of the " + num(plan.work_items) + " CTAs run at once on " +
               num(hw.cores) + " SMs; kv_splits=" + num(plan.kv_splits) + ".";
  } else {
    o.tiling = "block_q=" + num(plan.block_q) + " rows x block_kv=" + num(plan.block_kv) + " keys, head dim padded to " +
               num(plan.head_dim_padded) + ": the packed fp32 Q, K, V, score and O blocks take " +
               format_bytes(double(plan.working_set_bytes)) + ", fitted to " + fmt("%.0f", kCpuCacheFill * 100) +
               "% of the " + format_bytes(double(plan.target_level_bytes)) + " per-core " + plan.target_level +
               "; both blocks are multiples of the " + num(plan.reg_rows) + "x" + num(plan.reg_cols) +
               " register tile; " + num(plan.work_items) + " tasks (kv_splits=" + num(plan.kv_splits) + ") on " +
               num(plan.workers) + " workers.";
  }

  const double scale = 1.0 / std::sqrt(double(std::max<int64_t>(pr.head_dim, 1)));
  const int64_t kv_blocks = key_block > 0 ? ceil_div(pr.seqlen_k, key_block) : 0;
  o.numericalStability =
      "Scores are scaled by 1/sqrt(" + num(pr.head_dim) + ") = " + fmt("%.4g", scale) + " and each row keeps a running max m " +
      "over its visible keys, so every exponent is exp(s - m) <= 1 and cannot overflow, however large the " +
      std::string(dtype_name(pr.dtype)) + " inputs (up to " + dtype_range(pr.dtype) + "); inputs are widened to fp32 " +
      "before the dot products, and the row sum l and the O accumulator stay in fp32 over all " + num(pr.seqlen_k) +
      " keys" + (gpu ? std::string() : " (summed in partials of " + num(cpu_sum_chunk_keys) +
      " keys added to the totals, so rounding grows with keys / " + num(cpu_sum_chunk_keys) +
      ", not with keys, when one large score dominates a row)") + "; when the max grows, O and l are rescaled by exp(m_old - m_new) at most once per key block (" +
      num(kv_blocks) + " blocks of " + num(key_block) + "), and O is divided by l once at the end" +
      (plan.kv_splits > 1 ? "; the " + num(plan.kv_splits) + " key splits merge their (O, m, l) partials with the same rescaling" : "") +
      "; a row with no visible key gives 0 and lse -inf, never NaN.";

  const BoundaryTraffic& off = t.levels.back();
  const double kv_head = double(pr.seqlen_k) * double(pr.head_dim + pr.head_dim_v) * dtype_bytes(pr.kv_dtype);
  const double s_head = double(pr.seqlen_q) * double(pr.seqlen_k) * 4.0;
  const MemoryLevel& last_cache = hw.levels[hw.levels.size() - 2];
  // The standard path's S stays on chip when it fits the last cache: on a CPU one head's S per
  // worker sharing it; on a GPU (one kernel per pass over all heads) the whole S in one partition.
  const double cache_share =
      gpu ? double(last_cache.size_bytes) / std::max(1, last_cache.partitions)
          : double(last_cache.size_bytes) / std::max(1, std::min(last_cache.shared_by, plan.workers));
  const double s_needed = gpu ? s_bytes : s_head;
  // Dv multiplies per row per key block against 2 * block_kv * (D + Dv) matmul FLOPs per row.
  const double rescale_pct = 100.0 * double(pr.head_dim_v) /
                             (2.0 * double(std::max<int64_t>(1, key_block)) * double(std::max<int64_t>(1, pr.head_dim + pr.head_dim_v)));
  std::string trade = "Each unit's K/V (" + format_bytes(kv_head) + " per head) is re-read " +
                      (gpu ? std::string("from L2 into shared memory") : "from " + plan.target_level + " or beyond") +
                      " once per query block, " + num(q_blocks) + " times for " + num(rows) +
                      " rows; the forward pass recomputes nothing, but rescaling O once per key block costs " +
                      fmt("%.3g", rescale_pct) + "% on top of the matmul FLOPs. ";
  if (off.standard_bytes <= off.flash_bytes * 1.05) {
    trade += "Here the standard path moves about as few off-chip bytes (" + format_bytes(off.standard_bytes) + " vs " +
             format_bytes(off.flash_bytes) + ") because " + (gpu ? "the " : "a head's ") + format_bytes(s_needed) +
             " score matrix stays in the " +
             format_bytes(cache_share) + " " + last_cache.name + " share, and two tuned GEMMs can then beat the fused kernel.";
  } else {
    trade += std::string("The standard path would win only while ") + (gpu ? "the whole score matrix (" : "a head's score matrix (") +
             format_bytes(s_needed) + " here) fits the " + format_bytes(cache_share) + " " + last_cache.name + " share, i.e. " +
             (gpu ? "B*H*Sq*Sk <= " : "Sq*Sk <= ") + fmt("%.4g", cache_share / 4) +
             "; at this size it moves " + format_ratio(off.standard_bytes, off.flash_bytes) + " the off-chip bytes.";
  }
  o.tradeoff = trade;

  if (gpu) {
    // K/V the resident CTAs read at once: each (unit, key split) is read by its q_blocks CTAs, a
    // split covers 1 / kv_splits of a head's keys, and prefill units are query heads, G of which
    // share one kv head; never more than the problem's whole K/V.
    const int64_t group = pr.heads_kv > 0 ? std::max<int64_t>(1, pr.heads_q / pr.heads_kv) : 1;
    const bool per_q_head = plan.units == pr.batch * pr.heads_q && group > 1;
    const double resident = double(std::min<int64_t>(plan.workers, plan.work_items));
    const double unit_splits = std::ceil(resident / double(std::max<int64_t>(1, q_blocks)));
    const double active_kv = std::min(double(pr.batch * pr.heads_kv) * kv_head,
                                      std::ceil(unit_splits / double(per_q_head ? group : 1)) * kv_head /
                                          double(std::max(1, plan.kv_splits)));
    o.failureMode = "The tile needs " + format_bytes(double(plan.working_set_bytes)) + " of shared memory per block: on a GPU " +
                    "with less than that opt-in (this profile has " + format_bytes(double(plan.target_level_bytes)) +
                    ") the kernel cannot launch, and below " + format_bytes(2.0 * double(plan.working_set_bytes)) +
                    " per SM only one CTA fits and latency hiding halves; if the L2 holds less than the active heads' K/V (" +
                    format_bytes(active_kv) +
                    ", vs " + format_bytes(double(hw.levels[1].size_bytes) / std::max(1, hw.levels[1].partitions)) +
                    " per partition here) K/V is re-read from " + hw.dram().name + " per query block." +
                    (plan.supported ? "" : " This shape is not supported by the CUDA build: " + plan.rationale);
  } else if (cpu_decode) {
    // Each core keeps at most 16 L1 fill buffers of lines in flight, and every K/V line of a
    // decode is a software prefetch holding one for a full memory latency: 16 x 64 B / ~110 ns is
    // ~9.3 GB/s per core (bench/results/cpu-decode.md: one thread decoded 9.3 GB/s, two cores
    // at GQA 4 reached 72-81% of a plain read of 0.5-1 GiB caches, sixteen 95-101%).
    constexpr double kCoreStreamGbs = 16 * 64 / 110.0;
    const double kv_bytes = double(pr.batch * pr.heads_kv) * kv_head;
    const double bw = hw.dram().bandwidth_gbs;
    std::string fm = "Decode does " + fmt("%.3g", forward_flops(pr) / std::max(1.0, kv_bytes)) +
                     " FLOP per byte of K/V, so it is bound by " + hw.dram().name + " bandwidth, and it relies on two " +
                     "things: the prefetched next block (" + format_bytes(decode_block) + ") must wait in the " +
                     format_bytes(double(plan.target_level_bytes)) + " per-core " + plan.target_level +
                     " beside the current one, so with less than " + format_bytes(2 * decode_block) +
                     " of it free per core the lines are evicted before use and K/V crosses that boundary twice; and each " +
                     "core keeps at most 16 lines in flight (about " + fmt("%.3g", kCoreStreamGbs) +
                     " GB/s per core at ~110 ns)";
    if (bw > 0) {
      const int64_t cores_needed = int64_t(std::ceil(bw / kCoreStreamGbs));
      fm += ", so reading the " + fmt("%.4g", bw) + " GB/s of " + hw.name + " takes at least " + num(cores_needed) +
            " busy cores (this plan runs " + num(plan.workers) + ")";
    }
    o.failureMode = fm + ".";
  } else {
    // The same plan on this hardware with the target level at half the working set.
    HardwareProfile small = hw;
    const double half_ws = double(plan.working_set_bytes) / 2;
    size_t target_index = 0;
    for (size_t i = 0; i + 1 < small.levels.size(); ++i) {
      if (small.levels[i].name == plan.target_level) target_index = i;
    }
    small.levels[target_index].size_bytes = int64_t(half_ws) * small.levels[target_index].shared_by;
    const TrafficReport spilled = predict_traffic(pr, plan, small);
    const size_t boundary = std::min(target_index, t.levels.size() - 1);
    const BoundaryTraffic& spill_boundary = t.levels[boundary];
    const double spilled_bytes = spilled.levels[boundary].flash_bytes;
    o.failureMode = "The working set of " + format_bytes(double(plan.working_set_bytes)) + " assumes a " +
                    format_bytes(double(plan.target_level_bytes)) + " per-core " + plan.target_level +
                    "; if the real one is smaller than " + format_bytes(double(plan.working_set_bytes)) +
                    " (or the profile is wrong about sharing), the K/V, score and O blocks spill on every step and the " +
                    spill_boundary.name + " traffic rises from " + format_bytes(spill_boundary.flash_bytes) + " to " +
                    format_bytes(spilled_bytes) + " (this model with a " + format_bytes(half_ws) + " " + plan.target_level +
                    "); with " + num(plan.workers) + " workers the " + last_cache.name + " must also hold " +
                    format_bytes(kv_head * plan.workers) + " of K/V to read it from " + hw.dram().name + " only once.";
  }
  return o;
}

}  // namespace ioattn
