// The sm_90a forward (gpu/sm90/) against the fp64 oracle with the FlashAttention-2 tolerance rule:
// every head dim it covers, both storage types, no mask, causal and windows, GQA and MQA, lengths
// that are not multiples of its 128-row and 128-key tiles, LSE, the NaN rules, and 50 launches
// bitwise equal. Every case first checks that dispatch sends it to the sm_90a kernel, and the
// dispatch rule itself is checked for what the kernel leaves to the others. Exits 77
// ("SKIPPED") where no compute capability 9.0 device is visible or the build has no sm_90a path.
//
// Tags: [sanitize] marks the small cases scripts/gpu_run.sh runs under compute-sanitizer.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/gpu_tiles.h"
#include "common/params.h"
#include "gpu/gpu_backend.h"
#include "tests/catch.h"

#if IOATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "tests/gpu_case.h"

using namespace gpu_case;

// The binary's device condition (tests/gpu_main.cc): the sm_90a kernel runs only there.
bool gpu_test_device_ok(std::string* why) {
#if IOATTN_HAVE_SM90
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    *why = "the device's compute capability cannot be queried";
    return false;
  }
  if (major == 9 && minor == 0) return true;
  *why = "the device is compute capability " + std::to_string(major) + "." + std::to_string(minor) + ", not 9.0";
#else
  *why = "this build has no sm_90a path (IOATTN_SM90)";
#endif
  return false;
}

namespace {

// Runs the case through dispatch after checking that dispatch picks the sm_90a kernel for it.
void check_sm90(const Case& c) {
  Problem pr(c);
  const Oracle o = make_oracle(pr);
  INFO(c.name());
  const AttnParams d = pr.device_params();
  REQUIRE(ioattn::gpu::forward_kernel(d) == "sm90");
  pr.run_gpu(d);
  check_against(pr, o);
}

}  // namespace

TEST_CASE("sm_90a forward matches the fp64 oracle: head dims, dtypes, masks, odd lengths", "[gpu][sm90][sanitize]") {
  const DType types[] = {DType::bf16, DType::f16};
  struct Lengths {
    int64_t sq, sk;
  };
  // Sq >= 9 keeps G x Sq past the decode kernel's 16 rows (G = 2). Partial query and key tiles,
  // Sk below one tile, Sq > Sk (causal rows that see nothing), exactly one tile, a tile and one.
  const Lengths lengths[] = {{9, 1}, {17, 3}, {97, 113}, {130, 7}, {127, 257}, {128, 128}, {129, 385}, {300, 200}};
  uint32_t seed = 90;
  for (const int64_t d : {64, 128})
    for (const DType t : types)
      for (const Lengths& len : lengths)
        for (const int mask : {0, 1, 2}) check_sm90(grid_case(d, t, len.sq, len.sk, mask, seed++, 151, 23));
}

TEST_CASE("sm_90a forward: long sequences wrap the K/V pipeline many times", "[gpu][sm90]") {
  for (const int64_t d : {64, 128})
    for (const DType t : {DType::bf16, DType::f16})
      for (const bool causal : {false, true}) {
        Case c;
        c.head_dim = d;
        c.dtype = t;
        c.seqlen_q = 1023;
        c.seqlen_k = 1537;
        c.heads_q = 4;
        c.heads_kv = 2;
        c.causal = causal;
        c.seed = uint32_t(d + 2 * causal + (t == DType::f16));
        check_sm90(c);
      }
  Case c;  // causal with Sq > Sk: the top rows see no key at all (out 0, lse -inf)
  c.head_dim = 128;
  c.seqlen_q = 700;
  c.seqlen_k = 300;
  c.causal = true;
  c.heads_q = 3;
  c.heads_kv = 3;
  check_sm90(c);
  c.seqlen_q = 300;  // sliding window with Sq < Sk: the left edge cuts tiles too
  c.seqlen_k = 900;
  c.causal = false;
  c.window_left = 100;
  c.window_right = 20;
  check_sm90(c);
}

