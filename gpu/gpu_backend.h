// The CUDA backend's entry. Compiled to stubs that report IOATTN_ERROR_UNSUPPORTED when the build
// has no CUDA, so callers never see a silent fallback.
#pragma once

#include <cstddef>
#include <string>

#include "common/backend.h"
#include "common/hardware.h"
#include "common/params.h"
#include "common/status.h"

namespace ioattn::gpu {

// The current CUDA device as a hardware profile (SM count, shared memory per SM and per block
// opt-in, registers, L2, clocks, HBM bandwidth from the memory clock); false when this build has
// no CUDA or no device is visible.
bool query_cuda_device(HardwareProfile* out);

// A CUDA device is usable by this build.
bool available();

// What the CUDA backend cannot run (head dims, mixed q/kv storage, grid and index limits):
// IOATTN_ERROR_UNSUPPORTED naming the value, else OK. forward() checks it too; the KV-cache path
// calls it before append_kv so a rejected request leaves the cache untouched.
Status check_supported(const AttnParams& p);

// p validated by the API layer; all pointers are device pointers; runs on p.stream.
Status forward(const AttnParams& p);

// The kernel forward(p) picks on the current device: "sm90" (the sm_90a prefill), "sm80" (the
// sm_80 tensor-core prefill), "decode", "portable", or "none" (nothing to compute); empty when
// the device cannot be queried. The tests check which path their cases cover with it.
std::string forward_kernel(const AttnParams& p);

// KV-cache append on the device (KvAppend's pointers, cache_seqlens included, are device pointers).
// Bytes append_kv needs to keep the cache slots it overwrites; `saved` (that many bytes of device
// memory, or null to keep nothing) lets restore_kv put them back bit for bit when the attention
// after the append fails, so a failed call leaves the cache as it was.
size_t append_saved_bytes(const AttnParams& p, const KvAppend& a);
Status append_kv(const AttnParams& p, const KvAppend& a, void* saved);
Status restore_kv(const AttnParams& p, const KvAppend& a, const void* saved);

// The KV-cache call: append (when `append` is not null), then forward(p). What can fail without
// writing (device queries, scratch for split partials) is done before the append, so an error
// leaves the cache untouched.
Status forward_kvcache(const AttnParams& p, const KvAppend* append);

}  // namespace ioattn::gpu

namespace ioattn::gpu {

// Copies a few bytes of caller metadata (seqlens, block tables, cu_seqlens: device pointers on
// this backend) to the host so the API layer can validate them before anything is written.
Status download(void* host_dst, const void* device_src, size_t bytes, void* stream);

}  // namespace ioattn::gpu
