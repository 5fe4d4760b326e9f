// The CPU flash kernel against the fp64 oracle with the FlashAttention-2 tolerance rule
// (tests/support.h): the shape and feature grid of docs/TESTING.md, every compiled Highway
// target, every dtype, forced tilings and the C ABI.
#include <random>
#include <vector>

#include "cpu/cpu_backend.h"
#include "tests/catch.h"
#include "tests/support.h"

using ioattn::DType;
using ioattn::test::AttnBuffers;
using ioattn::test::AttnCase;

namespace {

void run_and_check(const AttnCase& c, uint32_t seed, float stddev = 1.f) {
  std::mt19937 rng(seed);
  AttnBuffers bufs(c);
  bufs.randomize(rng, stddev);
  const ioattn::Status st = ioattn::test::run_cpu_kernel(c, bufs);
  INFO(c.describe());
  REQUIRE(st.is_ok());
  const ioattn::test::Verdict v = ioattn::test::check_against_reference(c, bufs);
  INFO(v.report());
  CHECK(v.ok);
}

}  // namespace

TEST_CASE("smoke: small shapes on every target", "[cpu][forward]") {
  const int64_t target = GENERATE(from_range(ioattn::test::compiled_targets()));
  ioattn::test::TargetScope scope(target);
  INFO("target " << ioattn::test::target_name(target) << " dispatch " << ioattn::cpu::dispatch_target_name());
  CHECK(ioattn::cpu::dispatch_target_name() == ioattn::test::target_name(target));
  for (int64_t sq : {1, 3, 17}) {
    for (int64_t sk : {1, 2, 97}) {
      for (int64_t d : {1, 7, 64}) {
        for (bool causal : {false, true}) {
          AttnCase c;
          c.seqlen_q = sq;
          c.seqlen_k = sk;
          c.head_dim = d;
          c.causal = causal;
          c.heads_q = 2;
          run_and_check(c, uint32_t(sq * 1000 + sk * 10 + d));
        }
      }
    }
  }
}
