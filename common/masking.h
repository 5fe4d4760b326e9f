// The visibility rule of the contract, bottom-right aligned as in FlashAttention-2: with
// off = Sk - Sq, key j is visible to query i iff i + off - L <= j <= i + off + R, where causal
// is R = 0 and -1 leaves a side unbounded. Every kernel and the reference ask this one function.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace ioattn {

struct KeyRange {
  int64_t begin, end;  // visible keys are [begin, end); empty when begin >= end
};

// Causal folds into the right window: j <= i + off intersected with j <= i + off + R (R >= 0) is
// always R = 0.
IOATTN_HD int64_t effective_window_right(bool causal, int64_t window_right) { return causal ? 0 : window_right; }

IOATTN_HD KeyRange visible_keys(int64_t i, int64_t seqlen_q, int64_t seqlen_k, int64_t window_left,
                                int64_t window_right_eff) {
  const int64_t diag = i + seqlen_k - seqlen_q;
  int64_t begin = 0, end = seqlen_k;
  if (window_left >= 0 && diag - window_left > begin) begin = diag - window_left;
  if (window_right_eff >= 0 && diag + window_right_eff + 1 < end) end = diag + window_right_eff + 1;
  if (end < begin) end = begin;
  return {begin, end};
}

}  // namespace ioattn
