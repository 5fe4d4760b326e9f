// Device discovery for the CUDA backend and the hardware profile the planner reads for the GPU.
#include <cuda_runtime.h>

#include <cstdio>
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

std::string pointer_text(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

}  // namespace

namespace gpu {

bool query_cuda_device(HardwareProfile* out) {
  int device = 0, clock_khz = 0, mem_clock_khz = 0;
  cudaDeviceProp prop{};
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaGetDeviceProperties(&prop, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, device);
  if (err != cudaSuccess) {
    // Consumed, so the failure cannot resurface in a later launch check as that launch's own.
    cudaGetLastError();
    return false;
  }

  const std::string source = "cudaGetDeviceProperties(device " + std::to_string(device) + ")";
  HardwareProfile hw;
  hw.name = "cuda:" + std::to_string(device);
  hw.description =
      std::string(prop.name) + ", compute capability " + std::to_string(prop.major) + "." + std::to_string(prop.minor);
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
  hw.compute_capability = prop.major * 10 + prop.minor;

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

bool available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess) return count > 0;
  // No driver or no device: consumed, so it cannot resurface in the caller's next launch check.
  cudaGetLastError();
  return false;
}

Status download(void* host_dst, const void* device_src, size_t bytes, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  // The copy must finish before validation reads it, and a stream capturing a graph cannot
  // synchronize: refused up front, so the caller's capture is not invalidated by a failed sync.
  // On the legacy stream while a blocking stream captures, the query itself fails
  // (cudaErrorStreamCaptureImplicit) without invalidating that capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(s, &capture);
  if (err == cudaSuccess && capture != cudaStreamCaptureStatusNone)
    return Status::unsupported("backend=CUDA: opt.cuda_stream is capturing a CUDA graph; this entry point reads " +
                               std::to_string(bytes) +
                               " bytes of metadata (seqlens, block table or cu_seqlens) on the host before it "
                               "writes anything, which a capture cannot do");
  if (err == cudaSuccess) err = cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  if (err != cudaSuccess) {
    // The runtime keeps the failure as this thread's last error. Left there, the next launch
    // check (this library's cudaGetLastError after a launch, or the caller's) would report it as
    // its own failure, so the next valid call would fail too.
    cudaGetLastError();
    return Status::backend("backend=CUDA: copying " + std::to_string(bytes) +
                           " bytes of metadata (seqlens, block table or cu_seqlens) to the host on opt.cuda_stream=" +
                           pointer_text(stream) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
  return Status::ok();
}

}  // namespace gpu
}  // namespace ioattn
