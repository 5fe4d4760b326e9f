// What the CPU rules of the traffic model share between cpu_traffic (traffic_cpu.cc), the L1d-L2
// walk of the kernel's loop nest (traffic_cpu_l1.cc) and the reuse inside a tile past L1
// (traffic_cpu_tiles.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "common/cache_sim.h"
#include "common/traffic_parts.h"

namespace ioattn::traffic_detail {

// The constants mirror the kernel's (cpu/flash_kernel.cc): kCpuPanelRows is its kPanelRows; the
// register tile is common/cpu_tiles.h's, which the kernel and the planner share.
constexpr int64_t kCpuPanelRows = 48;
constexpr double kLine = 64;

struct CpuKernelShape {
  int64_t lanes, score_vecs, pv_rows, panel_cols;
};

// The score kernel's row vectors per chunk; the P V kernel's rows and V panel width (its own
// tile: 6 x 4 vectors on AVX-512, 64 columns; 6 x 2 on AVX2).
CpuKernelShape cpu_kernel_shape(const HardwareProfile& hw);

// The visible key range of each of a tile's rows (query position p0 + r / group) and their
// union [u0, u1) over the rows that see any key (u1 <= u0 when none does).
struct TileKeys {
  std::vector<int64_t> begin, end;
  int64_t u0, u1;
};
TileKeys tile_keys(const Problem& pr, int64_t p0, int64_t rows, int64_t group, int64_t right);

// One unit's L1d-L2 bytes of the packed kernel (traffic_cpu_l1.cc).
struct UnitL1 {
  double tiles = 0, packing = 0, steps = 0;  // per tile (and split), K/V packing, panel-steps
  double total() const { return tiles + packing + steps; }
};
UnitL1 cpu_flash_unit_l1(const Problem& pr, const Plan& plan, const CpuKernelShape& ks, double l1, int ways,
                         bool head_mode);

// What a level past L1 loses inside a unit's tiles (traffic_cpu_tiles.cc).
struct TileRefills {
  double inside = 0;       // (a)-(d) and (f), summed over the unit's tiles
  double tile_refill = 0;  // (e) for the unit's tiles after its first
  double first_tile = 0;   // (e) for its first tile
  double touched = 0;      // tile mode: bytes of scratch a tile touches (the most over the unit's tiles)
};
TileRefills cpu_tile_refills(const Problem& pr, const Plan& plan, const CpuKernelShape& ks, SetOccupancy& sets,
                             bool head_mode);

}  // namespace ioattn::traffic_detail
