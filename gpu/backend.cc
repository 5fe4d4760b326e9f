// The CUDA backend behind the C ABI's dispatch (common/backend.h). Plain C++ over gpu/'s entry
// points, which a build without CUDA defines as refusals (gpu/gpu_unavailable.cc).
#include "common/backend.h"

#include "gpu/gpu_backend.h"

namespace ioattn {
namespace {

class GpuBackend final : public Backend {
 public:
  bool available() const override { return gpu::available(); }
  Status check_supported(const AttnParams& p) const override { return gpu::check_supported(p); }
  Status forward(const AttnParams& p) const override { return gpu::forward(p); }
  // The kernel side reads the lengths from the device copy the append names.
  Status forward_kvcache(const AttnParams& p, const KvAppend* append, const int32_t*) const override {
    return gpu::forward_kvcache(p, append);
  }
  Status download(void* host_dst, const void* src, size_t bytes, void* stream) const override {
    return gpu::download(host_dst, src, bytes, stream);
  }
  bool query_device(HardwareProfile* out) const override { return gpu::query_cuda_device(out); }
  // GPU tiles come from the constexpr table the kernels are instantiated from; nothing to time.
  Status calibrate(const TuneRequest&, Calibration*) const override {
    return Status::unsupported("tune: the CUDA backend's tiles are compiled in; calibration is for the CPU backend");
  }
};

}  // namespace

const Backend& gpu_backend() {
  static const GpuBackend backend;
  return backend;
}

}  // namespace ioattn
