// The main of every GPU test binary (tests/test_gpu_*.cc): exit 77, which ctest reports as
// "Skipped", where no CUDA device is visible, the build has no CUDA backend, or the device is not
// one the binary's kernels run on, so a machine without one never counts these tests as passed.
// Catch2 v2 compiles its session runner into the translation unit that defines
// CATCH_CONFIG_RUNNER; v3 has it in the library and ignores the macro.
#define CATCH_CONFIG_RUNNER
#include <cstdio>
#include <string>

#include "tests/catch.h"

#if IOATTN_HAVE_CUDA
#include <cuda_runtime.h>

// A binary whose kernels need a particular device (tests/test_gpu_sm90.cc: compute capability
// 9.0) defines this, saying in *why what is missing; the default takes any device.
__attribute__((weak)) bool gpu_test_device_ok(std::string*) { return true; }
#endif

int main(int argc, char** argv) {
#if IOATTN_HAVE_CUDA
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  std::string why;
  if (!gpu_test_device_ok(&why)) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return 77;
  }
  return Catch::Session().run(argc, argv);
#else
  (void)argc;
  (void)argv;
  std::printf("SKIPPED: no CUDA device (this build has no CUDA backend)\n");
  return 77;
#endif
}
