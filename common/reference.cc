#include "common/reference.h"

#include <cmath>
#include <limits>
#include <vector>

namespace ioattn {

template <class T>
void naive_attention(const AttnParams& p, T* out, T* lse) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> scores, terms;
  for (int64_t b = 0; b < p.batch; ++b) {
    const SeqSpan s = sequence(p, b);
    for (int64_t h = 0; h < p.heads_q; ++h) {
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
}

template void naive_attention<double>(const AttnParams&, double*, double*);
template void naive_attention<float>(const AttnParams&, float*, float*);

}  // namespace ioattn
