// Dispatch of the CUDA forward: validates what only the CUDA backend cares about (head dims,
// layouts a 16-byte copy can read, grid limits, shared memory the device grants), then picks the
// split-KV decode kernel (few query rows per kv head), the sm_90a prefill kernel (wgmma, TMA) on
// a compute capability 9.0 device for the requests it covers, the sm_80 tensor-core prefill
// kernel for (head dim, storage type), or the portable path. choose_path is the one place that
// decides.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/gpu_tiles.h"
#include "gpu/decode.h"
#include "gpu/decode_launch.cuh"
#include "gpu/gpu_backend.h"
#include "gpu/simple_fwd.h"
#include "gpu/sm80/launch.h"
#if IOATTN_HAVE_SM90
#include "gpu/sm90/launch.h"
#endif

namespace ioattn::gpu {
namespace {

// A failed runtime call also leaves its error as the thread's last error, which the next launch
// check (ours or the caller's) would report as its own: consume it with the report.
Status cuda_error(const std::string& what, cudaError_t err) {
  cudaGetLastError();
  return Status::backend("backend=CUDA: " + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

bool supported_head_dim(int64_t d) { return d > 0 && d <= kSimpleMaxHeadDim; }

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }
bool multiple_of_8(int64_t a, int64_t b, int64_t c) { return a % 8 == 0 && b % 8 == 0 && c % 8 == 0; }

// The tensor-core kernel copies rows in 16-byte chunks and stores output pairs as 4 bytes, so
// every row it touches must start on a 16-byte boundary: 16-byte-aligned bases and element
// strides that are multiples of 8 (2-byte elements).
bool chunk_aligned(const AttnParams& p) {
  return aligned16(p.q) && aligned16(p.k) && aligned16(p.v) && aligned16(p.out) &&
         multiple_of_8(p.q_batch_stride, p.q_seq_stride, p.q_head_stride) &&
         multiple_of_8(p.k_batch_stride, p.k_seq_stride, p.k_head_stride) &&
         multiple_of_8(p.v_batch_stride, p.v_seq_stride, p.v_head_stride) &&
         multiple_of_8(p.o_batch_stride, p.o_seq_stride, p.o_head_stride);
}

template <class Elem>
cudaError_t launch_tensor_core(const AttnParams& p) {
  switch (p.head_dim) {
    case 64: return sm80::launch_flash_fwd<Elem, 64>(p);
    case 96: return sm80::launch_flash_fwd<Elem, 96>(p);
    case 128: return sm80::launch_flash_fwd<Elem, 128>(p);
    case 256: return sm80::launch_flash_fwd<Elem, 256>(p);
  }
  return cudaErrorInvalidValue;
}

#if IOATTN_HAVE_SM90
template <class Elem>
cudaError_t launch_hopper(const AttnParams& p, const sm90::DeviceGrid& dev) {
  switch (p.head_dim) {
    case 64: return sm90::launch_flash_fwd<Elem, 64>(p, dev);
    case 96: return sm90::launch_flash_fwd<Elem, 96>(p, dev);
    case 128: return sm90::launch_flash_fwd<Elem, 128>(p, dev);
    case 256: return sm90::launch_flash_fwd<Elem, 256>(p, dev);
  }
  return cudaErrorInvalidValue;
}
#endif

// What a TMA descriptor addresses: every stride below 2^40 bytes (the rows' 16-byte alignment is
// chunk_aligned's). Extents fit: sequences are at most 2^30 rows, heads and batch 65535.
bool tma_addressable(const AttnParams& p) {
  const int64_t limit = (int64_t(1) << 40) / 2;  // 2-byte elements
  for (const int64_t s :
       {p.q_batch_stride, p.q_seq_stride, p.q_head_stride, p.k_batch_stride, p.k_seq_stride, p.k_head_stride,
        p.v_batch_stride, p.v_seq_stride, p.v_head_stride, p.o_batch_stride, p.o_seq_stride, p.o_head_stride})
    if (s < 0 || s >= limit) return false;
  return true;
}

// The sm_90a kernel's reach: a compute capability 9.0 device (its sm_90a code runs nowhere
// else) in a build that compiled it; head dims with a gpu_tile_sm90 entry; the rows TMA reads as
// a box of one dense tensor per operand, so no varlen offsets, block tables or per-sequence
// cache lengths, at least one key (a TMA descriptor has no empty extent), and a tile count the
// persistent schedule indexes. Masks (causal, windows), softcap, any scale, GQA and LSE it covers
// as the sm_80 kernel does, with the same rules.
bool hopper_covers(const AttnParams& p, int cc_major, int cc_minor, int smem_optin) {
#if IOATTN_HAVE_SM90
  return cc_major == 9 && cc_minor == 0 && gpu_tile_sm90(int(p.head_dim)).supported && p.seqlen_k > 0 &&
         !p.cu_seqlens_q && !p.cu_seqlens_k && !p.block_table && !p.seqlens_k && tma_addressable(p) &&
         sm90::flash_fwd_tiles_fit(p) && sm90::flash_fwd_smem_bytes(int(p.head_dim)) <= smem_optin;
#else
  (void)p, (void)cc_major, (void)cc_minor, (void)smem_optin;
  return false;
#endif
}

enum class Path { none, decode, hopper, tensor_core, portable };

// Decode takes the requests whose query rows per (sequence, kv head), G x Sq, fit its 16-row
// tile (common/gpu_tiles.h has the arithmetic): the prefill kernel would give each of the G
// query heads its own CTA, reading the same K/V G times, with at most 16 of 128 rows used.
// Prefill takes the sm_90a kernel where it covers the request, else the sm_80 one.
Path choose_path(const AttnParams& p, int cc_major, int cc_minor, int smem_optin) {
  if (p.batch == 0 || p.seqlen_q == 0) return Path::none;
  const bool tensor_core =
      p.io_dtype != DType::f32 && p.head_dim == p.head_dim_v && gpu_tile(int(p.head_dim)).supported && chunk_aligned(p);
  if (tensor_core && gpu_decode_rows(p.heads_q / p.heads_kv, p.seqlen_q) &&
      decode::decode_smem_bytes(int(p.head_dim)) <= smem_optin)
    return Path::decode;
  if (tensor_core && hopper_covers(p, cc_major, cc_minor, smem_optin)) return Path::hopper;
  if (tensor_core && sm80::flash_fwd_smem_bytes(int(p.head_dim)) <= smem_optin) return Path::tensor_core;
  return Path::portable;
}

// The current device's figures that choose_path reads.
struct DeviceFacts {
  int smem_optin = 0, cc_major = 0, cc_minor = 0;
};

cudaError_t query_facts(DeviceFacts* f) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&f->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&f->cc_major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&f->cc_minor, cudaDevAttrComputeCapabilityMinor, device);
  return err;
}

// Everything that can fail without touching memory (device queries, the sm_90a grid's SM count,
// the decode kernel's attribute, the decode scratch, the buffer for the overwritten cache slots)
// happens before the append writes the cache. A failure after it (a launch, or the prefill
// kernel's attribute, set by its launcher) puts the saved slots back before returning, so a
// failed call leaves the cache as it was; only if that restore cannot be launched either does the
// message say the cache holds the new rows.
Status run(const AttnParams& p, const KvAppend* append) {
  Status s = check_supported(p);
  if (!s.is_ok()) return s;
  DeviceFacts f;
  cudaError_t err = query_facts(&f);
  if (err != cudaSuccess) return cuda_error("querying the device", err);

  const Path path = choose_path(p, f.cc_major, f.cc_minor, f.smem_optin);
#if IOATTN_HAVE_SM90
  sm90::DeviceGrid grid{};
  if (path == Path::hopper && !(s = device_sms_l2(&grid.sms, &grid.l2_bytes)).is_ok()) return s;
#endif
  int splits = 1;
  void* partials = nullptr;
  if (path == Path::decode) {
    if (!(s = decode_prepare(p, &splits)).is_ok()) return s;
    if (splits > 1 && !(s = device_scratch_alloc(decode_partials_bytes(p, splits), p.stream,
                                                 "the split-KV decode partials", &partials))
                           .is_ok())
      return s;
  }
  void* saved = nullptr;
  const size_t saved_bytes = append ? append_saved_bytes(p, *append) : 0;
  if (saved_bytes > 0 &&
      !(s = device_scratch_alloc(saved_bytes, p.stream, "the overwritten KV-cache slots", &saved)).is_ok()) {
    device_scratch_free(partials, p.stream);
    return s;
  }
  auto release = [&] {
    device_scratch_free(saved, p.stream);
    device_scratch_free(partials, p.stream);
  };
  if (append && !(s = append_kv(p, *append, saved)).is_ok()) {
    release();
    return s;
  }
  switch (path) {
    case Path::none: break;
    case Path::decode: s = decode_forward(p, splits, partials); break;
    case Path::hopper:
#if IOATTN_HAVE_SM90
      err = p.io_dtype == DType::bf16 ? launch_hopper<__nv_bfloat16>(p, grid) : launch_hopper<__half>(p, grid);
      if (err != cudaSuccess)
        s = cuda_error("launching the sm_90a flash forward (head_dim=" + std::to_string(p.head_dim) + ")", err);
#endif
      break;
    case Path::tensor_core:
      err = p.io_dtype == DType::bf16 ? launch_tensor_core<__nv_bfloat16>(p) : launch_tensor_core<__half>(p);
      if (err != cudaSuccess)
        s = cuda_error("launching the flash forward (head_dim=" + std::to_string(p.head_dim) + ")", err);
      break;
    case Path::portable:
      err = launch_simple_fwd(p);
      if (err != cudaSuccess) s = cuda_error("launching the portable forward", err);
      break;
  }
  if (!s.is_ok() && saved) {
    const Status r = restore_kv(p, *append, saved);
    if (!r.is_ok())
      s = Status::backend(s.message + "; restoring the KV cache failed too, it holds the appended rows (" + r.message +
                          ")");
  }
  release();
  return s;
}

}  // namespace

