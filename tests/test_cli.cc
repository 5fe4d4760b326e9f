// The `ioattn` binary as a user meets it: exit codes and one-line messages for bad flags and bad
// .npy files, no output file created or truncated on error, the JSON of plan/traffic/explain/hw,
// and `run` round trips against the fp64 reference.
#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/gpu_tiles.h"
#include "common/reference.h"
#include "ioattn/ioattn.h"
#include "tests/catch.h"
#include "tools/npy.h"

extern char** environ;

using nlohmann::json;
using namespace ioattn;
using namespace ioattn::cli;

namespace {

struct Result {
  int code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// A fresh directory per test case, removed with its files at the end.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base ? base : "/tmp") + "/ioattn_test_cli_XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    REQUIRE(::mkdtemp(buf.data()) != nullptr);
    path_ = buf.data();
  }
  ~TempDir() {
    for (const std::string& f : files()) std::remove((path_ + "/" + f).c_str());
    ::rmdir(path_.c_str());
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path_.c_str())) {
      while (dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") out.push_back(n);
      }
      ::closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::string path_;
};

std::string cli_path() {
  const char* p = std::getenv("IOATTN_CLI");
  REQUIRE(p != nullptr);  // set by tests/CMakeLists.txt; run through ctest
  return p;
}

Result run_cli(const std::vector<std::string>& args) {
  static int counter = 0;
  const char* base = std::getenv("TMPDIR");
  const std::string stem = std::string(base ? base : "/tmp") + "/ioattn_test_cli_" + std::to_string(::getpid()) + "_" +
                           std::to_string(counter++);
  const std::string out_path = stem + ".out", err_path = stem + ".err";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  const std::string exe = cli_path();
  std::vector<std::string> all = {exe};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE(rc == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  return r;
}

// Exit 2, one line on stderr naming every fragment, nothing on stdout.
void expect_usage_error(const std::vector<std::string>& args, const std::vector<std::string>& fragments) {
  const Result r = run_cli(args);
  std::string joined;
  for (const auto& a : args) joined += a + " ";
  INFO("ioattn " << joined << "\nstderr: " << r.err);
  CHECK(r.code == 2);
  REQUIRE(!r.err.empty());
  CHECK(r.err.back() == '\n');
  CHECK(r.err.find('\n') == r.err.size() - 1);
  CHECK(r.err.rfind("ioattn", 0) == 0);
  for (const auto& f : fragments) CHECK(r.err.find(f) != std::string::npos);
}

const std::vector<std::string> kReference = {"--hw",       "zen3", "--hw",       "h200-sxm", "--heads",    "16",
                                             "--head-dim", "128",  "--seqlen-q", "4096",     "--seqlen-k", "4096"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

json parse_json(const Result& r) {
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE(r.code == 0);
  const json j = json::parse(r.out, nullptr, false);
  REQUIRE_FALSE(j.is_discarded());
  return j;
}

// --- .npy fixtures -----------------------------------------------------------------------

struct Shape {
  int64_t b, s, h, d;
};

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = float(double(rng()) / 2147483648.0 - 1.0);
  return v;
}

void write_f32(const std::string& path, const Shape& s, const std::vector<float>& v) {
  std::string error;
  REQUIRE(write_npy(path, NpyDType::f32, {s.b, s.s, s.h, s.d}, v.data(), &error));
}

void write_f16(const std::string& path, const Shape& s, const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_f16(v[i]);
  std::string error;
  REQUIRE(write_npy(path, NpyDType::f16, {s.b, s.s, s.h, s.d}, h.data(), &error));
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

struct Reference {
  std::vector<double> out, lse;
};

// naive_attention<double> over contiguous arrays, exactly what the CLI's output must match.
Reference reference(const Shape& qs, const Shape& ks, int64_t dv, DType dtype, const void* q, const void* k,
                    const void* v, float scale, float softcap, bool causal, int64_t wl, int64_t wr) {
  AttnParams p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.io_dtype = p.kv_dtype = dtype;
  p.batch = qs.b;
  p.seqlen_q = qs.s;
  p.seqlen_k = ks.s;
  p.heads_q = qs.h;
  p.heads_kv = ks.h;
  p.head_dim = qs.d;
  p.head_dim_v = dv;
  p.q_batch_stride = qs.s * qs.h * qs.d;
  p.q_seq_stride = qs.h * qs.d;
  p.q_head_stride = qs.d;
  p.k_batch_stride = ks.s * ks.h * ks.d;
  p.k_seq_stride = ks.h * ks.d;
  p.k_head_stride = ks.d;
  p.v_batch_stride = ks.s * ks.h * dv;
  p.v_seq_stride = ks.h * dv;
  p.v_head_stride = dv;
  p.o_batch_stride = qs.s * qs.h * dv;
  p.o_seq_stride = qs.h * dv;
  p.o_head_stride = dv;
  p.lse_batch_stride = qs.h * qs.s;
  p.lse_head_stride = qs.s;
  p.scale = scale > 0 ? scale : float(1.0 / std::sqrt(double(qs.d)));
  p.softcap = softcap;
  p.causal = causal;
  p.window_left = wl;
  p.window_right = wr;
  p.num_threads = 1;
  Reference r;
  r.out.resize(size_t(qs.b * qs.s * qs.h * dv));
  r.lse.resize(size_t(qs.b * qs.h * qs.s));
  naive_attention<double>(p, r.out.data(), r.lse.data());
  return r;
}

// Valid inputs for the error tests: q (2, 5, 4, 8), k/v (2, 7, 2, 8).
struct Inputs {
  std::string q, k, v;
};
Inputs write_valid_inputs(const TempDir& dir) {
  const Shape qs{2, 5, 4, 8}, ks{2, 7, 2, 8};
  Inputs in{dir / "q.npy", dir / "k.npy", dir / "v.npy"};
  write_f32(in.q, qs, random_values(2 * 5 * 4 * 8, 1));
  write_f32(in.k, ks, random_values(2 * 7 * 2 * 8, 2));
  write_f32(in.v, ks, random_values(2 * 7 * 2 * 8, 3));
  return in;
}

}  // namespace

TEST_CASE("cli: usage, help and unknown commands", "[cli]") {
  const Result none = run_cli({});
  CHECK(none.code == 2);
  CHECK(none.err.find("usage: ioattn") != std::string::npos);
  // bench's help: "cli: bench ..." ([bench]; a build without benchmarks skips it).
  for (const char* cmd : {"demo", "run", "plan", "traffic", "explain", "hw"}) {
    const Result r = run_cli({cmd, "--help"});
    INFO(cmd << ": " << r.err);
    CHECK(r.code == 0);
    CHECK(r.out.find(std::string("usage: ioattn ") + cmd) != std::string::npos);
    CHECK(r.err.empty());
  }
  CHECK(run_cli({"--help"}).code == 0);
  expect_usage_error({"frobnicate"}, {"unknown command", "'frobnicate'"});
  // A control character in an argument cannot split the message over lines.
  expect_usage_error({"plan", "--heads", "1\n2"}, {"--heads", "'1\\x0a2'"});
}

TEST_CASE("cli: problem flags are validated with exit 2 and a one-line message", "[cli]") {
  for (const char* cmd : {"plan", "traffic", "explain"}) {
    const std::string c = cmd;
    expect_usage_error({c, "--head-dim", "abc"},
                       {"ioattn " + c + ": --head-dim: expected a positive integer, got 'abc'"});
    expect_usage_error({c, "--heads", "0"}, {"--heads", "out of range"});
    expect_usage_error({c, "--heads", "16", "--kv-heads", "3"}, {"--kv-heads", "does not divide", "16"});
    expect_usage_error({c, "--seqlen-q", "-5"}, {"--seqlen-q"});
    expect_usage_error({c, "--seqlen-q", "12x"}, {"--seqlen-q", "'12x'"});
    expect_usage_error({c, "--seqlen-k", "99999999999999999999"}, {"--seqlen-k", "out of range"});
    expect_usage_error({c, "--bogus"}, {"unknown flag", "'--bogus'"});
    expect_usage_error({c, "--heads"}, {"--heads", "missing value"});
    expect_usage_error({c, "--heads", "--causal"}, {"--heads", "missing value"});
    expect_usage_error({c, "--batch", "1", "--batch", "2"}, {"--batch", "more than once"});
    expect_usage_error({c, "--dtype", "f64"}, {"--dtype", "'f64'"});
    expect_usage_error({c, "--window", "5"}, {"--window", "L,R"});
    expect_usage_error({c, "--window", "5,-2"}, {"--window", "'-2'"});
    expect_usage_error({c, "--causal=yes"}, {"--causal", "takes no value"});
    expect_usage_error({c, "stray"}, {"unexpected argument", "'stray'"});
    expect_usage_error({c, "--hw", "pdp11"}, {"--hw", "pdp11"});
    expect_usage_error({c, "--hw-file", "/nonexistent/profile.json"}, {"--hw-file", "/nonexistent/profile.json"});
  }
  TempDir dir;
  write_raw(dir / "bad.json", "{\"name\": \"x\", \"kind\": ");
  expect_usage_error({"plan", "--hw-file", dir / "bad.json"}, {"--hw-file", "bad.json"});
  write_raw(dir / "wrong.json", "{\"name\": 7}");
  expect_usage_error({"plan", "--hw-file", dir / "wrong.json"}, {"--hw-file", "wrong.json"});
}

TEST_CASE("cli: plan --json for zen3 and h200-sxm, 16 heads x 128 over 4096 tokens", "[cli]") {
  const json j = parse_json(run_cli(with({"plan", "--json", "--dtype", "bf16"}, kReference)));
  REQUIRE(j.is_array());
  REQUIRE(j.size() == 2);
  for (const char* key : {"backend", "hardware", "block_q", "block_kv", "kv_splits", "workers", "working_set_bytes",
                          "target_level", "target_level_bytes"}) {
    CHECK(j[0].contains(key));
    CHECK(j[1].contains(key));
  }
  const json& cpu = j[0];
  CHECK(cpu["hardware"] == "zen3");
  CHECK(cpu["backend"] == "cpu");
  CHECK(cpu["block_q"].get<int>() > 0);
  CHECK(cpu["block_kv"].get<int>() > 0);
  CHECK(cpu["kv_splits"].get<int>() >= 1);
  CHECK(cpu["workers"].get<int>() >= 1);
  // The working set fits the cache level it was fitted to, and that level is a cache, not DRAM.
  CHECK(cpu["working_set_bytes"].get<int64_t>() > 0);
  CHECK(cpu["working_set_bytes"].get<int64_t>() <= cpu["target_level_bytes"].get<int64_t>());
  const std::string level = cpu["target_level"];
  CHECK((level == "L1d" || level == "L2" || level == "L3"));
  CHECK(cpu["problem"]["heads"] == 16);
  CHECK(cpu["problem"]["seqlen_k"] == 4096);

  const json& gpu = j[1];
  CHECK(gpu["hardware"] == "h200-sxm");
  CHECK(gpu["backend"] == "cuda");
  // The GPU plan is the constexpr tile the CUDA kernels are instantiated from.
  // An H200 is compute capability 9.0: its prefill plan is the sm_90a kernel's tile.
  constexpr GpuTileSm90 tile = gpu_tile_sm90(128);
  CHECK(gpu["kernel"] == "sm90");
  CHECK(gpu["block_q"].get<int>() == tile.block_q);
  CHECK(gpu["block_kv"].get<int>() == tile.block_kv);
  CHECK(gpu["stages"].get<int>() == tile.stages);
  CHECK(gpu["target_level"] == "smem");
  CHECK(gpu["working_set_bytes"].get<int64_t>() <= gpu["target_level_bytes"].get<int64_t>());
  CHECK(gpu["workers"].get<int>() > 1);
  // In f32 (the default dtype) the same GPU runs the portable kernel, and the plan says so.
  const json f32 = parse_json(run_cli(with({"plan", "--json"}, kReference)));
  CHECK(f32[1]["kernel"] == "portable");

  // One --hw: a single object, not a list (documented in `ioattn plan --help`).
  const json one = parse_json(run_cli({"plan", "--json", "--hw", "zen3", "--heads", "16", "--head-dim", "128"}));
  CHECK(one.is_object());
  CHECK(one["block_q"] == cpu["block_q"]);

  // Human-readable output names the same figures.
  const Result text = run_cli(with({"plan"}, kReference));
  CHECK(text.code == 0);
  CHECK(text.out.find("zen3") != std::string::npos);
  CHECK(text.out.find("block_q " + std::to_string(cpu["block_q"].get<int>())) != std::string::npos);
}

TEST_CASE("cli: traffic --json is a list; flash moves fewer off-chip bytes than standard", "[cli]") {
  const json j = parse_json(run_cli(with({"traffic", "--json"}, kReference)));
  REQUIRE(j.is_array());
  REQUIRE(j.size() == 2);
  CHECK(j[0]["hardware"] == "zen3");
  CHECK(j[1]["hardware"] == "h200-sxm");
  for (const json& t : j) {
    INFO(t.dump());
    const double flash = t["flash_dram_bytes"], standard = t["standard_dram_bytes"];
    // Q, K, V and O at least once each in fp32: 4 * 16 * 4096 * 128 * 4 bytes.
    CHECK(flash >= 4.0 * 16 * 4096 * 128 * 4 * 0.99);
    // Standard attention writes and reads the 16 x 4096 x 4096 fp32 scores S and P at least
    // once each: 4 * 16 * 4096^2 * 4 bytes, several times what flash moves.
    CHECK(standard >= 4.0 * 16 * 4096.0 * 4096 * 4 * 0.99);
    CHECK(standard > 2 * flash);
    REQUIRE(t["levels"].is_array());
    REQUIRE(t["levels"].size() >= 2);
    for (const json& l : t["levels"]) {
      CHECK(l.contains("name"));
      CHECK(l["flash_bytes"].get<double>() > 0);
      CHECK(l["standard_bytes"].get<double>() > 0);
    }
    CHECK(t["levels"].back()["flash_bytes"].get<double>() == flash);
    CHECK(t["flops"].get<double>() == Approx(4.0 * 16 * 4096.0 * 4096 * 128).epsilon(0.01));
  }
  const json one = parse_json(run_cli({"traffic", "--json", "--hw", "zen3"}));
  CHECK(one.is_array());
  CHECK(one.size() == 1);
}

TEST_CASE("cli: explain --json has exactly the five keys, each with this problem's numbers", "[cli]") {
  const json j = parse_json(run_cli(with({"explain", "--json"}, kReference)));
  REQUIRE(j.is_array());
  REQUIRE(j.size() == 2);
  const json plans = parse_json(run_cli(with({"plan", "--json"}, kReference)));
  for (size_t i = 0; i < 2; ++i) {
    const json& o = j[i];
    INFO(o.dump(2));
    REQUIRE(o.is_object());
    CHECK(o.size() == 5);
    for (const char* key : {"memoryTraffic", "tiling", "numericalStability", "tradeoff", "failureMode"}) {
      REQUIRE(o.contains(key));
      const std::string s = o[key];
      CHECK(s.size() > 40);
      CHECK(s.find_first_of("0123456789") != std::string::npos);
    }
    // The tiling paragraph carries the plan's own block sizes.
    const std::string tiling = o["tiling"];
    CHECK(tiling.find(std::to_string(plans[i]["block_q"].get<int>())) != std::string::npos);
    CHECK(tiling.find(std::to_string(plans[i]["block_kv"].get<int>())) != std::string::npos);
  }
  CHECK(parse_json(run_cli({"explain", "--json", "--hw", "h200-sxm"})).is_object());
}

TEST_CASE("cli: plan and traffic --ranks model the ring; explain refuses it", "[cli]") {
  const std::vector<std::string> shape = {"plan", "--hw",       "h100-sxm", "--heads", "16",  "--head-dim",
                                          "128",  "--seqlen-q", "131072",   "--dtype", "bf16"};
  const Result r = run_cli(with(shape, {"--ranks", "8", "--json"}));
  REQUIRE(r.code == 0);
  const json j = json::parse(r.out);
  REQUIRE(j.contains("ring"));
  CHECK(j["ring"]["ranks"] == 8);
  CHECK(j["ring"]["shard_seqlen"] == 16384);
  CHECK(j["ring"]["link"]["name"] == "NVLink4");
  CHECK(j["ring"]["link_bytes_per_step"].get<double>() == 16.0 * 16384 * 256 * 2);
  CHECK(j["ring"]["hides"] == true);
  CHECK(j["block_q"] == json::parse(run_cli(with(shape, {"--json"})).out)["block_q"]);
  const Result t = run_cli(with(shape, {"--ranks", "8", "--link", "PCIe5", "--seqlen-k", "131072", "--json"}));
  REQUIRE(t.code == 0);
  CHECK(json::parse(t.out)["ring"]["link"]["bandwidth_gbs"] == 64.0);
  const Result slow = run_cli(with(shape, {"--ranks", "8", "--link-gbs", "0.01"}));
  REQUIRE(slow.code == 0);
  CHECK(slow.out.find("does not hide") != std::string::npos);
  const Result traffic = run_cli({"traffic", "--hw", "zen3", "--seqlen-q", "8192", "--ranks", "4", "--json"});
  REQUIRE(traffic.code == 0);
  CHECK(json::parse(traffic.out)[0]["ring"]["rank_dram_bytes"].get<double>() > 0);
  expect_usage_error(with(shape, {"--ranks", "3"}), {"--ranks 3", "131072"});
  expect_usage_error(with(shape, {"--link", "PCIe5"}), {"--ranks"});
  expect_usage_error(with(shape, {"--ranks", "2", "--link", "10GbE"}), {"10GbE", "NVLink4, PCIe5"});
  expect_usage_error({"explain", "--ranks", "2"}, {"--ranks"});
}

TEST_CASE("cli: tune --quick writes a calibration that plan --tune-file applies", "[cli]") {
  const char* base = std::getenv("TMPDIR");
  const std::string path =
      std::string(base ? base : "/tmp") + "/ioattn_test_cli_tune_" + std::to_string(::getpid()) + ".json";
  const Result r = run_cli({"tune", "--quick", "--tune-file", path, "--threads", "2"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find(path) != std::string::npos);
  CHECK(r.out.find("prefill") != std::string::npos);
  CHECK(r.err.find("[1/") != std::string::npos);  // progress, one line per timed call off a terminal
  const Result p = run_cli({"plan", "--tune-file", path, "--json"});
  REQUIRE(p.code == 0);
  const json j = json::parse(p.out);
  CHECK(j["calibrated"] == true);
  CHECK(j["calibration"].get<std::string>().find(path) != std::string::npos);
  const Result e = run_cli({"explain", "--tune-file", path, "--json"});
  REQUIRE(e.code == 0);
  CHECK(json::parse(e.out)["tiling"].get<std::string>().find("calibrated") != std::string::npos);
  // Built-in profiles are never calibrated; a missing file leaves the host's plan cache-derived.
  CHECK(json::parse(run_cli({"plan", "--hw", "zen3", "--tune-file", path, "--json"}).out)["calibrated"] == false);
  CHECK(json::parse(run_cli({"plan", "--tune-file", path + ".none", "--json"}).out)["calibrated"] == false);
  std::remove(path.c_str());
  expect_usage_error({"tune", "--threads", "0"}, {"--threads"});
  expect_usage_error({"tune", "--tune-file", "/proc/ioattn-nowhere/x.json", "--quick"}, {"/proc/ioattn-nowhere"});
}

TEST_CASE("cli: hw lists the built-in profiles and the host", "[cli]") {
  const json j = parse_json(run_cli({"hw", "--json"}));
  REQUIRE(j.contains("host"));
  REQUIRE(j.contains("profiles"));
  std::vector<std::string> names;
  for (const json& p : j["profiles"]) names.push_back(p["name"]);
  for (const char* want : {"zen3", "h200-sxm", "a100-80gb", "h100-sxm"}) {
    CHECK(std::find(names.begin(), names.end(), want) != names.end());
  }
  const Result text = run_cli({"hw"});
  CHECK(text.code == 0);
  CHECK(text.out.find("zen3") != std::string::npos);
  // A profile written by `hw --json` loads back through --hw-file.
  TempDir dir;
  write_raw(dir / "zen3.json", j["profiles"][std::find(names.begin(), names.end(), "zen3") - names.begin()].dump());
  const json a = parse_json(run_cli({"plan", "--json", "--hw-file", dir / "zen3.json"}));
  const json b = parse_json(run_cli({"plan", "--json", "--hw", "zen3"}));
  CHECK(a["block_q"] == b["block_q"]);
  CHECK(a["block_kv"] == b["block_kv"]);
}

TEST_CASE("cli: run f32 round trip with GQA, Dv != D, causal, lse and --check", "[cli]") {
  TempDir dir;
  const Shape qs{2, 37, 4, 16}, ks{2, 45, 2, 16};
  const int64_t dv = 24;
  const auto q = random_values(size_t(qs.b * qs.s * qs.h * qs.d), 11);
  const auto k = random_values(size_t(ks.b * ks.s * ks.h * ks.d), 12);
  const auto v = random_values(size_t(ks.b * ks.s * ks.h * dv), 13);
  write_f32(dir / "q.npy", qs, q);
  write_f32(dir / "k.npy", ks, k);
  write_f32(dir / "v.npy", {ks.b, ks.s, ks.h, dv}, v);
  const Result r = run_cli({"run", "--q", dir / "q.npy", "--k", dir / "k.npy", "--v", dir / "v.npy", "--out",
                            dir / "o.npy", "--lse", dir / "l.npy", "--causal", "--check", "--threads", "2"});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("max abs error") != std::string::npos);

  NpyArray out, lse;
  std::string error;
  REQUIRE(read_npy(dir / "o.npy", &out, &error));
  REQUIRE(read_npy(dir / "l.npy", &lse, &error));
  CHECK(out.dtype == NpyDType::f32);
  CHECK(out.shape == std::vector<int64_t>{2, 37, 4, 24});
  CHECK(lse.dtype == NpyDType::f32);
  CHECK(lse.shape == std::vector<int64_t>{2, 4, 37});
  const Reference ref = reference(qs, ks, dv, DType::f32, q.data(), k.data(), v.data(), 0, 0, true, -1, -1);
  const float* o = reinterpret_cast<const float*>(out.data.data());
  const float* l = reinterpret_cast<const float*>(lse.data.data());
  double max_err = 0, max_lse_err = 0;
  for (size_t i = 0; i < ref.out.size(); ++i) max_err = std::max(max_err, std::fabs(o[i] - ref.out[i]));
  for (size_t i = 0; i < ref.lse.size(); ++i) max_lse_err = std::max(max_lse_err, std::fabs(l[i] - ref.lse[i]));
  // fp32 over 45 keys of magnitude <= 1: a few ulps.
  CHECK(max_err < 1e-5);
  CHECK(max_lse_err < 1e-5);

  // The --check line reports an error of the same size as measured here.
  const size_t at = r.out.find("out max abs error ");
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(r.out.substr(at + 18)) < 1e-5);
  // Nothing but the inputs and outputs in the directory: no temporaries left behind.
  CHECK(dir.files() == std::vector<std::string>{"k.npy", "l.npy", "o.npy", "q.npy", "v.npy"});
}

