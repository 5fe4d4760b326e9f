#include "common/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "common/calibration.h"
#include "common/cpu_tiles.h"
#include "common/gpu_tiles.h"
#include "common/int_math.h"

namespace ioattn {
namespace {

// Every table entry must fit Hopper's opt-in maximum per thread block, or the kernel
// instantiated from the table could not launch on the machine we build for.
constexpr int64_t kMaxSmemPerBlock = kGpuSmemPerBlockMax;
constexpr int kGpuHeadDims[] = {64, 96, 128, 256};
constexpr bool gpu_table_fits() {
  for (int d : kGpuHeadDims) {
    const GpuTile t = gpu_tile(d);
    if (!t.supported || gpu_tile_smem_bytes(t, d) > kMaxSmemPerBlock) return false;
    if (gpu_tile_smem_bytes(gpu_decode_tile(d), d) > kMaxSmemPerBlock) return false;
    const GpuTileSm90 h = gpu_tile_sm90(d);
    if (h.supported && gpu_tile_sm90_smem_bytes(h, d) > kMaxSmemPerBlock) return false;
  }
  return true;
}
static_assert(gpu_table_fits(), "a GPU tile table entry needs more than 227 KiB of shared memory per block");

// 128 keys per step: the per-block rescale of the O accumulator (Dv FLOP per row) is then
// Dv / (2 * 128 * (D + Dv)) = 1/512 of the block's FLOPs, and a longer key block would only
// take cache from block_q, whose size divides the K/V re-reads.
constexpr int64_t kKvBlockTarget = 128;
static_assert(kKvBlockTarget == 128, "plan_cpu's rationale names the 128-key block");
// When the query rows are exhausted, leftover cache goes to longer key blocks, up to 1024 keys:
// beyond that the rescale is already negligible and a longer block only delays the first exp.
constexpr int64_t kKvBlockMax = 1024;
// A key-axis split (flash-decoding) keeps at least 4 key blocks, so the (O, m, l) partial merge
// (one O row per split) stays small next to the split's own work.
constexpr int64_t kMinKvBlocksPerSplit = 4;
// FlashAttention-style CUDA kernels hold the O accumulator and score fragments in registers and
// compile to the 255-register ceiling; that bounds resident CTAs as much as shared memory does.
constexpr int kGpuRegsPerThread = 255;
constexpr int kGpuMaxThreadsPerSm = 2048;
constexpr int64_t kGpuSmemReservedPerBlock = 1024;  // the runtime's per-CTA reservation (sm_80+)

std::string kib(int64_t bytes) {
  char buf[64];
  if (bytes >= (int64_t(1) << 20) && bytes % (int64_t(1) << 20) == 0) {
    std::snprintf(buf, sizeof buf, "%lld MiB", (long long)(bytes >> 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(bytes) / 1024.0);
  }
  return buf;
}

// kv_splits depends on the problem and the profile's core/SM count only, never on the thread
// count, so the merge order (and so every output bit) is the same for any number of threads.
// most: the largest split count the key axis allows (from its block size).
int split_keys(int64_t tasks, int64_t cores, int64_t seqlen_k, int64_t most) {
  if (tasks <= 0 || tasks >= cores || seqlen_k <= 0) return 1;
  return int(std::min(ceil_div(cores, tasks), std::max<int64_t>(1, most)));
}
int64_t most_block_splits(int64_t seqlen_k, int64_t block_kv) {
  return ceil_div(seqlen_k, block_kv) / kMinKvBlocksPerSplit;
}

}  // namespace

int64_t cpu_working_set_bytes(int64_t block_q, int64_t block_kv, int64_t dp, int64_t dvp) {
  return 4 * (block_q * dp + block_kv * dp + block_kv * dvp + block_q * block_kv + block_q * dvp) + 8 * block_q;
}

PaperBlocks flash1_paper_blocks(int64_t sram_elements, int64_t head_dim) {
  const int64_t bc = ceil_div(sram_elements, 4 * head_dim);
  return {std::min(bc, head_dim), bc};
}

const MemoryLevel& cpu_target_level(const HardwareProfile& hw) {
  if (const MemoryLevel* l2 = hw.level("L2")) return *l2;
  // No level named L2: the second level if it is a cache, else the first.
  return hw.levels.size() > 2 ? hw.levels[1] : hw.levels.front();
}

int64_t cpu_target_capacity(const HardwareProfile& hw) {
  const MemoryLevel& l = cpu_target_level(hw);
  return l.size_bytes / std::max(1, l.shared_by);
}

int64_t cpu_tasks(const Problem& pr, const Plan& plan) {
  // Decode rows (cpu_decode_max_rows) run one task per (sequence, split) over all kv heads, so
  // only the batch counts toward filling the cores.
  if (cpu_decode_mode(plan.rows_per_unit)) return pr.batch;
  const int64_t group = pr.heads_kv > 0 ? pr.heads_q / pr.heads_kv : 1;
  const int64_t positions = std::max<int64_t>(1, plan.block_q / std::max<int64_t>(group, 1));
  return plan.rows_per_unit > 0 ? plan.units * ceil_div(pr.seqlen_q, positions) : 0;
}

namespace {

void set_cpu_workers(Plan& plan, int64_t tasks, int threads) {
  plan.work_items = tasks * plan.kv_splits;
  plan.workers = int(std::max<int64_t>(1, std::min<int64_t>(threads, plan.work_items)));
}

std::string times(double planned_ms, double best_ms) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.3g ms against %.3g ms for the cache-derived plan (%.2fx)", best_ms, planned_ms,
                planned_ms / best_ms);
  return buf;
}

std::string factor(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "x%g", f);
  return buf;
}