Status check_supported(const AttnParams& p) {
  if (!supported_head_dim(p.head_dim) || !supported_head_dim(p.head_dim_v))
    return Status::unsupported("backend=CUDA: head_dim=" + std::to_string(p.head_dim) + " head_dim_v=" +
                               std::to_string(p.head_dim_v) + ": the CUDA backend supports head dims 1.." +
                               std::to_string(kSimpleMaxHeadDim) + " (64, 96, 128 and 256 on its tensor-core kernels)");
  if (p.io_dtype != p.kv_dtype)
    return Status::unsupported(std::string("backend=CUDA: q/out dtype ") + dtype_name(p.io_dtype) + " with k/v dtype " +
                               dtype_name(p.kv_dtype) +
                               ": the CUDA backend needs one storage dtype for q, k, v and out");
  if (p.heads_q > 65535 || p.batch > 65535)
    return Status::unsupported("backend=CUDA: heads=" + std::to_string(p.heads_q) +
                               " batch=" + std::to_string(p.batch) + ": the CUDA grid allows at most 65535 of each");
  // Key indices inside the kernels are 32-bit.
  if (p.seqlen_q > (int64_t(1) << 30) || p.seqlen_k > (int64_t(1) << 30))
    return Status::unsupported("backend=CUDA: seqlen_q=" + std::to_string(p.seqlen_q) + " seqlen_k=" +
                               std::to_string(p.seqlen_k) + ": the CUDA kernels take sequences up to 2^30");
  return Status::ok();
}

Status forward(const AttnParams& p) { return run(p, nullptr); }

std::string forward_kernel(const AttnParams& p) {
  DeviceFacts f;
  if (query_facts(&f) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  switch (choose_path(p, f.cc_major, f.cc_minor, f.smem_optin)) {
    case Path::none: return "none";
    case Path::decode: return "decode";
    case Path::hopper: return "sm90";
    case Path::tensor_core: return "sm80";
    case Path::portable: return "portable";
  }
  return "";
}

Status forward_kvcache(const AttnParams& p, const KvAppend* append) { return run(p, append); }

}  // namespace ioattn::gpu
