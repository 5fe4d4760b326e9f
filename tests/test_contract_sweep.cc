// An outsider's acceptance sweep of docs/api.md, the inference entry points and the CLI's bench
// included: only the public headers, its own fp64 oracle written from the contract's text (so a
// semantic slip shared by the kernels and common/reference.cc would still show), its own f16/bf16
// rounding, its own .npy reader and writer. It covers what the other test files do not: the GQA
// head mapping, bottom-right windows intersected with causal, negative scale,
// round-to-nearest-even ties, packed and padded layouts, NULL data on empty problems, key splits
// with whole splits masked, NaN confinement across masks and dtypes, random requests, unowned
// varlen rows, non-power-of-two page sizes, head-major and shared prefix pages, block-table
// entries past a sequence's pages, half caches under half q, the C++ wrapper, and the CLI's exit 3
// path, empty arrays, bench dtypes and peak memory.
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ioattn/ioattn.h"
#include "ioattn/ioattn.hpp"
#include "tests/catch.h"
#include "tests/contract_cli.h"

namespace {

using ioattn::contract::f16_bits;
using ioattn::contract::f16_value;

constexpr double kEps32 = 0x1p-23, kEps16 = 0x1p-10, kEpsBf16 = 0x1p-7;
constexpr size_t kGuard = 64;
constexpr unsigned char kGuardByte = 0x5C;

double dtype_eps(int32_t t) { return t == IOATTN_F32 ? kEps32 : t == IOATTN_F16 ? kEps16 : kEpsBf16; }
size_t dtype_size(int32_t t) { return t == IOATTN_F32 ? 4 : 2; }

uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (std::isnan(x)) return uint16_t((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float bf16_value(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
// The value a float becomes in a storage dtype (round to nearest even).
float rounded(int32_t t, float x) {
  if (t == IOATTN_F16) return f16_value(f16_bits(x));
  if (t == IOATTN_BF16) return bf16_value(bf16_bits(x));
  return x;
}

float uniform(std::mt19937& rng) { return float(double(rng()) / 2147483648.0 - 1.0); }

// A strided (B, S, H, D) array in a storage dtype, framed by guard bytes; every element starts as
// NaN, logical or not, so an output element the kernel fails to write, or a padding element it
// reads, shows up.
class Arr {
 public:
  Arr() = default;
  Arr(int32_t dtype, int64_t b, int64_t s, int64_t h, int64_t d) : Arr(dtype, b, s, h, d, s * h * d, h * d, d) {}
  Arr(int32_t dtype, int64_t b, int64_t s, int64_t h, int64_t d, int64_t sb, int64_t ss, int64_t sh)
      : dtype_(dtype), b_(b), s_(s), h_(h), d_(d), sb_(sb), ss_(ss), sh_(sh) {
    span_ = (b == 0 || s == 0 || h == 0 || d == 0) ? 0 : (b - 1) * sb + (s - 1) * ss + (h - 1) * sh + d;
    mem_.assign(2 * kGuard + size_t(span_) * dtype_size(dtype), kGuardByte);
    for (int64_t e = 0; e < span_; ++e) put(e, std::numeric_limits<float>::quiet_NaN());
  }
  int32_t dtype() const { return dtype_; }
  int64_t batch() const { return b_; }
  int64_t seqlen() const { return s_; }
  int64_t heads() const { return h_; }
  int64_t dim() const { return d_; }
  int64_t span() const { return span_; }
  void* data() { return mem_.data() + kGuard; }
  int64_t offset(int64_t b, int64_t s, int64_t h) const { return b * sb_ + s * ss_ + h * sh_; }
  float at(int64_t e) const {
    const unsigned char* p = mem_.data() + kGuard + size_t(e) * dtype_size(dtype_);
    if (dtype_ == IOATTN_F32) {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    uint16_t b;
    std::memcpy(&b, p, 2);
    return dtype_ == IOATTN_F16 ? f16_value(b) : bf16_value(b);
  }
  void put(int64_t e, float x) {
    unsigned char* p = mem_.data() + kGuard + size_t(e) * dtype_size(dtype_);
    if (dtype_ == IOATTN_F32) {
      std::memcpy(p, &x, 4);
      return;
    }
    const uint16_t b = dtype_ == IOATTN_F16 ? f16_bits(x) : bf16_bits(x);
    std::memcpy(p, &b, 2);
  }
  float get(int64_t b, int64_t s, int64_t h, int64_t d) const { return at(offset(b, s, h) + d); }
  void set(int64_t b, int64_t s, int64_t h, int64_t d, float x) { put(offset(b, s, h) + d, x); }
  void randomize(std::mt19937& rng, float amplitude = 1.f) {
    for (int64_t b = 0; b < b_; ++b)
      for (int64_t s = 0; s < s_; ++s)
        for (int64_t h = 0; h < h_; ++h)
          for (int64_t d = 0; d < d_; ++d) set(b, s, h, d, amplitude * uniform(rng));
  }
  ioattn_tensor t() { return {data(), dtype_, b_, s_, h_, d_, sb_, ss_, sh_}; }
  const std::vector<unsigned char>& bytes() const { return mem_; }
  std::vector<unsigned char>& bytes() { return mem_; }

  // True when every byte outside the elements owned(b, s, h) says are written still equals
  // `before` (guards, padding, gaps and rows nobody owns).
  bool untouched_outside(const std::vector<unsigned char>& before,
                         const std::function<bool(int64_t, int64_t, int64_t)>& owned) const {
    std::vector<char> mine(mem_.size(), 0);
    for (int64_t b = 0; b < b_; ++b)
      for (int64_t s = 0; s < s_; ++s)
        for (int64_t h = 0; h < h_; ++h) {
          if (!owned(b, s, h)) continue;
          const size_t first = kGuard + size_t(offset(b, s, h)) * dtype_size(dtype_);
          std::fill(mine.begin() + long(first), mine.begin() + long(first + size_t(d_) * dtype_size(dtype_)), 1);
        }
    for (size_t i = 0; i < mem_.size(); ++i)
      if (!mine[i] && mem_[i] != before[i]) return false;
    return true;
  }

 private:
  int32_t dtype_ = IOATTN_F32;
  int64_t b_ = 0, s_ = 0, h_ = 0, d_ = 0, sb_ = 0, ss_ = 0, sh_ = 0, span_ = 0;
  std::vector<unsigned char> mem_;
};

// Masking and score options as docs/api.md states them.
struct Rule {
  int causal = 0;
  int64_t left = -1, right = -1;
  float softcap = 0.f, scale = 0.f;
};
Rule rule_of(const ioattn_options& o) { return {o.causal, o.window_left, o.window_right, o.softcap, o.scale}; }

bool visible(const Rule& r, int64_t i, int64_t j, int64_t sq, int64_t sk) {
  const int64_t off = sk - sq;
  if (r.causal && j > i + off) return false;
  if (r.left >= 0 && j < i + off - r.left) return false;
  if (r.right >= 0 && j > i + off + r.right) return false;
  return true;
}

// One sequence in T: q [Sq][Hq][D], k [Sk][Hkv][D], v [Sk][Hkv][Dv] -> out [Sq][Hq][Dv], lse [Hq][Sq].
// The scale is the float the caller passes (or float 1/sqrt(D)): the kernel cannot use another.
template <class T>
void oracle(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, int64_t sq,
            int64_t sk, int64_t hq, int64_t hkv, int64_t d, int64_t dv, const Rule& r, std::vector<T>* out,
            std::vector<T>* lse, std::vector<T>* score_terms = nullptr) {
  const float scale = r.scale > 0 ? r.scale : float(1.0 / std::sqrt(double(d)));
  out->assign(size_t(sq * hq * dv), T(0));
  lse->assign(size_t(hq * sq), T(0));
  if (score_terms) score_terms->assign(size_t(hq * sq), T(0));
  std::vector<T> s(static_cast<size_t>(sk));
  for (int64_t h = 0; h < hq; ++h) {
    const int64_t hk = h / (hq / hkv);
    for (int64_t i = 0; i < sq; ++i) {
      T m = -std::numeric_limits<T>::infinity();
      bool any = false, nan = false;
      for (int64_t j = 0; j < sk; ++j) {
        if (!visible(r, i, j, sq, sk)) continue;
        T dot = 0, terms = 0;
        for (int64_t c = 0; c < d; ++c) {
          const T term = T(q[size_t((i * hq + h) * d + c)]) * T(k[size_t((j * hkv + hk) * d + c)]);
          dot += term;
          terms += std::fabs(term);
        }
        if (score_terms) {
          T& mag = (*score_terms)[size_t(h * sq + i)];
          mag = std::max(mag, T(scale) * terms);
        }
        T x = T(scale) * dot;
        if (r.softcap > 0) x = T(r.softcap) * std::tanh(x / T(r.softcap));
        s[size_t(j)] = x;
        any = true;
        if (std::isnan(x)) nan = true;
        if (x > m) m = x;
      }
      T* o = out->data() + (i * hq + h) * dv;
      if (!any) {
        (*lse)[size_t(h * sq + i)] = -std::numeric_limits<T>::infinity();
        continue;
      }
      T sum = 0;
      for (int64_t j = 0; j < sk; ++j) {
        if (!visible(r, i, j, sq, sk)) continue;
        const T p = nan ? std::numeric_limits<T>::quiet_NaN() : std::exp(s[size_t(j)] - m);
        sum += p;
        for (int64_t c = 0; c < dv; ++c) o[c] += p * T(v[size_t((j * hkv + hk) * dv + c)]);
      }
      for (int64_t c = 0; c < dv; ++c) o[c] /= sum;
      (*lse)[size_t(h * sq + i)] = m + std::log(sum);
    }
  }
}

// The tolerance rule of docs/testing.md, accumulated over a whole call: max|out - ref| <= 2 max|naive - ref| + 2 ulp
// of the largest |ref| in the storage dtype; LSE separately in fp32; NaN exactly where the oracle
// has NaN, -inf exactly where it has -inf.
struct Tally {
  double eps = kEps32;
  double err = 0, naive = 0, mag = 0, lerr = 0, lnaive = 0, lmag = 0;
  int64_t mismatches = 0, compared = 0;

  void out(float got, double ref, float naive_rounded) {
    ++compared;
    if (std::isnan(ref) || std::isnan(got)) {
      if (std::isnan(ref) != std::isnan(got)) ++mismatches;
      return;
    }
    err = std::max(err, std::fabs(double(got) - ref));
    naive = std::max(naive, std::fabs(double(naive_rounded) - ref));
    mag = std::max(mag, std::fabs(ref));
  }
  // score_terms: the row's largest scale * sum_d |q_d k_d| over its visible keys. The LSE's
  // rounding noise is that of its scores, dot products whose noise scales with the magnitude of
  // their terms, not with the result: cancellation can make a score (with one key, the LSE
  // itself) far smaller than its terms, and 2 ulp of |lse| then sits below one rounding of a term.
  void lse(float got, double ref, float naive32, double score_terms) {
    if (std::isnan(ref) || std::isnan(got) || std::isinf(ref) || std::isinf(got)) {
      if (!(std::isnan(ref) && std::isnan(got)) && double(got) != ref) ++mismatches;
      return;
    }
    lerr = std::max(lerr, std::fabs(double(got) - ref));
    lnaive = std::max(lnaive, std::fabs(double(naive32) - ref));
    lmag = std::max({lmag, std::fabs(ref), score_terms});
  }
  bool ok() const {
    return mismatches == 0 && err <= 2 * naive + 2 * eps * mag && lerr <= 2 * lnaive + 2 * kEps32 * lmag;
  }
  std::string report() const {
    std::ostringstream os;
    os << "out err " << err << " vs 2*naive " << 2 * naive << " + floor " << 2 * eps * mag << "; lse err " << lerr
       << " vs 2*naive " << 2 * lnaive << " + floor " << 2 * kEps32 * lmag << "; non-finite mismatches " << mismatches
       << " of " << compared;
    return os.str();
  }
};

// Rows [s0, s0 + n) of batch b of an array, as a dense [n][H][D] float vector.
std::vector<float> gather(const Arr& a, int64_t b, int64_t s0, int64_t n) {
  std::vector<float> x(size_t(n * a.heads() * a.dim()));
  for (int64_t s = 0; s < n; ++s)
    for (int64_t h = 0; h < a.heads(); ++h)
      for (int64_t c = 0; c < a.dim(); ++c) x[size_t((s * a.heads() + h) * a.dim() + c)] = a.get(b, s0 + s, h, c);
  return x;
}

// Compares one sequence's out rows [q0, q0 + sq) of batch ob and lse entries lse_at(h, i).
void tally_sequence(Tally& t, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                    int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, int64_t dv, const Rule& r,
                    const Arr& out, int64_t ob, int64_t q0, const std::function<float(int64_t, int64_t)>& lse_at) {
  std::vector<double> o64, l64, terms;
  std::vector<float> o32, l32;
  oracle<double>(q, k, v, sq, sk, hq, hkv, d, dv, r, &o64, &l64, &terms);
  oracle<float>(q, k, v, sq, sk, hq, hkv, d, dv, r, &o32, &l32);
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t c = 0; c < dv; ++c) {
        const size_t at = size_t((i * hq + h) * dv + c);
        t.out(out.get(ob, q0 + i, h, c), o64[at], rounded(out.dtype(), o32[at]));
      }
      if (lse_at) t.lse(lse_at(h, i), l64[size_t(h * sq + i)], l32[size_t(h * sq + i)], terms[size_t(h * sq + i)]);
    }
}

ioattn_options defaults() {
  ioattn_options o;
  ioattn_options_default(&o);
  return o;
}

std::string last_error() { return ioattn_last_error(); }

// Runs ioattn_forward on tq, tk, tv (views of the values q, k, v hold) and checks out and lse
// against the oracle, that nothing outside out's logical elements changed, and that lse holds
// exactly B * Hq * Sq values.
void check_call(const Arr& q, const Arr& k, const Arr& v, Arr& out, const ioattn_tensor& tq, const ioattn_tensor& tk,
                const ioattn_tensor& tv, const ioattn_options& opt, bool with_lse = true) {
  const int64_t B = q.batch(), Sq = q.seqlen(), Hq = q.heads();
  std::vector<float> lse(size_t(B * Hq * Sq) + 8, std::numeric_limits<float>::quiet_NaN());
  const std::vector<unsigned char> before = out.bytes();
  ioattn_tensor to = out.t();
  const ioattn_status s = ioattn_forward(&tq, &tk, &tv, &to, with_lse ? lse.data() : nullptr, &opt);
  INFO("status " << s << ": " << last_error());
  REQUIRE(s == IOATTN_OK);
  Tally t;
  t.eps = dtype_eps(out.dtype());
  for (int64_t b = 0; b < B; ++b) {
    std::function<float(int64_t, int64_t)> lse_at;
    if (with_lse) lse_at = [&](int64_t h, int64_t i) { return lse[size_t((b * Hq + h) * Sq + i)]; };
    tally_sequence(t, gather(q, b, 0, Sq), gather(k, b, 0, k.seqlen()), gather(v, b, 0, v.seqlen()), Sq, k.seqlen(), Hq,
                   k.heads(), q.dim(), v.dim(), rule_of(opt), out, b, 0, lse_at);
  }
  INFO(t.report());
  CHECK(t.ok());
  CHECK(t.compared == B * Sq * Hq * out.dim());
  CHECK(out.untouched_outside(before, [](int64_t, int64_t, int64_t) { return true; }));
  for (size_t i = size_t(B * Hq * Sq); i < lse.size(); ++i) CHECK(std::isnan(lse[i]));
}

void check_dense(Arr& q, Arr& k, Arr& v, Arr& out, const ioattn_options& opt, bool with_lse = true) {
  check_call(q, k, v, out, q.t(), k.t(), v.t(), opt, with_lse);
}

struct DenseShape {
  int64_t B = 1, Sq = 1, Sk = 1, Hq = 1, Hkv = 1, D = 16, Dv = -1;
  int32_t dtype = IOATTN_F32;
};

void random_dense(const DenseShape& s, const ioattn_options& opt, uint32_t seed, float amplitude = 1.f) {
  std::mt19937 rng(seed);
  const int64_t dv = s.Dv < 0 ? s.D : s.Dv;
  Arr q(s.dtype, s.B, s.Sq, s.Hq, s.D), k(s.dtype, s.B, s.Sk, s.Hkv, s.D), v(s.dtype, s.B, s.Sk, s.Hkv, dv),
      out(s.dtype, s.B, s.Sq, s.Hq, dv);
  q.randomize(rng, amplitude);
  k.randomize(rng, amplitude);
  v.randomize(rng);
  check_dense(q, k, v, out, opt);
}

const char* dtype_label(int32_t t) { return t == IOATTN_F32 ? "f32" : t == IOATTN_F16 ? "f16" : "bf16"; }

}  // namespace

// ---- Dense semantics ---------------------------------------------------------------------

TEST_CASE("sweep: windows intersected with causal, bottom-right aligned, Sq != Sk both ways", "[sweep][dense]") {
  struct Mask {
    int causal;
    int32_t left, right;
  };
  // Causal with a right window wider than 0 must still be causal (R = 0 wins the intersection);
  // L = 0 leaves only the diagonal; R alone (no causal) reaches past it.
  const Mask masks[] = {{0, 0, 0}, {0, 3, 5}, {1, -1, 4}, {1, 2, 7}, {0, -1, 0}, {0, 0, -1}, {0, 6, -1}, {1, 0, -1}};
  const int64_t lengths[][2] = {{1, 339}, {239, 1}, {97, 17}, {17, 97}, {113, 127}, {33, 33}};
  int index = 0;
  for (const Mask& m : masks)
    for (const auto& len : lengths)
      for (int32_t dtype : {IOATTN_F32, IOATTN_BF16}) {
        ++index;
        if (index % 2 == 0 && dtype == IOATTN_BF16) continue;
        DenseShape s;
        s.B = 2;
        s.Sq = len[0];
        s.Sk = len[1];
        s.Hq = 4;
        s.Hkv = 2;
        s.D = index % 3 == 0 ? 7 : 24;
        s.dtype = dtype;
        ioattn_options o = defaults();
        o.causal = m.causal;
        o.window_left = m.left;
        o.window_right = m.right;
        o.num_threads = 2;
        DYNAMIC_SECTION("causal " << m.causal << " window " << m.left << "," << m.right << " Sq " << s.Sq << " Sk "
                                  << s.Sk << " " << dtype_label(dtype)) {
          random_dense(s, o, uint32_t(index));
        }
      }
}

TEST_CASE("sweep: causal equals window (-1, 0), and R = 0 without causal equals causal bitwise", "[sweep][dense]") {
  std::mt19937 rng(5);
  Arr q(IOATTN_F32, 1, 45, 2, 32), k(IOATTN_F32, 1, 70, 2, 32), v(IOATTN_F32, 1, 70, 2, 32);
  q.randomize(rng);
  k.randomize(rng);
  v.randomize(rng);
  Arr a(IOATTN_F32, 1, 45, 2, 32), b(IOATTN_F32, 1, 45, 2, 32);
  ioattn_tensor tq = q.t(), tk = k.t(), tv = v.t(), ta = a.t(), tb = b.t();
  ioattn_options causal = defaults(), window = defaults();
  causal.causal = 1;
  window.window_right = 0;
  std::vector<float> la(90), lb(90);
  REQUIRE(ioattn_forward(&tq, &tk, &tv, &ta, la.data(), &causal) == IOATTN_OK);
  REQUIRE(ioattn_forward(&tq, &tk, &tv, &tb, lb.data(), &window) == IOATTN_OK);
  // The same mask: the contract defines them as one rule, so the same tiles and the same bits.
  CHECK(a.bytes() == b.bytes());
  CHECK(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)) == 0);
}

