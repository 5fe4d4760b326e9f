// The tiling planner: one place that sizes blocks for both backends from (problem, hardware).
// CPU plans fit the per-core working set into L1/L2; GPU plans take their tile from the
// constexpr table in common/gpu_tiles.h, the same table the CUDA kernels are instantiated from.
#pragma once

#include <cstdint>
#include <string>

#include "common/hardware.h"
#include "common/problem.h"

namespace ioattn {

enum class BackendKind { cpu, cuda };

struct Plan {
  BackendKind backend = BackendKind::cpu;
  std::string hardware;            // profile name
  int block_q = 0;                 // query rows per tile
  int block_kv = 0;                // key/value rows per inner step
  int head_dim_padded = 0;         // head dim rounded up to the vector width (CPU) or 16/32 (GPU)
  int reg_rows = 0, reg_cols = 0;  // register tile of the score / PV micro-kernel
  int kv_splits = 1;               // >1: the key axis is split (flash-decoding) and partials merged
  int workers = 1;                 // threads (CPU) or concurrently resident CTAs (GPU)
  int64_t work_items = 0;          // independent tasks: batch * heads * query blocks * kv_splits
  int warps = 0, stages = 0;       // GPU: warps per CTA, K/V pipeline depth (cp.async or TMA)
  // GPU: the kernel the plan is for: "sm80" (mma.sync prefill), "sm90" (the sm_90a wgmma and TMA
  // prefill, on compute capability 9.0 profiles) or "decode" (split-KV); empty on the CPU.
  std::string kernel;
  int64_t working_set_bytes = 0;   // bytes one worker keeps live per step
  std::string target_level;        // the level the working set is fitted to ("L2", "smem")
  int64_t target_level_bytes = 0;  // the capacity it was fitted against (per worker share)
  std::string rationale;           // one sentence: why this level and these blocks
  bool supported = true;      // false: no kernel of this build runs this shape (the figures are what it would need)
  int64_t units = 0;          // independent K/V streams: batch * kv heads (CPU, GQA-packed) or batch * q heads (GPU)
  int64_t rows_per_unit = 0;  // query rows one unit owns: (Hq/Hkv) * Sq on the CPU, Sq on the GPU
  int ctas_per_sm = 0;        // GPU: resident CTAs per SM (shared memory and register limits)
  int decode_prefetch_blocks = 0;  // CPU decode: software prefetch distance in softmax blocks
  // CPU: whether a calibration file (common/calibration.h) adjusted this plan; calibration says
  // what it changed and what was measured, or why a file was not used (empty: there is none).
  bool calibrated = false;
  std::string calibration;
};

// Whether a plan carries its text (rationale, calibration): reports want it, a kernel call does
// not (building it is most of a small call's planning time).
enum class PlanText { full, none };

// threads: 0 means the profile's core count.
Plan plan_cpu(const Problem& pr, const HardwareProfile& hw, int threads = 0, PlanText text = PlanText::full);
Plan plan_gpu(const Problem& pr, const HardwareProfile& hw);
Plan plan_for(const Problem& pr, const HardwareProfile& hw, int threads = 0);

// A CPU plan's tasks before key splits: sequences in decode mode (one task per sequence runs every
// kv head), else (sequence, kv head, query block) tiles.
int64_t cpu_tasks(const Problem& pr, const Plan& plan);

// `plan` (plan_cpu's for pr on hw) with a caller's block_q, block_kv or kv_splits (0 keeps the
// planned value) and decode prefetch distance (-1 keeps it): the working set, task count and
// workers follow plan_cpu's rules for `threads`.
Plan with_cpu_overrides(Plan plan, const Problem& pr, const HardwareProfile& hw, int threads, int block_q, int block_kv,
                        int kv_splits, int decode_prefetch_blocks = -1);

// Bytes one CPU worker keeps live: packed fp32 Q block, K and V blocks, score/P block, O
// accumulator, and the running max and sum (8 B per row).
int64_t cpu_working_set_bytes(int64_t block_q, int64_t block_kv, int64_t head_dim_padded, int64_t head_dim_v_padded);

// The fraction of the target level a CPU plan may fill; the rest is for the output rows,
// the K/V rows being packed and the hardware prefetchers' streams.
inline constexpr double kCpuCacheFill = 0.75;

// FlashAttention-1's rule (arXiv 2205.14135, Algorithm 1): with on-chip memory of M elements,
// Bc = ceil(M / 4d) and Br = min(Bc, d), so the Q, K, V and O blocks each take at most ~M/4.
struct PaperBlocks {
  int64_t block_q;   // Br
  int64_t block_kv;  // Bc
};
PaperBlocks flash1_paper_blocks(int64_t sram_elements, int64_t head_dim);

// The memory level a CPU plan targets and the per-worker capacity it was fitted against.
const MemoryLevel& cpu_target_level(const HardwareProfile& hw);
int64_t cpu_target_capacity(const HardwareProfile& hw);

}  // namespace ioattn
