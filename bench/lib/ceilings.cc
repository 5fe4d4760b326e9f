// The machine's ceilings, measured in the same process as the kernel they judge.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "bench/lib/peers.h"
#include "bench/lib/probes.h"
#include "common/alloc.h"

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

double fma_team_gflops(int threads, int64_t steps) {
  const double dt = timed_team(threads, [&](int) { g_sink.store(fma_chains(steps)); });
  return double(fma_flops_per_iteration()) * double(steps) * threads / dt / 1e9;
}

}  // namespace

double measure_fma_peak(int threads, double seconds) {
  threads = std::max(threads, 1);
  const int64_t steps = fma_steps_for(seconds);
  double best = 0;
  for (int run = 0; run < 3; ++run) best = std::max(best, fma_team_gflops(threads, steps));
  return best;
}

double fma_probe_once(int threads) {
  // Calibrated once per process: 50 ms of chains, long against the team's start-up (~50 us)
  // and comparable to the calls it brackets (10 ms at S = 512 to a second at S = 16384).
  static const int64_t steps = fma_steps_for(0.05);
  return fma_team_gflops(std::max(threads, 1), steps);
}

double measure_read_bandwidth(int threads, size_t bytes, double seconds) {
  threads = std::max(threads, 1);
  // Each slice a whole number of 8 x 64-byte blocks, so every target's 8-vector loop covers it.
  const size_t quantum = 8 * 64 / sizeof(float);
  const size_t per_thread = std::max(quantum, bytes / sizeof(float) / size_t(threads) / quantum * quantum);
  ScratchPtr<float> buffer = scratch_array<float>(per_thread * size_t(threads));
  if (!buffer) return 0;
  // First touch by the thread that will read the slice (NUMA placement).
  timed_team(threads, [&](int t) { std::fill_n(buffer.get() + size_t(t) * per_thread, per_thread, 1.f); });
  int passes = 1;
  for (;;) {
    const double dt = timed_team(threads, [&](int t) {
      for (int p = 0; p < passes; ++p) g_sink.store(read_stream(buffer.get() + size_t(t) * per_thread, per_thread));
    });
    if (dt > seconds / 4 || passes > (1 << 20)) break;
    passes *= 2;
  }
  double best = 0;
  for (int run = 0; run < 3; ++run) {
    const double dt = timed_team(threads, [&](int t) {
      for (int p = 0; p < passes; ++p) g_sink.store(read_stream(buffer.get() + size_t(t) * per_thread, per_thread));
    });
    best = std::max(best, double(per_thread * sizeof(float)) * threads * passes / dt / 1e9);
  }
  return best;
}

double time_read_once(int threads, const void* const* buffers, const size_t* bytes, int n) {
  threads = std::max(threads, 1);
  // Slices of whole 8 x 64-byte blocks (read_stream's loop); a buffer's last few blocks, under
  // 512 x threads bytes, go unread.
  const size_t quantum = 8 * 64;
  return timed_team(threads, [&](int t) {
    for (int i = 0; i < n; ++i) {
      const size_t slice = bytes[i] / size_t(threads) / quantum * quantum;
      const float* at = reinterpret_cast<const float*>(static_cast<const char*>(buffers[i]) + size_t(t) * slice);
      g_sink.store(read_stream(at, slice / sizeof(float)));
    }
  });
}

}  // namespace ioattn::peers
