// Injected CUDA failures through the C ABI (test_faults.cc injects the host allocation failures).
// Two sources:
//
// 1. A failing CUDA runtime call. tests/CMakeLists.txt links this binary with `--wrap` for the
//    runtime entry points the library calls (device query, kernel attribute, kernel launch, and
//    the capture query, copy and synchronize that bring metadata to the host), so every such call lands in `__wrap_X`
//    below, which forwards to the runtime (`__real_X`) unless a failure is armed. An armed failure makes the runtime
//    itself fail (an attribute query of device -1, a launch with an empty grid), so the runtime's per-thread error
//    state is what a real failure leaves. For n = 0, 1, 2, ... the (n+1)-th wrapped call fails, until a request runs
//    through: every such call the library makes fails once. The library has no hook for this; the linker provides it in
//    this binary only.
// 2. A stream the runtime refuses: the legacy default stream while another, blocking, stream is
//    capturing a graph, which CUDA documents as invalid (Programming Guide, "Prohibited and
//    Unhandled Operations": any use of the legacy stream would depend on the capture).
//
// Each failure must return IOATTN_ERROR_BACKEND with a message carrying the CUDA error, leave out,
// lse and the KV cache byte-for-byte as they were, leave no CUDA error pending for the caller's
// next launch check (cudaPeekAtLastError), and leave the device healthy; the very next call must
// succeed with the bits of a clean run, which is itself checked against the fp64 reference.
// Exits 77 where no CUDA device is visible. [sanitize]: small enough for compute-sanitizer.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/params.h"
#include "common/reference.h"
#include "ioattn/ioattn.h"
#include "tests/catch.h"
#include "tests/support/support.h"

#if IOATTN_HAVE_CUDA
#include <cuda_runtime.h>

namespace {

// The armed failure: after this many more wrapped calls succeed, the next one fails (-1: off).
long g_calls_before_failure = -1;
const char* g_failed_call = nullptr;
cudaError_t g_injected_error = cudaSuccess;
long g_wrapped_calls = 0;

bool fail_this_call(const char* call) {
  ++g_wrapped_calls;
  if (g_calls_before_failure < 0) return false;
  if (g_calls_before_failure-- > 0) return false;
  g_failed_call = call;
  return true;
}

}  // namespace

extern "C" {
cudaError_t __real_cudaGetDevice(int* device);
cudaError_t __real_cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t __real_cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value);
cudaError_t __real_cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t __real_cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t __real_cudaStreamSynchronize(cudaStream_t stream);
cudaError_t __real___cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t smem,
                                      cudaStream_t stream);
}

namespace {

// The runtime fails an attribute query of a device ordinal that cannot exist
// (cudaErrorInvalidDevice) and keeps it as this thread's last error, as after any real failure.
cudaError_t runtime_failure() {
  int value = 0;
  return g_injected_error = __real_cudaDeviceGetAttribute(&value, cudaDevAttrMaxThreadsPerBlock, -1);
}

}  // namespace

extern "C" {
cudaError_t __wrap_cudaGetDevice(int* device) {
  return fail_this_call("cudaGetDevice") ? runtime_failure() : __real_cudaGetDevice(device);
}
cudaError_t __wrap_cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  return fail_this_call("cudaDeviceGetAttribute") ? runtime_failure()
                                                  : __real_cudaDeviceGetAttribute(value, attr, device);
}
cudaError_t __wrap_cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  return fail_this_call("cudaFuncSetAttribute") ? runtime_failure() : __real_cudaFuncSetAttribute(func, attr, value);
}
cudaError_t __wrap_cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  return fail_this_call("cudaStreamIsCapturing") ? runtime_failure() : __real_cudaStreamIsCapturing(stream, status);
}
cudaError_t __wrap_cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  return fail_this_call("cudaMemcpyAsync") ? runtime_failure() : __real_cudaMemcpyAsync(dst, src, count, kind, stream);
}
cudaError_t __wrap_cudaStreamSynchronize(cudaStream_t stream) {
  return fail_this_call("cudaStreamSynchronize") ? runtime_failure() : __real_cudaStreamSynchronize(stream);
}
// What `kernel<<<...>>>` compiles to with nvcc 12.8 and later. An empty grid is refused by the
// runtime before anything runs (cudaErrorInvalidConfiguration): a launch that really failed.
cudaError_t __wrap___cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t smem,
                                      cudaStream_t stream) {
  if (!fail_this_call("kernel launch")) return __real___cudaLaunchKernel(kernel, grid, block, args, smem, stream);
  return g_injected_error = __real___cudaLaunchKernel(kernel, dim3(0, 1, 1), block, args, smem, stream);
}
}

