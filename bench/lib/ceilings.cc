// The machine's ceilings, measured in the same process as the kernel they judge.
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/lib/peers.h"
#include "bench/lib/probes.h"
#include "common/alloc.h"
#include "common/cpu_cores.h"
#include "hwy/targets.h"

namespace ioattn::peers {
namespace {

using Clock = std::chrono::steady_clock;

// Runs body(thread) on `threads` std::threads released together; returns the wall seconds from
// the release to the last finish.
template <class Body>
double timed_team(int threads, const Body& body) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> team;
  for (int t = 0; t < threads; ++t) {
    team.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      body(t);
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : team) th.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::atomic<float> g_sink{0.f};

// FMA chain steps that take about `seconds` on one thread.
int64_t fma_steps_for(double seconds) {
  int64_t steps = 1 << 20;
  for (;;) {
    const auto t0 = Clock::now();
    g_sink.store(fma_chains(steps));
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (dt > 0.02) return std::max<int64_t>(steps, int64_t(double(steps) * seconds / dt));
    steps *= 4;
  }
}

// Seconds of CPU time the calling thread has run: what a thread's own work took however long other
// processes held its core (a KVM guest cannot see the host's steal, which still counts).
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double fma_team_gflops(int threads, int64_t steps) {
  const double dt = timed_team(threads, [&](int) { g_sink.store(fma_chains(steps)); });
  return double(fma_flops_per_iteration()) * double(steps) * threads / dt / 1e9;
}

}  // namespace

double fma_probe_once(int threads) {
  // Calibrated once per process: 50 ms of chains, long against the team's start-up (~50 us)
  // and comparable to the calls it brackets (10 ms at S = 512 to a second at S = 16384).
  static const int64_t steps = fma_steps_for(0.05);
  return fma_team_gflops(std::max(threads, 1), steps);
}

namespace {

// 64 dependent register-to-register integer adds a step. The empty asm makes x a register the
// compiler must assume changed after every add, so it can neither fold the adds nor reorder them;
// the addend is a register of unknown value, since Golden Cove's renamer folds chains of adds of
// a small immediate. The chain is 64 one-cycle adds a step on every
// core in the table, and the loop's own counter, compare and branch run beside it on other ports.
uint64_t add_chain(int64_t steps) {
  uint64_t x = 0, y = 1;
  asm volatile("" : "+r"(y));
  for (int64_t i = 0; i < steps; ++i) {
#pragma GCC unroll 64
    for (int k = 0; k < 64; ++k) {
      x += y;
      asm volatile("" : "+r"(x));
    }
  }
  return x;
}

}  // namespace

int cores_for(int threads) {
  threads = std::max(threads, 1);
  // Physical cores the affinity mask allows: distinct (package, core) pairs in sysfs topology, so
  // SMT siblings count once.
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return threads;
  std::set<std::pair<long, long>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    long package = -1, core = -1;
    std::ifstream(dir + "physical_package_id") >> package;
    std::ifstream(dir + "core_id") >> core;
    if (package < 0 || core < 0) return threads;
    cores.emplace(package, core);
  }
  return cores.empty() ? threads : std::min(threads, int(cores.size()));
}

