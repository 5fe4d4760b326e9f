// The score-row helpers the sm_80 and sm_90a forward kernels share: both keep a query row's scores
// in the C layout of a tensor-core product, where the quad of lanes 4g .. 4g + 3 holds rows g and
// g + 8 two columns at a time (mma.sync m16n8 tiles, and each m64nN wgmma accumulator, which is
// the same pattern N / 8 times per warp). The rules themselves are common/online_softmax.h's.
#pragma once

#include <cuda_runtime.h>

#include "common/online_softmax.h"
#include "common/params.h"
#include "gpu/primitives.cuh"

namespace ioattn::gpu {

// Pairwise reduction of a register array; the order is fixed, so results stay bitwise
// reproducible.
template <int N, class Op>
__device__ __forceinline__ float tree_reduce(float (&x)[N], Op op) {
  static_assert((N & (N - 1)) == 0, "power of two");
  // Both loops have constant trip counts, so they unroll fully and x stays in registers.
#pragma unroll
  for (int width = N / 2; width >= 1; width /= 2)
#pragma unroll
    for (int i = 0; i < N / 2; ++i)
      if (i < width) x[i] = op(x[i], x[i + width]);
  return x[0];
}

// f on every element of a register array of any rank, in index order.
template <class F>
__device__ __forceinline__ void for_each_score(float& x, F f) {
  f(x);
}
template <class T, int N, class F>
__device__ __forceinline__ void for_each_score(T (&a)[N], F f) {
#pragma unroll
  for (int i = 0; i < N; ++i) for_each_score(a[i], f);
}

// Scores enter the exponent in the log2 domain: x = s * scale * log2(e), or with softcap
// c * log2(e) * tanh(s * scale / c). The running max m is kept in that domain, rounded exactly
// as the scores are, so the row's largest score gives exp2(x - m) = 1. With a positive scale
// and no softcap the raw scores are not transformed: max(s) * k rounds to the max of the
// rounded products (rounding is monotone), and the exponent is one FFMA, exp2(s * k - m).
// Its argument then carries the rounding error of s * k, below ulp(m) / 2: harmless while
// |m| < 2^22 (error <= 1/4), but at logits ~1e11 (q = k = v = 133120, pytorch issue 121558)
// it is thousands and exp2 overflows, so such warps take the two-step form.
struct ScoreMode {
  static constexpr float kFusedLimit = 4194304.f;  // 2^22
  bool softcap, fused;
  float score_mul, softcap_log2;

  __device__ __forceinline__ explicit ScoreMode(const AttnParams& p)
      : softcap(p.softcap > 0.f),
        fused(!softcap && p.scale > 0.f),
        score_mul(softcap ? p.scale / p.softcap : p.scale * softmax::kLog2e),
        softcap_log2(p.softcap * softmax::kLog2e) {}

  // Takes the raw scores s into the log2 domain, or leaves them raw for the fused exponent;
  // returns the factor k that the max and the exponent still apply to them.
  template <class Scores>
  __device__ __forceinline__ float to_log2(Scores& s, bool use_softcap, bool use_fused) const {
    const float mul = score_mul, cap = softcap_log2;
    if (use_softcap)
      for_each_score(s, [mul, cap](float& x) { x = cap * tanhf(x * mul); });
    else if (!use_fused)
      for_each_score(s, [mul](float& x) { x *= mul; });
    return use_fused ? score_mul : 1.f;
  }
};

// The quad of lanes sharing a fragment row (lanes 4g .. 4g + 3) combines its values.
__device__ __forceinline__ float quad_max(float m) {
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
  return m;
}
__device__ __forceinline__ float quad_sum(float l) {
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  return l;
}

// Moves the running max of rows g and g + 8 (hr = 0, 1) over one tile's scores s times k, sets
// each row's O rescale factor and the m_ref its exponent subtracts; clears `small` unless both
// m_refs lie in the fused exponent's range (ScoreMode::kFusedLimit). One flag runs through all of
// a warp's rows, so the checks chain as one predicate.
template <int NT>
__device__ __forceinline__ void update_row_max(float (&row_max)[2], const float (&s)[NT][4], float k,
                                               float (&factor)[2], float (&m_ref)[2], bool& small) {
  auto exp2_fn = [](float d) { return fast_exp2(d); };
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float r[2 * NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) r[2 * n] = s[n][2 * hr], r[2 * n + 1] = s[n][2 * hr + 1];
    float m = fmaxf(row_max[hr], tree_reduce(r, [](float a, float b) { return fmaxf(a, b); }) * k);
    m = quad_max(m);
    factor[hr] = softmax::rescale_factor(row_max[hr], m, exp2_fn);
    row_max[hr] = m;
    m_ref[hr] = softmax::max_for_exp(m);
    small &= fabsf(m_ref[hr]) < ScoreMode::kFusedLimit;
  }
}

// Rewrites one tile's scores as the two-step argument __fmul_rn(x, k) - m_ref (rounded like the
// max, never contracted into an FMA), after which k_exp = 1 and m_ref = 0 make the fused
// expression exp2(fma(x, k_exp, -m_ref)) exact: the form for warps whose maxima left the fused
// range.
template <int NT>
__device__ __forceinline__ void to_two_step(float (&s)[NT][4], float k, float (&m_ref)[2]) {
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) s[n][2 * hr + e] = __fmul_rn(s[n][2 * hr + e], k) - m_ref[hr];
    m_ref[hr] = 0.f;
  }
}

// The probabilities of row g + 8 hr in k16 slice kn (pe[h][e]: column 16 kn + 8 h + 2t + e, the
// m16n8k16 A-fragment order P V reads); returns their sum.
template <int NT>
__device__ __forceinline__ float exp_slice(const float (&s)[NT][4], int kn, int hr, float k_exp, float m_ref,
                                           float (&pe)[2][2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int e = 0; e < 2; ++e) pe[h][e] = fast_exp2(fmaf(s[2 * kn + h][2 * hr + e], k_exp, -m_ref));
  return (pe[0][0] + pe[0][1]) + (pe[1][0] + pe[1][1]);
}

// Sets to -inf the scores of C-fragment row g + 8 hr (lane t of its quad) whose tile column is
// outside [lo, hi).
template <int NT>
__device__ __forceinline__ void mask_outside(float (&s)[NT][4], int hr, int t, int lo, int hi) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = n * 8 + 2 * t + e;
      if (col < lo || col >= hi) s[n][2 * hr + e] = softmax::neg_inf();
    }
}

// Multiplies the accumulator rows g (c0, c1) and g + 8 (c2, c3) by their factors.
template <int OT>
__device__ __forceinline__ void rescale_rows(float (&o)[OT][4], const float (&factor)[2]) {
#pragma unroll
  for (int d = 0; d < OT; ++d) {
    o[d][0] *= factor[0];
    o[d][1] *= factor[0];
    o[d][2] *= factor[1];
    o[d][3] *= factor[1];
  }
}

}  // namespace ioattn::gpu
