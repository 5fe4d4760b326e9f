#include "common/alloc.h"

#include <atomic>
#include <cstdlib>

namespace ioattn {
namespace {
std::atomic<long> g_successes_before_failure{-1};
}

void* scratch_alloc(size_t bytes) {
  long budget = g_successes_before_failure.load(std::memory_order_relaxed);
  while (budget >= 0) {
    if (g_successes_before_failure.compare_exchange_weak(budget, budget - 1)) {
      if (budget == 0) {
        g_successes_before_failure.store(-1);
        return nullptr;
      }
      break;
    }
  }
  constexpr size_t kAlign = 64;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  return std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
}

void scratch_free(void* p) { std::free(p); }

namespace testing {
void fail_scratch_alloc_after(long successes) { g_successes_before_failure.store(successes); }
}  // namespace testing

}  // namespace ioattn
