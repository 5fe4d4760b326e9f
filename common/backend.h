// The interface the C ABI dispatches through. common/ declares it and knows no backend; cpu/
// and gpu/ each define one (cpu/backend.cc, gpu/backend.cc), reached by backend_for().
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/params.h"
#include "common/status.h"
#include "ioattn/ioattn.h"

namespace ioattn {

struct HardwareProfile;
struct Calibration;
struct TuneRequest;

// New K/V rows for a KV-cache call, in the backend's memory: rows [0, seqlen_new) of k_new/v_new
// go to positions seqlens[b] + r of sequence b in the (contiguous or paged) cache p.k/p.v name.
struct KvAppend {
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  DType dtype = DType::f32;
  int64_t seqlen_new = 0;
  int64_t k_batch_stride = 0, k_seq_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_seq_stride = 0, v_head_stride = 0;
  const int32_t* cache_seqlens = nullptr;  // the caller's array, in the backend's memory
};

class Backend {
 public:
  virtual ~Backend() = default;

  // This build can run the backend here (CUDA: compiled in and a device is visible).
  virtual bool available() const = 0;

  // What the backend cannot run (head dims, mixed storage, index limits): IOATTN_ERROR_UNSUPPORTED
  // naming the value, else OK. Checked before a KV-cache append, so a refusal writes nothing.
  virtual Status check_supported(const AttnParams& p) const = 0;

  // p validated by the C ABI; its pointers are in the backend's memory.
  virtual Status forward(const AttnParams& p) const = 0;

  // The KV-cache call: the append (when `append` is not null), then forward(p). host_seqlens is a
  // host copy of the cache's lengths before the append. On failure the cache is as it was.
  virtual Status forward_kvcache(const AttnParams& p, const KvAppend* append, const int32_t* host_seqlens) const = 0;

  // Copies `bytes` of caller metadata (seqlens, block tables, cu_seqlens) from the backend's
  // memory to the host, so the C ABI can validate them before anything is written.
  virtual Status download(void* host_dst, const void* src, size_t bytes, void* stream) const = 0;

  // The backend's device as a hardware profile; false where it has none to report.
  virtual bool query_device(HardwareProfile* out) const = 0;

  // Times plan candidates on this machine (common/calibration.h); IOATTN_ERROR_UNSUPPORTED where
  // the backend has nothing to calibrate.
  virtual Status calibrate(const TuneRequest& request, Calibration* out) const = 0;
};

const Backend& cpu_backend();  // defined in cpu/backend.cc
const Backend& gpu_backend();  // gpu/backend.cc: CUDA's, or one that refuses every call without it

// IOATTN_BACKEND_CPU or IOATTN_BACKEND_CUDA (the C ABI has validated the value).
inline const Backend& backend_for(int32_t backend) {
  return backend == IOATTN_BACKEND_CUDA ? gpu_backend() : cpu_backend();
}

}  // namespace ioattn