TEST_CASE("sweep: a negative scale means 1/sqrt(D), like 0", "[sweep][dense]") {
  std::mt19937 rng(6);
  for (int32_t dtype : {IOATTN_F32, IOATTN_F16}) {
    Arr q(dtype, 1, 20, 2, 40), k(dtype, 1, 30, 2, 40), v(dtype, 1, 30, 2, 40);
    q.randomize(rng, 2.f);
    k.randomize(rng, 2.f);
    v.randomize(rng);
    Arr a(dtype, 1, 20, 2, 40), b(dtype, 1, 20, 2, 40);
    ioattn_tensor tq = q.t(), tk = k.t(), tv = v.t(), ta = a.t(), tb = b.t();
    ioattn_options zero = defaults(), negative = defaults();
    negative.scale = -0.75f;
    REQUIRE(ioattn_forward(&tq, &tk, &tv, &ta, nullptr, &zero) == IOATTN_OK);
    REQUIRE(ioattn_forward(&tq, &tk, &tv, &tb, nullptr, &negative) == IOATTN_OK);
    CHECK(a.bytes() == b.bytes());
    // And both match the oracle's 1/sqrt(D).
    Arr c(dtype, 1, 20, 2, 40);
    check_dense(q, k, v, c, negative);
  }
}

TEST_CASE("sweep: softcap applies after an explicit scale, saturating, in every dtype", "[sweep][dense]") {
  int index = 0;
  for (int32_t dtype : {IOATTN_F32, IOATTN_F16, IOATTN_BF16})
    for (float scale : {0.05f, 3.f}) {
      ++index;
      DenseShape s;
      s.Sq = 29;
      s.Sk = 41;
      s.Hq = 2;
      s.D = 32;
      s.Dv = 20;
      s.dtype = dtype;
      ioattn_options o = defaults();
      o.scale = scale;
      o.softcap = 1.5f;
      o.causal = index % 2;
      DYNAMIC_SECTION(dtype_label(dtype) << " scale " << scale) { random_dense(s, o, uint32_t(40 + index), 3.f); }
    }
}

TEST_CASE("sweep: query head h reads kv head h / (Hq / Hkv), not h % Hkv", "[sweep][dense][gqa]") {
  // V is constant per kv head (10, 20, ...), so each output head must equal exactly its kv head's
  // constant, whatever the scores: the softmax weights sum to one.
  for (const auto& heads : {std::pair<int64_t, int64_t>{6, 2}, {8, 2}, {6, 3}, {5, 1}, {4, 4}}) {
    const int64_t hq = heads.first, hkv = heads.second;
    std::mt19937 rng(uint32_t(hq * 10 + hkv));
    Arr q(IOATTN_F32, 2, 9, hq, 8), k(IOATTN_F32, 2, 13, hkv, 8), v(IOATTN_F32, 2, 13, hkv, 8);
    q.randomize(rng);
    k.randomize(rng);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t j = 0; j < 13; ++j)
        for (int64_t h = 0; h < hkv; ++h)
          for (int64_t c = 0; c < 8; ++c) v.set(b, j, h, c, float(10 * (h + 1)));
    Arr out(IOATTN_F32, 2, 9, hq, 8);
    ioattn_tensor tq = q.t(), tk = k.t(), tv = v.t(), to = out.t();
    const ioattn_options o = defaults();
    REQUIRE(ioattn_forward(&tq, &tk, &tv, &to, nullptr, &o) == IOATTN_OK);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t i = 0; i < 9; ++i)
        for (int64_t h = 0; h < hq; ++h) {
          INFO("Hq " << hq << " Hkv " << hkv << " head " << h);
          CHECK(out.get(b, i, h, 0) == Approx(10.0 * double(h / (hq / hkv) + 1)).epsilon(1e-5));
        }
  }
}

TEST_CASE("sweep: output is rounded to nearest even (ties included) in f16 and bf16", "[sweep][dense]") {
  // q = 0: two keys with equal scores each weigh exactly 1/2, so out = (v0 + v1) / 2 exactly in
  // fp32. v0, v1 one ulp apart put out on a tie; with v0's last bit even the tie rounds down to
  // v0, with it odd it rounds up to v1. Truncation fails the second, round-half-up the first.
  for (int32_t dtype : {IOATTN_F16, IOATTN_BF16}) {
    const float ulp = float(dtype_eps(dtype));
    const float even = 1.f, odd = 1.f + ulp;  // mantissa ...0 and ...1
    Arr q(dtype, 1, 1, 1, 4), k(dtype, 1, 2, 1, 4), v(dtype, 1, 2, 1, 4), out(dtype, 1, 1, 1, 4);
    for (int64_t c = 0; c < 4; ++c) {
      q.set(0, 0, 0, c, 0.f);
      k.set(0, 0, 0, c, 0.5f);
      k.set(0, 1, 0, c, -0.25f);
    }
    // Columns 0-1: v0 even (tie -> v0); columns 2-3: v0 odd (tie -> v1 = v0 + ulp, even).
    const float v0[4] = {even, -even, odd, -odd};
    for (int64_t c = 0; c < 4; ++c) {
      v.set(0, 0, 0, c, v0[c]);
      v.set(0, 1, 0, c, v0[c] + std::copysign(ulp, v0[c]));
    }
    ioattn_tensor tq = q.t(), tk = k.t(), tv = v.t(), to = out.t();
    const ioattn_options o = defaults();
    REQUIRE(ioattn_forward(&tq, &tk, &tv, &to, nullptr, &o) == IOATTN_OK);
    INFO(dtype_label(dtype));
    CHECK(out.get(0, 0, 0, 0) == even);
    CHECK(out.get(0, 0, 0, 1) == -even);
    CHECK(out.get(0, 0, 0, 2) == odd + ulp);
    CHECK(out.get(0, 0, 0, 3) == -(odd + ulp));
  }
}

TEST_CASE("sweep: packed QKV, padded out and stride-0 keys read and write only their elements",
          "[sweep][dense][strides]") {
  std::mt19937 rng(8);
  const int64_t B = 2, S = 19, H = 4, D = 24;
  SECTION("q, k, v interleaved in one (B, S, 3, H, D) buffer; out with gaps between rows and heads") {
    // One allocation viewed three times through offsets: stride_seq = 3 * H * D.
    Arr qkv(IOATTN_BF16, B, S, 3 * H, D);
    qkv.randomize(rng);
    const int64_t sb = S * 3 * H * D, ss = 3 * H * D;
    auto view = [&](int64_t part) {
      ioattn_tensor t = qkv.t();
      t.data = static_cast<char*>(qkv.data()) + size_t(part * H * D) * 2;
      t.heads = H;
      t.stride_batch = sb;
      t.stride_seq = ss;
      t.stride_head = D;
      return t;
    };
    Arr q(IOATTN_BF16, B, S, H, D), k(IOATTN_BF16, B, S, H, D), v(IOATTN_BF16, B, S, H, D);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t c = 0; c < D; ++c) {
            q.set(b, s, h, c, qkv.get(b, s, h, c));
            k.set(b, s, h, c, qkv.get(b, s, H + h, c));
            v.set(b, s, h, c, qkv.get(b, s, 2 * H + h, c));
          }
    // out (B, S, H, D) in a BHSD order with padding: head stride S * (D + 5) + 3.
    const int64_t sh = S * (D + 5) + 3;
    Arr out(IOATTN_BF16, B, S, H, D, H * sh + 11, D + 5, sh);
    ioattn_options o = defaults();
    o.causal = 1;
    const std::vector<unsigned char> qkv_before = qkv.bytes();
    check_call(q, k, v, out, view(0), view(1), view(2), o);
    CHECK(qkv.bytes() == qkv_before);
  }
  SECTION("stride-0 keys and values along the sequence: every key the same row") {
    Arr q(IOATTN_F32, B, S, H, D), k(IOATTN_F32, B, 37, 2, D, 2 * D, 0, D), v(IOATTN_F32, B, 37, 2, D, 2 * D, 0, D);
    q.randomize(rng);
    k.randomize(rng);
    v.randomize(rng);
    Arr out(IOATTN_F32, B, S, H, D);
    ioattn_options o = defaults();
    o.window_left = 4;
    check_dense(q, k, v, out, o);
    // Equal keys: uniform weights over equal values, so out is that value row.
    CHECK(out.get(1, 7, 3, 5) == Approx(v.get(1, 0, 1, 5)).epsilon(1e-6));
  }
  SECTION("q broadcast over batch and heads (stride 0), out contiguous") {
    Arr q(IOATTN_F16, B, S, H, D, 0, D, 0), k(IOATTN_F16, B, 23, 1, D), v(IOATTN_F16, B, 23, 1, 40);
    q.randomize(rng);
    k.randomize(rng);
    v.randomize(rng);
    Arr out(IOATTN_F16, B, S, H, 40);
    ioattn_options o = defaults();
    o.window_left = 2;
    o.window_right = 1;
    check_dense(q, k, v, out, o);
  }
}

