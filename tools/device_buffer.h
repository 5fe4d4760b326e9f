// Device memory for `--backend cuda`: the C ABI takes device pointers for the CUDA backend, so
// the CLI stages host arrays through these. In a build without CUDA, constructing one with a
// nonzero size is CliError(kExitUnsupported).
#pragma once

#include <cstddef>

namespace ioattn::cli {

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  void upload(const void* host);    // all `bytes`
  void download(void* host) const;  // all `bytes`

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Waits for the default stream; throws CliError(kExitInternal) on a CUDA error.
void device_synchronize();

}  // namespace ioattn::cli
