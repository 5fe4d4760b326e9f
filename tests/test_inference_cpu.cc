// The inference entry points on the CPU: KV-cache append-then-attend (contiguous and paged, in
// random page order, f32/f16/bf16 caches under f32 activations) and packed variable-length
// batches. The oracle never sees pages or packing: each sequence is rebuilt densely and run
// through the fp64 reference, so the paging and packing arithmetic is checked, not repeated.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/reference.h"
#include "ioattn/ioattn.h"
#include "tests/catch.h"
#include "tests/support/support.h"

namespace {

using ioattn::DType;

using ioattn::test::reference_sequence;
using ioattn::test::SequenceOracle;

ioattn::test::SequenceMask mask_of(const ioattn_options& opt) {
  return {opt.causal != 0, opt.window_left, opt.window_right, opt.softcap, opt.scale};
}

// The FlashAttention-2 rule with f32 output: err <= 2 * err(naive f32) + floor, floor being a few
// ulp of the output's magnitude.
void check_close(const float* got, const SequenceOracle& o, int64_t count, const char* what) {
  double ref_err = 0, got_err = 0, magnitude = 0;
  for (int64_t i = 0; i < count; ++i) {
    REQUIRE(!std::isnan(got[i]));
    magnitude = std::max(magnitude, std::fabs(o.out64[size_t(i)]));
    ref_err = std::max(ref_err, std::fabs(double(o.out32[size_t(i)]) - o.out64[size_t(i)]));
    got_err = std::max(got_err, std::fabs(double(got[i]) - o.out64[size_t(i)]));
  }
  const double floor = 4 * 1.1920929e-7 * std::max(1.0, magnitude);
  INFO(what << ": kernel error " << got_err << ", naive f32 error " << ref_err);
  CHECK(got_err <= 2 * ref_err + floor);
}

void check_lse(float got, double want, double want32) {
  if (std::isinf(want)) {
    CHECK(got == float(want));
    return;
  }
  CHECK(std::fabs(double(got) - want) <= 2 * std::fabs(want32 - want) + 1e-5 * std::max(1.0, std::fabs(want)));
}

float round_cache(DType t, float x) { return ioattn::round_to(t, x); }

struct KvCase {
  int64_t batch, hq, hkv, d, sq, snew;
  int64_t page_size;  // 0: contiguous cache
  DType cache_dtype;
  int causal;
  int32_t window_left, window_right;
  float softcap;
};

void run_kvcache_case(const KvCase& c, std::mt19937& rng) {
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::uniform_int_distribution<int> len_dist(0, 300);
  std::vector<int32_t> cached(size_t(c.batch));
  for (auto& l : cached) l = len_dist(rng) % 4 == 0 ? int32_t(len_dist(rng) % 2) : int32_t(len_dist(rng));
  const int64_t smax = *std::max_element(cached.begin(), cached.end()) + c.snew + 3;
  const int64_t row = c.hkv * c.d;
  const bool paged = c.page_size > 0;

  // Pages: each sequence gets ceil(total / page_size) pages from a shuffled pool that also holds
  // unused guard pages; everything starts as NaN, so a stray read poisons a result and a stray
  // write shows in the final comparison.
  int64_t num_pages = 0, max_pages = 0;
  std::vector<int32_t> table;
  if (paged) {
    for (int32_t l : cached) max_pages = std::max(max_pages, (l + c.snew + c.page_size - 1) / c.page_size);
    max_pages = std::max<int64_t>(max_pages, 1);
    num_pages = c.batch * max_pages + 3;
    std::vector<int32_t> pool(static_cast<size_t>(num_pages));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    table.assign(size_t(c.batch * max_pages), -1);
    size_t next = 0;
    for (int64_t b = 0; b < c.batch; ++b) {
      const int64_t need = (cached[size_t(b)] + c.snew + c.page_size - 1) / c.page_size;
      for (int64_t j = 0; j < max_pages; ++j) table[size_t(b * max_pages + j)] = j < need ? pool[next++] : 0;
    }
  }
  const int64_t slots = paged ? num_pages * c.page_size : c.batch * smax;
  std::vector<uint16_t> kc16, vc16;
  std::vector<float> kc32, vc32;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto cache_index = [&](int64_t b, int64_t j) {
    if (!paged) return (b * smax + j) * row;
    return (table[size_t(b * max_pages + j / c.page_size)] * c.page_size + j % c.page_size) * row;
  };
  auto cache_store = [&](bool is_k, int64_t index, float x) {
    if (c.cache_dtype == DType::f32)
      (is_k ? kc32 : vc32)[size_t(index)] = x;
    else
      ioattn::store_from_f32((is_k ? kc16 : vc16).data(), index, c.cache_dtype, x);
  };
  if (c.cache_dtype == DType::f32) {
    kc32.assign(size_t(slots * row), nan);
    vc32.assign(size_t(slots * row), nan);
  } else {
    const uint16_t nan16 = c.cache_dtype == DType::f16 ? ioattn::f32_to_f16(nan) : ioattn::f32_to_bf16(nan);
    kc16.assign(size_t(slots * row), nan16);
    vc16.assign(size_t(slots * row), nan16);
  }

  // Logical per-sequence K/V (what the kernel must see after the append), q and the new rows.
  std::vector<std::vector<float>> logical_k(size_t(c.batch)), logical_v(size_t(c.batch));
  std::vector<float> k_new(size_t(c.batch * c.snew * row)), v_new(k_new.size());
  for (auto& x : k_new) x = uni(rng);
  for (auto& x : v_new) x = uni(rng);
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t total = cached[size_t(b)] + c.snew;
    logical_k[size_t(b)].resize(size_t(total * row));
    logical_v[size_t(b)].resize(size_t(total * row));
    for (int64_t j = 0; j < total; ++j)
      for (int64_t e = 0; e < row; ++e) {
        const bool is_new = j >= cached[size_t(b)];
        const int64_t src = (b * c.snew + (j - cached[size_t(b)])) * row + e;
        const float kx = round_cache(c.cache_dtype, is_new ? k_new[size_t(src)] : uni(rng));
        const float vx = round_cache(c.cache_dtype, is_new ? v_new[size_t(src)] : uni(rng));
        logical_k[size_t(b)][size_t(j * row + e)] = kx;
        logical_v[size_t(b)][size_t(j * row + e)] = vx;
        if (!is_new) {
          cache_store(true, cache_index(b, j) + e, kx);
          cache_store(false, cache_index(b, j) + e, vx);
        }
      }
  }
  std::vector<float> q(size_t(c.batch * c.sq * c.hq * c.d));
  for (auto& x : q) x = uni(rng);
  std::vector<float> out(q.size(), nan), lse(size_t(c.batch * c.hq * c.sq), nan);

