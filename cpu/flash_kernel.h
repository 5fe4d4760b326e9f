// The Highway flash-attention kernel behind ioattn::cpu::forward (internal to cpu/).
#pragma once

#include <cstddef>
#include <string>

#include "common/params.h"
#include "common/planner.h"
#include "common/status.h"

namespace ioattn::cpu {

// Runs the forward pass of a validated request with the plan's block_q, block_kv, kv_splits and
// workers, on the best Highway target of this CPU (dispatched once, here).
Status flash_forward(const AttnParams& p, const Plan& plan);

// Bytes of scratch flash_forward allocates for (p, plan) on that target: per-worker blocks plus
// split-KV partials.
size_t flash_scratch_bytes(const AttnParams& p, const Plan& plan);

// Name of the Highway target flash_forward dispatches to now.
std::string flash_target_name();

// Vector width of that target in bits (what the planner's register tile is sized for).
int flash_target_bits();

}  // namespace ioattn::cpu