TEST_CASE("cli: run f16 with window, softcap and scale", "[cli]") {
  TempDir dir;
  const Shape qs{1, 33, 2, 32}, ks{1, 20, 1, 32};
  auto q = random_values(size_t(qs.b * qs.s * qs.h * qs.d), 21);
  auto k = random_values(size_t(ks.b * ks.s * ks.h * ks.d), 22);
  auto v = random_values(size_t(ks.b * ks.s * ks.h * ks.d), 23);
  write_f16(dir / "q.npy", qs, q);
  write_f16(dir / "k.npy", ks, k);
  write_f16(dir / "v.npy", ks, v);
  const Result r = run_cli({"run", "--q", dir / "q.npy", "--k", dir / "k.npy", "--v", dir / "v.npy", "--out",
                            dir / "o.npy", "--window", "4,2", "--softcap", "2.5", "--scale", "0.5"});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  NpyArray out;
  std::string error;
  REQUIRE(read_npy(dir / "o.npy", &out, &error));
  CHECK(out.dtype == NpyDType::f16);
  CHECK(out.shape == std::vector<int64_t>{1, 33, 2, 32});
  std::vector<uint16_t> qh(q.size()), kh(k.size()), vh(v.size());
  for (size_t i = 0; i < q.size(); ++i) qh[i] = f32_to_f16(q[i]);
  for (size_t i = 0; i < k.size(); ++i) kh[i] = f32_to_f16(k[i]);
  for (size_t i = 0; i < v.size(); ++i) vh[i] = f32_to_f16(v[i]);
  const Reference ref = reference(qs, ks, ks.d, DType::f16, qh.data(), kh.data(), vh.data(), 0.5f, 2.5f, false, 4, 2);
  const uint16_t* o = reinterpret_cast<const uint16_t*>(out.data.data());
  double max_err = 0;
  int zero_rows_ok = 0;
  for (size_t i = 0; i < ref.out.size(); ++i) {
    max_err = std::max(max_err, std::fabs(double(f16_to_f32(o[i])) - ref.out[i]));
    if (ref.out[i] == 0.0 && f16_to_f32(o[i]) == 0.f) ++zero_rows_ok;
  }
  // |out| <= 1: f16 output rounding is <= 2^-11, accumulation error is far below that.
  CHECK(max_err <= 2.0 * 0x1p-11);
  // Sq > Sk with a window: the top rows see no key and must be exactly 0.
  CHECK(zero_rows_ok > 0);
}

