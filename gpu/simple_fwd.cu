#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/masking.h"
#include "common/online_softmax.h"
#include "gpu/elem_convert.cuh"
#include "gpu/simple_fwd.h"

namespace ioattn::gpu {
namespace {

constexpr int kRowsPerBlock = 4;  // one warp per row
constexpr int kPerLane = kSimpleMaxHeadDim / 32;

template <class T>
__global__ void __launch_bounds__(kRowsPerBlock * 32) simple_fwd_kernel(const __grid_constant__ AttnParams p) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const int64_t i = int64_t(blockIdx.x) * kRowsPerBlock + warp;
  const SeqSpan seq = sequence(p, b);
  if (i >= seq.seqlen_q) return;
  const int64_t hk = kv_head_of(p, h);
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);

  float qr[kPerLane];
  const int64_t qo = q_offset(p, b, seq, i, h);
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int64_t c = lane + 32 * r;
    qr[r] = c < p.head_dim ? to_f32(q[qo + c]) : 0.f;
  }

  // Scores in the log2 domain so the rules of online_softmax.h apply with exp2.
  const KeyRange keys = visible_keys(p, seq, i);
  float m = softmax::neg_inf(), l = 0.f, acc[kPerLane] = {};
  for (int64_t j = keys.begin; j < keys.end; ++j) {
    const int64_t ko = k_offset(p, b, seq, j, hk);
    float dot = 0.f;
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      const int64_t c = lane + 32 * r;
      if (c < p.head_dim) dot = fmaf(qr[r], to_f32(k[ko + c]), dot);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    // Lanes may differ in the last bit after the butterfly; lane 0's value is the row's.
    dot = __shfl_sync(0xffffffffu, dot, 0);
    float score = dot * p.scale;
    if (p.softcap > 0.f) score = p.softcap * tanhf(score / p.softcap);
    const float x = score * softmax::kLog2e;
    const float m_new = fmaxf(m, x);
    const float factor = softmax::rescale_factor(m, m_new, [](float d) { return exp2f(d); });
    const float pr = exp2f(x - softmax::max_for_exp(m_new));
    m = m_new;
    l = l * factor + pr;
    const int64_t vo = v_offset(p, b, seq, j, hk);
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      const int64_t c = lane + 32 * r;
      if (c < p.head_dim_v) acc[r] = fmaf(pr, to_f32(v[vo + c]), acc[r] * factor);
    }
  }

  T* out = static_cast<T*>(p.out);
  const int64_t oo = o_offset(p, b, seq, i, h);
  const float inv = softmax::output_scale(l);
#pragma unroll
  for (int r = 0; r < kPerLane; ++r) {
    const int64_t c = lane + 32 * r;
    if (c < p.head_dim_v) out[oo + c] = from_f32<T>(acc[r] * inv);
  }
  if (p.lse && lane == 0)
    p.lse[lse_offset(p, b, seq, i, h)] = softmax::row_lse(softmax::max_for_exp(m), l, softmax::Domain::log2);
}

template <class T>
cudaError_t launch(const AttnParams& p) {
  const dim3 grid(unsigned((p.seqlen_q + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(p.heads_q), unsigned(p.batch));
  simple_fwd_kernel<T><<<grid, kRowsPerBlock * 32, 0, static_cast<cudaStream_t>(p.stream)>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_simple_fwd(const AttnParams& p) {
  switch (p.io_dtype) {
    case DType::f32: return launch<float>(p);
    case DType::f16: return launch<__half>(p);
    case DType::bf16: return launch<__nv_bfloat16>(p);
  }
  return cudaErrorInvalidValue;
}

}  // namespace ioattn::gpu
