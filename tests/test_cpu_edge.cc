// Edges of the CPU kernel: masks that empty rows, random windows, softcap saturation,
// adversarial magnitudes (the bf16 133120 regression, outliers, huge logits, negative and odd
// scales), NaN confinement, empty problems and out-of-memory before any write.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/alloc.h"
#include "cpu/cpu_backend.h"
#include "tests/catch.h"
#include "tests/support/support.h"

using ioattn::DType;
using ioattn::test::AttnBuffers;
using ioattn::test::AttnCase;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

ioattn::test::Verdict run_filled(const AttnCase& c, AttnBuffers& bufs) {
  const ioattn::Status st = ioattn::test::run_cpu_kernel(c, bufs);
  INFO(c.describe() << ": " << st.message);
  REQUIRE(st.is_ok());
  return ioattn::test::check_against_reference(c, bufs);
}

void check_case(const AttnCase& c, uint32_t seed, float stddev = 1.f) {
  ioattn::Status st;
  const ioattn::test::Verdict v = ioattn::test::run_random_case(c, seed, &st, stddev);
  INFO(c.describe());
  INFO(st.message);
  REQUIRE(st.is_ok());
  INFO(v.report());
  CHECK(v.ok);
}

// NaN in one Q, K or V row, +inf or -inf in one K row: the output is NaN exactly where the
// oracle has it, and NaN reaches exactly the rows that read the poisoned row. Causal with
// block_kv = 16 puts key 21 inside a block that straddles the diagonal, so rows 0..20 share the
// block with it but must not see it: 0 * NaN must not happen. Non-causal runs the unmasked
// panels, whose block max comes from the score tile (x86's max may drop a NaN) and whose NaN is
// caught by the row sum instead: every row reads key 21 there, and the exponential must keep a
// NaN of either sign. An infinite score poisons its row by the header's rules, as the oracle says.
void check_poisoned_rows(AttnCase c) {
  c.heads_q = 2;
  c.heads_kv = 1;
  c.seqlen_q = 40;
  c.seqlen_k = 40;
  c.head_dim = 24;
  const float inf = std::numeric_limits<float>::infinity();
  for (bool causal : {true, false}) {
    c.causal = causal;
    for (int block_kv : {16, 0}) {
      c.tiling.block_kv = block_kv;
      for (int which = 0; which < 6; ++which) {
        std::mt19937 rng(11);
        AttnBuffers bufs(c);
        bufs.randomize(rng);
        const char* what[] = {"NaN in Q", "NaN in K", "NaN in V", "+inf in K", "-inf in K", "-NaN in K"};
        if (which == 0) bufs.q.set(0, 21, 1, 3, kNaN);
        if (which == 1) bufs.k.set(0, 21, 0, 3, kNaN);
        if (which == 2) bufs.v.set(0, 21, 0, 3, kNaN);
        if (which == 3) bufs.k.set(0, 21, 0, 3, inf);
        if (which == 4) bufs.k.set(0, 21, 0, 3, -inf);
        if (which == 5) bufs.k.set(0, 21, 0, 3, -kNaN);
        const ioattn::test::Verdict v = run_filled(c, bufs);
        INFO(c.describe() << ", " << what[which] << ": " << v.report());
        CHECK(v.ok);  // NaN exactly where the oracle has it
        if (which == 3 || which == 4) continue;
        int64_t wrong = 0;
        for (int64_t i = 0; i < 40; ++i) {
          const bool reads = which == 0 ? i == 21 : (!causal || i >= 21);
          for (int64_t h = 0; h < 2; ++h) {
            const bool poisoned = reads && (which != 0 || h == 1);
            wrong += std::isnan(bufs.out.get(0, i, h, which == 2 ? 3 : 0)) != poisoned;
          }
        }
        CHECK(wrong == 0);
      }
    }
  }
}