TEST_CASE("sweep: rows with no visible key are exactly 0 with lse -inf, in every dtype", "[sweep][dense][empty]") {
  // Sq = 10, Sk = 3, L = R = 0: off = -7, row i sees only key i - 7: rows 0..6 see nothing.
  for (int32_t dtype : {IOATTN_F32, IOATTN_F16, IOATTN_BF16}) {
    std::mt19937 rng(9);
    Arr q(dtype, 1, 10, 2, 16), k(dtype, 1, 3, 1, 16), v(dtype, 1, 3, 1, 16), out(dtype, 1, 10, 2, 16);
    q.randomize(rng);
    k.randomize(rng);
    v.randomize(rng);
    ioattn_options o = defaults();
    o.window_left = 0;
    o.window_right = 0;
    o.softcap = 2.f;
    std::vector<float> lse(20, 0.5f);
    ioattn_tensor tq = q.t(), tk = k.t(), tv = v.t(), to = out.t();
    REQUIRE(ioattn_forward(&tq, &tk, &tv, &to, lse.data(), &o) == IOATTN_OK);
    INFO(dtype_label(dtype));
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 10; ++i) {
        if (i < 7) {
          CHECK(lse[size_t(h * 10 + i)] == -INFINITY);
          for (int64_t c = 0; c < 16; ++c) CHECK(out.get(0, i, h, c) == 0.f);
        } else {
          // One visible key: its weight is 1, so out is that key's value row.
          CHECK(std::isfinite(lse[size_t(h * 10 + i)]));
          for (int64_t c = 0; c < 16; ++c) CHECK(out.get(0, i, h, c) == Approx(v.get(0, i - 7, 0, c)).margin(1e-6));
        }
      }
    Arr again(dtype, 1, 10, 2, 16);
    check_dense(q, k, v, again, o);
  }
}

TEST_CASE("sweep: Sk = 0 with causal, softcap, NULL lse and NULL k/v data", "[sweep][dense][empty]") {
  Arr q(IOATTN_BF16, 2, 5, 2, 8), out(IOATTN_BF16, 2, 5, 2, 8);
  std::mt19937 rng(10);
  q.randomize(rng);
  ioattn_tensor tq = q.t(), to = out.t();
  const ioattn_tensor tk{nullptr, IOATTN_BF16, 2, 0, 1, 8, 0, 8, 8}, tv{nullptr, IOATTN_BF16, 2, 0, 1, 8, 0, 8, 8};
  ioattn_options o = defaults();
  o.causal = 1;
  o.softcap = 4.f;
  REQUIRE(ioattn_forward(&tq, &tk, &tv, &to, nullptr, &o) == IOATTN_OK);
  for (int64_t e = 0; e < out.span(); ++e) CHECK(out.at(e) == 0.f);
}

TEST_CASE("sweep: B == 0 or Sq == 0 succeed with NULL data and write nothing", "[sweep][dense][empty]") {
  std::vector<float> lse(4, 7.f);
  float kv[64] = {};
  const ioattn_options o = defaults();
  {
    const ioattn_tensor q{nullptr, IOATTN_F32, 0, 5, 2, 8, 80, 16, 8}, k{nullptr, IOATTN_F32, 0, 5, 2, 8, 80, 16, 8};
    const ioattn_tensor out{nullptr, IOATTN_F32, 0, 5, 2, 8, 80, 16, 8};
    INFO(last_error());
    CHECK(ioattn_forward(&q, &k, &k, &out, lse.data(), &o) == IOATTN_OK);
  }
  {
    const ioattn_tensor q{nullptr, IOATTN_F16, 1, 0, 2, 8, 0, 16, 8}, k{kv, IOATTN_F16, 1, 2, 2, 8, 32, 16, 8};
    const ioattn_tensor out{nullptr, IOATTN_F16, 1, 0, 2, 8, 0, 16, 8};
    INFO(last_error());
    CHECK(ioattn_forward(&q, &k, &k, &out, lse.data(), &o) == IOATTN_OK);
  }
  for (float x : lse) CHECK(x == 7.f);
}

TEST_CASE("sweep: head dims 1 and 512 run on the CPU; 513 for D or Dv is UNSUPPORTED", "[sweep][dense]") {
  DenseShape s;
  s.Sq = 6;
  s.Sk = 9;
  s.D = 512;
  random_dense(s, defaults(), 11);
  s.D = 1;
  s.Dv = 512;
  random_dense(s, defaults(), 12);
  s.D = 512;
  s.Dv = 1;
  random_dense(s, defaults(), 13);

  for (const auto& dims : {std::pair<int64_t, int64_t>{513, 16}, {16, 513}}) {
    Arr q(IOATTN_F32, 1, 2, 1, dims.first), k(IOATTN_F32, 1, 2, 1, dims.first), v(IOATTN_F32, 1, 2, 1, dims.second),
        out(IOATTN_F32, 1, 2, 1, dims.second);
    const std::vector<unsigned char> before = out.bytes();
    std::vector<float> lse(2, 3.f);
    ioattn_tensor tq = q.t(), tk = k.t(), tv = v.t(), to = out.t();
    const ioattn_options o = defaults();
    INFO("D " << dims.first << " Dv " << dims.second << ": " << last_error());
    CHECK(ioattn_forward(&tq, &tk, &tv, &to, lse.data(), &o) == IOATTN_ERROR_UNSUPPORTED);
    CHECK(last_error().find("513") != std::string::npos);
    CHECK(out.bytes() == before);
    CHECK(lse[0] == 3.f);
  }
}

TEST_CASE("sweep: split keys with whole splits masked out, dense and decode shapes", "[sweep][dense][split]") {
  // One sequence and one kv head cannot fill two cores, so the key axis splits; windows and
  // Sq > Sk leave some splits with no visible key for a row while others have some, and the
  // merge must neither produce NaN nor lose the visible part.
  struct Mask {
    int causal;
    int32_t left, right;
  };
  const Mask masks[] = {{0, 3, -1}, {1, 0, -1}, {0, 0, 0}, {1, -1, -1}, {0, -1, -1}, {0, 40, 2}};
  int index = 0;
  for (int64_t sk : {700, 2500, 4099})
    for (int64_t sq : {1, 3, 9})
      for (const Mask& m : masks) {
        ++index;
        DenseShape s;
        s.Sq = sq;
        s.Sk = sk;
        s.Hq = index % 2 ? 4 : 1;
        s.Hkv = 1;
        s.D = index % 3 == 0 ? 40 : 64;
        s.dtype = index % 3 == 1 ? IOATTN_BF16 : IOATTN_F32;
        ioattn_options o = defaults();
        o.causal = m.causal;
        o.window_left = m.left;
        o.window_right = m.right;
        o.num_threads = index % 2 ? 1 : 2;
        DYNAMIC_SECTION("Sk " << sk << " Sq " << sq << " causal " << m.causal << " window " << m.left << ","
                              << m.right) {
          random_dense(s, o, uint32_t(500 + index));
        }
      }
}

TEST_CASE("sweep: NaN in one K and one V row stays in the rows that see it, every mask and dtype",
          "[sweep][dense][nan]") {
  struct Mask {
    int causal;
    int32_t left, right;
  };
  const Mask masks[] = {{1, -1, -1}, {0, 4, -1}, {0, 2, 3}, {1, 5, -1}, {0, -1, 0}};
  int index = 0;
  for (int32_t dtype : {IOATTN_F32, IOATTN_F16, IOATTN_BF16})
    for (const Mask& m : masks)
      for (const auto& len : {std::pair<int64_t, int64_t>{1, 600}, {37, 53}, {60, 20}, {130, 130}}) {
        ++index;
        std::mt19937 rng(uint32_t(700 + index));
        const int64_t sq = len.first, sk = len.second, d = index % 2 ? 7 : 48;
        Arr q(dtype, 1, sq, 4, d), k(dtype, 1, sk, 2, d), v(dtype, 1, sk, 2, d), out(dtype, 1, sq, 4, d);
        q.randomize(rng);
        k.randomize(rng);
        v.randomize(rng);
        k.set(0, int64_t(rng() % uint32_t(sk)), 1, d - 1, NAN);
        v.set(0, int64_t(rng() % uint32_t(sk)), 0, 0, NAN);
        ioattn_options o = defaults();
        o.causal = m.causal;
        o.window_left = m.left;
        o.window_right = m.right;
        DYNAMIC_SECTION(dtype_label(dtype) << " Sq " << sq << " Sk " << sk << " causal " << m.causal << " window "
                                           << m.left << "," << m.right) {
          check_dense(q, k, v, out, o);
        }
      }
}

TEST_CASE("sweep: q = k = v = 133120 in bf16 through dense, split and decode shapes", "[sweep][dense][adversarial]") {
  for (const auto& shape : {std::pair<int64_t, int64_t>{1, 3000}, {4, 4}, {2, 333}}) {
    for (int64_t hq : {1, 8}) {
      const int64_t sq = shape.first, sk = shape.second;
      Arr q(IOATTN_BF16, 1, sq, hq, 64), k(IOATTN_BF16, 1, sk, 1, 64), v(IOATTN_BF16, 1, sk, 1, 64),
          out(IOATTN_BF16, 1, sq, hq, 64);
      for (Arr* a : {&q, &k, &v})
        for (int64_t s = 0; s < a->seqlen(); ++s)
          for (int64_t h = 0; h < a->heads(); ++h)
            for (int64_t c = 0; c < 64; ++c) a->set(0, s, h, c, 133120.f);
      ioattn_options o = defaults();
      o.causal = 1;
      DYNAMIC_SECTION("Sq " << sq << " Sk " << sk << " Hq " << hq) {
        check_dense(q, k, v, out, o);
        for (int64_t i = 0; i < sq; ++i) CHECK(out.get(0, i, hq - 1, 63) == 133120.f);
      }
    }
  }
}

namespace {

// A random layout for a (B, S, H, D) array: token-major or head-major, padded rows, gaps, or a
// stride-0 broadcast axis (inputs only).
Arr random_layout(std::mt19937& rng, int32_t dtype, int64_t b, int64_t s, int64_t h, int64_t d, bool input) {
  const int64_t pad = int64_t(rng() % 3) * int64_t(rng() % 5);
  const int64_t row = d + pad;
  int64_t sb, ss, sh;
  if (rng() % 2) {  // (B, S, H, D)
    sh = row;
    ss = h * row + int64_t(rng() % 3);
    sb = s * ss + int64_t(rng() % 4);
  } else {  // (B, H, S, D)
    ss = row;
    sh = s * row + int64_t(rng() % 3);
    sb = h * sh + int64_t(rng() % 4);
  }
  if (input) {
    const uint32_t which = rng() % 8;
    if (which == 0) sb = 0;
    if (which == 1) sh = 0;
    if (which == 2) ss = 0;
  }
  return Arr(dtype, b, s, h, d, sb, ss, sh);
}

void random_request(uint32_t seed) {
  std::mt19937 rng(seed);
  const int32_t dtype = int32_t(rng() % 3);
  const int64_t B = 1 + rng() % 3, hkv = 1 + rng() % 3, group = int64_t(1) << (rng() % 3);
  const int64_t hq = hkv * group;
  const int64_t lens[] = {0, 1, 2, 3, 17, 31, 64, 97, 130};
  const int64_t sq = rng() % 9 == 0 ? 0 : lens[1 + rng() % 8], sk = lens[rng() % 9];
  const int64_t dims[] = {1, 3, 7, 16, 33, 59, 64, 80, 111, 128};
  const int64_t d = dims[rng() % 10], dv = rng() % 3 ? d : dims[rng() % 10];
  Arr q = random_layout(rng, dtype, B, sq, hq, d, true), k = random_layout(rng, dtype, B, sk, hkv, d, true),
      v = random_layout(rng, dtype, B, sk, hkv, dv, true), out = random_layout(rng, dtype, B, sq, hq, dv, false);
  const float amp = rng() % 4 == 0 ? 6.f : 1.f;
  q.randomize(rng, amp);
  k.randomize(rng, amp);
  v.randomize(rng);
  ioattn_options o = defaults();
  o.causal = int32_t(rng() % 3 == 0);
  o.window_left = rng() % 3 == 0 ? int32_t(rng() % 40) : -1;
  o.window_right = rng() % 4 == 0 ? int32_t(rng() % 20) : -1;
  o.softcap = rng() % 4 == 0 ? float(1 + rng() % 20) : 0.f;
  o.scale = rng() % 4 == 0 ? float(rng() % 100) / 50.f - 0.5f : 0.f;
  o.num_threads = int32_t(rng() % 4);
  INFO("seed " << seed << ": " << dtype_label(dtype) << " B " << B << " Hq " << hq << " Hkv " << hkv << " Sq " << sq
               << " Sk " << sk << " D " << d << " Dv " << dv << " causal " << o.causal << " window " << o.window_left
               << "," << o.window_right << " softcap " << o.softcap << " scale " << o.scale);
  check_dense(q, k, v, out, o, rng() % 4 != 0);
}

}  // namespace

// IOATTN_SWEEP_FIRST / IOATTN_SWEEP_SEEDS widen the hunt. Beyond the default seeds a few f32
// requests trip the rule without a kernel fault (seeds 1230, 1957, 2312, 4070, 5043 of 1..8000):
// a stride-0 q or a tiny Sq/Sk leaves a handful of distinct rows, so max|naive - ref| is a lucky
// small sample; with the naive dot summed in reverse order 1230 and 1957 pass.
TEST_CASE("sweep: random requests: shapes, layouts, masks, dtypes against the contract's oracle",
          "[sweep][dense][random]") {
  const char* env = std::getenv("IOATTN_SWEEP_SEEDS");
  const uint32_t count = env ? uint32_t(std::strtoul(env, nullptr, 10)) : 150;
  const char* first_env = std::getenv("IOATTN_SWEEP_FIRST");
  const uint32_t first = first_env ? uint32_t(std::strtoul(first_env, nullptr, 10)) : 1;
  for (uint32_t seed = first; seed < first + count; ++seed) random_request(seed);
}

