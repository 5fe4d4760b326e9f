// Every rejection of the C ABI: the status, a message naming the argument, and outputs (and the
// KV cache) left byte-for-byte untouched.
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ioattn/ioattn.h"
#include "tests/catch.h"

namespace {

constexpr float kSentinel = -12345.f;

bool all_sentinel(const std::vector<float>& x) {
  for (float e : x)
    if (e != kSentinel) return false;
  return true;
}

struct Dense {
  int64_t B = 2, S = 5, H = 4, Hkv = 2, D = 8;
  std::vector<float> q, k, v, out, lse;
  ioattn_tensor tq{}, tk{}, tv{}, to{};
  ioattn_options opt{};

  Dense() {
    q.assign(size_t(B * S * H * D), 0.5f);
    k.assign(size_t(B * S * Hkv * D), 0.25f);
    v.assign(size_t(B * S * Hkv * D), 1.f);
    out.assign(size_t(B * S * H * D), kSentinel);
    lse.assign(size_t(B * H * S), kSentinel);
    tq = make(q.data(), S, H);
    tk = make(k.data(), S, Hkv);
    tv = make(v.data(), S, Hkv);
    to = make(out.data(), S, H);
    ioattn_options_default(&opt);
    opt.num_threads = 1;
  }
  ioattn_tensor make(float* data, int64_t s, int64_t h) const {
    return {data, IOATTN_F32, B, s, h, D, s * h * D, h * D, D};
  }
  ioattn_status call() { return ioattn_forward(&tq, &tk, &tv, &to, lse.data(), &opt); }
  void snapshot() {}  // outputs start as sentinels
  bool untouched() const { return all_sentinel(out) && all_sentinel(lse); }
};

// Fixture: call() makes the request, untouched() says outputs (and any cache) kept their bytes;
// snapshot() records what untouched() compares against.
template <class Fixture>
void expect_rejected(Fixture& f, ioattn_status want, const std::string& needle) {
  f.snapshot();
  const ioattn_status got = f.call();
  INFO("message: " << ioattn_last_error());
  CHECK(got == want);
  CHECK(std::string(ioattn_last_error()).find(needle) != std::string::npos);
  CHECK(f.untouched());
}

}  // namespace

TEST_CASE("a valid dense request succeeds and writes every output", "[api]") {
  Dense d;
  REQUIRE(d.call() == IOATTN_OK);
  for (float x : d.out) REQUIRE(x == Approx(1.f));
  for (float x : d.lse) REQUIRE(std::isfinite(x));
}

