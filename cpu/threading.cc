#include "cpu/threading.h"

#include <algorithm>

#if defined(IOATTN_THREADING_OPENMP)
#include <omp.h>
#elif defined(IOATTN_THREADING_TBB)
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#elif !defined(IOATTN_THREADING_SEQUENTIAL)
#error "define one of IOATTN_THREADING_OPENMP, IOATTN_THREADING_TBB, IOATTN_THREADING_SEQUENTIAL"
#endif

namespace ioattn::cpu {

void parallel_for(int64_t n_tasks, int n_threads, const std::function<void(int64_t, int)>& fn) {
  if (n_tasks <= 0) return;
  const int workers = static_cast<int>(std::min<int64_t>(std::max(n_threads, 1), n_tasks));
  if (workers == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
    return;
  }
#if defined(IOATTN_THREADING_OPENMP)
  // Chunks of one task: a task is a whole query tile (thousands of FMAs per key), so the
  // scheduling cost is noise and dynamic hand-out balances causal tiles of unequal length.
#pragma omp parallel num_threads(workers)
  {
    const int worker = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < n_tasks; ++t) fn(t, worker);
  }
#elif defined(IOATTN_THREADING_TBB)
  // An arena of `workers` slots (one of them the calling thread) bounds concurrency to what the
  // caller asked for even when the process-wide TBB pool is larger; current_thread_index() is
  // the slot, hence in [0, workers).
  tbb::task_arena arena(workers);
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, n_tasks, 1),
        [&](const tbb::blocked_range<int64_t>& range) {
          const int worker = tbb::this_task_arena::current_thread_index();
          for (int64_t t = range.begin(); t < range.end(); ++t) fn(t, worker);
        },
        tbb::simple_partitioner());
  });
#else
  for (int64_t t = 0; t < n_tasks; ++t) fn(t, 0);
#endif
}

const char* threading_runtime_name() {
#if defined(IOATTN_THREADING_OPENMP)
  return "openmp";
#elif defined(IOATTN_THREADING_TBB)
  return "tbb";
#else
  return "sequential";
#endif
}

}  // namespace ioattn::cpu
