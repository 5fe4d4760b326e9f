// The one threading interface of the CPU backend. The runtime is chosen at build time
// (IOATTN_THREADING: openmp, tbb or sequential); kernels only see parallel_for.
#pragma once

#include <cstdint>
#include <functional>

namespace ioattn::cpu {

// Runs fn(task, worker) once for every task in [0, n_tasks) on at most n_threads workers, each
// worker id in [0, min(n_threads, n_tasks)), so per-worker scratch can be indexed by it. Tasks are
// handed out dynamically (their costs differ, e.g. causal query blocks); results must therefore
// not depend on which worker runs a task. Inside a caller's own OpenMP parallel region the OpenMP
// backend runs the team it is given (nested parallelism off: one thread); the oneTBB backend
// runs in its own task_arena capped at n_threads, so a caller's TBB pool is never oversubscribed.
// fn must not throw.
void parallel_for(int64_t n_tasks, int n_threads, const std::function<void(int64_t task, int worker)>& fn);

// Name of the compiled-in runtime: "openmp", "tbb" or "sequential".
const char* threading_runtime_name();

}  // namespace ioattn::cpu
