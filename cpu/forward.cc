// ioattn::cpu::forward: plan, then the Highway kernel (cpu/flash_kernel.cc).

#include "common/hardware.h"
#include "common/problem.h"
#include "cpu/cpu_backend.h"
#include "cpu/flash_kernel.h"

namespace ioattn::cpu {

Plan plan_for_params(const AttnParams& p) {
  const int threads = p.num_threads > 0 ? p.num_threads : default_threads();
  const std::shared_ptr<const HardwareProfile> planned = p.tiling.profile ? nullptr : planning_host_shared();
  const HardwareProfile& host = p.tiling.profile ? *p.tiling.profile : *planned;
  const Problem pr = problem_of(p);
  return with_cpu_overrides(plan_cpu(pr, host, threads, PlanText::none), pr, host, threads, p.tiling.block_q,
                            p.tiling.block_kv, p.tiling.kv_splits, p.tiling.decode_prefetch_blocks);
}

Status forward(const AttnParams& p) { return flash_forward(p, plan_for_params(p)); }

size_t scratch_bytes(const AttnParams& p) { return flash_scratch_bytes(p, plan_for_params(p)); }

std::string dispatch_target_name() { return flash_target_name(); }

}  // namespace ioattn::cpu
