// The traffic model: bytes a plan moves across each boundary of the memory hierarchy, for flash
// attention (tiled, S never materialized) and for standard attention (S and P written to and
// read back from memory), accounting for what stays resident in a level.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/planner.h"

namespace ioattn {

struct BoundaryTraffic {
  std::string name;  // "L1d-L2", "L2-L3", "L3-DRAM", "smem-L2", "L2-HBM"
  double flash_bytes = 0;
  double standard_bytes = 0;
};

struct TrafficReport {
  std::string hardware;
  std::vector<BoundaryTraffic> levels;  // innermost boundary first, the off-chip one last
  double flash_dram_bytes = 0;          // = levels.back().flash_bytes
  double standard_dram_bytes = 0;
  double flops = 0;
  // Roofline time implied by compute peak and off-chip bandwidth, seconds.
  double flash_roofline_s = 0, standard_roofline_s = 0;
};

TrafficReport predict_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw);

}  // namespace ioattn
