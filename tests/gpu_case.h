// The GPU forward suites' harness: a case (shapes, dtype, mask, layout, value pattern), its host
// and guarded device buffers, the fp64 oracle with FlashAttention-2's tolerance rule, and the
// check of a kernel's output and log-sum-exp against it. Shared by tests/test_gpu_forward.cc
// (every kernel through dispatch) and tests/test_gpu_sm90.cc (the sm_90a path).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/params.h"
#include "common/reference.h"
#include "gpu/gpu_backend.h"
#include "tests/catch.h"

namespace gpu_case {

using ioattn::AttnParams;
using ioattn::DType;

// How a (B, S, H, D) tensor sits in memory: "bshd" or "bhsd" axis order, and extra elements
// after each row (8 keeps 16-byte rows for the tensor-core path; an odd pad sends half-precision
// inputs to the portable path).
struct Layout {
  bool head_major = false;
  int64_t row_pad = 0;
};

struct Tensor {
  int64_t batch, seqlen, heads, dim;
  int64_t stride_batch, stride_seq, stride_head;
  int64_t elements;  // span the strides address
};

inline Tensor make_tensor(int64_t b, int64_t s, int64_t h, int64_t d, Layout l) {
  Tensor t{b, s, h, d, 0, 0, 0, 0};
  const int64_t row = d + l.row_pad;
  if (l.head_major) {
    t.stride_seq = row;
    t.stride_head = s * row;
    t.stride_batch = h * s * row;
  } else {
    t.stride_head = row;
    t.stride_seq = h * row;
    t.stride_batch = s * h * row;
  }
  t.elements = b * t.stride_batch;
  return t;
}

struct Case {
  int64_t batch = 1, heads_q = 2, heads_kv = 2, seqlen_q = 64, seqlen_k = 64, head_dim = 64, head_dim_v = -1;
  DType dtype = DType::bf16;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.f, scale = 0.f;
  Layout layout;
  float q_mul = 1.f, kv_mul = 1.f;
  bool outliers = false;
  bool constant_133120 = false;
  uint32_t seed = 1;

  std::string name() const {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "%s B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld Dv=%lld causal=%d win=(%lld,%lld) softcap=%g "
                  "scale=%g %s pad=%lld qmul=%g outliers=%d",
                  ioattn::dtype_name(dtype), (long long)batch, (long long)heads_q, (long long)heads_kv,
                  (long long)seqlen_q, (long long)seqlen_k, (long long)head_dim, (long long)dv(), int(causal),
                  (long long)window_left, (long long)window_right, double(softcap), double(scale),
                  layout.head_major ? "bhsd" : "bshd", (long long)layout.row_pad, double(q_mul), int(outliers));
    return buf;
  }
  int64_t dv() const { return head_dim_v < 0 ? head_dim : head_dim_v; }
};

// One case of the suites' head-dim x dtype x lengths x mask grids: batch 2, two query heads on one
// kv head; mask 0 is none, 1 causal, 2 a window drawn from the seed (left below left_mod, right
// below right_mod), so each suite picks windows narrow or wide against its tiles.
inline Case grid_case(int64_t head_dim, DType dtype, int64_t seqlen_q, int64_t seqlen_k, int mask, uint32_t seed,
                      uint32_t left_mod, uint32_t right_mod) {
  Case c;
  c.head_dim = head_dim;
  c.dtype = dtype;
  c.seqlen_q = seqlen_q;
  c.seqlen_k = seqlen_k;
  c.batch = 2;
  c.heads_q = 2;
  c.heads_kv = 1;
  c.causal = mask == 1;
  if (mask == 2) {
    c.window_left = int64_t(seed % left_mod);
    c.window_right = int64_t(seed % right_mod);
  }
  c.seed = seed;
  return c;
}

#define CUDA_OK(expr) REQUIRE((expr) == cudaSuccess)

// Host storage of one tensor in its dtype, plus its device copy surrounded by guard bytes that
// must come back untouched.
struct Buffer {
  static constexpr size_t kGuard = 256;
  DType dtype;
  std::vector<unsigned char> host;
  unsigned char* device = nullptr;

