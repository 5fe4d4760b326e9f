// The sm_90a forward (gpu/sm90/) against the fp64 oracle with the FlashAttention-2 tolerance rule:
// every head dim it covers, both storage types, no mask, causal and windows, GQA and MQA, lengths
// that are not multiples of its 128-row and 128- or 64-key tiles, LSE, the NaN rules, output rows'
// padding untouched, and 50 launches bitwise equal; the persistent grid with fewer, as many and
// many more work tiles than SMs (its tile order is checked on the host by test_sm90_schedule).
// Every case first checks that dispatch sends it to the sm_90a kernel, and the dispatch rule
// itself is checked for what the kernel leaves to the others. Exits 77 ("SKIPPED") where no
// compute capability 9.0 device is visible or the build has no sm_90a path.
//
// Tags: [sanitize] marks the small cases scripts/gpu_run.sh runs under compute-sanitizer.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/gpu_tiles.h"
#include "common/params.h"
#include "gpu/gpu_backend.h"
#include "tests/catch.h"

#if IOATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "gpu/sm90/schedule.cuh"
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

// The head dims gpu_tile_sm90 holds; the dispatch test below checks the table against this list.
constexpr int64_t kSm90Dims[] = {64, 96, 128, 256};

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
  for (const int64_t d : kSm90Dims)
    for (const DType t : types)
      for (const Lengths& len : lengths)
        for (const int mask : {0, 1, 2}) check_sm90(grid_case(d, t, len.sq, len.sk, mask, seed++, 151, 23));
}

