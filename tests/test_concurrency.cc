// Many callers at once: at least 16 threads call ioattn_forward and ioattn_forward_kvcache (on
// per-thread caches) with different shapes and thread counts for a bounded time, and every
// result must equal, bit for bit, the single-caller result computed before they start. Also
// from inside an OpenMP parallel region or oneTBB tasks, whichever runtime this build threads
// with. A watchdog turns a deadlock into a failure, and the process's thread count is sampled
// so a runtime that piles up threads (oversubscription) fails the bound.
//
// IOATTN_CONCURRENCY_SECONDS sets how long the main stress runs (default 5).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "ioattn/ioattn.h"
#include "tests/catch.h"
#include "tests/support/support.h"

#if defined(IOATTN_THREADING_OPENMP)
#include <omp.h>
#endif
#if defined(IOATTN_THREADING_TBB)
#include <tbb/parallel_for.h>
#include <tbb/task_group.h>
#endif

namespace {

using ioattn::DType;
using ioattn::test::AttnBuffers;
using ioattn::test::AttnCase;

constexpr int kCallers = 16;

double stress_seconds() {
  const char* env = std::getenv("IOATTN_CONCURRENCY_SECONDS");
  const double s = env ? std::atof(env) : 5.0;
  return s > 0 ? s : 5.0;
}

int process_threads() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  return 0;
}

