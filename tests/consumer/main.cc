// Uses the installed headers and libioattn.so: one causal attention call through the C++ API,
// checked against a direct evaluation of the first row (it sees only key 0, so out = v_0).
#include <cmath>
#include <cstdio>
#include <vector>

#include "ioattn/ioattn.hpp"

int main() {
  const int64_t seqlen = 5, heads = 2, dim = 8;
  std::vector<float> q(seqlen * heads * dim), k(q.size()), v(q.size()), out(q.size(), NAN);
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = std::sin(0.1f * float(i));
    k[i] = std::cos(0.2f * float(i));
    v[i] = float(i % 7) - 3.f;
  }
  using ioattn::DTypeCode;
  using ioattn::TensorView;
  ioattn::Options options;
  options.causal = true;
  ioattn::forward(TensorView::contiguous(q.data(), DTypeCode::f32, 1, seqlen, heads, dim),
                  TensorView::contiguous(k.data(), DTypeCode::f32, 1, seqlen, heads, dim),
                  TensorView::contiguous(v.data(), DTypeCode::f32, 1, seqlen, heads, dim),
                  TensorView::contiguous(out.data(), DTypeCode::f32, 1, seqlen, heads, dim), nullptr, options);
  for (int64_t c = 0; c < dim; ++c)
    if (std::fabs(out[size_t(c)] - v[size_t(c)]) > 1e-6f) {
      std::printf("consumer: row 0 should equal v_0, element %lld differs\n", (long long)c);
      return 1;
    }
  std::printf("consumer: ioattn %s OK\n", ioattn::version().c_str());
  return 0;
}