TEST_CASE("cli: run rejects bad inputs with exit 2, naming the file, creating no output", "[cli]") {
  TempDir dir;
  const Inputs in = write_valid_inputs(dir);
  const std::string out = dir / "o.npy";
  auto run_with = [&](const std::string& q, const std::string& k, const std::string& v) {
    return std::vector<std::string>{"run", "--q", q, "--k", k, "--v", v, "--out", out, "--lse", dir / "l.npy"};
  };
  const std::string good = slurp(in.q);

  write_raw(dir / "corrupt.npy", "this is not a numpy file at all");
  write_raw(dir / "short.npy", good.substr(0, good.size() - 3));
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  write_raw(dir / "fortran.npy", fortran);
  std::string f8 = good;
  f8.replace(f8.find("<f4"), 3, "<f8");
  write_raw(dir / "f8.npy", f8);
  std::string error;
  std::vector<float> small(2 * 5 * 4);
  REQUIRE(write_npy(dir / "3d.npy", NpyDType::f32, {2, 5, 4}, small.data(), &error));
  write_f32(dir / "k_d4.npy", {2, 7, 2, 4}, random_values(2 * 7 * 2 * 4, 5));
  write_f32(dir / "k_h3.npy", {2, 7, 3, 8}, random_values(2 * 7 * 3 * 8, 6));
  write_f32(dir / "v_h3.npy", {2, 7, 3, 8}, random_values(2 * 7 * 3 * 8, 10));
  REQUIRE(write_npy(dir / "h0.npy", NpyDType::f32, {2, 5, 0, 8}, small.data(), &error));
  write_f32(dir / "k_b1.npy", {1, 7, 2, 8}, random_values(1 * 7 * 2 * 8, 7));
  write_f32(dir / "v_s6.npy", {2, 6, 2, 8}, random_values(2 * 6 * 2 * 8, 8));
  write_f16(dir / "k_f16.npy", {2, 7, 2, 8}, random_values(2 * 7 * 2 * 8, 9));

  expect_usage_error(run_with(dir / "missing.npy", in.k, in.v), {"--q", "missing.npy", "No such file"});
  expect_usage_error(run_with(in.q, dir / "corrupt.npy", in.v), {"--k", "corrupt.npy", "not a .npy file"});
  expect_usage_error(run_with(in.q, in.k, dir / "short.npy"), {"--v", "short.npy", "truncated data"});
  expect_usage_error(run_with(dir / "fortran.npy", in.k, in.v), {"--q", "fortran.npy", "fortran_order"});
  expect_usage_error(run_with(dir / "f8.npy", in.k, in.v), {"--q", "f8.npy", "'<f8'"});
  expect_usage_error(run_with(dir / "3d.npy", in.k, in.v), {"--q", "3d.npy", "4 dimensions", "(2, 5, 4)"});
  expect_usage_error(run_with(dir / "h0.npy", in.k, in.v), {"--q", "h0.npy", "0 heads"});
  expect_usage_error(run_with(in.q, dir / "k_d4.npy", in.v), {"--k", "k_d4.npy", "head dim 4", "8"});
  expect_usage_error(run_with(in.q, dir / "k_h3.npy", dir / "v_h3.npy"),
                     {"--k", "k_h3.npy", "3 kv heads do not divide --q's 4"});
  expect_usage_error(run_with(in.q, dir / "k_h3.npy", in.v), {"--v", "v.npy", "heads 2 differs from --k's 3"});
  expect_usage_error(run_with(in.q, dir / "k_b1.npy", in.v), {"--k", "k_b1.npy", "batch 1"});
  expect_usage_error(run_with(in.q, in.k, dir / "v_s6.npy"), {"--v", "v_s6.npy", "seqlen 6"});
  expect_usage_error(run_with(in.q, dir / "k_f16.npy", in.v), {"--k", "k_f16.npy", "float16"});
  CHECK_FALSE(exists(out));
  CHECK_FALSE(exists(dir / "l.npy"));

  // Flag problems.
  expect_usage_error({"run", "--q", in.q, "--k", in.k, "--v", in.v}, {"missing required flag --out"});
  expect_usage_error(with(run_with(in.q, in.k, in.v), {"--threads", "-1"}), {"--threads"});
  expect_usage_error(with(run_with(in.q, in.k, in.v), {"--backend", "tpu"}), {"--backend", "'tpu'"});
  expect_usage_error(with(run_with(in.q, in.k, in.v), {"--softcap", "-1"}), {"--softcap"});
  expect_usage_error(with(run_with(in.q, in.k, in.v), {"--scale", "nan"}), {"--scale"});
  expect_usage_error({"run", "--q", in.q, "--k", in.k, "--v", in.v, "--out", dir / "no/such/dir/o.npy"},
                     {"--out", "no/such/dir"});
  CHECK_FALSE(exists(out));

  // An existing output is neither truncated nor replaced when the run fails.
  write_raw(out, "keep me");
  expect_usage_error(run_with(in.q, dir / "corrupt.npy", in.v), {"--k"});
  CHECK(slurp(out) == "keep me");

  // The CUDA backend where it is unavailable: exit 3, output untouched.
  if (!ioattn_backend_available(IOATTN_BACKEND_CUDA)) {
    const Result r = run_cli(with(run_with(in.q, in.k, in.v), {"--backend", "cuda"}));
    CHECK(r.code == 3);
    CHECK(r.err.find("cuda") != std::string::npos);
    CHECK(slurp(out) == "keep me");
  }
  std::remove(out.c_str());
  // Only the fixtures remain: every failure cleaned up its temporaries.
  for (const std::string& f : dir.files()) CHECK(f.find(".ioattn-") == std::string::npos);
}