TEST_CASE("dense rejections name the argument and write nothing", "[api]") {
  struct Case {
    const char* what;
    std::function<void(Dense&)> mutate;
    ioattn_status status;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"null q", [](Dense& d) { d.tq.data = nullptr; }, IOATTN_ERROR_INVALID_ARGUMENT, "q.data"},
      {"bad dtype", [](Dense& d) { d.tk.dtype = 7; }, IOATTN_ERROR_INVALID_ARGUMENT, "k.dtype=7"},
      {"dtype mismatch", [](Dense& d) { d.tv.dtype = IOATTN_F16; }, IOATTN_ERROR_INVALID_ARGUMENT, "v.dtype=f16"},
      {"out dtype mismatch", [](Dense& d) { d.to.dtype = IOATTN_BF16; }, IOATTN_ERROR_INVALID_ARGUMENT, "out.dtype"},
      {"negative batch", [](Dense& d) { d.tq.batch = -1; }, IOATTN_ERROR_INVALID_ARGUMENT, "q.batch=-1"},
      {"zero heads", [](Dense& d) { d.tk.heads = 0; }, IOATTN_ERROR_INVALID_ARGUMENT, "k.heads=0"},
      {"zero head dim", [](Dense& d) { d.tq.head_dim = 0; }, IOATTN_ERROR_INVALID_ARGUMENT, "q.head_dim=0"},
      {"negative stride", [](Dense& d) { d.tv.stride_seq = -8; }, IOATTN_ERROR_INVALID_ARGUMENT, "v.stride_seq=-8"},
      {"head dim mismatch", [](Dense& d) { d.tk.head_dim = 4; }, IOATTN_ERROR_INVALID_ARGUMENT, "k.head_dim=4"},
      {"out head dim != v", [](Dense& d) { d.to.head_dim = 4; }, IOATTN_ERROR_INVALID_ARGUMENT, "out.head_dim=4"},
      {"GQA not divisible",
       [](Dense& d) {
         d.tk.heads = 3;
         d.tv.heads = 3;
       },
       IOATTN_ERROR_INVALID_ARGUMENT, "q.heads=4"},
      {"k/v heads differ", [](Dense& d) { d.tv.heads = 1; }, IOATTN_ERROR_INVALID_ARGUMENT, "v.heads=1"},
      {"k/v seqlen differ", [](Dense& d) { d.tv.seqlen = 4; }, IOATTN_ERROR_INVALID_ARGUMENT, "v.seqlen=4"},
      {"batch mismatch", [](Dense& d) { d.tk.batch = 1; }, IOATTN_ERROR_INVALID_ARGUMENT, "k.batch=1"},
      {"out seqlen", [](Dense& d) { d.to.seqlen = 4; }, IOATTN_ERROR_INVALID_ARGUMENT, "out shape"},
      {"out overlapping strides", [](Dense& d) { d.to.stride_head = 4; }, IOATTN_ERROR_INVALID_ARGUMENT,
       "out.stride_head=4"},
      {"out aliases q", [](Dense& d) { d.to.data = d.q.data(); }, IOATTN_ERROR_INVALID_ARGUMENT, "overlaps input q"},
      {"stride overflow", [](Dense& d) { d.tq.stride_batch = INT64_MAX; }, IOATTN_ERROR_INVALID_ARGUMENT, "overflows"},
      {"causal 2", [](Dense& d) { d.opt.causal = 2; }, IOATTN_ERROR_INVALID_ARGUMENT, "opt.causal=2"},
      {"window -2", [](Dense& d) { d.opt.window_left = -2; }, IOATTN_ERROR_INVALID_ARGUMENT, "opt.window_left=-2"},
      {"window right -5", [](Dense& d) { d.opt.window_right = -5; }, IOATTN_ERROR_INVALID_ARGUMENT,
       "opt.window_right=-5"},
      {"NaN scale", [](Dense& d) { d.opt.scale = NAN; }, IOATTN_ERROR_INVALID_ARGUMENT, "opt.scale"},
      {"infinite scale", [](Dense& d) { d.opt.scale = INFINITY; }, IOATTN_ERROR_INVALID_ARGUMENT, "opt.scale"},
      {"negative softcap", [](Dense& d) { d.opt.softcap = -1.f; }, IOATTN_ERROR_INVALID_ARGUMENT, "opt.softcap"},
      {"bad backend", [](Dense& d) { d.opt.backend = 9; }, IOATTN_ERROR_INVALID_ARGUMENT, "opt.backend=9"},
      {"negative threads", [](Dense& d) { d.opt.num_threads = -3; }, IOATTN_ERROR_INVALID_ARGUMENT,
       "opt.num_threads=-3"},
      {"huge head dim on CPU",
       [](Dense& d) {
         static std::vector<float> wide(1024, 0.f);
         d.tq.data = d.tk.data = wide.data();
         d.tq.head_dim = d.tk.head_dim = 1024;
         d.tq.stride_seq = d.tq.stride_batch = d.tk.stride_seq = d.tk.stride_batch = 0;
         d.tq.stride_head = d.tk.stride_head = 0;
       },
       IOATTN_ERROR_UNSUPPORTED, "head_dim=1024"},
  };
  for (const Case& c : cases) {
    SECTION(c.what) {
      Dense d;
      c.mutate(d);
      expect_rejected(d, c.status, c.needle);
    }
  }
}

