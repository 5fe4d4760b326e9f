#include "tools/device_buffer.h"

#include <string>

#include "tools/cli.h"

#if defined(IOATTN_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace ioattn::cli {

#if defined(IOATTN_HAVE_CUDA)

namespace {
void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  const std::string msg = std::string(what) + ": " + cudaGetErrorString(e);
  if (e == cudaErrorMemoryAllocation) throw internal_error("out of device memory: " + msg);
  throw internal_error(msg);
}
}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes_ > 0) check(cudaMalloc(&ptr_, bytes_), "cudaMalloc");
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}
void DeviceBuffer::upload(const void* host) {
  if (bytes_ > 0) check(cudaMemcpy(ptr_, host, bytes_, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}
void DeviceBuffer::download(void* host) const {
  if (bytes_ > 0) check(cudaMemcpy(host, ptr_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}
void device_synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

#else

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes_ > 0) throw unsupported_error("--backend cuda: this build has no CUDA backend");
}
DeviceBuffer::~DeviceBuffer() = default;
void DeviceBuffer::upload(const void*) {}
void DeviceBuffer::download(void*) const {}
void device_synchronize() {}

#endif

}  // namespace ioattn::cli
