// CPU forward benchmarks: the flash kernel, the standard-attention baseline (S materialized,
// OpenBLAS) and the machine's ceilings (FMA peak, read bandwidth), all in the same process, so
// the reported ratios (fraction of peak, speedup over the baseline) are immune to the machine's
// load drifting between runs.
//
//   bench_cpu --benchmark_filter='D:128/S:4096/.*f32'        the headline shape
//   bench_cpu --benchmark_filter='ceiling|D:64/'              peaks and D = 64
//   IOATTN_BENCH_TARGET=AVX2 bench_cpu --benchmark_filter=ceiling/fma   probes and kernels on AVX2
//
// Every ratio names its ceiling: peak% is against the FMA probe measured at start-up (best of
// three), of_probe% against the probes timed beside each call, theory% against the theoretical
// peak (cores x FMA/cycle of bench/lib's core table x lanes x 2 x the clock measured at start-up).
//
// FLOPs follow the FlashAttention papers (bench/results/reference-figures.md):
// 2 * B * Hq * (visible query-key pairs) * (D + Dv), so causal counts only the visible half.
// Problem sizes keep the work per run near B=1, H=16, S=4096: H = 16 * (4096 / S)^2, at most 16
// and at least 1.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bench/lib/peers.h"
#include "common/problem.h"
#include "cpu/cpu_backend.h"

namespace {

using ioattn::AttnParams;
using ioattn::DType;
using Clock = std::chrono::steady_clock;

struct Shape {
  int64_t head_dim, seqlen;
  bool causal;
  int threads;
  DType dtype;
};

int64_t heads_for(int64_t seqlen) {
  const double h = 16.0 * (4096.0 / double(seqlen)) * (4096.0 / double(seqlen));
  return std::clamp<int64_t>(int64_t(h), 1, 16);
}

// Inputs (B=1, S, H, D) contiguous, normal values; outputs and lse.
struct Problem {
  std::vector<uint16_t> q16, k16, v16, o16;
  std::vector<float> q32, k32, v32, o32, lse;
  AttnParams p;

  explicit Problem(const Shape& s) {
    const int64_t h = heads_for(s.seqlen), n = s.seqlen * h * s.head_dim;
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.f, 1.f);
    auto fill = [&](std::vector<float>& x) {
      x.resize(size_t(n));
      for (float& e : x) e = dist(rng);
    };
    fill(q32);
    fill(k32);
    fill(v32);
    o32.assign(size_t(n), 0.f);
    lse.assign(size_t(h * s.seqlen), 0.f);
    p.io_dtype = p.kv_dtype = s.dtype;
    if (s.dtype == DType::f32) {
      p.q = q32.data();
      p.k = k32.data();
      p.v = v32.data();
      p.out = o32.data();
    } else {
      auto to16 = [&](const std::vector<float>& x, std::vector<uint16_t>& y) {
        y.resize(x.size());
        for (size_t i = 0; i < x.size(); ++i) y[i] = ioattn::f32_to_bf16(x[i]);
      };
      to16(q32, q16);
      to16(k32, k16);
      to16(v32, v16);
      o16.assign(size_t(n), 0);
      p.q = q16.data();
      p.k = k16.data();
      p.v = v16.data();
      p.out = o16.data();
    }
    p.lse = lse.data();
    p.batch = 1;
    p.heads_q = p.heads_kv = h;
    p.head_dim = p.head_dim_v = s.head_dim;
    p.seqlen_q = p.seqlen_k = s.seqlen;
    p.q_seq_stride = p.k_seq_stride = p.v_seq_stride = p.o_seq_stride = h * s.head_dim;
    p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = s.head_dim;
    p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = n;
    p.lse_head_stride = s.seqlen;
    p.lse_batch_stride = h * s.seqlen;
    p.scale = float(1.0 / std::sqrt(double(s.head_dim)));
    p.causal = s.causal;
    p.num_threads = s.threads;
  }
};

const ioattn::peers::FmaCeiling& fma_ceiling(int threads) {
  static std::map<int, ioattn::peers::FmaCeiling> cache;
  auto it = cache.find(threads);
  // Best of three: on the shared VM a probe that lands beside another tenant's burst reads low
  // (two-thread probes of 97 and 186 GFLOP/s a minute apart), which would inflate every ratio;
  // the clock likewise, which would deflate the theoretical figure.
  if (it == cache.end()) {
    ioattn::peers::FmaCeiling best = ioattn::peers::measure_fma_ceiling(threads, 0.3);
    for (int i = 1; i < 3; ++i) {
      const ioattn::peers::FmaCeiling c = ioattn::peers::measure_fma_ceiling(threads, 0.3);
      best.probe_gflops = std::max(best.probe_gflops, c.probe_gflops);
      best.probe_core_gflops = std::max(best.probe_core_gflops, c.probe_core_gflops);
      best.clock_ghz = std::max(best.clock_ghz, c.clock_ghz);
      best.integer_clock_ghz = std::max(best.integer_clock_ghz, c.integer_clock_ghz);
    }
    it = cache.emplace(threads, best).first;
  }
  return it->second;
}

