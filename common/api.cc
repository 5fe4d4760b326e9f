// The C ABI: validates a request completely, turns it into one AttnParams, and hands it to a
// backend. Every check happens before anything is written, and every failure names the
// argument and the value, so a caller can fix the call from the message alone.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "common/backend.h"
#include "common/calibration.h"
#include "common/cpu_tiles.h"
#include "common/hardware.h"
#include "common/params.h"
#include "common/status.h"
#include "ioattn/ioattn.h"

namespace ioattn {
namespace {

thread_local std::string t_last_error;

template <class... Args>
std::string format(const char* fmt, Args... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

bool valid_dtype(int32_t d) { return d == IOATTN_F32 || d == IOATTN_F16 || d == IOATTN_BF16; }
const char* dtype_str(int32_t d) { return valid_dtype(d) ? dtype_name(DType(d)) : "invalid"; }

// Offset one past the last element a tensor addresses, or -1 on int64 overflow.
int64_t element_span(const ioattn_tensor& t) {
  if (t.batch == 0 || t.seqlen == 0 || t.heads == 0 || t.head_dim == 0) return 0;
  int64_t span = t.head_dim, term;
  const int64_t extents[3] = {t.batch, t.seqlen, t.heads};
  const int64_t strides[3] = {t.stride_batch, t.stride_seq, t.stride_head};
  for (int i = 0; i < 3; ++i) {
    if (__builtin_mul_overflow(extents[i] - 1, strides[i], &term) || __builtin_add_overflow(span, term, &span))
      return -1;
  }
  return span;
}

Status check_tensor(const ioattn_tensor* t, const char* name) {
  if (!t) return Status::invalid(format("%s: null tensor pointer", name));
  if (!valid_dtype(t->dtype))
    return Status::invalid(format("%s.dtype=%d: expected 0 (f32), 1 (f16) or 2 (bf16)", name, t->dtype));
  const int64_t dims[4] = {t->batch, t->seqlen, t->heads, t->head_dim};
  const char* dim_names[4] = {"batch", "seqlen", "heads", "head_dim"};
  for (int i = 0; i < 4; ++i)
    if (dims[i] < 0) return Status::invalid(format("%s.%s=%lld: must be >= 0", name, dim_names[i], (long long)dims[i]));
  if (t->heads < 1) return Status::invalid(format("%s.heads=%lld: must be >= 1", name, (long long)t->heads));
  if (t->head_dim < 1) return Status::invalid(format("%s.head_dim=%lld: must be >= 1", name, (long long)t->head_dim));
  const int64_t strides[3] = {t->stride_batch, t->stride_seq, t->stride_head};
  const char* stride_names[3] = {"stride_batch", "stride_seq", "stride_head"};
  for (int i = 0; i < 3; ++i)
    if (strides[i] < 0)
      return Status::invalid(
          format("%s.%s=%lld: strides must be >= 0 (in elements)", name, stride_names[i], (long long)strides[i]));
  const int64_t span = element_span(*t);
  int64_t span_bytes = 0;
  if (span < 0 || __builtin_mul_overflow(span, int64_t(dtype_bytes(DType(t->dtype))), &span_bytes))
    return Status::invalid(format("%s: shape times strides overflows a 64-bit offset", name));
  if (span > 0 && !t->data) return Status::invalid(format("%s.data is NULL for a non-empty tensor", name));
  // The alias checks form [data, data + span_bytes): that range must exist in the address space.
  if (uint64_t(span_bytes) > UINTPTR_MAX - reinterpret_cast<uintptr_t>(t->data))
    return Status::invalid(format("%s: %lld bytes from data=%p run past the end of the address space", name,
                                  (long long)span_bytes, t->data));
  return Status::ok();
}

// An output written through overlapping strides would make results depend on write order, so
// its strides must give every element its own address: sorted by stride, each axis must step
// past everything the smaller axes span.
Status check_distinct_elements(const ioattn_tensor& t, const char* name) {
  struct Axis {
    int64_t extent, stride;
    const char* label;
  };
  // An empty tensor has no elements to collide, and its strides were never bounded by a span.
  if (element_span(t) == 0) return Status::ok();
  std::vector<Axis> axes;
  if (t.batch > 1) axes.push_back({t.batch, t.stride_batch, "stride_batch"});
  if (t.seqlen > 1) axes.push_back({t.seqlen, t.stride_seq, "stride_seq"});
  if (t.heads > 1) axes.push_back({t.heads, t.stride_head, "stride_head"});
  std::sort(axes.begin(), axes.end(), [](const Axis& a, const Axis& b) { return a.stride < b.stride; });
  int64_t covered = t.head_dim;
  for (const Axis& a : axes) {
    if (a.stride < covered)
      return Status::invalid(format("%s.%s=%lld: output elements would overlap (needs >= %lld)", name, a.label,
                                    (long long)a.stride, (long long)covered));
    covered = a.stride * (a.extent - 1) + covered;
  }
  return Status::ok();
}

struct ByteRange {
  const char* begin;
  const char* end;
};

ByteRange bytes_of(const ioattn_tensor& t) {
  const char* base = static_cast<const char*>(t.data);
  const int64_t span = element_span(t);
  return {base, base + span * dtype_bytes(DType(t.dtype))};
}

bool overlaps(ByteRange a, ByteRange b) {
  return a.begin < b.end && b.begin < a.end && a.begin != a.end && b.begin != b.end;
}

Status check_options(const ioattn_options* opt) {
  if (!opt) return Status::invalid("opt: null options pointer (use ioattn_options_default)");
  if (opt->causal != 0 && opt->causal != 1)
    return Status::invalid(format("opt.causal=%d: expected 0 or 1", opt->causal));
  if (opt->window_left < -1)
    return Status::invalid(format("opt.window_left=%d: expected -1 (unbounded) or >= 0", opt->window_left));
  if (opt->window_right < -1)
    return Status::invalid(format("opt.window_right=%d: expected -1 (unbounded) or >= 0", opt->window_right));
  if (!std::isfinite(opt->scale)) return Status::invalid(format("opt.scale=%g: must be finite", opt->scale));
  if (!std::isfinite(opt->softcap) || opt->softcap < 0)
    return Status::invalid(format("opt.softcap=%g: expected 0 (off) or a finite value > 0", opt->softcap));
  if (opt->backend != IOATTN_BACKEND_CPU && opt->backend != IOATTN_BACKEND_CUDA)
    return Status::invalid(format("opt.backend=%d: expected 0 (CPU) or 1 (CUDA)", opt->backend));
  if (opt->num_threads < 0)
    return Status::invalid(format("opt.num_threads=%d: expected 0 (library default) or >= 1", opt->num_threads));
  return Status::ok();
}

Status check_backend(const ioattn_options& opt, int64_t head_dim, int64_t head_dim_v) {
  if (opt.backend == IOATTN_BACKEND_CUDA) {
    if (!gpu_backend().available())
      return Status::unsupported("opt.backend=CUDA: no usable CUDA device or this build has no CUDA backend");
    return Status::ok();
  }
  if (head_dim > cpu_max_head_dim || head_dim_v > cpu_max_head_dim)
    return Status::unsupported(format("head_dim=%lld / head_dim_v=%lld: the CPU backend supports head dims 1..%lld",
                                      (long long)head_dim, (long long)head_dim_v, (long long)cpu_max_head_dim));
  return Status::ok();
}

void set_strides(const ioattn_tensor& t, int64_t* batch, int64_t* seq, int64_t* head) {
  *batch = t.stride_batch;
  *seq = t.stride_seq;
  *head = t.stride_head;
}

void fill_common(AttnParams& p, const ioattn_tensor& q, const ioattn_tensor& k, const ioattn_tensor& v,
                 const ioattn_tensor& out, float* lse, const ioattn_options& opt) {
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.out = out.data;
  p.lse = lse;
  p.io_dtype = DType(q.dtype);
  p.kv_dtype = DType(k.dtype);
  p.heads_q = q.heads;
  p.heads_kv = k.heads;
  p.head_dim = q.head_dim;
  p.head_dim_v = v.head_dim;
  set_strides(q, &p.q_batch_stride, &p.q_seq_stride, &p.q_head_stride);
  set_strides(k, &p.k_batch_stride, &p.k_seq_stride, &p.k_head_stride);
  set_strides(v, &p.v_batch_stride, &p.v_seq_stride, &p.v_head_stride);
  set_strides(out, &p.o_batch_stride, &p.o_seq_stride, &p.o_head_stride);
  p.scale = opt.scale > 0 ? opt.scale : float(1.0 / std::sqrt(double(q.head_dim)));
  p.softcap = opt.softcap;
  p.causal = opt.causal != 0;
  p.window_left = opt.window_left;
  p.window_right = opt.window_right;
  p.num_threads = opt.num_threads > 0 ? opt.num_threads : default_threads();
  p.stream = opt.cuda_stream;
}

// Shape agreement shared by all entry points: head dims, heads, GQA divisibility.
Status check_heads(const ioattn_tensor& q, const ioattn_tensor& k, const ioattn_tensor& v, const ioattn_tensor& out,
                   const char* k_name, const char* v_name) {
  if (k.head_dim != q.head_dim)
    return Status::invalid(
        format("%s.head_dim=%lld: must equal q.head_dim=%lld", k_name, (long long)k.head_dim, (long long)q.head_dim));
  if (out.head_dim != v.head_dim)
    return Status::invalid(format("out.head_dim=%lld: must equal %s.head_dim=%lld", (long long)out.head_dim, v_name,
                                  (long long)v.head_dim));
  if (v.heads != k.heads)
    return Status::invalid(
        format("%s.heads=%lld: must equal %s.heads=%lld", v_name, (long long)v.heads, k_name, (long long)k.heads));
  if (out.heads != q.heads)
    return Status::invalid(format("out.heads=%lld: must equal q.heads=%lld", (long long)out.heads, (long long)q.heads));
  if (q.heads % k.heads != 0)
    return Status::invalid(format("q.heads=%lld: must be a multiple of %s.heads=%lld (GQA/MQA)", (long long)q.heads,
                                  k_name, (long long)k.heads));
  if (out.dtype != q.dtype)
    return Status::invalid(format("out.dtype=%s: must equal q.dtype=%s", dtype_str(out.dtype), dtype_str(q.dtype)));
  if (out.seqlen != q.seqlen || out.batch != q.batch)
    return Status::invalid(format("out shape (B=%lld, S=%lld): must equal q's (B=%lld, S=%lld)", (long long)out.batch,
                                  (long long)out.seqlen, (long long)q.batch, (long long)q.seqlen));
  return check_distinct_elements(out, "out");
}

// The output must not alias what the kernel still reads, or the result would depend on timing.
Status check_no_alias(const ioattn_tensor& out, float* lse, int64_t lse_count,
                      std::initializer_list<std::pair<const ioattn_tensor*, const char*>> inputs) {
  const ByteRange o = bytes_of(out);
  const ByteRange l{reinterpret_cast<const char*>(lse), reinterpret_cast<const char*>(lse + (lse ? lse_count : 0))};
  for (const auto& [t, name] : inputs) {
    if (!t) continue;
    if (overlaps(o, bytes_of(*t))) return Status::invalid(format("out: its memory overlaps input %s", name));
    if (overlaps(l, bytes_of(*t))) return Status::invalid(format("lse: its memory overlaps input %s", name));
  }
  if (overlaps(o, l)) return Status::invalid("lse: its memory overlaps out");
  return Status::ok();
}

Status forward_impl(const ioattn_tensor* q, const ioattn_tensor* k, const ioattn_tensor* v, const ioattn_tensor* out,
                    float* lse, const ioattn_options* opt) {
  Status s;
  if (!(s = check_options(opt)).is_ok()) return s;
  const std::pair<const ioattn_tensor*, const char*> all[4] = {{q, "q"}, {k, "k"}, {v, "v"}, {out, "out"}};
  for (const auto& [t, name] : all)
    if (!(s = check_tensor(t, name)).is_ok()) return s;
  if (k->dtype != q->dtype || v->dtype != q->dtype)
    return Status::invalid(format("k.dtype=%s, v.dtype=%s: must equal q.dtype=%s", dtype_str(k->dtype),
                                  dtype_str(v->dtype), dtype_str(q->dtype)));
  if (k->batch != q->batch || v->batch != q->batch)
    return Status::invalid(format("k.batch=%lld, v.batch=%lld: must equal q.batch=%lld", (long long)k->batch,
                                  (long long)v->batch, (long long)q->batch));
  if (v->seqlen != k->seqlen)
    return Status::invalid(
        format("v.seqlen=%lld: must equal k.seqlen=%lld", (long long)v->seqlen, (long long)k->seqlen));
  if (!(s = check_heads(*q, *k, *v, *out, "k", "v")).is_ok()) return s;
  if (!(s = check_no_alias(*out, lse, q->batch * q->heads * q->seqlen, {{q, "q"}, {k, "k"}, {v, "v"}})).is_ok())
    return s;
  if (!(s = check_backend(*opt, q->head_dim, v->head_dim)).is_ok()) return s;
  if (q->batch == 0 || q->seqlen == 0) return Status::ok();

  AttnParams p;
  fill_common(p, *q, *k, *v, *out, lse, *opt);
  p.batch = q->batch;
  p.seqlen_q = q->seqlen;
  p.seqlen_k = k->seqlen;
  p.lse_head_stride = q->seqlen;
  p.lse_batch_stride = q->heads * q->seqlen;
  return backend_for(opt->backend).forward(p);
}

// Metadata arrays live where the backend computes; validation reads a host copy.
Status host_copy(std::vector<int32_t>* dst, const int32_t* src, int64_t count, const ioattn_options& opt) {
  try {
    dst->assign(size_t(count), 0);
  } catch (const std::bad_alloc&) {
    return Status::out_of_memory(format("cannot allocate %lld metadata entries for validation", (long long)count));
  }
  if (count == 0) return Status::ok();
  return backend_for(opt.backend).download(dst->data(), src, size_t(count) * sizeof(int32_t), opt.cuda_stream);
}

Status varlen_impl(const ioattn_tensor* q, const ioattn_tensor* k, const ioattn_tensor* v, const int32_t* cu_seqlens_q,
                   const int32_t* cu_seqlens_k, int32_t batch, const ioattn_tensor* out, float* lse,
                   const ioattn_options* opt) {
  Status s;
  if (!(s = check_options(opt)).is_ok()) return s;
  const std::pair<const ioattn_tensor*, const char*> all[4] = {{q, "q"}, {k, "k"}, {v, "v"}, {out, "out"}};
  for (const auto& [t, name] : all) {
    if (!(s = check_tensor(t, name)).is_ok()) return s;
    if (t->batch != 1)
      return Status::invalid(
          format("%s.batch=%lld: packed varlen tensors have batch 1 (1, total, H, D)", name, (long long)t->batch));
  }
  if (batch < 0) return Status::invalid(format("batch=%d: must be >= 0", batch));
  if (k->dtype != q->dtype || v->dtype != q->dtype)
    return Status::invalid(format("k.dtype=%s, v.dtype=%s: must equal q.dtype=%s", dtype_str(k->dtype),
                                  dtype_str(v->dtype), dtype_str(q->dtype)));
  if (v->seqlen != k->seqlen)
    return Status::invalid(
        format("v.seqlen=%lld: must equal k.seqlen=%lld", (long long)v->seqlen, (long long)k->seqlen));
  if (!(s = check_heads(*q, *k, *v, *out, "k", "v")).is_ok()) return s;
  if (!(s = check_no_alias(*out, lse, q->heads * q->seqlen, {{q, "q"}, {k, "k"}, {v, "v"}})).is_ok()) return s;
  if (!(s = check_backend(*opt, q->head_dim, v->head_dim)).is_ok()) return s;
  if (batch == 0) return Status::ok();
  if (!cu_seqlens_q) return Status::invalid("cu_seqlens_q: NULL with batch > 0");
  if (!cu_seqlens_k) return Status::invalid("cu_seqlens_k: NULL with batch > 0");
  std::vector<int32_t> cq, ck;
  if (!(s = host_copy(&cq, cu_seqlens_q, int64_t(batch) + 1, *opt)).is_ok()) return s;
  if (!(s = host_copy(&ck, cu_seqlens_k, int64_t(batch) + 1, *opt)).is_ok()) return s;
  int64_t max_q = 0, max_k = 0;
  const struct {
    const std::vector<int32_t>& cu;
    const char* name;
    int64_t total;
    int64_t* longest;
  } arrays[2] = {{cq, "cu_seqlens_q", q->seqlen, &max_q}, {ck, "cu_seqlens_k", k->seqlen, &max_k}};
  for (const auto& a : arrays) {
    if (a.cu[0] < 0) return Status::invalid(format("%s[0]=%d: must be >= 0", a.name, a.cu[0]));
    for (int32_t b = 0; b < batch; ++b) {
      if (a.cu[size_t(b) + 1] < a.cu[size_t(b)])
        return Status::invalid(format("%s[%d]=%d: must be >= %s[%d]=%d (non-decreasing)", a.name, b + 1,
                                      a.cu[size_t(b) + 1], a.name, b, a.cu[size_t(b)]));
      *a.longest = std::max<int64_t>(*a.longest, a.cu[size_t(b) + 1] - a.cu[size_t(b)]);
    }
    if (a.cu[size_t(batch)] > a.total)
      return Status::invalid(
          format("%s[%d]=%d: exceeds the packed length %lld", a.name, batch, a.cu[size_t(batch)], (long long)a.total));
  }
  AttnParams p;
  fill_common(p, *q, *k, *v, *out, lse, *opt);
  p.batch = batch;
  p.seqlen_q = max_q;
  p.seqlen_k = max_k;
  p.cu_seqlens_q = cu_seqlens_q;
  p.cu_seqlens_k = cu_seqlens_k;
  p.lse_head_stride = q->seqlen;
  p.lse_batch_stride = 0;
  return backend_for(opt->backend).forward(p);
}

// Positions the append writes, as flat element-row ids, so a block table that sends two
// sequences' new tokens to the same slot is rejected instead of racing.
struct CacheCheck {
  int64_t max_keys = 0;
};

Status check_cache(const ioattn_kvcache& cache, const ioattn_tensor& q, int64_t seqlen_new,
                   const std::vector<int32_t>& seqlens, const std::vector<int32_t>& table, CacheCheck* out) {
  const bool paged = cache.block_table != nullptr;
  const int64_t capacity_rows = cache.k.seqlen;  // S_max, or page_size when paged
  if (cache.v.seqlen != cache.k.seqlen || cache.v.batch != cache.k.batch)
    return Status::invalid(format("cache.v shape (B=%lld, S=%lld): must equal cache.k's (B=%lld, S=%lld)",
                                  (long long)cache.v.batch, (long long)cache.v.seqlen, (long long)cache.k.batch,
                                  (long long)cache.k.seqlen));
  if (!paged && cache.k.batch != q.batch)
    return Status::invalid(format("cache.k.batch=%lld: must equal q.batch=%lld for a contiguous cache",
                                  (long long)cache.k.batch, (long long)q.batch));
  if (paged && cache.max_pages_per_seq < 1)
    return Status::invalid(
        format("cache.max_pages_per_seq=%d: must be >= 1 with a block table", cache.max_pages_per_seq));
  if (paged && capacity_rows < 1)
    return Status::invalid(format("cache.k.seqlen (page_size)=%lld: must be >= 1", (long long)capacity_rows));
  std::vector<int64_t> written;
  for (int64_t b = 0; b < q.batch; ++b) {
    const int32_t len = seqlens[size_t(b)];
    if (len < 0) return Status::invalid(format("cache.seqlens[%lld]=%d: must be >= 0", (long long)b, len));
    const int64_t total = int64_t(len) + seqlen_new;
    out->max_keys = std::max(out->max_keys, total);
    if (!paged) {
      if (total > capacity_rows)
        return Status::invalid(format("cache.seqlens[%lld]=%d + %lld new tokens exceeds the cache capacity %lld",
                                      (long long)b, len, (long long)seqlen_new, (long long)capacity_rows));
      continue;
    }
    const int64_t pages = (total + capacity_rows - 1) / capacity_rows;
    if (pages > cache.max_pages_per_seq)
      return Status::invalid(
          format("cache.seqlens[%lld]=%d + %lld new tokens needs %lld pages of %lld, more than "
                 "max_pages_per_seq=%d",
                 (long long)b, len, (long long)seqlen_new, (long long)pages, (long long)capacity_rows,
                 cache.max_pages_per_seq));
    for (int64_t j = 0; j < pages; ++j) {
      const int32_t page = table[size_t(b * cache.max_pages_per_seq + j)];
      if (page < 0 || page >= cache.k.batch)
        return Status::invalid(format("cache.block_table[%lld][%lld]=%d: page id outside [0, %lld)", (long long)b,
                                      (long long)j, page, (long long)cache.k.batch));
    }
    for (int64_t r = len; r < total; ++r) {
      const int64_t page = table[size_t(b * cache.max_pages_per_seq + r / capacity_rows)];
      written.push_back(page * capacity_rows + r % capacity_rows);
    }
  }
  std::sort(written.begin(), written.end());
  if (std::adjacent_find(written.begin(), written.end()) != written.end())
    return Status::invalid("cache.block_table: two sequences append into the same page slot");
  return Status::ok();
}

// The append writes B * Snew * Hkv rows into each of cache.k and cache.v and reads as many from
// k_new and v_new. A row is one contiguous run of head_dim elements, so comparing rows as byte
// intervals is exact, and it still admits interleaved layouts (K and V of one packed buffer)
// that a whole-span comparison would refuse. A write landing on another write, or on a row the
// append still reads, would make the cache depend on the order of the copies (and race on the
// GPU). q is read after the append, so its whole span must miss every written row.
Status check_append_aliasing(const ioattn_kvcache& cache, const ioattn_tensor& q, const ioattn_tensor& k_new,
                             const ioattn_tensor& v_new, const std::vector<int32_t>& seqlens,
                             const std::vector<int32_t>& table) {
  struct Row {
    uintptr_t begin, end;
    bool write;
    const char* name;
  };
  std::vector<Row> rows;
  const bool paged = cache.block_table != nullptr;
  const int64_t page_size = cache.k.seqlen;
  auto add = [&rows](const ioattn_tensor& t, int64_t element, bool write, const char* name) {
    const int64_t bytes = dtype_bytes(DType(t.dtype));
    const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data) + uintptr_t(element * bytes);
    rows.push_back({begin, begin + uintptr_t(t.head_dim * bytes), write, name});
  };
  for (int64_t b = 0; b < q.batch; ++b) {
    for (int64_t r = 0; r < k_new.seqlen; ++r) {
      const int64_t j = seqlens[size_t(b)] + r;
      for (int64_t h = 0; h < cache.k.heads; ++h) {
        for (const ioattn_tensor* c : {&cache.k, &cache.v}) {
          const int64_t row =
              paged ? int64_t(table[size_t(b * cache.max_pages_per_seq + j / page_size)]) * c->stride_batch +
                          (j % page_size) * c->stride_seq
                    : b * c->stride_batch + j * c->stride_seq;
          add(*c, row + h * c->stride_head, true, c == &cache.k ? "cache.k" : "cache.v");
        }
        for (const ioattn_tensor* n : {&k_new, &v_new})
          add(*n, b * n->stride_batch + r * n->stride_seq + h * n->stride_head, false, n == &k_new ? "k_new" : "v_new");
      }
    }
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.begin < b.begin; });
  const Row* last_write = nullptr;
  const Row* last_read = nullptr;
  for (const Row& row : rows) {
    const Row* hit = last_write && row.begin < last_write->end              ? last_write
                     : row.write && last_read && row.begin < last_read->end ? last_read
                                                                            : nullptr;
    if (hit)
      return Status::invalid(
          format("%s and %s: the KV-cache append would write a row that overlaps another %s "
                 "(appended rows must be disjoint from each other and from k_new/v_new)",
                 hit->name, row.name, row.write && hit->write ? "written row" : "row it reads"));
    const Row*& last = row.write ? last_write : last_read;
    if (!last || row.end > last->end) last = &row;
  }
  const ByteRange q_bytes = bytes_of(q);
  for (const Row& row : rows)
    if (row.write &&
        overlaps(q_bytes, {reinterpret_cast<const char*>(row.begin), reinterpret_cast<const char*>(row.end)}))
      return Status::invalid(format("q: its memory overlaps rows the append writes into %s", row.name));
  return Status::ok();
}

Status kvcache_impl(const ioattn_tensor* q, const ioattn_kvcache* cache, const ioattn_tensor* k_new,
                    const ioattn_tensor* v_new, const ioattn_tensor* out, float* lse, const ioattn_options* opt) {
  Status s;
  if (!(s = check_options(opt)).is_ok()) return s;
  if (!cache) return Status::invalid("cache: null pointer");
  if (!(s = check_tensor(q, "q")).is_ok() || !(s = check_tensor(out, "out")).is_ok() ||
      !(s = check_tensor(&cache->k, "cache.k")).is_ok() || !(s = check_tensor(&cache->v, "cache.v")).is_ok())
    return s;
  if ((k_new == nullptr) != (v_new == nullptr))
    return Status::invalid(k_new ? "v_new: NULL while k_new is given (pass both or neither)"
                                 : "k_new: NULL while v_new is given (pass both or neither)");
  if (cache->v.dtype != cache->k.dtype)
    return Status::invalid(
        format("cache.v.dtype=%s: must equal cache.k.dtype=%s", dtype_str(cache->v.dtype), dtype_str(cache->k.dtype)));
  const bool mixed = cache->k.dtype != q->dtype;
  if (mixed && q->dtype != IOATTN_F32)
    return Status::invalid(format("cache.k.dtype=%s with q.dtype=%s: the cache may differ from q only when q is f32",
                                  dtype_str(cache->k.dtype), dtype_str(q->dtype)));
  if (mixed && opt->backend == IOATTN_BACKEND_CUDA)
    return Status::unsupported(format("cache.k.dtype=%s with f32 q: mixed-precision caches run on the CPU backend only",
                                      dtype_str(cache->k.dtype)));
  if (!(s = check_heads(*q, cache->k, cache->v, *out, "cache.k", "cache.v")).is_ok()) return s;
  int64_t seqlen_new = 0;
  if (k_new) {
    if (!(s = check_tensor(k_new, "k_new")).is_ok() || !(s = check_tensor(v_new, "v_new")).is_ok()) return s;
    if (k_new->dtype != q->dtype || v_new->dtype != q->dtype)
      return Status::invalid(format("k_new.dtype=%s, v_new.dtype=%s: must equal q.dtype=%s", dtype_str(k_new->dtype),
                                    dtype_str(v_new->dtype), dtype_str(q->dtype)));
    if (k_new->batch != q->batch || v_new->batch != q->batch)
      return Status::invalid(format("k_new.batch=%lld, v_new.batch=%lld: must equal q.batch=%lld",
                                    (long long)k_new->batch, (long long)v_new->batch, (long long)q->batch));
    if (v_new->seqlen != k_new->seqlen)
      return Status::invalid(format("v_new.seqlen=%lld: must equal k_new.seqlen=%lld", (long long)v_new->seqlen,
                                    (long long)k_new->seqlen));
    if (k_new->heads != cache->k.heads || v_new->heads != cache->k.heads)
      return Status::invalid(format("k_new.heads=%lld, v_new.heads=%lld: must equal cache.k.heads=%lld",
                                    (long long)k_new->heads, (long long)v_new->heads, (long long)cache->k.heads));
    if (k_new->head_dim != cache->k.head_dim || v_new->head_dim != cache->v.head_dim)
      return Status::invalid(format("k_new.head_dim=%lld, v_new.head_dim=%lld: must equal the cache's %lld and %lld",
                                    (long long)k_new->head_dim, (long long)v_new->head_dim,
                                    (long long)cache->k.head_dim, (long long)cache->v.head_dim));
    seqlen_new = k_new->seqlen;
  }
  if (!(s = check_no_alias(
            *out, lse, q->batch * q->heads * q->seqlen,
            {{q, "q"}, {&cache->k, "cache.k"}, {&cache->v, "cache.v"}, {k_new, "k_new"}, {v_new, "v_new"}}))
           .is_ok())
    return s;
  if (!(s = check_backend(*opt, q->head_dim, cache->v.head_dim)).is_ok()) return s;
  if (q->batch == 0) return Status::ok();
  if (!cache->seqlens) return Status::invalid("cache.seqlens: NULL with batch > 0");
  std::vector<int32_t> seqlens, table;
  if (!(s = host_copy(&seqlens, cache->seqlens, q->batch, *opt)).is_ok()) return s;
  if (cache->block_table && cache->max_pages_per_seq >= 1 &&
      !(s = host_copy(&table, cache->block_table, q->batch * cache->max_pages_per_seq, *opt)).is_ok())
    return s;
  CacheCheck check;
  if (!(s = check_cache(*cache, *q, seqlen_new, seqlens, table, &check)).is_ok()) return s;
  if (seqlen_new > 0 && !(s = check_append_aliasing(*cache, *q, *k_new, *v_new, seqlens, table)).is_ok()) return s;

  AttnParams p;
  fill_common(p, *q, cache->k, cache->v, *out, lse, *opt);
  p.batch = q->batch;
  p.seqlen_q = q->seqlen;
  p.seqlen_k = check.max_keys;
  p.seqlens_k = cache->seqlens;
  p.seqlens_k_added = seqlen_new;
  if (cache->block_table) {
    p.block_table = cache->block_table;
    p.max_pages_per_seq = cache->max_pages_per_seq;
    p.page_size = cache->k.seqlen;
  }
  p.lse_head_stride = q->seqlen;
  p.lse_batch_stride = q->heads * q->seqlen;

  KvAppend a;
  if (seqlen_new > 0) {
    a.k_new = k_new->data;
    a.v_new = v_new->data;
    a.dtype = DType(k_new->dtype);
    a.seqlen_new = seqlen_new;
    set_strides(*k_new, &a.k_batch_stride, &a.k_seq_stride, &a.k_head_stride);
    set_strides(*v_new, &a.v_batch_stride, &a.v_seq_stride, &a.v_head_stride);
    a.cache_seqlens = cache->seqlens;
  }
  const Backend& backend = backend_for(opt->backend);
  // The append writes the cache, so whatever the kernel would refuse must be refused first.
  if (!(s = backend.check_supported(p)).is_ok()) return s;
  return backend.forward_kvcache(p, seqlen_new > 0 ? &a : nullptr, seqlens.data());
}

Status tune_impl(const ioattn_tune_options* opt) {
  if (!opt) return Status::invalid("opt: null tune options pointer (use ioattn_tune_options_default)");
  if (opt->num_threads < 0 || opt->num_threads > 4096)
    return Status::invalid(format("opt.num_threads=%d: expected 0 (library default) to 4096", opt->num_threads));
  if (opt->quick != 0 && opt->quick != 1) return Status::invalid(format("opt.quick=%d: expected 0 or 1", opt->quick));
  const std::string path = opt->path ? opt->path : calibration_path();
  if (opt->path && path.empty())
    return Status::invalid("opt.path is empty: name a file, or NULL for ioattn_tune_path()");
  if (path.empty())
    return Status::invalid(
        "no calibration file location: IOATTN_TUNE_FILE is set empty, or neither XDG_CACHE_HOME "
        "nor HOME is set; pass opt.path");
  std::string error;
  if (!check_calibration_path(path, &error)) return Status::invalid("opt.path: " + error);
  TuneRequest r;
  r.threads = opt->num_threads;
  r.quick = opt->quick == 1;
  r.progress = opt->progress;
  r.user = opt->user;
  Calibration c;
  if (Status s = cpu_backend().calibrate(r, &c); !s.is_ok()) return s;
  if (!write_calibration_file(path, detect_host(), c, &error)) return Status::invalid("opt.path: " + error);
  reset_host_calibration();
  return Status::ok();
}

ioattn_status finish(const Status& s) {
  if (!s.is_ok()) t_last_error = s.message;
  return s.code;
}

template <class Fn>
ioattn_status guarded(const char* entry, Fn fn) {
  try {
    return finish(fn());
  } catch (const std::bad_alloc&) {
    return finish(Status::out_of_memory(std::string(entry) + ": out of memory"));
  } catch (const std::exception& e) {
    return finish(Status::backend(std::string(entry) + ": internal error: " + e.what()));
  } catch (...) {
    return finish(Status::backend(std::string(entry) + ": internal error"));
  }
}

}  // namespace
}  // namespace ioattn