  Buffer(DType t, int64_t elements) : dtype(t), host(size_t(elements) * size_t(ioattn::dtype_bytes(t)), 0) {}
  ~Buffer() {
    if (device) cudaFree(device);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() { return device + kGuard; }
  void upload() {
    CUDA_OK(cudaMalloc(&device, host.size() + 2 * kGuard));
    CUDA_OK(cudaMemset(device, 0xff, host.size() + 2 * kGuard));
    CUDA_OK(cudaMemcpy(device + kGuard, host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  // Poisons the payload (0xff bytes are NaN in f32, f16 and bf16) so unwritten outputs fail.
  void allocate_poisoned() {
    CUDA_OK(cudaMalloc(&device, host.size() + 2 * kGuard));
    CUDA_OK(cudaMemset(device, 0xff, host.size() + 2 * kGuard));
  }
  void download_checked() {
    std::vector<unsigned char> all(host.size() + 2 * kGuard);
    CUDA_OK(cudaMemcpy(all.data(), device, all.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < kGuard; ++i) {
      REQUIRE(all[i] == 0xff);
      REQUIRE(all[all.size() - 1 - i] == 0xff);
    }
    std::memcpy(host.data(), all.data() + kGuard, host.size());
  }
  float get(int64_t i) const { return ioattn::load_as_f32(host.data(), i, dtype); }
  void set(int64_t i, float x) { ioattn::store_from_f32(host.data(), i, dtype, x); }
};

struct Problem {
  Case c;
  Tensor tq, tk, tv, to;
  Buffer q, k, v, out, lse;
  AttnParams p;  // host pointers (reference); device pointers are swapped in for the kernel

  explicit Problem(const Case& cs)
      : c(cs),
        tq(make_tensor(cs.batch, cs.seqlen_q, cs.heads_q, cs.head_dim, cs.layout)),
        tk(make_tensor(cs.batch, cs.seqlen_k, cs.heads_kv, cs.head_dim, cs.layout)),
        tv(make_tensor(cs.batch, cs.seqlen_k, cs.heads_kv, cs.dv(), cs.layout)),
        to(make_tensor(cs.batch, cs.seqlen_q, cs.heads_q, cs.dv(), cs.layout)),
        q(cs.dtype, tq.elements),
        k(cs.dtype, tk.elements),
        v(cs.dtype, tv.elements),
        out(cs.dtype, to.elements),
        lse(DType::f32, cs.batch * cs.heads_q * cs.seqlen_q) {
    std::mt19937 rng(cs.seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_real_distribution<float> unit(0.f, 1.f);
    // Padding lanes hold NaN: a kernel that reads them poisons its output.
    auto fill = [&](Buffer& b, const Tensor& t, float mul) {
      for (int64_t i = 0; i < t.elements; ++i) b.set(i, NAN);
      for (int64_t bi = 0; bi < t.batch; ++bi)
        for (int64_t s = 0; s < t.seqlen; ++s) {
          const float row_mul = cs.outliers && unit(rng) < 0.05f ? 10.f : 1.f;
          for (int64_t h = 0; h < t.heads; ++h)
            for (int64_t d = 0; d < t.dim; ++d) {
              float x = normal(rng) * mul * row_mul;
              if (cs.outliers && unit(rng) < 0.01f) x *= 20.f;
              if (cs.constant_133120) x = 133120.f;
              b.set(bi * t.stride_batch + s * t.stride_seq + h * t.stride_head + d, x);
            }
        }
    };
    fill(q, tq, cs.q_mul);
    fill(k, tk, cs.kv_mul);
    fill(v, tv, cs.kv_mul);

    p.io_dtype = p.kv_dtype = cs.dtype;
    p.batch = cs.batch;
    p.heads_q = cs.heads_q;
    p.heads_kv = cs.heads_kv;
    p.head_dim = cs.head_dim;
    p.head_dim_v = cs.dv();
    p.seqlen_q = cs.seqlen_q;
    p.seqlen_k = cs.seqlen_k;
    p.q_batch_stride = tq.stride_batch, p.q_seq_stride = tq.stride_seq, p.q_head_stride = tq.stride_head;
    p.k_batch_stride = tk.stride_batch, p.k_seq_stride = tk.stride_seq, p.k_head_stride = tk.stride_head;
    p.v_batch_stride = tv.stride_batch, p.v_seq_stride = tv.stride_seq, p.v_head_stride = tv.stride_head;
    p.o_batch_stride = to.stride_batch, p.o_seq_stride = to.stride_seq, p.o_head_stride = to.stride_head;
    p.lse_batch_stride = cs.heads_q * cs.seqlen_q;
    p.lse_head_stride = cs.seqlen_q;
    p.scale = cs.scale != 0.f ? cs.scale : 1.f / std::sqrt(float(cs.head_dim));
    p.softcap = cs.softcap;
    p.causal = cs.causal;
    p.window_left = cs.window_left;
    p.window_right = cs.window_right;
    p.num_threads = 2;
    p.q = q.host.data();
    p.k = k.host.data();
    p.v = v.host.data();
  }

  AttnParams device_params() {
    q.upload();
    k.upload();
    v.upload();
    out.allocate_poisoned();
    lse.allocate_poisoned();
    AttnParams d = p;
    d.q = q.data();
    d.k = k.data();
    d.v = v.data();
    d.out = out.data();
    d.lse = reinterpret_cast<float*>(lse.data());
    return d;
  }

  // Runs the CUDA forward; out.host and lse.host then hold its results.
  void run_gpu() { run_gpu(device_params()); }
  // The same on the params device_params() returned (its buffers are uploaded once).
  void run_gpu(const AttnParams& d) {
    const ioattn::Status s = ioattn::gpu::forward(d);
    INFO(s.message);
    REQUIRE(s.is_ok());
    CUDA_OK(cudaDeviceSynchronize());
    out.download_checked();
    lse.download_checked();
  }
};

// Visits every output element (o index into the out tensor) and every lse element.
template <class OutFn, class LseFn>
void for_each_output(const Problem& pr, OutFn out_fn, LseFn lse_fn) {
  const AttnParams& p = pr.p;
  for (int64_t b = 0; b < p.batch; ++b) {
    const ioattn::SeqSpan s = ioattn::sequence(p, b);
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        const int64_t oo = ioattn::o_offset(p, b, s, i, h);
        for (int64_t c = 0; c < p.head_dim_v; ++c) out_fn(oo + c);
        lse_fn(ioattn::lse_offset(p, b, s, i, h));
      }
  }
}

// Output rounding noise of the storage type: 2 ulp of the largest reference magnitude.
inline double output_floor(DType t, double max_abs) {
  const double rel = t == DType::bf16  ? std::ldexp(1.0, -7)
                     : t == DType::f16 ? std::ldexp(1.0, -10)
                                       : std::ldexp(1.0, -23);
  return 2.0 * rel * std::max(max_abs, 1e-6);
}

struct Oracle {
  std::vector<double> out_ref, lse_ref;
  double out_tol = 0, max_ref = 0;
  std::vector<double> lse_tol;  // per row: 2 * |naive_f32 - ref| + floor
};

// The FlashAttention-2 rule: max|kernel - ref| <= 2 * max|naive_same_dtype - ref| + floor, with
// naive_same_dtype the fp32 naive attention rounded to the storage type.
inline Oracle make_oracle(const Problem& pr) {
  Oracle o;
  o.out_ref.assign(size_t(pr.to.elements), 0.0);
  o.lse_ref.assign(pr.lse.host.size() / 4, 0.0);
  std::vector<float> out_naive(size_t(pr.to.elements)), lse_naive(o.lse_ref.size());
  ioattn::naive_attention<double>(pr.p, o.out_ref.data(), o.lse_ref.data());
  ioattn::naive_attention<float>(pr.p, out_naive.data(), lse_naive.data());
  double naive_err = 0;
  o.lse_tol.assign(o.lse_ref.size(), 0.0);
  for_each_output(
      pr,
      [&](int64_t i) {
        const double ref = o.out_ref[size_t(i)];
        const double naive = ioattn::round_to(pr.c.dtype, out_naive[size_t(i)]);
        if (std::isfinite(ref)) {
          naive_err = std::max(naive_err, std::fabs(naive - ref));
          o.max_ref = std::max(o.max_ref, std::fabs(ref));
        }
      },
      [&](int64_t i) {
        const double ref = o.lse_ref[size_t(i)];
        if (std::isfinite(ref))
          o.lse_tol[size_t(i)] =
              2 * std::fabs(double(lse_naive[size_t(i)]) - ref) + 1e-5 * std::max(1.0, std::fabs(ref));
      });
  o.out_tol = 2 * naive_err + output_floor(pr.c.dtype, o.max_ref);
  return o;
}

// Kernel output vs oracle: within tolerance, NaN only where the oracle has NaN, infinities equal.
inline void check_against(const Problem& pr, const Oracle& o) {
  double worst = 0;
  int64_t bad_lse = 0, nan_mismatch = 0;
  for_each_output(
      pr,
      [&](int64_t i) {
        const double ref = o.out_ref[size_t(i)], got = pr.out.get(i);
        if (std::isnan(ref) != std::isnan(got)) {
          ++nan_mismatch;
          return;
        }
        if (!std::isnan(ref)) worst = std::max(worst, std::fabs(got - ref));
      },
      [&](int64_t i) {
        const double ref = o.lse_ref[size_t(i)];
        const double got = reinterpret_cast<const float*>(pr.lse.host.data())[i];
        if (std::isnan(ref) || std::isinf(ref)) {
          if (!(std::isnan(ref) ? std::isnan(got) : got == ref)) ++bad_lse;
        } else if (!(std::fabs(got - ref) <= o.lse_tol[size_t(i)])) {
          ++bad_lse;
        }
      });
  INFO(pr.c.name());
  INFO("max |out - ref| = " << worst << ", tolerance " << o.out_tol << " (max |ref| " << o.max_ref << ")");
  CHECK(nan_mismatch == 0);
  CHECK(worst <= o.out_tol);
  CHECK(bad_lse == 0);
}

inline void check_case(const Case& c) {
  Problem pr(c);
  const Oracle o = make_oracle(pr);
  pr.run_gpu();
  check_against(pr, o);
}

}  // namespace gpu_case
