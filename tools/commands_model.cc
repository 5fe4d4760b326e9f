// plan, traffic, explain and hw: the planner, traffic model and design outline for a problem on
// one or more hardware profiles, without running anything.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/calibration.h"
#include "common/outline.h"
#include "common/planner.h"
#include "common/ring.h"
#include "common/traffic.h"
#include "tools/args.h"
#include "tools/cli.h"
#include "tools/problem_flags.h"
#include "tools/report.h"

namespace ioattn::cli {

using nlohmann::json;

namespace {

constexpr const char* kShapeOutput =
    "\nWith --json: one object for a single --hw (or none: the host), a list of objects, one per\n"
    "--hw/--hw-file in command-line order, for several.";

// A shape no kernel of this build runs (a GPU head dim without a tile, say) is still planned:
// the plan says supported = false and carries the figures such a kernel would need.
Plan checked_plan(const Problem& pr, const HardwareProfile& hw, int threads) {
  const Plan plan = plan_for(pr, hw, threads);
  if (plan.block_q <= 0 || plan.block_kv <= 0) {
    throw internal_error("--hw " + hw.name + ": the planner returned empty blocks for " + describe(pr));
  }
  return plan;
}

// One JSON value per hardware entry: the object itself for one, a list for several.
json one_or_list(const std::vector<json>& items) { return items.size() == 1 ? items[0] : json(items); }

// --tune-file for the length of one command: model_json runs commands inside a process (Python)
// whose later calls must see its own calibration path again.
class TuneFileScope {
 public:
  TuneFileScope() = default;
  TuneFileScope(const TuneFileScope&) = delete;
  TuneFileScope& operator=(const TuneFileScope&) = delete;
  void set(const std::string& path) {
    previous_ = set_calibration_path(path);
    active_ = true;
  }
  ~TuneFileScope() {
    if (active_) set_calibration_path(previous_);
  }

