// Calibration (common/calibration.h, cpu/calibrate.cc, ioattn_tune): the file's schema and its
// refusals, the machine key, how a calibration moves a plan (and what it may not move), that a
// calibrated plan keeps results exact and bitwise equal across thread counts, that decode's
// prefetch distance changes no bit on any compiled target, and the tuning run end to end.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/calibration.h"
#include "common/cpu_tiles.h"
#include "common/hardware.h"
#include "common/planner.h"
#include "ioattn/ioattn.h"
#include "tests/catch.h"
#include "tests/support/support.h"

using ioattn::Calibration;
using ioattn::DType;
using ioattn::HardwareProfile;
using ioattn::Plan;
using ioattn::test::AttnBuffers;
using ioattn::test::AttnCase;

namespace {

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && dir[0] ? dir : "/tmp") + "/ioattn-test-" + std::to_string(getpid()) + "-" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

Calibration sample_calibration() {
  Calibration c;
  c.key = ioattn::host_machine_key();
  c.created = "2026-12-06T00:00:00Z";
  c.library = "0.1.0";
  c.threads = 2;
  c.prefill.push_back({64, 2, 0.5, 96, 128, 10, 8});
  c.prefill.push_back({128, 0.5, 2, 48, 96, 20, 18});
  c.decode.push_back({DType::f16, 0, 2, 12, 10, 20, 24});
  c.decode.push_back({DType::bf16, 2, 1, 12, 11, 20, 22});
  return c;
}

HardwareProfile with_calibration(HardwareProfile hw, const Calibration& c) {
  auto shared = std::make_shared<Calibration>(c);
  shared->file = "test";
  hw.calibration = std::move(shared);
  return hw;
}

// Restores the default calibration path when a test that set one ends, pass or fail.
struct PathScope {
  explicit PathScope(const std::string& path) { ioattn::set_calibration_path(path); }
  ~PathScope() { ioattn::set_calibration_path(""); }
};

}  // namespace

TEST_CASE("calibration: the file round-trips and names what is wrong with a bad one", "[calibration]") {
  const HardwareProfile host = ioattn::detect_host();
  const Calibration c = sample_calibration();
  const std::string text = ioattn::calibration_to_json(host, c);
  Calibration back;
  std::string error;
  REQUIRE(ioattn::parse_calibration_json(text, "f.json", &back, &error));
  CHECK(back.key == c.key);
  REQUIRE(back.prefill.size() == 2);
  CHECK(back.prefill[1].block_kv_factor == 2);
  CHECK(back.prefill[0].planned_block_kv == 128);
  REQUIRE(back.decode.size() == 2);
  CHECK(back.decode[0].kv_dtype == DType::f16);
  CHECK(back.decode[0].split_factor == 2);
  CHECK(back.decode[1].prefetch_blocks == 2);
  CHECK(back.file == "f.json");
  // The same document is a hardware profile of the host (profiles.json's schema, extended).
  HardwareProfile profile;
  REQUIRE(ioattn::parse_profile_json(text, "f.json", &profile, &error));
  CHECK(profile.levels.size() == host.levels.size());

  struct Bad {
    std::string from, to, says;
  };
  const std::vector<Bad> bad = {
      {"\"block_q_factor\": 2.0", "\"block_q_factor\": 100.0", "block factors"},
      {"\"block_q_factor\": 2.0", "\"block_q_factor\": \"2\"", "block_q_factor"},
      {"\"kv_dtype\": \"f16\"", "\"kv_dtype\": \"f8\"", "kv_dtype"},
      {"\"prefetch_blocks\": 0", "\"prefetch_blocks\": 9", "prefetch_blocks"},
      {"\"split_factor\": 2", "\"split_factor\": 0", "split_factor"},
      {"\"planned_ms\": 10.0", "\"planned_ms\": -1.0", "times"},
      {"\"threads\": 2", "\"thread\": 2", "threads"},
      {"\"calibration\"", "\"calibrated\"", "no 'calibration' object"},
  };
  for (const Bad& b : bad) {
    std::string t = text;
    const size_t at = t.find(b.from);
    REQUIRE(at != std::string::npos);
    t.replace(at, b.from.size(), b.to);
    Calibration out;
    error.clear();
    INFO(b.to);
    CHECK_FALSE(ioattn::parse_calibration_json(t, "bad.json", &out, &error));
    CHECK(error.find("bad.json") != std::string::npos);
    CHECK(error.find(b.says) != std::string::npos);
  }
  CHECK_FALSE(ioattn::parse_calibration_json("{", "cut.json", &back, &error));
  CHECK(error.find("cut.json") != std::string::npos);
}

