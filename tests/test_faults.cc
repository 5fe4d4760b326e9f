// Injected allocation failures through the C ABI: for n = 0, 1, 2, ... the (n+1)-th scratch
// allocation fails (ioattn::testing::fail_scratch_alloc_after). Every such call must return
// IOATTN_ERROR_OUT_OF_MEMORY with a message, leave out, lse and the KV cache byte-for-byte as
// they were (the API stages the cache append and undoes it), and the next call without injection
// must succeed with exactly the bits of a clean run. Leaks are LeakSanitizer's job in the ASan
// build: every path below frees what it allocated, or the suite fails there at exit.
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/alloc.h"
#include "common/dtype.h"
#include "common/hardware.h"
#include "cpu/cpu_backend.h"
#include "ioattn/ioattn.h"
#include "tests/catch.h"
#include "tests/support/support.h"

namespace {

using ioattn::DType;
using ioattn::test::AttnBuffers;
using ioattn::test::AttnCase;
using Bytes = std::vector<unsigned char>;

// Arms the hook for one call and always disarms it, even when a check throws.
struct InjectedFailure {
  explicit InjectedFailure(long successes) { ioattn::testing::fail_scratch_alloc_after(successes); }
  ~InjectedFailure() { ioattn::testing::fail_scratch_alloc_after(-1); }
};

// Drives one request through every allocation it makes. `call` runs it on the caller's buffers,
// `state` returns every byte the call may write (outputs and cache), `reset` puts those buffers
// back to their pristine contents. Returns how many injected failures the request went through.
int exhaust_allocations(const std::function<ioattn_status()>& call, const std::function<Bytes()>& state,
                        const std::function<void()>& reset) {
  reset();
  REQUIRE(call() == IOATTN_OK);
  const Bytes clean = state();
  constexpr long kMaxAllocations = 64;
  for (long n = 0; n < kMaxAllocations; ++n) {
    reset();
    const Bytes before = state();
    ioattn_status s;
    {
      InjectedFailure inject(n);
      s = call();
    }
    if (s == IOATTN_OK) {
      CHECK(state() == clean);  // a run with no failure left is a clean run
      return int(n);
    }
    INFO("allocation " << n << " failed; message: " << ioattn_last_error());
    REQUIRE(s == IOATTN_ERROR_OUT_OF_MEMORY);
    CHECK(std::string(ioattn_last_error()).find("allocate") != std::string::npos);
    CHECK(state() == before);
    // Recovery: the very next call, hook off, succeeds with the clean bits.
    reset();
    REQUIRE(call() == IOATTN_OK);
    CHECK(state() == clean);
  }
  FAIL("the request still failed after " << kMaxAllocations << " injected allocation failures");
  return -1;
}

Bytes bytes_of(const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  return Bytes(b, b + n);
}

Bytes outputs_of(const AttnBuffers& bufs) {
  Bytes s = bytes_of(bufs.out.data(), size_t(bufs.out.span_elements()) * size_t(dtype_bytes(bufs.out.dtype())));
  const Bytes l = bytes_of(bufs.lse.data(), bufs.lse.size() * sizeof(float));
  s.insert(s.end(), l.begin(), l.end());
  return s;
}

ioattn_tensor dense(void* data, int32_t dtype, int64_t b, int64_t s, int64_t h, int64_t d) {
  return {data, dtype, b, s, h, d, s * h * d, h * d, d};
}

}  // namespace

TEST_CASE("dense forward: each failing scratch allocation returns OUT_OF_MEMORY, writes nothing, recovers",
          "[faults]") {
  struct Shape {
    int64_t b, hq, hkv, sq, sk, d;
    DType dt;
    int threads;
  };
  // The last is a decode shape (one query row, long keys) for which the planner splits the key
  // axis, so the partials buffer is allocated too.
  const Shape shapes[] = {{2, 4, 2, 33, 47, 32, DType::f32, 1},
                          {1, 2, 2, 64, 64, 64, DType::bf16, 3},
                          {1, 1, 1, 1, 4096, 64, DType::f16, 4}};
  for (const Shape& sh : shapes) {
    AttnCase c;
    c.batch = sh.b, c.heads_q = sh.hq, c.heads_kv = sh.hkv, c.seqlen_q = sh.sq, c.seqlen_k = sh.sk;
    c.head_dim = sh.d, c.dtype = sh.dt, c.threads = sh.threads, c.causal = true;
    INFO(c.describe());
    std::mt19937 rng(5);
    AttnBuffers bufs(c);
    bufs.randomize(rng);
    const int failures = exhaust_allocations([&] { return ioattn::test::run_c_abi(c, bufs); },
                                             [&] { return outputs_of(bufs); }, [&] { bufs.reset_outputs(); });
    const ioattn::Plan plan = ioattn::cpu::plan_for_params(ioattn::test::make_params(c, bufs));
    // The kernel allocates its tile index and the workers' scratch, plus the split partials.
    CHECK(failures == (plan.kv_splits > 1 ? 3 : 2));
    // Decode splits its keys to fill the cores this process may use (one CPU: nothing to fill).
    if (sh.sq == 1 && ioattn::detect_host().cores > 1) CHECK(plan.kv_splits > 1);
  }
}