namespace {

using ioattn::AttnParams;
using ioattn::DType;
using Bytes = std::vector<unsigned char>;

#define CUDA_OK(expr) REQUIRE((expr) == cudaSuccess)

// Arms one failure for its lifetime and always disarms, even when a check throws.
struct ArmedFailure {
  explicit ArmedFailure(long successes) {
    g_calls_before_failure = successes;
    g_failed_call = nullptr;
    g_injected_error = cudaSuccess;
  }
  ~ArmedFailure() { g_calls_before_failure = -1; }
};

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(const Bytes& host) : bytes(host.size()) {
    CUDA_OK(cudaMalloc(&ptr, std::max<size_t>(bytes, 1)));
    upload(host);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void upload(const Bytes& host) {
    REQUIRE(host.size() == bytes);
    if (bytes) CUDA_OK(cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  Bytes download() const {
    Bytes host(bytes);
    if (bytes) CUDA_OK(cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost));
    return host;
  }
};

template <class T>
Bytes bytes_of(const std::vector<T>& v) {
  const auto* b = reinterpret_cast<const unsigned char*>(v.data());
  return Bytes(b, b + v.size() * sizeof(T));
}

// Random values in [-1, 1] stored in `t`; the reference reads the same bits.
Bytes random_tensor(int64_t elements, DType t, std::mt19937& rng) {
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  Bytes b(size_t(elements * ioattn::dtype_bytes(t)));
  for (int64_t i = 0; i < elements; ++i) ioattn::store_from_f32(b.data(), i, t, uni(rng));
  return b;
}

// NaN in every element of f32, f16 and bf16 alike, so an element the call forgets to write fails.
Bytes nan_filled(size_t bytes) { return Bytes(bytes, 0xff); }

// "" when equal, else where the first difference is (printing megabytes of bytes helps nobody).
std::string difference(const std::vector<Bytes>& got, const std::vector<Bytes>& want) {
  if (got.size() != want.size()) return "different buffer counts";
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].size() != want[i].size()) return "buffer " + std::to_string(i) + " has another size";
    const auto at = std::mismatch(got[i].begin(), got[i].end(), want[i].begin());
    if (at.first != got[i].end())
      return "buffer " + std::to_string(i) + " (out, lse, cache.k, cache.v) differs from byte " +
             std::to_string(at.first - got[i].begin()) + " of " + std::to_string(got[i].size());
  }
  return "";
}

// One request through the C ABI on device buffers, with its host twin for the reference.
struct Request {
  std::string name;
  DType dtype = DType::bf16;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  // What the call may write (out, lse, the caches), each with its contents before every call.
  std::vector<std::pair<DeviceBuffer*, Bytes>> written;
  std::function<ioattn_status(cudaStream_t)> call;
  // The bytes a clean run must leave in `written`: the host reference's inputs are built from
  // them (for the KV cache, the appended cache), and the outputs are checked against it.
  std::function<void(const std::vector<Bytes>&)> check_clean_run;

  DeviceBuffer* device(const Bytes& host) {
    buffers.push_back(std::make_unique<DeviceBuffer>(host));
    return buffers.back().get();
  }
  DeviceBuffer* output(const Bytes& pristine) {
    DeviceBuffer* b = device(pristine);
    written.emplace_back(b, pristine);
    return b;
  }
  void reset() {
    for (auto& [buffer, pristine] : written) buffer->upload(pristine);
  }
  std::vector<Bytes> state() const {
    std::vector<Bytes> s;
    for (const auto& w : written) s.push_back(w.first->download());
    return s;
  }
};

ioattn_tensor tensor(const DeviceBuffer* b, DType t, int64_t batch, int64_t seq, int64_t heads, int64_t dim) {
  return {b->ptr, int32_t(t), batch, seq, heads, dim, seq * heads * dim, heads * dim, dim};
}

