// The inference entry points on the CUDA backend: KV-cache append-then-attend (contiguous and
// paged in random page order, with NaN guard pages) and packed variable-length batches, in bf16
// and f16, against the fp64 reference run on each sequence rebuilt densely on the host. Few
// query rows per kv head (G x Sq <= 16) take the split-KV decode kernel (gpu/decode.cuh); the
// grids below cover it with and without splits, its merge, and its scratch allocation failing.
// Every pointer the call receives is a device pointer (docs/api.md, "Memory spaces").
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/gpu_tiles.h"
#include "common/reference.h"
#include "ioattn/ioattn.h"
#include "tests/catch.h"
#include "tests/support/support.h"

#if IOATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "gpu/decode.h"

namespace {

using ioattn::DType;

#define CUDA_OK(expr) REQUIRE((expr) == cudaSuccess)

template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceArray(const std::vector<T>& host) : count(host.size()) {
    CUDA_OK(cudaMalloc(&ptr, std::max<size_t>(1, count) * sizeof(T)));
    if (count) CUDA_OK(cudaMemcpy(ptr, host.data(), count * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<T> download() const {
    std::vector<T> host(count);
    if (count) CUDA_OK(cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
};

// Values as the kernel reads them: drawn, then rounded through the storage type.
std::vector<uint16_t> to_storage(const std::vector<float>& x, DType t) {
  std::vector<uint16_t> s(x.size());
  for (size_t i = 0; i < x.size(); ++i) ioattn::store_from_f32(s.data(), int64_t(i), t, x[i]);
  return s;
}

using ioattn::test::reference_sequence;
using ioattn::test::SequenceMask;
using ioattn::test::SequenceOracle;

// The tolerance rule of docs/testing.md with a half-precision output: err <= 2 * err(naive f32, rounded to the
// storage type) + floor, floor = 2 ulp of the output magnitude in that type.
void check_sequence(const std::vector<uint16_t>& out, int64_t offset, const std::vector<float>& lse, int64_t lse_at,
                    int64_t lse_head_stride, const SequenceOracle& o, int64_t sq, int64_t hq, DType t) {
  double magnitude = 0, naive_err = 0, err = 0;
  for (size_t i = 0; i < o.out64.size(); ++i) {
    const float got = ioattn::load_as_f32(out.data(), offset + int64_t(i), t);
    REQUIRE(!std::isnan(got));
    magnitude = std::max(magnitude, std::fabs(o.out64[i]));
    naive_err = std::max(naive_err, std::fabs(double(ioattn::round_to(t, o.out32[i])) - o.out64[i]));
    err = std::max(err, std::fabs(double(got) - o.out64[i]));
  }
  const double ulp = t == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
  INFO("kernel error " << err << ", naive error " << naive_err << ", magnitude " << magnitude);
  CHECK(err <= 2 * naive_err + 2 * ulp * std::max(magnitude, 1e-3));
  const int64_t d = int64_t(o.out64.size()) / std::max<int64_t>(1, sq * hq);
  for (int64_t h = 0; h < hq; ++h)
    for (int64_t i = 0; i < sq; ++i) {
      const double want = o.lse64[size_t(h * sq + i)];
      const float got = lse[size_t(lse_at + h * lse_head_stride + i)];
      if (std::isinf(want)) {
        CHECK(got == float(want));
        // A row with no visible key is exactly 0 (contract), not merely within tolerance.
        for (int64_t c = 0; c < d; ++c) CHECK(ioattn::load_as_f32(out.data(), offset + (i * hq + h) * d + c, t) == 0.f);
      } else {
        CHECK(std::fabs(double(got) - want) <= 1e-3 * std::max(1.0, std::fabs(want)));
      }
    }
}

struct KvCase {
  int64_t batch, hq, hkv, d, snew;
  int64_t page_size;  // 0: contiguous
  DType dtype;
  SequenceMask mask;
  int64_t sq = 0;             // 0: max(snew, 1)
  int32_t max_cached = 1000;  // longest cached length drawn
  int32_t min_cached = 0;     // shortest, for sequences past the first two
  int repeats = 1;            // > 1: the call again must give the same bits
  bool fail_scratch = false;  // first call with the device scratch allocation failing
};

void run_kvcache(const KvCase& c, std::mt19937& rng) {
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<int32_t> cached(size_t(c.batch));
  // 0 and 1 cached keys always among the sequences (when there are enough), the rest random.
  for (size_t b = 0; b < cached.size(); ++b)
    cached[b] =
        b < 2 && c.batch > 2 ? int32_t(b) : c.min_cached + int32_t(rng() % uint32_t(c.max_cached - c.min_cached + 1));
  std::shuffle(cached.begin(), cached.end(), rng);
  const int64_t sq = c.sq > 0 ? c.sq : std::max<int64_t>(c.snew, 1), row = c.hkv * c.d;
  const int64_t smax = *std::max_element(cached.begin(), cached.end()) + c.snew + 5;
  const bool paged = c.page_size > 0;
  int64_t pages = 0, max_pages = 1;
  std::vector<int32_t> table;
  if (paged) {
    for (int32_t l : cached) max_pages = std::max(max_pages, (l + c.snew + c.page_size - 1) / c.page_size);
    pages = c.batch * max_pages + 2;  // two guard pages nobody owns
    std::vector<int32_t> pool(static_cast<size_t>(pages));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    table.assign(size_t(c.batch * max_pages), 0);
    for (size_t i = 0; i < table.size(); ++i) table[i] = pool[i];
  }
  const int64_t slots = paged ? pages * c.page_size : c.batch * smax;
  auto slot = [&](int64_t b, int64_t j) {
    return paged ? table[size_t(b * max_pages + j / c.page_size)] * c.page_size + j % c.page_size : b * smax + j;
  };
  const uint16_t nan_bits = c.dtype == DType::bf16 ? ioattn::f32_to_bf16(NAN) : ioattn::f32_to_f16(NAN);
  std::vector<uint16_t> kc(size_t(slots * row), nan_bits), vc(kc.size(), nan_bits);
  std::vector<std::vector<float>> lk(size_t(c.batch)), lv(size_t(c.batch));
  std::vector<float> knew(size_t(c.batch * c.snew * row)), vnew(knew.size()), q(size_t(c.batch * sq * c.hq * c.d));
  for (auto* x : {&knew, &vnew, &q})
    for (float& e : *x) e = ioattn::round_to(c.dtype, uni(rng));
  std::vector<uint16_t> k_expect = kc, v_expect = vc;
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t total = cached[size_t(b)] + c.snew;
    lk[size_t(b)].resize(size_t(total * row));
    lv[size_t(b)].resize(size_t(total * row));
    for (int64_t j = 0; j < total; ++j)
      for (int64_t e = 0; e < row; ++e) {
        const bool fresh = j >= cached[size_t(b)];
        const size_t src = size_t((b * c.snew + (j - cached[size_t(b)])) * row + e);
        const float kx = fresh ? knew[src] : ioattn::round_to(c.dtype, uni(rng));
        const float vx = fresh ? vnew[src] : ioattn::round_to(c.dtype, uni(rng));
        lk[size_t(b)][size_t(j * row + e)] = kx;
        lv[size_t(b)][size_t(j * row + e)] = vx;
        const int64_t at = slot(b, j) * row + e;
        ioattn::store_from_f32(k_expect.data(), at, c.dtype, kx);
        ioattn::store_from_f32(v_expect.data(), at, c.dtype, vx);
        if (!fresh) {
          ioattn::store_from_f32(kc.data(), at, c.dtype, kx);
          ioattn::store_from_f32(vc.data(), at, c.dtype, vx);
        }
      }
  }
  DeviceArray<uint16_t> dk(kc), dv(vc), dq(to_storage(q, c.dtype)), dkn(to_storage(knew, c.dtype)),
      dvn(to_storage(vnew, c.dtype)), dout(std::vector<uint16_t>(q.size(), nan_bits));
  DeviceArray<float> dlse(std::vector<float>(size_t(c.batch * c.hq * sq), NAN));
  DeviceArray<int32_t> dseq(cached), dtable(paged ? table : std::vector<int32_t>{0});
  const int32_t t = int32_t(c.dtype);
  const int64_t cb = paged ? pages : c.batch, cs = paged ? c.page_size : smax;
  ioattn_kvcache cache{};
  cache.k = {dk.ptr, t, cb, cs, c.hkv, c.d, cs * row, row, c.d};
  cache.v = {dv.ptr, t, cb, cs, c.hkv, c.d, cs * row, row, c.d};
  cache.seqlens = dseq.ptr;
  cache.block_table = paged ? dtable.ptr : nullptr;
  cache.max_pages_per_seq = int32_t(max_pages);
  const ioattn_tensor tq{dq.ptr, t, c.batch, sq, c.hq, c.d, sq * c.hq * c.d, c.hq * c.d, c.d};
  const ioattn_tensor to{dout.ptr, t, c.batch, sq, c.hq, c.d, sq * c.hq * c.d, c.hq * c.d, c.d};
  const ioattn_tensor tkn{dkn.ptr, t, c.batch, c.snew, c.hkv, c.d, c.snew * row, row, c.d};
  const ioattn_tensor tvn{dvn.ptr, t, c.batch, c.snew, c.hkv, c.d, c.snew * row, row, c.d};
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.backend = IOATTN_BACKEND_CUDA;
  opt.causal = c.mask.causal ? 1 : 0;
  opt.window_left = int32_t(c.mask.window_left);
  opt.window_right = int32_t(c.mask.window_right);
  opt.softcap = c.mask.softcap;
  INFO("B=" << c.batch << " Hq=" << c.hq << " Hkv=" << c.hkv << " D=" << c.d << " Sq=" << sq << " Snew=" << c.snew
            << " page=" << c.page_size << " " << ioattn::dtype_name(c.dtype) << " causal=" << c.mask.causal
            << " window=" << c.mask.window_left << "," << c.mask.window_right << " softcap=" << c.mask.softcap);
  auto call = [&] {
    return ioattn_forward_kvcache(&tq, &cache, c.snew ? &tkn : nullptr, c.snew ? &tvn : nullptr, &to, dlse.ptr, &opt);
  };
  if (c.fail_scratch) {
    // Both device allocations, the decode partials (first) and the copy of the cache slots the
    // append overwrites (second, only with new rows), come before the append: either failure
    // leaves cache, out and lse as they were, and the next call works.
    const std::vector<std::pair<long, const char*>> failures = {{0, "split-KV decode partials"},
                                                                {1, "overwritten KV-cache slots"}};
    for (const auto& [after, what] : failures) {
      if (after == 1 && c.snew == 0) continue;
      INFO("failing allocation " << after << ": " << what);
      ioattn::gpu::testing::fail_device_alloc_after(after);
      const ioattn_status failed = call();
      ioattn::gpu::testing::fail_device_alloc_after(-1);
      CHECK(failed == IOATTN_ERROR_BACKEND);
      CHECK(std::string(ioattn_last_error()).find(what) != std::string::npos);
      CUDA_OK(cudaDeviceSynchronize());
      CHECK(dk.download() == kc);
      CHECK(dv.download() == vc);
      const std::vector<uint16_t> untouched = dout.download();
      CHECK(std::all_of(untouched.begin(), untouched.end(), [&](uint16_t x) { return x == nan_bits; }));
      const std::vector<float> lse_untouched = dlse.download();
      CHECK(std::all_of(lse_untouched.begin(), lse_untouched.end(), [](float x) { return std::isnan(x); }));
    }
  }
  const ioattn_status st = call();
  INFO(ioattn_last_error());
  REQUIRE(st == IOATTN_OK);
  CUDA_OK(cudaDeviceSynchronize());
  CHECK(dk.download() == k_expect);  // appended rows landed, guard pages and other slots untouched
  CHECK(dv.download() == v_expect);
  const std::vector<uint16_t> out = dout.download();
  const std::vector<float> lse = dlse.download();
  for (int64_t b = 0; b < c.batch; ++b) {
    std::vector<float> qb(q.begin() + b * sq * c.hq * c.d, q.begin() + (b + 1) * sq * c.hq * c.d);
    const SequenceOracle o =
        reference_sequence(qb, lk[size_t(b)], lv[size_t(b)], sq, cached[size_t(b)] + c.snew, c.hq, c.hkv, c.d, c.mask);
    INFO("sequence " << b << ", " << cached[size_t(b)] << " cached keys");
    check_sequence(out, b * sq * c.hq * c.d, lse, b * c.hq * sq, sq, o, sq, c.hq, c.dtype);
  }
  // Re-running appends the same rows to the same slots: the cache is unchanged and the split
  // count, the split boundaries and the merge order are fixed, so out and lse repeat bit for bit.
  for (int r = 1; r < c.repeats; ++r) {
    REQUIRE(call() == IOATTN_OK);
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(dout.download() == out);
    const std::vector<float> again = dlse.download();
    CHECK(std::memcmp(again.data(), lse.data(), lse.size() * sizeof(float)) == 0);
  }
}

}  // namespace

TEST_CASE("CUDA KV cache: append then attend, contiguous and paged, against the reference", "[gpu][kvcache]") {
  std::mt19937 rng(4242);
  int index = 0;
  for (int64_t page : {0, 1, 16, 256})
    for (DType t : {DType::bf16, DType::f16})
      for (int64_t snew : {0, 1, 4}) {
        ++index;
        SequenceMask mask;
        mask.causal = index % 2 == 0;
        const KvCase c{1 + index % 3, index % 2 ? 8 : 4, index % 3 ? 2 : 1, index % 4 ? 128 : 64, snew, page, t, mask};
        DYNAMIC_SECTION("case " << index) { run_kvcache(c, rng); }
      }
}

// The decode grid: Sq 1..16 query rows per head with GQA 1/4/8 (G x Sq <= 16 decodes, larger
// products exercise the hand-over to the prefill kernel), D 64/96/128/256, page sizes 1/16/256 in
// random order and contiguous, causal / window / softcap, cache lengths up to 3000 so that small
// batches split the keys (B x Hkv CTAs < 132 SMs), 3 bitwise-equal repeats each.
TEST_CASE("CUDA decode: split-KV with GQA packing, paged and contiguous, against the reference", "[gpu][decode]") {
  std::mt19937 rng(5150);
  struct Shape {
    int64_t hq, hkv, sq, d;
  };
  const Shape shapes[] = {{8, 8, 1, 128}, {8, 2, 1, 64},   {16, 2, 2, 128}, {8, 1, 2, 256}, {4, 4, 16, 64},
                          {4, 1, 4, 96},  {8, 8, 3, 256},  {32, 8, 1, 128}, {8, 1, 1, 128}, {2, 2, 9, 128},
                          {8, 2, 5, 64},  {16, 16, 1, 64}, {4, 4, 7, 128},  {8, 1, 3, 64}};
  const int64_t pages[] = {0, 1, 16, 256};
  int index = 0;
  for (const Shape& sh : shapes)
    for (int variant = 0; variant < 4; ++variant) {
      ++index;
      SequenceMask mask;
      switch ((index + variant) % 5) {
        case 0: break;
        case 1: mask.causal = true; break;
        case 2: mask.window_left = 40 + int64_t(rng() % 200), mask.window_right = int64_t(rng() % 3); break;
        case 3: mask.softcap = 5.f, mask.causal = true; break;
        case 4: mask.window_left = 300, mask.causal = true, mask.softcap = 30.f; break;
      }
      const int64_t snew = variant == 3 ? 0 : std::min<int64_t>(sh.sq, 1 + variant);
      KvCase c{1 + int64_t(rng() % 4),
               sh.hq,
               sh.hkv,
               sh.d,
               snew,
               pages[(index + variant) % 4],
               index % 3 ? DType::bf16 : DType::f16,
               mask};
      c.sq = sh.sq;
      c.max_cached = variant == 0 ? 3000 : 700;
      c.repeats = 3;
      DYNAMIC_SECTION("case " << index) { run_kvcache(c, rng); }
    }
}

// A bounded subset for compute-sanitizer (memcheck, racecheck, synccheck): one split and one
// multi-split decode, paged and contiguous, and the scratch failure with its recovery.
TEST_CASE("CUDA decode: small split and unsplit cases", "[gpu][decode][sanitize]") {
  std::mt19937 rng(99);
  SequenceMask causal;
  causal.causal = true;
  KvCase split{2, 8, 2, 64, 1, 16, DType::bf16, causal};
  split.max_cached = 1500;
  split.min_cached = 800;  // >= 13 key blocks: 4 CTAs split 3 ways at least
  split.repeats = 2;
  SECTION("paged, split") { run_kvcache(split, rng); }
  KvCase whole{8, 32, 32, 128, 1, 0, DType::f16, SequenceMask{}};
  whole.max_cached = 200;
  SECTION("contiguous, one split per CTA") { run_kvcache(whole, rng); }
  KvCase fail{1, 4, 1, 128, 2, 1, DType::bf16, causal};
  fail.max_cached = 2000;
  fail.min_cached = 1000;
  fail.fail_scratch = true;
  SECTION("scratch allocation fails, then the call works") { run_kvcache(fail, rng); }
}

TEST_CASE("CUDA varlen: packed sequences with empty ones, against the reference", "[gpu][varlen]") {
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  // The second length set has at most 3 query rows per sequence (G x Sq = 12): the decode
  // kernel, with key splits from the 4000-key sequence.
  const std::vector<std::vector<int32_t>> q_lens{{5, 0, 129, 1, 33}, {1, 0, 3, 2}};
  const std::vector<std::vector<int32_t>> k_lens{{7, 9, 129, 0, 300}, {0, 700, 1, 4000}};
  for (size_t set = 0; set < q_lens.size(); ++set)
    for (DType t : {DType::bf16, DType::f16})
      for (bool causal : {false, true}) {
        const int64_t hq = 8, hkv = 2, d = 64;
        const std::vector<int32_t>& lq = q_lens[set];
        const std::vector<int32_t>& lk = k_lens[set];
        std::vector<int32_t> cq{0}, ck{0};
        for (size_t b = 0; b < lq.size(); ++b) {
          cq.push_back(cq.back() + lq[b]);
          ck.push_back(ck.back() + lk[b]);
        }
        const int64_t tq = cq.back(), tk = ck.back();
        std::vector<float> q(size_t(tq * hq * d)), k(size_t(tk * hkv * d)), v(k.size());
        for (auto* x : {&q, &k, &v})
          for (float& e : *x) e = ioattn::round_to(t, uni(rng));
        const uint16_t nan_bits = t == DType::bf16 ? ioattn::f32_to_bf16(NAN) : ioattn::f32_to_f16(NAN);
        DeviceArray<uint16_t> dq(to_storage(q, t)), dk(to_storage(k, t)), dv(to_storage(v, t)),
            dout(std::vector<uint16_t>(q.size(), nan_bits));
        DeviceArray<float> dlse(std::vector<float>(size_t(hq * tq), NAN));
        DeviceArray<int32_t> dcq(cq), dck(ck);
        const int32_t dt = int32_t(t);
        const ioattn_tensor tq_{dq.ptr, dt, 1, tq, hq, d, tq * hq * d, hq * d, d};
        const ioattn_tensor tk_{dk.ptr, dt, 1, tk, hkv, d, tk * hkv * d, hkv * d, d};
        const ioattn_tensor tv_{dv.ptr, dt, 1, tk, hkv, d, tk * hkv * d, hkv * d, d};
        const ioattn_tensor to_{dout.ptr, dt, 1, tq, hq, d, tq * hq * d, hq * d, d};
        ioattn_options opt;
        ioattn_options_default(&opt);
        opt.backend = IOATTN_BACKEND_CUDA;
        opt.causal = causal ? 1 : 0;
        const ioattn_status st =
            ioattn_forward_varlen(&tq_, &tk_, &tv_, dcq.ptr, dck.ptr, int32_t(lq.size()), &to_, dlse.ptr, &opt);
        INFO(ioattn_last_error());
        REQUIRE(st == IOATTN_OK);
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<uint16_t> out = dout.download();
        const std::vector<float> lse = dlse.download();
        for (size_t b = 0; b < lq.size(); ++b) {
          if (lq[b] == 0) continue;
          std::vector<float> qb(q.begin() + cq[b] * hq * d, q.begin() + cq[b + 1] * hq * d);
          std::vector<float> kb(k.begin() + ck[b] * hkv * d, k.begin() + ck[b + 1] * hkv * d);
          std::vector<float> vb(v.begin() + ck[b] * hkv * d, v.begin() + ck[b + 1] * hkv * d);
          SequenceMask mask;
          mask.causal = causal;
          const SequenceOracle o = reference_sequence(qb, kb, vb, lq[b], lk[b], hq, hkv, d, mask);
          INFO("set " << set << " " << ioattn::dtype_name(t) << " causal " << causal << " sequence " << b);
          check_sequence(out, cq[b] * hq * d, lse, cq[b], tq, o, lq[b], hq, t);
        }
      }
}

#endif  // IOATTN_HAVE_CUDA (main: tests/gpu_main.cc)