TEST_CASE("varlen forward: failing allocations leave out and lse untouched", "[faults]") {
  const int64_t H = 2, D = 16;
  const std::vector<int32_t> cu_q = {0, 3, 3, 20}, cu_k = {0, 9, 30, 31};
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<float> q(size_t(20 * H * D)), kv(size_t(31 * H * D)), out(q.size()), lse(size_t(H * 20));
  for (float& x : q) x = normal(rng);
  for (float& x : kv) x = normal(rng);
  ioattn_tensor tq = dense(q.data(), IOATTN_F32, 1, 20, H, D), tk = dense(kv.data(), IOATTN_F32, 1, 31, H, D);
  ioattn_tensor to = dense(out.data(), IOATTN_F32, 1, 20, H, D);
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.num_threads = 2;
  const int failures = exhaust_allocations(
      [&] { return ioattn_forward_varlen(&tq, &tk, &tk, cu_q.data(), cu_k.data(), 3, &to, lse.data(), &opt); },
      [&] {
        Bytes s = bytes_of(out.data(), out.size() * 4);
        const Bytes l = bytes_of(lse.data(), lse.size() * 4);
        s.insert(s.end(), l.begin(), l.end());
        return s;
      },
      [&] {
        std::fill(out.begin(), out.end(), -3.f);
        std::fill(lse.begin(), lse.end(), -3.f);
      });
  CHECK(failures >= 2);
}

TEST_CASE("KV-cache forward: a failure after the append is staged restores the cache exactly", "[faults]") {
  // Contiguous f32 and paged half-precision caches; the append is staged in a scratch backup
  // (allocation 0), then the kernel allocates, so n >= 1 fails after the cache was written and
  // the undo must put every byte back.
  for (const bool paged : {false, true}) {
    const int32_t cache_dtype = paged ? IOATTN_F16 : IOATTN_F32;
    const int64_t B = 2, Hq = 4, Hkv = 2, D = 32, Sq = 2, Snew = 2, page = 4, pages_per_seq = 4;
    const int64_t outer = paged ? B * pages_per_seq : B, rows = paged ? page : page * pages_per_seq;
    const int64_t esize = cache_dtype == IOATTN_F32 ? 4 : 2;
    INFO((paged ? "paged f16 cache" : "contiguous f32 cache"));
    std::mt19937 rng(17);
    std::normal_distribution<float> normal;
    Bytes k_pristine(size_t(outer * rows * Hkv * D * esize)), v_pristine(k_pristine.size());
    for (Bytes* c : {&k_pristine, &v_pristine})
      for (int64_t i = 0; i < outer * rows * Hkv * D; ++i)
        ioattn::store_from_f32(c->data(), i, DType(cache_dtype), normal(rng));
    Bytes k_cache = k_pristine, v_cache = v_pristine;
    std::vector<float> q(size_t(B * Sq * Hq * D)), k_new(size_t(B * Snew * Hkv * D)), v_new(k_new.size());
    for (auto* v : {&q, &k_new, &v_new})
      for (float& x : *v) x = normal(rng);
    std::vector<float> out(q.size()), lse(size_t(B * Hq * Sq));
    const std::vector<int32_t> seqlens = {5, 9};
    const std::vector<int32_t> table = {6, 1, 3, 0, 2, 7, 5, 4};
    ioattn_kvcache cache{};
    cache.k = dense(k_cache.data(), cache_dtype, outer, rows, Hkv, D);
    cache.v = dense(v_cache.data(), cache_dtype, outer, rows, Hkv, D);
    cache.seqlens = seqlens.data();
    if (paged) {
      cache.block_table = table.data();
      cache.max_pages_per_seq = int32_t(pages_per_seq);
    }
    ioattn_tensor tq = dense(q.data(), IOATTN_F32, B, Sq, Hq, D), to = dense(out.data(), IOATTN_F32, B, Sq, Hq, D);
    ioattn_tensor tkn = dense(k_new.data(), IOATTN_F32, B, Snew, Hkv, D),
                  tvn = dense(v_new.data(), IOATTN_F32, B, Snew, Hkv, D);
    ioattn_options opt;
    ioattn_options_default(&opt);
    opt.causal = 1;
    opt.num_threads = 2;
    const int failures =
        exhaust_allocations([&] { return ioattn_forward_kvcache(&tq, &cache, &tkn, &tvn, &to, lse.data(), &opt); },
                            [&] {
                              Bytes s = bytes_of(out.data(), out.size() * 4);
                              for (const Bytes* part : {&k_cache, &v_cache})
                                s.insert(s.end(), part->begin(), part->end());
                              const Bytes l = bytes_of(lse.data(), lse.size() * 4);
                              s.insert(s.end(), l.begin(), l.end());
                              return s;
                            },
                            [&] {
                              k_cache = k_pristine;
                              v_cache = v_pristine;
                              std::fill(out.begin(), out.end(), -5.f);
                              std::fill(lse.begin(), lse.end(), -5.f);
                            });
    CHECK(failures >= 3);  // the staging backup, then at least the kernel's two
  }
}