extern "C" {

void ioattn_options_default(ioattn_options* opt) {
  if (!opt) return;
  opt->scale = 0.f;
  opt->causal = 0;
  opt->window_left = -1;
  opt->window_right = -1;
  opt->softcap = 0.f;
  opt->backend = IOATTN_BACKEND_CPU;
  opt->num_threads = 0;
  opt->cuda_stream = nullptr;
}

ioattn_status ioattn_forward(const ioattn_tensor* q, const ioattn_tensor* k, const ioattn_tensor* v,
                             const ioattn_tensor* out, float* lse, const ioattn_options* opt) {
  return ioattn::guarded("ioattn_forward", [&] { return ioattn::forward_impl(q, k, v, out, lse, opt); });
}

ioattn_status ioattn_forward_kvcache(const ioattn_tensor* q, const ioattn_kvcache* cache, const ioattn_tensor* k_new,
                                     const ioattn_tensor* v_new, const ioattn_tensor* out, float* lse,
                                     const ioattn_options* opt) {
  return ioattn::guarded("ioattn_forward_kvcache",
                         [&] { return ioattn::kvcache_impl(q, cache, k_new, v_new, out, lse, opt); });
}

ioattn_status ioattn_forward_varlen(const ioattn_tensor* q, const ioattn_tensor* k, const ioattn_tensor* v,
                                    const int32_t* cu_seqlens_q, const int32_t* cu_seqlens_k, int32_t batch,
                                    const ioattn_tensor* out, float* lse, const ioattn_options* opt) {
  return ioattn::guarded("ioattn_forward_varlen", [&] {
    return ioattn::varlen_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, batch, out, lse, opt);
  });
}

