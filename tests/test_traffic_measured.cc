// The measurement parsers (tests/support/traffic_samples.h) on synthetic text and on the recorded
// samples in bench/traffic/samples, and the traffic model against those samples: within ±15%
// at every (point, boundary), the H200's L2 lookups (lts__t_bytes) included, except the misses
// docs/traffic.md lists and explains, which are asserted to still miss so the list cannot outlive
// a model fix.
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "tests/catch.h"
#include "tests/support/traffic_samples.h"

using namespace ioattn;
using namespace ioattn::measured;

namespace {

constexpr double kBar = 0.15;

std::string samples_dir() {
  const char* src = std::getenv("IOATTN_SOURCE_DIR");
  return std::string(src ? src : ".") + "/bench/traffic/samples";
}

// The recorded GPU samples that load reads from samples_dir()/gpu (at least at_least of them),
// with the h200-sxm profile they were measured on.
struct GpuSamples {
  std::vector<GpuPoint> points;
  HardwareProfile h200;
};
GpuSamples gpu_samples(bool (*load)(const std::string&, std::vector<GpuPoint>*, std::string*), size_t at_least) {
  GpuSamples s;
  std::string error;
  REQUIRE(load(samples_dir() + "/gpu", &s.points, &error));
  REQUIRE(s.points.size() >= at_least);
  REQUIRE(find_profile("h200-sxm", &s.h200, &error));
  return s;
}

// (point name, boundary) pairs where the model is known to miss the bar: see docs/traffic.md,
// "Where the model misses". On the CPU samples (zen3's plans through ioattn_forward) one cold
// call, bf16 S=512 D=64 causal past L2, whose V copy's re-reads the model spreads over the
// buffers. The split (gpu_ncu.sh SPLIT=1) is held the same way, by source; the four S = 16384 points of the
// CUDA kernel send through the fabric half of SM-side writes that are not O's stores (1.0 GB at
// D = 128: docs/traffic.md, "What lts__t_bytes counts"), which the model does not have.
const std::set<std::string> kKnownMisses = {
    "flash h1_s512_d64_bf16 causal L2-beyond", "ioattn b1_h16_s16384_d128 L2 fabric",
    "ioattn b1_h16_s16384_d128 causal L2 fabric", "ioattn b1_h32_s16384_d64 L2 fabric",
    "ioattn b1_h32_s16384_d64 causal L2 fabric"};

// One comparison against the bar: within it, or, for a known miss (of `misses`), still outside
// it (so a fix shows up as a failure until the list is updated). Returns whether it was a miss.
bool check_against_bar(const std::string& point, const Comparison& c,
                       const std::set<std::string>& misses = kKnownMisses) {
  const std::string key = point + " " + c.boundary;
  INFO(key << ": predicted " << c.predicted << " measured " << c.measured << " error " << c.error());
  REQUIRE(c.measured > 0);
  const bool miss = misses.count(key) > 0;
  if (miss)
    CHECK(std::fabs(c.error()) > kBar);
  else
    CHECK(std::fabs(c.error()) <= kBar);
  return miss;
}

const char* kCachegrindText =
    "ioattn-cachegrind D1=32768,8,64 LL=524288,8,64 valgrind=valgrind-3.19.0\n"
    "==7== Cachegrind, a cache and branch-prediction profiler\n"
    "ioattn-traffic-run kernel=flash batch=1 heads=1 heads_kv=1 seqlen=256 dim=64 dtype=f32 causal=1 threads=1 "
    "calls=1 hardware=zen3 block_q=132 block_kv=256 head_dim_padded=64 reg_rows=6 reg_cols=16 kv_splits=1 workers=1 "
    "working_set=338000 simd_bits=256 target=AVX2\n"
    "==7== D   refs:      155,924,042  (140,172,103 rd   + 15,751,939 wr)\n"
    "==7== D1  misses:     15,843,825  ( 14,574,090 rd   +  1,269,735 wr)\n"
    "==7== LLd misses:        861,927  (    578,142 rd   +    283,785 wr)\n";

}  // namespace

TEST_CASE("cachegrind summary and driver line parse", "[traffic_measured]") {
  CpuRun r;
  std::string error;
  REQUIRE(parse_cpu_run("synthetic", kCachegrindText, &r, &error));
  CHECK(r.counts.d1_read_misses == 14574090.0);
  CHECK(r.counts.d1_write_misses == 1269735.0);
  CHECK(r.counts.lld_read_misses == 578142.0);
  CHECK(r.counts.lld_write_misses == 283785.0);
  CHECK(r.counts.d1_bytes == 32768);
  CHECK(r.counts.ll_bytes == 524288);
  CHECK(r.counts.line == 64);
  Problem pr;
  Plan plan;
  int bits = 0;
  REQUIRE(make_problem_plan(r.run, &pr, &plan, &bits, &error));
  CHECK(pr.seqlen_q == 256);
  CHECK(pr.causal);
  CHECK(plan.block_q == 132);
  CHECK(plan.block_kv == 256);
  CHECK(bits == 256);
}