  ioattn_kvcache cache{};
  void* kdata = c.cache_dtype == DType::f32 ? static_cast<void*>(kc32.data()) : kc16.data();
  void* vdata = c.cache_dtype == DType::f32 ? static_cast<void*>(vc32.data()) : vc16.data();
  const int64_t cache_b = paged ? num_pages : c.batch, cache_s = paged ? c.page_size : smax;
  cache.k = {kdata, int32_t(c.cache_dtype), cache_b, cache_s, c.hkv, c.d, cache_s * row, row, c.d};
  cache.v = {vdata, int32_t(c.cache_dtype), cache_b, cache_s, c.hkv, c.d, cache_s * row, row, c.d};
  cache.seqlens = cached.data();
  cache.block_table = paged ? table.data() : nullptr;
  cache.max_pages_per_seq = int32_t(max_pages);
  const ioattn_tensor tq{q.data(), IOATTN_F32, c.batch, c.sq, c.hq, c.d, c.sq * c.hq * c.d, c.hq * c.d, c.d};
  const ioattn_tensor to{out.data(), IOATTN_F32, c.batch, c.sq, c.hq, c.d, c.sq * c.hq * c.d, c.hq * c.d, c.d};
  const ioattn_tensor tkn{k_new.data(), IOATTN_F32, c.batch, c.snew, c.hkv, c.d, c.snew * row, row, c.d};
  const ioattn_tensor tvn{v_new.data(), IOATTN_F32, c.batch, c.snew, c.hkv, c.d, c.snew * row, row, c.d};
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.causal = c.causal;
  opt.window_left = c.window_left;
  opt.window_right = c.window_right;
  opt.softcap = c.softcap;