const char* ioattn_status_string(ioattn_status s) {
  switch (s) {
    case IOATTN_OK: return "ok";
    case IOATTN_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case IOATTN_ERROR_UNSUPPORTED: return "unsupported";
    case IOATTN_ERROR_OUT_OF_MEMORY: return "out of memory";
    case IOATTN_ERROR_BACKEND: return "backend error";
  }
  return "unknown status";
}

const char* ioattn_last_error(void) { return ioattn::t_last_error.c_str(); }

const char* ioattn_version(void) { return IOATTN_VERSION_STRING; }

void ioattn_tune_options_default(ioattn_tune_options* opt) {
  if (!opt) return;
  opt->path = nullptr;
  opt->num_threads = 0;
  opt->quick = 0;
  opt->progress = nullptr;
  opt->user = nullptr;
}

ioattn_status ioattn_tune(const ioattn_tune_options* opt) {
  return ioattn::guarded("ioattn_tune", [&] { return ioattn::tune_impl(opt); });
}

const char* ioattn_tune_path(void) {
  static thread_local std::string path;
  path = ioattn::calibration_path();
  return path.c_str();
}

int ioattn_backend_available(int32_t backend) {
  if (backend == IOATTN_BACKEND_CPU) return 1;
  if (backend == IOATTN_BACKEND_CUDA) return ioattn::gpu_backend().available() ? 1 : 0;
  return 0;
}

}  // extern "C"
