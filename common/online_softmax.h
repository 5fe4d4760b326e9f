// The online-softmax rules, the single source of truth for the CPU kernels, the CUDA kernels and
// the tests (FlashAttention-2, section 3.1). A row keeps a running max m, a running sum
// l = sum exp(s - m) and an unnormalized accumulator O = sum exp(s - m) v. Scores may live in the
// natural domain (exp) or be pre-multiplied by log2(e) (exp2, the GPU's native instruction); the
// rules are the same, only the exponential and the final log change, so each rule takes the
// exponential as a parameter.
//
// The -inf rules, all here and nowhere else:
//  * a row that has seen only masked scores has m = -inf; exponentials are taken against
//    max_for_exp(m) = 0 instead, so exp(-inf - (-inf)) = NaN never happens and p = 0;
//  * the accumulator is rescaled only when the max grows (factor exactly 1 otherwise, so the
//    common case does no multiply-by-one rounding and NaN does not appear from inf - inf);
//  * a row with l == 0 saw no visible key: its output is exactly 0 and its lse is -inf;
//  * NaN is never masked away: a NaN score makes m, l or O NaN and the row's output NaN.
#pragma once

#include <cmath>

#include "common/host_device.h"

namespace ioattn::softmax {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

enum class Domain { natural, log2 };

IOATTN_HD float neg_inf() { return -INFINITY; }

IOATTN_HD float max_for_exp(float m) { return m == -INFINITY ? 0.f : m; }

// Factor by which O and l are multiplied when the running max moves from m_old to m_new >= m_old.
template <class ExpFn>
IOATTN_HD float rescale_factor(float m_old, float m_new, ExpFn exp_fn) {
  if (m_old == m_new) return 1.f;
  return exp_fn(m_old - max_for_exp(m_new));
}

// Merge of two partial states (m_a, l_a, O_a) and (m_b, l_b, O_b) over disjoint key sets, as the
// split-KV path does: O = w_a O_a + w_b O_b, l = w_a l_a + w_b l_b with the returned weights.
struct MergeWeights {
  float m, l, weight_a, weight_b;
};

template <class ExpFn>
IOATTN_HD MergeWeights merge(float m_a, float l_a, float m_b, float l_b, ExpFn exp_fn) {
  MergeWeights r;
  r.m = m_a > m_b ? m_a : m_b;
  if (m_a != m_a || m_b != m_b) r.m = m_a + m_b;  // keep NaN: comparisons drop it
  const float ref = max_for_exp(r.m);
  r.weight_a = m_a == -INFINITY ? 0.f : exp_fn(m_a - ref);
  r.weight_b = m_b == -INFINITY ? 0.f : exp_fn(m_b - ref);
  r.l = l_a * r.weight_a + l_b * r.weight_b;
  return r;
}

// Multiplier applied once to the accumulator at the end (FlashAttention-2's deferred
// normalization): 0 for a row without visible keys, so its output is exactly 0.
IOATTN_HD float output_scale(float l) { return l == 0.f ? 0.f : 1.f / l; }

// Natural-log logsumexp of the row from its final state.
IOATTN_HD float row_lse(float m, float l, Domain domain) {
  if (l == 0.f) return -INFINITY;
  if (domain == Domain::log2) return (m + log2f(l)) * kLn2;
  return m + logf(l);
}

}  // namespace ioattn::softmax
