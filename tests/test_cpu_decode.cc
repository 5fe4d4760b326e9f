// The CPU kernel's decode mode (cpu/flash_kernel.cc, DecodeRange): calls whose sequences have at
// most cpu_decode_max_rows query rows per kv head (G heads x Sq positions) stream K/V straight
// from the cache, all kv heads per task, with split-KV over positions. Every case here is checked
// against the fp64 oracle with the FA2 tolerance rule (tests/support); the shapes straddle the
// decode/packed boundary (Sq 1..16 at G = 1, 4, 8 and MQA), cover odd head dims (a vector tail in
// both the score and the P V loops), windows that cut blocks, NaN in one K or V row, determinism
// over thread counts with forced key splits, and every compiled Highway target.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/cpu_tiles.h"
#include "cpu/cpu_backend.h"
#include "tests/catch.h"
#include "tests/support/support.h"

using ioattn::DType;
using ioattn::test::AttnBuffers;
using ioattn::test::AttnCase;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

void check_case(const AttnCase& c, uint32_t seed) {
  ioattn::Status st = ioattn::Status::ok();
  const ioattn::test::Verdict v = ioattn::test::run_random_case(c, seed, &st);
  INFO(c.describe() << ": " << v.report());
  REQUIRE(st.is_ok());
  CHECK(v.ok);
}

}  // namespace

TEST_CASE("decode: Sq 1..16 across GQA 1, 4, 8 and MQA against the reference", "[cpu][decode]") {
  struct Heads {
    int64_t hq, hkv;
  };
  // G = 1 (MHA), 4 (the 32/8), 8, and MQA with G = 8 (decode) and G = 16 (packed).
  const Heads heads[] = {{4, 4}, {8, 2}, {16, 2}, {8, 1}, {16, 1}};
  const DType types[] = {DType::f32, DType::f16, DType::bf16};
  int index = 0;
  for (const Heads& h : heads)
    for (int64_t sq : {1, 2, 3, 8, 16}) {
      ++index;
      AttnCase c;
      c.batch = 1 + index % 3;
      c.heads_q = h.hq;
      c.heads_kv = h.hkv;
      c.seqlen_q = sq;
      c.seqlen_k = index % 4 == 0 ? 1 : 37 + 61 * (index % 5);
      c.head_dim = index % 3 == 0 ? 59 : (index % 3 == 1 ? 64 : 128);
      c.dtype = types[index % 3];
      c.causal = index % 2 == 1;
      c.window_left = index % 7 == 3 ? 20 : -1;
      c.threads = 1 + index % 2;
      DYNAMIC_SECTION("case " << index << ": " << c.describe()) { check_case(c, uint32_t(300 + index)); }
    }
}

TEST_CASE("decode: windows and softcap cut the key blocks", "[cpu][decode]") {
  int index = 0;
  for (int64_t wl : {0, 5, 40})
    for (int64_t wr : {-1, 0, 3})
      for (float cap : {0.f, 7.f}) {
        ++index;
        AttnCase c;
        c.heads_q = 8;
        c.heads_kv = 2;
        c.seqlen_q = 2;
        c.seqlen_k = 150;
        c.head_dim = 64;
        c.dtype = index % 2 ? DType::f16 : DType::bf16;
        c.window_left = wl;
        c.window_right = wr;
        c.softcap = cap;
        c.threads = 2;
        DYNAMIC_SECTION(c.describe()) { check_case(c, uint32_t(900 + index)); }
      }
}

TEST_CASE("decode: NaN in one K or V row reaches exactly the rows that read it", "[cpu][decode]") {
  // Sq = 2 at G = 4 (8 rows, decode): with window_left = 0 and causal, position i sees key
  // Sk - Sq + i only, so a NaN at key Sk - 2 poisons position 0 and must not reach position 1,
  // even though both positions' rows share the key block (a hidden score is -inf by select and
  // a hidden V row is never multiplied by 0).
  for (int which = 0; which < 2; ++which)
    for (int64_t threads : {1, 2}) {
      AttnCase c;
      c.heads_q = 8;
      c.heads_kv = 2;
      c.seqlen_q = 2;
      c.seqlen_k = 40;
      c.head_dim = 64;
      c.dtype = DType::f16;
      c.causal = true;
      c.window_left = 0;
      c.threads = int(threads);
      AttnBuffers bufs(c);
      std::mt19937 rng(5);
      bufs.randomize(rng);
      const int64_t key = c.seqlen_k - 2;
      if (which == 0)
        bufs.k.set(0, key, 1, 3, kNaN);
      else
        bufs.v.set(0, key, 1, 3, kNaN);
      REQUIRE(ioattn::test::run_cpu_kernel(c, bufs).is_ok());
      const ioattn::test::Verdict v = ioattn::test::check_against_reference(c, bufs);
      INFO("NaN in " << (which == 0 ? "K" : "V") << ", threads " << threads << ": " << v.report());
      CHECK(v.ok);
      for (int64_t h = 0; h < c.heads_q; ++h) {
        const bool reads = h / 4 == 1;  // the heads of kv head 1
        CHECK(std::isnan(bufs.out.get(0, 0, h, which == 1 ? 3 : 0)) == reads);
        CHECK(!std::isnan(bufs.out.get(0, 1, h, 0)));
      }
    }
}

