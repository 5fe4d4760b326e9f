// Split-KV decode on the CUDA backend (flash-decoding): what the dispatcher and the tests see of
// it. The kernels are in gpu/decode.cuh, the host side in gpu/decode.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/params.h"
#include "common/status.h"

namespace ioattn::gpu {

// Everything the decode path does on the host that can fail, done before anything is written
// (the KV-cache append included): the device's state (profile, memory pool), the kernel's shared
// memory attribute, and *splits, plan_gpu's kv_splits for p on the current device, which depends
// only on the problem and the device's SM count. Errors come back as IOATTN_ERROR_BACKEND with
// no CUDA error left pending.
Status decode_prepare(const AttnParams& p, int* splits);

// The current device's SM count and L2 size in bytes (0 where the profile has no L2), from the
// device state kept per device, queried once per process: what the sm_90a forward's persistent
// grid is sized by. Errors as decode_prepare's.
Status device_sms_l2(int* sms, int64_t* l2_bytes);

// Device memory for the split partials, stream-ordered on `stream`. On failure (real or
// injected) returns IOATTN_ERROR_BACKEND naming `what` and the size, and *out is null.
Status device_scratch_alloc(size_t bytes, void* stream, const char* what, void** out);
void device_scratch_free(void* ptr, void* stream);

// Attends p with the decode kernel on p.stream, after decode_prepare; `partials` holds
// decode_partials_bytes(p, splits) bytes when splits > 1 (unused otherwise).
Status decode_forward(const AttnParams& p, int splits, void* partials);
size_t decode_partials_bytes(const AttnParams& p, int splits);

namespace testing {
// After `successes` more successful device scratch allocations, the next one fails
// (process-wide; -1 disables), as common/alloc.h's hook does for host scratch. Tests only.
void fail_device_alloc_after(long successes);
}  // namespace testing

}  // namespace ioattn::gpu
