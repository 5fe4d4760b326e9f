// Threads: the parallel_for contract, bitwise determinism across thread counts and repeated
// runs (with and without key splits), many callers at once, and calls from inside a caller's
// own parallel region.
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/threading.h"
#include "tests/catch.h"
#include "tests/support/support.h"

#if defined(IOATTN_THREADING_OPENMP)
#include <omp.h>
#elif defined(IOATTN_THREADING_TBB)
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#endif

using ioattn::DType;
using ioattn::test::AttnBuffers;
using ioattn::test::AttnCase;

TEST_CASE("parallel_for runs every task once on worker ids below the thread count", "[cpu][threads]") {
  for (int threads : {1, 2, 3, 8}) {
    for (int64_t tasks : {0, 1, 5, 1000}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(tasks));
      std::atomic<int> bad_worker{0};
      ioattn::cpu::parallel_for(tasks, threads, [&](int64_t t, int worker) {
        seen[size_t(t)].fetch_add(1);
        if (worker < 0 || worker >= threads) bad_worker.fetch_add(1);
      });
      INFO(ioattn::cpu::threading_runtime_name() << " threads " << threads << " tasks " << tasks);
      CHECK(bad_worker.load() == 0);
      for (auto& s : seen) CHECK(s.load() == 1);
    }
  }
}

TEST_CASE("outputs are bitwise identical for 1, 2 and 3 threads and across repeated runs", "[cpu][threads]") {
  std::vector<AttnCase> cases;
  AttnCase c;
  c.batch = 2;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.seqlen_q = 150;
  c.seqlen_k = 170;
  c.head_dim = 64;
  c.causal = true;
  cases.push_back(c);
  c.dtype = DType::bf16;
  c.tiling = {24, 32, 3};  // forced key splits: the merge order must not depend on threads
  cases.push_back(c);
  c.dtype = DType::f16;
  c.seqlen_q = 1;  // decode: the planner splits the keys by itself
  c.seqlen_k = 1000;
  c.causal = false;
  c.tiling = {};
  cases.push_back(c);
  for (const AttnCase& base : cases) {
    std::mt19937 rng(21);
    AttnBuffers first(base);
    first.randomize(rng);
    AttnCase one = base;
    one.threads = 1;
    REQUIRE(ioattn::test::run_cpu_kernel(one, first).is_ok());
    for (int threads : {1, 2, 3}) {
      for (int repeat = 0; repeat < 2; ++repeat) {
        AttnBuffers again = first;
        again.reset_outputs();
        AttnCase t = base;
        t.threads = threads;
        REQUIRE(ioattn::test::run_cpu_kernel(t, again).is_ok());
        INFO(t.describe() << " repeat " << repeat);
        CHECK(ioattn::test::bitwise_equal(first, again));
      }
    }
    const ioattn::test::Verdict v = ioattn::test::check_against_reference(one, first);
    INFO(v.report());
    CHECK(v.ok);
  }
}

TEST_CASE("many threads calling the library at once get correct results", "[cpu][threads]") {
  AttnCase c;
  c.heads_q = 2;
  c.seqlen_q = 40;
  c.seqlen_k = 60;
  c.head_dim = 32;
  c.causal = true;
  c.threads = 2;
  std::mt19937 rng(31);
  AttnBuffers reference(c);
  reference.randomize(rng);
  REQUIRE(ioattn::test::run_cpu_kernel(c, reference).is_ok());
  std::vector<AttnBuffers> copies(6, reference);
  std::vector<int> ok(copies.size(), 0);
  std::vector<std::thread> callers;
  for (size_t i = 0; i < copies.size(); ++i) {
    callers.emplace_back([&, i] {
      copies[i].reset_outputs();
      ok[i] = ioattn::test::run_cpu_kernel(c, copies[i]).is_ok() ? 1 : 0;
    });
  }
  for (auto& t : callers) t.join();
  for (size_t i = 0; i < copies.size(); ++i) {
    CHECK(ok[i] == 1);
    CHECK(ioattn::test::bitwise_equal(reference, copies[i]));
  }
}

