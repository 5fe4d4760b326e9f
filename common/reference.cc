#include "common/reference.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

namespace ioattn {

namespace {

// The rows of the (sequence, head) pairs first, first + step, ...
template <class T>
void naive_pairs(const AttnParams& p, T* out, T* lse, int64_t first, int64_t step) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> scores, terms;
  for (int64_t pair = first; pair < p.batch * p.heads_q; pair += step) {
    const int64_t b = pair / p.heads_q, h = pair % p.heads_q;
    const SeqSpan s = sequence(p, b);
    const int64_t hk = kv_head_of(p, h);
    for (int64_t i = 0; i < s.seqlen_q; ++i) {
      const KeyRange keys = visible_keys(p, s, i);
      const int64_t qo = q_offset(p, b, s, i, h);
      scores.assign(static_cast<size_t>(keys.end > keys.begin ? keys.end - keys.begin : 0), T(0));
      T row_max = neg_inf;
      bool saw_nan = false;
      for (int64_t j = keys.begin; j < keys.end; ++j) {
        const int64_t ko = k_offset(p, b, s, j, hk);
        T dot = 0;
        for (int64_t c = 0; c < p.head_dim; ++c)
          dot += T(load_as_f32(p.q, qo + c, p.io_dtype)) * T(load_as_f32(p.k, ko + c, p.kv_dtype));
        T score = T(p.scale) * dot;
        if (p.softcap > 0) score = T(p.softcap) * std::tanh(score / T(p.softcap));
        scores[size_t(j - keys.begin)] = score;
        if (std::isnan(score)) saw_nan = true;
        if (score > row_max) row_max = score;
      }
      if (saw_nan) row_max = std::numeric_limits<T>::quiet_NaN();
      const int64_t oo = o_offset(p, b, s, i, h);
      if (keys.end <= keys.begin) {
        for (int64_t c = 0; c < p.head_dim_v; ++c) out[oo + c] = T(0);
        if (lse) lse[lse_offset(p, b, s, i, h)] = neg_inf;
        continue;
      }
      // A row whose visible scores are all -inf (softcap cannot produce that, huge negative
      // scale times inf input can) has no finite max; treat it like the kernels do.
      const T shift = row_max == neg_inf ? T(0) : row_max;
      // terms[j] = (weight, weight * v_j), summed over the keys as a pairwise tree, as BLAS-
      // and numpy-style code sums: its rounding grows with log(keys), not with keys, so
      // "2 x the naive error" compares a kernel with a careful f32 implementation.
      const size_t n = size_t(keys.end - keys.begin), w = size_t(p.head_dim_v) + 1;
      terms.assign(n * w, T(0));
      for (int64_t j = keys.begin; j < keys.end; ++j) {
        T* t = terms.data() + size_t(j - keys.begin) * w;
        t[0] = std::exp(scores[size_t(j - keys.begin)] - shift);
        const int64_t vo = v_offset(p, b, s, j, hk);
        for (int64_t c = 0; c < p.head_dim_v; ++c) t[c + 1] = t[0] * T(load_as_f32(p.v, vo + c, p.kv_dtype));
      }
      for (size_t stride = 1; stride < n; stride *= 2)
        for (size_t j = 0; j + stride < n; j += 2 * stride)
          for (size_t c = 0; c < w; ++c) terms[j * w + c] += terms[(j + stride) * w + c];
      const T sum = terms[0];
      const T inv = sum == T(0) ? T(0) : T(1) / sum;
      for (int64_t c = 0; c < p.head_dim_v; ++c) out[oo + c] = terms[size_t(c) + 1] * inv;
      if (lse) lse[lse_offset(p, b, s, i, h)] = sum == T(0) ? neg_inf : shift + std::log(sum);
    }
  }
}

}  // namespace

// Rows are independent and each is summed the same way on any thread, so the split changes
// nothing in the result; it only keeps the oracle from dominating the GPU suites' time on a
// many-core host. Pairs are dealt round-robin: under a causal mask or varlen they differ in size.
// A thread is started only for a share of at least kMinShare multiply-adds (about a millisecond
// of this scalar code, tens of times a thread's start), so the suites' many small calls
// stay on the caller's thread.
template <class T>
void naive_attention(const AttnParams& p, T* out, T* lse) {
  constexpr int64_t kMinShare = int64_t(1) << 20;
  const int64_t pairs = p.batch * p.heads_q;
  const double work = double(pairs) * double(p.seqlen_q) * double(p.seqlen_k) * double(p.head_dim + p.head_dim_v);
  const int64_t shares = int64_t(std::min(work / double(kMinShare), double(std::thread::hardware_concurrency())));
  const int64_t workers = std::clamp<int64_t>(shares, 1, std::max<int64_t>(pairs, 1));
  std::vector<std::thread> pool;
  int64_t started = 1;
  try {
    for (; started < workers; ++started) pool.emplace_back(naive_pairs<T>, std::cref(p), out, lse, started, workers);
  } catch (const std::exception&) {
    // No more threads to be had: this one takes the shares that were not started.
  }
  for (int64_t w = started; w < workers; ++w) naive_pairs(p, out, lse, w, workers);
  naive_pairs(p, out, lse, 0, workers);
  for (std::thread& t : pool) t.join();
}

template void naive_attention<double>(const AttnParams&, double*, double*);
template void naive_attention<float>(const AttnParams&, float*, float*);

}  // namespace ioattn