TEST_CASE("sm_90a forward: long sequences wrap the K/V pipeline many times", "[gpu][sm90]") {
  for (const int64_t d : kSm90Dims)
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

// The persistent grid around its size: fewer work tiles than SMs (the grid shrinks to them), as
// many, one more (one CTA runs two) and two rounds and one; then a few per CTA, where whole work
// tiles see no key between ones that see several, so the Q barrier and the K/V ring must skip
// them on both sides alike.
TEST_CASE("sm_90a forward: persistent grid below, at and past the SM count", "[gpu][sm90][sanitize]") {
  int device = 0, sms = 0;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  for (const int64_t tiles : {int64_t(3), int64_t(sms) - 1, int64_t(sms), int64_t(sms) + 1, 2 * int64_t(sms) + 1}) {
    Case c;  // one query block per (sequence, head): B work tiles
    c.head_dim = kSm90Dims[size_t(tiles) % std::size(kSm90Dims)];
    c.batch = tiles;
    c.heads_q = 1;
    c.heads_kv = 1;
    c.seqlen_q = 100;
    c.seqlen_k = 150;
    c.causal = true;
    c.seed = uint32_t(tiles);
    check_sm90(c);
  }
  for (const int64_t d : kSm90Dims) {
    Case c;  // Sq > Sk causal: query block 0 sees no key, blocks 1 and 2 see one or two key tiles
    c.head_dim = d;
    c.batch = 8;
    c.heads_q = 16;
    c.heads_kv = 4;
    c.seqlen_q = 333;
    c.seqlen_k = 200;
    c.causal = true;
    c.seed = uint32_t(d + 7);
    check_sm90(c);
  }
}

// Many work tiles per CTA, each CTA carrying the K/V ring across work tiles of different key-tile
// counts (D = 64 has three stages, so the ring's stage does not restart with a work tile).
TEST_CASE("sm_90a forward: persistent grid with many work tiles per CTA", "[gpu][sm90]") {
  SECTION("about 12 work tiles per CTA: causal, odd lengths, GQA 8, B x H = 768") {
    for (const int64_t d : kSm90Dims) {
      Case c;
      c.head_dim = d;
      c.dtype = d == 64 ? DType::f16 : DType::bf16;
      c.batch = 16;
      c.heads_q = 48;
      c.heads_kv = 6;
      c.seqlen_q = 130;
      c.seqlen_k = 257;
      c.causal = true;
      c.seed = uint32_t(d);
      check_sm90(c);
    }
  }
  SECTION("windows and softcap over many work tiles") {
    Case c;
    c.head_dim = 64;
    c.batch = 6;
    c.heads_q = 32;
    c.heads_kv = 8;
    c.seqlen_q = 701;
    c.seqlen_k = 509;
    c.window_left = 90;
    c.window_right = 13;
    c.softcap = 20.f;
    c.seed = 31;
    check_sm90(c);
    c.head_dim = 128;
    c.dtype = DType::f16;
    c.window_left = 300;
    c.window_right = 0;
    c.softcap = 0.f;
    check_sm90(c);
  }
  SECTION("K/V past half the L2 per section: several sections, a short last one") {
    // 2 x 16384 keys x 128 x 2 bytes = 8 MiB of K and V per (sequence, kv head): three pairs per
    // section on an H100 (50 MiB of L2), so sections of 3, 3, 3 and 1; the window keeps the
    // oracle's work small.
    Case c;
    c.head_dim = 128;
    c.batch = 2;
    c.heads_q = 10;
    c.heads_kv = 5;
    c.seqlen_q = 3000;
    c.seqlen_k = 16384;
    c.window_left = 64;
    c.window_right = 0;
    c.seed = 77;
    check_sm90(c);
  }
}

TEST_CASE("sm_90a forward: GQA and MQA, softcap, scales, adversarial values", "[gpu][sm90][sanitize]") {
  Case base;
  base.head_dim = 128;
  base.seqlen_q = 77;
  base.seqlen_k = 150;
  SECTION("GQA ratios 1, 2, 4, 8 and MQA, every head dim") {
    for (const int64_t d : kSm90Dims)
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
    for (const int64_t d : kSm90Dims) {
      c.head_dim = d;
      check_sm90(c);
    }
  }
  SECTION("head-major (B, H, S, D) rows with NaN padding, which TMA must not read") {
    Case c = base;
    c.causal = true;
    // Head-major at D = 128 and 256, (B, S, H, D) at 64 and 96; padded rows either way.
    for (const int64_t d : kSm90Dims) {
      c.head_dim = d;
      c.layout = {d % 128 == 0, 8};
      check_sm90(c);
    }
  }
}

// O leaves through a TMA store at D = 64, 96 and 128 and from registers at 256: either way the 8
// padding elements after each output row (poisoned with 0xff before the call) stay as they were,
// whether a warpgroup's 64-row box is whole, clipped at the sequence's end, or empty.
TEST_CASE("sm_90a forward: O's stores leave the rows' padding untouched", "[gpu][sm90][sanitize]") {
  for (const int64_t d : kSm90Dims)
    for (const bool head_major : {false, true}) {
      Case c;
      c.head_dim = d;
      c.batch = 3;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.seqlen_k = 150;
      c.causal = head_major;
      c.layout = {head_major, 8};
      c.seed = uint32_t(d + head_major);
      // 70 rows clip the second warpgroup's 64-row box to 6 rows; 40 leave it empty.
      for (const int64_t sq : {int64_t(70), int64_t(40)}) {
        c.seqlen_q = sq;
        Problem pr(c);
        const Oracle o = make_oracle(pr);
        INFO(c.name());
        const AttnParams dp = pr.device_params();
        REQUIRE(ioattn::gpu::forward_kernel(dp) == "sm90");
        pr.run_gpu(dp);
        check_against(pr, o);
        const size_t elem = size_t(ioattn::dtype_bytes(c.dtype));
        int64_t touched = 0;
        for (int64_t b = 0; b < c.batch; ++b)
          for (int64_t h = 0; h < c.heads_q; ++h)
            for (int64_t i = 0; i < sq; ++i) {
              const int64_t row = b * pr.to.stride_batch + h * pr.to.stride_head + i * pr.to.stride_seq;
              for (size_t byte = size_t(row + d) * elem; byte < size_t(row + d + 8) * elem; ++byte)
                touched += pr.out.host[byte] != 0xff;
            }
        CHECK(touched == 0);
      }
    }
}

TEST_CASE("sm_90a forward: NaN inputs reach exactly the rows that see them", "[gpu][sm90][sanitize]") {
  for (const int64_t d : kSm90Dims) {
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
  struct Shape {
    int64_t d, batch, heads_q, heads_kv, sq, sk;
  };
  // Fewer work tiles than SMs (128 each), then about ten per CTA (1280).
  const Shape shapes[] = {{64, 2, 8, 2, 1000, 1500},
                          {96, 2, 8, 2, 1000, 1500},
                          {128, 2, 8, 2, 1000, 1500},
                          {256, 2, 8, 2, 1000, 1500},
                          {128, 8, 32, 8, 520, 700}};
  for (const Shape& sh : shapes) {
    Case c;
    c.head_dim = sh.d;
    c.batch = sh.batch;
    c.heads_q = sh.heads_q;
    c.heads_kv = sh.heads_kv;
    c.seqlen_q = sh.sq;
    c.seqlen_k = sh.sk;
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
  for (int64_t d = 1; d <= 256; ++d) {
    const bool listed = std::find(std::begin(kSm90Dims), std::end(kSm90Dims), d) != std::end(kSm90Dims);
    CHECK(ioattn::gpu_tile_sm90(int(d)).supported == listed);
  }
  for (const int64_t d : {32, 64, 80, 96, 128, 160, 256}) {
    c.head_dim = d;
    const char* expected = ioattn::gpu_tile_sm90(int(d)).supported ? "sm90"
                           : ioattn::gpu_tile(int(d)).supported    ? "sm80"
                                                                   : "portable";
    CHECK(kernel_of(c) == expected);
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
