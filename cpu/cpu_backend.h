// The CPU backend's entry: Highway kernels with runtime dispatch, threaded by the configured
// runtime (OpenMP, oneTBB or sequential).
#pragma once

#include <cstddef>
#include <string>

#include "common/params.h"
#include "common/planner.h"
#include "common/status.h"

namespace ioattn::cpu {

// p has been validated by the API layer. The plan comes from plan_cpu on the detected host
// with p.num_threads workers; p.tiling overrides its block sizes and split count.
Status forward(const AttnParams& p);

// The plan forward() would run for p (after overrides), for tests, the CLI and benchmarks.
Plan plan_for_params(const AttnParams& p);

// Scratch bytes forward() allocates for p (beyond the caller's inputs and outputs): what the
// benchmarks report as the kernel's extra memory.
size_t scratch_bytes(const AttnParams& p);

// Highway target the dispatcher picks on this machine ("AVX2", "AVX3", "NEON", ...).
std::string dispatch_target_name();

}  // namespace ioattn::cpu