ioattn_options cuda_options(cudaStream_t stream) {
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.backend = IOATTN_BACKEND_CUDA;
  opt.causal = 1;
  opt.cuda_stream = stream;
  return opt;
}

// Host params over contiguous (B, S, H, D) tensors, causal like every request here.
AttnParams host_params(const void* q, const void* k, const void* v, DType t, int64_t batch, int64_t sq, int64_t sk,
                       int64_t hq, int64_t hkv, int64_t d, int64_t k_rows) {
  AttnParams p = ioattn::test::dense_params(q, k, v, t, batch, sq, sk, hq, hkv, d, k_rows);
  p.causal = true;
  return p;
}

// The tolerance rule of docs/testing.md: max|out - ref| <= 2 max|naive f32 rounded to the storage type - ref| + 2 ulp
// of the output magnitude; lse within 2x the naive f32 error + 1e-5 relative; -inf rows exactly.
void check_reference(const AttnParams& p, DType t, const Bytes& out, const Bytes& lse_bytes) {
  const size_t n_out = out.size() / size_t(ioattn::dtype_bytes(t)), n_lse = lse_bytes.size() / sizeof(float);
  std::vector<double> out64(n_out, 0.0), lse64(n_lse, 0.0);
  std::vector<float> out32(n_out, 0.f), lse32(n_lse, 0.f);
  ioattn::naive_attention<double>(p, out64.data(), lse64.data());
  ioattn::naive_attention<float>(p, out32.data(), lse32.data());
  double magnitude = 0, naive_err = 0, err = 0;
  int64_t nan = 0, bad_lse = 0;
  for (size_t i = 0; i < n_out; ++i) {
    const float got = ioattn::load_as_f32(out.data(), int64_t(i), t);
    if (std::isnan(got)) ++nan;
    magnitude = std::max(magnitude, std::fabs(out64[i]));
    naive_err = std::max(naive_err, std::fabs(double(ioattn::round_to(t, out32[i])) - out64[i]));
    err = std::max(err, std::fabs(double(got) - out64[i]));
  }
  std::vector<float> lse(n_lse);
  std::memcpy(lse.data(), lse_bytes.data(), lse_bytes.size());
  for (size_t i = 0; i < n_lse; ++i) {
    if (std::isinf(lse64[i])) {
      bad_lse += lse[i] != float(lse64[i]);
    } else {
      const double tol = 2 * std::fabs(double(lse32[i]) - lse64[i]) + 1e-5 * std::max(1.0, std::fabs(lse64[i]));
      bad_lse += !(std::fabs(double(lse[i]) - lse64[i]) <= tol);
    }
  }
  const double ulp = t == DType::bf16  ? std::ldexp(1.0, -7)
                     : t == DType::f16 ? std::ldexp(1.0, -10)
                                       : std::ldexp(1.0, -23);
  INFO("max |out - ref| " << err << ", naive error " << naive_err << ", max |ref| " << magnitude);
  CHECK(nan == 0);
  CHECK(err <= 2 * naive_err + 2 * ulp * std::max(magnitude, 1e-6));
  CHECK(bad_lse == 0);
}

// Dense causal attention, Sq < Sk, GQA 2: bf16 runs the tensor-core kernel, f32 the portable one.
std::unique_ptr<Request> dense_request(DType t) {
  constexpr int64_t B = 2, Sq = 37, Sk = 70, Hq = 4, Hkv = 2, D = 64;
  auto r = std::make_unique<Request>();
  r->name = std::string("ioattn_forward ") + ioattn::dtype_name(t);
  r->dtype = t;
  std::mt19937 rng(7);
  const Bytes q = random_tensor(B * Sq * Hq * D, t, rng), k = random_tensor(B * Sk * Hkv * D, t, rng),
              v = random_tensor(B * Sk * Hkv * D, t, rng);
  const DeviceBuffer *dq = r->device(q), *dk = r->device(k), *dv = r->device(v);
  const DeviceBuffer* dout = r->output(nan_filled(q.size()));
  const DeviceBuffer* dlse = r->output(nan_filled(size_t(B * Hq * Sq) * sizeof(float)));
  r->call = [=](cudaStream_t stream) {
    const ioattn_tensor tq = tensor(dq, t, B, Sq, Hq, D), tk = tensor(dk, t, B, Sk, Hkv, D),
                        tv = tensor(dv, t, B, Sk, Hkv, D), to = tensor(dout, t, B, Sq, Hq, D);
    const ioattn_options opt = cuda_options(stream);
    return ioattn_forward(&tq, &tk, &tv, &to, static_cast<float*>(dlse->ptr), &opt);
  };
  r->check_clean_run = [=](const std::vector<Bytes>& s) {
    check_reference(host_params(q.data(), k.data(), v.data(), t, B, Sq, Sk, Hq, Hkv, D, Sk), t, s[0], s[1]);
  };
  return r;
}

