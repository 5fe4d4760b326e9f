#include "common/reference.h"

#include <cmath>
#include <limits>
#include <vector>

namespace ioattn {

template <class T>
void naive_attention(const AttnParams& p, T* out, T* lse) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> scores;
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
        T sum = 0;
        std::vector<T> acc(static_cast<size_t>(p.head_dim_v), T(0));
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          const T weight = std::exp(scores[size_t(j - keys.begin)] - shift);
          sum += weight;
          const int64_t vo = v_offset(p, b, s, j, hk);
          for (int64_t c = 0; c < p.head_dim_v; ++c)
            acc[size_t(c)] += weight * T(load_as_f32(p.v, vo + c, p.kv_dtype));
        }
        const T inv = sum == T(0) ? T(0) : T(1) / sum;
        for (int64_t c = 0; c < p.head_dim_v; ++c) out[oo + c] = acc[size_t(c)] * inv;
        if (lse) lse[lse_offset(p, b, s, i, h)] = sum == T(0) ? neg_inf : shift + std::log(sum);
      }
    }
  }
}

template void naive_attention<double>(const AttnParams&, double*, double*);
template void naive_attention<float>(const AttnParams&, float*, float*);

}  // namespace ioattn
