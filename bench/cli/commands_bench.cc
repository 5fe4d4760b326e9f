// `ioattn bench`: flash (ioattn_forward) against standard attention with S materialized
// (bench/lib, OpenBLAS sgemm) at one shape on this machine, against its measured FMA peak.
// Built with the benchmarks (IOATTN_BUILD_BENCH) into ioattn_bench_cli, which the ioattn
// executable links; a build without them links tools/bench_unavailable.cc instead.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "bench/lib/peers.h"
#include "common/planner.h"
#include "common/problem.h"
#include "cpu/cpu_backend.h"
#include "tools/args.h"
#include "tools/attention_job.h"
#include "tools/cli.h"
#include "tools/problem_flags.h"
#include "tools/report.h"

namespace ioattn::cli {

using nlohmann::json;

namespace {

void fill_uniform(HostTensor& t, std::mt19937& rng) {
  for (int64_t i = 0; i < t.count(); ++i) {
    store_from_f32(t.bytes.data(), i, t.dtype, float(double(rng()) / 2147483648.0 - 1.0));
  }
}

struct Measured {
  double seconds = 0;
  size_t scratch_bytes = 0;
};

// Peak memory: what an implementation holds at once, the problem's q, k, v and out plus the
// scratch it allocates on top (docs/api.md's "peak memory"; the memory flash saves is the ratio).
// percent_of_peak is against the FMA probe, percent_of_theoretical against the theoretical peak
// (0 where the core is not in bench/lib's table).
json measured_json(const Measured& m, double flops, double peak, double theory, double io_bytes) {
  return {{"seconds", m.seconds},
          {"gflops", flops / m.seconds * 1e-9},
          {"percent_of_peak", peak > 0 ? 100.0 * flops / m.seconds * 1e-9 / peak : 0.0},
          {"percent_of_theoretical", theory > 0 ? 100.0 * flops / m.seconds * 1e-9 / theory : 0.0},
          {"scratch_bytes", m.scratch_bytes},
          {"peak_memory_bytes", io_bytes + double(m.scratch_bytes)}};
}

json fma_json(const peers::FmaCeiling& c, int threads) {
  const double theory = c.theoretical_gflops();
  return {{"threads", threads},
          {"cores", c.cores},
          {"target", c.target},
          {"lanes", c.lanes},
          {"core", c.core.core},
          {"fma_per_cycle", c.core.fma_per_cycle},
          {"clock_ghz", c.clock_ghz},
          {"integer_clock_ghz", c.integer_clock_ghz},
          {"probe_gflops", c.probe_gflops},
          {"probe_core_gflops", c.probe_core_gflops},
          {"theoretical_gflops", theory},
          {"percent_of_theoretical", theory > 0 ? 100.0 * c.probe_gflops / theory : 0.0},
          {"core_percent_of_theoretical", theory > 0 ? 100.0 * c.probe_core_gflops / theory : 0.0}};
}

// `ioattn bench --ceilings`: the machine's ceilings alone, at 1 thread and at `threads`: the clock,
// the FMA probe against its theoretical figure, and the read probe's methods at 1 GiB and 16 MiB.
int print_ceilings(int threads, bool as_json) {
  std::vector<int> counts = {1};
  if (threads > 1) counts.push_back(threads);
  json fma = json::array(), read = json::array();
  for (int t : counts) {
    const peers::FmaCeiling c = peers::measure_fma_ceiling(t);
    fma.push_back(fma_json(c, t));
    if (!as_json) {
      const double theory = c.theoretical_gflops();
      // Wall time, then the probe threads' own CPU time (what other processes on the cores leave out).
      if (theory > 0) {
        std::printf("FMA probe, %d thread(s): %.1f GFLOP/s = %.1f%% of theoretical (in-core %.1f = %.1f%%); %s\n", t,
                    c.probe_gflops, 100.0 * c.probe_gflops / theory, c.probe_core_gflops,
                    100.0 * c.probe_core_gflops / theory, c.describe().c_str());
      } else {
        std::printf("FMA probe, %d thread(s): %.1f GFLOP/s (in-core %.1f); %s\n", t, c.probe_gflops,
                    c.probe_core_gflops, c.describe().c_str());
      }
    }
  }
  for (int t : counts) {
    for (size_t bytes : {size_t(1) << 30, size_t(16) << 20}) {
      const peers::ReadCeiling r = peers::measure_read_ceiling(t, bytes);
      json methods = json::object();
      std::string text;
      for (const auto& [streams, gbs] : r.by_streams) {
        methods[std::to_string(streams)] = gbs;
        char item[48];
        std::snprintf(item, sizeof(item), "%s%d: %.1f", text.empty() ? "" : ", ", streams, gbs);
        text += item;
      }
      read.push_back(
          {{"threads", t}, {"bytes", bytes}, {"gbs", r.gbs}, {"streams", r.streams}, {"by_streams", methods}});
      if (!as_json) {
        std::printf("read, %d thread(s), %s: %.1f GB/s, best of streams per thread (%s GB/s)\n", t,
                    human_bytes(double(bytes)).c_str(), r.gbs, text.c_str());
      }
    }
  }
  if (as_json) std::cout << dump(json{{"fma", fma}, {"read", read}}) << "\n";
  return kExitOk;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  Args a("bench");
  add_problem_flags(a, false);
  a.option("--hw", "NAME", "hardware: only host (bench measures the machine it runs on; docs/api.md's shared flag)",
           true);
  a.option("--threads", "N", "CPU threads for both, 0 = library default (IOATTN_NUM_THREADS, else all cores)");
  a.option("--repeats", "N", "timed runs of each after one warm-up; the fastest counts (default 3)");
  a.option("--target", "NAME", "Highway target for the kernels and probes (AVX2, SSE4, ...; default the best)");
  a.flag("--ceilings", "only the machine's ceilings: clock, FMA probe against its theoretical peak, read methods");
  a.flag("--json", "machine-readable output");
  if (!a.parse(argc, argv)) {
    std::cout << a.help("[problem flags] [--threads N] [--repeats N] [--target NAME] [--ceilings] [--json]",
                        "Measures flash attention (ioattn_forward, CPU) and standard attention with the\n"
                        "score matrix materialized (OpenBLAS sgemm + softmax, bench/lib) at one shape\n"
                        "on this machine, with fixed random inputs: time, GFLOP/s (FLOPs of visible\n"
                        "pairs, 4 * Sq * Sk_visible * D per head), percent of the measured fp32 FMA\n"
                        "peak (the probe) and of the theoretical peak (cores x FMA/cycle x lanes x 2 x\n"
                        "the clock measured under FMA load), extra memory each allocates, peak memory\n"
                        "(inputs, output and that extra), and the largest difference between the two\n"
                        "outputs. Problem flags default to 16 heads x 4096 tokens x head dim 128, f32.\n"
                        "--ceilings prints only the ceilings: clock, FMA probe against the theoretical\n"
                        "peak, read bandwidth of 1, 2, 4 and 8 streams per thread, at 1 and N threads.");
    return kExitOk;
  }
  // The shared problem flags include --hw; a timing is of this machine, so only host is meaningful.
  for (const std::string& name : a.values("--hw")) {
    if (name != "host") {
      throw usage_error("bench: --hw '" + name + "': bench measures this machine, so the only valid name is 'host' (" +
                        "plan, traffic and explain take any profile)");
    }
  }
  if (const auto target = a.value("--target")) {
    if (!peers::force_target(*target)) {
      throw usage_error("bench: --target '" + *target +
                        "': not a Highway target this build compiles and this machine runs");
    }
  }
  if (a.has("--ceilings")) {
    const int t = int(int_option(a, "--threads", 0, 0, 4096));
    return print_ceilings(t > 0 ? t : default_threads(), a.has("--json"));
  }
  const ProblemRequest req = read_problem_flags(a, false);
  const Problem& pr = req.problem;
  const int repeats = int(int_option(a, "--repeats", 3, 1, 1000));
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.num_threads = int32_t(int_option(a, "--threads", 0, 0, 4096));
  opt.causal = pr.causal ? 1 : 0;
  opt.window_left = int32_t(pr.window_left);
  opt.window_right = int32_t(pr.window_right);
  opt.scale = req.scale;
  opt.softcap = req.softcap;
  const int threads = opt.num_threads > 0 ? opt.num_threads : default_threads();

  std::mt19937 rng(20260102);
  HostTensor q(pr.dtype, pr.batch, pr.seqlen_q, pr.heads_q, pr.head_dim);
  HostTensor k(pr.dtype, pr.batch, pr.seqlen_k, pr.heads_kv, pr.head_dim);
  HostTensor v(pr.dtype, pr.batch, pr.seqlen_k, pr.heads_kv, pr.head_dim_v);
  HostTensor flash_out(pr.dtype, pr.batch, pr.seqlen_q, pr.heads_q, pr.head_dim_v);
  HostTensor standard_out = flash_out;
  fill_uniform(q, rng);
  fill_uniform(k, rng);
  fill_uniform(v, rng);
  ForwardJob job{&q, &k, &v, &flash_out, nullptr, opt};

  Measured flash, standard;
  flash.seconds = run_forward(job, repeats + 1);
  AttnParams p = params_for_heads(job, 0, pr.heads_q);
  flash.scratch_bytes = cpu::scratch_bytes(p);
  const Plan plan = cpu::plan_for_params(p);

  p.out = standard_out.bytes.data();
  standard.seconds = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repeats + 1; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const Status s = peers::standard_attention(p, threads, &standard.scratch_bytes);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!s.is_ok()) {
      const std::string m = "standard attention baseline: " + s.message;
      if (s.code == IOATTN_ERROR_UNSUPPORTED) throw unsupported_error(m);
      throw internal_error(m);
    }
    standard.seconds = std::min(standard.seconds, dt);
  }
  double max_diff = 0;
  for (int64_t i = 0; i < flash_out.count(); ++i) {
    max_diff = std::max(max_diff, double(std::fabs(flash_out.at(i) - standard_out.at(i))));
  }