// Decode, split-key, GQA and unmasked shapes: the decode path's own softmax, the split merge, the
// packed tiles' masked and unmasked panels, with NaN of either sign in one K row and one V row
// of a kv head, and rows that see no key (out 0, lse -inf).
void check_poisoned_shapes(AttnCase c) {
  struct Shape {
    int64_t hq, hkv, sq, sk, d, dv;
    bool causal;
    int64_t left, right;
  };
  const Shape shapes[] = {{8, 2, 1, 300, 64, 64, false, -1, -1}, {8, 2, 2, 517, 40, 24, true, -1, -1},
                          {4, 2, 60, 20, 7, 7, false, -1, -1},   {4, 2, 60, 20, 7, 7, false, -1, 0},
                          {4, 2, 37, 53, 48, 48, false, 2, 3},   {1, 1, 9, 2100, 32, 32, false, -1, -1},
                          {1, 1, 9, 2100, 32, 32, false, 40, 2}, {4, 1, 130, 130, 16, 72, true, 5, -1},
                          {2, 1, 40, 9, 16, 16, true, -1, -1}};
  for (const Shape& s : shapes) {
    c.heads_q = s.hq;
    c.heads_kv = s.hkv;
    c.seqlen_q = s.sq;
    c.seqlen_k = s.sk;
    c.head_dim = s.d;
    c.head_dim_v = s.dv;
    c.causal = s.causal;
    c.window_left = s.left;
    c.window_right = s.right;
    for (float poison : {kNaN, -kNaN}) {
      std::mt19937 rng(uint32_t(s.sk * 7 + s.sq));
      AttnBuffers bufs(c);
      bufs.randomize(rng);
      bufs.k.set(0, s.sk / 3, s.hkv - 1, s.d - 1, poison);
      bufs.v.set(0, s.sk - 1, 0, 0, poison);
      const ioattn::test::Verdict v = run_filled(c, bufs);
      INFO(c.describe() << ": " << v.report());
      CHECK(v.ok);
    }
  }
}

// Runs check on every compiled target under the host's plan and each built-in CPU profile's,
// one or two threads in turn (the thread count picks head or tile mode), so that every plan
// meets both counts across the targets.
template <class Check>
void on_every_target_and_plan(Check check) {
  std::vector<const ioattn::HardwareProfile*> plans = {nullptr};  // the host's own plan first
  for (const ioattn::HardwareProfile& hw : ioattn::test::cpu_profiles()) plans.push_back(&hw);
  int turn = 0;
  for (int64_t target : ioattn::test::compiled_targets()) {
    ioattn::test::TargetScope scope(target);
    for (const ioattn::HardwareProfile* hw : plans) {
      INFO("target " << ioattn::test::target_name(target));
      AttnCase c;
      c.tiling.profile = hw;
      c.threads = 1 + turn++ % 2;
      check(c);
    }
    ++turn;
  }
}

}  // namespace

TEST_CASE("causal with Sq > Sk: the top rows see nothing, out 0 and lse -inf exactly", "[cpu][edge]") {
  AttnCase c;
  c.heads_q = 2;
  c.seqlen_q = 40;
  c.seqlen_k = 9;
  c.head_dim = 16;
  c.causal = true;
  std::mt19937 rng(1);
  AttnBuffers bufs(c);
  bufs.randomize(rng);
  const ioattn::test::Verdict v = run_filled(c, bufs);
  INFO(v.report());
  CHECK(v.ok);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 31; ++i) {  // off = Sk - Sq = -31: rows 0..30 see no key
      CHECK(bufs.lse[size_t(h * 40 + i)] == -INFINITY);
      for (int64_t d = 0; d < 16; ++d) CHECK(bufs.out.get(0, i, h, d) == 0.f);
    }
  CHECK(std::isfinite(bufs.lse[31]));
}

