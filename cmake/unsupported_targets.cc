// Prints the Highway targets this build would compile but this CPU cannot run, as a constant
// for HWY_DISABLED_TARGETS (CMakeLists.txt, IOATTN_SIMD_TARGETS=host).
#include <cinttypes>
#include <cstdio>

#include "hwy/targets.h"

int main() {
  std::printf("0x%" PRIx64 "LL", static_cast<uint64_t>(HWY_TARGETS & ~hwy::SupportedTargets()));
  return 0;
}
