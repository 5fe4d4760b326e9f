// The tiling planner: one place that sizes blocks for both backends from (problem, hardware).
// CPU plans fit the per-core working set into L1/L2; GPU plans take their tile from the
// constexpr table in common/gpu_tiles.h, the same table the CUDA kernels are instantiated from.
#pragma once

#include <cstdint>
#include <string>

#include "common/hardware.h"
#include "common/problem.h"

namespace ioattn {

enum class Backend { cpu, cuda };

struct Plan {
  Backend backend = Backend::cpu;
  std::string hardware;  // profile name
  int block_q = 0;       // query rows per tile
  int block_kv = 0;      // key/value rows per inner step
  int head_dim_padded = 0;  // head dim rounded up to the vector width (CPU) or 16/32 (GPU)
  int reg_rows = 0, reg_cols = 0;  // register tile of the score / PV micro-kernel
  int kv_splits = 1;     // >1: the key axis is split (flash-decoding) and partials merged
  int workers = 1;       // threads (CPU) or concurrently resident CTAs (GPU)
  int64_t work_items = 0;  // independent tasks: batch * heads * query blocks * kv_splits
  int warps = 0, stages = 0;  // GPU: warps per CTA, cp.async pipeline depth
  int64_t working_set_bytes = 0;   // bytes one worker keeps live per step
  std::string target_level;        // the level the working set is fitted to ("L2", "smem")
  int64_t target_level_bytes = 0;  // the capacity it was fitted against (per worker share)
  std::string rationale;           // one sentence: why this level and these blocks
};

// threads: 0 means the profile's core count.
Plan plan_cpu(const Problem& pr, const HardwareProfile& hw, int threads = 0);
Plan plan_gpu(const Problem& pr, const HardwareProfile& hw);
Plan plan_for(const Problem& pr, const HardwareProfile& hw, int threads = 0);

}  // namespace ioattn
