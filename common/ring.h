// The ring model: one attention problem spread over N devices by context parallelism (ring
// attention, as ioattn.distributed runs it). Each rank holds S/N query rows and S/N key rows;
// in N steps it attends its queries to every rank's K/V shard while the shard it holds travels to
// the next rank, and merges the step partials by the online-softmax merge rule. Causal problems
// use the zigzag layout (rank r holds chunks r and 2N-1-r of 2N), which gives every rank the same
// visible pairs per step.
//
// Per step the model asks the single-device planner and traffic model about the call each rank
// runs, and compares that call's roofline time with the time the link needs for one K/V shard:
// the transfer hides under compute when compute per step >= transfer per step.
#pragma once

#include <cstdint>
#include <string>

#include "common/hardware.h"
#include "common/planner.h"
#include "common/problem.h"

namespace ioattn {

struct RingModel {
  int ranks = 1;
  int64_t shard_seqlen = 0;  // query (and key) rows per rank
  Link link;
  bool zigzag = false;  // causal: the balanced layout the model assumes
  // One rank's call per step: the diagonal step (its own shard) and each of the other N - 1.
  Problem diagonal_step, ring_step;
  Plan ring_step_plan;
  double flops_per_step = 0;        // an off-diagonal step's FLOPs on one rank
  double link_bytes_per_step = 0;   // one K/V shard, sent (and one received) per step
  double compute_s_per_step = 0;    // roofline time of an off-diagonal step
  double transfer_s_per_step = 0;   // link_bytes / bandwidth + latency
  bool hides = false;               // compute_s_per_step >= transfer_s_per_step
  double rank_dram_bytes = 0;       // one rank's off-chip bytes: its N calls, the K/V it sends and
                                    // receives, and the merges
  double rank_time_s = 0;           // N steps, each the longer of compute and transfer (none after the last)
  double single_device_time_s = 0;  // the whole problem's roofline time on one device
  double predicted_efficiency = 0;  // single_device_time_s / (ranks * rank_time_s)
  std::string summary;              // one sentence with the numbers
};

// The ring of `ranks` devices of profile `hw` joined by `link`. The problem's seqlen_q and
// seqlen_k must be equal and divisible by ranks (by 2 * ranks when causal); false with a message
// naming the value otherwise.
bool predict_ring(const Problem& pr, const HardwareProfile& hw, int ranks, const Link& link, int threads,
                  RingModel* out, std::string* error);

}  // namespace ioattn