  const peers::FmaCeiling ceiling = peers::measure_fma_ceiling(threads);
  const double peak = ceiling.probe_gflops;
  const double flops = forward_flops(pr);
  const double io_bytes = double(q.bytes.size() + k.bytes.size() + v.bytes.size() + flash_out.bytes.size());
  if (a.has("--json")) {
    const json j = {{"problem", problem_json(pr)},
                    {"threads", threads},
                    {"simd_target", cpu::dispatch_target_name()},
                    {"flops", flops},
                    {"peak_gflops", peak},
                    {"fma_ceiling", fma_json(ceiling, threads)},
                    {"io_bytes", io_bytes},
                    {"plan", plan_json(plan)},
                    {"flash", measured_json(flash, flops, peak, ceiling.theoretical_gflops(), io_bytes)},
                    {"standard", measured_json(standard, flops, peak, ceiling.theoretical_gflops(), io_bytes)},
                    {"speedup", standard.seconds / flash.seconds},
                    {"max_abs_difference", max_diff}};
    std::cout << dump(j) << "\n";
    return kExitOk;
  }
  std::printf("bench: %s, %d threads, %s, best of %d\n", describe(pr).c_str(), threads,
              cpu::dispatch_target_name().c_str(), repeats);
  std::printf("%.3g GFLOP of visible pairs; inputs+output %s\n", flops * 1e-9, human_bytes(io_bytes).c_str());
  const double theory = ceiling.theoretical_gflops();
  std::printf("measured fp32 FMA peak (probe) %.1f GFLOP/s", peak);
  if (theory > 0) std::printf(", %.1f%% of the theoretical", 100.0 * peak / theory);
  std::printf(" %s\n", ceiling.describe().c_str());
  std::printf("%-9s %12s %10s %8s %9s %14s %14s\n", "", "time (ms)", "GFLOP/s", "% probe", "% theory", "extra memory",
              "peak memory");
  for (const auto& [name, m] : {std::pair{"flash", flash}, std::pair{"standard", standard}}) {
    const double gflops = flops / m.seconds * 1e-9;
    std::printf("%-9s %12.3f %10.2f %7.1f%% %8.1f%% %14s %14s\n", name, m.seconds * 1e3, gflops,
                peak > 0 ? 100 * gflops / peak : 0.0, theory > 0 ? 100 * gflops / theory : 0.0,
                human_bytes(double(m.scratch_bytes)).c_str(), human_bytes(io_bytes + double(m.scratch_bytes)).c_str());
  }
  std::printf(
      "flash is %.2fx standard; standard peaks at %.2fx flash's memory; flash block_q %d x block_kv %d; "
      "max |flash - standard| = %.3e\n",
      standard.seconds / flash.seconds,
      (io_bytes + double(standard.scratch_bytes)) / (io_bytes + double(flash.scratch_bytes)), plan.block_q,
      plan.block_kv, max_diff);
  return kExitOk;
}

}  // namespace ioattn::cli
