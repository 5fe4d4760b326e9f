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

namespace {

// What every paragraph of the outline reads: the plan's numbers and the prediction's.
struct OutlineFacts {
  OutlineFacts(const Problem& p, const Plan& pl, const HardwareProfile& h)
      : pr(p), plan(pl), hw(h), t(predict_traffic(p, pl, h)) {}

  const Problem& pr;
  const Plan& plan;
  const HardwareProfile& hw;
  TrafficReport t;
  bool gpu = false;
  // CPU decode mode (cpu/decode-inl.h) runs none of the packed blocks: per kv head its few query
  // rows keep fp32 Q, a 32-key score block and O, and K/V stream from the cache in 32-key blocks
  // over all kv heads, one block prefetched into L2 ahead of use.
  bool cpu_decode = false;
  int64_t rows = 0, key_block = 0, q_blocks = 0;
  double s_bytes = 0, decode_state = 0, decode_block = 0, kv_head = 0;
  std::string state_level;
};

OutlineFacts facts_of(const Problem& pr, const Plan& plan, const HardwareProfile& hw) {
  OutlineFacts f(pr, plan, hw);
  f.gpu = plan.backend == BackendKind::cuda;
  f.s_bytes = double(pr.batch * pr.heads_q) * double(pr.seqlen_q) * double(pr.seqlen_k) * 4.0;
  f.cpu_decode = !f.gpu && cpu_decode_mode(plan.rows_per_unit);
  f.rows = plan.rows_per_unit;
  f.key_block = f.cpu_decode ? cpu_decode_block_keys : plan.block_kv;
  f.decode_state =
      4.0 * double(pr.heads_kv) * double(f.rows) * double(pr.head_dim + cpu_decode_block_keys + pr.head_dim_v);
  f.decode_block = double(cpu_decode_block_bytes(pr.heads_kv, pr.head_dim, pr.head_dim_v, dtype_bytes(pr.kv_dtype)));
  f.state_level = f.decode_state <= double(hw.levels.front().size_bytes) ? hw.levels.front().name : plan.target_level;
  f.q_blocks = plan.block_q > 0 ? ceil_div(f.rows, plan.block_q) : 0;
  f.kv_head = double(pr.seqlen_k) * double(pr.head_dim + pr.head_dim_v) * dtype_bytes(pr.kv_dtype);
  return f;
}

std::string memory_traffic_text(const OutlineFacts& f) {
  const Plan& plan = f.plan;
  std::string traffic =
      "Predicted bytes per boundary on " + f.hw.name + ", flash vs standard (S and P materialized in fp32):";
  for (const BoundaryTraffic& b : f.t.levels) {
    traffic += " " + b.name + " " + format_bytes(b.flash_bytes) + " vs " + format_bytes(b.standard_bytes) + " (" +
               format_ratio(b.standard_bytes, b.flash_bytes) + ");";
  }
  traffic +=
      " the score matrix alone is " + format_bytes(f.s_bytes) + ", which flash attention never writes; it keeps " +
      (f.cpu_decode ? "each worker's " + num(f.rows) + "x" + num(cpu_decode_block_keys) +
                          " score block per kv head in " + f.state_level + " and reads every K/V byte of the cache once"
                    : std::string(f.gpu ? "each CTA's" : "each worker's") + " " + num(plan.block_q) + "x" +
                          num(plan.block_kv) + " score tile in " + plan.target_level) +
      ".";
  return traffic;
}

// What a calibration file changed and measured, or why one was not used.
std::string calibration_text(const Plan& plan) {
  if (plan.calibration.empty()) return {};
  std::string text = plan.calibrated ? " This plan is " : " This plan is cache-derived: the ";
  text += plan.calibration;
  text += '.';
  return text;
}

std::string tiling_text(const OutlineFacts& f) {
  const Problem& pr = f.pr;
  const Plan& plan = f.plan;
  if (f.cpu_decode) {
    return "decode mode (" + num(f.rows) + " query rows per kv head, at most " + num(cpu_decode_max_rows) +
           "): one task per sequence and key split runs all " + num(pr.heads_kv) +
           " kv heads, whose rows keep fp32 Q, " + "scores and O in " + format_bytes(f.decode_state) + " (" +
           f.state_level + "), and reads K and V straight from the " + std::string(dtype_name(pr.kv_dtype)) +
           " cache in " + num(cpu_decode_block_keys) + "-key blocks (" + format_bytes(f.decode_block) +
           " of K/V per block, " +
           (plan.decode_prefetch_blocks > 0 ? "the one " + num(plan.decode_prefetch_blocks) +
                                                  " ahead prefetched into " + plan.target_level + " in address order"
                                            : std::string("no software prefetch: the hardware prefetchers alone")) +
           "), with no packed copy; " + num(plan.work_items) + " tasks (kv_splits=" + num(plan.kv_splits) +
           ", splits of whole blocks) on " + num(plan.workers) + " workers. The planner's " +
           "packed blocks, block_q=" + num(plan.block_q) + " x block_kv=" + num(plan.block_kv) + " (" +
           format_bytes(double(plan.working_set_bytes)) + " of fp32 copies in the " +
           format_bytes(double(plan.target_level_bytes)) + " per-core " + plan.target_level +
           "), apply only to calls with more than " + num(cpu_decode_max_rows) + " query rows per kv head." +
           calibration_text(plan);
  }
  if (f.gpu) {
    return "block_q=" + num(plan.block_q) + ", block_kv=" + num(plan.block_kv) + " (" + num(plan.warps) + " warps, " +
           num(plan.stages) + " K/V stages, head dim padded to " + num(plan.head_dim_padded) + ") from the constexpr " +
           "tile table: the Q tile plus the K/V stages take " + format_bytes(double(plan.working_set_bytes)) +
           " of the " + format_bytes(double(plan.target_level_bytes)) + " shared memory per block, so " +
           num(plan.ctas_per_sm) + " CTAs fit per SM and " + num(plan.workers) + " of the " + num(plan.work_items) +
           " CTAs run at once on " + num(f.hw.cores) + " SMs; kv_splits=" + num(plan.kv_splits) + ".";
  }
  return "block_q=" + num(plan.block_q) + " rows x block_kv=" + num(plan.block_kv) + " keys, head dim padded to " +
         num(plan.head_dim_padded) + ": the packed fp32 Q, K, V, score and O blocks take " +
         format_bytes(double(plan.working_set_bytes)) + ", fitted to " + fmt("%.0f", kCpuCacheFill * 100) +
         "% of the " + format_bytes(double(plan.target_level_bytes)) + " per-core " + plan.target_level +
         "; both blocks are multiples of the " + num(plan.reg_rows) + "x" + num(plan.reg_cols) + " register tile; " +
         num(plan.work_items) + " tasks (kv_splits=" + num(plan.kv_splits) + ") on " + num(plan.workers) + " workers." +
         calibration_text(plan);
}

std::string stability_text(const OutlineFacts& f) {
  const Problem& pr = f.pr;
  const double scale = 1.0 / std::sqrt(double(std::max<int64_t>(pr.head_dim, 1)));
  const int64_t kv_blocks = f.key_block > 0 ? ceil_div(pr.seqlen_k, f.key_block) : 0;
  return "Scores are scaled by 1/sqrt(" + num(pr.head_dim) + ") = " + fmt("%.4g", scale) +
         " and each row keeps a running max m " +
         "over its visible keys, so every exponent is exp(s - m) <= 1 and cannot overflow, however large the " +
         std::string(dtype_name(pr.dtype)) + " inputs (up to " + dtype_range(pr.dtype) +
         "); inputs are widened to fp32 " +
         "before the dot products, and the row sum l and the O accumulator stay in fp32 over all " + num(pr.seqlen_k) +
         " keys" +
         (f.gpu ? std::string()
                : " (summed in partials of " + num(cpu_sum_chunk_keys) +
                      " keys added to the totals, so rounding grows with keys / " + num(cpu_sum_chunk_keys) +
                      ", not with keys, when one large score dominates a row)") +
         "; when the max grows, O and l are rescaled by exp(m_old - m_new) at most once per key block (" +
         num(kv_blocks) + " blocks of " + num(f.key_block) + "), and O is divided by l once at the end" +
         (f.plan.kv_splits > 1
              ? "; the " + num(f.plan.kv_splits) + " key splits merge their (O, m, l) partials with the same rescaling"
              : "") +
         "; a row with no visible key gives 0 and lse -inf, never NaN.";
}

const MemoryLevel& last_cache_of(const HardwareProfile& hw) { return hw.levels[hw.levels.size() - 2]; }

std::string tradeoff_text(const OutlineFacts& f) {
  const Problem& pr = f.pr;
  const Plan& plan = f.plan;
  const bool gpu = f.gpu;
  const BoundaryTraffic& off = f.t.levels.back();
  const double s_head = double(pr.seqlen_q) * double(pr.seqlen_k) * 4.0;
  const MemoryLevel& last_cache = last_cache_of(f.hw);
  // The standard path's S stays on chip when it fits the last cache: on a CPU one head's S per
  // worker sharing it; on a GPU (one kernel per pass over all heads) the whole S in one partition.
  const double cache_share =
      gpu ? double(last_cache.size_bytes) / std::max(1, last_cache.partitions)
          : double(last_cache.size_bytes) / std::max(1, std::min(last_cache.shared_by, plan.workers));
  const double s_needed = gpu ? f.s_bytes : s_head;
  // Dv multiplies per row per key block against 2 * block_kv * (D + Dv) matmul FLOPs per row.
  const double rescale_pct =
      100.0 * double(pr.head_dim_v) /
      (2.0 * double(std::max<int64_t>(1, f.key_block)) * double(std::max<int64_t>(1, pr.head_dim + pr.head_dim_v)));
  std::string trade = "Each unit's K/V (" + format_bytes(f.kv_head) + " per head) is re-read " +
                      (gpu ? std::string("from L2 into shared memory") : "from " + plan.target_level + " or beyond") +
                      " once per query block, " + num(f.q_blocks) + " times for " + num(f.rows) +
                      " rows; the forward pass recomputes nothing, but rescaling O once per key block costs " +
                      fmt("%.3g", rescale_pct) + "% on top of the matmul FLOPs. ";
  if (off.standard_bytes <= off.flash_bytes * 1.05) {
    trade += "Here the standard path moves about as few off-chip bytes (" + format_bytes(off.standard_bytes) + " vs " +
             format_bytes(off.flash_bytes) + ") because " + (gpu ? "the " : "a head's ") + format_bytes(s_needed) +
             " score matrix stays in the " + format_bytes(cache_share) + " " + last_cache.name +
             " share, and two tuned GEMMs can then beat the fused kernel.";
  } else {
    trade += std::string("The standard path would win only while ") +
             (gpu ? "the whole score matrix (" : "a head's score matrix (") + format_bytes(s_needed) +
             " here) fits the " + format_bytes(cache_share) + " " + last_cache.name + " share, i.e. " +
             (gpu ? "B*H*Sq*Sk <= " : "Sq*Sk <= ") + fmt("%.4g", cache_share / 4) + "; at this size it moves " +
             format_ratio(off.standard_bytes, off.flash_bytes) + " the off-chip bytes.";
  }
  return trade;
}

std::string gpu_failure_text(const OutlineFacts& f) {
  const Problem& pr = f.pr;
  const Plan& plan = f.plan;
  const HardwareProfile& hw = f.hw;
  // K/V the resident CTAs read at once: each (unit, key split) is read by its q_blocks CTAs, a
  // split covers 1 / kv_splits of a head's keys, and prefill units are query heads, G of which
  // share one kv head; never more than the problem's whole K/V.
  const int64_t group = pr.heads_kv > 0 ? std::max<int64_t>(1, pr.heads_q / pr.heads_kv) : 1;
  const bool per_q_head = plan.units == pr.batch * pr.heads_q && group > 1;
  const double resident = double(std::min<int64_t>(plan.workers, plan.work_items));
  const double unit_splits = std::ceil(resident / double(std::max<int64_t>(1, f.q_blocks)));
  const double active_kv =
      std::min(double(pr.batch * pr.heads_kv) * f.kv_head, std::ceil(unit_splits / double(per_q_head ? group : 1)) *
                                                               f.kv_head / double(std::max(1, plan.kv_splits)));
  return "The tile needs " + format_bytes(double(plan.working_set_bytes)) + " of shared memory per block: on a GPU " +
         "with less than that opt-in (this profile has " + format_bytes(double(plan.target_level_bytes)) +
         ") the kernel cannot launch, and below " + format_bytes(2.0 * double(plan.working_set_bytes)) +
         " per SM only one CTA fits and latency hiding halves; if the L2 holds less than the active heads' K/V (" +
         format_bytes(active_kv) + ", vs " +
         format_bytes(double(hw.levels[1].size_bytes) / std::max(1, hw.levels[1].partitions)) +
         " per partition here) K/V is re-read from " + hw.dram().name + " per query block." +
         (!plan.supported             ? " This shape is not supported by the CUDA build: " + plan.rationale
          : plan.kernel == "portable" ? " This shape runs on the portable kernel, not on these tiles: " + plan.rationale
                                      : "");
}

std::string cpu_decode_failure_text(const OutlineFacts& f) {
  const Plan& plan = f.plan;
  const HardwareProfile& hw = f.hw;
  // Each core keeps at most 16 L1 fill buffers of lines in flight, and every K/V line of a
  // decode is a software prefetch holding one for a full memory latency: 16 x 64 B / ~110 ns is
  // ~9.3 GB/s per core (bench/results/cpu-decode.md has the measured per-core and paired reads).
  constexpr double kCoreStreamGbs = 16 * 64 / 110.0;
  const double kv_bytes = double(f.pr.batch * f.pr.heads_kv) * f.kv_head;
  const double bw = hw.dram().bandwidth_gbs;
  std::string fm =
      "Decode does " + fmt("%.3g", forward_flops(f.pr) / std::max(1.0, kv_bytes)) +
      " FLOP per byte of K/V, so it is bound by " + hw.dram().name + " bandwidth, and it relies on two " +
      "things: the prefetched next block (" + format_bytes(f.decode_block) + ") must wait in the " +
      format_bytes(double(plan.target_level_bytes)) + " per-core " + plan.target_level +
      " beside the current one, so with less than " + format_bytes(2 * f.decode_block) +
      " of it free per core the lines are evicted before use and K/V crosses that boundary twice; and each " +
      "core keeps at most 16 lines in flight (about " + fmt("%.3g", kCoreStreamGbs) + " GB/s per core at ~110 ns)";
  if (bw > 0) {
    const int64_t cores_needed = int64_t(std::ceil(bw / kCoreStreamGbs));
    fm += ", so reading the " + fmt("%.4g", bw) + " GB/s of " + hw.name + " takes at least " + num(cores_needed) +
          " busy cores (this plan runs " + num(plan.workers) + ")";
  }
  return fm + ".";
}

std::string cpu_failure_text(const OutlineFacts& f) {
  const Plan& plan = f.plan;
  // The same plan on this hardware with the target level at half the working set.
  HardwareProfile small = f.hw;
  const double half_ws = double(plan.working_set_bytes) / 2;
  size_t target_index = 0;
  for (size_t i = 0; i + 1 < small.levels.size(); ++i) {
    if (small.levels[i].name == plan.target_level) target_index = i;
  }
  small.levels[target_index].size_bytes = int64_t(half_ws) * small.levels[target_index].shared_by;
  const TrafficReport spilled = predict_traffic(f.pr, plan, small);
  const size_t boundary = std::min(target_index, f.t.levels.size() - 1);
  const BoundaryTraffic& spill_boundary = f.t.levels[boundary];
  const double spilled_bytes = spilled.levels[boundary].flash_bytes;
  return "The working set of " + format_bytes(double(plan.working_set_bytes)) + " assumes a " +
         format_bytes(double(plan.target_level_bytes)) + " per-core " + plan.target_level +
         "; if the real one is smaller than " + format_bytes(double(plan.working_set_bytes)) +
         " (or the profile is wrong about sharing), the K/V, score and O blocks spill on every step and the " +
         spill_boundary.name + " traffic rises from " + format_bytes(spill_boundary.flash_bytes) + " to " +
         format_bytes(spilled_bytes) + " (this model with a " + format_bytes(half_ws) + " " + plan.target_level +
         "); with " + num(plan.workers) + " workers the " + last_cache_of(f.hw).name + " must also hold " +
         format_bytes(f.kv_head * plan.workers) + " of K/V to read it from " + f.hw.dram().name + " only once.";
}

}  // namespace

DesignOutline designOutline(const Problem& pr, const Plan& plan, const HardwareProfile& hw) {
  const OutlineFacts f = facts_of(pr, plan, hw);
  DesignOutline o;
  o.memoryTraffic = memory_traffic_text(f);
  o.tiling = tiling_text(f);
  o.numericalStability = stability_text(f);
  o.tradeoff = tradeoff_text(f);
  o.failureMode = f.gpu ? gpu_failure_text(f) : f.cpu_decode ? cpu_decode_failure_text(f) : cpu_failure_text(f);
  return o;
}

}  // namespace ioattn