TEST_CASE("sweep: data pointers one element past a vector boundary (no alignment is promised)",
          "[sweep][dense][strides]") {
  // Each tensor lives in a (B, S, H, D + 1) buffer and is passed from element 1 of every row, so
  // every row starts 2 or 4 bytes past a 64-byte line; column 0 of out must stay untouched.
  for (int32_t dtype : {IOATTN_F32, IOATTN_BF16})
    for (int causal : {0, 1}) {
      const int64_t B = 2, sq = 37, sk = 70, hq = 4, hkv = 2, d = 64;
      std::mt19937 rng(uint32_t(40 + causal));
      Arr qs(dtype, B, sq, hq, d + 1), ks(dtype, B, sk, hkv, d + 1), vs(dtype, B, sk, hkv, d + 1),
          os(dtype, B, sq, hq, d + 1);
      qs.randomize(rng);
      ks.randomize(rng);
      vs.randomize(rng);
      auto shifted = [dtype, d](Arr& a) {
        ioattn_tensor t = a.t();
        t.data = static_cast<char*>(t.data) + dtype_size(dtype);
        t.head_dim = d;
        return t;
      };
      auto values = [d](const Arr& a) {
        Arr v(a.dtype(), a.batch(), a.seqlen(), a.heads(), d);
        for (int64_t b = 0; b < a.batch(); ++b)
          for (int64_t s = 0; s < a.seqlen(); ++s)
            for (int64_t h = 0; h < a.heads(); ++h)
              for (int64_t c = 0; c < d; ++c) v.set(b, s, h, c, a.get(b, s, h, c + 1));
        return v;
      };
      ioattn_options o = defaults();
      o.causal = causal;
      std::vector<float> lse(size_t(B * hq * sq));
      const ioattn_tensor tq = shifted(qs), tk = shifted(ks), tv = shifted(vs), to = shifted(os);
      INFO(dtype_label(dtype) << " causal " << causal << ": " << last_error());
      REQUIRE(ioattn_forward(&tq, &tk, &tv, &to, lse.data(), &o) == IOATTN_OK);
      const Arr q = values(qs), k = values(ks), v = values(vs), out = values(os);
      Tally t;
      t.eps = dtype_eps(dtype);
      for (int64_t b = 0; b < B; ++b)
        tally_sequence(t, gather(q, b, 0, sq), gather(k, b, 0, sk), gather(v, b, 0, sk), sq, sk, hq, hkv, d, d,
                       rule_of(o), out, b, 0, [&](int64_t h, int64_t i) { return lse[size_t((b * hq + h) * sq + i)]; });
      INFO(t.report());
      CHECK(t.ok());
      bool column0_untouched = true;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < sq; ++s)
          for (int64_t h = 0; h < hq; ++h) column0_untouched = column0_untouched && std::isnan(os.get(b, s, h, 0));
      CHECK(column0_untouched);
    }
}

// ---- Dense rejections not covered elsewhere ---------------------------------------------

namespace {

struct Request {
  Arr q{IOATTN_F32, 2, 5, 4, 8}, k{IOATTN_F32, 2, 6, 2, 8}, v{IOATTN_F32, 2, 6, 2, 8}, out{IOATTN_F32, 2, 5, 4, 8};
  ioattn_tensor tq, tk, tv, to;
  ioattn_options opt = defaults();
  std::vector<float> lse = std::vector<float>(40, 1.25f);
  float* lse_ptr;
  const ioattn_tensor *pq, *pk, *pv, *po;
  Request() {
    std::mt19937 rng(3);
    q.randomize(rng);
    k.randomize(rng);
    v.randomize(rng);
    tq = q.t();
    tk = k.t();
    tv = v.t();
    to = out.t();
    lse_ptr = lse.data();
    pq = &tq;
    pk = &tk;
    pv = &tv;
    po = &to;
  }
  ioattn_status call() { return ioattn_forward(pq, pk, pv, po, lse_ptr, &opt); }
};

}  // namespace

TEST_CASE("sweep: dense rejections: each names its argument, writes nothing", "[sweep][api]") {
  struct Case {
    const char* what;
    std::function<void(Request&)> mutate;
    ioattn_status want;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"null k tensor", [](Request& r) { r.pk = nullptr; }, IOATTN_ERROR_INVALID_ARGUMENT, "k"},
      {"null v tensor", [](Request& r) { r.pv = nullptr; }, IOATTN_ERROR_INVALID_ARGUMENT, "v"},
      {"null out tensor", [](Request& r) { r.po = nullptr; }, IOATTN_ERROR_INVALID_ARGUMENT, "out"},
      {"null out data", [](Request& r) { r.to.data = nullptr; }, IOATTN_ERROR_INVALID_ARGUMENT, "out.data"},
      {"null k data", [](Request& r) { r.tk.data = nullptr; }, IOATTN_ERROR_INVALID_ARGUMENT, "k.data"},
      {"negative q dtype", [](Request& r) { r.tq.dtype = -1; }, IOATTN_ERROR_INVALID_ARGUMENT, "q.dtype=-1"},
      {"negative seqlen", [](Request& r) { r.tk.seqlen = -2; }, IOATTN_ERROR_INVALID_ARGUMENT, "k.seqlen=-2"},
      {"negative head dim", [](Request& r) { r.tv.head_dim = -8; }, IOATTN_ERROR_INVALID_ARGUMENT, "v.head_dim=-8"},
      {"negative heads", [](Request& r) { r.tq.heads = -4; }, IOATTN_ERROR_INVALID_ARGUMENT, "q.heads=-4"},
      {"negative batch stride", [](Request& r) { r.to.stride_batch = -1; }, IOATTN_ERROR_INVALID_ARGUMENT,
       "out.stride_batch=-1"},
      {"out batch differs", [](Request& r) { r.to.batch = 1; }, IOATTN_ERROR_INVALID_ARGUMENT, "out"},
      {"out heads differ", [](Request& r) { r.to.heads = 2; }, IOATTN_ERROR_INVALID_ARGUMENT, "out.heads=2"},
      {"out broadcast over batch (stride 0)", [](Request& r) { r.to.stride_batch = 0; }, IOATTN_ERROR_INVALID_ARGUMENT,
       "out.stride_batch=0"},
      {"out aliases v", [](Request& r) { r.to.data = r.v.data(); }, IOATTN_ERROR_INVALID_ARGUMENT, "v"},
      {"lse inside k", [](Request& r) { r.lse_ptr = static_cast<float*>(r.k.data()) + 5; },
       IOATTN_ERROR_INVALID_ARGUMENT, "lse"},
      {"NaN softcap", [](Request& r) { r.opt.softcap = NAN; }, IOATTN_ERROR_INVALID_ARGUMENT, "opt.softcap"},
      {"infinite softcap", [](Request& r) { r.opt.softcap = INFINITY; }, IOATTN_ERROR_INVALID_ARGUMENT, "opt.softcap"},
      {"-inf scale", [](Request& r) { r.opt.scale = -INFINITY; }, IOATTN_ERROR_INVALID_ARGUMENT, "opt.scale"},
      {"window INT32_MIN", [](Request& r) { r.opt.window_left = INT32_MIN; }, IOATTN_ERROR_INVALID_ARGUMENT,
       "opt.window_left"},
      {"causal -1", [](Request& r) { r.opt.causal = -1; }, IOATTN_ERROR_INVALID_ARGUMENT, "opt.causal=-1"},
      {"backend -1", [](Request& r) { r.opt.backend = -1; }, IOATTN_ERROR_INVALID_ARGUMENT, "opt.backend=-1"},
      {"q f16 with f16 k/v but f32 out", [](Request& r) { r.tq.dtype = r.tk.dtype = r.tv.dtype = IOATTN_F16; },
       IOATTN_ERROR_INVALID_ARGUMENT, "dtype"},
  };
  for (const Case& c : cases) {
    SECTION(c.what) {
      Request r;
      c.mutate(r);
      const std::vector<unsigned char> before = r.out.bytes(), k_before = r.k.bytes(), v_before = r.v.bytes();
      const ioattn_status got = r.call();
      INFO("message: " << last_error());
      CHECK(got == c.want);
      CHECK(last_error().find(c.needle) != std::string::npos);
      CHECK(r.out.bytes() == before);
      CHECK(r.k.bytes() == k_before);
      CHECK(r.v.bytes() == v_before);
      for (float x : r.lse) CHECK(x == 1.25f);
    }
  }
}

TEST_CASE("sweep: status strings are distinct and never NULL; last_error is per thread", "[sweep][api]") {
  std::vector<std::string> seen;
  for (int s = IOATTN_OK; s <= IOATTN_ERROR_BACKEND; ++s) {
    const char* text = ioattn_status_string(ioattn_status(s));
    REQUIRE(text != nullptr);
    CHECK(std::string(text).size() > 0);
    CHECK(std::find(seen.begin(), seen.end(), text) == seen.end());
    seen.push_back(text);
  }
  CHECK(ioattn_status_string(ioattn_status(99)) != nullptr);
  REQUIRE(ioattn_version() != nullptr);
  CHECK(std::string(ioattn_version()).find_first_of("0123456789") != std::string::npos);

  Request mine;
  mine.opt.causal = 7;
  REQUIRE(mine.call() == IOATTN_ERROR_INVALID_ARGUMENT);
  const std::string my_message = last_error();
  CHECK(my_message.find("opt.causal=7") != std::string::npos);
  std::string their_message;
  std::thread other([&] {
    Request r;
    r.opt.num_threads = -9;
    if (r.call() == IOATTN_ERROR_INVALID_ARGUMENT) their_message = last_error();
  });
  other.join();
  CHECK(their_message.find("opt.num_threads=-9") != std::string::npos);
  CHECK(last_error() == my_message);
}

// ---- Varlen ------------------------------------------------------------------------------

namespace {

struct VarlenSpec {
  std::vector<int32_t> lens_q, lens_k;
  int64_t lead_q = 0, tail_q = 0, lead_k = 0, hq = 4, hkv = 2, d = 24, dv = 24, row_pad = 0;
  int32_t dtype = IOATTN_F32;
};

void run_varlen(const VarlenSpec& s, const ioattn_options& opt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> cu_q{int32_t(s.lead_q)}, cu_k{int32_t(s.lead_k)};
  for (size_t b = 0; b < s.lens_q.size(); ++b) {
    cu_q.push_back(cu_q.back() + s.lens_q[b]);
    cu_k.push_back(cu_k.back() + s.lens_k[b]);
  }
  const int64_t total_q = cu_q.back() + s.tail_q, total_k = cu_k.back();
  // q and out rows padded by row_pad elements after each sequence position.
  const int64_t qs = s.hq * s.d + s.row_pad, os = s.hq * s.dv + s.row_pad;
  Arr q(s.dtype, 1, total_q, s.hq, s.d, total_q * qs, qs, s.d), k(s.dtype, 1, total_k, s.hkv, s.d),
      v(s.dtype, 1, total_k, s.hkv, s.dv), out(s.dtype, 1, total_q, s.hq, s.dv, total_q * os, os, s.dv);
  q.randomize(rng);
  k.randomize(rng);
  v.randomize(rng);
  std::vector<float> lse(size_t(s.hq * total_q), std::numeric_limits<float>::quiet_NaN());
  const std::vector<unsigned char> before = out.bytes();
  ioattn_tensor tq = q.t(), tk = k.t(), tv = v.t(), to = out.t();
  const int32_t batch = int32_t(s.lens_q.size());
  const ioattn_status st = ioattn_forward_varlen(&tq, &tk, &tv, cu_q.data(), cu_k.data(), batch, &to, lse.data(), &opt);
  INFO(last_error());
  REQUIRE(st == IOATTN_OK);
  Tally t;
  t.eps = dtype_eps(s.dtype);
  for (int32_t b = 0; b < batch; ++b) {
    const int64_t q0 = cu_q[size_t(b)], k0 = cu_k[size_t(b)], sq = s.lens_q[size_t(b)], sk = s.lens_k[size_t(b)];
    tally_sequence(t, gather(q, 0, q0, sq), gather(k, 0, k0, sk), gather(v, 0, k0, sk), sq, sk, s.hq, s.hkv, s.d, s.dv,
                   rule_of(opt), out, 0, q0, [&](int64_t h, int64_t i) { return lse[size_t(h * total_q + q0 + i)]; });
  }
  INFO(t.report());
  CHECK(t.ok());
  // Rows before cu_seqlens_q[0] and after cu_seqlens_q[batch] belong to no sequence.
  const int64_t owned_begin = cu_q.front(), owned_end = cu_q.back();
  CHECK(out.untouched_outside(before,
                              [&](int64_t, int64_t row, int64_t) { return row >= owned_begin && row < owned_end; }));
  for (int64_t h = 0; h < s.hq; ++h)
    for (int64_t row = 0; row < total_q; ++row)
      if (row < owned_begin || row >= owned_end) CHECK(std::isnan(lse[size_t(h * total_q + row)]));
}

}  // namespace

TEST_CASE("sweep: varlen per-sequence bottom-right masks, GQA 3, unowned rows untouched", "[sweep][varlen]") {
  int index = 0;
  for (int32_t dtype : {IOATTN_F32, IOATTN_F16, IOATTN_BF16})
    for (int mask = 0; mask < 4; ++mask) {
      ++index;
      VarlenSpec s;
      // Sq > Sk (top rows empty under causal), Sq < Sk, both zero, q zero, k zero, long.
      s.lens_q = {12, 3, 0, 4, 0, 40, 1};
      s.lens_k = {5, 30, 0, 0, 7, 41, 1};
      s.lead_q = index % 2 ? 3 : 0;
      s.tail_q = 2;
      s.lead_k = 4;
      s.hq = 6;
      s.hkv = 2;
      s.d = index % 3 == 0 ? 7 : 32;
      s.dv = index % 2 ? 16 : s.d;
      s.row_pad = index % 2 ? 5 : 0;
      s.dtype = dtype;
      ioattn_options o = defaults();
      o.causal = mask == 1 || mask == 3;
      o.window_left = mask >= 2 ? 3 : -1;
      o.window_right = mask == 2 ? 2 : -1;
      o.softcap = mask == 3 ? 2.f : 0.f;
      o.num_threads = 2;
      DYNAMIC_SECTION(dtype_label(dtype) << " mask " << mask) { run_varlen(s, o, uint32_t(index)); }
    }
}

