// The Highway parts of the peers: the FMA-peak and read-bandwidth probes and the standard
// attention's row softmax, compiled for every target and dispatched once per call.
// clang-format off: foreach_target.h must follow HWY_TARGET_INCLUDE, before the other includes.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/lib/probes.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "bench/lib/probes.h"
#include "common/online_softmax.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ioattn::peers {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Vector registers the target has: 32 on AVX-512 and AArch64, 16 on AVX2, SSE and ARMv7 NEON.
constexpr int kVectorRegisters = ((HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3) || HWY_ARCH_ARM_A64) ? 32 : 16;
// Independent FMA chains: at least latency x FMA ports of the cores in bench/lib/ceilings.cc's
// table (4-5 cycles x 2 on x86 = 10, 4 x 4 on Neoverse V1/V2 = 16), plus the two constants, within
// the register file: 12 + 2 of 16, 24 + 2 of 32.
constexpr int kChains = kVectorRegisters == 32 ? 24 : 12;

// kChains chains in named locals, so they stay in registers whatever the compiler's unrolling
// (an array of accumulators left in memory adds a store-to-load round trip to every chain). An
// iteration is 4 steps of kChains register-to-register FMAs: the loop counter's add and branch,
// which the scheduler may put on an FMA port, then cost at most 2 slots in 2 + 4 x kChains (2% at
// 24 chains) instead of 2 in 2 + kChains (8%). acc -> acc * 0.999999 + 1e-6 converges to 1, so
// values stay normal (no denormal slow path) and the loop cannot fold.
float FmaChains(int64_t iterations) {
  const DF df;
  const VF mul = hn::Set(df, 0.999999f), add = hn::Set(df, 1e-6f);
  const auto start = [&](int i) { return hn::Set(df, 0.5f + 0.01f * float(i)); };
  VF a0 = start(0), a1 = start(1), a2 = start(2), a3 = start(3), a4 = start(4), a5 = start(5);
  VF a6 = start(6), a7 = start(7), a8 = start(8), a9 = start(9), a10 = start(10), a11 = start(11);
  VF b0 = start(12), b1 = start(13), b2 = start(14), b3 = start(15), b4 = start(16), b5 = start(17);
  VF b6 = start(18), b7 = start(19), b8 = start(20), b9 = start(21), b10 = start(22), b11 = start(23);
  const auto step = [&] {
    a0 = hn::MulAdd(a0, mul, add);
    a1 = hn::MulAdd(a1, mul, add);
    a2 = hn::MulAdd(a2, mul, add);
    a3 = hn::MulAdd(a3, mul, add);
    a4 = hn::MulAdd(a4, mul, add);
    a5 = hn::MulAdd(a5, mul, add);
    a6 = hn::MulAdd(a6, mul, add);
    a7 = hn::MulAdd(a7, mul, add);
    a8 = hn::MulAdd(a8, mul, add);
    a9 = hn::MulAdd(a9, mul, add);
    a10 = hn::MulAdd(a10, mul, add);
    a11 = hn::MulAdd(a11, mul, add);
    if constexpr (kChains == 24) {
      b0 = hn::MulAdd(b0, mul, add);
      b1 = hn::MulAdd(b1, mul, add);
      b2 = hn::MulAdd(b2, mul, add);
      b3 = hn::MulAdd(b3, mul, add);
      b4 = hn::MulAdd(b4, mul, add);
      b5 = hn::MulAdd(b5, mul, add);
      b6 = hn::MulAdd(b6, mul, add);
      b7 = hn::MulAdd(b7, mul, add);
      b8 = hn::MulAdd(b8, mul, add);
      b9 = hn::MulAdd(b9, mul, add);
      b10 = hn::MulAdd(b10, mul, add);
      b11 = hn::MulAdd(b11, mul, add);
    }
  };
  for (int64_t it = 0; it < iterations; ++it) {
    step();
    step();
    step();
    step();
  }
  VF sum = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  sum = hn::Add(sum, hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  if constexpr (kChains == 24) {
    sum = hn::Add(sum, hn::Add(hn::Add(hn::Add(b0, b1), hn::Add(b2, b3)), hn::Add(hn::Add(b4, b5), hn::Add(b6, b7))));
    sum = hn::Add(sum, hn::Add(hn::Add(b8, b9), hn::Add(b10, b11)));
  }
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

// The clock while the FMA pipes run: each step issues 20 FMAs and kAdds dependent integer adds
// (one cycle each; the empty asm keeps the compiler from folding them, the unknown addend keeps
// the renamer from it). kAdds = fma_clock_adds(FMAs a cycle) gives the 20 FMAs 83% of the adds'
// cycles (24 at 1 a cycle, 12 at 2, 6 at 4), so the add chain sets the pace with the FMA pipes
// 83% busy, dense enough for the lower clock Intel cores hold under dense 512-bit FMAs, and
// steps x kAdds is the cycle count at that clock. The 20 FMAs run on 20 chains where there are 32
// registers (4 cycles of latency, under the 6 of the 4-a-cycle cores), else on 12, 8 of them
// twice (10 cycles at Zen 2's 5, under 12). Should the FMAs run under 83% of their rate, the FMAs
// set the pace and the clock reads low: the integer-only clock is reported beside it. Returns
// the adds' total, which keeps them alive.
template <int kAdds>
uint64_t FmaClockChainT(int64_t iterations) {
  const DF df;
  const VF mul = hn::Set(df, 0.999999f), add = hn::Set(df, 1e-6f);
  const auto start = [&](int i) { return hn::Set(df, 0.5f + 0.01f * float(i)); };
  VF a0 = start(0), a1 = start(1), a2 = start(2), a3 = start(3), a4 = start(4), a5 = start(5);
  VF a6 = start(6), a7 = start(7), a8 = start(8), a9 = start(9), a10 = start(10), a11 = start(11);
  VF b0 = start(12), b1 = start(13), b2 = start(14), b3 = start(15), b4 = start(16), b5 = start(17);
  VF b6 = start(18), b7 = start(19);
  uint64_t x = 0, y = 1;
  asm volatile("" : "+r"(y));
  for (int64_t it = 0; it < iterations; ++it) {
    a0 = hn::MulAdd(a0, mul, add);
    a1 = hn::MulAdd(a1, mul, add);
    a2 = hn::MulAdd(a2, mul, add);
    a3 = hn::MulAdd(a3, mul, add);
    a4 = hn::MulAdd(a4, mul, add);
    a5 = hn::MulAdd(a5, mul, add);
    a6 = hn::MulAdd(a6, mul, add);
    a7 = hn::MulAdd(a7, mul, add);
    a8 = hn::MulAdd(a8, mul, add);
    a9 = hn::MulAdd(a9, mul, add);
    a10 = hn::MulAdd(a10, mul, add);
    a11 = hn::MulAdd(a11, mul, add);
    if constexpr (kVectorRegisters == 32) {
      b0 = hn::MulAdd(b0, mul, add);
      b1 = hn::MulAdd(b1, mul, add);
      b2 = hn::MulAdd(b2, mul, add);
      b3 = hn::MulAdd(b3, mul, add);
      b4 = hn::MulAdd(b4, mul, add);
      b5 = hn::MulAdd(b5, mul, add);
      b6 = hn::MulAdd(b6, mul, add);
      b7 = hn::MulAdd(b7, mul, add);
    } else {
      a0 = hn::MulAdd(a0, mul, add);
      a1 = hn::MulAdd(a1, mul, add);
      a2 = hn::MulAdd(a2, mul, add);
      a3 = hn::MulAdd(a3, mul, add);
      a4 = hn::MulAdd(a4, mul, add);
      a5 = hn::MulAdd(a5, mul, add);
      a6 = hn::MulAdd(a6, mul, add);
      a7 = hn::MulAdd(a7, mul, add);
    }
#pragma GCC unroll 24
    for (int k = 0; k < kAdds; ++k) {
      x += y;
      asm volatile("" : "+r"(x));
    }
  }
  VF sum = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  sum = hn::Add(sum, hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  sum = hn::Add(sum, hn::Add(hn::Add(hn::Add(b0, b1), hn::Add(b2, b3)), hn::Add(hn::Add(b4, b5), hn::Add(b6, b7))));
  return x + static_cast<uint64_t>(hn::GetLane(hn::SumOfLanes(df, sum)));
}

uint64_t FmaClockChain(int64_t iterations, int adds) {
  switch (adds) {
    case 6: return FmaClockChainT<6>(iterations);
    case 24: return FmaClockChainT<24>(iterations);
    default: return FmaClockChainT<12>(iterations);
  }
}

int64_t FmaFlopsPerIteration() { return 4 * kChains * 2 * static_cast<int64_t>(hn::Lanes(DF())); }

int FloatLanes() { return static_cast<int>(hn::Lanes(DF())); }

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

// Whether MulAdd is one FMA instruction here (SSE2-SSE4 emulate it with a multiply and an add).
bool NativeFma() { return HWY_NATIVE_FMA; }

// Sums n floats (64-byte aligned, a multiple of the vector) with 8 independent add chains, so the
// loop is bound by the loads, not by add latency. kStreams splits the floats into that many
// contiguous parts read side by side, each 8 / kStreams vectors a step: several sequential streams
// per core, which the hardware prefetchers track separately (a core's one stream can be
// prefetch-bound). The floats past the last whole step of every part are summed one vector at a
// time.
template <size_t kStreams>
float ReadStreams(const float* data, size_t n) {
  static_assert(kStreams >= 1 && 8 % kStreams == 0, "8 accumulators over the streams");
  constexpr size_t kPer = 8 / kStreams;
  const DF df;
  const size_t N = hn::Lanes(df), step = kPer * N, part = n / kStreams / step * step;
  // Accumulator j reads part j / kPer at vector j % kPer of the step; named vectors, as scalable
  // vectors (SVE) cannot form an array.
  const auto at = [&](size_t j) { return j / kPer * part + j % kPer * N; };
  const size_t o0 = at(0), o1 = at(1), o2 = at(2), o3 = at(3), o4 = at(4), o5 = at(5), o6 = at(6), o7 = at(7);
  VF a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (size_t i = 0; i < part; i += step) {
    const float* p = data + i;
    a0 = hn::Add(a0, hn::Load(df, p + o0));
    a1 = hn::Add(a1, hn::Load(df, p + o1));
    a2 = hn::Add(a2, hn::Load(df, p + o2));
    a3 = hn::Add(a3, hn::Load(df, p + o3));
    a4 = hn::Add(a4, hn::Load(df, p + o4));
    a5 = hn::Add(a5, hn::Load(df, p + o5));
    a6 = hn::Add(a6, hn::Load(df, p + o6));
    a7 = hn::Add(a7, hn::Load(df, p + o7));
  }
  for (size_t i = kStreams * part; i + N <= n; i += N) a0 = hn::Add(a0, hn::Load(df, data + i));
  const VF sum = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

float ReadStream(const float* data, size_t n, int streams) {
  switch (streams) {
    case 2: return ReadStreams<2>(data, n);
    case 4: return ReadStreams<4>(data, n);
    case 8: return ReadStreams<8>(data, n);
    default: return ReadStreams<1>(data, n);
  }
}

// One row of the standard path: keys outside [lo, hi) become -inf, softcap applies, then the
// normalized softmax is written in place; returns the row's lse. Uses the same -inf rules as
// the kernels (a row with no visible key is all zeros, lse -inf).
float SoftmaxRow(float* row, int64_t n, int64_t lo, int64_t hi, float softcap) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const VF neg_inf = hn::Set(df, -INFINITY), vcap = hn::Set(df, softcap);
  for (int64_t j = 0; j < lo && j < n; ++j) row[j] = -INFINITY;
  for (int64_t j = hi; j < n; ++j) row[j] = -INFINITY;
  VF mx = neg_inf;
  int64_t j = lo;
  for (; j + N <= hi; j += N) {
    VF s = hn::LoadU(df, row + j);
    if (softcap > 0.f) s = hn::Mul(vcap, hn::Tanh(df, hn::Div(s, vcap)));
    hn::StoreU(s, df, row + j);
    mx = hn::Max(mx, s);
  }
  float m = hn::GetLane(hn::MaxOfLanes(df, mx));
  for (; j < hi; ++j) {
    if (softcap > 0.f) row[j] = softcap * std::tanh(row[j] / softcap);
    m = std::fmax(m, row[j]);
  }
  const VF ref = hn::Set(df, softmax::max_for_exp(m));
  VF sum = hn::Zero(df);
  for (j = 0; j + N <= n; j += N) {
    const VF p = hn::Exp(df, hn::Sub(hn::LoadU(df, row + j), ref));
    hn::StoreU(p, df, row + j);
    sum = hn::Add(sum, p);
  }
  float l = hn::GetLane(hn::SumOfLanes(df, sum));
  for (; j < n; ++j) {
    row[j] = std::exp(row[j] - softmax::max_for_exp(m));
    l += row[j];
  }
  const VF inv = hn::Set(df, softmax::output_scale(l));
  for (j = 0; j + N <= n; j += N) hn::StoreU(hn::Mul(hn::LoadU(df, row + j), inv), df, row + j);
  for (; j < n; ++j) row[j] *= softmax::output_scale(l);
  return softmax::row_lse(m, l, softmax::Domain::natural);
}

}  // namespace HWY_NAMESPACE
}  // namespace ioattn::peers
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ioattn::peers {

HWY_EXPORT(FmaChains);
HWY_EXPORT(FmaFlopsPerIteration);
HWY_EXPORT(FmaClockChain);
HWY_EXPORT(FloatLanes);
HWY_EXPORT(TargetName);
HWY_EXPORT(NativeFma);
HWY_EXPORT(ReadStream);
HWY_EXPORT(SoftmaxRow);

float fma_chains(int64_t iterations) { return HWY_DYNAMIC_DISPATCH(FmaChains)(iterations); }
int64_t fma_flops_per_iteration() { return HWY_DYNAMIC_DISPATCH(FmaFlopsPerIteration)(); }
int fma_clock_adds(int fma_per_cycle) { return fma_per_cycle <= 1 ? 24 : fma_per_cycle >= 4 ? 6 : 12; }
uint64_t fma_clock_chain(int64_t iterations, int fma_per_cycle) {
  return HWY_DYNAMIC_DISPATCH(FmaClockChain)(iterations, fma_clock_adds(fma_per_cycle));
}
int float_lanes() { return HWY_DYNAMIC_DISPATCH(FloatLanes)(); }
const char* probe_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }
bool probe_native_fma() { return HWY_DYNAMIC_DISPATCH(NativeFma)(); }
float read_stream(const float* data, size_t n, int streams) {
  return HWY_DYNAMIC_DISPATCH(ReadStream)(data, n, streams);
}
float softmax_row(float* row, int64_t n, int64_t lo, int64_t hi, float softcap) {
  return HWY_DYNAMIC_DISPATCH(SoftmaxRow)(row, n, lo, hi, softcap);
}

}  // namespace ioattn::peers
#endif  // HWY_ONCE