double fma_peak_gflops(int threads) { return fma_ceiling(threads).probe_gflops; }

// Seconds per call of the f32 standard baseline at this shape (dtype ignored: the baseline
// computes in f32 whatever the storage), measured once per process.
std::map<std::tuple<int64_t, int64_t, bool, int>, double>& baseline_cache() {
  static std::map<std::tuple<int64_t, int64_t, bool, int>, double> cache;
  return cache;
}

double time_standard_once(Problem& pr, int threads, size_t* scratch) {
  const auto t0 = Clock::now();
  const ioattn::Status st = ioattn::peers::standard_attention(pr.p, threads, scratch);
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  return st.is_ok() ? dt : -1;
}

double baseline_seconds(const Shape& s) {
  const auto key = std::make_tuple(s.head_dim, s.seqlen, s.causal, s.threads);
  auto& cache = baseline_cache();
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Shape f32 = s;
  f32.dtype = DType::f32;
  Problem pr(f32);
  size_t scratch = 0;
  time_standard_once(pr, s.threads, &scratch);  // warm-up, as for the kernel (BM_Flash)
  double best = time_standard_once(pr, s.threads, &scratch);
  best = std::min(best, time_standard_once(pr, s.threads, &scratch));
  cache[key] = best;
  return best;
}

void report(benchmark::State& state, const Shape& s, const AttnParams& p, double seconds, double scratch_bytes) {
  const double flops = ioattn::forward_flops(ioattn::problem_of(p));
  const double gflops = flops / seconds / 1e9;
  state.counters["GFLOP/s"] = gflops;
  state.counters["peak%"] = 100.0 * gflops / fma_peak_gflops(s.threads);
  const double theory = fma_ceiling(s.threads).theoretical_gflops();
  if (theory > 0) state.counters["theory%"] = 100.0 * gflops / theory;
  state.counters["scratch_MiB"] = scratch_bytes / double(1 << 20);
  state.counters["heads"] = double(p.heads_q);
}

void BM_Flash(benchmark::State& state, Shape s) {
  Problem pr(s);
  // One untimed call first: a long shape runs one or two timed iterations, and a cold first
  // call (thread-pool start, first touch of scratch and of the inputs' pages on this core)
  // measured 15-25% slower than the steady state at S = 4096 on the 2-core VM.
  if (!ioattn::cpu::forward(pr.p).is_ok()) {
    state.SkipWithError("warm-up call failed");
    return;
  }
  // Each timed call is bracketed by two runs of the FMA probe on as many threads, and judged
  // against their mean: on the shared VM the FMA rate itself drifts by 10-15% within minutes, so
  // peak% (against the best start-up probe) mixes the kernel's speed with the machine's state
  // then and now. of_probe% is the median of the per-call ratios; like bench_decode's of_read%.
  // A call whose probes read under 80% of the start-up probe is left out (counted in
  // `disturbed`): another tenant then held a core, and the kernel's dynamic schedule and the
  // probe's even split slow by different amounts (a two-thread probe of one core's worth, 173
  // GFLOP/s, paired with a kernel call at 141, read "78%").
  const double flops = ioattn::forward_flops(ioattn::problem_of(pr.p));
  double total = 0;
  int64_t runs = 0;
  std::vector<double> ratios, probes;
  for (auto _ : state) {
    const double before = ioattn::peers::fma_probe_once(s.threads);
    const auto t0 = Clock::now();
    const ioattn::Status st = ioattn::cpu::forward(pr.p);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!st.is_ok()) {
      state.SkipWithError(st.message.c_str());
      return;
    }
    state.SetIterationTime(dt);
    const double probe = 0.5 * (before + ioattn::peers::fma_probe_once(s.threads));
    probes.push_back(probe);
    if (probe >= 0.8 * fma_peak_gflops(s.threads)) ratios.push_back(flops / dt / 1e9 / probe);
    total += dt;
    ++runs;
  }
  const double seconds = total / double(runs);
  report(state, s, pr.p, seconds, double(ioattn::cpu::scratch_bytes(pr.p)));
  auto median = [](std::vector<double>& x) {
    std::nth_element(x.begin(), x.begin() + x.size() / 2, x.end());
    return x[x.size() / 2];
  };
  state.counters["probe_GFLOP/s"] = median(probes);
  state.counters["disturbed"] = double(probes.size() - ratios.size());
  if (!ratios.empty()) state.counters["of_probe%"] = 100.0 * median(ratios);
  state.counters["vs_blas"] = baseline_seconds(s) / seconds;
  const ioattn::Plan plan = ioattn::cpu::plan_for_params(pr.p);
  state.SetLabel(ioattn::cpu::dispatch_target_name() + " block_q=" + std::to_string(plan.block_q) +
                 " block_kv=" + std::to_string(plan.block_kv) + " splits=" + std::to_string(plan.kv_splits));
}