TEST_CASE("calibration: a file is applied on its own machine only, and a bad one changes nothing", "[calibration]") {
  const HardwareProfile host = ioattn::detect_host();
  const ioattn::Problem pr = ioattn::test::make_problem(16, 16, 2048, 2048, 64);
  const Plan derived = ioattn::plan_cpu(pr, host);
  const std::string path = temp_path("key.json");
  std::string error;

  Calibration c = sample_calibration();
  REQUIRE(ioattn::write_calibration_file(path, host, c, &error));
  {
    PathScope scope(path);
    HardwareProfile h;
    REQUIRE(ioattn::find_profile("host", &h, &error));
    REQUIRE(h.calibration);
    CHECK(h.calibration->file == path);
    const Plan p = ioattn::plan_cpu(pr, h);
    CHECK(p.calibrated);
    CHECK(p.calibration.find(path) != std::string::npos);
    // The kernels plan with the calibrated host unless IOATTN_HW_PROFILE names another profile
    // (CI reruns the suite under zen3's and rpi5's plans), which is never calibrated.
    const char* named = std::getenv("IOATTN_HW_PROFILE");
    CHECK(bool(ioattn::planning_host().calibration) == !(named && named[0]));
  }

  c.key.cores += 1;
  REQUIRE(ioattn::write_calibration_file(path, host, c, &error));
  {
    PathScope scope(path);
    std::string note;
    CHECK_FALSE(ioattn::host_calibration(&note));
    CHECK(note.find("another machine") != std::string::npos);
    CHECK(note.find("cores") != std::string::npos);
    HardwareProfile h;
    REQUIRE(ioattn::find_profile("host", &h, &error));
    const Plan p = ioattn::plan_cpu(pr, h);
    CHECK_FALSE(p.calibrated);
    CHECK(p.block_q == derived.block_q);
    CHECK(p.block_kv == derived.block_kv);
    CHECK(p.calibration == note);
  }

  {
    std::ofstream(path) << "{\"name\": \"host\"}";
    PathScope scope(path);
    std::string note;
    CHECK_FALSE(ioattn::host_calibration(&note));
    CHECK(note.find("not used") != std::string::npos);
  }
  {
    PathScope scope(path + ".missing");
    std::string note = "x";
    CHECK_FALSE(ioattn::host_calibration(&note));
    CHECK(note.empty());
  }
  std::remove(path.c_str());
}

