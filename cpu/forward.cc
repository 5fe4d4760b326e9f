// ioattn::cpu::forward: plan, then the Highway kernel (cpu/flash_kernel.cc).
#include <algorithm>

#include "common/hardware.h"
#include "common/problem.h"
#include "cpu/cpu_backend.h"
#include "cpu/flash_kernel.h"

namespace ioattn::cpu {

Plan plan_for_params(const AttnParams& p) {
  const int threads = p.num_threads > 0 ? p.num_threads : default_threads();
  const HardwareProfile host = p.tiling.profile ? *p.tiling.profile : planning_host();
  Plan plan = plan_cpu(problem_of(p), host, threads);
  if (p.tiling.block_q > 0) plan.block_q = p.tiling.block_q;
  if (p.tiling.block_kv > 0) plan.block_kv = p.tiling.block_kv;
  if (p.tiling.block_q > 0 || p.tiling.block_kv > 0) {
    // The working set belongs to the tile that runs, not the one the planner chose: the CLI, the
    // benchmarks and the traffic model (decode's spill rule, traffic_run's plan line) read it.
    // Padded as plan_cpu pads: D and Dv to whole vectors of the host's lanes.
    const int64_t lanes = std::max(4, host.simd_bits / 32);
    const int64_t dvp = (std::max<int64_t>(p.head_dim_v, 1) + lanes - 1) / lanes * lanes;
    plan.working_set_bytes = cpu_working_set_bytes(plan.block_q, plan.block_kv, plan.head_dim_padded, dvp);
  }
  if (p.tiling.kv_splits > 0) plan.kv_splits = p.tiling.kv_splits;
  if (p.tiling.block_q > 0 || p.tiling.kv_splits > 0) {
    const int64_t group = p.heads_kv > 0 ? p.heads_q / p.heads_kv : 1;
    const int64_t rows_per_tile = std::max<int64_t>(1, plan.block_q / group) * group;
    const int64_t q_blocks = (group * p.seqlen_q + rows_per_tile - 1) / rows_per_tile;
    plan.work_items = p.batch * p.heads_kv * q_blocks * plan.kv_splits;
    plan.workers = int(std::max<int64_t>(1, std::min<int64_t>(threads, plan.work_items)));
  }
  return plan;
}

Status forward(const AttnParams& p) { return flash_forward(p, plan_for_params(p)); }

size_t scratch_bytes(const AttnParams& p) { return flash_scratch_bytes(p, plan_for_params(p)); }

std::string dispatch_target_name() { return flash_target_name(); }

}  // namespace ioattn::cpu
