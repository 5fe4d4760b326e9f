// The design outline: every field carries this plan's own figures, formatted by the one helper.
#include <cmath>
#include <cstdio>

#include "common/cpu_tiles.h"
#include "common/outline.h"
#include "tests/catch.h"
#include "tests/support/support.h"

using namespace ioattn;
using ioattn::test::make_problem;
using ioattn::test::profile;

namespace {

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

}  // namespace

TEST_CASE("format_bytes and format_ratio") {
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(512 * 1024) == "512 KiB");
  CHECK(format_bytes(1.5 * 1024 * 1024) == "1.5 MiB");
  CHECK(format_bytes(50.0 * 1024 * 1024) == "50 MiB");
  CHECK(format_bytes(390464) == "381.3 KiB");
  CHECK(format_ratio(33, 1) == "33x");
  CHECK(format_ratio(1, 0) == "n/a");
}

TEST_CASE("each outline field names this plan's figures") {
  const struct {
    const char* hw;
    Problem pr;
  } cases[] = {
      {"zen3", make_problem(16, 16, 4096, 4096, 128, DType::f32)},
      {"h200-sxm", make_problem(16, 16, 4096, 4096, 128, DType::bf16)},
      {"spr-xeon", make_problem(32, 8, 1, 16384, 128, DType::f16)},
      {"rpi5", make_problem(8, 8, 512, 512, 64, DType::f16)},
  };
  for (const auto& c : cases) {
    const HardwareProfile hw = profile(c.hw);
    const Problem& pr = c.pr;
    const Plan plan = plan_for(pr, hw);
    const TrafficReport t = predict_traffic(pr, plan, hw);
    const DesignOutline o = designOutline(pr, plan, hw);
    INFO(c.hw << "\n"
              << o.memoryTraffic << "\n"
              << o.tiling << "\n"
              << o.numericalStability << "\n"
              << o.tradeoff << "\n"
              << o.failureMode);

    for (const BoundaryTraffic& b : t.levels) {
      CHECK(has(o.memoryTraffic, b.name + " " + format_bytes(b.flash_bytes) + " vs " + format_bytes(b.standard_bytes)));
      CHECK(has(o.memoryTraffic, format_ratio(b.standard_bytes, b.flash_bytes)));
    }
    CHECK(has(o.memoryTraffic, format_bytes(double(pr.heads_q) * double(pr.seqlen_q) * double(pr.seqlen_k) * 4)));

    CHECK(has(o.tiling, "block_q=" + std::to_string(plan.block_q)));
    CHECK(has(o.tiling, "block_kv=" + std::to_string(plan.block_kv)));
    CHECK(has(o.tiling, format_bytes(double(plan.working_set_bytes))));
    CHECK(has(o.tiling, format_bytes(double(plan.target_level_bytes))));
    CHECK(has(o.tiling, "kv_splits=" + std::to_string(plan.kv_splits)));

    char scale[32];
    std::snprintf(scale, sizeof scale, "%.4g", 1.0 / std::sqrt(double(pr.head_dim)));
    CHECK(has(o.numericalStability, scale));
    CHECK(has(o.numericalStability, dtype_name(pr.dtype)));
    CHECK(has(o.numericalStability, "fp32"));
    CHECK(has(o.numericalStability, std::to_string(pr.seqlen_k) + " keys"));
    // CPU decode mode streams the cache in its own 32-key blocks, not the packed block_kv.
    const bool cpu_decode = plan.backend == BackendKind::cpu && cpu_decode_mode(plan.rows_per_unit);
    CHECK(has(o.numericalStability,
              "blocks of " + std::to_string(cpu_decode ? int64_t(cpu_decode_block_keys) : int64_t(plan.block_kv))));
    if (plan.kv_splits > 1) CHECK(has(o.numericalStability, std::to_string(plan.kv_splits) + " key splits"));

    const int64_t q_blocks = (plan.rows_per_unit + plan.block_q - 1) / plan.block_q;
    CHECK(has(o.tradeoff, std::to_string(q_blocks) + " times"));
    const double kv_head = double(pr.seqlen_k) * double(pr.head_dim + pr.head_dim_v) * dtype_bytes(pr.kv_dtype);
    CHECK(has(o.tradeoff, format_bytes(kv_head)));
    CHECK(has(o.tradeoff, format_bytes(t.levels.back().flash_bytes)) ==
          (t.levels.back().standard_bytes <= t.levels.back().flash_bytes * 1.05));

    if (cpu_decode) {
      // The block prefetched ahead, all kv heads of 32 positions, and room for two of them.
      const double block = 32.0 * double(pr.heads_kv) * double(pr.head_dim + pr.head_dim_v) * dtype_bytes(pr.kv_dtype);
      CHECK(has(o.failureMode, format_bytes(block)));
      CHECK(has(o.failureMode, format_bytes(2 * block)));
      CHECK(has(o.tiling, "decode mode"));
      CHECK(has(o.memoryTraffic, "4x32 score block"));
    } else {
      CHECK(has(o.failureMode, format_bytes(double(plan.working_set_bytes))));
    }
    CHECK(has(o.failureMode, format_bytes(double(plan.target_level_bytes))));
  }
}