TEST_CASE("malformed cachegrind samples are rejected with a reason", "[traffic_measured]") {
  CpuRun r;
  std::string error;
  std::string no_summary = kCachegrindText;
  no_summary.erase(no_summary.find("==7== D1"));
  CHECK_FALSE(parse_cpu_run("a", no_summary, &r, &error));
  CHECK(error.find("D1  misses") != std::string::npos);
  std::string no_geometry = kCachegrindText;
  no_geometry.erase(0, no_geometry.find('\n') + 1);
  CHECK_FALSE(parse_cpu_run("b", no_geometry, &r, &error));
  CHECK(error.find("geometry") != std::string::npos);
  std::string bad_number = kCachegrindText;
  bad_number.replace(bad_number.find("14,574,090"), 10, "14,57x,090");
  CHECK_FALSE(parse_cpu_run("c", bad_number, &r, &error));
}

TEST_CASE("a kernel run without its none run is an error", "[traffic_measured]") {
  CpuRun r;
  std::string error;
  REQUIRE(parse_cpu_run("synthetic", kCachegrindText, &r, &error));
  std::vector<CpuPoint> points;
  CHECK_FALSE(cpu_points({r}, &points, &error));
  CHECK(error.find("none") != std::string::npos);
}

TEST_CASE("two calls minus one is the steady state, one call minus none a cold call", "[traffic_measured]") {
  auto run = [](const std::string& kernel, const std::string& calls, double ll_reads) {
    std::string text = kCachegrindText;
    text.replace(text.find("kernel=flash"), 12, "kernel=" + kernel);
    text.replace(text.find("calls=1"), 7, "calls=" + calls);
    const std::string old = "    578,142 rd", now = std::to_string(int64_t(ll_reads)) + " rd";
    text.replace(text.find(old), old.size(), now);
    CpuRun r;
    std::string error;
    REQUIRE(parse_cpu_run(kernel + calls, text, &r, &error));
    return r;
  };
  std::vector<CpuPoint> points;
  std::string error;
  REQUIRE(cpu_points({run("none", "1", 1000), run("flash", "1", 5000), run("flash", "2", 8000)}, &points, &error));
  REQUIRE(points.size() == 2);
  for (const CpuPoint& p : points) {
    CHECK(p.hardware == "zen3");
    // LL writes are the same in every run: only the reads differ.
    CHECK(p.measured_l2_beyond == 64.0 * (p.cold ? 4000 : 3000));
    CHECK(p.name == std::string("flash h1_s256_d64_f32 causal") + (p.cold ? "" : " steady"));
  }
  CHECK_FALSE(cpu_points({run("none", "1", 1000), run("flash", "2", 8000)}, &points, &error));
  CHECK(error.find("n1") != std::string::npos);
}

TEST_CASE("ncu CSV rows are summed per metric with units", "[traffic_measured]") {
  const std::string gemm = "\"0\",\"sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3\",";
  const std::string text =
      "ioattn-ncu impl=math batch=1 heads=16 seqlen=4096 dim=128 causal=0 dtype=bf16\n"
      "==PROF== Connected to process 1\n"
      "\"ID\",\"Kernel Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n" +
      gemm + "\"dram__bytes_read.sum\",\"Mbyte\",\"1,024.50\"\n" + gemm +
      "\"dram__bytes_write.sum\",\"Gbyte\",\"2.00\"\n" + gemm + "\"lts__t_bytes.sum\",\"byte\",\"4,096\"\n" +
      "\"1\",\"softmax\",\"dram__bytes_read.sum\",\"Kbyte\",\"500\"\n"
      "\"1\",\"softmax\",\"dram__bytes_write.sum\",\"byte\",\"10\"\n";
  GpuPoint g;
  std::string error;
  REQUIRE(parse_gpu_sample("synthetic", text, &g, &error));
  CHECK(g.dram_read == Approx(1024.5e6 + 500e3));
  CHECK(g.dram_write == Approx(2e9 + 10));
  CHECK(g.l2_bytes == Approx(4096));
  CHECK(g.problem.heads_q == 16);
  CHECK(g.impl == "math");
  // The Q K^T kernel's tile is read from its name; no P V kernel in the text leaves that one unset.
  CHECK(g.qk_tile[0] == 64);
  CHECK(g.qk_tile[1] == 256);
  CHECK(g.pv_tile[0] == 0);
  CHECK(passes_for_point(g).qk_tile_k == 256);
  CHECK(passes_for_point(g).pv_tile_d == 128);
  std::string unknown_unit = text;
  unknown_unit.replace(unknown_unit.find("Mbyte"), 5, "parsec");
  CHECK_FALSE(parse_gpu_sample("u", unknown_unit, &g, &error));
  CHECK(error.find("parsec") != std::string::npos);
}