TEST_CASE("sweep: varlen rejections and batch 0", "[sweep][varlen][api]") {
  Arr q(IOATTN_F32, 1, 6, 4, 8), k(IOATTN_F32, 1, 9, 2, 8), v(IOATTN_F32, 1, 9, 2, 8), out(IOATTN_F32, 1, 6, 4, 8);
  std::mt19937 rng(4);
  q.randomize(rng);
  k.randomize(rng);
  v.randomize(rng);
  std::vector<float> lse(24, 2.5f);
  const std::vector<unsigned char> before = out.bytes();
  const ioattn_options o = defaults();
  auto call = [&](ioattn_tensor tq, ioattn_tensor tk, ioattn_tensor tv, std::vector<int32_t> cq,
                  std::vector<int32_t> ck, int32_t batch) {
    ioattn_tensor to = out.t();
    return ioattn_forward_varlen(&tq, &tk, &tv, cq.empty() ? nullptr : cq.data(), ck.empty() ? nullptr : ck.data(),
                                 batch, &to, lse.data(), &o);
  };
  auto expect = [&](ioattn_status got, ioattn_status want, const char* needle) {
    INFO(last_error());
    CHECK(got == want);
    if (want != IOATTN_OK) CHECK(last_error().find(needle) != std::string::npos);
    CHECK(out.bytes() == before);
    for (float x : lse) CHECK(x == 2.5f);
  };
  const std::vector<int32_t> cq{0, 2, 6}, ck{0, 4, 9};
  expect(call(q.t(), k.t(), v.t(), {-1, 2, 6}, ck, 2), IOATTN_ERROR_INVALID_ARGUMENT, "cu_seqlens_q[0]=-1");
  expect(call(q.t(), k.t(), v.t(), cq, {0, 5, 4}, 2), IOATTN_ERROR_INVALID_ARGUMENT, "cu_seqlens_k[2]=4");
  expect(call(q.t(), k.t(), v.t(), {0, 2, 7}, ck, 2), IOATTN_ERROR_INVALID_ARGUMENT, "cu_seqlens_q[2]=7");
  expect(call(q.t(), k.t(), v.t(), cq, {}, 2), IOATTN_ERROR_INVALID_ARGUMENT, "cu_seqlens_k");
  ioattn_tensor k2 = k.t();
  k2.batch = 2;
  expect(call(q.t(), k2, v.t(), cq, ck, 2), IOATTN_ERROR_INVALID_ARGUMENT, "k.batch=2");
  ioattn_tensor v16 = v.t();
  v16.dtype = IOATTN_F16;
  expect(call(q.t(), k.t(), v16, cq, ck, 2), IOATTN_ERROR_INVALID_ARGUMENT, "dtype");
  ioattn_tensor k3 = k.t(), v3 = v.t();
  k3.heads = v3.heads = 3;
  k3.stride_head = v3.stride_head = 0;
  expect(call(q.t(), k3, v3, cq, ck, 2), IOATTN_ERROR_INVALID_ARGUMENT, "q.heads=4");
  ioattn_tensor v8 = v.t();
  v8.seqlen = 8;
  expect(call(q.t(), k.t(), v8, cq, ck, 2), IOATTN_ERROR_INVALID_ARGUMENT, "v.seqlen=8");
  // No sequences: nothing to read, cu_seqlens may be NULL, nothing written.
  expect(call(q.t(), k.t(), v.t(), {}, {}, 0), IOATTN_OK, "");
}

// ---- KV cache ----------------------------------------------------------------------------

namespace {

struct KvSpec {
  int32_t io = IOATTN_F32, cache = IOATTN_F32;
  int64_t hq = 4, hkv = 2, d = 32, dv = 32, sq = 1, snew = 1;
  int64_t page = 0;         // 0: contiguous
  bool head_major = false;  // pages laid out (page, Hkv, page_size, D)
  std::vector<int32_t> cached;
};

// Where token j of sequence b lives: (cache batch index, row).
struct Slot {
  int64_t index, row;
};

void run_kvcache(const KvSpec& s, const ioattn_options& opt, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t B = int64_t(s.cached.size());
  std::vector<int64_t> total(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) total[size_t(b)] = s.cached[size_t(b)] + s.snew;
  const int64_t longest = *std::max_element(total.begin(), total.end());
  const bool paged = s.page > 0;
  // Block tables one entry longer than any sequence needs; the unused entries hold ids no pool
  // has (-1, a huge one), which the contract never asks the library to read.
  int64_t max_pages = 0, pages = 0;
  std::vector<int32_t> table;
  if (paged) {
    max_pages = (longest + s.page - 1) / s.page + 1;
    pages = B * max_pages + 2;
    std::vector<int32_t> pool(static_cast<size_t>(pages));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    size_t next = 0;
    table.assign(size_t(B * max_pages), 0);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t need = (total[size_t(b)] + s.page - 1) / s.page;
      for (int64_t j = 0; j < max_pages; ++j)
        table[size_t(b * max_pages + j)] = j < need ? pool[next++] : (j % 2 ? -1 : INT32_MAX);
    }
  }
  const int64_t cb = paged ? pages : B, cs = paged ? s.page : longest + 2;
  auto make_cache = [&](int64_t dim) {
    if (s.head_major) return Arr(s.cache, cb, cs, s.hkv, dim, s.hkv * cs * dim, dim, cs * dim);
    return Arr(s.cache, cb, cs, s.hkv, dim);
  };
  Arr kc = make_cache(s.d), vc = make_cache(s.dv);
  auto slot = [&](int64_t b, int64_t j) {
    if (!paged) return Slot{b, j};
    return Slot{table[size_t(b * max_pages + j / s.page)], j % s.page};
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < s.cached[size_t(b)]; ++j) {
      const Slot at = slot(b, j);
      for (int64_t h = 0; h < s.hkv; ++h) {
        for (int64_t c = 0; c < s.d; ++c) kc.set(at.index, at.row, h, c, uniform(rng));
        for (int64_t c = 0; c < s.dv; ++c) vc.set(at.index, at.row, h, c, uniform(rng));
      }
    }
  Arr q(s.io, B, s.sq, s.hq, s.d), out(s.io, B, s.sq, s.hq, s.dv), kn(s.io, B, s.snew, s.hkv, s.d),
      vn(s.io, B, s.snew, s.hkv, s.dv);
  q.randomize(rng);
  kn.randomize(rng);
  vn.randomize(rng);

  // The keys each sequence must attend over, and the cache expected afterwards.
  std::vector<std::vector<float>> keys(static_cast<size_t>(B)), values(static_cast<size_t>(B));
  Arr k_after = kc, v_after = vc;
  for (int64_t b = 0; b < B; ++b) {
    keys[size_t(b)].resize(size_t(total[size_t(b)] * s.hkv * s.d));
    values[size_t(b)].resize(size_t(total[size_t(b)] * s.hkv * s.dv));
    for (int64_t j = 0; j < total[size_t(b)]; ++j) {
      const Slot at = slot(b, j);
      const bool is_new = j >= s.cached[size_t(b)];
      const int64_t r = j - s.cached[size_t(b)];
      for (int64_t h = 0; h < s.hkv; ++h) {
        for (int64_t c = 0; c < s.d; ++c) {
          const float x = is_new ? rounded(s.cache, kn.get(b, r, h, c)) : kc.get(at.index, at.row, h, c);
          keys[size_t(b)][size_t((j * s.hkv + h) * s.d + c)] = x;
          if (is_new) k_after.set(at.index, at.row, h, c, x);
        }
        for (int64_t c = 0; c < s.dv; ++c) {
          const float x = is_new ? rounded(s.cache, vn.get(b, r, h, c)) : vc.get(at.index, at.row, h, c);
          values[size_t(b)][size_t((j * s.hkv + h) * s.dv + c)] = x;
          if (is_new) v_after.set(at.index, at.row, h, c, x);
        }
      }
    }
  }

  const std::vector<int32_t> seqlens_before = s.cached;
  std::vector<int32_t> seqlens = s.cached;
  std::vector<float> lse(size_t(B * s.hq * s.sq), std::numeric_limits<float>::quiet_NaN());
  ioattn_kvcache cache{};
  cache.k = kc.t();
  cache.v = vc.t();
  cache.seqlens = seqlens.data();
  cache.block_table = paged ? table.data() : nullptr;
  cache.max_pages_per_seq = int32_t(max_pages);
  ioattn_tensor tq = q.t(), to = out.t(), tkn = kn.t(), tvn = vn.t();
  const std::vector<unsigned char> out_before = out.bytes();
  const ioattn_status st = ioattn_forward_kvcache(&tq, &cache, s.snew > 0 ? &tkn : nullptr, s.snew > 0 ? &tvn : nullptr,
                                                  &to, lse.data(), &opt);
  INFO(last_error());
  REQUIRE(st == IOATTN_OK);
  CHECK(seqlens == seqlens_before);
  // Exactly the appended rows changed: guard pages, other slots and padding kept their bytes.
  CHECK(kc.bytes() == k_after.bytes());
  CHECK(vc.bytes() == v_after.bytes());
  CHECK(out.untouched_outside(out_before, [](int64_t, int64_t, int64_t) { return true; }));
  Tally t;
  t.eps = dtype_eps(s.io);
  for (int64_t b = 0; b < B; ++b)
    tally_sequence(t, gather(q, b, 0, s.sq), keys[size_t(b)], values[size_t(b)], s.sq, total[size_t(b)], s.hq, s.hkv,
                   s.d, s.dv, rule_of(opt), out, b, 0,
                   [&](int64_t h, int64_t i) { return lse[size_t((b * s.hq + h) * s.sq + i)]; });
  INFO(t.report());
  CHECK(t.ok());
}

}  // namespace

TEST_CASE("sweep: paged KV with page sizes 3, 5 and 7, head-major pages, unused table entries", "[sweep][kvcache]") {
  int index = 0;
  for (int64_t page : {3, 5, 7, 1})
    for (bool head_major : {false, true}) {
      ++index;
      KvSpec s;
      s.page = page;
      s.head_major = head_major;
      s.cached = {0, 1, 23, 40, 6};
      s.sq = index % 3 == 0 ? 5 : 1;
      s.snew = index % 4 == 0 ? 0 : s.sq;
      s.hq = 8;
      s.hkv = 2;
      s.d = index % 2 ? 24 : 7;
      s.dv = index % 3 ? s.d : 12;
      s.cache = index % 2 ? IOATTN_BF16 : IOATTN_F16;
      ioattn_options o = defaults();
      o.causal = 1;
      o.window_left = index % 3 == 1 ? 9 : -1;
      o.softcap = index % 4 == 1 ? 3.f : 0.f;
      o.num_threads = 2;
      DYNAMIC_SECTION("page " << page << (head_major ? " head-major" : "") << " Sq " << s.sq << " Snew " << s.snew) {
        run_kvcache(s, o, uint32_t(70 + index));
      }
    }
}

TEST_CASE("sweep: KV cache in the same half dtype as q, Dv != D, Sq > Sk rows empty", "[sweep][kvcache]") {
  int index = 0;
  for (int32_t dtype : {IOATTN_F16, IOATTN_BF16})
    for (int64_t page : {0, 4}) {
      ++index;
      KvSpec s;
      s.io = s.cache = dtype;
      s.page = page;
      // Sequence 0 holds 0 cached + 2 new keys under 9 queries: with causal, rows 0..6 see none.
      s.cached = {0, 1, 17};
      s.sq = 9;
      s.snew = 2;
      s.hq = 3;
      s.hkv = 1;
      s.d = 40;
      s.dv = 24;
      ioattn_options o = defaults();
      o.causal = 1;
      DYNAMIC_SECTION(dtype_label(dtype) << " page " << page) { run_kvcache(s, o, uint32_t(90 + index)); }
    }
  // Contiguous cache, f32 q over an f16 cache, window reaching right of the diagonal.
  KvSpec s;
  s.cache = IOATTN_F16;
  s.cached = {5, 0};
  s.sq = 4;
  s.snew = 3;
  ioattn_options o = defaults();
  o.window_left = 2;
  o.window_right = 1;
  run_kvcache(s, o, 99);
}

namespace {

struct CacheRequest {
  Arr q{IOATTN_F32, 2, 1, 4, 8}, out{IOATTN_F32, 2, 1, 4, 8}, kc{IOATTN_F32, 2, 6, 2, 8}, vc{IOATTN_F32, 2, 6, 2, 8},
      kn{IOATTN_F32, 2, 1, 2, 8}, vn{IOATTN_F32, 2, 1, 2, 8};
  std::vector<int32_t> seqlens{3, 2}, table;
  ioattn_kvcache cache{};
  ioattn_tensor tq, to, tkn, tvn;
  const ioattn_tensor *pkn, *pvn;
  const ioattn_kvcache* pcache;
  ioattn_options opt = defaults();
  std::vector<float> lse = std::vector<float>(8, 4.5f);
  CacheRequest() {
    std::mt19937 rng(12);
    q.randomize(rng);
    kc.randomize(rng);
    vc.randomize(rng);
    kn.randomize(rng);
    vn.randomize(rng);
    tq = q.t();
    to = out.t();
    tkn = kn.t();
    tvn = vn.t();
    pkn = &tkn;
    pvn = &tvn;
    cache.k = kc.t();
    cache.v = vc.t();
    cache.seqlens = seqlens.data();
    pcache = &cache;
  }
  // The same storage as 6 pages of 2 rows, 3 per sequence.
  void paged() {
    cache.k = {kc.data(), IOATTN_F32, 6, 2, 2, 8, 32, 16, 8};
    cache.v = {vc.data(), IOATTN_F32, 6, 2, 2, 8, 32, 16, 8};
    table = {5, 0, 3, 1, 4, 2};
    cache.block_table = table.data();
    cache.max_pages_per_seq = 3;
  }
  ioattn_status call() { return ioattn_forward_kvcache(&tq, pcache, pkn, pvn, &to, lse.data(), &opt); }
};

}  // namespace

