// The design outline: the plan explained with its own numbers.
#pragma once

#include <string>

#include "common/planner.h"
#include "common/traffic.h"

namespace ioattn {

struct DesignOutline {
  std::string memoryTraffic;
  std::string tiling;
  std::string numericalStability;
  std::string tradeoff;
  std::string failureMode;
};

DesignOutline designOutline(const Problem& pr, const Plan& plan, const HardwareProfile& hw);

}  // namespace ioattn