// Aborts the process when a section outlives its budget by far (a deadlock hangs forever; ctest
// would only report a timeout without saying where), and records the peak thread count.
class Watchdog {
 public:
  Watchdog(const char* section, double budget_seconds) : section_(section) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t((budget_seconds * 4 + 120) * 1000));
    thread_ = std::thread([this, deadline] {
      while (!done_.load()) {
        peak_.store(std::max(peak_.load(), process_threads()));
        if (std::chrono::steady_clock::now() > deadline) {
          std::fprintf(stderr, "test_concurrency: '%s' still running long past its budget: deadlock?\n", section_);
          std::_Exit(3);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  }
  ~Watchdog() { stop(); }
  int stop() {
    done_.store(true);
    if (thread_.joinable()) thread_.join();
    return peak_.load();
  }

 private:
  const char* section_;
  std::atomic<bool> done_{false};
  std::atomic<int> peak_{0};
  std::thread thread_;
};

// Dense problems of different shapes, masks, dtypes and thread counts.
std::vector<AttnCase> dense_cases() {
  std::vector<AttnCase> cases;
  const struct {
    int64_t b, hq, hkv, sq, sk, d;
    DType dt;
    bool causal;
    int64_t wl;
    float softcap;
    int threads;
  } grid[] = {
      {1, 4, 4, 33, 65, 32, DType::f32, false, -1, 0.f, 1}, {2, 4, 2, 17, 17, 64, DType::f32, true, -1, 0.f, 2},
      {1, 8, 1, 1, 129, 64, DType::f16, false, -1, 0.f, 3}, {1, 2, 2, 64, 48, 16, DType::bf16, true, 8, 0.f, 4},
      {3, 2, 1, 9, 31, 40, DType::f32, false, 4, 30.f, 2},  {1, 6, 3, 50, 50, 96, DType::f16, true, -1, 0.f, 1},
      {2, 1, 1, 128, 7, 8, DType::f32, false, -1, 5.f, 3},  {1, 4, 2, 40, 97, 128, DType::bf16, false, 16, 0.f, 4},
  };
  for (const auto& g : grid) {
    AttnCase c;
    c.batch = g.b, c.heads_q = g.hq, c.heads_kv = g.hkv, c.seqlen_q = g.sq, c.seqlen_k = g.sk, c.head_dim = g.d;
    c.dtype = g.dt, c.causal = g.causal, c.window_left = g.wl, c.softcap = g.softcap, c.threads = g.threads;
    cases.push_back(c);
  }
  return cases;
}

// One KV-cache request with its own cache: B sequences of different cached lengths, a paged or
// contiguous cache in f32 or f16, Snew appended tokens.
struct KvCase {
  int64_t batch = 1, heads_q = 1, heads_kv = 1, dim = 1, capacity = 1, seqlen_q = 1, seqlen_new = 0;
  int32_t cache_dtype = IOATTN_F32;
  bool paged = false;
  int threads = 1;
  std::vector<int32_t> seqlens, block_table;
  int64_t page_size = 4;
  std::vector<float> q, k_new, v_new;
  std::vector<unsigned char> k_cache, v_cache;  // pristine contents

  int64_t pages() const { return batch * ((capacity + page_size - 1) / page_size); }
  int64_t cache_rows() const { return paged ? pages() * page_size : batch * capacity; }
  size_t cache_bytes() const { return size_t(cache_rows() * heads_kv * dim * (cache_dtype == IOATTN_F32 ? 4 : 2)); }
};

struct KvResult {
  std::vector<float> out, lse;
  std::vector<unsigned char> k_cache, v_cache;
  bool operator==(const KvResult& o) const {
    auto same = [](const auto& a, const auto& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    return same(out, o.out) && same(lse, o.lse) && same(k_cache, o.k_cache) && same(v_cache, o.v_cache);
  }
};

KvCase make_kv_case(uint32_t seed, int64_t batch, int64_t hq, int64_t hkv, int64_t dim, int64_t sq, int64_t snew,
                    int32_t cache_dtype, bool paged, int threads) {
  KvCase c;
  c.batch = batch, c.heads_q = hq, c.heads_kv = hkv, c.dim = dim, c.capacity = 48, c.seqlen_q = sq;
  c.seqlen_new = snew, c.cache_dtype = cache_dtype, c.paged = paged, c.threads = threads;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int32_t> len(0, int32_t(c.capacity - snew));
  for (int64_t b = 0; b < batch; ++b) c.seqlens.push_back(len(rng));
  if (paged) {
    c.block_table.resize(size_t(c.pages()));
    for (size_t i = 0; i < c.block_table.size(); ++i) c.block_table[i] = int32_t(i);
    std::shuffle(c.block_table.begin(), c.block_table.end(), rng);
  }
  auto fill = [&](std::vector<float>& v, int64_t n) {
    v.resize(size_t(n));
    for (float& x : v) x = normal(rng);
  };
  fill(c.q, batch * sq * hq * dim);
  fill(c.k_new, batch * snew * hkv * dim);
  fill(c.v_new, batch * snew * hkv * dim);
  for (auto* cache : {&c.k_cache, &c.v_cache}) {
    cache->resize(c.cache_bytes());
    const int64_t n = c.cache_rows() * hkv * dim;
    for (int64_t i = 0; i < n; ++i) ioattn::store_from_f32(cache->data(), i, DType(cache_dtype), normal(rng));
  }
  return c;
}

// Runs one KV case from its pristine cache; the caller's own copy of the cache is `r`.
ioattn_status run_kv(const KvCase& c, KvResult& r) {
  r.k_cache = c.k_cache;
  r.v_cache = c.v_cache;
  r.out.assign(size_t(c.batch * c.seqlen_q * c.heads_q * c.dim), -1.f);
  r.lse.assign(size_t(c.batch * c.heads_q * c.seqlen_q), -1.f);
  auto dense = [](void* data, int32_t dt, int64_t b, int64_t s, int64_t h, int64_t d) {
    return ioattn_tensor{data, dt, b, s, h, d, s * h * d, h * d, d};
  };
  ioattn_tensor q = dense(const_cast<float*>(c.q.data()), IOATTN_F32, c.batch, c.seqlen_q, c.heads_q, c.dim);
  ioattn_tensor out = dense(r.out.data(), IOATTN_F32, c.batch, c.seqlen_q, c.heads_q, c.dim);
  ioattn_tensor k_new = dense(const_cast<float*>(c.k_new.data()), IOATTN_F32, c.batch, c.seqlen_new, c.heads_kv, c.dim);
  ioattn_tensor v_new = dense(const_cast<float*>(c.v_new.data()), IOATTN_F32, c.batch, c.seqlen_new, c.heads_kv, c.dim);
  ioattn_kvcache cache{};
  const int64_t outer = c.paged ? c.pages() : c.batch, rows = c.paged ? c.page_size : c.capacity;
  cache.k = dense(r.k_cache.data(), c.cache_dtype, outer, rows, c.heads_kv, c.dim);
  cache.v = dense(r.v_cache.data(), c.cache_dtype, outer, rows, c.heads_kv, c.dim);
  cache.seqlens = c.seqlens.data();
  if (c.paged) {
    cache.block_table = c.block_table.data();
    cache.max_pages_per_seq = int32_t(c.pages() / c.batch);
  }
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.causal = 1;
  opt.num_threads = c.threads;
  return ioattn_forward_kvcache(&q, &cache, &k_new, &v_new, &out, r.lse.data(), &opt);
}

std::vector<KvCase> kv_cases() {
  return {make_kv_case(1, 2, 4, 2, 32, 1, 1, IOATTN_F32, false, 1),
          make_kv_case(2, 3, 8, 1, 64, 1, 2, IOATTN_F16, true, 2),
          make_kv_case(3, 1, 4, 4, 16, 5, 5, IOATTN_BF16, true, 3),
          make_kv_case(4, 2, 2, 2, 128, 3, 3, IOATTN_F32, true, 4)};
}

// The single-caller results every concurrent call must reproduce.
struct Expected {
  std::vector<AttnCase> dense = dense_cases();
  std::vector<AttnBuffers> dense_out;
  std::vector<KvCase> kv = kv_cases();
  std::vector<KvResult> kv_out;

  Expected() {
    std::mt19937 rng(2024);
    for (const AttnCase& c : dense) {
      dense_out.emplace_back(c);
      dense_out.back().randomize(rng);
      REQUIRE(ioattn::test::run_c_abi(c, dense_out.back()) == IOATTN_OK);
    }
    for (const KvCase& c : kv) {
      kv_out.emplace_back();
      REQUIRE(run_kv(c, kv_out.back()) == IOATTN_OK);
    }
  }
};

// One caller's private buffers: inputs copied from the expected ones, outputs its own.
struct Caller {
  std::vector<AttnBuffers> dense;
  std::vector<KvResult> kv;
  explicit Caller(const Expected& e) : dense(e.dense_out), kv(e.kv.size()) {}

  // Runs case `i` (dense first, then KV) and compares; false on any difference or error.
  bool run(const Expected& e, size_t i, std::string* why) {
    if (i < e.dense.size()) {
      dense[i].reset_outputs();
      const ioattn_status s = ioattn::test::run_c_abi(e.dense[i], dense[i]);
      if (s != IOATTN_OK) return *why = "dense " + e.dense[i].describe() + ": " + ioattn_last_error(), false;
      if (!ioattn::test::bitwise_equal(dense[i], e.dense_out[i])) return *why = "dense " + e.dense[i].describe(), false;
      return true;
    }
    const size_t k = i - e.dense.size();
    const ioattn_status s = run_kv(e.kv[k], kv[k]);
    if (s != IOATTN_OK) return *why = "kv case " + std::to_string(k) + ": " + ioattn_last_error(), false;
    if (!(kv[k] == e.kv_out[k])) return *why = "kv case " + std::to_string(k), false;
    return true;
  }
};

struct Tally {
  std::atomic<int64_t> calls{0}, mismatches{0};
  std::mutex mu;
  std::string first;
  void record(bool ok, const std::string& why) {
    calls.fetch_add(1);
    if (ok) return;
    mismatches.fetch_add(1);
    std::lock_guard<std::mutex> lock(mu);
    if (first.empty()) first = why;
  }
};

// Threads the process may hold: the callers, each with a team of at most 4 workers (the largest
// num_threads used) and as many again on their way out (libgomp releases a caller's surplus pool
// threads when its team shrinks and starts new ones when it grows, and /proc still counts the
// old ones for a moment), the runtime's own pool (one per core), Catch2, and the watchdog. A
// thread leaked per call would pass it within the first hundred calls.
int thread_bound(int callers) { return callers * 4 * 2 + 2 * int(std::thread::hardware_concurrency()) + 8; }

}  // namespace

TEST_CASE("16+ threads calling dense and KV-cache entry points at once reproduce single-caller bits", "[concurrency]") {
  const Expected expected;
  const size_t n_cases = expected.dense.size() + expected.kv.size();
  const double seconds = stress_seconds();
  Tally tally;
  Watchdog watchdog("std::thread callers", seconds);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(seconds * 1000));
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      Caller me(expected);
      std::string why;
      // Each caller starts on a different case so all shapes and thread counts overlap in time.
      for (size_t it = size_t(t); std::chrono::steady_clock::now() < deadline; ++it)
        tally.record(me.run(expected, it % n_cases, &why), why);
    });
  }
  for (auto& c : callers) c.join();
  const int peak = watchdog.stop();
  std::printf("test_concurrency: %d callers, %.1f s, %lld calls, %lld mismatches, peak %d threads\n", kCallers, seconds,
              (long long)tally.calls.load(), (long long)tally.mismatches.load(), peak);
  INFO("first mismatch: " << tally.first);
  CHECK(tally.mismatches.load() == 0);
  CHECK(tally.calls.load() >= int64_t(kCallers * n_cases));
  CHECK(peak <= thread_bound(kCallers));
}