TEST_CASE("cli: bench measures flash and standard at one shape", "[cli][bench]") {
  const Result help = run_cli({"bench", "--help"});
  INFO(help.err);
  CHECK(help.code == 0);
  CHECK(help.out.find("usage: ioattn bench") != std::string::npos);
  CHECK(help.err.empty());
  const json j = parse_json(run_cli({"bench", "--heads", "2", "--kv-heads", "1", "--seqlen-q", "96", "--seqlen-k", "80",
                                     "--head-dim", "32", "--causal", "--repeats", "1", "--hw", "host", "--json"}));
  INFO(j.dump(2));
  for (const char* side : {"flash", "standard"}) {
    CHECK(j[side]["seconds"].get<double>() > 0);
    CHECK(j[side]["gflops"].get<double>() > 0);
    CHECK(j[side]["percent_of_peak"].get<double>() > 0);
    CHECK(j[side]["scratch_bytes"].get<double>() > 0);
  }
  // Standard attention materializes one head's 96 x 80 fp32 scores at least.
  CHECK(j["standard"]["scratch_bytes"].get<double>() >= 96.0 * 80 * 4);
  CHECK(j["peak_gflops"].get<double>() > 0);
  // Both compute the same attention in fp32.
  CHECK(j["max_abs_difference"].get<double>() < 1e-5);
  CHECK(j["problem"]["kv_heads"] == 1);
  // bench measures this machine: --hw (a shared problem flag in docs/api.md) names only host.
  expect_usage_error({"bench", "--hw", "zen3"}, {"--hw", "'zen3'", "'host'"});
  expect_usage_error({"bench", "--hw", "host", "--hw", "h200-sxm"}, {"'h200-sxm'"});
}

#if !IOATTN_TEST_HAVE_BENCH
// A build without benchmarks (IOATTN_BUILD_BENCH=OFF) keeps the command, which says so: exit 3.
TEST_CASE("cli: bench in a build without benchmarks is unsupported, exit 3", "[cli]") {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"bench"}, {"bench", "--help"}}) {
    const Result r = run_cli(args);
    INFO(r.err);
    CHECK(r.code == 3);
    CHECK(r.out.empty());
    CHECK(r.err == "ioattn bench: this build has no benchmarks (configure with -DIOATTN_BUILD_BENCH=ON)\n");
  }
}
#endif

TEST_CASE("cli: demo plans, runs and checks the embedded workload", "[cli]") {
  const Result r = run_cli({"demo", "--threads", "2"});
  INFO(r.out << r.err);
  CHECK(r.code == 0);
  for (const char* part :
       {"== plan", "== design outline", "== predicted traffic", "GFLOP/s", "max abs error", "demo: PASS"}) {
    CHECK(r.out.find(part) != std::string::npos);
  }
}
