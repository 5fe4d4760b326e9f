// The online softmax of a block, vectorized over query rows (prefill) or along keys (decode),
// in the log2 domain of common/online_softmax.h.
// Per-target code: included by cpu/flash_kernel.cc once for every Highway target.
#if defined(IOATTN_CPU_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef IOATTN_CPU_SOFTMAX_INL_H_
#undef IOATTN_CPU_SOFTMAX_INL_H_
#else
#define IOATTN_CPU_SOFTMAX_INL_H_
#endif

#include <cmath>
#include <limits>

#include "common/online_softmax.h"
#include "cpu/scratch-inl.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ioattn::cpu {
namespace HWY_NAMESPACE {

// 2^d for the softmax exponent d = x - m <= 0 (or NaN, which only poisoned rows see), ~1.2 ULP.
// d = n + f with n = round(d) and f = d - n exact (Sterbenz) in [-1/2, 1/2]; 2^f is a degree-6
// polynomial (minimax for relative error on [-1/2, 1/2], 1.9e-9 in exact arithmetic, 1.19 ULP
// in fp32 Horner against 2^f in double), times 2^n. Below 2^-125 the result flushes to 0: such a
// term is under 2^-101 of the row max's own term (exactly 1), so it cannot change l or O in fp32.
// d = 0 gives exactly 1. Not hwy::Exp: in the natural domain it needs a two-constant Cody-Waite
// reduction and a range split for the scale, 30 vector ops per 8 scores against 13 here.
HWY_INLINE VF Exp2NonPositive(DF df, VF d) {
  const VF n = hn::Round(d);
  const VF f = hn::Sub(d, n);
  VF p = hn::Set(df, 1.5345809515565634e-4f);
  p = hn::MulAdd(p, f, hn::Set(df, 1.3399930903688073e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 9.618489071726799e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 5.550328642129898e-2f));
  p = hn::MulAdd(p, f, hn::Set(df, 2.4022646248340607e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 6.931471824645996e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 1.f));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  // AVX-512's vscalefps multiplies by 2^n in one instruction: exact, so the same bits as the
  // exponent-field add below while the result is normal (d >= -125), in 1 vector op instead of
  // 3 (convert, shift, add), and the flush rides on its zero-mask: 10 ops in all instead of 13.
  // The mask is "not less than" (unordered-true) so that a NaN d still yields NaN.
  const __mmask16 keep = _mm512_cmp_ps_mask(d.raw, _mm512_set1_ps(-125.f), _CMP_NLT_UQ);
  return VF{_mm512_maskz_scalef_ps(keep, p.raw, n.raw)};
#else
  // 2^n is built as a float and multiplied in, not added into p's exponent field: a NaN d
  // converts to an arbitrary integer (x86 saturates +NaN to INT_MAX), and adding that to p's
  // bits can make a finite number, while NaN times any 2^n stays NaN. Exact, so the same bits
  // as the exponent add for d >= -125 (n + 127 >= 2 is a normal exponent); one integer add more.
  const hn::RebindToSigned<DF> di;
  const auto pow2n = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127))));
  return hn::IfThenZeroElse(hn::Lt(d, hn::Set(df, -125.f)), hn::Mul(p, pow2n));
#endif
}

// A row's running max after a block whose max is m_blk: a NaN on either side stays NaN (std::max
// would drop it on one side), so a poisoned row stays poisoned through every later block.
inline float NextRowMax(float m_old, float m_blk) {
  return std::isnan(m_old) || std::isnan(m_blk) ? std::numeric_limits<float>::quiet_NaN() : std::max(m_old, m_blk);
}