TEST_CASE("sweep: KV-cache rejections: each names its argument; cache, out and lse untouched",
          "[sweep][kvcache][api]") {
  struct Case {
    const char* what;
    std::function<void(CacheRequest&)> mutate;
    ioattn_status want;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"null cache", [](CacheRequest& r) { r.pcache = nullptr; }, IOATTN_ERROR_INVALID_ARGUMENT, "cache"},
      {"only v_new given", [](CacheRequest& r) { r.pkn = nullptr; }, IOATTN_ERROR_INVALID_ARGUMENT, "k_new"},
      {"cache k/v dtypes differ", [](CacheRequest& r) { r.cache.v.dtype = IOATTN_F16; }, IOATTN_ERROR_INVALID_ARGUMENT,
       "cache.v.dtype"},
      {"k_new dtype differs from q", [](CacheRequest& r) { r.tkn.dtype = IOATTN_F16; }, IOATTN_ERROR_INVALID_ARGUMENT,
       "k_new.dtype"},
      {"k_new batch differs", [](CacheRequest& r) { r.tkn.batch = 1; }, IOATTN_ERROR_INVALID_ARGUMENT, "k_new.batch"},
      {"v_new seqlen differs", [](CacheRequest& r) { r.tvn.seqlen = 0; }, IOATTN_ERROR_INVALID_ARGUMENT,
       "v_new.seqlen"},
      {"k_new head dim differs", [](CacheRequest& r) { r.tkn.head_dim = 4; }, IOATTN_ERROR_INVALID_ARGUMENT,
       "k_new.head_dim"},
      {"q head dim differs from the cache", [](CacheRequest& r) { r.tq.head_dim = 4; }, IOATTN_ERROR_INVALID_ARGUMENT,
       "head_dim"},
      {"contiguous cache batch differs", [](CacheRequest& r) { r.cache.k.batch = r.cache.v.batch = 1; },
       IOATTN_ERROR_INVALID_ARGUMENT, "cache.k.batch=1"},
      {"cache.v shape differs", [](CacheRequest& r) { r.cache.v.seqlen = 5; }, IOATTN_ERROR_INVALID_ARGUMENT,
       "cache.v"},
      {"GQA not divisible", [](CacheRequest& r) { r.tq.heads = r.to.heads = 3; }, IOATTN_ERROR_INVALID_ARGUMENT,
       "q.heads=3"},
      {"out aliases the cache", [](CacheRequest& r) { r.to.data = r.kc.data(); }, IOATTN_ERROR_INVALID_ARGUMENT,
       "cache.k"},
      {"block table with max_pages_per_seq 0",
       [](CacheRequest& r) {
         r.paged();
         r.cache.max_pages_per_seq = 0;
       },
       IOATTN_ERROR_INVALID_ARGUMENT, "max_pages_per_seq=0"},
      {"page size 0",
       [](CacheRequest& r) {
         r.paged();
         r.cache.k.seqlen = r.cache.v.seqlen = 0;
       },
       IOATTN_ERROR_INVALID_ARGUMENT, "page_size"},
      {"negative page id",
       [](CacheRequest& r) {
         r.paged();
         r.table[4] = -2;
       },
       IOATTN_ERROR_INVALID_ARGUMENT, "cache.block_table[1][1]=-2"},
      {"a f16 cache with f32 q on CUDA is UNSUPPORTED, not a fallback",
       [](CacheRequest& r) {
         r.cache.k.dtype = r.cache.v.dtype = IOATTN_F16;
         r.opt.backend = IOATTN_BACKEND_CUDA;
       },
       IOATTN_ERROR_UNSUPPORTED, "cache.k.dtype=f16"},
  };
  for (const Case& c : cases) {
    SECTION(c.what) {
      CacheRequest r;
      c.mutate(r);
      const std::vector<unsigned char> out_before = r.out.bytes(), k_before = r.kc.bytes(), v_before = r.vc.bytes();
      const ioattn_status got = r.call();
      INFO("message: " << last_error());
      CHECK(got == c.want);
      CHECK(last_error().find(c.needle) != std::string::npos);
      CHECK(r.out.bytes() == out_before);
      CHECK(r.kc.bytes() == k_before);
      CHECK(r.vc.bytes() == v_before);
      for (float x : r.lse) CHECK(x == 4.5f);
      CHECK(r.seqlens == std::vector<int32_t>{3, 2});
    }
  }
  SECTION("the valid request the cases start from succeeds, contiguous and paged") {
    CacheRequest r;
    INFO(last_error());
    CHECK(r.call() == IOATTN_OK);
    CacheRequest p;
    p.paged();
    CHECK(p.call() == IOATTN_OK);
  }
}

TEST_CASE("sweep: paged sequences sharing prefix pages, each appending into its own page", "[sweep][kvcache]") {
  // Prefix caching: sequences 0 and 1 share page 2 for their first 4 cached tokens and read it
  // only; each appends into a page of its own. Nothing is written twice, so the request is valid.
  std::mt19937 rng(31);
  const int64_t page = 4, hkv = 1, hq = 2, d = 16;
  Arr kc(IOATTN_F32, 5, page, hkv, d), vc(IOATTN_F32, 5, page, hkv, d);
  kc.randomize(rng);
  vc.randomize(rng);
  std::vector<int32_t> table{2, 0, 2, 4}, seqlens{4, 4};
  Arr q(IOATTN_F32, 2, 1, hq, d), out(IOATTN_F32, 2, 1, hq, d), kn(IOATTN_F32, 2, 1, hkv, d),
      vn(IOATTN_F32, 2, 1, hkv, d);
  q.randomize(rng);
  kn.randomize(rng);
  vn.randomize(rng);
  ioattn_kvcache cache{};
  cache.k = kc.t();
  cache.v = vc.t();
  cache.seqlens = seqlens.data();
  cache.block_table = table.data();
  cache.max_pages_per_seq = 2;
  std::vector<float> lse(4);
  ioattn_tensor tq = q.t(), to = out.t(), tkn = kn.t(), tvn = vn.t();
  const ioattn_options o = defaults();
  const Arr k_prefix = kc, v_prefix = vc;
  const ioattn_status st = ioattn_forward_kvcache(&tq, &cache, &tkn, &tvn, &to, lse.data(), &o);
  INFO(last_error());
  REQUIRE(st == IOATTN_OK);
  Tally t;
  for (int64_t b = 0; b < 2; ++b) {
    std::vector<float> keys, values;
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t c = 0; c < d; ++c) {
        const int64_t pg = j < 4 ? 2 : table[size_t(b * 2 + 1)];
        keys.push_back(j < 4 ? k_prefix.get(2, j, 0, c) : kn.get(b, 0, 0, c));
        values.push_back(j < 4 ? v_prefix.get(2, j, 0, c) : vn.get(b, 0, 0, c));
        if (j == 4) CHECK(kc.get(pg, 0, 0, c) == kn.get(b, 0, 0, c));
      }
    tally_sequence(t, gather(q, b, 0, 1), keys, values, 1, 5, hq, hkv, d, d, rule_of(o), out, b, 0,
                   [&](int64_t h, int64_t) { return lse[size_t(b * hq + h)]; });
  }
  INFO(t.report());
  CHECK(t.ok());
}

TEST_CASE("sweep: KV-cache odd requests: Sq = 0 still appends, B = 0 is a no-op, padded q/out and strided k_new",
          "[sweep][kvcache]") {
  std::mt19937 rng(32);
  const int64_t hq = 4, hkv = 2, d = 8;
  Arr kc(IOATTN_F32, 2, 8, hkv, d), vc(IOATTN_F32, 2, 8, hkv, d);
  kc.randomize(rng);
  vc.randomize(rng);
  std::vector<int32_t> seqlens{2, 5};
  ioattn_kvcache cache{};
  cache.k = kc.t();
  cache.v = vc.t();
  cache.seqlens = seqlens.data();
  const ioattn_options o = defaults();
  SECTION("Sq = 0 with two new tokens: the cache is appended, nothing else written") {
    // docs/api.md orders the call as "appends ..., then attends q": an empty q empties only the second
    // step, so a chunk that only fills the cache is a valid request.
    Arr kn(IOATTN_F32, 2, 2, hkv, d), vn(IOATTN_F32, 2, 2, hkv, d);
    kn.randomize(rng);
    vn.randomize(rng);
    ioattn_tensor tq{nullptr, IOATTN_F32, 2, 0, hq, d, 0, hq * d, d}, to = tq, tkn = kn.t(), tvn = vn.t();
    REQUIRE(ioattn_forward_kvcache(&tq, &cache, &tkn, &tvn, &to, nullptr, &o) == IOATTN_OK);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t r = 0; r < 2; ++r)
        for (int64_t h = 0; h < hkv; ++h) {
          CHECK(kc.get(b, seqlens[size_t(b)] + r, h, 3) == kn.get(b, r, h, 3));
          CHECK(vc.get(b, seqlens[size_t(b)] + r, h, 5) == vn.get(b, r, h, 5));
        }
    CHECK(seqlens == std::vector<int32_t>{2, 5});
  }
  SECTION("B = 0: nothing read, nothing written, seqlens may be NULL") {
    const std::vector<unsigned char> before = kc.bytes();
    cache.seqlens = nullptr;
    cache.k.batch = cache.v.batch = 0;
    ioattn_tensor tq{nullptr, IOATTN_F32, 0, 1, hq, d, hq * d, hq * d, d}, to = tq;
    INFO(last_error());
    CHECK(ioattn_forward_kvcache(&tq, &cache, nullptr, nullptr, &to, nullptr, &o) == IOATTN_OK);
    CHECK(kc.bytes() == before);
  }
  SECTION("q and out padded, k_new broadcast over the batch (stride 0), Sq = 3 causal") {
    const int64_t qs = hq * d + 3;
    Arr q(IOATTN_F32, 2, 3, hq, d, 3 * qs + 1, qs, d), out(IOATTN_F32, 2, 3, hq, d, 3 * qs + 7, qs, d);
    Arr kn(IOATTN_F32, 2, 1, hkv, d, 0, hkv * d, d), vn(IOATTN_F32, 2, 1, hkv, d, 0, hkv * d, d);
    q.randomize(rng);
    kn.randomize(rng);
    vn.randomize(rng);
    const Arr k0 = kc, v0 = vc;
    ioattn_options causal = o;
    causal.causal = 1;
    std::vector<float> lse(24);
    const std::vector<unsigned char> before = out.bytes();
    ioattn_tensor tq = q.t(), to = out.t(), tkn = kn.t(), tvn = vn.t();
    REQUIRE(ioattn_forward_kvcache(&tq, &cache, &tkn, &tvn, &to, lse.data(), &causal) == IOATTN_OK);
    CHECK(out.untouched_outside(before, [](int64_t, int64_t, int64_t) { return true; }));
    Tally t;
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t len = seqlens[size_t(b)] + 1;
      std::vector<float> keys = gather(k0, b, 0, len), values = gather(v0, b, 0, len);
      for (int64_t h = 0; h < hkv; ++h)
        for (int64_t c = 0; c < d; ++c) {
          keys[size_t(((len - 1) * hkv + h) * d + c)] = kn.get(0, 0, h, c);
          values[size_t(((len - 1) * hkv + h) * d + c)] = vn.get(0, 0, h, c);
        }
      tally_sequence(t, gather(q, b, 0, 3), keys, values, 3, len, hq, hkv, d, d, rule_of(causal), out, b, 0,
                     [&](int64_t h, int64_t i) { return lse[size_t((b * hq + h) * 3 + i)]; });
    }
    INFO(t.report());
    CHECK(t.ok());
  }
  SECTION("a contiguous cache broadcast over the batch (stride 0), read without an append") {
    ioattn_kvcache shared = cache;
    shared.k.stride_batch = shared.v.stride_batch = 0;
    Arr q(IOATTN_F32, 2, 1, hq, d), out(IOATTN_F32, 2, 1, hq, d);
    q.randomize(rng);
    std::vector<float> lse(8);
    ioattn_tensor tq = q.t(), to = out.t();
    INFO(last_error());
    REQUIRE(ioattn_forward_kvcache(&tq, &shared, nullptr, nullptr, &to, lse.data(), &o) == IOATTN_OK);
    Tally t;
    for (int64_t b = 0; b < 2; ++b)
      tally_sequence(t, gather(q, b, 0, 1), gather(kc, 0, 0, seqlens[size_t(b)]), gather(vc, 0, 0, seqlens[size_t(b)]),
                     1, seqlens[size_t(b)], hq, hkv, d, d, rule_of(o), out, b, 0,
                     [&](int64_t h, int64_t) { return lse[size_t(b * hq + h)]; });
    INFO(t.report());
    CHECK(t.ok());
  }
}