double measure_clock_ghz(int threads, int fma_per_cycle, double seconds) {
  threads = std::max(threads, 1);
  // Cycles a step: add_chain's 64 adds, or fma_clock_chain's adds beside its FMAs.
  const double cycles = fma_per_cycle > 0 ? fma_clock_adds(fma_per_cycle) : 64.0;
  const auto chain = [fma_per_cycle](int64_t steps) {
    return float(fma_per_cycle > 0 ? fma_clock_chain(steps, fma_per_cycle) : add_chain(steps));
  };
  int64_t steps = 1 << 12;
  for (;;) {
    const auto t0 = Clock::now();
    g_sink.store(chain(steps));
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (dt > 0.005) {
      steps = std::max<int64_t>(steps, int64_t(double(steps) * seconds / dt));
      break;
    }
    steps *= 4;
  }
  double best = 0;
  for (int run = 0; run < 3; ++run) {
    // Each thread divides its cycles by its own CPU time, so neither a late start nor another
    // process sharing the core reads as a slow clock; the figure is their mean, the clock the
    // theoretical peak multiplies by the core count.
    std::vector<double> ghz(size_t(threads), 0.0);
    timed_team(threads, [&](int t) {
      const double t0 = thread_cpu_seconds();
      g_sink.store(chain(steps));
      ghz[size_t(t)] = cycles * double(steps) / (thread_cpu_seconds() - t0) / 1e9;
    });
    double sum = 0;
    for (double g : ghz) sum += g;
    best = std::max(best, sum / threads);
  }
  return best;
}

double FmaCeiling::theoretical_gflops() const { return double(cores) * core.fma_per_cycle * lanes * 2 * clock_ghz; }

std::vector<std::pair<std::string, double>> FmaCeiling::counters() const {
  std::vector<std::pair<std::string, double>> c = {{"GFLOP/s", probe_gflops},
                                                   {"core_GFLOP/s", probe_core_gflops},
                                                   {"GHz", clock_ghz},
                                                   {"int_GHz", integer_clock_ghz}};
  const double theory = theoretical_gflops();
  if (theory > 0) {
    c.emplace_back("theory_GFLOP/s", theory);
    c.emplace_back("of_theory%", 100.0 * probe_gflops / theory);
    c.emplace_back("core_of_theory%", 100.0 * probe_core_gflops / theory);
  }
  return c;
}

std::vector<std::pair<std::string, double>> ReadCeiling::counters() const {
  std::vector<std::pair<std::string, double>> c = {{"GB/s", gbs}};
  for (const auto& [n, g] : by_streams) {
    char name[32];
    std::snprintf(name, sizeof(name), "s%d_GB/s", n);
    c.emplace_back(name, g);
  }
  return c;
}

std::string ReadCeiling::describe() const {
  char text[64];
  std::snprintf(text, sizeof(text), "best: %d stream(s) per thread", streams);
  return text;
}

std::string FmaCeiling::describe() const {
  char text[320];
  if (core.fma_per_cycle == 0) {
    std::snprintf(text, sizeof(text),
                  "theoretical peak unknown: %s, %s %d lanes, %.2f GHz under FMA load (%.2f integer)",
                  core.core.c_str(), target.c_str(), lanes, clock_ghz, integer_clock_ghz);
  } else {
    std::snprintf(text, sizeof(text),
                  "%d cores x %d FMA/cycle x %d lanes x 2 x %.2f GHz = %.1f GFLOP/s (%s, %s; clock under FMA load, "
                  "%.2f GHz integer-only)",
                  cores, core.fma_per_cycle, lanes, clock_ghz, theoretical_gflops(), core.core.c_str(), target.c_str(),
                  integer_clock_ghz);
  }
  return text;
}

