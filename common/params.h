// One request, resolved and validated by the API layer from any entry point (dense, KV cache,
// varlen), carried unchanged to the CPU and CUDA kernels (the role of FlashAttention's
// Flash_fwd_params). Lengths may vary per sequence; the accessors below are the only place that
// knows how a (sequence, row, head) becomes an element offset.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/host_device.h"
#include "common/masking.h"

namespace ioattn {

struct HardwareProfile;

struct TilingOverride {
  int block_q = 0;                  // 0: the planner's choice
  int block_kv = 0;                 // 0: the planner's choice
  int kv_splits = 0;                // 0: the planner's choice
  int decode_prefetch_blocks = -1;  // -1: the planner's choice
  // Plan as for this profile instead of the detected host (CPU): plans follow the caches, so the
  // tests run every built-in profile's plan on whatever machine runs them.
  const HardwareProfile* profile = nullptr;
};

struct AttnParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // may be null

  DType io_dtype = DType::f32;  // q and out
  DType kv_dtype = DType::f32;  // k and v (differs from io_dtype only on the KV-cache path)

  int64_t batch = 0, heads_q = 0, heads_kv = 0, head_dim = 0, head_dim_v = 0;
  int64_t seqlen_q = 0;  // dense length, or the longest sequence when lengths vary
  int64_t seqlen_k = 0;

  // Element strides. On the paged path the k/v batch stride is the page stride.
  int64_t q_batch_stride = 0, q_seq_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_seq_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_seq_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_seq_stride = 0, o_head_stride = 0;
  // lse[b * lse_batch_stride + h * lse_head_stride + q_begin(b) + i]
  int64_t lse_batch_stride = 0, lse_head_stride = 0;

  // Varlen: sequence b owns q rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) and k rows likewise;
  // the batch strides are then unused.
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  // KV cache: sequence b attends over seqlens_k[b] + seqlens_k_added keys (cached + appended);
  // seqlens_k lives where the backend computes.
  const int32_t* seqlens_k = nullptr;
  int64_t seqlens_k_added = 0;
  // Paged KV: key j of sequence b is row j % page_size of page
  // block_table[b * max_pages_per_seq + j / page_size].
  const int32_t* block_table = nullptr;
  int64_t max_pages_per_seq = 0;
  int64_t page_size = 0;

  float scale = 0.f;  // resolved: never <= 0 unless the caller asked for a negative scale
  float softcap = 0.f;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;  // as given; effective_window_right() folds causal

  int num_threads = 0;  // resolved by the API layer: >= 1
  void* stream = nullptr;
  TilingOverride tiling;
};

struct SeqSpan {
  int64_t q_begin, seqlen_q;  // q/out rows of this sequence in the packed layout (0 when dense)
  int64_t k_begin, seqlen_k;
};

IOATTN_HD SeqSpan sequence(const AttnParams& p, int64_t b) {
  SeqSpan s{0, p.seqlen_q, 0, p.seqlen_k};
  if (p.cu_seqlens_q) {
    s.q_begin = p.cu_seqlens_q[b];
    s.seqlen_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
  }
  if (p.cu_seqlens_k) {
    s.k_begin = p.cu_seqlens_k[b];
    s.seqlen_k = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  }
  if (p.seqlens_k) s.seqlen_k = p.seqlens_k[b] + p.seqlens_k_added;
  return s;
}

IOATTN_HD int64_t kv_head_of(const AttnParams& p, int64_t h) { return h / (p.heads_q / p.heads_kv); }

// Offsets in elements of row i (within sequence b) of head h.
IOATTN_HD int64_t q_offset(const AttnParams& p, int64_t b, const SeqSpan& s, int64_t i, int64_t h) {
  const int64_t batch_part = p.cu_seqlens_q ? 0 : b * p.q_batch_stride;
  return batch_part + (s.q_begin + i) * p.q_seq_stride + h * p.q_head_stride;
}
IOATTN_HD int64_t o_offset(const AttnParams& p, int64_t b, const SeqSpan& s, int64_t i, int64_t h) {
  const int64_t batch_part = p.cu_seqlens_q ? 0 : b * p.o_batch_stride;
  return batch_part + (s.q_begin + i) * p.o_seq_stride + h * p.o_head_stride;
}
IOATTN_HD int64_t lse_offset(const AttnParams& p, int64_t b, const SeqSpan& s, int64_t i, int64_t h) {
  return b * p.lse_batch_stride + h * p.lse_head_stride + s.q_begin + i;
}

// Key/value row j of sequence b, kv head hk: the paged, packed and dense cases in one place.
IOATTN_HD int64_t kv_row_offset(const AttnParams& p, int64_t b, const SeqSpan& s, int64_t j, int64_t batch_stride,
                                int64_t seq_stride) {
  if (p.block_table) {
    const int64_t page = p.block_table[b * p.max_pages_per_seq + j / p.page_size];
    return page * batch_stride + (j % p.page_size) * seq_stride;
  }
  if (p.cu_seqlens_k) return (s.k_begin + j) * seq_stride;
  return b * batch_stride + j * seq_stride;
}
IOATTN_HD int64_t k_offset(const AttnParams& p, int64_t b, const SeqSpan& s, int64_t j, int64_t hk) {
  return kv_row_offset(p, b, s, j, p.k_batch_stride, p.k_seq_stride) + hk * p.k_head_stride;
}
IOATTN_HD int64_t v_offset(const AttnParams& p, int64_t b, const SeqSpan& s, int64_t j, int64_t hk) {
  return kv_row_offset(p, b, s, j, p.v_batch_stride, p.v_seq_stride) + hk * p.v_head_stride;
}

IOATTN_HD KeyRange visible_keys(const AttnParams& p, const SeqSpan& s, int64_t i) {
  return visible_keys(i, s.seqlen_q, s.seqlen_k, p.window_left, effective_window_right(p.causal, p.window_right));
}

}  // namespace ioattn