// What plan_cpu's block rules need to re-derive a plan around calibrated blocks.
struct CpuPlanFrame {
  int64_t group, row_step, key_step, rows_cap, keys_cap, cores, dvp;
  int threads;
  PlanText text;
};

int64_t nearest_multiple(double x, int64_t step, int64_t cap) {
  return std::clamp<int64_t>(std::llround(x / double(step)) * step, step, std::max(step, cap));
}

// The cache-derived prefill blocks scaled by the measured factors. A larger block_q that would
// leave cores without a query block the plan gave them keeps the planned one.
void calibrate_prefill(Plan& plan, const Problem& pr, const PrefillCalibration& e, const CpuPlanFrame& f,
                       const std::string& file) {
  const int64_t planned_tasks = cpu_tasks(pr, plan);
  Plan tuned = plan;
  tuned.block_q = int(nearest_multiple(plan.block_q * e.block_q_factor, f.row_step, f.rows_cap));
  tuned.block_kv = int(nearest_multiple(plan.block_kv * e.block_kv_factor, f.key_step, f.keys_cap));
  if (tuned.block_q > plan.block_q && cpu_tasks(pr, tuned) < std::min(f.cores, planned_tasks))
    tuned.block_q = plan.block_q;
  tuned.working_set_bytes = cpu_working_set_bytes(tuned.block_q, tuned.block_kv, plan.head_dim_padded, f.dvp);
  const int64_t tasks = cpu_tasks(pr, tuned);
  tuned.kv_splits = split_keys(tasks, f.cores, pr.seqlen_k, most_block_splits(pr.seqlen_k, tuned.block_kv));
  set_cpu_workers(tuned, tasks, f.threads);
  tuned.calibrated = true;
  if (f.text == PlanText::full)
    tuned.calibration = "calibrated (" + file + "): block_q " + factor(e.block_q_factor) + ", block_kv " +
                        factor(e.block_kv_factor) + " of the cache-derived " + std::to_string(plan.block_q) + "x" +
                        std::to_string(plan.block_kv) + " gives " + std::to_string(tuned.block_q) + "x" +
                        std::to_string(tuned.block_kv) + "; at D=" + std::to_string(e.head_dim) + " (" +
                        std::to_string(e.planned_block_q) + "x" + std::to_string(e.planned_block_kv) +
                        " planned) the tuning run measured " + times(e.planned_ms, e.best_ms);
  plan = std::move(tuned);
}

