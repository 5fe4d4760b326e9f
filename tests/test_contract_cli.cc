// An outsider's acceptance sweep of docs/api.md's "CLI: ioattn" section and the C ABI's small
// functions, driving the built binary (IOATTN_CLI) as a user would. It covers what test_cli.cc and
// test_contract_sweep.cc leave out: -h on every subcommand, usage errors on the subcommands
// without problem flags (demo, hw, run, bench), a bad value reported ahead of a missing required
// flag, plan/traffic/explain over several --hw and --hw-file in command-line order and over every
// listed profile, explain's text changing with the problem, big-endian and 5-d .npy inputs, npy
// format versions 2 and 3, --backend cuda creating no file, and last_error under two threads that
// both fail.
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ioattn/ioattn.h"
#include "tests/catch.h"
#include "tests/contract_cli.h"

namespace {

using json = nlohmann::json;

using ioattn::contract::CliResult;
using ioattn::contract::f16_bits;
using ioattn::contract::file_exists;
using ioattn::contract::Npy;
using ioattn::contract::read_file;
using ioattn::contract::read_npy;
using ioattn::contract::Scratch;

void spit(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// Output captured outside the scratch directories the tests list.
CliResult cli(const std::vector<std::string>& args) {
  static Scratch capture;
  return ioattn::contract::run_cli(capture, args);
}

bool one_line(const std::string& s) { return !s.empty() && s.find('\n') == s.size() - 1; }

// Exit 2, nothing on stdout, exactly one line on stderr containing every needle.
void expect_usage(const std::vector<std::string>& args, const std::vector<std::string>& needles) {
  const CliResult r = cli(args);
  std::string shown;
  for (const std::string& a : args) shown += a + " ";
  INFO("ioattn " << shown << "-> exit " << r.code << ", stderr: " << r.err << "stdout: " << r.out);
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK(one_line(r.err));
  for (const std::string& n : needles) CHECK(r.err.find(n) != std::string::npos);
}

json ok_json(const std::vector<std::string>& args) {
  const CliResult r = cli(args);
  INFO(r.err);
  REQUIRE(r.code == 0);
  REQUIRE(r.err.empty());
  return json::parse(r.out);
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// NumPy .npy: magic, version, header length (2 bytes in v1, 4 in v2/v3), a dict padded with
// spaces to a multiple of 64 bytes, then the data.
void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const std::string& data, int version = 1, const char* fortran = "False") {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
  }
  dict += "), }";
  const size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string file = "\x93NUMPY";
  file += char(version);
  file += char(0);
  for (size_t i = 0; i < prefix - 8; ++i) file += char((dict.size() >> (8 * i)) & 0xff);
  spit(path, file + dict + data);
}

std::string f32_bytes(const std::vector<float>& x) {
  return std::string(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
}

std::vector<float> randoms(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(n);
  for (float& e : x) e = u(rng);
  return x;
}

// A (2, 5, 4, 8) query against (2, 7, 2, 8) keys and values: GQA with two query heads per KV head.
struct Inputs {
  std::string q, k, v;
};
Inputs write_inputs(const Scratch& dir) {
  Inputs in{dir / "q.npy", dir / "k.npy", dir / "v.npy"};
  write_npy(in.q, "<f4", {2, 5, 4, 8}, f32_bytes(randoms(2 * 5 * 4 * 8, 1)));
  write_npy(in.k, "<f4", {2, 7, 2, 8}, f32_bytes(randoms(2 * 7 * 2 * 8, 2)));
  write_npy(in.v, "<f4", {2, 7, 2, 8}, f32_bytes(randoms(2 * 7 * 2 * 8, 3)));
  return in;
}

std::vector<std::string> profile_names() {
  const json hw = ok_json({"hw", "--json"});
  std::vector<std::string> names;
  for (const json& p : hw["profiles"]) names.push_back(p["name"]);
  return names;
}

// The problem of these tests: long enough that flash attention's off-chip traffic is far below
// standard attention's on every profile.
const std::vector<std::string> kLong = {"--heads", "8", "--kv-heads", "2", "--seqlen-q", "8192", "--head-dim", "64"};

}  // namespace

TEST_CASE("clisweep: every subcommand answers --help and -h on stdout with exit 0", "[clisweep]") {
  // bench: "clisweep: bench answers ..." ([bench]; a build without benchmarks skips it).
  for (const char* cmd : {"demo", "run", "plan", "traffic", "explain", "hw"}) {
    for (const char* h : {"--help", "-h"}) {
      const CliResult r = cli({cmd, h});
      INFO(cmd << " " << h << ": " << r.err);
      CHECK(r.code == 0);
      CHECK(r.err.empty());
      CHECK(r.out.find(std::string("usage: ioattn ") + cmd) != std::string::npos);
      CHECK(r.out.find("exit codes") != std::string::npos);
    }
  }
  // The problem flags docs/api.md lists appear in the help of each command that takes them.
  for (const char* cmd : {"plan", "traffic", "explain"}) {
    const std::string help = cli({cmd, "--help"}).out;
    for (const char* flag : {"--batch", "--heads", "--kv-heads", "--seqlen-q", "--seqlen-k", "--head-dim", "--dtype",
                             "--causal", "--window", "--hw", "--hw-file", "--json"}) {
      INFO(cmd << " lacks " << flag);
      CHECK(help.find(flag) != std::string::npos);
    }
  }
  const std::string run_help = cli({"run", "--help"}).out;
  for (const char* flag : {"--q", "--k", "--v", "--out", "--lse", "--causal", "--window", "--softcap", "--scale",
                           "--backend", "--threads", "--check"}) {
    INFO("run lacks " << flag);
    CHECK(run_help.find(flag) != std::string::npos);
  }
}

TEST_CASE("clisweep: usage errors on every subcommand: exit 2, one line naming flag and value", "[clisweep]") {
  expect_usage({"--bogus"}, {"'--bogus'"});
  expect_usage({"Plan"}, {"unknown command", "'Plan'"});
  for (const char* cmd : {"demo", "hw", "run", "plan", "traffic", "explain"}) {
    const std::string c = cmd;
    expect_usage({c, "--no-such-flag", "3"}, {"ioattn " + c, "unknown flag", "'--no-such-flag'"});
    expect_usage({c, "-x"}, {"ioattn " + c, "'-x'"});
  }
  expect_usage({"demo", "--threads"}, {"--threads", "missing value"});
  expect_usage({"demo", "--threads", "two"}, {"--threads", "'two'"});
  expect_usage({"demo", "--threads", "-3"}, {"--threads", "-3"});
  expect_usage({"hw", "--json=yes"}, {"--json", "takes no value"});
  expect_usage({"hw", "extra"}, {"'extra'"});
  for (const char* cmd : {"plan", "traffic", "explain"}) {
    const std::string c = cmd;
    expect_usage({c, "--batch", "0x10"}, {"--batch", "'0x10'"});
    expect_usage({c, "--head-dim", ""}, {"--head-dim", "''"});
    expect_usage({c, "--window", "3,x"}, {"--window", "'x'"});
    expect_usage({c, "--hw"}, {"--hw", "missing value"});
    expect_usage({c, "--hw-file"}, {"--hw-file", "missing value"});
    expect_usage({c, "--json", "--json"}, {"--json", "more than once"});
  }
}

// bench is built with the benchmarks (IOATTN_BUILD_BENCH): its share of the two sweeps above.
TEST_CASE("clisweep: bench answers --help and -h, and its usage errors exit 2", "[clisweep][bench]") {
  for (const char* h : {"--help", "-h"}) {
    const CliResult r = cli({"bench", h});
    INFO("bench " << h << ": " << r.err);
    CHECK(r.code == 0);
    CHECK(r.err.empty());
    CHECK(r.out.find("usage: ioattn bench") != std::string::npos);
    CHECK(r.out.find("exit codes") != std::string::npos);
  }
  expect_usage({"bench", "--no-such-flag", "3"}, {"ioattn bench", "unknown flag", "'--no-such-flag'"});
  expect_usage({"bench", "-x"}, {"ioattn bench", "'-x'"});
  expect_usage({"bench", "--repeats", "many"}, {"--repeats", "'many'"});
  expect_usage({"bench", "--heads", "1.5"}, {"--heads", "'1.5'"});
}

TEST_CASE("clisweep: run's bad flag values exit 2 naming them and create or touch no file", "[clisweep]") {
  Scratch dir;
  const Inputs in = write_inputs(dir);
  const std::string out = dir / "o.npy", lse = dir / "l.npy";
  const std::vector<std::string> base = {"run", "--q", in.q, "--k", in.k, "--v", in.v, "--out", out, "--lse", lse};
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> bad = {
      {{"--threads", "abc"}, {"--threads", "'abc'"}},
      {{"--threads", "99999"}, {"--threads", "99999"}},
      {{"--threads"}, {"--threads", "missing value"}},
      {{"--scale", "fast"}, {"--scale", "'fast'"}},
      {{"--scale", "1e400"}, {"--scale", "1e400"}},
      {{"--softcap", "inf"}, {"--softcap", "'inf'"}},
      {{"--softcap", "-0.5"}, {"--softcap", "-0.5"}},
      {{"--window", "2"}, {"--window", "L,R"}},
      {{"--window", "a,2"}, {"--window", "'a'"}},
      {{"--backend", "CPU"}, {"--backend", "'CPU'"}},
      {{"--causal", "--causal"}, {"--causal", "more than once"}},
      {{"--check=1"}, {"--check", "takes no value"}},
  };
  for (const auto& [flags, needles] : bad) expect_usage(with(base, flags), needles);
  CHECK_FALSE(file_exists(out));
  CHECK_FALSE(file_exists(lse));
  // A bad value is reported as itself even when required flags are also missing: the user
  // learns about the flag they did type.
  expect_usage({"run", "--threads", "abc"}, {"--threads", "'abc'"});
  expect_usage({"run", "--out", out, "--backend", "tpu"}, {"--backend", "'tpu'"});
  expect_usage({"run", "--q", in.q, "--k", in.k, "--v", in.v}, {"--out"});
  CHECK_FALSE(file_exists(out));
  // An existing output survives every usage error byte for byte.
  spit(out, "previous output");
  spit(lse, "previous lse");
  for (const auto& [flags, needles] : bad) expect_usage(with(base, flags), needles);
  CHECK(read_file(out) == "previous output");
  CHECK(read_file(lse) == "previous lse");
}

TEST_CASE("clisweep: plan --json: the documented keys with sane types; one --hw an object", "[clisweep]") {
  for (const std::string& hw : {std::string("host"), std::string("zen3"), std::string("a100-80gb")}) {
    const json p = ok_json(with({"plan", "--json", "--hw", hw}, kLong));
    INFO(p.dump(2));
    REQUIRE(p.is_object());
    CHECK(p["hardware"] == hw);
    CHECK((p["backend"] == "cpu" || p["backend"] == "cuda"));
    for (const char* key : {"block_q", "block_kv", "kv_splits", "workers", "working_set_bytes", "target_level_bytes"}) {
      REQUIRE(p.contains(key));
      CHECK(p[key].is_number_integer());
      CHECK(p[key].get<int64_t>() >= 1);
    }
    REQUIRE(p.contains("target_level"));
    CHECK(p["target_level"].is_string());
    CHECK(p["working_set_bytes"].get<int64_t>() <= p["target_level_bytes"].get<int64_t>());
  }
  // No --hw is the host, as a single object.
  const json none = ok_json(with({"plan", "--json"}, kLong));
  REQUIRE(none.is_object());
  CHECK(none["hardware"] == "host");
  CHECK(none == ok_json(with({"plan", "--json", "--hw", "host"}, kLong)));
}

TEST_CASE("clisweep: plan, traffic and explain list several --hw and --hw-file in command-line order", "[clisweep]") {
  Scratch dir;
  // A custom profile: zen3 with its L2 shrunk to 64 KiB, under another name.
  json custom;
  const json hw_list = ok_json({"hw", "--json"});
  for (const json& p : hw_list["profiles"]) {
    if (p["name"] == "zen3") custom = p;
  }
  REQUIRE(custom.is_object());
  custom["name"] = "tiny-l2";
  bool shrunk = false;
  for (json& l : custom["levels"]) {
    if (l["name"] == "L2") {
      l["size_bytes"] = 64 * 1024;
      shrunk = true;
    }
  }
  REQUIRE(shrunk);
  spit(dir / "tiny.json", custom.dump());

  const std::vector<std::string> hw = {"--hw", "h200-sxm", "--hw-file", dir / "tiny.json",
                                       "--hw", "zen3",     "--hw",      "host"};
  const std::vector<std::string> want = {"h200-sxm", "tiny-l2", "zen3", "host"};
  const json plans = ok_json(with(with({"plan", "--json"}, kLong), hw));
  const json traffic = ok_json(with(with({"traffic", "--json"}, kLong), hw));
  const json explain = ok_json(with(with({"explain", "--json"}, kLong), hw));
  REQUIRE(plans.is_array());
  REQUIRE(traffic.is_array());
  REQUIRE(explain.is_array());
  REQUIRE(plans.size() == want.size());
  REQUIRE(traffic.size() == want.size());
  REQUIRE(explain.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(plans[i]["hardware"] == want[i]);
    CHECK(traffic[i]["hardware"] == want[i]);
    // explain's objects carry no hardware key; the tiling names the plan's blocks of that profile.
    const std::string tiling = explain[i]["tiling"];
    INFO(want[i] << ": " << tiling);
    CHECK(tiling.find(std::to_string(plans[i]["block_q"].get<int>())) != std::string::npos);
    CHECK(tiling.find(std::to_string(plans[i]["block_kv"].get<int>())) != std::string::npos);
  }
  // The custom profile is planned against its own cache, not zen3's.
  const json& tiny = plans[1];
  const json& zen3 = plans[2];
  if (tiny["target_level"] == "L2") CHECK(tiny["target_level_bytes"] == 64 * 1024);
  CHECK(tiny["working_set_bytes"].get<int64_t>() <= 64 * 1024);
  CHECK(tiny["working_set_bytes"].get<int64_t>() < zen3["working_set_bytes"].get<int64_t>());
}

TEST_CASE("clisweep: a bad --hw name lists every valid name", "[clisweep]") {
  const std::vector<std::string> names = profile_names();
  REQUIRE(names.size() >= 4);
  for (const char* cmd : {"plan", "traffic", "explain"}) {
    const CliResult r = cli({cmd, "--hw", "zen3", "--hw", "Zen3"});
    INFO(r.err);
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(one_line(r.err));
    CHECK(r.err.find("'Zen3'") != std::string::npos);
    CHECK(r.err.find("host") != std::string::npos);
    for (const std::string& n : names) CHECK(r.err.find(n) != std::string::npos);
  }
}

TEST_CASE("clisweep: every profile `hw` lists is accepted by plan, traffic and explain", "[clisweep]") {
  const std::vector<std::string> names = profile_names();
  for (const std::string& n : names) {
    INFO(n);
    const json p = ok_json(with({"plan", "--json", "--hw", n}, kLong));
    CHECK(p["hardware"] == n);
    const json t = ok_json(with({"traffic", "--json", "--hw", n}, kLong));
    REQUIRE(t.is_array());
    REQUIRE(t.size() == 1);
    const json& e = t[0];
    CHECK(e["hardware"] == n);
    // 8 query heads over 8192 keys: standard attention writes and reads an 8 x 8192^2 fp32 score
    // matrix (2 GiB) that flash attention never materializes.
    const double flash = e["flash_dram_bytes"], standard = e["standard_dram_bytes"];
    CHECK(flash > 0);
    CHECK(flash < standard);
    REQUIRE(e["levels"].is_array());
    REQUIRE_FALSE(e["levels"].empty());
    std::set<std::string> level_names;
    for (const json& l : e["levels"]) {
      REQUIRE(l["name"].is_string());
      level_names.insert(l["name"].get<std::string>());
      CHECK(l["flash_bytes"].is_number());
      CHECK(l["standard_bytes"].is_number());
    }
    CHECK(level_names.size() == e["levels"].size());
    const json x = ok_json(with({"explain", "--json", "--hw", n}, kLong));
    CHECK(x.is_object());
    CHECK(x.size() == 5);
  }
}

TEST_CASE("clisweep: flash moves fewer off-chip bytes than standard at every long length", "[clisweep]") {
  // Past the last cache both grow as S^2 (flash re-reads K/V once per query block), so only the
  // inequality is a contract, not a ratio that keeps growing.
  for (const char* s : {"2048", "8192", "32768"}) {
    const json t = ok_json(
        {"traffic", "--json", "--hw", "zen3", "--hw", "h200-sxm", "--heads", "4", "--seqlen-q", s, "--head-dim", "64"});
    REQUIRE(t.size() == 2);
    for (const json& e : t) {
      INFO("seqlen " << s << " on " << e["hardware"] << ": flash " << e["flash_dram_bytes"] << ", standard "
                     << e["standard_dram_bytes"]);
      CHECK(e["flash_dram_bytes"].get<double>() < e["standard_dram_bytes"].get<double>());
    }
  }
}

TEST_CASE("clisweep: explain's five paragraphs follow the problem and the hardware", "[clisweep]") {
  const char* keys[] = {"memoryTraffic", "tiling", "numericalStability", "tradeoff", "failureMode"};
  const std::vector<std::vector<std::string>> problems = {
      {"--heads", "8", "--seqlen-q", "1024", "--head-dim", "64"},
      {"--heads", "8", "--seqlen-q", "16384", "--head-dim", "128", "--causal"},
      {"--heads", "8", "--seqlen-q", "1024", "--head-dim", "64", "--dtype", "bf16"},
  };
  for (const char* hw : {"zen3", "h100-sxm"}) {
    std::vector<json> outlines;
    for (const auto& pr : problems) {
      const json x = ok_json(with({"explain", "--json", "--hw", hw}, pr));
      REQUIRE(x.is_object());
      std::set<std::string> got;
      for (auto it = x.begin(); it != x.end(); ++it) got.insert(it.key());
      CHECK(got == std::set<std::string>(std::begin(keys), std::end(keys)));
      const json plan = ok_json(with({"plan", "--json", "--hw", hw}, pr));
      const std::string tiling = x["tiling"];
      INFO(hw << " tiling: " << tiling);
      CHECK(tiling.find(std::to_string(plan["block_q"].get<int>())) != std::string::npos);
      CHECK(tiling.find(std::to_string(plan["block_kv"].get<int>())) != std::string::npos);
      outlines.push_back(x);
    }
    // A different length changes every paragraph: each carries this problem's figures.
    for (const char* k : keys) {
      INFO(hw << " " << k << ":\n" << outlines[0][k] << "\n" << outlines[1][k]);
      CHECK(outlines[0][k] != outlines[1][k]);
    }
    // The storage dtype changes the bytes, hence the traffic paragraph.
    CHECK(outlines[0]["memoryTraffic"] != outlines[2]["memoryTraffic"]);
  }
  // The human-readable form carries the same tiling text.
  const json x = ok_json(with({"explain", "--json", "--hw", "zen3"}, problems[0]));
  const CliResult text = cli(with({"explain", "--hw", "zen3"}, problems[0]));
  CHECK(text.code == 0);
  CHECK(text.out.find(x["tiling"].get<std::string>()) != std::string::npos);
}

TEST_CASE("clisweep: hw lists the built-in profiles and the detected host, in text and JSON", "[clisweep]") {
  const json j = ok_json({"hw", "--json"});
  REQUIRE(j["host"].is_object());
  CHECK(j["host"]["name"] == "host");
  REQUIRE(j["profiles"].is_array());
  const CliResult text = cli({"hw"});
  CHECK(text.code == 0);
  CHECK(text.err.empty());
  CHECK(text.out.find("host") != std::string::npos);
  std::set<std::string> names;
  for (const json& p : j["profiles"]) {
    const std::string n = p["name"];
    CHECK(names.insert(n).second);
    CHECK(text.out.find(n) != std::string::npos);
    CHECK((p["kind"] == "cpu" || p["kind"] == "gpu"));
    CHECK_FALSE(p["levels"].empty());
  }
  CHECK(names.count("host") == 0);
  CHECK(names.size() >= 4);
  // The host entry reports the host's real core count (the process may be pinned to fewer).
  CHECK(j["host"]["cores"].get<int>() >= 1);
}

TEST_CASE("clisweep: run f32 and f16 write out in q's dtype and lse (B, H, S) in f32", "[clisweep]") {
  Scratch dir;
  const std::vector<float> q = randoms(3 * 6 * 2 * 16, 4), k = randoms(3 * 9 * 1 * 16, 5),
                           v = randoms(3 * 9 * 1 * 16, 6);
  write_npy(dir / "q.npy", "<f4", {3, 6, 2, 16}, f32_bytes(q));
  write_npy(dir / "k.npy", "<f4", {3, 9, 1, 16}, f32_bytes(k));
  write_npy(dir / "v.npy", "<f4", {3, 9, 1, 16}, f32_bytes(v));
  auto half = [](const std::vector<float>& x) {
    std::string s;
    for (float e : x) {
      const uint16_t b = f16_bits(e);
      s.append(reinterpret_cast<const char*>(&b), 2);
    }
    return s;
  };
  write_npy(dir / "qh.npy", "<f2", {3, 6, 2, 16}, half(q));
  write_npy(dir / "kh.npy", "<f2", {3, 9, 1, 16}, half(k));
  write_npy(dir / "vh.npy", "<f2", {3, 9, 1, 16}, half(v));
  for (const char* sfx : {"", "h"}) {
    const std::string s = sfx;
    const CliResult r = cli({"run",
                             "--q",
                             dir / ("q" + s + ".npy"),
                             "--k",
                             dir / ("k" + s + ".npy"),
                             "--v",
                             dir / ("v" + s + ".npy"),
                             "--out",
                             dir / ("o" + s + ".npy"),
                             "--lse",
                             dir / ("l" + s + ".npy"),
                             "--check",
                             "--causal",
                             "--window",
                             "3,0",
                             "--softcap",
                             "4",
                             "--scale",
                             "0.3",
                             "--threads",
                             "1"});
    INFO(r.out << r.err);
    REQUIRE(r.code == 0);
    const Npy o = read_npy(dir / ("o" + s + ".npy")), l = read_npy(dir / ("l" + s + ".npy"));
    CHECK(o.descr == (s.empty() ? "<f4" : "<f2"));
    CHECK(o.shape == std::vector<int64_t>{3, 6, 2, 16});
    CHECK(o.data.size() == size_t(3 * 6 * 2 * 16) * (s.empty() ? 4 : 2));
    CHECK(l.descr == "<f4");
    CHECK(l.shape == std::vector<int64_t>{3, 2, 6});
    CHECK(l.data.size() == size_t(3 * 2 * 6) * 4);
    // --check reports a max abs error: a small finite number, f16 output rounding at most.
    const size_t at = r.out.find("max abs error ");
    REQUIRE(at != std::string::npos);
    const double err = std::stod(r.out.substr(at + 14));
    CHECK(std::isfinite(err));
    CHECK(err <= (s.empty() ? 1e-5 : 2.0 * 0x1p-11));
  }
}

TEST_CASE("clisweep: run reads .npy format versions 2 and 3", "[clisweep]") {
  Scratch dir;
  const Inputs in = write_inputs(dir);
  const std::string q1 = read_file(in.q);
  write_npy(dir / "q2.npy", "<f4", {2, 5, 4, 8}, f32_bytes(randoms(2 * 5 * 4 * 8, 1)), 2);
  write_npy(dir / "q3.npy", "<f4", {2, 5, 4, 8}, f32_bytes(randoms(2 * 5 * 4 * 8, 1)), 3);
  REQUIRE(cli({"run", "--q", in.q, "--k", in.k, "--v", in.v, "--out", dir / "o1.npy"}).code == 0);
  for (const char* name : {"q2.npy", "q3.npy"}) {
    const std::string out = dir / (std::string("o_") + name);
    const CliResult r = cli({"run", "--q", dir / name, "--k", in.k, "--v", in.v, "--out", out});
    INFO(name << ": " << r.err);
    REQUIRE(r.code == 0);
    CHECK(read_npy(out).data == read_npy(dir / "o1.npy").data);
  }
}

TEST_CASE("clisweep: malformed .npy inputs exit 2 naming the file; no output appears", "[clisweep]") {
  Scratch dir;
  const Inputs in = write_inputs(dir);
  const std::string qdata = f32_bytes(randoms(2 * 5 * 4 * 8, 1));
  write_npy(dir / "big_endian.npy", ">f4", {2, 5, 4, 8}, qdata);
  write_npy(dir / "big_endian16.npy", ">f2", {2, 5, 4, 8}, qdata.substr(0, qdata.size() / 2));
  write_npy(dir / "five_d.npy", "<f4", {2, 5, 4, 8, 1}, qdata);
  write_npy(dir / "two_d.npy", "<f4", {40, 8}, qdata);
  write_npy(dir / "fortran.npy", "<f4", {2, 5, 4, 8}, qdata, 1, "True");
  write_npy(dir / "truncated.npy", "<f4", {2, 5, 4, 8}, qdata.substr(0, qdata.size() - 1));
  write_npy(dir / "float64.npy", "<f8", {2, 5, 4, 4}, qdata);
  write_npy(dir / "int32.npy", "<i4", {2, 5, 4, 8}, qdata);
  spit(dir / "header_only.npy", read_file(in.q).substr(0, 20));
  spit(dir / "empty.npy", "");
  write_npy(dir / "q_seq_wrong_k.npy", "<f4", {2, 7, 2, 4}, qdata.substr(0, 2 * 7 * 2 * 4 * 4));
  write_npy(dir / "v_batch3.npy", "<f4", {3, 7, 2, 8}, f32_bytes(randoms(3 * 7 * 2 * 8, 9)));
  const std::string out = dir / "o.npy", lse = dir / "l.npy";
  auto run = [&](const std::string& q, const std::string& k, const std::string& v) {
    return std::vector<std::string>{"run", "--q", q, "--k", k, "--v", v, "--out", out, "--lse", lse};
  };
  for (const char* bad : {"big_endian.npy", "big_endian16.npy", "five_d.npy", "two_d.npy", "fortran.npy",
                          "truncated.npy", "float64.npy", "int32.npy", "header_only.npy", "empty.npy"}) {
    expect_usage(run(dir / bad, in.k, in.v), {"--q", bad});
    expect_usage(run(in.q, in.k, dir / bad), {"--v", bad});
  }
  expect_usage(run(dir / "big_endian.npy", in.k, in.v), {"big-endian"});
  expect_usage(run(dir / "five_d.npy", in.k, in.v), {"(2, 5, 4, 8, 1)"});
  expect_usage(run(in.q, dir / "q_seq_wrong_k.npy", in.v), {"--k", "q_seq_wrong_k.npy"});
  expect_usage(run(in.q, in.k, dir / "v_batch3.npy"), {"--v", "v_batch3.npy", "3"});
  CHECK_FALSE(file_exists(out));
  CHECK_FALSE(file_exists(lse));
}

TEST_CASE("clisweep: run --backend cuda on a build or host without CUDA exits 3 and creates nothing", "[clisweep]") {
  if (ioattn_backend_available(IOATTN_BACKEND_CUDA)) {
    WARN("a CUDA device is usable here: the exit 3 path is not reachable");
    return;
  }
  Scratch dir;
  const Inputs in = write_inputs(dir);
  const CliResult r = cli({"run", "--q", in.q, "--k", in.k, "--v", in.v, "--out", dir / "o.npy", "--lse", dir / "l.npy",
                           "--backend", "cuda", "--check"});
  INFO(r.err);
  CHECK(r.code == 3);
  CHECK(r.out.empty());
  CHECK(one_line(r.err));
  CHECK(r.err.find("cuda") != std::string::npos);
  CHECK_FALSE(file_exists(dir / "o.npy"));
  CHECK_FALSE(file_exists(dir / "l.npy"));
}

TEST_CASE("clisweep: demo without flags prints plan, outline, traffic, time, GFLOP/s and the check", "[clisweep]") {
  const CliResult r = cli({"demo"});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  for (const char* part :
       {"block_q", "block_kv", "memory traffic", "tiling", "numerical stability", "tradeoff", "failure mode", "flash",
        "standard", "ms", "GFLOP/s", "fp64 reference", "max abs error", "PASS"}) {
    CHECK(r.out.find(part) != std::string::npos);
  }
  CHECK(r.out.find("FAIL") == std::string::npos);
}

TEST_CASE("clisweep: status strings for every code and out-of-range ones; version", "[clisweep][api]") {
  std::set<std::string> seen;
  for (ioattn_status s : {IOATTN_OK, IOATTN_ERROR_INVALID_ARGUMENT, IOATTN_ERROR_UNSUPPORTED,
                          IOATTN_ERROR_OUT_OF_MEMORY, IOATTN_ERROR_BACKEND}) {
    const char* text = ioattn_status_string(s);
    REQUIRE(text != nullptr);
    CHECK(std::strlen(text) > 0);
    CHECK(seen.insert(text).second);
  }
  for (int s : {-1, 5, 1000, INT_MIN, INT_MAX}) {
    const char* text = ioattn_status_string(static_cast<ioattn_status>(s));
    INFO(s);
    REQUIRE(text != nullptr);
    CHECK(std::strlen(text) > 0);
    CHECK(seen.count(text) == 0);
  }
  const char* version = ioattn_version();
  REQUIRE(version != nullptr);
  CHECK(std::strlen(version) > 0);
  const CliResult r = cli({"--version"});
  CHECK(r.code == 0);
  CHECK(r.out.find(version) != std::string::npos);
}

namespace {

// One f32 (1, 2, 1, 4) self-attention with the given options; returns the status.
ioattn_status tiny_forward(const ioattn_options& opt) {
  std::vector<float> x(8, 0.5f), o(8, 0.f);
  ioattn_tensor t{x.data(), IOATTN_F32, 1, 2, 1, 4, 8, 4, 4};
  ioattn_tensor out{o.data(), IOATTN_F32, 1, 2, 1, 4, 8, 4, 4};
  return ioattn_forward(&t, &t, &t, &out, nullptr, &opt);
}

}  // namespace

TEST_CASE("clisweep: last_error is per thread while two threads fail concurrently", "[clisweep][api]") {
  ioattn_options good;
  ioattn_options_default(&good);
  REQUIRE(tiny_forward(good) == IOATTN_OK);

  ioattn_options mine = good;
  mine.causal = 3;
  REQUIRE(tiny_forward(mine) == IOATTN_ERROR_INVALID_ARGUMENT);
  const std::string my_message = ioattn_last_error();
  CHECK(my_message.find("causal") != std::string::npos);

  // A thread that never failed sees a valid (non-NULL) string, not this thread's message.
  std::string fresh = "unset";
  std::thread clean([&] {
    const char* e = ioattn_last_error();
    fresh = e ? e : "NULL";
  });
  clean.join();
  CHECK(fresh != "NULL");
  CHECK(fresh.find("causal") == std::string::npos);

  // Several threads fail over and over with their own values; each reads back its own.
  constexpr int kThreads = 4, kRounds = 200;
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&, t] {
      ioattn_options o = good;
      o.num_threads = -(t + 2);
      const std::string needle = "num_threads=" + std::to_string(-(t + 2));
      for (int i = 0; i < kRounds; ++i) {
        if (tiny_forward(o) != IOATTN_ERROR_INVALID_ARGUMENT ||
            std::string(ioattn_last_error()).find(needle) == std::string::npos) {
          ++wrong[size_t(t)];
        }
      }
    });
  }
  for (std::thread& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t) CHECK(wrong[size_t(t)] == 0);
  CHECK(ioattn_last_error() == my_message);
}
