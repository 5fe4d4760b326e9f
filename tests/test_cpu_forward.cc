// The CPU flash kernel against the fp64 oracle with the FlashAttention-2 tolerance rule
// (tests/support/support.h): the shape and feature grid of docs/testing.md, every compiled Highway
// target, every dtype, layouts and strides, forced tilings and the C ABI.
#include <array>
#include <random>
#include <set>
#include <vector>

#include "cpu/cpu_backend.h"
#include "tests/catch.h"
#include "tests/support/support.h"

using ioattn::DType;
using ioattn::test::AttnBuffers;
using ioattn::test::AttnCase;
using ioattn::test::Layout;

namespace {

void check_case(const AttnCase& c, uint32_t seed, float stddev = 1.f) {
  ioattn::Status st;
  const ioattn::test::Verdict v = ioattn::test::run_random_case(c, seed, &st, stddev);
  INFO(c.describe());
  INFO(st.message);
  REQUIRE(st.is_ok());
  INFO(v.report());
  CHECK(v.ok);
}

constexpr std::array<DType, 3> kDtypes = {DType::f32, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("every compiled Highway target: odd shapes, masks, dtypes", "[cpu][forward][targets]") {
  const int64_t target = GENERATE(from_range(ioattn::test::compiled_targets()));
  ioattn::test::TargetScope scope(target);
  INFO("target " << ioattn::test::target_name(target));
  REQUIRE(ioattn::cpu::dispatch_target_name() == ioattn::test::target_name(target));
  uint32_t seed = 1;
  for (int64_t sq : {1, 3, 17}) {
    for (int64_t sk : {1, 2, 113}) {
      for (int64_t d : {1, 7, 64, 80}) {
        AttnCase c;
        c.seqlen_q = sq;
        c.seqlen_k = sk;
        c.head_dim = d;
        c.causal = seed % 2 == 0;
        c.heads_q = 4;
        c.heads_kv = seed % 3 == 0 ? 1 : 2;
        c.dtype = kDtypes[seed % 3];
        c.tiling.block_kv = seed % 4 == 0 ? 16 : 0;
        check_case(c, seed++);
      }
    }
  }
}

TEST_CASE("sequence-length grid: Sq != Sk both ways, not multiples of any block", "[cpu][forward]") {
  const std::vector<std::pair<int64_t, int64_t>> lengths = {
      {1, 1},   {2, 3},   {3, 2},   {17, 17}, {97, 113},  {113, 97},  {127, 257},  {257, 127},
      {1, 339}, {239, 1}, {799, 3}, {3, 799}, {1023, 17}, {17, 1025}, {1025, 1023}};
  uint32_t seed = 100;
  for (auto [sq, sk] : lengths) {
    for (bool causal : {false, true}) {
      AttnCase c;
      c.seqlen_q = sq;
      c.seqlen_k = sk;
      c.causal = causal;
      c.head_dim = sq * sk > 100000 ? 64 : 59;
      c.heads_q = 2;
      c.heads_kv = sq * sk > 100000 ? 1 : 2;
      check_case(c, seed++);
    }
  }
}

TEST_CASE("head-dim grid, Dv != D, every dtype", "[cpu][forward]") {
  uint32_t seed = 200;
  for (int64_t d : {1, 7, 59, 64, 80, 96, 111, 128, 256, 512}) {
    for (DType t : kDtypes) {
      AttnCase c;
      c.seqlen_q = 37;
      c.seqlen_k = 70;
      c.head_dim = d;
      c.dtype = t;
      c.causal = seed % 2 == 1;
      check_case(c, seed++);
    }
  }
  for (auto [d, dv] : std::vector<std::pair<int64_t, int64_t>>{{64, 128}, {128, 64}, {7, 33}, {96, 1}, {1, 96}}) {
    AttnCase c;
    c.seqlen_q = 45;
    c.seqlen_k = 61;
    c.head_dim = d;
    c.head_dim_v = dv;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.causal = d > dv;
    check_case(c, seed++);
  }
}

TEST_CASE("GQA ratios 1, 2, 4, 8 and MQA, decode and prefill", "[cpu][forward]") {
  uint32_t seed = 300;
  for (int64_t group : {1, 2, 4, 8}) {
    for (int64_t sq : {1, 5, 70}) {
      AttnCase c;
      c.heads_kv = 2;
      c.heads_q = 2 * group;
      c.seqlen_q = sq;
      c.seqlen_k = 131;
      c.head_dim = 32;
      c.causal = sq > 1;
      c.dtype = kDtypes[seed % 3];
      check_case(c, seed++);
    }
  }
  AttnCase mqa;
  mqa.heads_q = 12;
  mqa.heads_kv = 1;
  mqa.seqlen_q = 33;
  mqa.seqlen_k = 90;
  mqa.head_dim = 40;
  mqa.causal = true;
  check_case(mqa, seed++);
}

TEST_CASE("layouts: batch > 1, strides differing per axis, BHSD, padded rows, stride-0 broadcast", "[cpu][forward]") {
  AttnCase base;
  base.batch = 3;
  base.heads_q = 4;
  base.heads_kv = 2;
  base.seqlen_q = 29;
  base.seqlen_k = 41;
  base.head_dim = 24;
  base.head_dim_v = 20;
  uint32_t seed = 400;
  SECTION("every tensor its own layout") {
    for (DType t : kDtypes) {
      AttnCase c = base;
      c.dtype = t;
      c.q_layout = Layout{Layout::bhsd, 3, 5};
      c.k_layout = Layout{Layout::bshd, 1, 7};
      c.v_layout = Layout{Layout::bhsd, 0, 2};
      c.o_layout = Layout{Layout::bshd, 5, 3};
      c.causal = t != DType::f32;
      check_case(c, seed++);
    }
  }
  SECTION("stride-0 broadcast of K/V over the batch, of Q over heads, of V over heads") {
    AttnCase c = base;
    c.k_layout.broadcast_batch = true;
    c.v_layout.broadcast_batch = true;
    check_case(c, seed++);
    c = base;
    c.q_layout.broadcast_heads = true;
    c.v_layout.broadcast_heads = true;
    c.causal = true;
    check_case(c, seed++);
    c = base;
    c.k_layout.broadcast_seq = true;  // every key identical: uniform softmax
    check_case(c, seed++);
  }
}

TEST_CASE("forced tilings: block sizes, kv splits, with masks", "[cpu][forward][tiling]") {
  uint32_t seed = 500;
  const std::vector<ioattn::TilingOverride> tilings = {{1, 1, 0},   {6, 16, 0},     {7, 5, 0},   {48, 192, 0},
                                                       {64, 17, 0}, {500, 1000, 0}, {0, 32, 2},  {0, 16, 3},
                                                       {13, 7, 4},  {0, 0, 7},      {96, 48, 16}};
  for (const auto& t : tilings) {
    for (bool causal : {false, true}) {
      AttnCase c;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.seqlen_q = causal ? 83 : 5;
      c.seqlen_k = 150;
      c.head_dim = 40;
      c.causal = causal;
      c.window_left = seed % 3 == 0 ? 30 : -1;
      c.tiling = t;
      c.dtype = kDtypes[seed % 3];
      check_case(c, seed++);
    }
  }
}

// Plans follow the caches: each built-in CPU profile sizes other blocks, splits and modes for the
// same shape, so every profile's plan runs here whatever machine runs the suite, at one to three
// threads (the count picks head or tile mode and the split). The shapes are ones the profiles
// disagree on; the test fails if they stop disagreeing, which would leave plans untested.
TEST_CASE("every built-in CPU profile's plan: prefill, decode and split shapes, 1 to 3 threads",
          "[cpu][forward][plans]") {
  struct Shape {
    int64_t hq, hkv, sq, sk, d;
    bool causal;
    DType dtype;
  };
  const std::vector<Shape> shapes = {{4, 2, 150, 500, 128, true, DType::f32},
                                     {2, 2, 97, 1100, 64, false, DType::bf16},
                                     {8, 2, 1, 12000, 128, false, DType::f16},
                                     {8, 2, 3, 4100, 96, true, DType::bf16},
                                     {2, 1, 150, 257, 256, false, DType::f16}};
  std::vector<const ioattn::HardwareProfile*> profiles = {nullptr};  // the host's own plan too
  for (const ioattn::HardwareProfile& hw : ioattn::test::cpu_profiles()) profiles.push_back(&hw);
  uint32_t seed = 700;
  for (const Shape& s : shapes) {
    AttnCase c;
    c.heads_q = s.hq;
    c.heads_kv = s.hkv;
    c.seqlen_q = s.sq;
    c.seqlen_k = s.sk;
    c.head_dim = s.d;
    c.causal = s.causal;
    c.dtype = s.dtype;
    std::mt19937 rng(seed++);
    AttnBuffers bufs(c);
    bufs.randomize(rng);
    const ioattn::test::Oracle oracle = ioattn::test::make_oracle(c, bufs);  // the inputs are shared
    std::set<std::array<int64_t, 4>> plans;
    for (const ioattn::HardwareProfile* hw : profiles) {
      for (int threads = 1; threads <= 3; ++threads) {
        c.threads = threads;
        c.tiling.profile = hw;
        const ioattn::Plan plan = ioattn::cpu::plan_for_params(ioattn::test::make_params(c, bufs));
        plans.insert({plan.block_q, plan.block_kv, plan.kv_splits, plan.workers});
        INFO(c.describe() << " under " << (hw ? hw->name : std::string("the host")) << "'s plan: blocks "
                          << plan.block_q << "x" << plan.block_kv << ", " << plan.kv_splits << " splits");
        bufs.reset_outputs();
        REQUIRE(ioattn::test::run_cpu_kernel(c, bufs).is_ok());
        const ioattn::test::Verdict v = ioattn::test::check_against(oracle, c, bufs);
        INFO(v.report());
        CHECK(v.ok);
      }
    }
    INFO("D " << s.d << ", Sq " << s.sq << ", Sk " << s.sk);
    CHECK(plans.size() >= 12);  // at least half of the 24 runs plan differently
  }
}

TEST_CASE("the plan honours tiling overrides", "[cpu][forward][tiling]") {
  ioattn::AttnParams p;
  p.batch = 1;
  p.heads_q = p.heads_kv = 2;
  p.seqlen_q = p.seqlen_k = 100;
  p.head_dim = p.head_dim_v = 64;
  p.num_threads = 2;
  p.tiling = {12, 40, 3};
  const ioattn::Plan plan = ioattn::cpu::plan_for_params(p);
  CHECK(plan.block_q == 12);
  CHECK(plan.block_kv == 40);
  CHECK(plan.kv_splits == 3);
  CHECK(plan.workers == 2);
}

TEST_CASE("through the C ABI", "[cpu][forward][abi]") {
  uint32_t seed = 600;
  for (DType t : kDtypes) {
    AttnCase c;
    c.batch = 2;
    c.heads_q = 6;
    c.heads_kv = 3;
    c.seqlen_q = 50;
    c.seqlen_k = 77;
    c.head_dim = 48;
    c.dtype = t;
    c.causal = true;
    c.window_left = 20;
    c.softcap = 5.f;
    c.threads = 2;
    c.q_layout = Layout{Layout::bhsd, 2, 0};
    std::mt19937 rng(seed++);
    AttnBuffers bufs(c);
    bufs.randomize(rng);
    INFO(c.describe());
    REQUIRE(ioattn::test::run_c_abi(c, bufs) == IOATTN_OK);
    const ioattn::test::Verdict v = ioattn::test::check_against_reference(c, bufs);
    INFO(v.report());
    CHECK(v.ok);
  }
}