// Three packed sequences, one of them with no query rows.
std::unique_ptr<Request> varlen_request() {
  constexpr int64_t Hq = 4, Hkv = 2, D = 64;
  const DType t = DType::bf16;
  const std::vector<int32_t> cu_q = {0, 5, 5, 37}, cu_k = {0, 40, 41, 100};
  const int64_t total_q = cu_q.back(), total_k = cu_k.back(), batch = int64_t(cu_q.size()) - 1;
  auto r = std::make_unique<Request>();
  r->name = "ioattn_forward_varlen bf16";
  std::mt19937 rng(8);
  const Bytes q = random_tensor(total_q * Hq * D, t, rng), k = random_tensor(total_k * Hkv * D, t, rng),
              v = random_tensor(total_k * Hkv * D, t, rng);
  const DeviceBuffer *dq = r->device(q), *dk = r->device(k), *dv = r->device(v);
  const DeviceBuffer *dcq = r->device(bytes_of(cu_q)), *dck = r->device(bytes_of(cu_k));
  const DeviceBuffer* dout = r->output(nan_filled(q.size()));
  const DeviceBuffer* dlse = r->output(nan_filled(size_t(Hq * total_q) * sizeof(float)));
  r->call = [=](cudaStream_t stream) {
    const ioattn_tensor tq = tensor(dq, t, 1, total_q, Hq, D), tk = tensor(dk, t, 1, total_k, Hkv, D),
                        tv = tensor(dv, t, 1, total_k, Hkv, D), to = tensor(dout, t, 1, total_q, Hq, D);
    const ioattn_options opt = cuda_options(stream);
    return ioattn_forward_varlen(&tq, &tk, &tv, static_cast<const int32_t*>(dcq->ptr),
                                 static_cast<const int32_t*>(dck->ptr), int32_t(batch), &to,
                                 static_cast<float*>(dlse->ptr), &opt);
  };
  r->check_clean_run = [=](const std::vector<Bytes>& s) {
    AttnParams p = host_params(q.data(), k.data(), v.data(), t, batch, 0, 0, Hq, Hkv, D, 0);
    for (int64_t b = 0; b < batch; ++b) {
      p.seqlen_q = std::max<int64_t>(p.seqlen_q, cu_q[size_t(b) + 1] - cu_q[size_t(b)]);
      p.seqlen_k = std::max<int64_t>(p.seqlen_k, cu_k[size_t(b) + 1] - cu_k[size_t(b)]);
    }
    p.cu_seqlens_q = cu_q.data();
    p.cu_seqlens_k = cu_k.data();
    p.lse_head_stride = total_q;
    p.lse_batch_stride = 0;
    check_reference(p, t, s[0], s[1]);
  };
  return r;
}