#if defined(IOATTN_THREADING_OPENMP)
TEST_CASE("called from inside an OpenMP parallel region: no oversubscription, same bits", "[cpu][threads]") {
  AttnCase c;
  c.heads_q = 4;
  c.seqlen_q = 30;
  c.seqlen_k = 50;
  c.head_dim = 16;
  c.threads = 4;
  std::mt19937 rng(41);
  AttnBuffers reference(c);
  reference.randomize(rng);
  REQUIRE(ioattn::test::run_cpu_kernel(c, reference).is_ok());
  std::vector<AttnBuffers> copies(2, reference);
  std::atomic<int> failures{0};
  std::atomic<int> max_team{0};
#pragma omp parallel num_threads(2)
  {
    const int me = omp_get_thread_num();
    copies[size_t(me)].reset_outputs();
    if (!ioattn::test::run_cpu_kernel(c, copies[size_t(me)]).is_ok()) failures.fetch_add(1);
    ioattn::cpu::parallel_for(4, 4, [&](int64_t, int) {
      int team = omp_get_num_threads();
      int seen = max_team.load();
      while (team > seen && !max_team.compare_exchange_weak(seen, team)) {
      }
    });
  }
  CHECK(failures.load() == 0);
  CHECK(max_team.load() == 1);  // nested parallelism is off: the inner loop runs on its caller
  for (const auto& copy : copies) CHECK(ioattn::test::bitwise_equal(reference, copy));
}
#endif

#if defined(IOATTN_THREADING_TBB)
TEST_CASE("called from inside the caller's own TBB loop: bounded arena, same bits", "[cpu][threads]") {
  AttnCase c;
  c.heads_q = 4;
  c.seqlen_q = 30;
  c.seqlen_k = 50;
  c.head_dim = 16;
  c.threads = 2;
  std::mt19937 rng(61);
  AttnBuffers reference(c);
  reference.randomize(rng);
  REQUIRE(ioattn::test::run_cpu_kernel(c, reference).is_ok());
  std::vector<AttnBuffers> copies(4, reference);
  std::atomic<int> failures{0}, over{0};
  tbb::parallel_for(0, 4, [&](int i) {
    copies[size_t(i)].reset_outputs();
    if (!ioattn::test::run_cpu_kernel(c, copies[size_t(i)]).is_ok()) failures.fetch_add(1);
    ioattn::cpu::parallel_for(8, 2, [&](int64_t, int) {
      if (tbb::this_task_arena::max_concurrency() > 2) over.fetch_add(1);
    });
  });
  CHECK(failures.load() == 0);
  CHECK(over.load() == 0);  // the library's arena is capped at the requested threads
  for (const auto& copy : copies) CHECK(ioattn::test::bitwise_equal(reference, copy));
}
#endif

TEST_CASE("head mode (K/V packed once per head) and tile mode give the same bits", "[cpu][threads]") {
  // One kv head with several query tiles: one worker packs the head once (head mode), two
  // workers split its tiles (tile mode, each tile packing its own blocks). Prefill and masks.
  for (bool causal : {false, true}) {
    AttnCase c;
    c.heads_q = 3;
    c.heads_kv = 1;
    c.seqlen_q = 200;
    c.seqlen_k = 230;
    c.head_dim = 40;
    c.causal = causal;
    c.window_left = causal ? 70 : -1;
    c.dtype = causal ? DType::bf16 : DType::f32;
    c.tiling = {48, 40, 1};
    std::mt19937 rng(51);
    AttnBuffers head_mode(c);
    head_mode.randomize(rng);
    AttnBuffers tile_mode = head_mode;
    c.threads = 1;
    REQUIRE(ioattn::test::run_cpu_kernel(c, head_mode).is_ok());
    c.threads = 2;
    REQUIRE(ioattn::test::run_cpu_kernel(c, tile_mode).is_ok());
    INFO(c.describe());
    CHECK(ioattn::test::bitwise_equal(head_mode, tile_mode));
    const ioattn::test::Verdict v = ioattn::test::check_against_reference(c, tile_mode);
    INFO(v.report());
    CHECK(v.ok);
  }
}
