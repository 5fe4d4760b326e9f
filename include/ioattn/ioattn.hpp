// ioattn C++ API: a thin, header-only layer over the C ABI (one core, two faces). Errors become
// ioattn::Error exceptions on the caller's side; the library itself never throws across the ABI.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "ioattn/ioattn.h"

namespace ioattn {

enum class DTypeCode : int32_t { f32 = IOATTN_F32, f16 = IOATTN_F16, bf16 = IOATTN_BF16 };

class Error : public std::runtime_error {
 public:
  Error(ioattn_status status, const std::string& what) : std::runtime_error(what), status_(status) {}
  ioattn_status status() const { return status_; }

 private:
  ioattn_status status_;
};

// A (B, S, H, D) view with D contiguous; strides in elements.
struct TensorView {
  ioattn_tensor raw{};

  // Contiguous (B, S, H, D) layout.
  static TensorView contiguous(void* data, DTypeCode dtype, int64_t batch, int64_t seqlen, int64_t heads,
                               int64_t head_dim) {
    return strided(data, dtype, batch, seqlen, heads, head_dim, seqlen * heads * head_dim, heads * head_dim, head_dim);
  }
  static TensorView strided(void* data, DTypeCode dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
                            int64_t stride_batch, int64_t stride_seq, int64_t stride_head) {
    TensorView t;
    t.raw = {data, int32_t(dtype), batch, seqlen, heads, head_dim, stride_batch, stride_seq, stride_head};
    return t;
  }
};

struct Options {
  float scale = 0.f;  // <= 0: 1/sqrt(D)
  bool causal = false;
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.f;
  ioattn_backend backend = IOATTN_BACKEND_CPU;
  int32_t num_threads = 0;
  void* cuda_stream = nullptr;

  ioattn_options raw() const {
    ioattn_options o;
    ioattn_options_default(&o);
    o.scale = scale;
    o.causal = causal ? 1 : 0;
    o.window_left = window_left;
    o.window_right = window_right;
    o.softcap = softcap;
    o.backend = backend;
    o.num_threads = num_threads;
    o.cuda_stream = cuda_stream;
    return o;
  }
};

inline void check(ioattn_status s) {
  if (s != IOATTN_OK) throw Error(s, std::string(ioattn_status_string(s)) + ": " + ioattn_last_error());
}

inline void forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    float* lse = nullptr, const Options& options = {}) {
  const ioattn_options o = options.raw();
  check(ioattn_forward(&q.raw, &k.raw, &v.raw, &out.raw, lse, &o));
}

inline void forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const int32_t* cu_seqlens_q,
                           const int32_t* cu_seqlens_k, int32_t batch, const TensorView& out, float* lse = nullptr,
                           const Options& options = {}) {
  const ioattn_options o = options.raw();
  check(ioattn_forward_varlen(&q.raw, &k.raw, &v.raw, cu_seqlens_q, cu_seqlens_k, batch, &out.raw, lse, &o));
}

// k_new / v_new may both be null (no append).
inline void forward_kvcache(const TensorView& q, const ioattn_kvcache& cache, const TensorView* k_new,
                            const TensorView* v_new, const TensorView& out, float* lse = nullptr,
                            const Options& options = {}) {
  const ioattn_options o = options.raw();
  check(ioattn_forward_kvcache(&q.raw, &cache, k_new ? &k_new->raw : nullptr, v_new ? &v_new->raw : nullptr, &out.raw,
                               lse, &o));
}

inline std::string version() { return ioattn_version(); }

}  // namespace ioattn
