// KV-cache append on the device: new rows go to positions seqlens[b] + r of sequence b through
// the same row accessor the kernels read with (contiguous or paged), converting the storage
// type when the cache's differs from the new rows'.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "gpu/elem_convert.cuh"
#include "gpu/gpu_backend.h"

namespace ioattn::gpu {
namespace {

__device__ float load_f32(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f16: return to_f32(static_cast<const __half*>(base)[i]);
    case DType::bf16: return to_f32(static_cast<const __nv_bfloat16*>(base)[i]);
  }
  return 0.f;
}

__device__ void store_f32(void* base, int64_t i, DType t, float x) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = x; return;
    case DType::f16: static_cast<__half*>(base)[i] = from_f32<__half>(x); return;
    case DType::bf16: static_cast<__nv_bfloat16*>(base)[i] = from_f32<__nv_bfloat16>(x); return;
  }
}

// Raw copy of one element (2 or 4 bytes): the saved rows go back bit for bit, NaN payloads too.
__device__ void copy_elem(void* dst, int64_t di, const void* src, int64_t si, int64_t bytes) {
  if (bytes == 4)
    static_cast<uint32_t*>(dst)[di] = static_cast<const uint32_t*>(src)[si];
  else
    static_cast<uint16_t*>(dst)[di] = static_cast<const uint16_t*>(src)[si];
}

enum class Mode { append, restore };

// One CTA per (new row, kv head, sequence); threads stride over the head dim. Append first copies
// the slots it overwrites into `saved` (when given), slot (b, r, hk) at ((b * n + r) * Hkv + hk)
// * (D + Dv) elements; restore copies them back. The same thread reads each old element before
// writing the new one, so no synchronization is needed.
__global__ void append_kv_kernel(const __grid_constant__ AttnParams p, const __grid_constant__ KvAppend a, void* saved,
                                 Mode mode) {
  const int64_t r = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const SeqSpan seq = sequence(p, b);
  const int64_t j = a.cache_seqlens[b] + r;
  // The cache rows p.k / p.v are written through; the params hold them as const for the kernels.
  void* k_cache = const_cast<void*>(p.k);
  void* v_cache = const_cast<void*>(p.v);
  const int64_t kd = k_offset(p, b, seq, j, hk), vd = v_offset(p, b, seq, j, hk);
  const int64_t eb = dtype_bytes(p.kv_dtype);
  const int64_t slot = ((b * a.seqlen_new + r) * p.heads_kv + hk) * (p.head_dim + p.head_dim_v);
  if (mode == Mode::restore) {
    for (int64_t c = threadIdx.x; c < p.head_dim; c += blockDim.x) copy_elem(k_cache, kd + c, saved, slot + c, eb);
    for (int64_t c = threadIdx.x; c < p.head_dim_v; c += blockDim.x)
      copy_elem(v_cache, vd + c, saved, slot + p.head_dim + c, eb);
    return;
  }
  const int64_t ks = b * a.k_batch_stride + r * a.k_seq_stride + hk * a.k_head_stride;
  const int64_t vs = b * a.v_batch_stride + r * a.v_seq_stride + hk * a.v_head_stride;
  for (int64_t c = threadIdx.x; c < p.head_dim; c += blockDim.x) {
    if (saved) copy_elem(saved, slot + c, k_cache, kd + c, eb);
    store_f32(k_cache, kd + c, p.kv_dtype, load_f32(a.k_new, ks + c, a.dtype));
  }
  for (int64_t c = threadIdx.x; c < p.head_dim_v; c += blockDim.x) {
    if (saved) copy_elem(saved, slot + p.head_dim + c, v_cache, vd + c, eb);
    store_f32(v_cache, vd + c, p.kv_dtype, load_f32(a.v_new, vs + c, a.dtype));
  }
}

Status launch(const AttnParams& p, const KvAppend& a, void* saved, Mode mode) {
  if (a.seqlen_new == 0 || p.batch == 0 || a.k_new == nullptr) return Status::ok();
  if (a.seqlen_new > 0x7fffffff || p.heads_kv > 65535 || p.batch > 65535)
    return Status::unsupported("backend=CUDA: append of seqlen_new=" + std::to_string(a.seqlen_new) +
                               " heads_kv=" + std::to_string(p.heads_kv) + " batch=" + std::to_string(p.batch) +
                               " exceeds the CUDA grid (2^31-1, 65535, 65535)");
  const dim3 grid(unsigned(a.seqlen_new), unsigned(p.heads_kv), unsigned(p.batch));
  append_kv_kernel<<<grid, 128, 0, static_cast<cudaStream_t>(p.stream)>>>(p, a, saved, mode);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return Status::backend(std::string("backend=CUDA: launching the KV-cache ") +
                           (mode == Mode::append ? "append: " : "restore: ") + cudaGetErrorName(err) + " (" +
                           cudaGetErrorString(err) + ")");
  return Status::ok();
}

}  // namespace

size_t append_saved_bytes(const AttnParams& p, const KvAppend& a) {
  if (a.seqlen_new == 0 || p.batch == 0 || a.k_new == nullptr) return 0;
  return size_t(p.batch) * size_t(a.seqlen_new) * size_t(p.heads_kv) * size_t(p.head_dim + p.head_dim_v) *
         size_t(dtype_bytes(p.kv_dtype));
}

Status append_kv(const AttnParams& p, const KvAppend& a, void* saved) { return launch(p, a, saved, Mode::append); }

Status restore_kv(const AttnParams& p, const KvAppend& a, const void* saved) {
  return launch(p, a, const_cast<void*>(saved), Mode::restore);
}

}  // namespace ioattn::gpu