// Decode's measured prefetch distance, and more key splits where the plan splits at all.
void calibrate_decode(Plan& plan, const Problem& pr, const DecodeCalibration& e, const CpuPlanFrame& f,
                      const std::string& file) {
  plan.calibrated = true;
  plan.decode_prefetch_blocks = e.prefetch_blocks;
  if (e.split_factor > 1 && plan.kv_splits > 1) {
    plan.kv_splits = int(std::min<int64_t>(int64_t(plan.kv_splits) * e.split_factor,
                                           std::max<int64_t>(1, pr.seqlen_k / cpu_decode_min_split_keys)));
    set_cpu_workers(plan, cpu_tasks(pr, plan), f.threads);
  }
  if (f.text == PlanText::none) return;
  char gbs[64];
  std::snprintf(gbs, sizeof gbs, " (%.1f GB/s against %.1f)", e.best_gbs, e.planned_gbs);
  plan.calibration = "calibrated (" + file + "): decode prefetch " + std::to_string(e.prefetch_blocks) +
                     " block(s) ahead, key splits x" + std::to_string(e.split_factor) + "; for a " +
                     dtype_name(e.kv_dtype) + " cache the tuning run measured " + times(e.planned_ms, e.best_ms) + gbs;
}

// plan_cpu's sentence for its cache-derived blocks: what fits where, and why these sizes.
std::string cpu_rationale(const Plan& plan, const Problem& pr, int64_t dp, int64_t group, int cores, const char* why,
                          bool grew) {
  // Decode mode never runs the packed blocks sized above (they serve calls with more query rows
  // per kv head); the plan keeps them and says what decode streams instead.
  const bool decode = cpu_decode_mode(plan.rows_per_unit);
  const int64_t decode_block_bytes =
      cpu_decode_block_bytes(pr.heads_kv, pr.head_dim, pr.head_dim_v, dtype_bytes(pr.kv_dtype));
  const std::string bq = std::to_string(plan.block_q), bkv = std::to_string(plan.block_kv);
  std::string text = (decode ? "decode: one task per sequence and key split reads K/V straight from the cache in " +
                                   std::to_string(cpu_decode_block_keys) + "-key blocks over all " +
                                   std::to_string(pr.heads_kv) + " kv heads (" + kib(decode_block_bytes) +
                                   " of K/V per block, prefetched into L2), the " + std::to_string(group) +
                                   " query heads of each kv head together; for calls with more query rows, the "
                                   "packed blocks: "
                             : std::string()) +
                     "working set " + kib(plan.working_set_bytes) + " (Q " + bq + "x" + std::to_string(dp) + ", K/V " +
                     bkv + " keys, scores " + bq + "x" + bkv + ", fp32) fits " +
                     std::to_string(int(kCpuCacheFill * 100)) + "% of the " + kib(plan.target_level_bytes) +
                     " per-core " + plan.target_level + "; " + why +
                     (grew ? ", and the leftover cache lengthens block_kv" : "") +
                     (plan.kv_splits > 1 ? "; the key axis splits " + std::to_string(plan.kv_splits) + " ways so all " +
                                               std::to_string(cores) + " cores have work"
                                         : "");
  if (plan.working_set_bytes > plan.target_level_bytes)
    text += "; even the smallest tile overflows " + plan.target_level + " on this profile";
  return text;
}

}  // namespace

