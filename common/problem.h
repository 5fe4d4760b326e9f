// The shape of an attention problem as the planner, the traffic model and the design outline
// see it: no pointers, only what decides tiling and bytes moved.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/params.h"

namespace ioattn {

struct Problem {
  int64_t batch = 1, heads_q = 1, heads_kv = 1;
  int64_t seqlen_q = 1, seqlen_k = 1;
  int64_t head_dim = 64, head_dim_v = 64;
  DType dtype = DType::f32;     // q and out
  DType kv_dtype = DType::f32;  // k and v
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  bool with_lse = false;  // the call writes the fp32 log-sum-exp (B * Hq * Sq * 4 bytes)
};

// The problem a validated request describes (longest sequence for varlen / KV cache).
Problem problem_of(const AttnParams& p);

// Number of (query, key) pairs the mask leaves visible, summed over one (batch, head): what
// the FLOP convention's Sq * Sk_avg counts.
double visible_pairs(const Problem& pr);

// FLOPs of the forward pass by the FlashAttention convention (visible pairs only).
double forward_flops(const Problem& pr);

}  // namespace ioattn
