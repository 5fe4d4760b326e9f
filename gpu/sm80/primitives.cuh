// The sm_80 instruction vocabulary of the flash kernels: asynchronous global->shared copies,
// ldmatrix and the m16n8k16 tensor-core product, each a thin inline-PTX wrapper. Everything here
// also runs on sm_90; the sm_90a kernel (gpu/sm90/) has its own wgmma and TMA vocabulary and
// shares only gpu/primitives.cuh with this one.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
// g = lane / 4 and t = lane % 4:
//   A (16x16, row-major, 4 x b32): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..),
//                                  a3 = (g+8, 2t+8..)
//   B (16x8, "col": k contiguous, 2 x b32): b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C (16x8 fp32, 4 x f32): c0, c1 = (g, 2t), (g, 2t+1); c2, c3 = (g+8, 2t), (g+8, 2t+1)
// The C layout of two adjacent n8 tiles is exactly the A layout of one k16 slice, which is what
// lets the probabilities P stay in registers between the two products.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "gpu/primitives.cuh"

namespace ioattn::gpu::sm80 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte copy that bypasses L1 (.cg: K/V tiles are reused through shared memory, not L1).
// valid == false zero-fills the destination without reading src, which is how rows past the end
// of a sequence become zeros instead of out-of-bounds reads.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D += A B on the tensor cores, fp32 accumulate; AB is the PTX type of A and B ("bf16", "f16"),
// which an asm string cannot take from a template argument.
#define IOATTN_SM80_MMA_M16N8K16(AB)                     \
  asm("mma.sync.aligned.m16n8k16.row.col.f32." AB "." AB \
      ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "        \
      "{%8, %9}, {%0, %1, %2, %3};\n"                    \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])   \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

// The tensor-core instruction of a storage element type (its packed pairs: gpu/primitives.cuh).
template <class Elem>
struct ElemOps {
  static_assert(std::is_same_v<Elem, __nv_bfloat16> || std::is_same_v<Elem, __half>, "bf16 or f16 storage");
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (std::is_same_v<Elem, __nv_bfloat16>)
      IOATTN_SM80_MMA_M16N8K16("bf16");
    else
      IOATTN_SM80_MMA_M16N8K16("f16");
  }
};

#undef IOATTN_SM80_MMA_M16N8K16

}  // namespace ioattn::gpu::sm80