TEST_CASE("Sk = 0: every row empty; B = 0 and Sq = 0: nothing written", "[cpu][edge]") {
  AttnCase c;
  c.seqlen_q = 5;
  c.seqlen_k = 0;
  c.head_dim = 8;
  std::mt19937 rng(2);
  AttnBuffers bufs(c);
  bufs.randomize(rng);
  const ioattn::test::Verdict v = run_filled(c, bufs);
  INFO(v.report());
  CHECK(v.ok);
  for (int64_t i = 0; i < 5; ++i) {
    CHECK(bufs.lse[size_t(i)] == -INFINITY);
    for (int64_t d = 0; d < 8; ++d) CHECK(bufs.out.get(0, i, 0, d) == 0.f);
  }
  for (auto [b, sq] : {std::pair<int64_t, int64_t>{0, 5}, {2, 0}}) {
    AttnCase e = c;
    e.batch = b;
    e.seqlen_q = sq;
    e.seqlen_k = 4;
    AttnBuffers eb(e);
    REQUIRE(ioattn::test::run_cpu_kernel(e, eb).is_ok());
    CHECK(eb.out.padding_intact());
    CHECK(eb.out.guards_intact());
  }
}

TEST_CASE("random sliding windows, with and without causal, Sq != Sk", "[cpu][edge]") {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> len(1, 140), win(-1, 40), pick(0, 2);
  for (int trial = 0; trial < 24; ++trial) {
    AttnCase c;
    c.heads_q = 2;
    c.seqlen_q = len(rng);
    c.seqlen_k = len(rng);
    c.head_dim = 8 + 8 * pick(rng);
    c.window_left = win(rng);
    c.window_right = win(rng);
    c.causal = pick(rng) == 0;
    c.dtype = pick(rng) == 0 ? DType::bf16 : DType::f32;
    c.tiling.block_kv = trial % 2 ? 16 : 0;
    c.tiling.block_q = trial % 3 ? 0 : 12;
    check_case(c, uint32_t(1000 + trial));
  }
}

TEST_CASE("softcap with q scaled so tanh saturates", "[cpu][edge]") {
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (float cap : {1.f, 30.f}) {
      AttnCase c;
      c.heads_q = 2;
      c.seqlen_q = 33;
      c.seqlen_k = 65;
      c.head_dim = 64;
      c.dtype = t;
      c.softcap = cap;
      c.causal = cap > 1.f;
      check_case(c, 77, 4.f);  // scores ~ 16 * 8: deep in tanh's saturation
    }
  }
}

TEST_CASE("adversarial magnitudes", "[cpu][edge]") {
  SECTION("q = k = v = 133120 in bf16 (the NaN of pytorch issue 121558)") {
    AttnCase c;
    c.dtype = DType::bf16;
    c.heads_q = 2;
    c.seqlen_q = 20;
    c.seqlen_k = 37;
    c.head_dim = 64;
    c.causal = true;
    AttnBuffers bufs(c);
    bufs.q.fill([](int64_t, int64_t, int64_t, int64_t) { return 133120.f; });
    bufs.k.fill([](int64_t, int64_t, int64_t, int64_t) { return 133120.f; });
    bufs.v.fill([](int64_t, int64_t, int64_t, int64_t) { return 133120.f; });
    const ioattn::test::Verdict v = run_filled(c, bufs);
    INFO(v.report());
    CHECK(v.ok);
    for (int64_t i = 0; i < 20; ++i) CHECK(bufs.out.get(0, i, 1, 5) == 133120.f);
  }
  SECTION("outliers: 1% of values x20, some rows x10, q x5, k and v x3") {
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      AttnCase c;
      c.dtype = t;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.seqlen_q = 50;
      c.seqlen_k = 90;
      c.head_dim = 64;
      c.causal = t == DType::f16;
      std::mt19937 rng(5);
      std::normal_distribution<float> n(0.f, 1.f);
      std::uniform_real_distribution<float> u(0.f, 1.f);
      auto outlier = [&](float base) {
        return [&, base](int64_t, int64_t s, int64_t, int64_t) {
          float x = base * n(rng);
          if (u(rng) < 0.01f) x *= 20.f;
          if (s % 17 == 3) x *= 10.f;
          return x;
        };
      };
      AttnBuffers bufs(c);
      bufs.q.fill(outlier(5.f));
      bufs.k.fill(outlier(3.f));
      bufs.v.fill(outlier(3.f));
      const ioattn::test::Verdict v = run_filled(c, bufs);
      INFO(v.report());
      CHECK(v.ok);
    }
  }
  SECTION("huge logits, negative scale, scale far from 1/sqrt(D)") {
    for (float scale : {-0.125f, 1e-4f, 30.f}) {
      for (DType t : {DType::f32, DType::bf16}) {
        AttnCase c;
        c.dtype = t;
        c.heads_q = 2;
        c.seqlen_q = 31;
        c.seqlen_k = 45;
        c.head_dim = 32;
        c.scale = scale;
        c.causal = scale < 0;
        check_case(c, 9, scale == 30.f ? 3.f : 1.f);
      }
    }
  }
}