void BM_Standard(benchmark::State& state, Shape s) {
  Problem pr(s);
  double total = 0;
  int64_t runs = 0;
  size_t scratch = 0;
  time_standard_once(pr, s.threads, &scratch);  // warm-up, as for the kernel
  for (auto _ : state) {
    const double dt = time_standard_once(pr, s.threads, &scratch);
    if (dt < 0) {
      state.SkipWithError("standard attention failed");
      return;
    }
    state.SetIterationTime(dt);
    total += dt;
    ++runs;
  }
  const double seconds = total / double(runs);
  auto& cache = baseline_cache();
  const auto key = std::make_tuple(s.head_dim, s.seqlen, s.causal, s.threads);
  cache[key] = std::min(cache.count(key) ? cache[key] : seconds, seconds);
  report(state, s, pr.p, seconds, double(scratch));
}

// The probe beside its theoretical figure (cores x FMA/cycle x lanes x 2 x measured clock; the
// label spells it out): of_theory% is how close the probe comes over wall time, core_of_theory%
// over the probe threads' own CPU time (what other processes on the cores leave out), GHz the
// clock measured around it.
void BM_FmaPeak(benchmark::State& state, int threads) {
  ioattn::peers::FmaCeiling c;
  for (auto _ : state) c = ioattn::peers::measure_fma_ceiling(threads, 0.2);
  for (const auto& [name, value] : c.counters()) state.counters[name] = value;
  state.SetLabel(c.describe());
}

// The best read method's GB/s, and each method's (s<streams per thread>_GB/s).
void BM_ReadBandwidth(benchmark::State& state, int threads, size_t bytes) {
  ioattn::peers::ReadCeiling r;
  for (auto _ : state) r = ioattn::peers::measure_read_ceiling(threads, bytes, 0.2);
  for (const auto& [name, value] : r.counters()) state.counters[name] = value;
  state.SetLabel(r.describe());
}

}  // namespace

int main(int argc, char** argv) {
  if (!ioattn::peers::apply_target_env()) return 2;
  const int all = ioattn::default_threads();
  std::vector<int> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  // The probes that peak% divides by run first, before any kernel or BLAS thread exists: taken
  // after the benchmarks, the two-thread probe read one core's worth (96 against 182 GFLOP/s).
  for (int t : thread_counts) fma_peak_gflops(t);
  for (int t : thread_counts) {
    benchmark::RegisterBenchmark(("ceiling/fma_peak/threads:" + std::to_string(t)).c_str(), BM_FmaPeak, t)
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
    for (size_t mib : {16, 1024}) {
      benchmark::RegisterBenchmark(
          ("ceiling/read_bw/threads:" + std::to_string(t) + "/MiB:" + std::to_string(mib)).c_str(), BM_ReadBandwidth, t,
          mib << 20)
          ->Iterations(1)
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (int64_t d : {64, 128, 256}) {
    for (int64_t s : {512, 1024, 2048, 4096, 8192, 16384}) {
      for (bool causal : {false, true}) {
        for (int t : thread_counts) {
          const std::string tail = "/D:" + std::to_string(d) + "/S:" + std::to_string(s) +
                                   "/causal:" + std::to_string(int(causal)) + "/threads:" + std::to_string(t);
          benchmark::RegisterBenchmark(("standard" + tail + "/f32").c_str(), BM_Standard,
                                       Shape{d, s, causal, t, DType::f32})
              ->UseManualTime()
              ->MinTime(0.3)
              ->Unit(benchmark::kMillisecond);
          for (DType dt : {DType::f32, DType::bf16}) {
            benchmark::RegisterBenchmark(("flash" + tail + "/" + ioattn::dtype_name(dt)).c_str(), BM_Flash,
                                         Shape{d, s, causal, t, dt})
                ->UseManualTime()
                ->MinTime(0.5)
                // The median of three runs: one run swung 88-125 GFLOP/s with the VM's neighbours.
                ->Repetitions(3)
                ->ReportAggregatesOnly(true)
                ->Unit(benchmark::kMillisecond);
          }
        }
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
