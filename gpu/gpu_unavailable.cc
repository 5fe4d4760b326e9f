// The CUDA backend of a build without CUDA: every call says so instead of falling back.
#include "gpu/gpu_backend.h"

namespace ioattn::gpu {

bool query_cuda_device(HardwareProfile*) { return false; }

bool available() { return false; }

Status check_supported(const AttnParams&) {
  return Status::unsupported(
      "backend=CUDA: this build of ioattn was compiled without CUDA (IOATTN_CUDA=OFF or no nvcc)");
}

Status forward(const AttnParams&) {
  return Status::unsupported(
      "backend=CUDA: this build of ioattn was compiled without CUDA (IOATTN_CUDA=OFF or no nvcc)");
}

std::string forward_kernel(const AttnParams&) { return ""; }

Status forward_kvcache(const AttnParams&, const KvAppend*) {
  return Status::unsupported(
      "backend=CUDA: this build of ioattn was compiled without CUDA (IOATTN_CUDA=OFF or no nvcc)");
}

Status download(void*, const void*, size_t, void*) {
  return Status::unsupported(
      "backend=CUDA: this build of ioattn was compiled without CUDA (IOATTN_CUDA=OFF or no nvcc)");
}

}  // namespace ioattn::gpu