  // The expected cache afterwards: the old contents plus the appended rows, nothing else.
  std::vector<float> k_after32 = kc32, v_after32 = vc32;
  std::vector<uint16_t> k_after16 = kc16, v_after16 = vc16;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t j = cached[size_t(b)]; j < cached[size_t(b)] + c.snew; ++j)
      for (int64_t e = 0; e < row; ++e) {
        const float kx = logical_k[size_t(b)][size_t(j * row + e)], vx = logical_v[size_t(b)][size_t(j * row + e)];
        const int64_t idx = cache_index(b, j) + e;
        if (c.cache_dtype == DType::f32) {
          k_after32[size_t(idx)] = kx;
          v_after32[size_t(idx)] = vx;
        } else {
          ioattn::store_from_f32(k_after16.data(), idx, c.cache_dtype, kx);
          ioattn::store_from_f32(v_after16.data(), idx, c.cache_dtype, vx);
        }
      }

  const ioattn_tensor* kn = c.snew > 0 ? &tkn : nullptr;
  const ioattn_tensor* vn = c.snew > 0 ? &tvn : nullptr;
  INFO("B=" << c.batch << " Hq=" << c.hq << " Hkv=" << c.hkv << " D=" << c.d << " Sq=" << c.sq << " Snew=" << c.snew
            << " page=" << c.page_size << " cache=" << ioattn::dtype_name(c.cache_dtype) << " causal=" << c.causal
            << " window=" << c.window_left << "," << c.window_right << " softcap=" << c.softcap);
  REQUIRE(ioattn_forward_kvcache(&tq, &cache, kn, vn, &to, lse.data(), &opt) == IOATTN_OK);

  auto same_bits = [](const auto& a, const auto& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
  };
  CHECK(same_bits(kc32, k_after32));
  CHECK(same_bits(vc32, v_after32));
  CHECK(same_bits(kc16, k_after16));
  CHECK(same_bits(vc16, v_after16));

  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t total = cached[size_t(b)] + c.snew;
    std::vector<float> qb(q.begin() + b * c.sq * c.hq * c.d, q.begin() + (b + 1) * c.sq * c.hq * c.d);
    const SequenceOracle o =
        reference_sequence(qb, logical_k[size_t(b)], logical_v[size_t(b)], c.sq, total, c.hq, c.hkv, c.d, mask_of(opt));
    INFO("sequence " << b << " with " << cached[size_t(b)] << " cached keys");
    check_close(out.data() + b * c.sq * c.hq * c.d, o, c.sq * c.hq * c.d, "out");
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.sq; ++i)
        check_lse(lse[size_t((b * c.hq + h) * c.sq + i)], o.lse64[size_t(h * c.sq + i)], o.lse32[size_t(h * c.sq + i)]);
  }
}

}  // namespace

TEST_CASE("KV-cache append then attend matches the reference", "[kvcache]") {
  std::mt19937 rng(20261202);
  const int64_t page_sizes[] = {0, 1, 16, 256};
  const DType cache_types[] = {DType::f32, DType::f16, DType::bf16};
  const int64_t query_lengths[] = {1, 4, 16};
  int index = 0;
  for (int64_t page : page_sizes)
    for (DType t : cache_types)
      for (int64_t sq : query_lengths) {
        ++index;
        KvCase c{};
        c.batch = 1 + index % 4;
        c.hkv = index % 3 == 0 ? 1 : 2;
        c.hq = c.hkv * (index % 2 == 0 ? 4 : 2);
        c.d = index % 5 == 0 ? 80 : (index % 3 == 0 ? 59 : 64);
        c.sq = sq;
        c.snew = index % 4 == 0 ? 0 : sq;
        c.page_size = page;
        c.cache_dtype = t;
        c.causal = index % 2;
        c.window_left = index % 7 == 0 ? 37 : -1;
        c.window_right = -1;
        c.softcap = index % 6 == 0 ? 5.f : 0.f;
        DYNAMIC_SECTION("case " << index) { run_kvcache_case(c, rng); }
      }
}

TEST_CASE("decode shapes: one query token, GQA 4 and MQA", "[kvcache]") {
  std::mt19937 rng(7);
  for (int64_t hkv : {8, 1}) {
    KvCase c{2, 32, hkv, 128, 1, 1, 16, DType::f16, 1, -1, -1, 0.f};
    DYNAMIC_SECTION("Hkv " << hkv) { run_kvcache_case(c, rng); }
  }
}