TEST_CASE("null pointers to the request itself are rejected", "[api]") {
  Dense d;
  CHECK(ioattn_forward(nullptr, &d.tk, &d.tv, &d.to, nullptr, &d.opt) == IOATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ioattn_last_error()).find("q: null") != std::string::npos);
  CHECK(ioattn_forward(&d.tq, &d.tk, &d.tv, &d.to, nullptr, nullptr) == IOATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ioattn_last_error()).find("opt") != std::string::npos);
  CHECK(d.untouched());
}

TEST_CASE("lse overlapping out is rejected", "[api]") {
  Dense d;
  const ioattn_status s = ioattn_forward(&d.tq, &d.tk, &d.tv, &d.to, d.out.data() + 3, &d.opt);
  CHECK(s == IOATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(ioattn_last_error()).find("lse") != std::string::npos);
  CHECK(d.untouched());
}

TEST_CASE("CUDA backend is unsupported, not a silent fallback, when no device is usable", "[api]") {
  if (ioattn_backend_available(IOATTN_BACKEND_CUDA)) return;
  Dense d;
  d.opt.backend = IOATTN_BACKEND_CUDA;
  expect_rejected(d, IOATTN_ERROR_UNSUPPORTED, "CUDA");
}

TEST_CASE("empty problems succeed and write nothing", "[api]") {
  Dense d;
  d.tq.batch = d.tk.batch = d.tv.batch = d.to.batch = 0;
  CHECK(d.call() == IOATTN_OK);
  CHECK(d.untouched());
  Dense e;
  e.tq.seqlen = e.to.seqlen = 0;
  CHECK(e.call() == IOATTN_OK);
  CHECK(e.untouched());
}

TEST_CASE("Sk == 0: every row is empty: out 0, lse -inf", "[api]") {
  Dense d;
  d.tk.seqlen = d.tv.seqlen = 0;
  d.tk.data = d.tv.data = nullptr;
  REQUIRE(d.call() == IOATTN_OK);
  for (float x : d.out) CHECK(x == 0.f);
  for (float x : d.lse) CHECK(x == -INFINITY);
}

TEST_CASE("status strings and version", "[api]") {
  CHECK(std::string(ioattn_status_string(IOATTN_OK)) == "ok");
  CHECK(std::string(ioattn_status_string(IOATTN_ERROR_UNSUPPORTED)) == "unsupported");
  CHECK(std::string(ioattn_version()).size() >= 5);
  ioattn_options o;
  std::memset(&o, 0x5a, sizeof(o));
  ioattn_options_default(&o);
  CHECK(o.scale == 0.f);
  CHECK(o.causal == 0);
  CHECK(o.window_left == -1);
  CHECK(o.window_right == -1);
  CHECK(o.softcap == 0.f);
  CHECK(o.backend == IOATTN_BACKEND_CPU);
  CHECK(o.num_threads == 0);
  CHECK(o.cuda_stream == nullptr);
}

namespace {

struct Varlen {
  int64_t H = 2, D = 4, total_q = 6, total_k = 9;
  std::vector<float> q, k, v, out, lse;
  std::vector<int32_t> cu_q{0, 2, 2, 6}, cu_k{0, 3, 5, 9};
  ioattn_tensor tq{}, tk{}, tv{}, to{};
  ioattn_options opt{};
  Varlen() {
    q.assign(size_t(total_q * H * D), 0.1f);
    k.assign(size_t(total_k * H * D), 0.2f);
    v.assign(size_t(total_k * H * D), 2.f);
    out.assign(q.size(), kSentinel);
    lse.assign(size_t(H * total_q), kSentinel);
    tq = {q.data(), IOATTN_F32, 1, total_q, H, D, total_q * H * D, H * D, D};
    tk = {k.data(), IOATTN_F32, 1, total_k, H, D, total_k * H * D, H * D, D};
    tv = {v.data(), IOATTN_F32, 1, total_k, H, D, total_k * H * D, H * D, D};
    to = {out.data(), IOATTN_F32, 1, total_q, H, D, total_q * H * D, H * D, D};
    ioattn_options_default(&opt);
  }
  ioattn_status call(int32_t batch = 3) {
    return ioattn_forward_varlen(&tq, &tk, &tv, cu_q.data(), cu_k.data(), batch, &to, lse.data(), &opt);
  }
  bool untouched() const { return all_sentinel(out) && all_sentinel(lse); }
};

}  // namespace