TEST_CASE("ncu counts (sectors, requests) are kept per metric for the L2 split", "[traffic_measured]") {
  const std::string row = "\"0\",\"flash_fwd_kernel\",";
  const std::string text =
      "ioattn-ncu impl=ioattn batch=1 heads=16 seqlen=1024 dim=128 causal=0 dtype=bf16\n"
      "\"ID\",\"Kernel Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"\n" +
      row + "\"dram__bytes_read.sum\",\"byte\",\"10\"\n" + row + "\"dram__bytes_write.sum\",\"byte\",\"20\"\n" + row +
      "\"lts__t_sectors_srcunit_tex.sum\",\"sector\",\"1,000\"\n" + row +
      "\"lts__t_sectors_srcunit_tex.sum\",\"sector\",\"24\"\n" + row +
      "\"lts__t_requests_srcunit_tex.sum\",\"request\",\"7\"\n";
  GpuPoint g;
  std::string error;
  REQUIRE(parse_gpu_sample("synthetic", text, &g, &error));
  CHECK(g.metrics.at("lts__t_sectors_srcunit_tex.sum") == 1024);
  CHECK(g.metrics.at("lts__t_requests_srcunit_tex.sum") == 7);
  CHECK(g.metrics.at("dram__bytes_write.sum") == 20);
  // Without the rest of the split's counters there is no split.
  L2Split split;
  CHECK_FALSE(l2_split(g, &split));
}

TEST_CASE(
    "the recorded L2 split: its sources cover lts__t_sectors, and the CUDA kernel's lookups are "
    "the SMs' own",
    "[traffic_measured]") {
  const auto [points, h200] = gpu_samples(load_split_points, 10);
  for (const GpuPoint& g : points) {
    L2Split m;
    INFO(g.file);
    REQUIRE(l2_split(g, &m));
    // Sources other than the SMs and the fabric (HBM fills are not looked up again; copy engines,
    // instruction fetches) are under 1% of the lookups.
    CHECK(m.tex + m.fabric <= m.total);
    CHECK(m.tex + m.fabric >= 0.99 * m.total);
    CHECK(m.total == Approx(g.l2_bytes));
    if (g.impl == "ioattn") {
      // 1f30c9f's rule sent every cp.async.cg request through the fabric again (a third of the
      // lookups); measured, the fabric carries at most a sixth, and the SMs' reads are 1.5 x what
      // the tiles hold (the model's kCudaCopyReadSectors).
      CHECK(m.fabric < m.total / 6);
      CHECK(m.xbar_read / predict_for_point(g, h200).smem_l2_reads == Approx(1.5).epsilon(0.02));
    }
  }
}

TEST_CASE("the model is within 15% of the recorded CPU cachegrind samples", "[traffic_measured]") {
  std::vector<CpuPoint> points;
  std::string error;
  REQUIRE(load_cpu_points(samples_dir() + "/cpu", &points, &error));
  std::map<int64_t, int> flash_by_heads;
  int steady = 0;
  for (const CpuPoint& p : points) {
    // Every sample is a call through ioattn_forward with the plan the library makes for the
    // simulated hierarchy (run_cachegrind.sh: IOATTN_HW_PROFILE=zen3), as a user's call on zen3.
    INFO(p.name);
    CHECK(p.hardware == "zen3");
    if (p.kernel == "flash") ++flash_by_heads[p.problem.heads_q];
    steady += !p.cold;
    for (const Comparison& c : compare_cpu(p)) {
      check_against_bar(p.name, c);
    }
  }
  // One, two and four heads, cold and steady: one head runs head mode on one thread.
  CHECK(flash_by_heads[1] >= 20);
  CHECK(flash_by_heads[2] >= 4);
  CHECK(flash_by_heads[4] >= 8);
  CHECK(steady >= 20);
}

TEST_CASE("the model is within 15% of the recorded GPU Nsight Compute samples", "[traffic_measured]") {
  const auto [points, h200] = gpu_samples(load_gpu_points, 6);
  int lookups = 0;
  for (const GpuPoint& g : points) {
    for (const Comparison& c : compare_gpu(g, predict_for_point(g, h200))) {
      lookups += c.boundary == "L2 lookups";
      check_against_bar(g.name, c);
    }
  }
  // Every sample with lts__t_bytes (the 20 ioattn and 20 MATH grid points) is held on L2 lookups.
  CHECK(lookups >= 40);
}

