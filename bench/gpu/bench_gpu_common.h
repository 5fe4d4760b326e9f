// What bench_gpu_forward and bench_gpu_decode share: CUDA error reporting, the input generator,
// and the fp64 reference that their output checks compare rows against.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace ioattn::gpu_bench {

inline bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// Both benchmarks' exits before any measurement: 2 for a flag they do not know, 77 (ctest's skip
// status) where no CUDA device is visible.
inline int unknown_flag(const std::string& flag) {
  std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
  return 2;
}
inline int skipped_without_device() {
  std::printf("SKIPPED: no CUDA device\n");
  return 77;
}

// A 64-bit LCG: fast enough for 10^8 values and never zeros (zeros run faster on
// the GPU and hide unwritten outputs).
struct Lcg {
  uint64_t state;
  float next() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return float(int32_t(state >> 32)) * (1.f / 2147483648.f);
  }
};

// The larger error, NaN sticky: a NaN output must fail the check, and std::max(worst, NaN)
// returns worst.
inline double worst_error(double worst, double err) { return std::isnan(worst) || err <= worst ? worst : err; }

// Max |out[c] - ref[c]| over one query row's d outputs, ref = softmax(q . k_j / sqrt(d)) . v
// recomputed in double from the same bf16 values, over keys j in [0, keys) whose K and V rows
// start kv_stride elements apart.
inline double row_error(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t kv_stride, int64_t keys,
                        int64_t d, const uint16_t* out) {
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> sc(static_cast<size_t>(keys));
  double mx = -INFINITY;
  for (int64_t j = 0; j < keys; ++j) {
    double dot = 0;
    for (int64_t c = 0; c < d; ++c) dot += double(bf16_to_f32(q[c])) * bf16_to_f32(k[size_t(j * kv_stride + c)]);
    sc[size_t(j)] = dot * scale;
    mx = std::max(mx, sc[size_t(j)]);
  }
  double sum = 0;
  std::vector<double> acc(size_t(d), 0.0);
  for (int64_t j = 0; j < keys; ++j) {
    const double w = std::exp(sc[size_t(j)] - mx);
    sum += w;
    for (int64_t c = 0; c < d; ++c) acc[size_t(c)] += w * bf16_to_f32(v[size_t(j * kv_stride + c)]);
  }
  double worst = 0;
  for (int64_t c = 0; c < d; ++c) worst = worst_error(worst, std::fabs(acc[size_t(c)] / sum - bf16_to_f32(out[c])));
  return worst;
}

}  // namespace ioattn::gpu_bench