TEST_CASE("sweep: varlen over head-major packed tensors", "[sweep][varlen][strides]") {
  // (1, total, H, D) stored head by head: stride_head = total * D, stride_seq = D.
  std::mt19937 rng(33);
  const std::vector<int32_t> cu_q{0, 5, 5, 12}, cu_k{0, 9, 10, 30};
  const int64_t tq_len = 12, tk_len = 30, hq = 4, hkv = 2, d = 20;
  Arr q(IOATTN_F16, 1, tq_len, hq, d, hq * tq_len * d, d, tq_len * d),
      k(IOATTN_F16, 1, tk_len, hkv, d, hkv * tk_len * d, d, tk_len * d),
      v(IOATTN_F16, 1, tk_len, hkv, d, hkv * tk_len * d, d, tk_len * d),
      out(IOATTN_F16, 1, tq_len, hq, d, hq * tq_len * d, d, tq_len * d);
  q.randomize(rng);
  k.randomize(rng);
  v.randomize(rng);
  ioattn_options o = defaults();
  o.causal = 1;
  std::vector<float> lse(size_t(hq * tq_len));
  ioattn_tensor tq = q.t(), tk = k.t(), tv = v.t(), to = out.t();
  INFO(last_error());
  REQUIRE(ioattn_forward_varlen(&tq, &tk, &tv, cu_q.data(), cu_k.data(), 3, &to, lse.data(), &o) == IOATTN_OK);
  Tally t;
  t.eps = kEps16;
  for (size_t b = 0; b < 3; ++b) {
    const int64_t q0 = cu_q[b], k0 = cu_k[b], sq = cu_q[b + 1] - q0, sk = cu_k[b + 1] - k0;
    tally_sequence(t, gather(q, 0, q0, sq), gather(k, 0, k0, sk), gather(v, 0, k0, sk), sq, sk, hq, hkv, d, d,
                   rule_of(o), out, 0, q0, [&](int64_t h, int64_t i) { return lse[size_t(h * tq_len + q0 + i)]; });
  }
  INFO(t.report());
  CHECK(t.ok());
}

TEST_CASE("sweep: extreme but valid options and strides", "[sweep][dense]") {
  std::mt19937 rng(34);
  Arr q(IOATTN_F32, 1, 6, 2, 8), k(IOATTN_F32, 1, 7, 2, 8), v(IOATTN_F32, 1, 7, 2, 8);
  q.randomize(rng);
  k.randomize(rng);
  v.randomize(rng);
  SECTION("num_threads INT32_MAX, windows INT32_MAX") {
    ioattn_options o = defaults();
    o.num_threads = INT32_MAX;
    o.window_left = INT32_MAX;
    o.window_right = INT32_MAX;
    Arr out(IOATTN_F32, 1, 6, 2, 8);
    check_dense(q, k, v, out, o);
  }
  SECTION("a stride on an axis of extent 1 is never used, however large") {
    ioattn_tensor tq = q.t(), tk = k.t(), tv = v.t();
    tq.stride_batch = tk.stride_batch = tv.stride_batch = INT64_MAX;
    Arr out(IOATTN_F32, 1, 6, 2, 8, INT64_MAX / 2, 16, 8);
    check_call(q, k, v, out, tq, tk, tv, defaults());
  }
}

TEST_CASE("sweep: varlen and paged KV results are bitwise the same for 1, 2, 3 and 7 threads", "[sweep][threads]") {
  std::mt19937 rng(35);
  const std::vector<int32_t> cu_q{0, 1, 40, 41, 300}, cu_k{0, 900, 950, 2000, 2300};
  const int64_t hq = 8, hkv = 2, d = 32;
  Arr q(IOATTN_BF16, 1, 300, hq, d), k(IOATTN_BF16, 1, 2300, hkv, d), v(IOATTN_BF16, 1, 2300, hkv, d);
  q.randomize(rng);
  k.randomize(rng);
  v.randomize(rng);
  // A paged cache of one sequence (one task: the key axis splits) decoding 2 tokens.
  const int64_t page = 16, pages = 120;
  Arr kc(IOATTN_F16, pages, page, hkv, d), vc(IOATTN_F16, pages, page, hkv, d);
  kc.randomize(rng);
  vc.randomize(rng);
  std::vector<int32_t> table(pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<int32_t> seqlens{1800};
  Arr qd(IOATTN_F32, 1, 2, hq, d);
  qd.randomize(rng);
  std::vector<std::vector<unsigned char>> varlen_bits, cache_bits;
  std::vector<std::vector<float>> varlen_lse, cache_lse;
  for (int32_t threads : {1, 2, 3, 7}) {
    ioattn_options o = defaults();
    o.causal = 1;
    o.window_left = 700;
    o.num_threads = threads;
    Arr out(IOATTN_BF16, 1, 300, hq, d);
    std::vector<float> lse(size_t(hq * 300));
    ioattn_tensor tq = q.t(), tk = k.t(), tv = v.t(), to = out.t();
    REQUIRE(ioattn_forward_varlen(&tq, &tk, &tv, cu_q.data(), cu_k.data(), 4, &to, lse.data(), &o) == IOATTN_OK);
    varlen_bits.push_back(out.bytes());
    varlen_lse.push_back(lse);

    Arr od(IOATTN_F32, 1, 2, hq, d);
    std::vector<float> lsed(size_t(hq * 2));
    ioattn_kvcache cache{};
    cache.k = kc.t();
    cache.v = vc.t();
    cache.seqlens = seqlens.data();
    cache.block_table = table.data();
    cache.max_pages_per_seq = int32_t(pages);
    ioattn_tensor tqd = qd.t(), tod = od.t();
    REQUIRE(ioattn_forward_kvcache(&tqd, &cache, nullptr, nullptr, &tod, lsed.data(), &o) == IOATTN_OK);
    cache_bits.push_back(od.bytes());
    cache_lse.push_back(lsed);
  }
  for (size_t i = 1; i < varlen_bits.size(); ++i) {
    INFO("thread count #" << i);
    CHECK(varlen_bits[i] == varlen_bits[0]);
    CHECK(std::memcmp(varlen_lse[i].data(), varlen_lse[0].data(), varlen_lse[0].size() * 4) == 0);
    CHECK(cache_bits[i] == cache_bits[0]);
    CHECK(std::memcmp(cache_lse[i].data(), cache_lse[0].data(), cache_lse[0].size() * 4) == 0);
  }
}

TEST_CASE("sweep: +inf in K under a softcap is a finite score c * tanh(inf) = c", "[sweep][dense][softcap]") {
  std::mt19937 rng(36);
  Arr q(IOATTN_F32, 1, 12, 2, 16), k(IOATTN_F32, 1, 20, 1, 16), v(IOATTN_F32, 1, 20, 1, 16),
      out(IOATTN_F32, 1, 12, 2, 16);
  q.randomize(rng);
  k.randomize(rng);
  v.randomize(rng);
  // Every q element positive: key 5's score is +inf before the cap, exactly c after it.
  for (int64_t i = 0; i < 12; ++i)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t c = 0; c < 16; ++c) q.set(0, i, h, c, 0.1f + std::fabs(q.get(0, i, h, c)));
  k.set(0, 5, 0, 3, INFINITY);
  ioattn_options o = defaults();
  o.softcap = 3.f;
  o.causal = 1;
  check_dense(q, k, v, out, o);
}

TEST_CASE("sweep: the C++ API: defaults, views, exceptions carrying status and message", "[sweep][cpp]") {
  // Field by field: the struct has padding before cuda_stream, which memcmp would compare.
  const ioattn_options c = defaults();
  const ioattn_options cpp = ioattn::Options{}.raw();
  CHECK(c.scale == cpp.scale);
  CHECK(c.causal == cpp.causal);
  CHECK(c.window_left == cpp.window_left);
  CHECK(c.window_right == cpp.window_right);
  CHECK(c.softcap == cpp.softcap);
  CHECK(c.backend == cpp.backend);
  CHECK(c.num_threads == cpp.num_threads);
  CHECK(c.cuda_stream == cpp.cuda_stream);

  std::mt19937 rng(37);
  Arr q(IOATTN_F16, 2, 7, 4, 16), k(IOATTN_F16, 2, 9, 2, 16), v(IOATTN_F16, 2, 9, 2, 16), out(IOATTN_F16, 2, 7, 4, 16),
      expect(IOATTN_F16, 2, 7, 4, 16);
  q.randomize(rng);
  k.randomize(rng);
  v.randomize(rng);
  using ioattn::DTypeCode;
  using ioattn::TensorView;
  const TensorView tq = TensorView::contiguous(q.data(), DTypeCode::f16, 2, 7, 4, 16);
  const TensorView tk = TensorView::contiguous(k.data(), DTypeCode::f16, 2, 9, 2, 16);
  const TensorView tv = TensorView::contiguous(v.data(), DTypeCode::f16, 2, 9, 2, 16);
  const TensorView to = TensorView::contiguous(out.data(), DTypeCode::f16, 2, 7, 4, 16);
  ioattn::Options opt;
  opt.causal = true;
  opt.window_left = 3;
  std::vector<float> lse(56), lse_c(56);
  ioattn::forward(tq, tk, tv, to, lse.data(), opt);
  ioattn_tensor cq = q.t(), ck = k.t(), cv = v.t(), ce = expect.t();
  const ioattn_options raw = opt.raw();
  REQUIRE(ioattn_forward(&cq, &ck, &cv, &ce, lse_c.data(), &raw) == IOATTN_OK);
  CHECK(out.bytes() == expect.bytes());
  CHECK(lse == lse_c);

  ioattn::Options bad;
  bad.window_right = -7;
  const std::vector<unsigned char> before = out.bytes();
  try {
    ioattn::forward(tq, tk, tv, to, nullptr, bad);
    FAIL("an invalid request must throw ioattn::Error");
  } catch (const ioattn::Error& e) {
    CHECK(e.status() == IOATTN_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()).find("opt.window_right=-7") != std::string::npos);
  }
  CHECK(out.bytes() == before);
  CHECK(ioattn::version() == ioattn_version());

  // Varlen and KV-cache wrappers reach the same entry points.
  const int32_t cu_q[] = {0, 3, 7}, cu_k[] = {0, 4, 9};
  const TensorView pq = TensorView::contiguous(q.data(), DTypeCode::f16, 1, 7, 4, 16);
  const TensorView pk = TensorView::contiguous(k.data(), DTypeCode::f16, 1, 9, 2, 16);
  const TensorView pv = TensorView::contiguous(v.data(), DTypeCode::f16, 1, 9, 2, 16);
  const TensorView po = TensorView::contiguous(out.data(), DTypeCode::f16, 1, 7, 4, 16);
  CHECK_NOTHROW(ioattn::forward_varlen(pq, pk, pv, cu_q, cu_k, 2, po, nullptr, opt));
  const int32_t bad_cu[] = {0, 5, 4};
  CHECK_THROWS_AS(ioattn::forward_varlen(pq, pk, pv, bad_cu, cu_k, 2, po, nullptr, opt), ioattn::Error);
  ioattn_kvcache cache{};
  cache.k = k.t();
  cache.v = v.t();
  const int32_t seqlens[] = {9, 2};
  cache.seqlens = seqlens;
  CHECK_NOTHROW(ioattn::forward_kvcache(tq, cache, nullptr, nullptr, to, nullptr, opt));
}

namespace {

uint32_t env_count(const char* name, uint32_t fallback) {
  const char* env = std::getenv(name);
  return env ? uint32_t(std::strtoul(env, nullptr, 10)) : fallback;
}

ioattn_options random_options(std::mt19937& rng) {
  ioattn_options o = defaults();
  o.causal = int32_t(rng() % 2);
  o.window_left = rng() % 3 == 0 ? int32_t(rng() % 50) : -1;
  o.window_right = rng() % 4 == 0 ? int32_t(rng() % 10) : -1;
  o.softcap = rng() % 4 == 0 ? float(1 + rng() % 30) : 0.f;
  o.scale = rng() % 5 == 0 ? 0.05f + float(rng() % 50) / 100.f : 0.f;
  o.num_threads = int32_t(rng() % 4);
  return o;
}

}  // namespace

TEST_CASE("sweep: random varlen and KV-cache requests against the contract's oracle", "[sweep][random][inference]") {
  const uint32_t first = env_count("IOATTN_SWEEP_FIRST", 1), count = env_count("IOATTN_SWEEP_SEEDS", 40);
  for (uint32_t seed = first; seed < first + count; ++seed) {
    std::mt19937 rng(seed * 7919u);
    const int64_t hkv = 1 + rng() % 3, group = int64_t(1) << (rng() % 4);
    const int64_t dims[] = {1, 5, 8, 24, 40, 64, 80, 128};
    const int64_t d = dims[rng() % 8], dv = rng() % 3 ? d : dims[rng() % 8];
    const ioattn_options o = random_options(rng);
    VarlenSpec v;
    const int32_t batch = int32_t(1 + rng() % 5);
    for (int32_t b = 0; b < batch; ++b) {
      v.lens_q.push_back(int32_t(rng() % 4 == 0 ? 0 : rng() % 70));
      v.lens_k.push_back(int32_t(rng() % 5 == 0 ? 0 : rng() % 300));
    }
    v.lead_q = rng() % 3;
    v.tail_q = rng() % 3;
    v.lead_k = rng() % 5;
    v.hq = hkv * group;
    v.hkv = hkv;
    v.d = d;
    v.dv = dv;
    v.row_pad = rng() % 2 ? 3 : 0;
    v.dtype = int32_t(rng() % 3);
    KvSpec k;
    for (int32_t b = 0; b < batch; ++b) k.cached.push_back(int32_t(rng() % 4 == 0 ? rng() % 2 : rng() % 400));
    k.cache = int32_t(rng() % 3);
    k.io = rng() % 2 ? IOATTN_F32 : k.cache;
    k.hq = hkv * group;
    k.hkv = hkv;
    k.d = d;
    k.dv = dv;
    k.sq = 1 + int64_t(rng() % 16);
    k.snew = rng() % 3 == 0 ? 0 : k.sq;
    const int64_t pages[] = {0, 1, 2, 3, 16, 17, 256};
    k.page = pages[rng() % 7];
    k.head_major = k.page > 0 && rng() % 2;
    INFO("seed " << seed << " Hq " << hkv * group << " Hkv " << hkv << " D " << d << " Dv " << dv << " causal "
                 << o.causal << " window " << o.window_left << "," << o.window_right << " softcap " << o.softcap
                 << " scale " << o.scale << " threads " << o.num_threads);
    {
      INFO("varlen " << dtype_label(v.dtype) << " batch " << batch);
      run_varlen(v, o, seed);
    }
    {
      INFO("kvcache io " << dtype_label(k.io) << " cache " << dtype_label(k.cache) << " Sq " << k.sq << " Snew "
                         << k.snew << " page " << k.page << (k.head_major ? " head-major" : ""));
      run_kvcache(k, o, seed);
    }
  }
}

