// Caller rows into the kernel: f16/bf16 widened to f32 (exact), the decode Q layout, and the
// software prefetch of rows the hardware prefetchers cannot follow.
// Per-target code: included by cpu/flash_kernel.cc once for every Highway target.
#if defined(IOATTN_CPU_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef IOATTN_CPU_CONVERT_INL_H_
#undef IOATTN_CPU_CONVERT_INL_H_
#else
#define IOATTN_CPU_CONVERT_INL_H_
#endif

#include <cstring>
#include <type_traits>

#include "common/dtype.h"
#include "cpu/tiles-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ioattn::cpu {
namespace HWY_NAMESPACE {

// Conversion of a caller's row into f32 scratch: f16/bf16 are widened with PromoteTo (exact), so
// the micro-kernels only ever see f32.

void RowToF32(const void* base, int64_t offset, DType type, int64_t n, float* dst) {
  const DF df;
  int64_t i = 0;
  if (type == DType::f32) {
    std::memcpy(dst, static_cast<const float*>(base) + offset, size_t(n) * sizeof(float));
    return;
  }
  if (type == DType::f16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto* src = static_cast<const hwy::float16_t*>(base) + offset;
    for (; i + kLanes <= n; i += kLanes) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, src + i)), df, dst + i);
  } else {
    const hn::Rebind<hwy::bfloat16_t, DF> db;
    const auto* src = static_cast<const hwy::bfloat16_t*>(base) + offset;
    for (; i + kLanes <= n; i += kLanes) hn::StoreU(hn::PromoteTo(df, hn::LoadU(db, src + i)), df, dst + i);
  }
  for (; i < n; ++i) dst[i] = load_as_f32(base, offset + i, type);
}

template <class T>
HWY_INLINE VF LoadWide(const T* p) {
  const DF df;
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else {
    const hn::Rebind<T, DF> dt;
    return hn::PromoteTo(df, hn::LoadU(dt, p));
  }
}

template <class T>
constexpr DType kDTypeOf = std::is_same_v<T, float>            ? DType::f32
                           : std::is_same_v<T, hwy::float16_t> ? DType::f16
                                                               : DType::bf16;

// Decode's Q: rows in chunks of kDecodeRowChunk, each chunk D x kDecodeRowChunk floats laid out
// [d / lanes][row][lanes] for the whole vectors of D, then [row][tail] for the rest. The score
// loop then reads every row of its chunk from one pointer at fixed offsets: with a pointer per
// row, its four K rows, the prefetch queue's cursor and the loop counters wanted more than x86's
// 15 free general registers, and GCC parked the K row pointers in vector registers (a vmovq back
// before every load).
void DecodeQ(const float* row, int64_t r, int64_t D, float* qt) {
  const int64_t dv = D / kLanes * kLanes, rr = r % kDecodeRowChunk;
  float* chunk = qt + (r - rr) * D;
  for (int64_t d = 0; d < dv; d += kLanes)
    std::memcpy(chunk + kDecodeRowChunk * d + rr * kLanes, row + d, size_t(kLanes) * sizeof(float));
  std::memcpy(chunk + kDecodeRowChunk * dv + rr * (D - dv), row + dv, size_t(D - dv) * sizeof(float));
}

// The caller's K/V rows are usually far apart (stride Hkv x D elements: one 4 KiB page per row
// at Hkv = 8, D = 128), which defeats the hardware prefetchers' in-page streams, so copying a row
// waits a full memory latency. Head mode packs each head once; per-tile packing prefetches the next block a few rows
// per score step, and within a copy loop kPrefetchRows rows ahead (a tile's first block has no predecessor to hide its
// misses behind).
constexpr int64_t kPrefetchRows = 8;

void PrefetchRow(const void* base, int64_t offset, DType type, int64_t n) {
  const int64_t eb = dtype_bytes(type);
  const char* row = static_cast<const char*>(base) + offset * eb;
  for (int64_t byte = 0; byte < n * eb; byte += 64) __builtin_prefetch(row + byte, 0, 3);
  __builtin_prefetch(row + n * eb - 1, 0, 3);
}

}  // namespace HWY_NAMESPACE
}  // namespace ioattn::cpu
HWY_AFTER_NAMESPACE();

#endif  // IOATTN_CPU_CONVERT_INL_H_