#if defined(IOATTN_THREADING_OPENMP)
TEST_CASE("calls from inside an OpenMP parallel region reproduce single-caller bits", "[concurrency]") {
  const Expected expected;
  const size_t n_cases = expected.dense.size() + expected.kv.size();
  Tally tally;
  Watchdog watchdog("OpenMP region callers", 10);
  // Nested parallelism is left at the runtime's default (off), so each call inside the region
  // runs on its caller's thread: no team of teams.
#pragma omp parallel num_threads(kCallers)
  {
    Caller me(expected);
    std::string why;
    for (size_t i = 0; i < 2 * n_cases; ++i)
      tally.record(me.run(expected, (size_t(omp_get_thread_num()) + i) % n_cases, &why), why);
  }
  const int peak = watchdog.stop();
  INFO("first mismatch: " << tally.first);
  CHECK(tally.mismatches.load() == 0);
  CHECK(tally.calls.load() == int64_t(kCallers * 2 * n_cases));
  CHECK(peak <= thread_bound(kCallers));
}
#endif

#if defined(IOATTN_THREADING_TBB)
TEST_CASE("calls from inside oneTBB tasks reproduce single-caller bits", "[concurrency]") {
  const Expected expected;
  const size_t n_cases = expected.dense.size() + expected.kv.size();
  Tally tally;
  Watchdog watchdog("oneTBB task callers", 10);
  // The library's own parallel loop runs inside the caller's task: it must neither wait on
  // itself (deadlock) nor start a second pool.
  tbb::parallel_for(0, kCallers * 2, [&](int task) {
    Caller me(expected);
    std::string why;
    for (size_t i = 0; i < n_cases; ++i) tally.record(me.run(expected, (size_t(task) + i) % n_cases, &why), why);
  });
  tbb::task_group group;
  for (int task = 0; task < kCallers; ++task) {
    group.run([&, task] {
      Caller me(expected);
      std::string why;
      tally.record(me.run(expected, size_t(task) % n_cases, &why), why);
    });
  }
  group.wait();
  const int peak = watchdog.stop();
  INFO("first mismatch: " << tally.first);
  CHECK(tally.mismatches.load() == 0);
  CHECK(tally.calls.load() == int64_t(kCallers * 2 * n_cases + kCallers));
  CHECK(peak <= thread_bound(kCallers));
}
#endif