TEST_CASE("varlen rejections", "[api][varlen]") {
  SECTION("decreasing cu_seqlens_q") {
    Varlen d;
    d.cu_q = {0, 3, 2, 6};
    CHECK(d.call() == IOATTN_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(ioattn_last_error()).find("cu_seqlens_q[2]=2") != std::string::npos);
    CHECK(d.untouched());
  }
  SECTION("cu_seqlens_k beyond the packed length") {
    Varlen d;
    d.cu_k = {0, 3, 5, 10};
    CHECK(d.call() == IOATTN_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(ioattn_last_error()).find("cu_seqlens_k[3]=10") != std::string::npos);
    CHECK(d.untouched());
  }
  SECTION("negative batch") {
    Varlen d;
    CHECK(d.call(-1) == IOATTN_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(ioattn_last_error()).find("batch=-1") != std::string::npos);
  }
  SECTION("packed tensors must have batch 1") {
    Varlen d;
    d.tq.batch = 2;
    CHECK(d.call() == IOATTN_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(ioattn_last_error()).find("q.batch=2") != std::string::npos);
    CHECK(d.untouched());
  }
  SECTION("null cu_seqlens") {
    Varlen d;
    CHECK(ioattn_forward_varlen(&d.tq, &d.tk, &d.tv, nullptr, d.cu_k.data(), 3, &d.to, nullptr, &d.opt) ==
          IOATTN_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(ioattn_last_error()).find("cu_seqlens_q") != std::string::npos);
    CHECK(d.untouched());
  }
  SECTION("a valid request succeeds; the empty sequence writes nothing it does not own") {
    Varlen d;
    REQUIRE(d.call() == IOATTN_OK);
    for (float x : d.out) CHECK(x == Approx(2.f));
  }
}

namespace {

// A contiguous f16-free cache (f32) of capacity 6 for 2 sequences, 1 kv head, D 4; or a paged one.
struct Cache {
  int64_t B = 2, Hq = 2, Hkv = 1, D = 4, Smax = 6, Snew = 1;
  std::vector<float> q, kc, vc, kn, vn, out, lse;
  std::vector<int32_t> seqlens{3, 0};
  std::vector<int32_t> table;
  ioattn_kvcache cache{};
  ioattn_tensor tq{}, tkn{}, tvn{}, to{};
  ioattn_options opt{};
  Cache() {
    q.assign(size_t(B * Hq * D), 0.3f);
    kc.assign(size_t(B * Smax * Hkv * D), 0.7f);
    vc.assign(kc.size(), 5.f);
    kn.assign(size_t(B * Snew * Hkv * D), 0.1f);
    vn.assign(kn.size(), 5.f);
    out.assign(q.size(), kSentinel);
    lse.assign(size_t(B * Hq), kSentinel);
    tq = {q.data(), IOATTN_F32, B, 1, Hq, D, Hq * D, Hq * D, D};
    to = {out.data(), IOATTN_F32, B, 1, Hq, D, Hq * D, Hq * D, D};
    tkn = {kn.data(), IOATTN_F32, B, Snew, Hkv, D, Snew * Hkv * D, Hkv * D, D};
    tvn = {vn.data(), IOATTN_F32, B, Snew, Hkv, D, Snew * Hkv * D, Hkv * D, D};
    cache.k = {kc.data(), IOATTN_F32, B, Smax, Hkv, D, Smax * Hkv * D, Hkv * D, D};
    cache.v = {vc.data(), IOATTN_F32, B, Smax, Hkv, D, Smax * Hkv * D, Hkv * D, D};
    cache.seqlens = seqlens.data();
    ioattn_options_default(&opt);
  }
  // Reinterpret the same storage as 6 pages of 2 rows.
  void make_paged() {
    cache.k = {kc.data(), IOATTN_F32, 6, 2, Hkv, D, 2 * Hkv * D, Hkv * D, D};
    cache.v = {vc.data(), IOATTN_F32, 6, 2, Hkv, D, 2 * Hkv * D, Hkv * D, D};
    table = {4, 1, 0, 5, 2, 3};
    cache.block_table = table.data();
    cache.max_pages_per_seq = 3;
  }
  ioattn_status call() { return ioattn_forward_kvcache(&tq, &cache, &tkn, &tvn, &to, lse.data(), &opt); }
  std::vector<float> kc0, vc0;
  void snapshot() {
    kc0 = kc;
    vc0 = vc;
  }
  bool untouched() const { return all_sentinel(out) && kc == kc0 && vc == vc0; }
};

}  // namespace