// Online softmax of one block, vectorized over query rows (S^T is [key][row]), in the log2
// domain of common/online_softmax.h (as the CUDA kernel): scores are x = s * scale * log2(e)
// (one rounded multiply by a constant, done by ScoreTile as it stores S^T; with softcap
// c * log2(e) * tanh(s * scale / c)), the running max m and the exponent 2^(x - m) live in that
// domain, and the LSE converts back. Pass 1 caps the scores, hides masked ones, and takes the
// block max per row; then the header's scalar rules give each row its new max and rescale
// factor; pass 2 exponentiates in place (S^T becomes P^T) and accumulates l.
// kMaxDone (unmasked, no softcap): ScoreTile already left the block max in w.mblk and pass 1 has
// nothing else to do, so it is skipped; NaN, which x86's max may drop, is then caught by pass 2
// instead: a NaN score makes its p, so the row's sum, NaN (and only a NaN score or a +inf max,
// already poisoned, can), and the row's m and rescale factor become NaN before O is rescaled,
// as pass 1 would have made them.
// Keys [kb, ke) of the block: the rest are hidden from every row of the panel.
template <bool kMasked, bool kSoftcap, bool kMaxDone>
void SoftmaxBlock(const Panel& pn, int64_t kb, int64_t ke, float softcap, const Scratch& w) {
  static_assert(!kMaxDone || (!kMasked && !kSoftcap), "the score kernel's max is of unmasked, uncapped scores");
  const DF df;
  const VF vcap = hn::Set(df, softcap);
  const VF vcap_log2 = hn::Set(df, softcap * softmax::kLog2e);
  const VF neg_inf = hn::Set(df, -INFINITY);
  const VF pos_inf = hn::Set(df, INFINITY);
  const VF nan = hn::Set(df, std::numeric_limits<float>::quiet_NaN());
  // Locals: through the structs the compiler reloads the base and stride after every store.
  const int64_t mp = pn.mp, row0 = pn.row0;
  float* const st = w.st;
  for (int64_t r0 = row0; !kMaxDone && r0 < row0 + mp; r0 += kLanes) {
    VF mx = neg_inf, saw_nan = hn::Zero(df);
    const VF lo = hn::Load(df, w.lo + r0), hi = hn::Load(df, w.hi + r0);
    float* sp = st + kb * mp + (r0 - row0);
    for (int64_t j = kb; j < ke; ++j, sp += mp) {
      VF s = hn::Load(df, sp);
      if (kSoftcap) s = hn::Mul(vcap_log2, hn::Tanh(df, hn::Div(s, vcap)));
      if (kMasked) {
        const VF jf = hn::Set(df, static_cast<float>(j));
        s = hn::IfThenElse(hn::And(hn::Ge(jf, lo), hn::Lt(jf, hi)), s, neg_inf);
      }
      if (kSoftcap || kMasked) hn::Store(s, df, sp);
      mx = hn::Max(mx, s);
      saw_nan = hn::Or(saw_nan, hn::VecFromMask(df, hn::IsNaN(s)));
    }
    // NaN is never masked away (x86 max drops it), and an infinite score makes the reference's
    // exp(inf - inf) NaN: both make the row's max NaN, which the rescale factor then carries
    // into O and l.
    const auto poisoned = hn::Or(hn::MaskFromVec(saw_nan), hn::Eq(mx, pos_inf));
    hn::Store(hn::IfThenElse(poisoned, nan, mx), df, w.mblk + r0);
  }
  for (int64_t r = row0; r < row0 + mp; ++r) {
    const float m_old = w.m[r],
                m_blk = kMaxDone && w.mblk[r] == INFINITY ? std::numeric_limits<float>::quiet_NaN() : w.mblk[r];
    const float m_new = NextRowMax(m_old, m_blk);
    w.alpha[r] = softmax::rescale_factor(m_old, m_new, [](float x) { return std::exp2(x); });
    w.m[r] = m_new;
    w.mref[r] = softmax::max_for_exp(m_new);
  }
  for (int64_t r0 = row0; r0 < row0 + mp; r0 += kLanes) {
    const VF mref = hn::Load(df, w.mref + r0);
    VF sum = hn::Zero(df);
    float* sp = st + kb * mp + (r0 - row0);
    for (int64_t j0 = kb; j0 < ke; j0 += kSumChunk) {
      VF part = hn::Zero(df);
      for (int64_t j = j0; j < std::min(ke, j0 + kSumChunk); ++j, sp += mp) {
        const VF pj = Exp2NonPositive(df, hn::Sub(hn::Load(df, sp), mref));
        hn::Store(pj, df, sp);
        part = hn::Add(part, pj);
      }
      sum = hn::Add(sum, part);
    }
    VF alpha = hn::Load(df, w.alpha + r0);
    if (kMaxDone) {
      const auto saw_nan = hn::IsNaN(sum);
      alpha = hn::IfThenElse(saw_nan, nan, alpha);
      hn::Store(alpha, df, w.alpha + r0);
      hn::Store(hn::IfThenElse(saw_nan, nan, hn::Load(df, w.m + r0)), df, w.m + r0);
    }
    hn::Store(hn::MulAdd(hn::Load(df, w.l + r0), alpha, sum), df, w.l + r0);
  }
}