TEST_CASE("varlen packed batches, with empty sequences, match the reference", "[varlen]") {
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  for (int causal = 0; causal < 2; ++causal) {
    const int64_t hq = 4, hkv = 2, d = 48;
    const std::vector<int32_t> lens_q{5, 0, 17, 1, 33}, lens_k{7, 9, 17, 0, 100};
    std::vector<int32_t> cu_q{0}, cu_k{0};
    for (size_t b = 0; b < lens_q.size(); ++b) {
      cu_q.push_back(cu_q.back() + lens_q[b]);
      cu_k.push_back(cu_k.back() + lens_k[b]);
    }
    const int64_t tq_len = cu_q.back(), tk_len = cu_k.back();
    std::vector<float> q(size_t(tq_len * hq * d)), k(size_t(tk_len * hkv * d)), v(k.size());
    for (auto& x : q) x = uni(rng);
    for (auto& x : k) x = uni(rng);
    for (auto& x : v) x = uni(rng);
    std::vector<float> out(q.size(), NAN), lse(size_t(hq * tq_len), NAN);
    const ioattn_tensor tq{q.data(), IOATTN_F32, 1, tq_len, hq, d, tq_len * hq * d, hq * d, d};
    const ioattn_tensor tk{k.data(), IOATTN_F32, 1, tk_len, hkv, d, tk_len * hkv * d, hkv * d, d};
    const ioattn_tensor tv{v.data(), IOATTN_F32, 1, tk_len, hkv, d, tk_len * hkv * d, hkv * d, d};
    const ioattn_tensor to{out.data(), IOATTN_F32, 1, tq_len, hq, d, tq_len * hq * d, hq * d, d};
    ioattn_options opt;
    ioattn_options_default(&opt);
    opt.causal = causal;
    REQUIRE(ioattn_forward_varlen(&tq, &tk, &tv, cu_q.data(), cu_k.data(), int32_t(lens_q.size()), &to, lse.data(),
                                  &opt) == IOATTN_OK);
    for (size_t b = 0; b < lens_q.size(); ++b) {
      if (lens_q[b] == 0) continue;
      std::vector<float> qb(q.begin() + cu_q[b] * hq * d, q.begin() + cu_q[b + 1] * hq * d);
      std::vector<float> kb(k.begin() + cu_k[b] * hkv * d, k.begin() + cu_k[b + 1] * hkv * d);
      std::vector<float> vb(v.begin() + cu_k[b] * hkv * d, v.begin() + cu_k[b + 1] * hkv * d);
      const SequenceOracle o = reference_sequence(qb, kb, vb, lens_q[b], lens_k[b], hq, hkv, d, mask_of(opt));
      INFO("causal " << causal << " sequence " << b);
      check_close(out.data() + cu_q[b] * hq * d, o, lens_q[b] * hq * d, "out");
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t i = 0; i < lens_q[b]; ++i)
          check_lse(lse[size_t(h * tq_len + cu_q[b] + i)], o.lse64[size_t(h * lens_q[b] + i)],
                    o.lse32[size_t(h * lens_q[b] + i)]);
    }
  }
}

TEST_CASE("decode mode over paged caches: page sizes 1, 16, 256, Sq 1 and 2, GQA 4 and 8", "[kvcache][decode]") {
  // G x Sq <= 8 rows per kv head: the kernel's decode mode reads K/V position by position
  // through the block table (pages in random order, guard pages NaN).
  std::mt19937 rng(2026);
  int index = 0;
  for (int64_t page : {1, 16, 256})
    for (int64_t sq : {1, 2})
      for (int64_t g : {4, 8}) {
        if (g * sq > 8) continue;
        ++index;
        const DType t = index % 2 ? DType::bf16 : DType::f16;
        KvCase c{1 + index % 3, 2 * g, 2, index % 3 == 0 ? 72 : 128, sq, sq,
                 page,          t,     1, index % 4 == 1 ? 50 : -1,  -1, 0.f};
        DYNAMIC_SECTION("page " << page << " Sq " << sq << " G " << g) { run_kvcache_case(c, rng); }
      }
}