FmaCeiling measure_fma_ceiling(int threads, double seconds) {
  FmaCeiling c;
  threads = std::max(threads, 1);
  c.target = probe_target();
  c.lanes = float_lanes();
  c.cores = cores_for(threads);
  c.core = core_fma(host_cpu_identity(), c.lanes * 32);
  if (!probe_native_fma()) c.core = {c.core.core + " (target without FMA instructions)", 0};
  // The clock under FMA load on either side of the probe, the higher counting: a lowered clock
  // would flatter the probe's ratio.
  // An unknown core's FMAs are paced as 2 a cycle, the table's commonest; its theoretical figure
  // is not printed anyway.
  const int pace = c.core.fma_per_cycle > 0 ? c.core.fma_per_cycle : 2;
  c.integer_clock_ghz = measure_clock_ghz(threads, 0);
  const double before = measure_clock_ghz(threads, pace);
  const int64_t steps = fma_steps_for(seconds);
  for (int run = 0; run < 3; ++run) {
    std::vector<double> in_core(size_t(threads), 0.0);
    const double dt = timed_team(threads, [&](int t) {
      const double t0 = thread_cpu_seconds();
      g_sink.store(fma_chains(steps));
      in_core[size_t(t)] = double(fma_flops_per_iteration()) * double(steps) / (thread_cpu_seconds() - t0) / 1e9;
    });
    c.probe_gflops = std::max(c.probe_gflops, double(fma_flops_per_iteration()) * double(steps) * threads / dt / 1e9);
    double sum = 0;
    for (double g : in_core) sum += g;
    // Threads beyond the cores share them, so the in-core sum counts each core once.
    c.probe_core_gflops = std::max(c.probe_core_gflops, sum * c.cores / threads);
  }
  c.clock_ghz = std::max(before, measure_clock_ghz(threads, pace));
  return c;
}

bool force_target(const std::string& name) {
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    if (name == hwy::TargetName(target)) {
      hwy::SetSupportedTargetsForTest(target);
      return true;
    }
  }
  return false;
}

bool apply_target_env() {
  const char* name = std::getenv("IOATTN_BENCH_TARGET");
  if (name == nullptr || *name == '\0') return true;
  if (force_target(name)) return true;
  std::fprintf(stderr, "IOATTN_BENCH_TARGET=%s: not a target this build and machine run; available:", name);
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) std::fprintf(stderr, " %s", hwy::TargetName(target));
  std::fprintf(stderr, "\n");
  return false;
}

ReadCeiling measure_read_ceiling(int threads, size_t bytes, double seconds) {
  threads = std::max(threads, 1);
  ReadCeiling result;
  // Each slice a whole number of 8 streams x 8 x 64-byte blocks, so every method's loop covers it.
  const size_t quantum = 8 * 8 * 64 / sizeof(float);
  const size_t per_thread = std::max(quantum, bytes / sizeof(float) / size_t(threads) / quantum * quantum);
  ScratchPtr<float> buffer = scratch_array<float>(per_thread * size_t(threads));
  if (!buffer) return result;
  // First touch by the thread that will read the slice (NUMA placement).
  timed_team(threads, [&](int t) { std::fill_n(buffer.get() + size_t(t) * per_thread, per_thread, 1.f); });
  for (int streams : kReadStreams) {
    const auto pass = [&](int passes) {
      return timed_team(threads, [&](int t) {
        for (int p = 0; p < passes; ++p) {
          g_sink.store(read_stream(buffer.get() + size_t(t) * per_thread, per_thread, streams));
        }
      });
    };
    int passes = 1;
    while (pass(passes) <= seconds / 4 && passes <= (1 << 20)) passes *= 2;
    double best = 0;
    for (int run = 0; run < 3; ++run) {
      best = std::max(best, double(per_thread * sizeof(float)) * threads * passes / pass(passes) / 1e9);
    }
    result.by_streams.emplace_back(streams, best);
    if (best > result.gbs) {
      result.gbs = best;
      result.streams = streams;
    }
  }
  return result;
}

double time_read_once(int threads, const void* const* buffers, const size_t* bytes, int n, int streams) {
  threads = std::max(threads, 1);
  // Slices of whole 64-byte lines, so every load is aligned; a buffer's last few lines, under
  // 64 x threads bytes, go unread.
  const size_t quantum = 64;
  return timed_team(threads, [&](int t) {
    for (int i = 0; i < n; ++i) {
      const size_t slice = bytes[i] / size_t(threads) / quantum * quantum;
      const float* at = reinterpret_cast<const float*>(static_cast<const char*>(buffers[i]) + size_t(t) * slice);
      g_sink.store(read_stream(at, slice / sizeof(float), streams));
    }
  });
}

}  // namespace ioattn::peers