Plan plan_cpu(const Problem& pr, const HardwareProfile& hw, int threads, PlanText text) {
  Plan plan;
  plan.backend = BackendKind::cpu;
  plan.hardware = hw.name;
  const int lanes = std::max(4, hw.simd_bits / 32);
  const CpuRegisterTile tile = cpu_register_tile(hw.simd_bits);
  plan.reg_rows = tile.rows;
  plan.reg_cols = tile.vecs * lanes;
  const int64_t dp = round_up(std::max<int64_t>(pr.head_dim, 1), lanes);
  const int64_t dvp = round_up(std::max<int64_t>(pr.head_dim_v, 1), lanes);
  plan.head_dim_padded = int(dp);
  plan.decode_prefetch_blocks = cpu_decode_default_prefetch_blocks;

  const MemoryLevel& target = cpu_target_level(hw);
  plan.target_level = target.name;
  plan.target_level_bytes = cpu_target_capacity(hw);
  const int64_t budget = int64_t(kCpuCacheFill * double(plan.target_level_bytes));

  // GQA packing: the G query heads of one KV head share its K/V blocks, so they are rows of one
  // unit; decode (Sq = 1) then still fills the register tile's rows.
  const int64_t group = pr.heads_kv > 0 ? pr.heads_q / pr.heads_kv : 1;
  plan.units = pr.batch * pr.heads_kv;
  plan.rows_per_unit = group * pr.seqlen_q;
  // The kernel stacks whole groups of G heads per query position into a tile's rows, so block_q
  // steps by lcm(reg_rows, G): a multiple of the register tile that is also whole positions.
  const int64_t rr = std::lcm<int64_t>(plan.reg_rows, std::max<int64_t>(group, 1)), rc = plan.reg_cols;
  const int64_t rows_cap = round_up(std::max<int64_t>(plan.rows_per_unit, 1), rr);
  const int64_t keys_cap = round_up(std::max<int64_t>(pr.seqlen_k, 1), rc);
  const int cores = std::max(1, hw.cores);
  // With fewer units than cores, cap block_q so each unit offers ceil(cores / units) query blocks.
  int64_t q_limit = rows_cap;
  if (plan.units > 0 && plan.units < cores) {
    q_limit = std::min(q_limit, round_up(ceil_div(rows_cap, ceil_div(cores, plan.units)), rr));
  }

  // ws(bq, bkv) is linear in each block: solve for the largest multiple of the register tile.
  auto max_bq = [&](int64_t bkv) {
    const int64_t fixed = 4 * bkv * (dp + dvp), per_row = 4 * (dp + bkv + dvp) + 8;
    return budget > fixed ? (budget - fixed) / per_row / rr * rr : 0;
  };
  auto max_bkv = [&](int64_t bq) {
    const int64_t fixed = bq * (4 * (dp + dvp) + 8), per_key = 4 * (dp + dvp + bq);
    return budget > fixed ? (budget - fixed) / per_key / rc * rc : 0;
  };
  int64_t bkv = std::min(keys_cap, std::max(rc, kKvBlockTarget / rc * rc));
  int64_t bq;
  // Why these blocks, as literals: the text is assembled only for reports (PlanText::full).
  const char* why;
  bool grew = false;
  if (max_bq(bkv) < rr) {
    // Not even one register-tile of rows fits next to a full key block: shorten the key block.
    bq = rr;
    bkv = std::max(rc, std::min(bkv, max_bkv(bq)));
    why = "the cache is too small for a 128-key block at this head dim, so block_kv shrinks";
  } else {
    bq = std::min(q_limit, max_bq(bkv));
    why = bq == q_limit ? (q_limit < rows_cap ? "block_q is capped so that every core gets a query block"
                                              : "block_q covers all the rows of a unit")
                        : "block_q is as large as fits, minimizing K/V re-reads";
    if (bq == q_limit) {
      // Growth stops where the key axis could no longer give every idle core a split of
      // kMinKvBlocksPerSplit blocks (a limit from the problem and the core count only).
      int64_t grow_limit = std::max(kKvBlockMax / rc * rc, bkv);
      const int64_t tasks = plan.units * ceil_div(pr.seqlen_q, std::max<int64_t>(1, bq / std::max<int64_t>(group, 1)));
      if (tasks > 0 && tasks < cores) {
        const int64_t want = ceil_div(cores, tasks);
        grow_limit = std::max(bkv, std::min(grow_limit, ceil_div(pr.seqlen_k, kMinKvBlocksPerSplit * want) / rc * rc));
      }
      const int64_t grown = std::min({keys_cap, grow_limit, max_bkv(bq)});
      if (grown > bkv) {
        bkv = grown;
        grew = true;
      }
    }
  }
  plan.block_q = int(bq);
  plan.block_kv = int(bkv);
  plan.working_set_bytes = cpu_working_set_bytes(bq, bkv, dp, dvp);

  // Decode's splits are cut in its own 32-key blocks (never block_kv's, which only the packed
  // path uses).
  const bool decode = cpu_decode_mode(plan.rows_per_unit);
  const int64_t tasks = cpu_tasks(pr, plan);
  plan.kv_splits = split_keys(tasks, cores, pr.seqlen_k,
                              decode ? pr.seqlen_k / cpu_decode_min_split_keys : most_block_splits(pr.seqlen_k, bkv));
  set_cpu_workers(plan, tasks, threads > 0 ? threads : cores);

  const int64_t dmax = std::max(pr.head_dim, pr.head_dim_v);
  plan.supported = dmax <= cpu_max_head_dim;
  if (text == PlanText::full) {
    plan.rationale = cpu_rationale(plan, pr, dp, group, cores, why, grew);
    if (!plan.supported)
      plan.rationale += "; head dim " + std::to_string(dmax) + " is past the CPU kernels' 1.." +
                        std::to_string(cpu_max_head_dim) +
                        ", so the backend reports unsupported; figures are what such a kernel would need";
    plan.calibration = hw.calibration_note;
  }
  if (hw.calibration) {
    const CpuPlanFrame frame{group, rr, rc, rows_cap, keys_cap, cores, dvp, threads > 0 ? threads : cores, text};
    if (!decode) {
      if (const PrefillCalibration* e = hw.calibration->prefill_for(pr.head_dim))
        calibrate_prefill(plan, pr, *e, frame, hw.calibration->file);
    } else if (const DecodeCalibration* e = hw.calibration->decode_for(pr.kv_dtype)) {
      calibrate_decode(plan, pr, *e, frame, hw.calibration->file);
    }
  }
  return plan;
}