TEST_CASE("f32 with large scores stays within the rule: the exponent's error does not grow with |s|",
          "[cpu][edge][precision]") {
  // Scores far from 0 (1% of inputs x20) round s * c to |s| * 2^-24 in any f32 code; the max
  // subtracted afterwards must not turn that into an absolute error of the exponent larger than
  // a naive f32 softmax has.
  on_every_target_and_plan([](AttnCase c) {
    for (uint32_t seed : {2u, 3u}) {
      c.heads_q = 4;
      c.heads_kv = 4;
      c.seqlen_q = 31;
      c.seqlen_k = 513;
      c.head_dim = 59;
      c.head_dim_v = 72;
      c.o_layout.row_pad = 5;
      std::mt19937 rng(seed);
      std::normal_distribution<float> n(0.f, 1.f);
      std::uniform_real_distribution<float> u(0.f, 1.f);
      auto outlier = [&](int64_t, int64_t, int64_t, int64_t) { return n(rng) * (u(rng) < 0.01f ? 20.f : 1.f); };
      AttnBuffers bufs(c);
      bufs.q.fill(outlier);
      bufs.k.fill(outlier);
      bufs.v.fill(outlier);
      const ioattn::test::Verdict v = run_filled(c, bufs);
      INFO(c.describe() << " seed " << seed << ": " << v.report());
      CHECK(v.ok);
    }
  });
}

TEST_CASE("NaN in one Q, K or V row reaches exactly the rows that read it, on every target and plan",
          "[cpu][edge][nan]") {
  on_every_target_and_plan(check_poisoned_rows);
}

TEST_CASE("NaN in K and V under decode, split, GQA and masked shapes, on every target and plan", "[cpu][edge][nan]") {
  on_every_target_and_plan(check_poisoned_shapes);
}

TEST_CASE("out of memory is reported before any output is written", "[cpu][edge]") {
  AttnCase c;
  c.heads_q = 2;
  c.seqlen_q = 30;
  c.seqlen_k = 30;
  c.head_dim = 16;
  c.threads = 2;
  for (int splits : {1, 3}) {
    for (long successes : {0L, 1L, 2L}) {
      c.tiling.kv_splits = splits;
      std::mt19937 rng(12);
      AttnBuffers bufs(c);
      bufs.randomize(rng);
      ioattn::testing::fail_scratch_alloc_after(successes);
      const ioattn::Status st = ioattn::test::run_cpu_kernel(c, bufs);
      ioattn::testing::fail_scratch_alloc_after(-1);
      if (st.is_ok()) {
        const ioattn::test::Verdict v = ioattn::test::check_against_reference(c, bufs);
        CHECK(v.ok);
        continue;
      }
      INFO(st.message);
      CHECK(st.code == IOATTN_ERROR_OUT_OF_MEMORY);
      CHECK(st.message.find("scratch") != std::string::npos);
      for (int64_t i = 0; i < 30; ++i) CHECK(std::isnan(bufs.out.get(0, i, 0, 0)));
      for (float x : bufs.lse) CHECK(std::isnan(x));
    }
  }
}
