// Storage types and their conversions. Highway 1.0.3's scalar BF16FromF32 truncates, while the
// contract asks for round-to-nearest-even output, so the bf16 rounding is spelled out here once.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/host_device.h"

namespace ioattn {

enum class DType : int32_t { f32 = 0, f16 = 1, bf16 = 2 };

constexpr int dtype_bytes(DType t) { return t == DType::f32 ? 4 : 2; }
constexpr const char* dtype_name(DType t) { return t == DType::f32 ? "f32" : t == DType::f16 ? "f16" : "bf16"; }

#if !defined(__CUDACC__)
inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even on the 16 dropped bits; NaN keeps a quiet payload so it cannot round
// into an infinity.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// GCC >= 12 and Clang implement _Float16 on x86-64 with IEEE round-to-nearest-even conversions
// (F16C instructions where present, a libgcc routine otherwise). Clang 14 (Debian 12's, which
// builds the fuzzers) lacks _Float16 on x86-64; its storage-only __fp16 converts with the same
// rounding through compiler-rt's __gnu_f2h_ieee / __gnu_h2f_ieee, so such builds link with
// --rtlib=compiler-rt (fuzz/CMakeLists.txt does). On AArch64, GCC accepts _Float16 in C++ only
// from version 13, while __fp16 is IEEE binary16 there (the ARM alternative format is opt-in)
// and converts with the FPCR's rounding, nearest-even by default, in one fcvt.
#if (defined(__clang__) && __clang_major__ < 15 && defined(__x86_64__)) || defined(__aarch64__)
using HalfStorage = __fp16;
#else
using HalfStorage = _Float16;
#endif
inline float f16_to_f32(uint16_t bits) {
  HalfStorage h;
  std::memcpy(&h, &bits, 2);
  return float(h);
}
inline uint16_t f32_to_f16(float f) {
  HalfStorage h = static_cast<HalfStorage>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

inline float load_as_f32(const void* base, int64_t index, DType t) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[index];
    case DType::f16: return f16_to_f32(static_cast<const uint16_t*>(base)[index]);
    case DType::bf16: return bf16_to_f32(static_cast<const uint16_t*>(base)[index]);
  }
  return 0.f;
}

inline void store_from_f32(void* base, int64_t index, DType t, float value) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[index] = value; return;
    case DType::f16: static_cast<uint16_t*>(base)[index] = f32_to_f16(value); return;
    case DType::bf16: static_cast<uint16_t*>(base)[index] = f32_to_bf16(value); return;
  }
}

// The value a float takes once stored in t and read back: how tests and the reference see
// exactly what the kernel sees.
inline float round_to(DType t, float value) {
  switch (t) {
    case DType::f32: return value;
    case DType::f16: return f16_to_f32(f32_to_f16(value));
    case DType::bf16: return bf16_to_f32(f32_to_bf16(value));
  }
  return value;
}
#endif

}  // namespace ioattn