namespace {

// The sm_90a prefill's plan (gpu/sm90/, tile table gpu_tile_sm90): a compute capability 9.0
// profile and a head dim the kernel instantiates. A problem carries its shape only, so requests
// the kernel leaves to the sm_80 one (varlen, paged: gpu/forward.cu's hopper_covers) plan as
// their dense shape would.
bool plans_sm90(const Problem& pr, const HardwareProfile& hw) {
  const GpuTileSm90 t = gpu_tile_sm90(int(pr.head_dim));
  return hw.compute_capability == 90 && pr.dtype != DType::f32 && pr.head_dim == pr.head_dim_v && t.supported &&
         gpu_tile_sm90_smem_bytes(t, int(pr.head_dim)) <= hw.smem_per_block_bytes;
}

// One CTA per (batch, q head, 128-row query block) of a producer and two consumer warpgroups,
// whose registers (setmaxnreg hands the producer's to the consumers) fill the SM's file: the
// launch bound caps 384 threads at 168 registers each, 64512 of 65536.
Plan plan_gpu_sm90(const Problem& pr, const HardwareProfile& hw) {
  constexpr int kRegsPerThread = 168;
  const int d = int(pr.head_dim);
  const GpuTileSm90 t = gpu_tile_sm90(d);
  Plan plan;
  plan.backend = BackendKind::cuda;
  plan.hardware = hw.name;
  plan.kernel = "sm90";
  plan.reg_rows = 64;  // wgmma m64: the rows of one consumer warpgroup
  plan.reg_cols = t.block_kv;
  plan.block_q = t.block_q;
  plan.block_kv = t.block_kv;
  plan.warps = 4 * (t.consumer_wgs + 1);
  plan.stages = t.stages;
  plan.head_dim_padded = d;
  plan.working_set_bytes = gpu_tile_sm90_smem_bytes(t, d);
  plan.target_level = "smem";
  plan.target_level_bytes = hw.smem_per_block_bytes;
  const int threads = plan.warps * 32;
  const int64_t by_smem = hw.levels.front().size_bytes / (plan.working_set_bytes + kGpuSmemReservedPerBlock);
  const int64_t by_regs = hw.regs_per_sm > 0 ? hw.regs_per_sm / (threads * kRegsPerThread) : 1;
  plan.ctas_per_sm = int(std::max<int64_t>(1, std::min({by_smem, int64_t(kGpuMaxThreadsPerSm / threads), by_regs})));
  plan.units = pr.batch * pr.heads_q;
  plan.rows_per_unit = pr.seqlen_q;
  plan.kv_splits = 1;
  plan.work_items = plan.units * (pr.seqlen_q > 0 ? ceil_div(pr.seqlen_q, plan.block_q) : 0);
  plan.workers = int(std::max<int64_t>(1, std::min<int64_t>(int64_t(hw.cores) * plan.ctas_per_sm, plan.work_items)));
  plan.rationale = "sm_90a warp-specialized prefill: tile " + std::to_string(plan.block_q) + "x" +
                   std::to_string(plan.block_kv) + " from the constexpr table (a TMA producer warpgroup and " +
                   std::to_string(t.consumer_wgs) + " wgmma consumer warpgroups of 64 rows, " +
                   std::to_string(t.stages) + " K/V stages) needs " + kib(plan.working_set_bytes) + " of the " +
                   kib(plan.target_level_bytes) + " shared memory per block, " + std::to_string(plan.ctas_per_sm) +
                   " CTA per SM (its 384 threads hold the register file)";
  return plan;
}

}  // namespace

