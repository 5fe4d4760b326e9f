// Device discovery for the CUDA backend and the hardware profile the planner reads for the GPU.
#include <cuda_runtime.h>

#include <string>

#include "common/hardware.h"
#include "gpu/gpu_backend.h"

namespace ioattn {
namespace {

// Dense 16-bit tensor-core FLOP per SM per clock, from the vendors' datasheets: A100 312 TFLOP/s
// = 108 SMs x 1.41 GHz x 2048; H100/H200 SXM 989 TFLOP/s = 132 x 1.83 GHz x 4096. Unknown
// architectures report 0 (no claimed peak) rather than a guess.
double tensor_flop_per_sm_clock(int major, int minor) {
  if (major == 8 && minor == 0) return 2048;
  if (major == 9 && minor == 0) return 4096;
  return 0;
}

}  // namespace

bool query_cuda_device(HardwareProfile* out) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return false;
  int clock_khz = 0, mem_clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device);
  cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, device);

  const std::string source = "cudaGetDeviceProperties(device " + std::to_string(device) + ")";
  HardwareProfile hw;
  hw.name = "cuda:" + std::to_string(device);
  hw.description = std::string(prop.name) + ", compute capability " + std::to_string(prop.major) + "." +
                   std::to_string(prop.minor);
  hw.kind = DeviceKind::gpu;
  hw.cores = prop.multiProcessorCount;
  hw.clock_ghz = clock_khz * 1e-6;
  // fp32 FMA lanes per SM: 64 on sm_80 (A100: 108 x 64 x 2 x 1.41 GHz = 19.5 TFLOP/s), 128 on
  // later architectures; an FMA counts 2 FLOP.
  const int fp32_lanes = prop.major == 8 && prop.minor == 0 ? 64 : 128;
  hw.fma_gflops_per_core = 2.0 * fp32_lanes * hw.clock_ghz;
  hw.tensor_tflops = tensor_flop_per_sm_clock(prop.major, prop.minor) * hw.cores * hw.clock_ghz * 1e-3;
  hw.smem_per_block_bytes = int64_t(prop.sharedMemPerBlockOptin);
  hw.regs_per_sm = prop.regsPerMultiprocessor;

  MemoryLevel smem;
  smem.name = "smem";
  smem.size_bytes = int64_t(prop.sharedMemPerMultiprocessor);
  smem.shared_by = 1;
  smem.line_bytes = 128;
  smem.source = source;
  MemoryLevel l2;
  l2.name = "L2";
  l2.size_bytes = prop.l2CacheSize;
  l2.shared_by = hw.cores;
  l2.line_bytes = 128;
  l2.source = source;
  MemoryLevel hbm;
  hbm.name = "HBM";
  hbm.shared_by = hw.cores;
  hbm.line_bytes = 32;
  // Double data rate: two transfers per memory clock over the whole bus.
  hbm.bandwidth_gbs = 2.0 * mem_clock_khz * 1e3 * (prop.memoryBusWidth / 8) * 1e-9;
  hbm.source = source + ": memory clock x bus width x 2";
  hw.levels = {smem, l2, hbm};
  hw.source = source;
  *out = hw;
  return true;
}

namespace gpu {

bool available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

Status download(void* host_dst, const void* device_src, size_t bytes, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err != cudaSuccess)
    return Status::backend("backend=CUDA: copying " + std::to_string(bytes) +
                           " bytes of metadata (seqlens, block table or cu_seqlens) to the host: " +
                           cudaGetErrorString(err));
  return Status::ok();
}

}  // namespace gpu
}  // namespace ioattn