TEST_CASE("calibration: factors scale the cache-derived blocks within the planner's limits", "[calibration]") {
  for (const HardwareProfile& base : ioattn::test::cpu_profiles()) {
    Calibration c = sample_calibration();
    const HardwareProfile hw = with_calibration(base, c);
    for (int64_t d : {int64_t(64), int64_t(80), int64_t(128), int64_t(256)}) {
      const ioattn::Problem pr = ioattn::test::make_problem(16, 4, 1000, 3000, d);
      const Plan derived = ioattn::plan_cpu(pr, base);
      const Plan tuned = ioattn::plan_cpu(pr, hw);
      const ioattn::PrefillCalibration* e = hw.calibration->prefill_for(d);
      REQUIRE(e != nullptr);
      CHECK(e->head_dim == (d < 96 ? 64 : 128));
      INFO(base.name << " D=" << d << ": " << tuned.calibration);
      CHECK(tuned.calibrated);
      // Whole register tiles (and whole GQA groups), never past the rows and keys there are.
      CHECK(tuned.block_q % derived.reg_rows == 0);
      CHECK(tuned.block_q % 4 == 0);
      CHECK(tuned.block_kv % derived.reg_cols == 0);
      CHECK(tuned.block_q <= std::max<int64_t>(derived.block_q, 4 * 1000 + derived.reg_rows * 4));
      CHECK(tuned.block_kv <= 3000 + derived.reg_cols);
      const double want_q = derived.block_q * e->block_q_factor, want_kv = derived.block_kv * e->block_kv_factor;
      CHECK(std::abs(tuned.block_kv - want_kv) <= derived.reg_cols);
      if (e->block_q_factor < 1) CHECK(std::abs(tuned.block_q - want_q) <= 12 * 4);
      CHECK(tuned.working_set_bytes ==
            ioattn::cpu_working_set_bytes(tuned.block_q, tuned.block_kv, tuned.head_dim_padded, tuned.head_dim_padded));
      // Like the planner's own, a calibrated plan is the same for every thread count.
      for (int threads : {1, 3, 7}) {
        const Plan t = ioattn::plan_cpu(pr, hw, threads);
        CHECK(t.block_q == tuned.block_q);
        CHECK(t.block_kv == tuned.block_kv);
        CHECK(t.kv_splits == tuned.kv_splits);
      }
    }
    // A larger block_q may not take query blocks from cores the plan gave them.
    const ioattn::Problem few = ioattn::test::make_problem(1, 1, 512, 512, 64);
    Calibration grow = c;
    grow.prefill = {{64, 8, 1, 0, 0, 1, 1}};
    const Plan derived = ioattn::plan_cpu(few, base);
    const Plan grown = ioattn::plan_cpu(few, with_calibration(base, grow));
    INFO(base.name << ": " << grown.calibration);
    CHECK(grown.work_items >= std::min<int64_t>(derived.work_items, base.cores));

    // Decode: the prefetch distance and more key splits where the plan splits at all.
    const ioattn::Problem dec = ioattn::test::make_problem(32, 8, 1, 32768, 128, DType::f16);
    const Plan d0 = ioattn::plan_cpu(dec, base);
    const Plan d1 = ioattn::plan_cpu(dec, hw);
    CHECK(d0.decode_prefetch_blocks == ioattn::cpu_decode_default_prefetch_blocks);
    CHECK(d1.decode_prefetch_blocks == 0);
    CHECK(d1.kv_splits == (d0.kv_splits > 1 ? std::min(2 * d0.kv_splits, 32768 / 256) : 1));
    CHECK(d1.block_q == d0.block_q);
    // No entry for f32 caches: that problem keeps the cache-derived plan.
    const ioattn::Problem dec32 = ioattn::test::make_problem(32, 8, 1, 32768, 128, DType::f32);
    const Plan d32 = ioattn::plan_cpu(dec32, hw);
    CHECK_FALSE(d32.calibrated);
    CHECK(d32.decode_prefetch_blocks == ioattn::cpu_decode_default_prefetch_blocks);
  }
}