TEST_CASE("KV-cache rejections leave the cache and outputs untouched", "[api][kvcache]") {
  SECTION("append beyond capacity") {
    Cache c;
    c.seqlens[0] = 6;
    expect_rejected(c, IOATTN_ERROR_INVALID_ARGUMENT, "cache.seqlens[0]=6");
  }
  SECTION("negative cached length") {
    Cache c;
    c.seqlens[1] = -1;
    expect_rejected(c, IOATTN_ERROR_INVALID_ARGUMENT, "cache.seqlens[1]=-1");
  }
  SECTION("null seqlens") {
    Cache c;
    c.cache.seqlens = nullptr;
    expect_rejected(c, IOATTN_ERROR_INVALID_ARGUMENT, "cache.seqlens");
  }
  SECTION("only k_new given") {
    Cache c;
    c.snapshot();
    CHECK(ioattn_forward_kvcache(&c.tq, &c.cache, &c.tkn, nullptr, &c.to, nullptr, &c.opt) ==
          IOATTN_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(ioattn_last_error()).find("v_new") != std::string::npos);
    CHECK(c.untouched());
  }
  SECTION("k_new heads differ from the cache") {
    Cache c;
    c.tkn.heads = 2;
    c.tkn.stride_batch = 2 * c.D;
    expect_rejected(c, IOATTN_ERROR_INVALID_ARGUMENT, "k_new.heads=2");
  }
  SECTION("a half cache under a bf16 q is rejected (only f32 activations may differ)") {
    Cache c;
    c.cache.k.dtype = c.cache.v.dtype = IOATTN_F16;
    c.tq.dtype = c.to.dtype = c.tkn.dtype = c.tvn.dtype = IOATTN_BF16;
    expect_rejected(c, IOATTN_ERROR_INVALID_ARGUMENT, "cache.k.dtype=f16");
  }
  SECTION("page id outside the pool") {
    Cache c;
    c.make_paged();
    c.table[1] = 6;
    expect_rejected(c, IOATTN_ERROR_INVALID_ARGUMENT, "cache.block_table[0][1]=6");
  }
  SECTION("more pages needed than the table holds") {
    Cache c;
    c.make_paged();
    c.cache.max_pages_per_seq = 1;
    expect_rejected(c, IOATTN_ERROR_INVALID_ARGUMENT, "max_pages_per_seq=1");
  }
  SECTION("two sequences appending into one slot") {
    Cache c;
    c.make_paged();
    c.seqlens = {0, 0};
    c.table = {2, 1, 0, 2, 4, 3};
    expect_rejected(c, IOATTN_ERROR_INVALID_ARGUMENT, "same page slot");
  }
  SECTION("a valid paged append then attend succeeds") {
    Cache c;
    c.make_paged();
    REQUIRE(c.call() == IOATTN_OK);
    for (float x : c.out) CHECK(x == Approx(5.f));
    // Sequence 1 had 0 cached tokens: its new token went to row 0 of page table[3] = 5.
    CHECK(c.kc[size_t(5 * 2 * c.D)] == Approx(0.1f));
  }
}
