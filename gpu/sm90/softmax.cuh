// The online softmax of one consumer thread's two query rows over one key tile, on the wgmma
// accumulator of S = Q K^T. The fragment of an m64nN wgmma is, per warp, the m16n8 C layout N / 8
// times: element 4n + 2hr + e is row g + 8hr, column 8n + 2t + e (g = lane / 4, t = lane % 4),
// which is what gpu/score_rows.cuh's helpers take as s[n][4]. The P fragment P V reads from
// registers has the m16n8k16 A layout per k16 slice, so two adjacent n8 tiles of S become one
// slice of P without data movement. The rules are common/online_softmax.h's, applied as in the
// sm_80 kernel (gpu/sm80/flash_fwd.cuh): the fused exponent exp2(s * k - m) in the common mode,
// the two-step form for logits past 2^22 and for softcap or negative scales.
#pragma once

#include "common/online_softmax.h"
#include "gpu/primitives.cuh"
#include "gpu/score_rows.cuh"

namespace ioattn::gpu::sm90 {

// A CUDA 16-bit value as CuTe's type of the same bits (cutlass::bfloat16_t, cutlass::half_t).
template <class T>
__device__ __forceinline__ T cute_bits(__nv_bfloat16 x) {
  return T::bitcast(static_cast<__nv_bfloat16_raw>(x).x);
}
template <class T>
__device__ __forceinline__ T cute_bits(__half x) {
  return T::bitcast(static_cast<__half_raw>(x).x);
}

template <int NT>
struct RowSoftmax {
  static_assert(NT % 2 == 0, "whole k16 slices of P");
  float row_max[2], row_sum[2];

  __device__ __forceinline__ RowSoftmax() {
    row_max[0] = row_max[1] = softmax::neg_inf();
    row_sum[0] = row_sum[1] = 0.f;
  }

  // Moves the running max of both rows over the tile's scores (the quad sharing a row agrees on
  // it) and returns the exponent's multiplier; sets each row's O rescale factor and the m_ref its
  // exponent subtracts. Past the fused form's range the scores are rewritten in the two-step
  // form, as in the sm_80 kernel.
  __device__ __forceinline__ float update_max(float (&s)[NT][4], float k, bool use_fused, float (&factor)[2],
                                              float (&m_ref)[2]) {
    bool small = true;
    update_row_max(row_max, s, k, factor, m_ref, small);
    float k_exp = k;
    if (use_fused && !__all_sync(0xffffffffu, small)) {
      to_two_step(s, k, m_ref);
      k_exp = 1.f;
    }
    return k_exp;
  }

  // Exponentiates the scores into P (storage type, in the A-fragment order of P V: element
  // 8 kn + 4h + 2hr + e is row hr, column 16 kn + 8h + 2t + e) and adds them to the row sums.
  template <class Elem, class PFrag>
  __device__ __forceinline__ void exponentiate(const float (&s)[NT][4], float k_exp, const float (&m_ref)[2],
                                               const float (&factor)[2], PFrag& p_frag) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      row_sum[hr] *= factor[hr];
#pragma unroll
      for (int kn = 0; kn < NT / 2; ++kn) {
        float pe[2][2];
        row_sum[hr] += exp_slice(s, kn, hr, k_exp, m_ref[hr], pe);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const auto pair = ElemPair<Elem>::round(pe[h][0], pe[h][1]);
          using T = typename PFrag::value_type;
          p_frag(8 * kn + 4 * h + 2 * hr) = cute_bits<T>(pair.x);
          p_frag(8 * kn + 4 * h + 2 * hr + 1) = cute_bits<T>(pair.y);
        }
      }
    }
  }
};

}  // namespace ioattn::gpu::sm90