TEST_CASE("calibration: calibrated plans stay exact and bitwise equal across thread counts", "[calibration]") {
  const HardwareProfile hw = with_calibration(ioattn::detect_host(), sample_calibration());
  std::vector<AttnCase> cases;
  AttnCase c;
  c.batch = 2;
  c.heads_q = 8;
  c.heads_kv = 2;
  c.seqlen_q = 300;
  c.seqlen_k = 333;
  c.head_dim = 64;
  c.causal = true;
  c.tiling.profile = &hw;
  cases.push_back(c);
  c.head_dim = 120;
  c.dtype = DType::bf16;
  c.causal = false;
  cases.push_back(c);
  c.dtype = DType::f16;
  c.seqlen_q = 1;
  c.seqlen_k = 4000;
  c.head_dim = 128;
  c.heads_q = 32;
  c.heads_kv = 8;
  c.batch = 1;
  cases.push_back(c);
  for (const AttnCase& base : cases) {
    std::mt19937 rng(5);
    AttnBuffers first(base);
    first.randomize(rng);
    AttnCase one = base;
    one.threads = 1;
    REQUIRE(ioattn::test::run_cpu_kernel(one, first).is_ok());
    const ioattn::test::Verdict v = ioattn::test::check_against_reference(one, first);
    INFO(base.describe() << ": " << v.report());
    CHECK(v.ok);
    for (int threads : {2, 3}) {
      AttnBuffers again = first;
      again.reset_outputs();
      AttnCase t = base;
      t.threads = threads;
      REQUIRE(ioattn::test::run_cpu_kernel(t, again).is_ok());
      INFO("threads " << threads);
      CHECK(ioattn::test::bitwise_equal(first, again));
    }
  }
}

TEST_CASE("calibration: decode's prefetch distance changes no bit, on every compiled target", "[calibration]") {
  for (int64_t target : ioattn::test::compiled_targets()) {
    ioattn::test::TargetScope scope(target);
    int index = 0;
    for (DType t : {DType::f16, DType::bf16, DType::f32})
      for (int64_t sk : {int64_t(31), int64_t(100), int64_t(1000)}) {
        ++index;
        AttnCase c;
        c.batch = 2;
        c.heads_q = index % 2 ? 8 : 4;
        c.heads_kv = index % 2 ? 2 : 4;
        c.seqlen_q = 1 + index % 2;
        c.seqlen_k = sk;
        c.head_dim = index % 3 == 0 ? 72 : 64;
        c.dtype = t;
        c.causal = true;
        c.window_left = index % 4 == 0 ? 50 : -1;
        c.threads = 2;
        c.tiling.kv_splits = index % 3 + 1;
        c.tiling.decode_prefetch_blocks = 0;
        std::mt19937 rng(uint32_t(40 + index));
        AttnBuffers none(c);
        none.randomize(rng);
        REQUIRE(ioattn::test::run_cpu_kernel(c, none).is_ok());
        const ioattn::test::Verdict v = ioattn::test::check_against_reference(c, none);
        INFO(ioattn::test::target_name(target) << " " << c.describe() << ": " << v.report());
        CHECK(v.ok);
        for (int ahead : {1, 2}) {
          AttnBuffers again = none;
          again.reset_outputs();
          AttnCase a = c;
          a.tiling.decode_prefetch_blocks = ahead;
          REQUIRE(ioattn::test::run_cpu_kernel(a, again).is_ok());
          INFO("prefetch " << ahead);
          CHECK(ioattn::test::bitwise_equal(none, again));
        }
      }
  }
}

namespace {

struct Progress {
  int calls = 0, last_done = 0, total = -1;
  bool monotonic = true, labelled = true;
};

void record(int32_t done, int32_t total, const char* what, void* user) {
  Progress& p = *static_cast<Progress*>(user);
  p.monotonic = p.monotonic && done > p.last_done && done <= total && (p.total < 0 || total == p.total);
  p.labelled = p.labelled && what && what[0];
  p.last_done = done;
  p.total = total;
  ++p.calls;
}

}  // namespace