Plan plan_gpu(const Problem& pr, const HardwareProfile& hw) {
  const int64_t group_rows = pr.heads_kv > 0 ? std::max<int64_t>(1, pr.heads_q / pr.heads_kv) : 1;
  if (plans_sm90(pr, hw) && !gpu_decode_rows(group_rows, pr.seqlen_q)) return plan_gpu_sm90(pr, hw);
  Plan plan;
  plan.backend = BackendKind::cuda;
  plan.hardware = hw.name;
  plan.reg_rows = 16;  // mma.sync m16n8k16: 16 query rows per warp
  plan.reg_cols = 8;
  const int64_t dmax = std::max(pr.head_dim, pr.head_dim_v);
  int dpad = 0;
  for (int d : kGpuHeadDims) {
    if (d >= dmax) {
      dpad = d;
      break;
    }
  }
  GpuTile t{};
  std::string why;
  // The tensor-core kernels take f16 and bf16 operands only (gpu/forward.cu's choose_path).
  const bool f32 = pr.dtype == DType::f32;
  const bool exact = !f32 && pr.head_dim == pr.head_dim_v && gpu_tile(int(pr.head_dim)).supported;
  if (dpad > 0) {
    t = gpu_tile(dpad);
  } else {
    // Beyond the table: the 256 tile with the head dim rounded to 64, shrunk below to fit.
    dpad = int(round_up(dmax, 64));
    t = gpu_tile(256);
  }
  // f32 and head dims without a tile run on the portable kernel, up to its register limit.
  plan.supported = dmax <= kGpuPortableMaxHeadDim;
  // Few query rows per kv head (decode, speculative verification) run the split-KV decode
  // kernel, whose tile packs the G query heads of one kv head (common/gpu_tiles.h).
  const int64_t group = pr.heads_kv > 0 ? std::max<int64_t>(1, pr.heads_q / pr.heads_kv) : 1;
  const bool decode = exact && gpu_decode_rows(group, pr.seqlen_q);
  if (decode) t = gpu_decode_tile(dpad);
  plan.kernel = !exact ? "portable" : decode ? "decode" : "sm80";
  if (!exact) {
    why =
        (f32 ? std::string("f32 has no tensor-core kernel (its MMAs take f16 or bf16)")
             : "head dim " + std::to_string(pr.head_dim) +
                   (pr.head_dim_v != pr.head_dim ? "/" + std::to_string(pr.head_dim_v) : "") +
                   " has no tensor-core tile (table: 64, 96, 128, 256)") +
        ", so " +
        (plan.supported ? "the portable kernel runs it (one warp per query row, each row re-reading its keys "
                          "from L2, no shared-memory tile); the blocks and figures are the tensor-core tiling's "
                          "at D padded to " +
                              std::to_string(dpad) + ", which that kernel does not have"
                        : "and it is past the portable kernel's " + std::to_string(kGpuPortableMaxHeadDim) +
                              ", the backend reports unsupported; figures are for D padded to " + std::to_string(dpad));
  }
  const int64_t smem_block = std::max<int64_t>(hw.smem_per_block_bytes, 1);
  if (gpu_tile_smem_bytes(t, dpad) > smem_block) {
    // The dispatch then falls back to the portable kernel (gpu/forward.cu's choose_path).
    plan.kernel = "portable";
    why += std::string(why.empty() ? "" : "; ") + "the table's tile needs " + kib(gpu_tile_smem_bytes(t, dpad)) +
           " of shared memory, more than this GPU's " + kib(smem_block) +
           " per block, so the portable kernel runs it; figures are for a reduced tile";
    t.stages = 1;
    while (gpu_tile_smem_bytes(t, dpad) > smem_block && t.block_kv > 16) t.block_kv /= 2;
    while (gpu_tile_smem_bytes(t, dpad) > smem_block && t.block_q > 16) t.block_q /= 2;
  }
  plan.block_q = t.block_q;
  plan.block_kv = t.block_kv;
  plan.warps = t.warps;
  plan.stages = t.stages;
  plan.head_dim_padded = dpad;
  plan.working_set_bytes = gpu_tile_smem_bytes(t, dpad);
  plan.target_level = "smem";
  plan.target_level_bytes = hw.smem_per_block_bytes;

  const int64_t smem_sm = hw.levels.front().size_bytes;
  const int threads_per_cta = t.warps * 32;
  const int64_t by_smem = smem_sm / (plan.working_set_bytes + kGpuSmemReservedPerBlock);
  const int64_t by_threads = kGpuMaxThreadsPerSm / threads_per_cta;
  const int64_t by_regs = hw.regs_per_sm > 0 ? hw.regs_per_sm / (threads_per_cta * kGpuRegsPerThread) : by_threads;
  plan.ctas_per_sm = int(std::max<int64_t>(1, std::min({by_smem, by_threads, by_regs})));

  // Prefill: one CTA per (batch, q head, query block), as in FlashAttention-2. Decode: one CTA
  // per (batch, kv head) holding all its G x Sq query rows, so the split fills the SMs from
  // batch x kv heads.
  plan.units = decode ? pr.batch * pr.heads_kv : pr.batch * pr.heads_q;
  plan.rows_per_unit = decode ? group * pr.seqlen_q : pr.seqlen_q;
  const int64_t q_blocks = pr.seqlen_q > 0 ? (decode ? 1 : ceil_div(pr.seqlen_q, plan.block_q)) : 0;
  const int64_t tasks = plan.units * q_blocks;
  const int64_t slots = int64_t(hw.cores) * plan.ctas_per_sm;
  if (decode) {
    // Decode streams K/V at the rate the resident CTAs keep bytes in flight: on the H200 each
    // CTA's two 32 KiB tiles ahead sustained ~16 GB/s, at 192 CTAs as at 256, so the keys split
    // into as many runs as fill every resident slot in one wave (floor: a second, partial wave
    // would leave most SMs idle at its end).
    const int64_t most = std::max<int64_t>(1, most_block_splits(pr.seqlen_k, plan.block_kv));
    plan.kv_splits = tasks <= 0 || tasks >= slots || pr.seqlen_k <= 0 ? 1 : int(std::min(slots / tasks, most));
  } else {
    // The prefill kernel (gpu/sm80/flash_fwd.cuh) has no key split: one CTA per query block
    // walks all its keys, however few CTAs that leaves the SMs.
    plan.kv_splits = 1;
  }
  plan.work_items = tasks * plan.kv_splits;
  plan.workers = int(std::max<int64_t>(1, std::min<int64_t>(slots, plan.work_items)));

  plan.rationale =
      std::string(decode ? "split-KV decode, the " + std::to_string(group) + " query heads of a kv head packed; "
                         : "") +
      "tile " + std::to_string(plan.block_q) + "x" + std::to_string(plan.block_kv) + " from the constexpr table (" +
      std::to_string(t.warps) + " warps, " + std::to_string(t.stages) + " K/V stages) needs " +
      kib(plan.working_set_bytes) + " of the " + kib(plan.target_level_bytes) + " shared memory per block, " +
      std::to_string(plan.ctas_per_sm) + " CTAs per SM" +
      (plan.kv_splits > 1 ? "; the key axis splits " + std::to_string(plan.kv_splits) + " ways to fill " +
                                std::to_string(hw.cores) + " SMs"
                          : "") +
      (why.empty() ? "" : "; " + why);
  return plan;
}