// Append 3 tokens to sequences holding 30 and 0, then attend causally; contiguous (S_max 40) or
// paged (16-row pages in shuffled order, one page nobody owns).
std::unique_ptr<Request> kvcache_request(bool paged) {
  constexpr int64_t B = 2, Hq = 4, Hkv = 2, D = 64, Snew = 3, Smax = 40, page = 16;
  const DType t = DType::bf16;
  const std::vector<int32_t> seqlens = {30, 0};
  auto r = std::make_unique<Request>();
  r->name = std::string("ioattn_forward_kvcache bf16 ") + (paged ? "paged" : "contiguous");
  std::mt19937 rng(paged ? 10 : 9);
  int64_t max_pages = 1, cache_batch = B, cache_rows = Smax;
  std::vector<int32_t> table;
  if (paged) {
    for (int32_t l : seqlens) max_pages = std::max<int64_t>(max_pages, (l + Snew + page - 1) / page);
    cache_batch = B * max_pages + 1;
    cache_rows = page;
    std::vector<int32_t> pool(static_cast<size_t>(cache_batch));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    table.assign(pool.begin(), pool.begin() + B * max_pages);
  }
  const int64_t cache_elems = cache_batch * cache_rows * Hkv * D;
  const Bytes q = random_tensor(B * Snew * Hq * D, t, rng), k_new = random_tensor(B * Snew * Hkv * D, t, rng),
              v_new = random_tensor(B * Snew * Hkv * D, t, rng), k_cache = random_tensor(cache_elems, t, rng),
              v_cache = random_tensor(cache_elems, t, rng);
  const DeviceBuffer *dq = r->device(q), *dkn = r->device(k_new), *dvn = r->device(v_new);
  const DeviceBuffer* dlens = r->device(bytes_of(seqlens));
  const DeviceBuffer* dtable = paged ? r->device(bytes_of(table)) : nullptr;
  const DeviceBuffer* dout = r->output(nan_filled(q.size()));
  const DeviceBuffer* dlse = r->output(nan_filled(size_t(B * Hq * Snew) * sizeof(float)));
  const DeviceBuffer *dkc = r->output(k_cache), *dvc = r->output(v_cache);
  r->call = [=](cudaStream_t stream) {
    const ioattn_tensor tq = tensor(dq, t, B, Snew, Hq, D), tkn = tensor(dkn, t, B, Snew, Hkv, D),
                        tvn = tensor(dvn, t, B, Snew, Hkv, D), to = tensor(dout, t, B, Snew, Hq, D);
    ioattn_kvcache cache{};
    cache.k = tensor(dkc, t, cache_batch, cache_rows, Hkv, D);
    cache.v = tensor(dvc, t, cache_batch, cache_rows, Hkv, D);
    cache.seqlens = static_cast<const int32_t*>(dlens->ptr);
    cache.block_table = dtable ? static_cast<const int32_t*>(dtable->ptr) : nullptr;
    cache.max_pages_per_seq = int32_t(max_pages);
    const ioattn_options opt = cuda_options(stream);
    return ioattn_forward_kvcache(&tq, &cache, &tkn, &tvn, &to, static_cast<float*>(dlse->ptr), &opt);
  };
  r->check_clean_run = [=](const std::vector<Bytes>& s) {
    AttnParams p = host_params(q.data(), s[2].data(), s[3].data(), t, B, Snew, 0, Hq, Hkv, D, cache_rows);
    p.seqlens_k = seqlens.data();
    p.seqlens_k_added = Snew;
    p.seqlen_k = *std::max_element(seqlens.begin(), seqlens.end()) + Snew;
    if (paged) {
      p.block_table = table.data();
      p.max_pages_per_seq = max_pages;
      p.page_size = page;
    }
    // The cache after the call: as given, plus the new rows at seqlens[b] + r, nothing else.
    Bytes want_k = k_cache, want_v = v_cache;
    const size_t row = size_t(D * ioattn::dtype_bytes(t));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < Snew; ++i)
        for (int64_t h = 0; h < Hkv; ++h) {
          const ioattn::SeqSpan span = ioattn::sequence(p, b);
          const size_t dst =
              size_t(ioattn::k_offset(p, b, span, seqlens[size_t(b)] + i, h)) * size_t(ioattn::dtype_bytes(t));
          const size_t src = size_t(((b * Snew + i) * Hkv + h) * D * ioattn::dtype_bytes(t));
          std::memcpy(want_k.data() + dst, k_new.data() + src, row);
          std::memcpy(want_v.data() + dst, v_new.data() + src, row);
        }
    CHECK(difference({s[2], s[3]}, {want_k, want_v}) == "");
    check_reference(p, t, s[0], s[1]);
  };
  return r;
}

std::vector<std::unique_ptr<Request>> all_requests() {
  std::vector<std::unique_ptr<Request>> r;
  r.push_back(dense_request(DType::bf16));
  r.push_back(dense_request(DType::f32));
  r.push_back(varlen_request());
  r.push_back(kvcache_request(false));
  r.push_back(kvcache_request(true));
  return r;
}

