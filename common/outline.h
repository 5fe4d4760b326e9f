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

// The one formatter of byte counts in the outline (binary units, 3-4 significant digits:
// "512 KiB", "16 MiB", "1.25 GiB"), so tests can rebuild the figures they look for.
std::string format_bytes(double bytes);
// "12.3x" style ratio of standard over flash bytes.
std::string format_ratio(double standard_bytes, double flash_bytes);

}  // namespace ioattn