TEST_CASE("CPU decode's failure mode names the cores a stream of this bandwidth needs") {
  // spr-xeon: DRAM 307.2 GB/s; a core keeps 16 lines of 64 B in flight per ~110 ns.
  const HardwareProfile spr = profile("spr-xeon");
  const Problem pr = make_problem(32, 8, 1, 32768, 128, DType::bf16, 8);
  const Plan plan = plan_cpu(pr, spr);
  const DesignOutline o = designOutline(pr, plan, spr);
  INFO(o.failureMode);
  CHECK(has(o.failureMode, "4 FLOP per byte"));
  CHECK(has(o.failureMode, "at least " + std::to_string(int(std::ceil(spr.dram().bandwidth_gbs / (16 * 64 / 110.0)))) +
                               " busy cores"));
  // The packed path's outline for the same machine and more query rows keeps its own terms.
  const Problem prefill = make_problem(32, 8, 512, 32768, 128, DType::bf16);
  CHECK(!has(designOutline(prefill, plan_cpu(prefill, spr), spr).tiling, "decode mode"));
}

TEST_CASE("the CPU failure mode quotes the model's traffic with the target level halved") {
  const HardwareProfile zen3 = profile("zen3");
  const Problem pr = make_problem(16, 16, 4096, 4096, 128, DType::f32);
  const Plan plan = plan_cpu(pr, zen3);
  HardwareProfile small = zen3;
  small.levels[1].size_bytes = plan.working_set_bytes / 2;
  const TrafficReport spilled = predict_traffic(pr, plan, small);
  const TrafficReport normal = predict_traffic(pr, plan, zen3);
  CHECK(spilled.levels[1].flash_bytes > normal.levels[1].flash_bytes);
  const DesignOutline o = designOutline(pr, plan, zen3);
  CHECK(has(o.failureMode, "L2-L3 traffic rises from " + format_bytes(normal.levels[1].flash_bytes) + " to " +
                               format_bytes(spilled.levels[1].flash_bytes)));
}

TEST_CASE("a GPU shape off the tile table says where it runs in the failure mode") {
  const HardwareProfile h200 = profile("h200-sxm");
  const Problem portable = make_problem(16, 16, 4096, 4096, 80, DType::bf16);
  const DesignOutline o = designOutline(portable, plan_gpu(portable, h200), h200);
  CHECK(has(o.failureMode, "portable kernel"));
  CHECK(has(o.failureMode, "96"));
  const Problem wide = make_problem(16, 16, 4096, 4096, 320, DType::bf16);
  CHECK(has(designOutline(wide, plan_gpu(wide, h200), h200).failureMode, "not supported"));
}
