// Standard attention with S materialized: the unfused baseline the flash kernel must beat.
#include <cblas.h>

#include <algorithm>
#include <string>

#include "bench/lib/peers.h"
#include "bench/lib/probes.h"
#include "common/alloc.h"
#include "cpu/threading.h"

namespace ioattn::peers {

size_t standard_attention_scratch_bytes(const AttnParams& p) {
  const size_t sq = size_t(p.seqlen_q), sk = size_t(p.seqlen_k), d = size_t(p.head_dim), dv = size_t(p.head_dim_v);
  return (sq * d + sk * d + sk * dv + sq * sk + sq * dv) * sizeof(float);
}

Status standard_attention(const AttnParams& p, int threads, size_t* scratch_bytes) {
  if (p.cu_seqlens_q || p.cu_seqlens_k || p.seqlens_k || p.block_table)
    return Status::unsupported("standard attention baseline: dense requests only");
  const int64_t sq = p.seqlen_q, sk = p.seqlen_k, d = p.head_dim, dv = p.head_dim_v;
  const size_t bytes = standard_attention_scratch_bytes(p);
  if (scratch_bytes) *scratch_bytes = bytes;
  ScratchPtr<float> q = scratch_array<float>(size_t(sq * d)), k = scratch_array<float>(size_t(sk * d)),
                    v = scratch_array<float>(size_t(sk * dv)), s = scratch_array<float>(size_t(sq * sk)),
                    o = scratch_array<float>(size_t(sq * dv));
  if (!q || !k || !v || !s || !o)
    return Status::out_of_memory("standard attention baseline: could not allocate " + std::to_string(bytes) + " bytes");
  openblas_set_num_threads(std::max(threads, 1));
  const SeqSpan span{0, sq, 0, sk};
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t hk = kv_head_of(p, h);
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t c = 0; c < d; ++c)
          q[size_t(i * d + c)] = load_as_f32(p.q, q_offset(p, b, span, i, h) + c, p.io_dtype);
      for (int64_t j = 0; j < sk; ++j) {
        for (int64_t c = 0; c < d; ++c)
          k[size_t(j * d + c)] = load_as_f32(p.k, k_offset(p, b, span, j, hk) + c, p.kv_dtype);
        for (int64_t c = 0; c < dv; ++c)
          v[size_t(j * dv + c)] = load_as_f32(p.v, v_offset(p, b, span, j, hk) + c, p.kv_dtype);
      }
      if (sk > 0 && sq > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(sq), int(sk), int(d), p.scale, q.get(), int(d),
                    k.get(), int(d), 0.f, s.get(), int(sk));
      }
      // Rows in chunks of 16: enough per task to amortize the hand-out, enough tasks to balance.
      const int64_t chunk = 16;
      cpu::parallel_for((sq + chunk - 1) / chunk, threads, [&](int64_t task, int) {
        for (int64_t i = task * chunk; i < std::min(sq, (task + 1) * chunk); ++i) {
          const KeyRange keys = visible_keys(p, span, i);
          const float lse = softmax_row(s.get() + i * sk, sk, keys.begin, keys.end, p.softcap);
          if (p.lse) p.lse[lse_offset(p, b, span, i, h)] = lse;
        }
      });
      if (sk > 0 && sq > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(sq), int(dv), int(sk), 1.f, s.get(), int(sk),
                    v.get(), int(dv), 0.f, o.get(), int(dv));
      } else {
        std::fill_n(o.get(), size_t(sq * dv), 0.f);
      }
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t c = 0; c < dv; ++c)
          store_from_f32(p.out, o_offset(p, b, span, i, h) + c, p.io_dtype, o[size_t(i * dv + c)]);
    }
  }
  return Status::ok();
}

}  // namespace ioattn::peers