TEST_CASE("the model is within 15% of Nsight Compute's HBM bytes for one ioattn_forward call (H100)",
          "[traffic_measured]") {
  // bench/traffic/gpu_ncu.sh IMPLS=abi: one call through the public C ABI with the library's own
  // plan per point, B = 1 among them (a grid short of the SMs once planned a key split that the
  // prefill kernel never runs, and the model then predicted 3.5x the bytes). Recorded on an H100.
  std::vector<GpuPoint> points;
  std::string error;
  REQUIRE(load_gpu_points(samples_dir() + "/gpu/abi-h100-2026-12-06", &points, &error));
  REQUIRE(points.size() >= 6);
  HardwareProfile h100;
  REQUIRE(find_profile("h100-sxm", &h100, &error));
  int single_batch = 0;
  for (const GpuPoint& g : points) {
    single_batch += g.problem.batch == 1;
    const Comparison hbm = compare_gpu(g, predict_for_point(g, h100)).front();
    check_against_bar(g.name, hbm);
  }
  CHECK(single_batch >= 4);
}

TEST_CASE("the model is within 15% of the recorded L2 split, in total and by source", "[traffic_measured]") {
  const auto [points, h200] = gpu_samples(load_split_points, 10);
  int by_source = 0;
  for (const GpuPoint& g : points) {
    const PointPrediction pp = predict_for_point(g, h200);
    std::vector<Comparison> all = compare_gpu(g, pp);
    const std::vector<Comparison> split = compare_split(g, pp);
    by_source += int(split.size());
    all.insert(all.end(), split.begin(), split.end());
    for (const Comparison& c : all) {
      check_against_bar(g.name, c);
    }
  }
  CHECK(by_source == 2 * int(points.size()));
}

TEST_CASE("the model against the sm_90a kernel's Nsight Compute samples (H100)", "[traffic_measured]") {
  // bench/traffic/gpu_ncu.sh IMPLS=ioattn SPLIT=1 at main's tile order (K/V sections of half the
  // L2, gpu/sm90/schedule.cuh): the TMA moves exactly the tiles' sectors, and every causal point
  // is within the bar. Without a mask a section is re-read once per query block, and the L2 keeps
  // far less of that cyclic reuse than the half it is sized to (docs/traffic.md, "The sm_90a
  // kernel"): those points read up to 2.9 x the compulsory bytes from HBM, and the far lines read
  // again cross the fabric again. The model predicts the compulsory bytes, what the kernel is
  // meant to read; those misses are listed so that a schedule which reaches them shows up here.
  std::vector<GpuPoint> points;
  std::string error;
  REQUIRE(load_gpu_points(samples_dir() + "/gpu/sm90-half-l2-2026-12-07", &points, &error));
  REQUIRE(points.size() == 20);
  HardwareProfile h100;
  REQUIRE(find_profile("h100-sxm", &h100, &error));
  const std::set<std::string> section_misses = {
      "ioattn b16_h32_s1024_d64 L2-HBM",    "ioattn b16_h32_s1024_d64 L2 fabric",  "ioattn b8_h16_s2048_d128 L2-HBM",
      "ioattn b8_h16_s2048_d128 L2 fabric", "ioattn b8_h32_s2048_d64 L2-HBM",      "ioattn b8_h32_s2048_d64 L2 fabric",
      "ioattn b8_h32_s2048_d64 L2 lookups", "ioattn b4_h16_s4096_d128 L2-HBM",     "ioattn b4_h16_s4096_d128 L2 fabric",
      "ioattn b4_h32_s4096_d64 L2-HBM",     "ioattn b4_h32_s4096_d64 L2 fabric",   "ioattn b2_h16_s8192_d128 L2-HBM",
      "ioattn b2_h16_s8192_d128 L2 fabric", "ioattn b2_h32_s8192_d64 L2-HBM",      "ioattn b2_h32_s8192_d64 L2 fabric",
      "ioattn b1_h16_s16384_d128 L2-HBM",   "ioattn b1_h16_s16384_d128 L2 fabric", "ioattn b1_h32_s16384_d64 L2-HBM",
      "ioattn b1_h32_s16384_d64 L2 fabric"};
  int compared = 0, missed = 0;
  for (const GpuPoint& g : points) {
    REQUIRE(g.impl == "ioattn");
    const PointPrediction pp = predict_for_point(g, h100);
    L2Split m;
    REQUIRE(l2_split(g, &m));
    INFO(g.file);
    CHECK(m.xbar_read == Approx(pp.smem_l2_reads).epsilon(0.001));
    std::vector<Comparison> all = compare_gpu(g, pp);
    const std::vector<Comparison> split = compare_split(g, pp);
    all.insert(all.end(), split.begin(), split.end());
    for (const Comparison& c : all) {
      ++compared;
      // The compulsory bytes are what the model predicts: the re-reads fall short of the measured.
      if (check_against_bar(g.name, c, section_misses)) {
        CHECK(c.predicted < c.measured);
        ++missed;
      }
    }
  }
  CHECK(compared == 80);
  CHECK(missed == int(section_misses.size()));
}
