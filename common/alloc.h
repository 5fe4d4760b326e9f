// Scratch allocation for the kernels: 64-byte aligned (a cache line, and the widest vector),
// never throwing, and with a test hook that makes the n-th allocation fail so out-of-memory
// handling can be exercised.
#pragma once

#include <cstddef>
#include <memory>

namespace ioattn {

// nullptr on failure (real or injected).
void* scratch_alloc(size_t bytes);
void scratch_free(void* p);

struct ScratchDeleter {
  void operator()(void* p) const { scratch_free(p); }
};
template <class T>
using ScratchPtr = std::unique_ptr<T[], ScratchDeleter>;

template <class T>
ScratchPtr<T> scratch_array(size_t count) {
  return ScratchPtr<T>(static_cast<T*>(scratch_alloc(count * sizeof(T))));
}

namespace testing {
// After `successes` more successful scratch allocations, the next one fails (process-wide;
// -1 disables). Used only by tests.
void fail_scratch_alloc_after(long successes);
}  // namespace testing

}  // namespace ioattn
