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

#include "tests/gpu_case.h"

using namespace gpu_case;

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
        for (const int mask : {0, 1, 2}) check_case(grid_case(d, t, len.sq, len.sk, mask, seed++, 37, 11));
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

TEST_CASE("CUDA forward: head dims without a tensor-core tile run on the portable kernel", "[gpu][sanitize]") {
  uint32_t seed = 90;
  for (const int64_t d : {1, 8, 32, 80, 111, 160, 255})
    for (const DType t : {DType::bf16, DType::f16}) check_case(grid_case(d, t, 37, 53, int(d % 3), seed++, 37, 11));
}

TEST_CASE("CUDA forward rejects what it cannot run, naming the value", "[gpu][sanitize]") {
  for (const int64_t d : {257, 320, 512}) {
    Case c;
    c.head_dim = d;
    Problem pr(c);
    const AttnParams dp = pr.device_params();
    const ioattn::Status s = ioattn::gpu::forward(dp);
    CHECK(s.code == IOATTN_ERROR_UNSUPPORTED);
    CHECK(s.message.find("head_dim=" + std::to_string(d)) != std::string::npos);
    CHECK(s.message.find("1..256") != std::string::npos);
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