TEST_CASE("sm_90a forward: GQA and MQA, softcap, scales, adversarial values", "[gpu][sm90][sanitize]") {
  Case base;
  base.head_dim = 128;
  base.seqlen_q = 77;
  base.seqlen_k = 150;
  SECTION("GQA ratios 1, 2, 4, 8 and MQA, both head dims") {
    for (const int64_t d : {64, 128})
      for (const int64_t kv : {8, 4, 2, 1}) {
        Case c = base;
        c.head_dim = d;
        c.heads_q = 8;
        c.heads_kv = kv;
        c.causal = kv % 2 == 0;
        check_sm90(c);
      }
  }
  SECTION("softcap with saturated tanh") {
    Case c = base;
    c.softcap = 5.f;
    c.q_mul = 10.f;
    check_sm90(c);
    c.causal = true;
    c.dtype = DType::f16;
    c.head_dim = 64;
    check_sm90(c);
  }
  SECTION("negative scale and a scale far from 1/sqrt(D)") {
    Case c = base;
    c.scale = -0.3f;
    check_sm90(c);
    c.scale = 2.5f;
    check_sm90(c);
  }
  SECTION("outliers: 1% of values x20, some rows x10, q x5, k and v x3") {
    Case c = base;
    c.outliers = true;
    c.q_mul = 5.f;
    c.kv_mul = 3.f;
    check_sm90(c);
    c.dtype = DType::f16;
    check_sm90(c);
  }
  SECTION("q = k = v = 133120 (pytorch issue 121558): large logits stay finite") {
    Case c = base;
    c.constant_133120 = true;
    check_sm90(c);
    c.head_dim = 64;
    check_sm90(c);
  }
  SECTION("head-major (B, H, S, D) rows with NaN padding, which TMA must not read") {
    Case c = base;
    c.layout = {true, 8};
    c.causal = true;
    check_sm90(c);
    c.head_dim = 64;
    c.layout = {false, 8};
    check_sm90(c);
  }
}

TEST_CASE("sm_90a forward: NaN inputs reach exactly the rows that see them", "[gpu][sm90][sanitize]") {
  for (const int64_t d : {64, 128}) {
    Case c;
    c.head_dim = d;
    c.seqlen_q = 200;
    c.seqlen_k = 200;
    c.heads_q = 2;
    c.heads_kv = 1;
    c.causal = true;
    Problem pr(c);
    // A NaN in query row 5 (head 0) and in key row 150 (the kv head): row 5 is NaN, rows 150 and
    // later see the key and are NaN, the rows before it (causal) stay finite.
    pr.q.set(5 * pr.tq.stride_seq + 3, NAN);
    pr.k.set(150 * pr.tk.stride_seq + 7, NAN);
    const Oracle o = make_oracle(pr);
    const AttnParams dp = pr.device_params();
    REQUIRE(ioattn::gpu::forward_kernel(dp) == "sm90");
    pr.run_gpu(dp);
    check_against(pr, o);
    CHECK(std::isnan(pr.out.get(5 * pr.to.stride_seq)));
    CHECK(std::isnan(pr.out.get(160 * pr.to.stride_seq)));
    CHECK(!std::isnan(pr.out.get(100 * pr.to.stride_seq)));
  }
}

TEST_CASE("sm_90a forward: 50 repeated launches are bitwise equal", "[gpu][sm90]") {
  for (const int64_t d : {64, 128}) {
    Case c;
    c.head_dim = d;
    c.batch = 2;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.seqlen_q = 1000;
    c.seqlen_k = 1500;
    c.causal = true;
    Problem pr(c);
    const AttnParams dp = pr.device_params();
    REQUIRE(ioattn::gpu::forward_kernel(dp) == "sm90");
    std::vector<unsigned char> first(pr.out.host.size()), again(pr.out.host.size());
    std::vector<unsigned char> first_lse(pr.lse.host.size()), again_lse(pr.lse.host.size());
    for (int run = 0; run < 50; ++run) {
      REQUIRE(ioattn::gpu::forward(dp).is_ok());
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
}

TEST_CASE("sm_90a dispatch: what the kernel does not cover keeps its kernel", "[gpu][sm90][sanitize]") {
  auto kernel_of = [](const Case& c) {
    Problem pr(c);
    return ioattn::gpu::forward_kernel(pr.device_params());
  };
  Case c;
  c.seqlen_q = 200;
  c.seqlen_k = 300;
  for (const int64_t d : {64, 96, 128, 256}) {
    c.head_dim = d;
    CHECK(kernel_of(c) == (ioattn::gpu_tile_sm90(int(d)).supported ? "sm90" : "sm80"));
  }
  c.head_dim = 128;
  c.head_dim_v = 64;  // Dv != D
  CHECK(kernel_of(c) == "portable");
  c.head_dim_v = -1;
  c.layout = {false, 3};  // rows off 16-byte alignment
  CHECK(kernel_of(c) == "portable");
  c.layout = {};
  c.dtype = DType::f32;
  CHECK(kernel_of(c) == "portable");
  c.dtype = DType::bf16;
  {
    Problem pr(c);
    AttnParams d = pr.device_params();
    d.seqlen_k = 0;  // no key for a TMA box to address
    CHECK(ioattn::gpu::forward_kernel(d) == "sm80");
  }
  c.seqlen_q = 4;  // G x Sq = 4 rows: the split-KV decode kernel
  CHECK(kernel_of(c) == "decode");
}

#endif  // IOATTN_HAVE_CUDA (main: tests/gpu_main.cc)
