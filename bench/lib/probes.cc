// The Highway parts of the peers: the FMA-peak and read-bandwidth probes and the standard
// attention's row softmax, compiled for every target and dispatched once per call.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/lib/probes.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "bench/lib/probes.h"
#include "common/online_softmax.h"
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace ioattn::peers {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// 12 chains: each FMA depends only on its own chain's previous result, so 12 are in flight;
// 4 cycles of latency x 2 ports needs 8. acc -> acc * 0.999999 + 1e-6 converges to 1, so values
// stay normal (no denormal slow path) and the compiler cannot fold the loop.
float FmaChains(int64_t iterations) {
  const DF df;
  constexpr int kChains = 12;
  VF acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = hn::Set(df, 0.5f + 0.01f * float(i));
  const VF mul = hn::Set(df, 0.999999f), add = hn::Set(df, 1e-6f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = hn::MulAdd(acc[i], mul, add);
  }
  VF sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = hn::Add(sum, acc[i]);
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

int64_t FmaFlopsPerIteration() { return 12 * 2 * static_cast<int64_t>(hn::Lanes(DF())); }

// Sums n floats (n a multiple of 8 vectors) with 8 independent add chains, so the loop is bound
// by the loads, not by add latency.
float ReadStream(const float* data, size_t n) {
  const DF df;
  const size_t N = hn::Lanes(df);
  VF acc[8];
  for (auto& a : acc) a = hn::Zero(df);
  for (size_t i = 0; i + 8 * N <= n; i += 8 * N) {
    for (size_t k = 0; k < 8; ++k) acc[k] = hn::Add(acc[k], hn::Load(df, data + i + k * N));
  }
  VF sum = acc[0];
  for (size_t k = 1; k < 8; ++k) sum = hn::Add(sum, acc[k]);
  return hn::GetLane(hn::SumOfLanes(df, sum));
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
HWY_EXPORT(ReadStream);
HWY_EXPORT(SoftmaxRow);

float fma_chains(int64_t iterations) { return HWY_DYNAMIC_DISPATCH(FmaChains)(iterations); }
int64_t fma_flops_per_iteration() { return HWY_DYNAMIC_DISPATCH(FmaFlopsPerIteration)(); }
float read_stream(const float* data, size_t n) { return HWY_DYNAMIC_DISPATCH(ReadStream)(data, n); }
float softmax_row(float* row, int64_t n, int64_t lo, int64_t hi, float softcap) {
  return HWY_DYNAMIC_DISPATCH(SoftmaxRow)(row, n, lo, hi, softcap);
}

}  // namespace ioattn::peers
#endif  // HWY_ONCE
