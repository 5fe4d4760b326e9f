// The Highway flash-attention kernel behind ioattn::cpu::forward (internal to cpu/).
#pragma once

#include <string>

#include "common/params.h"
#include "common/planner.h"
#include "common/status.h"

namespace ioattn::cpu {

// Runs the forward pass of a validated request with the plan's block_q, block_kv, kv_splits and
// workers, on the best Highway target of this CPU (dispatched once, here).
Status flash_forward(const AttnParams& p, const Plan& plan);

// Name of the Highway target flash_forward dispatches to now.
std::string flash_target_name();

// Vector width of that target in bits (what the planner's register tile is sized for).
int flash_target_bits();

}  // namespace ioattn::cpu
