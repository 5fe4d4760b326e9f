#include "cpu/kv_append.h"

#include <cstring>
#include <string>

#include "common/dtype.h"

namespace ioattn::cpu {

Status KvAppender::prepare(const AttnParams& p, const KvAppend& a, const int32_t* seqlens) {
  p_ = &p;
  a_ = &a;
  seqlens_ = seqlens;
  const int64_t rows = p.batch * a.seqlen_new * p.heads_kv;
  const size_t bytes = size_t(rows) * size_t(p.head_dim + p.head_dim_v) * size_t(dtype_bytes(p.kv_dtype));
  backup_.reset(static_cast<char*>(scratch_alloc(bytes)));
  if (!backup_ && bytes > 0)
    return Status::out_of_memory("cannot allocate " + std::to_string(bytes) + " bytes to stage the KV-cache append");
  return Status::ok();
}

void KvAppender::copy_rows(bool forward) {
  const AttnParams& p = *p_;
  const KvAppend& a = *a_;
  const int64_t kv_bytes = dtype_bytes(p.kv_dtype);
  const int64_t k_row = p.head_dim * kv_bytes, v_row = p.head_dim_v * kv_bytes;
  char* saved = backup_.get();
  for (int64_t b = 0; b < p.batch; ++b) {
    const SeqSpan s = sequence(p, b);
    for (int64_t r = 0; r < a.seqlen_new; ++r) {
      const int64_t j = seqlens_[b] + r;
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        const int64_t k_src = b * a.k_batch_stride + r * a.k_seq_stride + h * a.k_head_stride;
        const int64_t v_src = b * a.v_batch_stride + r * a.v_seq_stride + h * a.v_head_stride;
        char* k_cache = const_cast<char*>(static_cast<const char*>(p.k)) + k_offset(p, b, s, j, h) * kv_bytes;
        char* v_cache = const_cast<char*>(static_cast<const char*>(p.v)) + v_offset(p, b, s, j, h) * kv_bytes;
        if (forward) {
          std::memcpy(saved, k_cache, size_t(k_row));
          std::memcpy(saved + k_row, v_cache, size_t(v_row));
          for (int64_t c = 0; c < p.head_dim; ++c)
            store_from_f32(k_cache, c, p.kv_dtype, load_as_f32(a.k_new, k_src + c, a.dtype));
          for (int64_t c = 0; c < p.head_dim_v; ++c)
            store_from_f32(v_cache, c, p.kv_dtype, load_as_f32(a.v_new, v_src + c, a.dtype));
        } else {
          std::memcpy(k_cache, saved, size_t(k_row));
          std::memcpy(v_cache, saved + k_row, size_t(v_row));
        }
        saved += k_row + v_row;
      }
    }
  }
}

}  // namespace ioattn::cpu
