// The ring model (common/ring.h): shard sizes, bytes on the link, the compute/transfer comparison
// that says whether communication hides, per-rank off-chip bytes, and the refusals; the profiles'
// link figures and their schema.
#include <string>

#include "common/hardware.h"
#include "common/problem.h"
#include "common/ring.h"
#include "common/traffic.h"
#include "tests/catch.h"
#include "tests/support/support.h"

using ioattn::DType;
using ioattn::HardwareProfile;
using ioattn::Link;
using ioattn::RingModel;

namespace {

RingModel ring(const ioattn::Problem& pr, const HardwareProfile& hw, int ranks, const Link& link) {
  RingModel m;
  std::string error;
  INFO(error);
  REQUIRE(ioattn::predict_ring(pr, hw, ranks, link, 0, &m, &error));
  return m;
}

}  // namespace

TEST_CASE("ring: every built-in profile names its links, fastest first", "[ring]") {
  for (const HardwareProfile& hw : ioattn::builtin_profiles()) {
    INFO(hw.name);
    REQUIRE_FALSE(hw.links.empty());
    for (size_t i = 0; i < hw.links.size(); ++i) {
      CHECK(hw.links[i].bandwidth_gbs > 0);
      CHECK(hw.links[i].latency_us >= 0);
      CHECK_FALSE(hw.links[i].source.empty());
      if (i > 0) CHECK(hw.links[i].bandwidth_gbs <= hw.links[i - 1].bandwidth_gbs);
    }
  }
  // The schema: links round-trip through a profile file, and a bad one is named.
  const HardwareProfile h100 = ioattn::test::profile("h100-sxm");
  HardwareProfile back;
  std::string error;
  std::string text = ioattn::profile_to_json(h100);
  REQUIRE(ioattn::parse_profile_json(text, "p.json", &back, &error));
  REQUIRE(back.links.size() == h100.links.size());
  CHECK(back.links[0].name == "NVLink4");
  CHECK(back.links[0].bandwidth_gbs == 450);
  const size_t at = text.find("\"bandwidth_gbs\": 450.0");
  REQUIRE(at != std::string::npos);
  text.replace(at, 22, "\"bandwidth_gbs\": -1");
  CHECK_FALSE(ioattn::parse_profile_json(text, "p.json", &back, &error));
  CHECK(error.find("links[0]") != std::string::npos);
  CHECK(error.find("bandwidth_gbs") != std::string::npos);
}

TEST_CASE("ring: link bytes, compute per step and whether the transfer hides", "[ring]") {
  const HardwareProfile h100 = ioattn::test::profile("h100-sxm");
  const Link nvlink = h100.links[0];
  ioattn::Problem pr = ioattn::test::make_problem(16, 16, 131072, 131072, 128, DType::bf16);
  const RingModel m = ring(pr, h100, 8, nvlink);
  CHECK(m.shard_seqlen == 16384);
  // One K/V shard per step: 16 heads x 16384 rows x (128 + 128) x 2 bytes.
  CHECK(m.link_bytes_per_step == 16.0 * 16384 * 256 * 2);
  CHECK(m.transfer_s_per_step == Approx(m.link_bytes_per_step / 450e9 + 2e-6));
  CHECK(m.flops_per_step == Approx(4.0 * 16 * 16384.0 * 16384 * 128));
  CHECK(m.hides);
  CHECK(m.compute_s_per_step >= m.flops_per_step / (h100.tensor_tflops * 1e12) * 0.999);
  CHECK(m.summary.find("hides under compute") != std::string::npos);
  // The same step over PCIe with 8x shorter shards: 8x fewer bytes, 64x fewer FLOPs.
  pr.seqlen_q = pr.seqlen_k = 16384;
  const RingModel p = ring(pr, h100, 8, h100.links[1]);
  CHECK_FALSE(p.hides);
  CHECK(p.transfer_s_per_step > p.compute_s_per_step);
  CHECK(p.summary.find("does not hide") != std::string::npos);
  CHECK(p.predicted_efficiency < m.predicted_efficiency);
  // Per rank: its calls' bytes plus the shard it sends and receives each later step.
  CHECK(p.rank_dram_bytes > 7 * 2 * p.link_bytes_per_step);
  // One rank is the single device: nothing on the link, the same time.
  const RingModel one = ring(pr, h100, 1, nvlink);
  CHECK(one.transfer_s_per_step == 0);
  CHECK(one.rank_time_s == Approx(one.single_device_time_s));
  CHECK(one.predicted_efficiency == Approx(1.0));
}

TEST_CASE("ring: causal problems use zigzag, half the work per step", "[ring]") {
  const HardwareProfile zen3 = ioattn::test::profile("zen3");
  ioattn::Problem pr = ioattn::test::make_problem(8, 2, 8192, 8192, 64);
  const RingModel full = ring(pr, zen3, 4, zen3.links[0]);
  pr.causal = true;
  const RingModel causal = ring(pr, zen3, 4, zen3.links[0]);
  CHECK(causal.zigzag);
  CHECK(causal.diagonal_step.causal);
  CHECK_FALSE(causal.ring_step.causal);
  CHECK(causal.flops_per_step == Approx(full.flops_per_step / 2));
  // GQA: only the kv heads travel, and the link bytes do not depend on the mask.
  CHECK(causal.link_bytes_per_step == 2.0 * 2048 * 128 * 4);
  CHECK(causal.link_bytes_per_step == full.link_bytes_per_step);
}

TEST_CASE("ring: shapes the ring cannot shard are refused, naming the value", "[ring]") {
  const HardwareProfile zen3 = ioattn::test::profile("zen3");
  const Link link = zen3.links[0];
  RingModel m;
  std::string error;
  ioattn::Problem pr = ioattn::test::make_problem(4, 4, 1000, 1000, 64);
  CHECK_FALSE(ioattn::predict_ring(pr, zen3, 3, link, 0, &m, &error));
  CHECK(error.find("1000") != std::string::npos);
  pr = ioattn::test::make_problem(4, 4, 1004, 1004, 64);
  pr.causal = true;  // 1004 rows divide into 4 shards but not into 8 zigzag chunks
  error.clear();
  CHECK_FALSE(ioattn::predict_ring(pr, zen3, 4, link, 0, &m, &error));
  CHECK(error.find("zigzag") != std::string::npos);
  pr = ioattn::test::make_problem(4, 4, 1024, 2048, 64);
  error.clear();
  CHECK_FALSE(ioattn::predict_ring(pr, zen3, 2, link, 0, &m, &error));
  CHECK(error.find("seqlen_q") != std::string::npos);
  pr = ioattn::test::make_problem(4, 4, 1024, 1024, 64);
  pr.window_left = 100;
  error.clear();
  CHECK_FALSE(ioattn::predict_ring(pr, zen3, 2, link, 0, &m, &error));
  CHECK(error.find("window") != std::string::npos);
  error.clear();
  CHECK_FALSE(ioattn::predict_ring(ioattn::test::make_problem(4, 4, 1024, 1024, 64), zen3, 0, link, 0, &m, &error));
  CHECK(error.find("ranks=0") != std::string::npos);
}
