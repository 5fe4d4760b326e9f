// The CUDA backend of a build without CUDA: every call says so instead of falling back.
#include "gpu/gpu_backend.h"

namespace ioattn {

bool query_cuda_device(HardwareProfile*) { return false; }

}  // namespace ioattn

namespace ioattn::gpu {

bool available() { return false; }

Status check_supported(const AttnParams&) {
  return Status::unsupported("backend=CUDA: this build of ioattn was compiled without CUDA (IOATTN_CUDA=OFF or no nvcc)");
}

Status forward(const AttnParams&) {
  return Status::unsupported("backend=CUDA: this build of ioattn was compiled without CUDA (IOATTN_CUDA=OFF or no nvcc)");
}

Status forward_kvcache(const AttnParams&, const KvAppend*) {
  return Status::unsupported("backend=CUDA: this build of ioattn was compiled without CUDA (IOATTN_CUDA=OFF or no nvcc)");
}

}  // namespace ioattn::gpu

namespace ioattn::gpu {

Status download(void*, const void*, size_t, void*) {
  return Status::unsupported("backend=CUDA: this build of ioattn was compiled without CUDA (IOATTN_CUDA=OFF or no nvcc)");
}

}  // namespace ioattn::gpu