TEST_CASE("sweep: without a usable CUDA device, varlen and KV-cache calls on CUDA are UNSUPPORTED, untouched",
          "[sweep][api][cuda]") {
  if (ioattn_backend_available(IOATTN_BACKEND_CUDA)) return;  // the GPU tests cover a usable device
  ioattn_options o = defaults();
  o.backend = IOATTN_BACKEND_CUDA;
  {
    Arr q(IOATTN_BF16, 1, 6, 2, 8), k(IOATTN_BF16, 1, 9, 1, 8), out(IOATTN_BF16, 1, 6, 2, 8);
    const std::vector<unsigned char> before = out.bytes();
    const int32_t cu_q[] = {0, 6}, cu_k[] = {0, 9};
    ioattn_tensor tq = q.t(), tk = k.t(), to = out.t();
    CHECK(ioattn_forward_varlen(&tq, &tk, &tk, cu_q, cu_k, 1, &to, nullptr, &o) == IOATTN_ERROR_UNSUPPORTED);
    CHECK(last_error().find("CUDA") != std::string::npos);
    CHECK(out.bytes() == before);
  }
  {
    CacheRequest r;
    r.opt = o;
    const std::vector<unsigned char> k_before = r.kc.bytes(), out_before = r.out.bytes();
    CHECK(r.call() == IOATTN_ERROR_UNSUPPORTED);
    CHECK(last_error().find("CUDA") != std::string::npos);
    CHECK(r.kc.bytes() == k_before);
    CHECK(r.out.bytes() == out_before);
  }
}

// ---- CLI ---------------------------------------------------------------------------------

namespace {

using ioattn::contract::CliResult;
using ioattn::contract::file_exists;
using ioattn::contract::Npy;
using ioattn::contract::read_file;
using ioattn::contract::read_npy;
using ioattn::contract::Scratch;

CliResult cli(const Scratch& dir, const std::vector<std::string>& args) { return ioattn::contract::run_cli(dir, args); }

// NumPy's .npy v1.0: magic, header length, a dict padded with spaces to 64 bytes, then data.
void write_npy(const std::string& path, const char* descr, const std::vector<int64_t>& shape, const void* data,
               size_t bytes) {
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i)
    dict += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
  dict += "), }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string file = "\x93NUMPY";
  file += char(1);
  file += char(0);
  file += char(dict.size() & 0xff);
  file += char(dict.size() >> 8);
  file += dict;
  if (bytes > 0) file.append(static_cast<const char*>(data), bytes);
  std::ofstream(path, std::ios::binary) << file;
}

std::vector<float> floats(const Npy& n) {
  std::vector<float> x(n.data.size() / 4);
  std::memcpy(x.data(), n.data.data(), x.size() * 4);
  return x;
}

void write_f32(const std::string& path, const std::vector<int64_t>& shape, uint32_t seed) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::mt19937 rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& e : x) e = uniform(rng);
  write_npy(path, "<f4", shape, x.data(), x.size() * 4);
}

bool one_line(const std::string& s) { return !s.empty() && s.find('\n') == s.size() - 1; }

}  // namespace

TEST_CASE("sweep cli: run where the library says UNSUPPORTED exits 3, one line, no files", "[sweep][cli]") {
  Scratch dir;
  // Head dim 600 is a well-formed request beyond the CPU backend's 1..512.
  write_f32(dir / "q.npy", {1, 2, 1, 600}, 1);
  write_f32(dir / "k.npy", {1, 3, 1, 600}, 2);
  write_f32(dir / "v.npy", {1, 3, 1, 600}, 3);
  const CliResult r = cli(dir, {"run", "--q", dir / "q.npy", "--k", dir / "k.npy", "--v", dir / "v.npy", "--out",
                                dir / "o.npy", "--lse", dir / "l.npy"});
  INFO(r.err);
  CHECK(r.code == 3);
  CHECK(one_line(r.err));
  CHECK(r.err.find("600") != std::string::npos);
  CHECK(dir.listing() == std::vector<std::string>{"k.npy", "q.npy", "v.npy"});
}

TEST_CASE("sweep cli: run with Sk = 0 writes zeros and -inf; B = 0 writes an empty array", "[sweep][cli]") {
  Scratch dir;
  write_f32(dir / "q.npy", {2, 3, 2, 4}, 1);
  write_npy(dir / "k.npy", "<f4", {2, 0, 1, 4}, nullptr, 0);
  write_npy(dir / "v.npy", "<f4", {2, 0, 1, 6}, nullptr, 0);
  const CliResult r = cli(dir, {"run", "--q", dir / "q.npy", "--k", dir / "k.npy", "--v", dir / "v.npy", "--out",
                                dir / "o.npy", "--lse", dir / "l.npy", "--causal", "--check"});
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  const Npy o = read_npy(dir / "o.npy"), l = read_npy(dir / "l.npy");
  CHECK(o.shape == std::vector<int64_t>{2, 3, 2, 6});
  CHECK(l.shape == std::vector<int64_t>{2, 2, 3});
  const std::vector<float> ov = floats(o), lv = floats(l);
  CHECK(ov.size() == 72);
  for (float x : ov) CHECK(x == 0.f);
  CHECK(lv.size() == 12);
  for (float x : lv) CHECK(x == -INFINITY);

  write_npy(dir / "q0.npy", "<f2", {0, 3, 2, 4}, nullptr, 0);
  write_npy(dir / "k0.npy", "<f2", {0, 5, 1, 4}, nullptr, 0);
  const CliResult e =
      cli(dir, {"run", "--q", dir / "q0.npy", "--k", dir / "k0.npy", "--v", dir / "k0.npy", "--out", dir / "o0.npy"});
  INFO(e.out << e.err);
  REQUIRE(e.code == 0);
  const Npy o0 = read_npy(dir / "o0.npy");
  CHECK(o0.descr == "<f2");
  CHECK(o0.shape == std::vector<int64_t>{0, 3, 2, 4});
  CHECK(o0.data.empty());
}

TEST_CASE("sweep cli: run output does not depend on --threads; --window -1,-1 is no window", "[sweep][cli]") {
  Scratch dir;
  write_f32(dir / "q.npy", {2, 70, 4, 16}, 1);
  write_f32(dir / "k.npy", {2, 90, 2, 16}, 2);
  write_f32(dir / "v.npy", {2, 90, 2, 16}, 3);
  auto run = [&](const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> args = {"run", "--q",         dir / "q.npy", "--k",    dir / "k.npy",
                                     "--v", dir / "v.npy", "--out",       dir / out};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = cli(dir, args);
    INFO(r.err);
    REQUIRE(r.code == 0);
    return read_npy(dir / out).data;
  };
  CHECK(run("a.npy", {"--threads", "1", "--causal"}) == run("b.npy", {"--threads", "2", "--causal"}));
  CHECK(run("c.npy", {}) == run("d.npy", {"--window", "-1,-1"}));
  CHECK(run("e.npy", {"--causal"}) == run("f.npy", {"--window", "-1,0"}));
}

TEST_CASE("sweep cli: an unwritable --lse fails with exit 2 before --out appears", "[sweep][cli]") {
  Scratch dir;
  write_f32(dir / "q.npy", {1, 4, 2, 8}, 1);
  write_f32(dir / "k.npy", {1, 4, 2, 8}, 2);
  const CliResult r = cli(dir, {"run", "--q", dir / "q.npy", "--k", dir / "k.npy", "--v", dir / "k.npy", "--out",
                                dir / "o.npy", "--lse", dir / "missing/l.npy"});
  INFO(r.err);
  CHECK(r.code == 2);
  CHECK(one_line(r.err));
  CHECK(r.err.find("--lse") != std::string::npos);
  CHECK_FALSE(file_exists(dir / "o.npy"));
}

TEST_CASE("sweep cli: plan, traffic and explain accept every problem flag, f16 and bf16", "[sweep][cli]") {
  Scratch dir;
  for (const char* dtype : {"f16", "bf16"}) {
    const std::vector<std::string> problem = {"--batch",    "2",    "--heads",    "8",        "--kv-heads", "2",
                                              "--seqlen-q", "300",  "--seqlen-k", "700",      "--head-dim", "64",
                                              "--dtype",    dtype,  "--causal",   "--window", "128,0",      "--hw",
                                              "host",       "--hw", "h200-sxm",   "--json"};
    for (const char* cmd : {"plan", "traffic", "explain"}) {
      std::vector<std::string> args = {cmd};
      args.insert(args.end(), problem.begin(), problem.end());
      const CliResult r = cli(dir, args);
      INFO(cmd << " " << dtype << ": " << r.err);
      CHECK(r.code == 0);
      // Two --hw: a JSON list of two objects (the shape plan and explain document for several).
      CHECK(r.out.front() == '[');
      CHECK(r.out.find("h200-sxm") != std::string::npos);
    }
  }
  const CliResult t = cli(dir, {"traffic", "--json", "--hw", "h200-sxm", "--dtype", "bf16"});
  for (const char* key : {"\"hardware\"", "\"flash_dram_bytes\"", "\"standard_dram_bytes\"", "\"levels\"",
                          "\"flash_bytes\"", "\"standard_bytes\"", "\"name\""})
    CHECK(t.out.find(key) != std::string::npos);
}

TEST_CASE("sweep cli: bench runs f16 and bf16 storage, GQA and windows", "[sweep][cli][bench]") {
  Scratch dir;
  for (const char* dtype : {"f16", "bf16"}) {
    const CliResult r =
        cli(dir, {"bench", "--heads", "4",   "--kv-heads", "2",    "--seqlen-q", "64", "--seqlen-k", "80", "--head-dim",
                  "32",    "--dtype", dtype, "--window",   "16,0", "--repeats",  "1",  "--threads",  "1",  "--json"});
    INFO(dtype << ": " << r.err);
    CHECK(r.code == 0);
    for (const char* key : {"\"flash\"", "\"standard\"", "\"gflops\"", "\"percent_of_peak\"", "\"scratch_bytes\""})
      CHECK(r.out.find(key) != std::string::npos);
  }
}

TEST_CASE("sweep cli: bench reports the peak memory of flash and of standard attention", "[sweep][cli][bench]") {
  // docs/api.md: bench prints "time, GFLOP/s, % of peak, peak memory" for flash and standard. The peak
  // is what each holds at once: q, k, v and out plus its own scratch (S and P for standard).
  Scratch dir;
  const CliResult r = cli(dir, {"bench", "--heads", "2", "--seqlen-q", "96", "--seqlen-k", "200", "--head-dim", "32",
                                "--repeats", "1", "--threads", "1", "--json"});
  INFO(r.err);
  REQUIRE(r.code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const double io = j["io_bytes"].get<double>();
  // q and out 96 x 2 x 32, k and v 200 x 2 x 32, fp32.
  CHECK(io == 4.0 * (2 * 96 * 2 * 32 + 2 * 200 * 2 * 32));
  for (const char* side : {"flash", "standard"}) {
    INFO(side);
    REQUIRE(j[side].contains("peak_memory_bytes"));
    CHECK(j[side]["peak_memory_bytes"].get<double>() == io + j[side]["scratch_bytes"].get<double>());
  }
  // Standard attention holds a 96 x 200 fp32 score matrix per head at least; flash holds less.
  CHECK(j["standard"]["peak_memory_bytes"].get<double>() >= io + 96 * 200 * 4);
  const CliResult text = cli(dir, {"bench", "--heads", "2", "--seqlen-q", "96", "--seqlen-k", "200", "--head-dim", "32",
                                   "--repeats", "1", "--threads", "1"});
  REQUIRE(text.code == 0);
  CHECK(text.out.find("peak memory") != std::string::npos);
}

TEST_CASE("sweep cli: explain's K/V figure never exceeds the problem's K/V", "[sweep][cli]") {
  // docs/api.md: each explain field names "this problem's numbers". For a split-KV decode on the H200
  // (Hq 32, Hkv 8, Sq 1, Sk 32768, D 128, bf16) the whole K/V is 8 * 32768 * (128 + 128) * 2 bytes
  // = 128 MiB, so the active heads' share of it cannot be larger (common/outline.cc used to
  // multiply one head's K/V by the active CTAs and ignore that the key splits divide it: 4.125 GiB).
  Scratch dir;
  const CliResult r = cli(dir, {"explain", "--json", "--hw", "h200-sxm", "--heads", "32", "--kv-heads", "8",
                                "--seqlen-q", "1", "--seqlen-k", "32768", "--head-dim", "128", "--dtype", "bf16"});
  REQUIRE(r.code == 0);
  const std::string failure = nlohmann::json::parse(r.out)["failureMode"].get<std::string>();
  INFO(failure);
  const std::string marker = "active heads' K/V (";
  const size_t at = failure.find(marker);
  REQUIRE(at != std::string::npos);
  std::istringstream in(failure.substr(at + marker.size()));
  double value = 0;
  std::string unit;
  in >> value >> unit;
  const double scale = unit.rfind("GiB", 0) == 0   ? 0x1p30
                       : unit.rfind("MiB", 0) == 0 ? 0x1p20
                       : unit.rfind("KiB", 0) == 0 ? 0x1p10
                                                   : 1.0;
  CHECK(value * scale <= 8.0 * 32768 * 256 * 2);
}

TEST_CASE("sweep cli: --lse naming --out's file by another spelling is refused, not written over it", "[sweep][cli]") {
  // Both files are renamed into place on success, so the second rename would silently replace the
  // attention output with the LSE array; the same string is already refused, and any spelling of
  // the same directory entry is the same destination.
  Scratch dir;
  write_f32(dir / "q.npy", {1, 4, 2, 8}, 1);
  write_f32(dir / "k.npy", {1, 5, 2, 8}, 2);
  for (const std::string& lse : {dir / "./o.npy", dir / "../" + dir.name() + "/o.npy"}) {
    const CliResult r = cli(dir, {"run", "--q", dir / "q.npy", "--k", dir / "k.npy", "--v", dir / "k.npy", "--out",
                                  dir / "o.npy", "--lse", lse});
    INFO(lse << ": " << r.err);
    CHECK(r.code == 2);
    CHECK(one_line(r.err));
    CHECK(r.err.find("--lse") != std::string::npos);
    CHECK(dir.listing() == std::vector<std::string>{"k.npy", "q.npy"});
  }
}
