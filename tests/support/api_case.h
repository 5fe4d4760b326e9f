// One fuzz case over the C ABI: bytes decode into a dense, varlen or KV-cache request whose tensors
// live inside ONE heap arena (so ASan's redzones around it catch any access outside the caller's
// memory), the request runs, and the contract is checked:
//   - never a crash, never IOATTN_ERROR_BACKEND on the CPU;
//   - a request the harness knows is malformed (a null tensor that has elements, a shape whose
//     strides overflow) is never OK;
//   - on any error the whole arena and every metadata array are bitwise as before;
//   - on OK only out, lse and the appended cache slots changed; out elements do not overlap each
//     other, out/lse do not overlap any input; rows with no visible key are exactly 0 with
//     lse = -inf, every other row is a convex combination of v (|out| <= max|v|) with finite lse;
//     the appended slots hold k_new/v_new rounded to the cache dtype;
//   - the same request with another num_threads gives a bitwise identical arena.
// Header-only and Catch2-free (in the test-support layer, ioattn_test_support_core) so the
// libFuzzer target (fuzz/fuzz_api, clang) and the replay test (any compiler) share it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "ioattn/ioattn.h"

namespace ioattn::fuzz {

// Reads the fuzz input front to back; past its end every read is 0, so short inputs still decode
// into a complete (mostly default, mostly valid) request.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t u8() { return p_ < end_ ? *p_++ : 0; }
  uint16_t u16() { return uint16_t(u8() | u8() << 8); }
  uint32_t u32() { return uint32_t(u16()) | uint32_t(u16()) << 16; }
  uint64_t u64() { return uint64_t(u32()) | uint64_t(u32()) << 32; }
  int64_t below(int64_t n) { return n <= 0 ? 0 : int64_t(u8() % uint64_t(n)); }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// The arena holds every tensor and lse. Its 16-bit words are chosen so that any view of the bytes
// as f32, f16 or bf16 is finite with magnitude in [0.5, 2): bits 14..7 are 0x7E or 0x7F (the bf16
// exponent of [0.5, 2), whose top five bits are also the f16 exponent 15), and an f32 takes its
// exponent from its high word. Overlapping inputs of different dtypes therefore stay bounded, and
// every output must satisfy |out| <= 2.
inline constexpr size_t kArenaBytes = 256 * 1024;
inline constexpr float kMaxAbsInput = 2.0f;

inline const std::vector<uint8_t>& pristine_arena() {
  static const std::vector<uint8_t> arena = [] {
    std::vector<uint8_t> a(kArenaBytes);
    uint32_t x = 0x9e3779b9u;
    for (size_t i = 0; i + 1 < a.size(); i += 2) {
      x = x * 1664525u + 1013904223u;
      const uint16_t word = uint16_t((x >> 31) << 15 | (0x7Eu + ((x >> 30) & 1u)) << 7 | ((x >> 16) & 0x7Fu));
      std::memcpy(&a[i], &word, 2);
    }
    return a;
  }();
  return arena;
}

// A tensor as the harness describes it: shape and strides exactly as passed, and where its data
// lives (an offset into the arena, NULL, or a non-null pointer that must never be dereferenced).
struct TensorSpec {
  enum class Where { arena, null, wild };
  int32_t dtype = IOATTN_F32;
  int64_t dims[4] = {0, 0, 0, 0};  // B, S, H, D
  int64_t strides[3] = {0, 0, 0};  // batch, seq, head
  Where where = Where::arena;
  size_t offset = 0;
  bool present = true;  // false: the ioattn_tensor pointer itself is NULL
};

inline int64_t elem_bytes(int32_t dtype) {
  return dtype == IOATTN_F32 ? 4 : dtype == IOATTN_F16 || dtype == IOATTN_BF16 ? 2 : 4;
}

// One past the last element, or -1 on overflow (or a negative extent/stride: never placed).
inline int64_t span_elems(const TensorSpec& t) {
  for (int64_t d : t.dims)
    if (d < 0) return -1;
  for (int64_t s : t.strides)
    if (s < 0) return -1;
  if (t.dims[0] == 0 || t.dims[1] == 0 || t.dims[2] == 0 || t.dims[3] == 0) return 0;
  int64_t span = t.dims[3], term = 0;
  for (int i = 0; i < 3; ++i)
    if (__builtin_mul_overflow(t.dims[i] - 1, t.strides[i], &term) || __builtin_add_overflow(span, term, &span))
      return -1;
  return span;
}

inline int64_t span_bytes(const TensorSpec& t) {
  const int64_t e = span_elems(t);
  int64_t b = 0;
  if (e < 0 || __builtin_mul_overflow(e, elem_bytes(t.dtype), &b)) return -1;
  return b;
}

inline void set_layout(TensorSpec& t, ByteReader& in) {
  const int64_t S = std::max<int64_t>(t.dims[1], 1), H = std::max<int64_t>(t.dims[2], 1),
                D = std::max<int64_t>(t.dims[3], 1);
  const uint8_t mode = in.u8() % 16;
  if (mode < 8) {  // contiguous (B, S, H, D), the common case
    t.strides[2] = D, t.strides[1] = H * D, t.strides[0] = S * H * D;
  } else if (mode < 10) {  // heads-major (B, H, S, D), as a transposed PyTorch tensor
    t.strides[1] = D, t.strides[2] = S * D, t.strides[0] = H * S * D;
  } else if (mode < 12) {  // padded rows, heads and batches
    t.strides[2] = D + in.below(5);
    t.strides[1] = H * t.strides[2] + in.below(7);
    t.strides[0] = S * t.strides[1] + in.below(9);
  } else if (mode == 12) {  // a broadcast axis (stride 0)
    t.strides[2] = D, t.strides[1] = H * D, t.strides[0] = S * H * D;
    t.strides[in.below(3)] = 0;
  } else {
    t.strides[2] = D, t.strides[1] = H * D, t.strides[0] = S * H * D;
    const int axis = int(in.below(3));
    const int64_t huge[4] = {int64_t(1) << (40 + in.below(23)), std::numeric_limits<int64_t>::max(),
                             int64_t(in.u64() >> 1), -1 - int64_t(in.u8())};
    t.strides[axis] = huge[mode - 13];
  }
}

inline int64_t perturbed_value(ByteReader& in) {
  switch (in.u8() % 8) {
    case 0: return -1;
    case 1: return 0;
    case 2: return int64_t(1) << 62;
    case 3: return std::numeric_limits<int64_t>::max();
    case 4: return std::numeric_limits<int64_t>::min();
    case 5: return int64_t(in.u64());
    default: return in.below(41);
  }
}

// A few fields of a few tensors replaced by edge values: how validation gets exercised while most
// inputs still decode into runnable requests.
inline void perturb(std::vector<TensorSpec*> tensors, ByteReader& in) {
  const int count = in.u8() % 16 < 12 ? 0 : 1 + int(in.below(3));
  for (int i = 0; i < count; ++i) {
    TensorSpec& t = *tensors[size_t(in.below(int64_t(tensors.size())))];
    const int field = int(in.below(9));
    if (field == 0) {
      t.dtype = in.u8() % 4 == 0 ? int32_t(in.u32()) : int32_t(in.below(3));
    } else if (field <= 4) {
      t.dims[field - 1] = perturbed_value(in);
    } else if (field <= 7) {
      t.strides[field - 5] = perturbed_value(in);
    } else {
      t.present = false;
    }
  }
}

// Decides where a tensor lives: inside the arena when it fits, NULL when it has elements that
// cannot fit (so the library must refuse it), or a wild pointer when it has no elements at all
// (the library must not touch it).
inline void place(TensorSpec& t, ByteReader& in, bool* must_fail) {
  const uint8_t mode = in.u8() % 16;
  const size_t want = size_t(in.u16()) * 4 % kArenaBytes;
  const int64_t bytes = span_bytes(t);
  if (bytes < 0) {  // overflowing or negative shape: must be refused before any access
    t.where = TensorSpec::Where::arena;
    t.offset = 0;
    *must_fail = true;
    return;
  }
  if (bytes == 0 && mode >= 14) {
    t.where = mode == 14 ? TensorSpec::Where::null : TensorSpec::Where::wild;
    return;
  }
  if (mode == 14 || size_t(bytes) > kArenaBytes) {
    t.where = TensorSpec::Where::null;
    if (bytes > 0) *must_fail = true;
    return;
  }
  t.where = TensorSpec::Where::arena;
  const size_t align = size_t(elem_bytes(t.dtype));
  t.offset = std::min(want, kArenaBytes - size_t(bytes)) / align * align;
}

inline ioattn_tensor materialize(const TensorSpec& t, uint8_t* arena) {
  ioattn_tensor out{};
  out.data = t.where == TensorSpec::Where::arena  ? arena + t.offset
             : t.where == TensorSpec::Where::wild ? reinterpret_cast<void*>(uintptr_t(0x40))
                                                  : nullptr;
  out.dtype = t.dtype;
  out.batch = t.dims[0], out.seqlen = t.dims[1], out.heads = t.dims[2], out.head_dim = t.dims[3];
  out.stride_batch = t.strides[0], out.stride_seq = t.strides[1], out.stride_head = t.strides[2];
  return out;
}

struct Request {
  enum class Entry { dense, varlen, kvcache } entry = Entry::dense;
  TensorSpec q, k, v, out, k_new, v_new;  // k, v: the cache on the KV-cache path
  bool has_new = false;
  bool lse_present = false;
  size_t lse_offset = 0;
  int64_t lse_count = 0;
  ioattn_options opt{};
  bool opt_present = true;
  int32_t batch = 0;  // varlen's argument
  std::vector<int32_t> cu_q, cu_k, seqlens, block_table;
  bool cu_q_present = true, cu_k_present = true, seqlens_present = true, paged = false;
  int32_t max_pages_per_seq = 0;
  bool must_fail = false;
};

// Metadata arrays are sized from the request's final shape, so every entry the library may read
// is memory the harness owns; beyond this cap the array is passed as NULL and must be refused.
inline constexpr int64_t kMaxMetaBatch = 64;

inline void decode_options(Request& r, ByteReader& in) {
  ioattn_options_default(&r.opt);
  const float d = float(std::max<int64_t>(r.q.dims[3], 1));
  switch (in.u8() % 16) {
    case 0: r.opt.scale = -1.f / std::sqrt(d); break;
    case 1: r.opt.scale = float(in.u8()) * 0.05f; break;
    case 2: r.opt.scale = std::numeric_limits<float>::quiet_NaN(); break;
    case 3: r.opt.scale = std::numeric_limits<float>::infinity(); break;
    case 4: r.opt.scale = std::numeric_limits<float>::max(); break;
    default: break;
  }
  const uint8_t c = in.u8();
  r.opt.causal = c % 16 == 15 ? int32_t(in.u32()) : c % 3 == 0;
  for (int32_t* w : {&r.opt.window_left, &r.opt.window_right}) {
    const uint8_t m = in.u8() % 16;
    *w = m < 9 ? -1 : m < 14 ? int32_t(in.below(24)) : m == 14 ? -2 - int32_t(in.u8()) : int32_t(in.u32() >> 1);
  }
  switch (in.u8() % 16) {
    case 0: r.opt.softcap = 0.5f + float(in.u8()) * 0.25f; break;
    case 1: r.opt.softcap = 1e-30f; break;
    case 2: r.opt.softcap = -1.f; break;
    case 3: r.opt.softcap = std::numeric_limits<float>::quiet_NaN(); break;
    default: break;
  }
  const uint8_t b = in.u8();
  r.opt.backend = b % 32 == 31 ? int32_t(in.u32()) : b % 32 == 30 ? IOATTN_BACKEND_CUDA : IOATTN_BACKEND_CPU;
  const uint8_t t = in.u8();
  r.opt.num_threads = t % 32 == 31 ? -1 - int32_t(in.u8()) : t % 32 == 30 ? 0 : 1 + t % 4;
  r.opt_present = in.u8() % 64 != 63;
}

inline Request decode(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  Request r;
  r.entry = Request::Entry(in.u8() % 3);
  const int32_t dtype = int32_t(in.below(3));
  const int64_t B = 1 + in.below(3), Sq = in.below(21), Sk = in.below(21), Hkv = 1 + in.below(3),
                Hq = Hkv * (1 + in.below(3)), D = 1 + in.below(40);
  const int64_t Dv = in.u8() % 4 == 0 ? 1 + in.below(40) : D;
  auto shaped = [&](int64_t b, int64_t s, int64_t h, int64_t d, int32_t dt) {
    TensorSpec t;
    t.dtype = dt;
    t.dims[0] = b, t.dims[1] = s, t.dims[2] = h, t.dims[3] = d;
    set_layout(t, in);
    return t;
  };
  std::vector<TensorSpec*> all;
  if (r.entry == Request::Entry::dense) {
    r.q = shaped(B, Sq, Hq, D, dtype);
    r.k = shaped(B, Sk, Hkv, D, dtype);
    r.v = shaped(B, Sk, Hkv, Dv, dtype);
    r.out = shaped(B, Sq, Hq, Dv, dtype);
    all = {&r.q, &r.k, &r.v, &r.out};
  } else if (r.entry == Request::Entry::varlen) {
    // Sequences are cut from packed totals: the per-sequence lengths come from the input, the
    // packed length has some slack after the last sequence.
    std::vector<int32_t> lq{0}, lk{0};
    for (int64_t b = 0; b < B; ++b) {
      lq.push_back(lq.back() + int32_t(in.below(9)));
      lk.push_back(lk.back() + int32_t(in.below(9)));
    }
    r.cu_q = lq, r.cu_k = lk;
    r.batch = int32_t(B);
    r.q = shaped(1, lq.back() + in.below(3), Hq, D, dtype);
    r.k = shaped(1, lk.back() + in.below(3), Hkv, D, dtype);
    r.v = shaped(1, r.k.dims[1], Hkv, Dv, dtype);
    r.out = shaped(1, r.q.dims[1], Hq, Dv, dtype);
    all = {&r.q, &r.k, &r.v, &r.out};
  } else {
    const int64_t snew = in.below(4);
    r.has_new = snew > 0 || in.u8() % 4 == 0;
    const int32_t cache_dtype = dtype == IOATTN_F32 && in.u8() % 2 ? int32_t(1 + in.below(2)) : dtype;
    int64_t longest = 0;
    for (int64_t b = 0; b < B; ++b) {
      r.seqlens.push_back(int32_t(in.below(Sk + 1)));
      longest = std::max<int64_t>(longest, r.seqlens.back() + snew);
    }
    r.paged = in.u8() % 2;
    if (r.paged) {
      // Pages handed out from a shuffled pool: no two sequences share a page unless perturbed.
      const int64_t page = 1 + in.below(8);
      r.max_pages_per_seq = int32_t((longest + page - 1) / page + in.below(2));
      r.max_pages_per_seq = std::max(r.max_pages_per_seq, 1);
      const int64_t pages = B * r.max_pages_per_seq + in.below(3);
      std::vector<int32_t> pool(static_cast<size_t>(pages));
      for (int64_t i = 0; i < pages; ++i) pool[size_t(i)] = int32_t(i);
      for (int64_t i = pages - 1; i > 0; --i) std::swap(pool[size_t(i)], pool[size_t(in.below(i + 1))]);
      r.block_table.assign(pool.begin(), pool.begin() + B * r.max_pages_per_seq);
      r.k = shaped(pages, page, Hkv, D, cache_dtype);
      r.v = shaped(pages, page, Hkv, Dv, cache_dtype);
    } else {
      r.k = shaped(B, longest + in.below(3), Hkv, D, cache_dtype);
      r.v = shaped(B, r.k.dims[1], Hkv, Dv, cache_dtype);
    }
    r.q = shaped(B, Sq, Hq, D, dtype);
    r.out = shaped(B, Sq, Hq, Dv, dtype);
    r.k_new = shaped(B, snew, Hkv, D, dtype);
    r.v_new = shaped(B, snew, Hkv, Dv, dtype);
    all = {&r.q, &r.k, &r.v, &r.out, &r.k_new, &r.v_new};
  }
  decode_options(r, in);
  perturb(all, in);

  // Metadata edge values: negative or oversized lengths, out-of-range or shared pages, a wrong
  // batch count, missing arrays.
  if (in.u8() % 8 == 7) {
    const uint8_t what = in.u8() % 8;
    const int32_t value = in.u8() % 2 ? -1 - int32_t(in.below(3)) : int32_t(in.u32());
    auto poke = [&](std::vector<int32_t>& a) {
      if (!a.empty()) a[size_t(in.below(int64_t(a.size())))] = what % 2 ? value : int32_t(in.below(40));
    };
    if (r.entry == Request::Entry::varlen) {
      if (what < 2)
        poke(r.cu_q);
      else if (what < 4)
        poke(r.cu_k);
      else if (what == 4)
        r.batch = value;
      else if (what == 5)
        r.cu_q_present = false;
      else if (what == 6)
        r.cu_k_present = false;
      else
        r.batch = int32_t(in.below(6));
    } else if (r.entry == Request::Entry::kvcache) {
      if (what < 3)
        poke(r.seqlens);
      else if (what < 5)
        poke(r.block_table);
      else if (what == 5)
        r.seqlens_present = false;
      else if (what == 6)
        r.max_pages_per_seq = int32_t(in.below(4)) - 1;
      else
        r.has_new = !r.has_new;
    }
  }
  if (r.entry == Request::Entry::varlen) {
    if (r.batch >= 0 && r.batch <= kMaxMetaBatch) {
      r.cu_q.resize(size_t(r.batch) + 1, r.cu_q.back());
      r.cu_k.resize(size_t(r.batch) + 1, r.cu_k.back());
    } else {
      r.cu_q_present = r.cu_k_present = false;
    }
  }
  if (r.entry == Request::Entry::kvcache) {
    const int64_t qb = r.q.dims[0];
    if (qb < 0 || qb > kMaxMetaBatch) {
      r.seqlens_present = false;
    } else {
      r.seqlens.resize(size_t(qb), 0);
      if (r.paged) r.block_table.resize(size_t(std::max<int64_t>(qb * std::max(r.max_pages_per_seq, 0), 1)), 0);
    }
  }
  for (TensorSpec* t : all) {
    // k_new/v_new bind nothing unless both are passed (one alone is refused anyway). Any other
    // tensor that is dropped makes the call fail regardless.
    bool bad = false;
    place(*t, in, &bad);
    const bool passed = (t != &r.k_new && t != &r.v_new) || (r.has_new && r.k_new.present && r.v_new.present);
    r.must_fail = r.must_fail || (bad && passed);
  }
  // lse: [B][Hq][Sq] (dense, cache) or [Hq][total_q] (varlen), f32, contiguous.
  const bool bounded = r.q.dims[0] >= 0 && r.q.dims[1] >= 0 && r.q.dims[2] >= 0 && r.q.dims[0] <= 1 << 20 &&
                       r.q.dims[1] <= 1 << 20 && r.q.dims[2] <= 1 << 20;
  const int64_t lse_rows = !bounded                            ? 0
                           : r.entry == Request::Entry::varlen ? r.q.dims[2] * r.q.dims[1]
                                                               : r.q.dims[0] * r.q.dims[2] * r.q.dims[1];
  const bool fits = bounded && size_t(lse_rows) * 4 <= kArenaBytes;
  r.lse_present = fits && in.u8() % 4 != 0;
  if (r.lse_present) {
    r.lse_count = lse_rows;
    r.lse_offset = std::min(size_t(in.u16()) * 4 % kArenaBytes, kArenaBytes - size_t(lse_rows) * 4) / 4 * 4;
  }
  return r;
}

struct Call {
  ioattn_tensor q, k, v, out, k_new, v_new;
  ioattn_kvcache cache;
  float* lse;
};

inline ioattn_status run(const Request& r, uint8_t* arena, int32_t num_threads) {
  Call c{};
  c.q = materialize(r.q, arena);
  c.k = materialize(r.k, arena);
  c.v = materialize(r.v, arena);
  c.out = materialize(r.out, arena);
  c.lse = r.lse_present ? reinterpret_cast<float*>(arena + r.lse_offset) : nullptr;
  ioattn_options opt = r.opt;
  opt.num_threads = num_threads;
  const ioattn_options* o = r.opt_present ? &opt : nullptr;
  auto ptr = [](const TensorSpec& s, const ioattn_tensor& t) { return s.present ? &t : nullptr; };
  switch (r.entry) {
    case Request::Entry::dense:
      return ioattn_forward(ptr(r.q, c.q), ptr(r.k, c.k), ptr(r.v, c.v), ptr(r.out, c.out), c.lse, o);
    case Request::Entry::varlen:
      return ioattn_forward_varlen(ptr(r.q, c.q), ptr(r.k, c.k), ptr(r.v, c.v),
                                   r.cu_q_present ? r.cu_q.data() : nullptr, r.cu_k_present ? r.cu_k.data() : nullptr,
                                   r.batch, ptr(r.out, c.out), c.lse, o);
    case Request::Entry::kvcache: {
      c.k_new = materialize(r.k_new, arena);
      c.v_new = materialize(r.v_new, arena);
      c.cache.k = c.k;
      c.cache.v = c.v;
      c.cache.seqlens = r.seqlens_present ? r.seqlens.data() : nullptr;
      c.cache.block_table = r.paged ? r.block_table.data() : nullptr;
      c.cache.max_pages_per_seq = r.max_pages_per_seq;
      // A perturbation that drops cache.k or cache.v drops the whole cache struct; one that drops
      // k_new or v_new alone exercises the "pass both or neither" rule.
      const bool cache_present = r.k.present && r.v.present;
      return ioattn_forward_kvcache(ptr(r.q, c.q), cache_present ? &c.cache : nullptr,
                                    r.has_new ? ptr(r.k_new, c.k_new) : nullptr,
                                    r.has_new ? ptr(r.v_new, c.v_new) : nullptr, ptr(r.out, c.out), c.lse, o);
    }
  }
  return IOATTN_ERROR_BACKEND;
}

// Visible keys of query row i under docs/api.md's rule, written from the contract text rather than
// taken from common/masking.h, so the harness does not share a bug with the kernels.
inline int64_t visible_count(const ioattn_options& o, int64_t i, int64_t sq, int64_t sk) {
  const int64_t diag = i + sk - sq;
  int64_t lo = 0, hi = sk - 1;
  if (o.window_left >= 0) lo = std::max(lo, diag - o.window_left);
  if (o.causal) hi = std::min(hi, diag);
  if (o.window_right >= 0) hi = std::min(hi, diag + o.window_right);
  return std::max<int64_t>(0, hi - lo + 1);
}

inline std::string describe_status(ioattn_status s) {
  return std::string(ioattn_status_string(s)) + " (" + std::to_string(int(s)) + ")";
}

inline int64_t element_byte(const TensorSpec& t, int64_t b, int64_t s, int64_t h, int64_t d) {
  return int64_t(t.offset) + (b * t.strides[0] + s * t.strides[1] + h * t.strides[2] + d) * elem_bytes(t.dtype);
}

// Every invariant of one successful call; "" when all hold.
inline std::string check_success(const Request& r, const uint8_t* before, const uint8_t* after) {
  std::vector<uint8_t> writable(kArenaBytes, 0);
  std::string failure;
  const bool dense_out = r.out.where == TensorSpec::Where::arena && span_bytes(r.out) > 0;
  const int64_t ob = elem_bytes(r.out.dtype);
  const int64_t Hq = r.q.dims[2], Dv = r.out.dims[3], D = r.q.dims[3];

  // (b, first row, rows, keys) of each sequence: how rows of out/lse map to sequences.
  struct Seq {
    int64_t b, row0, rows, keys;
  };
  std::vector<Seq> seqs;
  int64_t snew = 0;
  // Dropping both k_new and v_new (a perturbation) means no append, whatever has_new says.
  if (r.entry == Request::Entry::kvcache && r.has_new && r.k_new.present && r.v_new.present) snew = r.k_new.dims[1];
  if (r.entry == Request::Entry::varlen) {
    for (int32_t b = 0; b < r.batch; ++b)
      seqs.push_back({0, r.cu_q[size_t(b)], r.cu_q[size_t(b) + 1] - r.cu_q[size_t(b)],
                      int64_t(r.cu_k[size_t(b) + 1]) - r.cu_k[size_t(b)]});
  } else {
    for (int64_t b = 0; b < r.q.dims[0] && r.q.dims[1] > 0; ++b) {
      const int64_t keys = r.entry == Request::Entry::kvcache ? r.seqlens[size_t(b)] + snew : r.k.dims[1];
      seqs.push_back({b, 0, r.q.dims[1], keys});
    }
  }
  auto lse_index = [&](const Seq& s, int64_t h, int64_t i) {
    return r.entry == Request::Entry::varlen ? h * r.q.dims[1] + s.row0 + i : (s.b * Hq + h) * r.q.dims[1] + i;
  };
  for (const Seq& s : seqs) {
    for (int64_t i = 0; i < s.rows; ++i) {
      for (int64_t h = 0; h < Hq; ++h) {
        if (dense_out) {
          for (int64_t d = 0; d < Dv; ++d) {
            const int64_t at = element_byte(r.out, s.b, s.row0 + i, h, d);
            for (int64_t k = 0; k < ob; ++k)
              if (writable[size_t(at + k)]++ && failure.empty())
                failure = "accepted an out whose elements overlap (byte " + std::to_string(at + k) + ")";
          }
        }
        if (r.lse_present) {
          const int64_t at = int64_t(r.lse_offset) + 4 * lse_index(s, h, i);
          for (int k = 0; k < 4; ++k)
            if (writable[size_t(at + k)]++ && failure.empty()) failure = "accepted an lse that overlaps out";
        }
      }
    }
  }
  if (!failure.empty()) return failure;

  // The appended cache slots, and what they must now hold.
  const int64_t cb = elem_bytes(r.k.dtype);
  auto cache_slot = [&](const TensorSpec& c, int64_t b, int64_t j, int64_t h) {
    if (!r.paged) return element_byte(c, b, j, h, 0);
    const int64_t page = r.block_table[size_t(b * r.max_pages_per_seq + j / c.dims[1])];
    return element_byte(c, page, j % c.dims[1], h, 0);
  };
  if (snew > 0) {
    for (int64_t b = 0; b < r.q.dims[0]; ++b)
      for (int64_t j = r.seqlens[size_t(b)]; j < r.seqlens[size_t(b)] + snew; ++j)
        for (int64_t h = 0; h < r.k.dims[2]; ++h)
          for (const TensorSpec* c : {&r.k, &r.v})
            for (int64_t k = 0; k < c->dims[3] * cb; ++k) writable[size_t(cache_slot(*c, b, j, h) + k)] = 1;
  }
  for (size_t i = 0; i < kArenaBytes; ++i)
    if (!writable[i] && before[i] != after[i])
      return "OK call wrote byte " + std::to_string(i) + " of the arena, outside out, lse and the appended slots";

  // Outputs must not alias what the kernel reads.
  auto range = [](const TensorSpec& t) {
    const int64_t n = t.where == TensorSpec::Where::arena ? span_bytes(t) : 0;
    return std::pair<int64_t, int64_t>{int64_t(t.offset), int64_t(t.offset) + std::max<int64_t>(n, 0)};
  };
  auto overlap = [](std::pair<int64_t, int64_t> a, std::pair<int64_t, int64_t> b) {
    return a.first < a.second && b.first < b.second && a.first < b.second && b.first < a.second;
  };
  const std::pair<int64_t, int64_t> out_r = range(r.out),
                                    lse_r = r.lse_present
                                                ? std::pair<int64_t, int64_t>{int64_t(r.lse_offset),
                                                                              int64_t(r.lse_offset) + 4 * r.lse_count}
                                                : std::pair<int64_t, int64_t>{0, 0};
  std::vector<const TensorSpec*> inputs = {&r.q, &r.k, &r.v};
  if (snew > 0) inputs.insert(inputs.end(), {&r.k_new, &r.v_new});
  for (const TensorSpec* t : inputs)
    if (overlap(out_r, range(*t)) || overlap(lse_r, range(*t))) return "accepted an out or lse that overlaps an input";

  auto value = [](const uint8_t* arena, const TensorSpec& t, int64_t byte) {
    return load_as_f32(arena + byte, 0, DType(t.dtype));
  };
  if (snew > 0) {
    for (int64_t b = 0; b < r.q.dims[0]; ++b)
      for (int64_t j = 0; j < snew; ++j)
        for (int64_t h = 0; h < r.k.dims[2]; ++h)
          for (int which = 0; which < 2; ++which) {
            const TensorSpec& c = which ? r.v : r.k;
            const TensorSpec& src = which ? r.v_new : r.k_new;
            const int64_t slot = cache_slot(c, b, r.seqlens[size_t(b)] + j, h);
            for (int64_t d = 0; d < c.dims[3]; ++d) {
              const float want = round_to(DType(c.dtype), value(before, src, element_byte(src, b, j, h, d)));
              const float got = value(after, c, slot + d * cb);
              if (std::memcmp(&want, &got, 4) != 0)
                return "appended cache element (b=" + std::to_string(b) + ", j=" + std::to_string(j) + ") holds " +
                       std::to_string(got) + ", expected " + std::to_string(want);
            }
          }
  }

  // Scores beyond float range make the softmax itself undefined; below it every row is bounded.
  const double scale = r.opt.scale > 0 ? r.opt.scale : 1.0 / std::sqrt(double(D));
  if (scale * kMaxAbsInput * kMaxAbsInput * double(D) > 1e37) return "";
  for (const Seq& s : seqs) {
    for (int64_t i = 0; i < s.rows; ++i) {
      const bool empty = visible_count(r.opt, i, s.rows, s.keys) == 0;
      for (int64_t h = 0; h < Hq; ++h) {
        if (r.lse_present) {
          float lse;
          std::memcpy(&lse, after + r.lse_offset + 4 * size_t(lse_index(s, h, i)), 4);
          if (empty ? !(std::isinf(lse) && lse < 0) : !std::isfinite(lse))
            return "lse of row " + std::to_string(s.row0 + i) + " head " + std::to_string(h) + " is " +
                   std::to_string(lse) + (empty ? " for a row with no visible key (want -inf)" : " (want finite)");
        }
        if (!dense_out) continue;
        for (int64_t d = 0; d < Dv; ++d) {
          const float o = value(after, r.out, element_byte(r.out, s.b, s.row0 + i, h, d));
          if (empty ? o != 0.f : !(std::fabs(o) <= kMaxAbsInput * 1.0001f))
            return "out of row " + std::to_string(s.row0 + i) + " head " + std::to_string(h) + " is " +
                   std::to_string(o) + (empty ? " for a row with no visible key (want 0)" : " (want |out| <= max|v|)");
        }
      }
    }
  }
  return "";
}

// Runs one fuzz input against the library; "" when every invariant holds, else what broke.
inline std::string run_case(const uint8_t* data, size_t size) {
  const Request r = decode(data, size);
  const std::vector<uint8_t>& pristine = pristine_arena();
  // Exactly the arena's size, so the allocator's redzones sit right at its ends.
  std::vector<uint8_t> arena(pristine);
  const std::vector<int32_t> cu_q = r.cu_q, cu_k = r.cu_k, seqlens = r.seqlens, table = r.block_table;
  const ioattn_status s = run(r, arena.data(), r.opt.num_threads);
  if (s != IOATTN_OK && s != IOATTN_ERROR_INVALID_ARGUMENT && s != IOATTN_ERROR_UNSUPPORTED &&
      s != IOATTN_ERROR_OUT_OF_MEMORY)
    return "unexpected status " + describe_status(s) + ": " + ioattn_last_error();
  if (r.cu_q != cu_q || r.cu_k != cu_k || r.seqlens != seqlens || r.block_table != table)
    return "a metadata array was modified";
  if (s != IOATTN_OK) {
    if (*ioattn_last_error() == '\0') return "status " + describe_status(s) + " with an empty ioattn_last_error()";
    if (arena != pristine) {
      size_t i = 0;
      while (arena[i] == pristine[i]) ++i;
      return "failed call (" + std::string(ioattn_last_error()) + ") wrote arena byte " + std::to_string(i);
    }
    return "";
  }
  if (r.must_fail) return "accepted a request with a NULL non-empty tensor or an overflowing shape";
  std::string failure = check_success(r, pristine.data(), arena.data());
  if (!failure.empty()) return failure;
  // Thread count must not change a single bit (docs/api.md); 0 asks for the library default.
  const int32_t other = r.opt.num_threads == 1 ? 3 : 1;
  std::vector<uint8_t> again(pristine);
  const ioattn_status s2 = run(r, again.data(), other);
  if (s2 != IOATTN_OK)
    return "OK with num_threads=" + std::to_string(r.opt.num_threads) + " but " + describe_status(s2) + " with " +
           std::to_string(other) + ": " + ioattn_last_error();
  if (again != arena)
    return "num_threads=" + std::to_string(r.opt.num_threads) + " and " + std::to_string(other) +
           " gave different bits";
  return "";
}

}  // namespace ioattn::fuzz