// A clean run on the default stream: checked against the reference, its bytes returned.
std::vector<Bytes> clean_run(Request& r) {
  r.reset();
  const ioattn_status s = r.call(nullptr);
  INFO(r.name << ": " << ioattn_last_error());
  REQUIRE(s == IOATTN_OK);
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<Bytes> clean = r.state();
  r.check_clean_run(clean);
  return clean;
}

// After a failed call: the documented status and a message carrying the CUDA error, no CUDA
// error left pending, the device healthy, nothing written; then the next call on the same stream
// succeeds with the clean bits. Uses CHECK throughout so one run reports every broken property.
void check_failed_call(Request& r, const char* injected, ioattn_status s, const std::vector<Bytes>& before,
                       const std::vector<Bytes>& clean, cudaError_t expected_error, cudaStream_t next_stream) {
  const std::string message = ioattn_last_error();
  const cudaError_t pending = cudaPeekAtLastError();
  const bool healthy = cudaDeviceSynchronize() == cudaSuccess;
  const std::string written = difference(r.state(), before);
  const ioattn_status next = r.call(next_stream);
  const std::string next_message = next == IOATTN_OK ? "" : ioattn_last_error();
  const bool next_synced = cudaStreamSynchronize(next_stream) == cudaSuccess;
  const std::string next_bits = difference(r.state(), clean);
  std::printf("  %s | %s: status %d \"%s\" | pending %s | %s | next call: status %d%s%s\n", r.name.c_str(), injected,
              int(s), message.c_str(), cudaGetErrorName(pending), written.empty() ? "nothing written" : written.c_str(),
              int(next), next_message.empty() ? "" : (" \"" + next_message + "\"").c_str(),
              next_bits.empty() ? ", clean bits" : (", " + next_bits).c_str());
  INFO("status " << int(s) << ", message: " << message);
  CHECK(s == IOATTN_ERROR_BACKEND);
  CHECK(message.find("backend=CUDA") != std::string::npos);
  if (expected_error != cudaSuccess) CHECK(message.find(cudaGetErrorString(expected_error)) != std::string::npos);
  INFO("pending CUDA error after the call: " << cudaGetErrorName(pending));
  CHECK(pending == cudaSuccess);
  CHECK(healthy);
  CHECK(written == "");
  INFO("next call: status " << int(next) << ", " << next_message);
  CHECK(next == IOATTN_OK);
  CHECK(next_synced);
  CHECK(next_bits == "");
  // A pending error the checks above reported must not also fail every later case.
  cudaGetLastError();
  r.reset();
}

}  // namespace

TEST_CASE("every CUDA runtime call the library makes, failed once: BACKEND, nothing written, next call clean",
          "[gpu][faults][sanitize]") {
  for (const auto& r : all_requests()) {
    const std::vector<Bytes> clean = clean_run(*r);
    constexpr long kMaxCalls = 64;
    std::vector<std::string> failed_calls;
    long n = 0;
    for (; n < kMaxCalls; ++n) {
      r->reset();
      const std::vector<Bytes> before = r->state();
      REQUIRE(cudaGetLastError() == cudaSuccess);
      ioattn_status s;
      const char* failed = nullptr;
      cudaError_t injected = cudaSuccess;
      {
        ArmedFailure armed(n);
        s = r->call(nullptr);
        failed = g_failed_call;
        injected = g_injected_error;
      }
      if (!failed) {
        INFO(r->name << ": a call with no failure left to inject: " << ioattn_last_error());
        CHECK(s == IOATTN_OK);
        CUDA_OK(cudaDeviceSynchronize());
        CHECK(difference(r->state(), clean) == "");
        break;
      }
      failed_calls.push_back(failed);
      INFO(r->name << ": wrapped call " << n << " (" << failed << ") failed with " << cudaGetErrorName(injected));
      check_failed_call(*r, failed, s, before, clean, injected, nullptr);
    }
    std::string calls;
    for (const std::string& c : failed_calls) calls += (calls.empty() ? "" : ", ") + c;
    std::printf("%s: %ld runtime calls failed one at a time: %s\n", r->name.c_str(), n, calls.c_str());
    INFO(r->name << " failed calls: " << calls);
    // Every request queries the device and launches at least one kernel: a wrapper the linker did
    // not route (a renamed runtime entry point) shows up here instead of passing vacuously.
    CHECK(std::count(failed_calls.begin(), failed_calls.end(), "kernel launch") >= 1);
    CHECK(std::count(failed_calls.begin(), failed_calls.end(), "cudaDeviceGetAttribute") >= 1);
    CHECK(n < kMaxCalls);
  }
}

