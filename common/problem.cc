#include "common/problem.h"

#include "common/masking.h"

namespace ioattn {

Problem problem_of(const AttnParams& p) {
  Problem pr;
  pr.batch = p.batch;
  pr.heads_q = p.heads_q;
  pr.heads_kv = p.heads_kv;
  pr.seqlen_q = p.seqlen_q;
  pr.seqlen_k = p.seqlen_k;
  pr.head_dim = p.head_dim;
  pr.head_dim_v = p.head_dim_v;
  pr.dtype = p.io_dtype;
  pr.kv_dtype = p.kv_dtype;
  pr.causal = p.causal;
  pr.window_left = p.window_left;
  pr.window_right = p.window_right;
  pr.with_lse = p.lse != nullptr;
  return pr;
}

// One pass over the query rows: the mask is a band, so each row's visible range is O(1) to find.
double visible_pairs(const Problem& pr) {
  const int64_t right = effective_window_right(pr.causal, pr.window_right);
  double pairs = 0;
  for (int64_t i = 0; i < pr.seqlen_q; ++i) {
    const KeyRange r = visible_keys(i, pr.seqlen_q, pr.seqlen_k, pr.window_left, right);
    pairs += double(r.end - r.begin);
  }
  return pairs;
}

// 2 FLOP per multiply-add: S = Q K^T costs 2 * D per visible pair and O = P V costs 2 * Dv.
double forward_flops(const Problem& pr) {
  return 2.0 * double(pr.batch) * double(pr.heads_q) * visible_pairs(pr) * double(pr.head_dim + pr.head_dim_v);
}

}  // namespace ioattn