Plan with_cpu_overrides(Plan plan, const Problem& pr, const HardwareProfile& hw, int threads, int block_q, int block_kv,
                        int kv_splits, int decode_prefetch_blocks) {
  if (block_q > 0) plan.block_q = block_q;
  if (block_kv > 0) plan.block_kv = block_kv;
  if (block_q > 0 || block_kv > 0) {
    // The working set belongs to the tile that runs, not the one the planner chose: the CLI, the
    // benchmarks and the traffic model (decode's spill rule) read it. Padded as plan_cpu pads.
    const int64_t lanes = std::max(4, hw.simd_bits / 32);
    const int64_t dvp = round_up(std::max<int64_t>(pr.head_dim_v, 1), lanes);
    plan.working_set_bytes = cpu_working_set_bytes(plan.block_q, plan.block_kv, plan.head_dim_padded, dvp);
  }
  if (kv_splits > 0) plan.kv_splits = kv_splits;
  if (block_q > 0 || kv_splits > 0) set_cpu_workers(plan, cpu_tasks(pr, plan), threads);
  if (decode_prefetch_blocks >= 0) plan.decode_prefetch_blocks = decode_prefetch_blocks;
  return plan;
}

Plan plan_for(const Problem& pr, const HardwareProfile& hw, int threads) {
  return hw.kind == DeviceKind::gpu ? plan_gpu(pr, hw) : plan_cpu(pr, hw, threads);
}

}  // namespace ioattn
