// libFuzzer entry over the C ABI; the decoding and every invariant live in
// tests/support/api_case.h, which the replay test (tests/test_fuzz_regressions.cc) shares.
#include <cstdio>
#include <cstdlib>

#include "tests/support/api_case.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string failure = ioattn::fuzz::run_case(data, size);
  if (!failure.empty()) {
    std::fprintf(stderr, "fuzz_api: contract violated: %s\n", failure.c_str());
    std::abort();
  }
  return 0;
}