TEST_CASE("calibration: ioattn_tune writes a file later plans use, and refuses bad options", "[calibration]") {
  const std::string path = temp_path("tune/dir/tune.json");
  ioattn_tune_options opt;
  ioattn_tune_options_default(&opt);
  opt.path = path.c_str();
  opt.quick = 1;
  opt.num_threads = 2;
  Progress progress;
  opt.progress = record;
  opt.user = &progress;
  REQUIRE(ioattn_tune(&opt) == IOATTN_OK);
  CHECK(progress.monotonic);
  CHECK(progress.labelled);
  CHECK(progress.last_done == progress.total);
  CHECK(progress.calls <= progress.total);
  CHECK(progress.total > 10);

  Calibration c;
  std::string error;
  REQUIRE(ioattn::parse_calibration_json(read_file(path), path, &c, &error));
  CHECK(c.key == ioattn::host_machine_key());
  CHECK(c.threads == 2);
  CHECK(c.prefill.size() == 2);
  CHECK(c.decode.size() == 3);
  for (const ioattn::PrefillCalibration& e : c.prefill) CHECK(e.best_ms <= e.planned_ms);
  for (const ioattn::DecodeCalibration& e : c.decode) CHECK(e.best_ms <= e.planned_ms);
  {
    PathScope scope(path);
    CHECK(std::string(ioattn_tune_path()) == path);
    HardwareProfile h;
    REQUIRE(ioattn::find_profile("host", &h, &error));
    CHECK(ioattn::plan_cpu(ioattn::test::make_problem(8, 8, 512, 512, 64), h).calibrated);
  }

  const std::string before = read_file(path);
  ioattn_tune_options bad = opt;
  bad.num_threads = -1;
  CHECK(ioattn_tune(&bad) == IOATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ioattn_last_error()).find("opt.num_threads=-1") != std::string::npos);
  bad = opt;
  bad.quick = 2;
  CHECK(ioattn_tune(&bad) == IOATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ioattn_last_error()).find("opt.quick=2") != std::string::npos);
  bad = opt;
  bad.path = "";
  CHECK(ioattn_tune(&bad) == IOATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ioattn_last_error()).find("opt.path") != std::string::npos);
  CHECK(ioattn_tune(nullptr) == IOATTN_ERROR_INVALID_ARGUMENT);
  // A file where a folder must go, and a folder where the file must go: each run fails naming
  // the path before it times anything, and writes nothing.
  const std::string blocked = path + "/under-a-file.json";
  const std::string folder = temp_path("tune/dir");
  for (const std::string& unwritable : {blocked, folder}) {
    INFO(unwritable);
    Progress none;
    bad = opt;
    bad.path = unwritable.c_str();
    bad.user = &none;
    CHECK(ioattn_tune(&bad) == IOATTN_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(ioattn_last_error()).find("opt.path: " + unwritable) != std::string::npos);
    CHECK(none.calls == 0);
    CHECK(read_file(path) == before);
  }
  // The file, then the two folders the run created for it.
  std::remove(path.c_str());
  std::remove(folder.c_str());
  std::remove(temp_path("tune").c_str());
}

TEST_CASE("calibration: a kernel's plan (no text) has the report's numbers", "[calibration]") {
  const Calibration c = sample_calibration();
  for (const HardwareProfile& base : ioattn::test::cpu_profiles())
    for (const HardwareProfile& hw : {base, with_calibration(base, c)})
      for (const ioattn::Problem& pr : {ioattn::test::make_problem(16, 4, 1000, 3000, 64),
                                        ioattn::test::make_problem(32, 8, 1, 9000, 128, DType::f16),
                                        ioattn::test::make_problem(2, 2, 40, 50000, 256, DType::bf16, 3)})
        for (int threads : {0, 1, 5}) {
          const Plan full = ioattn::plan_cpu(pr, hw, threads);
          const Plan bare = ioattn::plan_cpu(pr, hw, threads, ioattn::PlanText::none);
          INFO(hw.name << (hw.calibration ? " calibrated" : "") << " threads " << threads);
          CHECK_FALSE(full.rationale.empty());
          CHECK(bare.rationale.empty());
          CHECK(bare.calibration.empty());
          CHECK(bare.calibrated == full.calibrated);
          CHECK(bare.block_q == full.block_q);
          CHECK(bare.block_kv == full.block_kv);
          CHECK(bare.kv_splits == full.kv_splits);
          CHECK(bare.workers == full.workers);
          CHECK(bare.work_items == full.work_items);
          CHECK(bare.working_set_bytes == full.working_set_bytes);
          CHECK(bare.decode_prefetch_blocks == full.decode_prefetch_blocks);
        }
}
