// Device primitives the kernels of every architecture share (the sm_80 and sm_90a forwards, the
// decode and its merge): exp2 on the special-function unit and the rounding of fp32 pairs into
// the storage type. Instruction wrappers of one architecture stay in gpu/sm80/ or gpu/sm90/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace ioattn::gpu {

// exp2 on the special-function unit: relative error about 2^-22, -inf -> +0, NaN -> NaN.
// Subnormal results flush to zero, below the resolution of any probability that survives the
// fp32 row sum.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The packed pair conversion of a storage element type, rounding to nearest even as the
// contract asks.
template <class Elem>
struct ElemPair;
template <>
struct ElemPair<__nv_bfloat16> {
  __device__ __forceinline__ static __nv_bfloat162 round(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
};
template <>
struct ElemPair<__half> {
  __device__ __forceinline__ static __half2 round(float lo, float hi) { return __floats2half2_rn(lo, hi); }
};

// The rounded pair as one 32-bit register: the operand layout of the tensor-core products and
// the unit of the output stores.
template <class Elem>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  static_assert(std::is_same_v<Elem, __nv_bfloat16> || std::is_same_v<Elem, __half>, "bf16 or f16 storage");
  auto v = ElemPair<Elem>::round(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace ioattn::gpu
