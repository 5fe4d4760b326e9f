// What the parts of the traffic model share: traffic.cc's sizes and unit walk, and the CPU and
// GPU rules (traffic_cpu.cc, traffic_gpu.cc) that predict_traffic dispatches to.
#pragma once

#include <cstdint>

#include "common/traffic.h"

namespace ioattn::traffic_detail {

// How the query blocks of one unit (a K/V stream: one kv head on the CPU, one q head on the
// GPU) walk the key axis. As the CPU kernel packs GQA, a tile holds max(1, block_q / G) query
// positions times the G heads of the kv head. The CPU kernel cuts a tile's visible key range
// into blocks aligned to its end (so it reads exactly the visible keys); the CUDA kernel, like
// FlashAttention-2, aligns key blocks to multiples of block_kv.
struct UnitWalk {
  int64_t q_blocks = 0;       // blocks with at least one visible key
  int64_t steps = 0;          // (query block, key block) pairs visited
  int64_t kv_rows_sum = 0;    // key rows loaded, summed over the query blocks
  int64_t kv_rows_union = 0;  // distinct key rows any block loads
};

UnitWalk walk_unit(const Problem& pr, int64_t group, int64_t bq, int64_t bkv, bool align_to_end);

struct Sizes {
  double q, o, lse;  // compulsory bytes of the whole problem
  double kv_row;     // bytes of one key row plus one value row, storage dtype
  double s_fp32;     // one fp32 score matrix for all heads
  double s_head;     // one fp32 score matrix of one (batch, q head)
};

Sizes sizes_of(const Problem& pr);

// Fills a boundary's directional totals and their sums.
void set_traffic(BoundaryTraffic* b, double fr, double fw, double sr, double sw);

// Capacity a level offers to data that all cores read (see MemoryLevel::partitions).
double shared_capacity(const MemoryLevel& l);

TrafficReport cpu_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw, const StandardPasses& sp,
                          const TrafficOptions& opt);
TrafficReport gpu_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw, const StandardPasses& sp);

}  // namespace ioattn::traffic_detail
