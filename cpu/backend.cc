// The CPU backend: the Highway kernels behind the C ABI's dispatch (common/backend.h).
#include "common/backend.h"

#include <cstring>

#include "common/hardware.h"
#include "cpu/calibrate.h"
#include "cpu/cpu_backend.h"
#include "cpu/flash_kernel.h"
#include "cpu/kv_append.h"

namespace ioattn {
namespace {

class CpuBackend final : public Backend {
 public:
  bool available() const override { return true; }

  Status check_supported(const AttnParams&) const override { return Status::ok(); }

  Status forward(const AttnParams& p) const override { return cpu::forward(p); }

  Status forward_kvcache(const AttnParams& p, const KvAppend* append, const int32_t* host_seqlens) const override {
    cpu::KvAppender appender;
    if (append) {
      if (Status s = appender.prepare(p, *append, host_seqlens); !s.is_ok()) return s;
      appender.apply();
    }
    Status s = cpu::forward(p);
    if (!s.is_ok() && append) appender.undo();
    return s;
  }

  // Host memory already: the metadata is copied as it is.
  Status download(void* host_dst, const void* src, size_t bytes, void*) const override {
    std::memcpy(host_dst, src, bytes);
    return Status::ok();
  }

  // The SIMD target and width the kernels dispatch to; detect_host adds the caches and cores.
  bool query_device(HardwareProfile* out) const override {
    out->simd_target = cpu::flash_target_name();
    out->simd_bits = cpu::flash_target_bits();
    return true;
  }

  Status calibrate(const TuneRequest& request, Calibration* out) const override { return cpu::calibrate(request, out); }
};

}  // namespace

const Backend& cpu_backend() {
  static const CpuBackend backend;
  return backend;
}

}  // namespace ioattn