 private:
  bool active_ = false;
  std::string previous_;
};

struct ModelCommand {
  explicit ModelCommand(const char* name) : args(name) {}
  Args args;
  ProblemRequest request;
  bool json_output = false;
  int threads = 0;  // CPU workers to plan for; 0: the profile's cores
  TuneFileScope tune_file;
  int ranks = 0;  // --ranks: 0 when not given
  std::string link;
  double link_gbs = 0;
};

// --ranks N: the ring model on `hw` over the named link (default its fastest), or one of
// --link-gbs's bandwidth. Null JSON without --ranks.
std::pair<json, std::string> ring_report(const ModelCommand& c, const HardwareProfile& hw) {
  if (c.ranks == 0) return {json(nullptr), ""};
  Link link;
  if (!c.link.empty()) {
    const auto it = std::find_if(hw.links.begin(), hw.links.end(), [&](const Link& l) { return l.name == c.link; });
    if (it == hw.links.end()) {
      std::string names;
      for (const Link& l : hw.links) names += (names.empty() ? "" : ", ") + l.name;
      if (c.link_gbs <= 0)
        throw usage_error("--link " + quoted(c.link) + ": profile '" + hw.name + "' has no such link (it has: " +
                          (names.empty() ? "none" : names) + "); give --link-gbs for another");
      link.name = c.link;
    } else {
      link = *it;
    }
  } else if (!hw.links.empty()) {
    link = hw.links.front();
  } else {
    link.name = "link";
  }
  if (c.link_gbs > 0) {
    link.bandwidth_gbs = c.link_gbs;
    link.source = "--link-gbs";
  }
  if (c.ranks > 1 && !(link.bandwidth_gbs > 0))
    throw usage_error("--ranks: profile '" + hw.name + "' lists no link to its peers; give --link-gbs");
  RingModel m;
  std::string error;
  if (!predict_ring(c.request.problem, hw, c.ranks, link, c.threads, &m, &error))
    throw usage_error("--ranks " + std::to_string(c.ranks) + ": " + error);
  json j = {
      {"ranks", m.ranks},
      {"shard_seqlen", m.shard_seqlen},
      {"zigzag", m.zigzag},
      {"link", {{"name", m.link.name}, {"bandwidth_gbs", m.link.bandwidth_gbs}, {"latency_us", m.link.latency_us}}},
      {"step",
       {{"seqlen_q", m.ring_step.seqlen_q},
        {"seqlen_k", m.ring_step.seqlen_k},
        {"causal", m.ring_step.causal},
        {"block_q", m.ring_step_plan.block_q},
        {"block_kv", m.ring_step_plan.block_kv},
        {"kv_splits", m.ring_step_plan.kv_splits}}},
      {"flops_per_step", m.flops_per_step},
      {"link_bytes_per_step", m.link_bytes_per_step},
      {"compute_s_per_step", m.compute_s_per_step},
      {"transfer_s_per_step", m.transfer_s_per_step},
      {"hides", m.hides},
      {"rank_dram_bytes", m.rank_dram_bytes},
      {"rank_time_s", m.rank_time_s},
      {"single_device_time_s", m.single_device_time_s},
      {"predicted_efficiency", m.predicted_efficiency},
      {"summary", m.summary}};
  return {std::move(j),
          "ring            " + m.summary + "; " + human_bytes(m.rank_dram_bytes) + " off-chip per rank\n"};
}

// Parses the shared flags plus --json; returns false after printing help.
bool parse_model_command(ModelCommand& c, int argc, char** argv, const std::string& synopsis,
                         const std::string& description, std::ostream& out) {
  add_problem_flags(c.args, true);
  c.args.flag("--json", "machine-readable output");
  c.args.option("--threads", "N",
                "CPU profiles: plan for a call with num_threads = N (default: the profile's cores); one thread "
                "runs whole heads where two or more would each get part of one, which moves different bytes");
  c.args.option("--ranks", "N",
                "also model ring attention over N devices of each profile (context parallelism): per-rank "
                "off-chip bytes, K/V bytes on the link per step, and whether the transfer hides under compute");
  c.args.option("--link", "NAME", "--ranks: the profile's link to use (default its first, the fastest)");
  c.args.option("--link-gbs", "G", "--ranks: link bandwidth per direction in GB/s, overriding the profile's");
  c.args.option("--tune-file", "F.json",
                "--hw host: the calibration file to apply (default: ioattn_tune_path(), see `ioattn tune`)");
  if (!c.args.parse(argc, argv)) {
    out << c.args.help(synopsis, description);
    return false;
  }
  if (const auto f = c.args.value("--tune-file")) {
    if (f->empty()) throw usage_error("--tune-file: expected a file name, got ''");
    c.tune_file.set(*f);
  }
  c.request = read_problem_flags(c.args, true);
  c.json_output = c.args.has("--json");
  c.threads = int(int_option(c.args, "--threads", 0, 0, 4096));
  c.ranks = int(int_option(c.args, "--ranks", 0, 1, 65536));
  c.link = c.args.value("--link").value_or("");
  c.link_gbs = double_option(c.args, "--link-gbs", 0, 1e-6, 1e9);
  if (c.ranks == 0 && (c.args.has("--link") || c.args.has("--link-gbs")))
    throw usage_error("--link and --link-gbs describe the ring: give --ranks too");
  return true;
}

// One entry per --hw, in order: entry(plan, hw) gives that profile's JSON value and text, from the
// problem's checked plan there. --json prints the values (a list even for one where always_list),
// else the texts.
template <class Entry>
int print_per_profile(const ModelCommand& c, bool always_list, Entry entry, std::ostream& out) {
  std::vector<json> items;
  std::string text;
  for (const HardwareProfile& hw : c.request.hardware) {
    auto [j, t] = entry(checked_plan(c.request.problem, hw, c.threads), hw);
    items.push_back(std::move(j));
    text += t;
  }
  out << (c.json_output ? dump(always_list ? json(items) : one_or_list(items)) + "\n" : text);
  return kExitOk;
}

}  // namespace

namespace {

int run_plan(int argc, char** argv, std::ostream& out) {
  ModelCommand c("plan");
  if (!parse_model_command(
          c, argc, argv, "[problem flags] [--hw NAME]... [--threads N] [--json]",
          std::string("The tiling the planner chooses for the problem on each hardware profile: block\n"
                      "sizes, register or CTA tile, kv splits, workers, and the working set against\n"
                      "the cache or shared-memory level it was fitted to. CPU profiles get plan_cpu,\n"
                      "GPU profiles plan_gpu.") +
              kShapeOutput,
          out)) {
    return kExitOk;
  }
  const Problem& pr = c.request.problem;
  return print_per_profile(
      c, false,
      [&](const Plan& plan, const HardwareProfile& hw) {
        json j = plan_json(plan);
        j["problem"] = problem_json(pr);
        auto [ring, ring_text] = ring_report(c, hw);
        if (!ring.is_null()) j["ring"] = std::move(ring);
        return std::pair(std::move(j),
                         "problem         " + describe(pr) + "\n" + plan_text(plan, hw) + ring_text + "\n");
      },
      out);
}

int run_traffic(int argc, char** argv, std::ostream& out) {
  ModelCommand c("traffic");
  if (!parse_model_command(c, argc, argv, "[problem flags] [--hw NAME]... [--threads N] [--json]",
                           "Predicted bytes across every memory boundary (CPU: L1d-L2, L2-L3, L3-DRAM; GPU:\n"
                           "smem-L2, L2-HBM) for flash attention (tiled, scores never materialized) and for\n"
                           "standard attention (S and P written and read back), one entry per --hw.\n\n"
                           "With --json: always a list of objects (hardware, flash_dram_bytes,\n"
                           "standard_dram_bytes, levels [{name, flash_bytes, standard_bytes}], flops,\n"
                           "flash_roofline_s, standard_roofline_s), as docs/api.md specifies.",
                           out)) {
    return kExitOk;
  }
  const Problem& pr = c.request.problem;
  return print_per_profile(
      c, true,
      [&](const Plan& plan, const HardwareProfile& hw) {
        const TrafficReport t = predict_traffic(pr, plan, hw);
        json j = traffic_json(t);
        j["problem"] = problem_json(pr);
        auto [ring, ring_text] = ring_report(c, hw);
        if (!ring.is_null()) j["ring"] = std::move(ring);
        return std::pair(std::move(j), t.hardware + ": " + describe(pr) + " (block_q " + std::to_string(plan.block_q) +
                                           ", block_kv " + std::to_string(plan.block_kv) + ")\n" + traffic_text(t) +
                                           ring_text + "\n");
      },
      out);
}

int run_explain(int argc, char** argv, std::ostream& out) {
  ModelCommand c("explain");
  if (!parse_model_command(c, argc, argv, "[problem flags] [--hw NAME]... [--threads N] [--json]",
                           std::string("The design outline of the plan for this problem on this hardware: memory\n"
                                       "traffic, tiling, numerical stability, the tradeoff made and the failure mode\n"
                                       "risked, each with this plan's numbers. JSON keys are exactly memoryTraffic,\n"
                                       "tiling, numericalStability, tradeoff and failureMode.") +
                               kShapeOutput,
                           out)) {
    return kExitOk;
  }
  if (c.ranks > 0) throw usage_error("--ranks: the ring model is in `ioattn plan` and `ioattn traffic`");
  const Problem& pr = c.request.problem;
  return print_per_profile(
      c, false,
      [&](const Plan& plan, const HardwareProfile& hw) {
        const DesignOutline o = designOutline(pr, plan, hw);
        return std::pair(outline_json(o), hw.name + ": " + describe(pr) + "\n" + outline_text(o) + "\n");
      },
      out);
}

int run_hw(int argc, char** argv, std::ostream& out) {
  Args args("hw");
  args.flag("--json", "machine-readable output: {host, gpu (null without one), profiles: [...]}");
  if (!args.parse(argc, argv)) {
    out << args.help("[--json]",
                     "The built-in hardware profiles (names usable with --hw) and the detected host\n"
                     "(--hw host), with cache levels, cores, SIMD target and FMA rate.");
    return kExitOk;
  }
  const HardwareProfile host = detect_host();
  HardwareProfile gpu;
  const bool have_gpu = detect_gpu(&gpu);
  const auto& builtins = builtin_profiles();
  if (args.has("--json")) {
    json profiles = json::array();
    for (const HardwareProfile& hw : builtins) profiles.push_back(profile_json(hw));
    const json j = {
        {"host", profile_json(host)}, {"gpu", have_gpu ? profile_json(gpu) : json(nullptr)}, {"profiles", profiles}};
    out << dump(j) << "\n";
    return kExitOk;
  }
  auto row = [](const HardwareProfile& hw) {
    std::string levels;
    for (const MemoryLevel& l : hw.levels) {
      if (l.size_bytes <= 0) continue;
      if (!levels.empty()) levels += ", ";
      levels += l.name + " " + human_bytes(double(l.size_bytes));
      if (l.shared_by > 1) {
        levels += '/';
        levels += std::to_string(l.shared_by);
      }
    }
    char line[512];
    std::snprintf(line, sizeof line, "%-14s %-4s %5d %-8s %9.1f  %s\n", hw.name.c_str(), device_kind_name(hw.kind),
                  hw.cores, hw.kind == DeviceKind::cpu ? hw.simd_target.c_str() : "-",
                  hw.fma_gflops_per_core * hw.cores, levels.c_str());
    return std::string(line) + std::string(15, ' ') + hw.description + "\n";
  };
  char header[256];
  std::snprintf(header, sizeof header, "%-14s %-4s %5s %-8s %9s  %s\n", "name", "kind", "cores", "simd", "GFLOP/s",
                "levels (size/shared by)");
  out << header << row(host);
  if (have_gpu) out << row(gpu);
  for (const HardwareProfile& hw : builtins) out << row(hw);
  return kExitOk;
}

}  // namespace

int cmd_plan(int argc, char** argv) { return run_plan(argc, argv, std::cout); }
int cmd_traffic(int argc, char** argv) { return run_traffic(argc, argv, std::cout); }
int cmd_explain(int argc, char** argv) { return run_explain(argc, argv, std::cout); }
int cmd_hw(int argc, char** argv) { return run_hw(argc, argv, std::cout); }

std::string model_json(const std::string& command, const std::vector<std::string>& args) {
  int (*run)(int, char**, std::ostream&) = nullptr;
  if (command == "plan")
    run = run_plan;
  else if (command == "traffic")
    run = run_traffic;
  else if (command == "explain")
    run = run_explain;
  else if (command == "hw")
    run = run_hw;
  else
    throw usage_error("unknown command " + quoted(command) + " (plan, traffic, explain or hw)");
  std::vector<std::string> storage;
  bool has_json = false;
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") throw usage_error(a + ": not available here; see ioattn " + command + " --help");
    has_json = has_json || a == "--json";
    storage.push_back(a);
  }
  if (!has_json) storage.push_back("--json");
  std::vector<char*> argv;
  for (std::string& a : storage) argv.push_back(a.data());
  std::ostringstream out;
  run(int(argv.size()), argv.data(), out);
  std::string text = out.str();
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

}  // namespace ioattn::cli
