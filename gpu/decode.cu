// Host side of the split-KV decode: the split count from the planner, the device scratch for the
// partials (with its fault-injection hook), the per-head-dim launch and the merge kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/hardware.h"
#include "common/online_softmax.h"
#include "common/planner.h"
#include "common/problem.h"
#include "gpu/decode.h"
#include "gpu/decode_launch.cuh"
#include "gpu/elem_convert.cuh"
#include "gpu/gpu_backend.h"
#include "gpu/primitives.cuh"

namespace ioattn::gpu {
namespace {

std::atomic<long> g_device_allocs_before_failure{-1};

// True when the hook says this allocation fails; mirrors common/alloc.cc.
bool injected_failure() {
  long budget = g_device_allocs_before_failure.load(std::memory_order_relaxed);
  while (budget >= 0) {
    if (g_device_allocs_before_failure.compare_exchange_weak(budget, budget - 1)) {
      if (budget == 0) {
        g_device_allocs_before_failure.store(-1);
        return true;
      }
      return false;
    }
  }
  return false;
}

// What each device keeps for the decode path and the sm_90a forward's grid, set up once: the
// planner's profile (cudaGetDeviceProperties costs more than a whole decode step at short cache
// lengths) and a memory pool for the split partials. The pool keeps up to kPoolKeepBytes mapped
// between calls: the default pool returns freed memory at every synchronization, and re-mapping
// it made the first run's GQA decode at Sk = 4k take 124 us for about 40 us of kernels (H200).
constexpr uint64_t kPoolKeepBytes = uint64_t(64) << 20;

struct DeviceState {
  HardwareProfile hw;
  cudaMemPool_t pool = nullptr;
};

// A failed runtime call also leaves its error as the thread's last error, which the next launch
// check (ours or the caller's) would report as its own: consume it with the report.
Status cuda_failure(const std::string& what, cudaError_t err) {
  cudaGetLastError();
  return Status::backend("backend=CUDA: " + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

Status device_state(const DeviceState** out) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<DeviceState>> states;
  *out = nullptr;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return cuda_failure("setting up the device state: cudaGetDevice", err);
  std::lock_guard<std::mutex> lock(mutex);
  if (size_t(device) >= states.size()) states.resize(size_t(device) + 1);
  if (!states[size_t(device)]) {
    auto st = std::make_unique<DeviceState>();
    if (!query_cuda_device(&st->hw))
      return Status::backend("backend=CUDA: setting up the device state: querying the properties of device " +
                             std::to_string(device) + " failed");
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    uint64_t keep = kPoolKeepBytes;
    err = cudaMemPoolCreate(&st->pool, &props);
    if (err != cudaSuccess) return cuda_failure("setting up the device state: cudaMemPoolCreate", err);
    err = cudaMemPoolSetAttribute(st->pool, cudaMemPoolAttrReleaseThreshold, &keep);
    if (err != cudaSuccess) {
      cudaMemPoolDestroy(st->pool);
      return cuda_failure("setting up the device state: cudaMemPoolSetAttribute", err);
    }
    states[size_t(device)] = std::move(st);
  }
  *out = states[size_t(device)].get();
  return Status::ok();
}

decode::Partials partials_of(const AttnParams& p, int splits, void* scratch) {
  decode::Partials part;
  part.splits = splits;
  if (splits > 1) {
    const int64_t rows = decode::partial_rows(p, splits);
    part.o = static_cast<float*>(scratch);
    part.m = part.o + rows * p.head_dim_v;
    part.l = part.m + rows;
  }
  return part;
}

template <class Elem>
cudaError_t prepare_split(const AttnParams& p) {
  switch (p.head_dim) {
    case 64: return decode::prepare_decode<Elem, 64>();
    case 96: return decode::prepare_decode<Elem, 96>();
    case 128: return decode::prepare_decode<Elem, 128>();
    case 256: return decode::prepare_decode<Elem, 256>();
  }
  return cudaErrorInvalidValue;
}

template <class Elem>
cudaError_t launch_split(const AttnParams& p, const decode::Partials& part) {
  switch (p.head_dim) {
    case 64: return decode::launch_decode<Elem, 64>(p, part);
    case 96: return decode::launch_decode<Elem, 96>(p, part);
    case 128: return decode::launch_decode<Elem, 128>(p, part);
    case 256: return decode::launch_decode<Elem, 256>(p, part);
  }
  return cudaErrorInvalidValue;
}

// One CTA per (kv head, sequence): every output element folds its row's partials in split order,
// so the result is the same bits on every run.
template <class Elem>
__global__ void merge_kernel(const __grid_constant__ AttnParams p, const __grid_constant__ decode::Partials part) {
  const int64_t hk = blockIdx.x, b = blockIdx.y;
  const SeqSpan seq = sequence(p, b);
  const int group = int(p.heads_q / p.heads_kv);
  const int rows = group * int(seq.seqlen_q), dv = int(p.head_dim_v);
  auto exp2_fn = [](float x) { return fast_exp2(x); };
  Elem* out = static_cast<Elem*>(p.out);
  for (int e = int(threadIdx.x); e < rows * dv; e += int(blockDim.x)) {
    const int r = e / dv, c = e % dv;
    float m = softmax::neg_inf(), l = 0.f, acc = 0.f;
    for (int s = 0; s < part.splits; ++s) {
      const int64_t row = ((int64_t(s) * gridDim.y + b) * gridDim.x + hk) * kGpuDecodeMaxRows + r;
      const softmax::MergeWeights mw = softmax::merge(m, l, part.m[row], part.l[row], exp2_fn);
      acc = acc * mw.weight_a + part.o[row * dv + c] * mw.weight_b;
      m = mw.m;
      l = mw.l;
    }
    const int64_t i = r / group, h = hk * group + r % group;
    out[o_offset(p, b, seq, i, h) + c] = from_f32<Elem>(acc * softmax::output_scale(l));
    if (p.lse && c == 0)
      p.lse[lse_offset(p, b, seq, i, h)] = softmax::row_lse(softmax::max_for_exp(m), l, softmax::Domain::log2);
  }
}

}  // namespace

namespace decode {
template <class Elem>
cudaError_t launch_merge(const AttnParams& p, const Partials& part) {
  // 128 threads: a row of D <= 256 outputs is one or two passes, and B x Hkv CTAs fill the SMs.
  const dim3 grid(unsigned(p.heads_kv), unsigned(p.batch));
  merge_kernel<Elem><<<grid, 128, 0, static_cast<cudaStream_t>(p.stream)>>>(p, part);
  return cudaGetLastError();
}
template cudaError_t launch_merge<__half>(const AttnParams&, const Partials&);
template cudaError_t launch_merge<__nv_bfloat16>(const AttnParams&, const Partials&);
}  // namespace decode

Status decode_prepare(const AttnParams& p, int* splits) {
  *splits = 1;
  const DeviceState* st = nullptr;
  Status s = device_state(&st);
  if (!s.is_ok()) return s;
  const bool bf16 = p.io_dtype == DType::bf16;
  const cudaError_t err = bf16 ? prepare_split<__nv_bfloat16>(p) : prepare_split<__half>(p);
  if (err != cudaSuccess)
    return cuda_failure(
        "granting the split-KV decode kernel its shared memory (head_dim=" + std::to_string(p.head_dim) + ")", err);
  *splits = std::max(1, plan_gpu(problem_of(p), st->hw).kv_splits);
  return Status::ok();
}

Status device_sms_l2(int* sms, int64_t* l2_bytes) {
  const DeviceState* st = nullptr;
  const Status s = device_state(&st);
  if (!s.is_ok()) return s;
  *sms = st->hw.cores;
  const MemoryLevel* l2 = st->hw.level("L2");
  *l2_bytes = l2 ? l2->size_bytes : 0;
  return Status::ok();
}

size_t decode_partials_bytes(const AttnParams& p, int splits) {
  return size_t(decode::partial_rows(p, splits)) * size_t(p.head_dim_v + 2) * sizeof(float);
}

Status device_scratch_alloc(size_t bytes, void* stream, const char* what, void** out) {
  *out = nullptr;
  const std::string size = std::to_string(bytes) + " bytes of device memory for " + what;
  if (injected_failure()) return Status::backend("backend=CUDA: allocating " + size + ": injected failure (test hook)");
  const DeviceState* st = nullptr;
  const Status s = device_state(&st);
  if (!s.is_ok()) return s;
  const cudaError_t err = cudaMallocFromPoolAsync(out, bytes, st->pool, static_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) {
    *out = nullptr;
    return cuda_failure("allocating " + size, err);
  }
  return Status::ok();
}

// cudaFreeAsync fails only for a stream or pointer that the allocation and the launches on the
// same stream would already have failed on, and reported; its error is consumed so that it does
// not surface again in the caller's next launch check.
void device_scratch_free(void* ptr, void* stream) {
  if (ptr && cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream)) != cudaSuccess) cudaGetLastError();
}

Status decode_forward(const AttnParams& p, int splits, void* partials) {
  const decode::Partials part = partials_of(p, splits, partials);
  const bool bf16 = p.io_dtype == DType::bf16;
  cudaError_t err = bf16 ? launch_split<__nv_bfloat16>(p, part) : launch_split<__half>(p, part);
  if (err == cudaSuccess && splits > 1)
    err = bf16 ? decode::launch_merge<__nv_bfloat16>(p, part) : decode::launch_merge<__half>(p, part);
  if (err != cudaSuccess)
    return cuda_failure("launching the split-KV decode (head_dim=" + std::to_string(p.head_dim) + ", " +
                            std::to_string(splits) + " splits)",
                        err);
  return Status::ok();
}

namespace testing {
void fail_device_alloc_after(long successes) { g_device_allocs_before_failure.store(successes); }
}  // namespace testing

}  // namespace ioattn::gpu