TEST_CASE("decode: bitwise identical for any thread count with key splits", "[cpu][decode]") {
  for (int splits : {0, 3, 7}) {
    AttnCase c;
    c.batch = 2;
    c.heads_q = 32;
    c.heads_kv = 8;
    c.seqlen_q = 1;
    c.seqlen_k = 1500;
    c.head_dim = 128;
    c.dtype = DType::bf16;
    c.causal = true;
    c.tiling.kv_splits = splits;  // 0: the planner's split for this host
    AttnBuffers reference(c);
    std::mt19937 rng(17);
    reference.randomize(rng);
    AttnCase one = c;
    one.threads = 1;
    REQUIRE(ioattn::test::run_cpu_kernel(one, reference).is_ok());
    const ioattn::test::Verdict v = ioattn::test::check_against_reference(c, reference);
    INFO("kv_splits " << splits << ": " << v.report());
    CHECK(v.ok);
    for (int threads : {2, 3, 5}) {
      AttnBuffers again = reference;
      again.reset_outputs();
      AttnCase t = c;
      t.threads = threads;
      REQUIRE(ioattn::test::run_cpu_kernel(t, again).is_ok());
      INFO("kv_splits " << splits << ", threads " << threads);
      CHECK(ioattn::test::bitwise_equal(reference, again));
    }
  }
}

TEST_CASE("decode: key splits cut in 32-key blocks, more splits than blocks, windows past key 0", "[cpu][decode]") {
  // A split is a run of whole decode blocks counted from the first visible key, as even as the
  // blocks allow; with more splits than blocks some splits are empty and merge as (0, -inf, 0).
  // A left window moves the first visible key off 0, and two causal query positions (G x 2 = 8
  // rows, still decode mode) give each row its own range inside the union.
  int index = 0;
  for (int splits : {2, 5, 16, 40})
    for (int64_t sk : {int64_t(1), int64_t(31), int64_t(33), int64_t(95), int64_t(600)}) {
      ++index;
      AttnCase c;
      c.batch = 1 + index % 2;
      c.heads_q = 8;
      c.heads_kv = 2;
      c.seqlen_q = index % 2 == 0 ? 2 : 1;
      c.seqlen_k = sk;
      c.head_dim = index % 3 == 0 ? 72 : 64;
      c.dtype = index % 3 == 1 ? DType::f16 : DType::f32;
      c.causal = true;
      c.window_left = index % 4 < 2 ? 70 : -1;
      c.threads = 1 + index % 3;
      c.tiling.kv_splits = splits;
      DYNAMIC_SECTION("splits " << splits << ": " << c.describe()) { check_case(c, uint32_t(900 + index)); }
    }
}

TEST_CASE("decode: every compiled Highway target", "[cpu][decode]") {
  for (int64_t target : ioattn::test::compiled_targets()) {
    ioattn::test::TargetScope scope(target);
    int index = 0;
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      ++index;
      AttnCase c;
      c.batch = 2;
      c.heads_q = 8;
      c.heads_kv = 2;
      c.seqlen_q = 1 + index % 2;
      c.seqlen_k = 131;
      c.head_dim = index == 2 ? 59 : 128;
      c.dtype = t;
      c.causal = true;
      c.threads = 2;
      c.tiling.kv_splits = 2;
      DYNAMIC_SECTION(ioattn::test::target_name(target) << " " << c.describe()) { check_case(c, uint32_t(40 + index)); }
    }
  }
}

TEST_CASE("decode: head-major caches, each head over all blocks, on every compiled target", "[cpu][decode]") {
  // K and V both head-major (each kv head's keys contiguous) run head by head over the whole
  // split; one head-major and one position-major cache keep blocks outermost. Row padding puts
  // NaN between rows, multi-block key ranges with splits and windows cut blocks per head.
  using ioattn::test::Layout;
  const Layout head_major{Layout::bhsd, 0, 0}, padded_head_major{Layout::bhsd, 3, 5}, position_major{};
  struct Layouts {
    Layout k, v;
  };
  const Layouts layouts[] = {{head_major, head_major}, {padded_head_major, head_major}, {head_major, position_major}};
  const DType types[] = {DType::f16, DType::bf16, DType::f32};
  for (int64_t target : ioattn::test::compiled_targets()) {
    ioattn::test::TargetScope scope(target);
    int index = 0;
    for (const Layouts& l : layouts)
      for (int64_t hkv : {8, 2}) {
        ++index;
        AttnCase c;
        c.batch = 1 + index % 3;
        c.heads_q = 8;
        c.heads_kv = hkv;
        c.seqlen_q = 1;
        c.seqlen_k = index % 2 ? 203 : 97;
        c.head_dim = index % 3 == 0 ? 59 : 128;
        c.dtype = types[index % 3];
        c.k_layout = l.k;
        c.v_layout = l.v;
        c.causal = index % 2 == 0;
        c.window_left = index % 4 == 1 ? 70 : -1;
        c.threads = 1 + index % 2;
        c.tiling.kv_splits = 1 + index % 3;
        DYNAMIC_SECTION(ioattn::test::target_name(target) << " " << c.describe()) {
          check_case(c, uint32_t(700 + index));
        }
      }
  }
}