TEST_CASE("the legacy default stream while another stream captures a graph: BACKEND, nothing written, next call clean",
          "[gpu][faults][sanitize]") {
  cudaStream_t capturing = nullptr, next = nullptr;
  CUDA_OK(cudaStreamCreate(&capturing));  // blocking: the legacy stream would have to wait on it
  CUDA_OK(cudaStreamCreate(&next));
  for (const auto& r : all_requests()) {
    const std::vector<Bytes> clean = clean_run(*r);
    r->reset();
    const std::vector<Bytes> before = r->state();
    REQUIRE(cudaGetLastError() == cudaSuccess);
    CUDA_OK(cudaStreamBeginCapture(capturing, cudaStreamCaptureModeRelaxed));
    const ioattn_status s = r->call(nullptr);
    const std::string message = ioattn_last_error();
    const cudaError_t pending = cudaPeekAtLastError();
    // Ending the invalidated capture is this test's own failure; clear it before checking.
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(capturing, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    INFO(r->name << ": status " << int(s) << ", message: " << message << "; pending after the call: "
                 << cudaGetErrorName(pending) << "; end of capture: " << cudaGetErrorName(end));
    CHECK(pending == cudaSuccess);
    check_failed_call(*r, "legacy stream during a capture", s, before, clean, cudaErrorStreamCaptureImplicit, next);
  }
  CUDA_OK(cudaStreamDestroy(capturing));
  CUDA_OK(cudaStreamDestroy(next));
}

TEST_CASE("a capturing stream: dense forward is captured and replays exactly; metadata readers refuse it",
          "[gpu][faults][sanitize]") {
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (const auto& r : all_requests()) {
    const std::vector<Bytes> clean = clean_run(*r);
    r->reset();
    const std::vector<Bytes> before = r->state();
    REQUIRE(cudaGetLastError() == cudaSuccess);
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const ioattn_status s = r->call(stream);
    const std::string message = ioattn_last_error();
    const cudaError_t pending = cudaPeekAtLastError();
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    INFO(r->name << ": status " << int(s) << ", message: " << message << "; pending after the call: "
                 << cudaGetErrorName(pending) << "; end of capture: " << cudaGetErrorName(end));
    std::printf("%s, on a capturing stream: status %d, \"%s\"\n", r->name.c_str(), int(s), message.c_str());
    CHECK(pending == cudaSuccess);
    if (s == IOATTN_OK) {
      // Captured, not run: nothing written until the graph replays, then exactly the clean bits.
      REQUIRE(end == cudaSuccess);
      REQUIRE(graph != nullptr);
      CHECK(difference(r->state(), before) == "");
      cudaGraphExec_t exec = nullptr;
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      CHECK(difference(r->state(), clean) == "");
      CUDA_OK(cudaGraphExecDestroy(exec));
      CUDA_OK(cudaGraphDestroy(graph));
    } else {
      // The KV-cache and varlen entry points read their metadata on the host before anything is
      // written, which needs a synchronize that a capturing stream cannot do.
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      CHECK(r->name.find("ioattn_forward ") != 0);
      CHECK((s == IOATTN_ERROR_UNSUPPORTED || s == IOATTN_ERROR_BACKEND));
      CHECK(!message.empty());
      CHECK(cudaDeviceSynchronize() == cudaSuccess);
      CHECK(difference(r->state(), before) == "");
      CHECK(r->call(stream) == IOATTN_OK);
      CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
      CHECK(difference(r->state(), clean) == "");
    }
  }
  CUDA_OK(cudaStreamDestroy(stream));
}

#endif  // IOATTN_HAVE_CUDA (main: tests/gpu_main.cc)