// Online softmax of one decode block along its keys, row by row (S is [row][key], stride
// kDecodeStride), with SoftmaxBlock's rules and log2 domain: key i of row r is visible iff
// lo[r] <= i < hi[r] (hi <= the block's key count, so lanes past it are masked too); NaN and +inf
// poison the row's max; the exponent is taken against max_for_exp of the new max.
template <bool kSoftcap>
void DecodeSoftmax(int64_t rows, float scale, float softcap, const Scratch& w, const float* lo, const float* hi) {
  const DF df;
  constexpr int64_t kVecs = kDecodeStride / kLanes;
  const VF vscale = hn::Set(df, kSoftcap ? scale : scale * softmax::kLog2e);
  const VF vcap = hn::Set(df, softcap);
  const VF vcap_log2 = hn::Set(df, softcap * softmax::kLog2e);
  const VF neg_inf = hn::Set(df, -INFINITY);
  const VF iota = hn::Iota(df, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = w.st + r * kDecodeStride;
    const VF vlo = hn::Set(df, lo[r]), vhi = hn::Set(df, hi[r]);
    VF mx = neg_inf, saw_nan = hn::Zero(df);
    // The masked scores go back in place (not into an array of vectors, which scalable vectors
    // cannot form) for the exponent pass to read.
    for (int64_t v = 0; v < kVecs; ++v) {
      VF s = hn::Mul(hn::Load(df, sr + v * kLanes), vscale);
      if (kSoftcap) s = hn::Mul(vcap_log2, hn::Tanh(df, hn::Div(s, vcap)));
      const VF key = hn::Add(iota, hn::Set(df, static_cast<float>(v * kLanes)));
      const VF x = hn::IfThenElse(hn::And(hn::Ge(key, vlo), hn::Lt(key, vhi)), s, neg_inf);
      hn::Store(x, df, sr + v * kLanes);
      mx = hn::Max(mx, x);
      saw_nan = hn::Or(saw_nan, hn::VecFromMask(df, hn::IsNaN(x)));
    }
    float m_blk = hn::GetLane(hn::MaxOfLanes(df, mx));
    if (!hn::AllFalse(df, hn::MaskFromVec(saw_nan)) || m_blk == INFINITY)
      m_blk = std::numeric_limits<float>::quiet_NaN();
    const float m_old = w.m[r];
    const float m_new = NextRowMax(m_old, m_blk);
    const float alpha = softmax::rescale_factor(m_old, m_new, [](float e) { return std::exp2(e); });
    const VF mref = hn::Set(df, softmax::max_for_exp(m_new));
    VF sum = hn::Zero(df);
    for (int64_t v = 0; v < kVecs; ++v) {
      const VF pv = Exp2NonPositive(df, hn::Sub(hn::Load(df, sr + v * kLanes), mref));
      hn::Store(pv, df, sr + v * kLanes);
      sum = hn::Add(sum, pv);
    }
    w.alpha[r] = alpha;
    w.m[r] = m_new;
    w.l[r] = w.l[r] * alpha + hn::GetLane(hn::SumOfLanes(df, sum));
  }
}

// O rows [r0, r1) *= the block's rescale factor, skipped where the max did not grow (alpha 1).
void RescaleRows(const Scratch& w, int64_t r0, int64_t r1, int64_t dvp) {
  const DF df;
  for (int64_t r = r0; r < r1; ++r) {
    if (w.alpha[r] == 1.f) continue;
    const VF a = hn::Set(df, w.alpha[r]);
    float* o = w.o + r * dvp;
    for (int64_t c = 0; c < dvp; c += kLanes) hn::Store(hn::Mul(hn::Load(df, o + c), a), df, o + c);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace ioattn::cpu
HWY_AFTER_NAMESPACE();

#endif  // IOATTN_CPU_SOFTMAX_INL_H_
