// One CUDA forward through the public C ABI, as a user calls it, for Nsight Compute's DRAM bytes
// (bench/traffic/gpu_ncu.sh, ABI_POINTS): bf16 (B, S, H, D) contiguous, default options with the
// CUDA backend, the library's own plan.
//
//   gpu_abi_run --batch B --heads H --seqlen S --dim D [--causal 0|1]
//
// The inputs are copied to the device with cudaMemcpy (no kernel), so every kernel the process
// launches is the call's. Exit 77 where no CUDA device is visible.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ioattn/ioattn.h"

namespace {

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "gpu_abi_run: CUDA error in %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// Deterministic bf16 values in [-1, 1), never all zero (zeros would hide unwritten outputs).
std::vector<uint16_t> values(size_t n, uint64_t seed) {
  std::vector<uint16_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint16_t& e : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const float f = float(int32_t(x >> 32)) * (1.f / 2147483648.f);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    e = uint16_t(bits >> 16);  // truncation: any bf16 value will do
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t b = 1, h = 16, s = 1024, d = 128, causal = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (f == "--batch")
      b = v;
    else if (f == "--heads")
      h = v;
    else if (f == "--seqlen")
      s = v;
    else if (f == "--dim")
      d = v;
    else if (f == "--causal")
      causal = v;
    else {
      std::fprintf(stderr, "gpu_abi_run: unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  if (!ioattn_backend_available(IOATTN_BACKEND_CUDA)) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  const size_t n = size_t(b * s * h * d);
  void* dev[4] = {};
  for (int t = 0; t < 4; ++t) {
    if (!ok(cudaMalloc(&dev[t], n * 2), "cudaMalloc")) return 1;
    const std::vector<uint16_t> host = values(n, uint64_t(t + 1));
    if (!ok(cudaMemcpy(dev[t], host.data(), n * 2, cudaMemcpyHostToDevice), "cudaMemcpy")) return 1;
  }
  ioattn_tensor q{dev[0], IOATTN_BF16, b, s, h, d, s * h * d, h * d, d};
  ioattn_tensor k = q, v = q, o = q;
  k.data = dev[1];
  v.data = dev[2];
  o.data = dev[3];
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.causal = int32_t(causal);
  opt.backend = IOATTN_BACKEND_CUDA;
  if (ioattn_forward(&q, &k, &v, &o, nullptr, &opt) != IOATTN_OK) {
    std::fprintf(stderr, "gpu_abi_run: ioattn_forward failed: %s\n", ioattn_last_error());
    return 1;
  }
  if (!ok(cudaDeviceSynchronize(), "the forward")) return 1;
  uint16_t first = 0;
  if (!ok(cudaMemcpy(&first, dev[3], sizeof first, cudaMemcpyDeviceToHost), "reading out[0]")) return 1;
  std::printf("ioattn-abi-run batch=%lld heads=%lld seqlen=%lld dim=%lld causal=%lld out0_bits=0x%04x\n", (long long)b,
              (long long)h, (long long)s, (long long)d, (long long)causal, unsigned(first));
  for (void* p : dev) cudaFree(p);
  return 0;
}
