// The CUDA forward against the fp64 oracle with the FlashAttention-2 tolerance rule, against the
// CPU backend, for determinism over repeated launches, and for its rejections. Exits 77
// ("SKIPPED: no CUDA device") where no device is visible, which ctest reports as skipped.
//
// Tags: [sanitize] marks the small cases scripts/gpu_run.sh runs under compute-sanitizer
// (memcheck and racecheck multiply run time by 10-100x).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/params.h"
#include "common/reference.h"
#include "cpu/cpu_backend.h"
#include "gpu/gpu_backend.h"
#include "ioattn/ioattn.h"
#include "tests/catch.h"

#if IOATTN_HAVE_CUDA
#include <cuda_runtime.h>

namespace {

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

Tensor make_tensor(int64_t b, int64_t s, int64_t h, int64_t d, Layout l) {
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
  void run_gpu() {
    const AttnParams d = device_params();
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
double output_floor(DType t, double max_abs) {
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
Oracle make_oracle(const Problem& pr) {
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
void check_against(const Problem& pr, const Oracle& o) {
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

void check_case(const Case& c) {
  Problem pr(c);
  const Oracle o = make_oracle(pr);
  pr.run_gpu();
  check_against(pr, o);
}

}  // namespace

TEST_CASE("CUDA forward matches the fp64 oracle: lengths, head dims, dtypes, masks", "[gpu][sanitize]") {
  const int64_t dims[] = {64, 96, 128, 256};
  const DType types[] = {DType::bf16, DType::f16};
  struct Lengths {
    int64_t sq, sk;
  };
  // Odd lengths, Sq != Sk both ways, Sk far below one key block, Sq == 1 (decode).
  const Lengths lengths[] = {{1, 1}, {3, 17}, {97, 113}, {1, 339}, {239, 1}, {130, 7}, {127, 257}};
  uint32_t seed = 10;
  for (const int64_t d : dims)
    for (const DType t : types)
      for (const Lengths& len : lengths)
        for (const int mask : {0, 1, 2}) {
          Case c;
          c.head_dim = d;
          c.dtype = t;
          c.seqlen_q = len.sq;
          c.seqlen_k = len.sk;
          c.batch = 2;
          c.heads_q = 2;
          c.heads_kv = 1;
          c.causal = mask == 1;
          if (mask == 2) {  // a window drawn per case, both sides bounded
            c.window_left = int64_t(seed % 37);
            c.window_right = int64_t(seed % 11);
          }
          c.seed = seed++;
          check_case(c);
        }
}

TEST_CASE("CUDA forward: longer sequences cross many key blocks and the peeled masks", "[gpu]") {
  for (const int64_t d : {64, 128}) {
    for (const bool causal : {false, true}) {
      Case c;
      c.head_dim = d;
      c.seqlen_q = 1023;
      c.seqlen_k = 1025;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.causal = causal;
      c.seed = uint32_t(d + causal);
      check_case(c);
    }
  }
  Case c;  // causal with Sq > Sk: the top rows see no key at all (out 0, lse -inf)
  c.head_dim = 128;
  c.seqlen_q = 700;
  c.seqlen_k = 300;
  c.causal = true;
  c.dtype = DType::f16;
  check_case(c);
  c.seqlen_q = 300;  // sliding window with Sq < Sk, left and right bounded
  c.seqlen_k = 900;
  c.causal = false;
  c.window_left = 100;
  c.window_right = 20;
  check_case(c);
}

TEST_CASE("CUDA forward: GQA and MQA, softcap, scales, adversarial values", "[gpu][sanitize]") {
  Case base;
  base.head_dim = 128;
  base.seqlen_q = 77;
  base.seqlen_k = 150;
  SECTION("GQA ratios 1, 2, 4, 8 and MQA") {
    for (const int64_t kv : {8, 4, 2, 1}) {
      Case c = base;
      c.heads_q = 8;
      c.heads_kv = kv;
      c.causal = kv % 2 == 0;
      check_case(c);
    }
  }
  SECTION("softcap with saturated tanh") {
    Case c = base;
    c.softcap = 5.f;
    c.q_mul = 10.f;
    check_case(c);
    c.causal = true;
    c.dtype = DType::f16;
    check_case(c);
  }
  SECTION("negative scale and a scale far from 1/sqrt(D)") {
    Case c = base;
    c.scale = -0.3f;
    check_case(c);
    c.scale = 2.5f;
    check_case(c);
  }
  SECTION("outliers: 1% of values x20, some rows x10, q x5, k and v x3") {
    Case c = base;
    c.outliers = true;
    c.q_mul = 5.f;
    c.kv_mul = 3.f;
    check_case(c);
    c.dtype = DType::f16;
    check_case(c);
  }
  SECTION("q = k = v = 133120 (pytorch issue 121558): large logits stay finite") {
    Case c = base;
    c.constant_133120 = true;
    check_case(c);
  }
}

TEST_CASE("CUDA forward: strided layouts and the portable path", "[gpu][sanitize]") {
  Case base;
  base.head_dim = 64;
  base.seqlen_q = 90;
  base.seqlen_k = 70;
  base.batch = 2;
  base.causal = true;
  SECTION("head-major (B, H, S, D) with padded 16-byte rows: tensor-core path") {
    Case c = base;
    c.layout = {true, 8};
    check_case(c);
  }
  SECTION("odd row pad: rows not 16-byte aligned take the portable path") {
    Case c = base;
    c.layout = {false, 3};
    check_case(c);
    c.dtype = DType::f16;
    check_case(c);
  }
  SECTION("f32 storage") {
    for (const int64_t d : {64, 96, 128, 256}) {
      Case c = base;
      c.dtype = DType::f32;
      c.head_dim = d;
      c.window_left = 9;
      check_case(c);
    }
  }
  SECTION("Dv != D") {
    Case c = base;
    c.head_dim = 128;
    c.head_dim_v = 64;
    check_case(c);
  }
}

TEST_CASE("CUDA forward agrees with the CPU backend on the same inputs", "[gpu]") {
  for (const DType t : {DType::bf16, DType::f16, DType::f32}) {
    Case c;
    c.dtype = t;
    c.head_dim = 128;
    c.seqlen_q = 200;
    c.seqlen_k = 333;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.causal = true;
    c.seed = 77;
    Problem pr(c);
    const Oracle o = make_oracle(pr);
    Buffer cpu_out(t, pr.to.elements);
    std::vector<float> cpu_lse(pr.lse.host.size() / 4);
    AttnParams hp = pr.p;
    hp.out = cpu_out.host.data();
    hp.lse = cpu_lse.data();
    REQUIRE(ioattn::cpu::forward(hp).is_ok());
    pr.run_gpu();
    check_against(pr, o);
    // Both backends within the rule of the oracle, hence within twice the rule of each other.
    double diff = 0;
    for_each_output(
        pr, [&](int64_t i) { diff = std::max(diff, double(std::fabs(pr.out.get(i) - cpu_out.get(i)))); },
        [&](int64_t i) {
          const float g = reinterpret_cast<const float*>(pr.lse.host.data())[i];
          CHECK(std::fabs(g - cpu_lse[size_t(i)]) <= 2 * o.lse_tol[size_t(i)]);
        });
    INFO(c.name() << ": max |gpu - cpu| = " << diff);
    CHECK(diff <= 2 * o.out_tol);
  }
}

TEST_CASE("CUDA forward: 50 repeated launches are bitwise equal", "[gpu]") {
  Case c;
  c.head_dim = 128;
  c.batch = 2;
  c.heads_q = 8;
  c.heads_kv = 2;
  c.seqlen_q = 1000;
  c.seqlen_k = 1500;
  c.causal = true;
  Problem pr(c);
  const AttnParams d = pr.device_params();
  std::vector<unsigned char> first(pr.out.host.size()), again(pr.out.host.size());
  std::vector<unsigned char> first_lse(pr.lse.host.size()), again_lse(pr.lse.host.size());
  for (int run = 0; run < 50; ++run) {
    REQUIRE(ioattn::gpu::forward(d).is_ok());
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<unsigned char>& o = run == 0 ? first : again;
    std::vector<unsigned char>& l = run == 0 ? first_lse : again_lse;
    CUDA_OK(cudaMemcpy(o.data(), pr.out.data(), o.size(), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(l.data(), pr.lse.data(), l.size(), cudaMemcpyDeviceToHost));
    if (run > 0) {
      REQUIRE(std::memcmp(first.data(), again.data(), first.size()) == 0);
      REQUIRE(std::memcmp(first_lse.data(), again_lse.data(), first_lse.size()) == 0);
    }
  }
}

TEST_CASE("CUDA forward rejects what it cannot run, naming the value", "[gpu][sanitize]") {
  for (const int64_t d : {1, 32, 80, 111, 160, 512}) {
    Case c;
    c.head_dim = d;
    Problem pr(c);
    const AttnParams dp = pr.device_params();
    const ioattn::Status s = ioattn::gpu::forward(dp);
    CHECK(s.code == IOATTN_ERROR_UNSUPPORTED);
    CHECK(s.message.find("head_dim=" + std::to_string(d)) != std::string::npos);
    CHECK(s.message.find("64, 96, 128 and 256") != std::string::npos);
    // Nothing written: the output is still poison.
    pr.out.download_checked();
    for (unsigned char byte : pr.out.host) REQUIRE(byte == 0xff);
  }
  Case c;
  Problem pr(c);
  AttnParams dp = pr.device_params();
  dp.io_dtype = DType::f32;
  const ioattn::Status s = ioattn::gpu::forward(dp);
  CHECK(s.code == IOATTN_ERROR_UNSUPPORTED);
  CHECK(s.message.find("f32") != std::string::npos);
}

TEST_CASE("C ABI: ioattn_forward with backend CUDA runs the CUDA kernel", "[gpu][sanitize]") {
  Case c;
  c.head_dim = 128;
  c.seqlen_q = 130;
  c.seqlen_k = 257;
  c.causal = true;
  c.heads_q = 4;
  c.heads_kv = 2;
  Problem pr(c);
  const Oracle o = make_oracle(pr);
  const AttnParams d = pr.device_params();
  auto tensor = [&](void* data, const Tensor& t) {
    return ioattn_tensor{data,  int32_t(c.dtype), t.batch,      t.seqlen,     t.heads,
                         t.dim, t.stride_batch,   t.stride_seq, t.stride_head};
  };
  const ioattn_tensor q = tensor(const_cast<void*>(d.q), pr.tq), k = tensor(const_cast<void*>(d.k), pr.tk);
  const ioattn_tensor v = tensor(const_cast<void*>(d.v), pr.tv), out = tensor(d.out, pr.to);
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.causal = 1;
  opt.backend = IOATTN_BACKEND_CUDA;
  const ioattn_status st = ioattn_forward(&q, &k, &v, &out, d.lse, &opt);
  INFO(ioattn_last_error());
  REQUIRE(st == IOATTN_OK);
  CUDA_OK(cudaDeviceSynchronize());
  pr.out.download_checked();
  pr.lse.download_checked();
  check_against(pr, o);
}

#endif  // IOATTN_HAVE_CUDA (main: tests/gpu_main.cc)
