// Bit-level fingerprint of the library's outputs over the C ABI: forward, varlen and KV-cache
// calls (contiguous and paged, with appends) on shapes that reach every CPU kernel mode, printed
// as one hash per output. A refactor that claims identical behaviour builds this against the
// library before and after and diffs the two runs (scripts/fingerprint.sh); it needs nothing but
// the public header, so it builds against any commit.
#include <ioattn/ioattn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

uint64_t g_state = 0;

uint64_t fnv1a(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Every case draws its inputs from a seed of its name, so thread counts see the same inputs.
void seed(const char* name) { g_state = fnv1a(name, std::strlen(name)); }

float next_uniform() {  // [-2, 2)
  g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
  return float((g_state >> 40) * (4.0 / double(1ull << 24))) - 2.0f;
}

uint16_t to_half(float f) {
  _Float16 h = _Float16(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

uint16_t to_bf16(float f) {  // truncation: any fixed rule makes valid inputs
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return uint16_t(bits >> 16);
}

struct Buffer {
  std::vector<unsigned char> bytes;
  int32_t dtype = IOATTN_F32;
  void* data() { return bytes.data(); }
};

Buffer random_buffer(int64_t elements, int32_t dtype) {
  Buffer b;
  b.dtype = dtype;
  b.bytes.resize(size_t(elements) * (dtype == IOATTN_F32 ? 4 : 2));
  for (int64_t i = 0; i < elements; ++i) {
    const float x = next_uniform();
    if (dtype == IOATTN_F32) {
      std::memcpy(&b.bytes[size_t(i) * 4], &x, 4);
    } else {
      const uint16_t h = dtype == IOATTN_F16 ? to_half(x) : to_bf16(x);
      std::memcpy(&b.bytes[size_t(i) * 2], &h, 2);
    }
  }
  return b;
}

ioattn_tensor dense(Buffer& b, int64_t batch, int64_t seq, int64_t heads, int64_t dim) {
  return ioattn_tensor{b.data(), b.dtype, batch, seq, heads, dim, seq * heads * dim, heads * dim, dim};
}

void report(const std::string& name, ioattn_status st, const std::vector<std::pair<const char*, Buffer*>>& outs,
            const std::vector<float>& lse) {
  std::printf("%-34s status=%d", name.c_str(), int(st));
  for (const auto& [label, buf] : outs)
    std::printf(" %s=%016llx", label, (unsigned long long)fnv1a(buf->data(), buf->bytes.size()));
  if (!lse.empty()) std::printf(" lse=%016llx", (unsigned long long)fnv1a(lse.data(), lse.size() * 4));
  std::printf("\n");
}

struct Dense {
  const char* name;
  int32_t dtype;
  int64_t batch, sq, sk, hq, hkv, d, dv;
  int causal, wl, wr;
  float softcap;
};

void run_dense(const Dense& c, int threads) {
  seed(c.name);
  Buffer q = random_buffer(c.batch * c.sq * c.hq * c.d, c.dtype);
  Buffer k = random_buffer(c.batch * c.sk * c.hkv * c.d, c.dtype);
  Buffer v = random_buffer(c.batch * c.sk * c.hkv * c.dv, c.dtype);
  Buffer o = random_buffer(c.batch * c.sq * c.hq * c.dv, c.dtype);
  std::vector<float> lse(size_t(c.batch * c.hq * c.sq));
  ioattn_tensor tq = dense(q, c.batch, c.sq, c.hq, c.d), tk = dense(k, c.batch, c.sk, c.hkv, c.d);
  ioattn_tensor tv = dense(v, c.batch, c.sk, c.hkv, c.dv), to = dense(o, c.batch, c.sq, c.hq, c.dv);
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.causal = c.causal;
  opt.window_left = c.wl;
  opt.window_right = c.wr;
  opt.softcap = c.softcap;
  opt.num_threads = threads;
  const ioattn_status st = ioattn_forward(&tq, &tk, &tv, &to, lse.data(), &opt);
  report(std::string(c.name) + " t" + std::to_string(threads), st, {{"out", &o}}, lse);
}

void run_varlen(int threads) {
  seed("varlen");
  const std::vector<int32_t> cu_q = {0, 17, 17, 211, 212}, cu_k = {0, 40, 57, 301, 1301};
  const int64_t hq = 6, hkv = 2, d = 72, tq_rows = cu_q.back(), tk_rows = cu_k.back();
  Buffer q = random_buffer(tq_rows * hq * d, IOATTN_F32), k = random_buffer(tk_rows * hkv * d, IOATTN_F32);
  Buffer v = random_buffer(tk_rows * hkv * d, IOATTN_F32), o = random_buffer(tq_rows * hq * d, IOATTN_F32);
  std::vector<float> lse(size_t(hq * tq_rows));
  ioattn_tensor a = dense(q, 1, tq_rows, hq, d), b = dense(k, 1, tk_rows, hkv, d), c = dense(v, 1, tk_rows, hkv, d);
  ioattn_tensor out = dense(o, 1, tq_rows, hq, d);
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.causal = 1;
  opt.num_threads = threads;
  const ioattn_status st = ioattn_forward_varlen(&a, &b, &c, cu_q.data(), cu_k.data(), 4, &out, lse.data(), &opt);
  report("varlen f32 causal t" + std::to_string(threads), st, {{"out", &o}}, lse);
}

struct Cache {
  const char* name;
  int32_t cache_dtype;
  int64_t batch, sq, snew, hq, hkv, d;
  int64_t page;  // 0: contiguous
  int64_t max_len;
  int causal;
};

void run_cache(const Cache& c, int threads) {
  seed(c.name);
  std::vector<int32_t> seqlens;
  for (int64_t b = 0; b < c.batch; ++b) seqlens.push_back(int32_t((c.max_len - c.snew) - 97 * b));
  const int64_t pages_per_seq = c.page ? (c.max_len + c.page - 1) / c.page : 0;
  const int64_t num_pages = c.page ? c.batch * pages_per_seq + 3 : 0;
  std::vector<int32_t> table;
  for (int64_t i = 0; i < c.batch * pages_per_seq; ++i) table.push_back(int32_t((i * 7 + 3) % num_pages));
  Buffer q = random_buffer(c.batch * c.sq * c.hq * c.d, IOATTN_F32);
  const int64_t cache_rows = c.page ? num_pages * c.page : c.batch * c.max_len;
  Buffer kc = random_buffer(cache_rows * c.hkv * c.d, c.cache_dtype);
  Buffer vc = random_buffer(cache_rows * c.hkv * c.d, c.cache_dtype);
  Buffer kn = random_buffer(c.batch * c.snew * c.hkv * c.d, IOATTN_F32);
  Buffer vn = random_buffer(c.batch * c.snew * c.hkv * c.d, IOATTN_F32);
  Buffer o = random_buffer(c.batch * c.sq * c.hq * c.d, IOATTN_F32);
  std::vector<float> lse(size_t(c.batch * c.hq * c.sq));
  ioattn_kvcache cache{};
  if (c.page) {
    cache.k = dense(kc, num_pages, c.page, c.hkv, c.d);
    cache.v = dense(vc, num_pages, c.page, c.hkv, c.d);
    cache.block_table = table.data();
    cache.max_pages_per_seq = int32_t(pages_per_seq);
  } else {
    cache.k = dense(kc, c.batch, c.max_len, c.hkv, c.d);
    cache.v = dense(vc, c.batch, c.max_len, c.hkv, c.d);
  }
  cache.seqlens = seqlens.data();
  ioattn_tensor tq = dense(q, c.batch, c.sq, c.hq, c.d), to = dense(o, c.batch, c.sq, c.hq, c.d);
  ioattn_tensor tkn = dense(kn, c.batch, c.snew, c.hkv, c.d), tvn = dense(vn, c.batch, c.snew, c.hkv, c.d);
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.causal = c.causal;
  opt.num_threads = threads;
  const ioattn_status st =
      ioattn_forward_kvcache(&tq, &cache, c.snew ? &tkn : nullptr, c.snew ? &tvn : nullptr, &to, lse.data(), &opt);
  report(std::string(c.name) + " t" + std::to_string(threads), st, {{"out", &o}, {"k", &kc}, {"v", &vc}}, lse);
}

}  // namespace

int main() {
  const Dense dense_cases[] = {
      {"prefill f32 gqa causal", IOATTN_F32, 2, 333, 333, 8, 2, 80, 80, 1, -1, -1, 0.f},
      {"prefill f16 window softcap", IOATTN_F16, 1, 1000, 1000, 4, 4, 128, 128, 0, 100, 20, 30.f},
      {"prefill bf16 d64 sq<sk", IOATTN_BF16, 1, 37, 1500, 8, 4, 64, 64, 1, -1, -1, 0.f},
      {"prefill f32 d64 dv96", IOATTN_F32, 1, 300, 700, 4, 1, 64, 96, 0, -1, -1, 0.f},
      {"prefill f32 d128 long", IOATTN_F32, 1, 1024, 1024, 16, 16, 128, 128, 1, -1, -1, 0.f},
      {"decode f32 mqa", IOATTN_F32, 3, 1, 5000, 16, 1, 128, 128, 0, -1, -1, 0.f},
      {"decode f16 g1 split", IOATTN_F16, 1, 1, 20000, 8, 8, 128, 128, 0, -1, -1, 0.f},
      {"small d3", IOATTN_F32, 2, 5, 9, 3, 3, 3, 5, 1, -1, -1, 0.f},
  };
  const Cache cache_cases[] = {
      {"kvcache bf16 contiguous decode", IOATTN_BF16, 3, 1, 1, 32, 8, 128, 0, 6000, 1},
      {"kvcache f16 paged16 decode", IOATTN_F16, 2, 1, 1, 8, 8, 128, 16, 3000, 1},
      {"kvcache f32 paged64 chunk", IOATTN_F32, 2, 7, 7, 12, 4, 64, 64, 900, 1},
      {"kvcache f16 contiguous no append", IOATTN_F16, 4, 2, 0, 32, 8, 128, 0, 40000, 0},
  };
  for (int threads : {1, 2, 3}) {
    for (const Dense& c : dense_cases) run_dense(c, threads);
    run_varlen(threads);
    for (const Cache& c : cache_cases) run_cache(c, threads);
  }
  return 0;
}
