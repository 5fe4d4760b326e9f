// The decode kernel for D = 64 in bf16 and f16: one nvcc job per head dim.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu/decode.cuh"

namespace ioattn::gpu::decode {

template <>
cudaError_t prepare_decode<__nv_bfloat16, 64>() {
  return prepare_decode_tile<__nv_bfloat16, 64>();
}
template <>
cudaError_t launch_decode<__nv_bfloat16, 64>(const AttnParams& p, const Partials& part) {
  return launch_decode_tile<__nv_bfloat16, 64>(p, part);
}
template <>
cudaError_t prepare_decode<__half, 64>() {
  return prepare_decode_tile<__half, 64>();
}
template <>
cudaError_t launch_decode<__half, 64>(const AttnParams& p, const Partials& part) {
  return launch_decode_tile<__half, 64>(p, part);
}

}  // namespace ioattn::gpu::decode
