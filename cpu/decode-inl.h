// The decode pipeline: K/V streamed straight from the cache, every head of a sequence per task.
// Per-target code: included by cpu/flash_kernel.cc once for every Highway target.
#if defined(IOATTN_CPU_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef IOATTN_CPU_DECODE_INL_H_
#undef IOATTN_CPU_DECODE_INL_H_
#else
#define IOATTN_CPU_DECODE_INL_H_
#endif

#include <algorithm>
#include <type_traits>

#include "cpu/softmax-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace ioattn::cpu {
namespace HWY_NAMESPACE {

// Decode mode: K/V stream straight from the cache. Packing would convert each key to f32 into
// scratch and read it back, and score with a register tile whose 16 query rows are mostly empty
// at G = 4; here each K row is loaded once, widened in registers (PromoteTo, exact) and dotted
// with every row of its head, and each V row is loaded once per column chunk while it sits in
// L1, so every byte of the cache crosses the memory bus once.
//
// Arithmetic (D = Dv = 128, f16, G = 4): a key of one head is 256 + 256 bytes and costs
// 4 x 128 multiply-adds for the scores plus as many for P V, 4 flops per byte. At AVX-512 that
// is 64 vector FMAs per key and head, 32 cycles on two FMA ports: 512 bytes per 32 cycles is
// ~40 GB/s per core at 2.5 GHz, so a core can outrun its share of DRAM (about 12 GB/s on a
// server) if nothing else costs more than the FMAs. Two things used to: a horizontal sum per
// (key, row) (10 shuffles and adds each, more than the key's 8 FMAs per row at AVX-512), and a
// softmax vectorized over the 4 rows of a head (12 of 16 lanes idle). Now the dot products of
// kGroupKeys = lanes consecutive keys are reduced together by a transposed tree (DecodeScore,
// lanes - 1 pairwise-sum steps of 3 ops per lanes keys: under 3 ops per key and row instead of
// 10) whose result is one vector of the keys' scores, and the softmax runs along the keys.

// The transposed reduction needs a power-of-two lane count that divides the softmax block;
// elsewhere (scalable vectors wider than 16 lanes) each key is reduced on its own.
constexpr bool kTreeReduce = kLanes >= 2 && kLanes <= kDecodeKeys && (kLanes & (kLanes - 1)) == 0;
constexpr int64_t kGroupKeys = kTreeReduce ? kLanes : 1;
// x86 below AVX-512 has 16 vector registers, AVX-512 and Arm 32. The score step keeps
// 4 rows x kStepKeys accumulators (8 or 16) plus kStepKeys K vectors live, the P V tile
// 4 rows x kDecodeColVecs accumulators plus as many V vectors and a broadcast: 12 + 3 + 1 fill
// 16 registers, and 12 chains give the two FMA pipes' 8 in flight a third of slack.
constexpr bool kWideRegisterFile = !(HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3);
constexpr int kStepKeys = !kTreeReduce ? 1 : kLanes >= 4 && kWideRegisterFile ? 4 : 2;
constexpr int kDecodeColVecs = kWideRegisterFile ? 4 : 3;

// Column vectors of the next P V chunk with `left` whole vectors of Dv to go. Three-vector chunks
// leave 4 or 2 vectors to chunks of 2 (16 = 3 + 3 + 3 + 3 + 2 + 2): a one-vector chunk has 4
// chains, half of what the FMA pipes need in flight.
HWY_INLINE int64_t PvChunkVecs(int64_t left) {
  if (kDecodeColVecs == 3 && (left == 2 || left == 4)) return 2;
  return left >= kDecodeColVecs ? kDecodeColVecs : 1;
}

// P V's column chunks over the whole vectors of dv.
inline int64_t PvChunks(int64_t dv) {
  int64_t n = 0;
  for (int64_t left = dv / kLanes; left > 0; left -= PvChunkVecs(left)) ++n;
  return n;
}

// Lanes of a's pairwise sums, then b's: one level of the transposed reduction. Applied to
// neighbours level by level, lanes vectors become one whose lane i is the sum of vector i. The
// single-lane target has no ConcatEven and reduces each key on its own (kTreeReduce): there it
// is only declared, for the branches if constexpr discards.
#if HWY_TARGET != HWY_SCALAR
template <class D>
HWY_INLINE hn::Vec<D> PairSums(D d, hn::Vec<D> a, hn::Vec<D> b) {
  return hn::Add(hn::ConcatEven(d, b, a), hn::ConcatOdd(d, b, a));
}
#else
template <class D>
hn::Vec<D> PairSums(D d, hn::Vec<D> a, hn::Vec<D> b);
#endif

// Level `level` of the transposed reduction (0 pairs the sums of single keys). PairSums costs two
// lane-crossing two-table permutes per pair, each of which overwrites a source and so needs a
// register copy beside it. On x86 the first two levels stay inside 128-bit blocks (unpacks of
// 32-bit, then 64-bit lanes, which leave each block as [k0 k1 k2 k3] of its part of D) and the
// rest move whole blocks (AVX2: the halves; AVX-512: 4 of the 8 blocks of two vectors, keeping
// their order), all with non-destructive operands; lane i is still the sum of vector i.
template <int level, class D>
HWY_INLINE hn::Vec<D> Fold(D d, hn::Vec<D> a, hn::Vec<D> b) {
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX2 || HWY_TARGET <= HWY_AVX3)
  constexpr size_t kBlocks = hn::MaxLanes(D()) / 4;
  static_assert((kBlocks == 2 || kBlocks == 4) && level < 2 + kBlocks / 2, "levels fold the lanes of 2 or 4 blocks");
  if constexpr (level == 0) return hn::Add(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b));
  if constexpr (level == 1) {
    const hn::Repartition<double, D> dd;
    const auto a2 = hn::BitCast(dd, a), b2 = hn::BitCast(dd, b);
    return hn::Add(hn::BitCast(d, hn::InterleaveLower(dd, a2, b2)), hn::BitCast(d, hn::InterleaveUpper(dd, a2, b2)));
  }
#if HWY_TARGET <= HWY_AVX3
  // Blocks 0 and 2 of a then of b, plus blocks 1 and 3: neighbouring blocks summed, in order.
  return hn::Vec<D>{_mm512_add_ps(_mm512_shuffle_f32x4(a.raw, b.raw, _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(a.raw, b.raw, _MM_SHUFFLE(3, 1, 3, 1)))};
#else
  return hn::Add(hn::ConcatLowerLower(d, b, a), hn::ConcatUpperUpper(d, b, a));
#endif
#else
  return PairSums(d, a, b);
#endif
}

// Software prefetch of a later softmax block: a head's K and V rows of block n + prefetch_blocks
// (the plan's distance, 1 unless a calibration measured better; 32 x 512 bytes at D = 128 in f16)
// are requested while the same head computes block n, a few lines per inner step of the score
// and P V loops (per_step = lines / steps, 2 at AVX-512 and D = 128), so the requests overlap the
// arithmetic instead of queueing behind each other: a burst of the whole block's requests at its
// start stalls on the L1 fill buffers. The requests are prefetcht2 (into L2), not prefetcht0: the
// lines are used blocks later, after all other heads' blocks have passed through L1, so L1 would
// not keep them anyway.
struct LineQueue {
  const char* const* rows;
  int64_t nrows, row_bytes, per_step;
  // The line being issued and the end of its row, as integers (the last step may pass the
  // cache's end): a compare and an add per line, each row's pointer read once.
  int64_t row = 0;
  uintptr_t at = 0, stop = 0;
  HWY_INLINE void Issue() {
    for (int64_t n = 0; n < per_step; ++n) {
      if (at >= stop) {
        if (row == nrows) return;
        at = reinterpret_cast<uintptr_t>(rows[row++]);
        stop = at + uintptr_t(row_bytes);
      }
      __builtin_prefetch(reinterpret_cast<const void*>(at), 0, 1);
      at += 64;
    }
  }
};

// 16-register targets issue from the score loop only: P V's loop there, its 16 vector registers
// all taken by the 4 x 3 tile, loses more to the queue's steps than their finer spread is worth.
constexpr bool kPvIssues = kWideRegisterFile;

// The first C of x0..x3 widened from p, `stride` elements apart; the rest zero (never read).
template <int C, class T>
HWY_INLINE void LoadWideRow(const T* p, int64_t stride, VF& x0, VF& x1, VF& x2, VF& x3) {
  const DF df;
  x0 = LoadWide(p);
  x1 = C > 1 ? LoadWide(p + stride) : hn::Zero(df);
  x2 = C > 2 ? LoadWide(p + 2 * stride) : hn::Zero(df);
  x3 = C > 3 ? LoadWide(p + 3 * stride) : hn::Zero(df);
}

// A row's kStepKeys accumulators folded to one vector: lane i sums key i's dot product (the
// first kStepLevels levels of the transposed reduction).
constexpr int kStepLevels = kStepKeys == 4 ? 2 : kStepKeys == 2 ? 1 : 0;
template <class D>
HWY_INLINE hn::Vec<D> FoldStep(D df, hn::Vec<D> a0, hn::Vec<D> a1, hn::Vec<D> a2, hn::Vec<D> a3) {
  if constexpr (kStepKeys == 4) return Fold<1>(df, Fold<0>(df, a0, a1), Fold<0>(df, a2, a3));
  if constexpr (kStepKeys == 2) return Fold<0>(df, a0, a1);
  (void)a1, (void)a2, (void)a3;
  return a0;
}

// v, kept in a register for its uses: GCC folds a Q row's load into each key's FMA as a memory
// operand, which doubles the score step's loads (10 per 8 FMAs at two keys) where the register
// file has room for the row.
HWY_INLINE VF InRegister(VF v) {
#if HWY_ARCH_X86 && (HWY_COMPILER_GCC || HWY_COMPILER_CLANG) && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  asm("" : "+v"(v.raw));
#endif
  return v;
}

// One step of DecodeScore: keys kr[0, kStepKeys) against the R rows of q over the whole vectors
// of D (dv elements), each row's sums folded into p0..p3.
template <class T, int R>
HWY_INLINE void DecodeStep(const T* const* kr, const float* q, int64_t dv, LineQueue& lq, VF& p0, VF& p1, VF& p2,
                           VF& p3) {
  static_assert(1 <= R && R <= 4 && kStepKeys <= 4, "the named accumulators cover 4 rows x 4 keys");
  const DF df;
  const VF z = hn::Zero(df);
  VF a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
  VF a20 = z, a21 = z, a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
  const T* k0 = kr[0];
  const T* k1 = kr[kStepKeys > 1 ? 1 : 0];
  const T* k2 = kr[kStepKeys > 2 ? 2 : 0];
  const T* k3 = kr[kStepKeys > 3 ? 3 : 0];
  for (int64_t d = 0; d < dv; d += kLanes) {
    lq.Issue();
    const VF x0 = LoadWide(k0 + d);
    const VF x1 = kStepKeys > 1 ? LoadWide(k1 + d) : z;
    const VF x2 = kStepKeys > 2 ? LoadWide(k2 + d) : z;
    const VF x3 = kStepKeys > 3 ? LoadWide(k3 + d) : z;
    const float* qd = q + kDecodeRowChunk * d;
    MulAddRow<kStepKeys>(InRegister(hn::LoadU(df, qd)), x0, x1, x2, x3, a00, a01, a02, a03);
    if constexpr (R > 1)
      MulAddRow<kStepKeys>(InRegister(hn::LoadU(df, qd + kLanes)), x0, x1, x2, x3, a10, a11, a12, a13);
    if constexpr (R > 2)
      MulAddRow<kStepKeys>(InRegister(hn::LoadU(df, qd + 2 * kLanes)), x0, x1, x2, x3, a20, a21, a22, a23);
    if constexpr (R > 3)
      MulAddRow<kStepKeys>(InRegister(hn::LoadU(df, qd + 3 * kLanes)), x0, x1, x2, x3, a30, a31, a32, a33);
  }
  p0 = FoldStep(df, a00, a01, a02, a03);
  p1 = FoldStep(df, a10, a11, a12, a13);
  p2 = FoldStep(df, a20, a21, a22, a23);
  p3 = FoldStep(df, a30, a31, a32, a33);
}

// Row r's group sums into s: the kGroupKeys scores as one vector, or their one lane's total
// where keys are reduced one by one.
HWY_INLINE void StoreGroupScores(DF df, VF sums, float* s) {
  if constexpr (kTreeReduce) {
    hn::StoreU(sums, df, s);
  } else {
    s[0] = hn::GetLane(hn::SumOfLanes(df, sums));
  }
}

// s[r * kDecodeStride + i] = K_i . Q_r for the kGroupKeys keys krows[i] and R query rows. q: the
// chunk's rows in DecodeQ's layout, so that one pointer serves all rows. kStepKeys keys share
// each Q load; their sums are folded in registers to one vector per row, and the group's
// kGroupKeys / kStepKeys such vectors per row are folded pairwise as the steps complete
// (((0, 1), (2, 3)) for four). The tail of D past the last whole vector is scalar.
template <class T, int R>
void DecodeScore(const T* const* krows, const float* q, int64_t D, float* s, LineQueue& pq) {
  const DF df;
  constexpr int64_t kSteps = kGroupKeys / kStepKeys;
  static_assert(kSteps == 1 || kSteps == 2 || kSteps == 4, "the pairwise fold covers 1, 2 or 4 steps");
  const int64_t dv = D / kLanes * kLanes;
  // A local copy stays in registers; through the reference every step stored its cursor back.
  LineQueue lq = pq;
  VF s0, s1, s2, s3;
  DecodeStep<T, R>(krows, q, dv, lq, s0, s1, s2, s3);
  if constexpr (kSteps > 1) {
    VF t0, t1, t2, t3;
    DecodeStep<T, R>(krows + kStepKeys, q, dv, lq, t0, t1, t2, t3);
    constexpr int L = kStepLevels;
    s0 = Fold<L>(df, s0, t0), s1 = Fold<L>(df, s1, t1), s2 = Fold<L>(df, s2, t2), s3 = Fold<L>(df, s3, t3);
  }
  if constexpr (kSteps > 2) {
    VF t0, t1, t2, t3, u0, u1, u2, u3;
    DecodeStep<T, R>(krows + 2 * kStepKeys, q, dv, lq, t0, t1, t2, t3);
    DecodeStep<T, R>(krows + 3 * kStepKeys, q, dv, lq, u0, u1, u2, u3);
    constexpr int L = kStepLevels;
    s0 = Fold<L + 1>(df, s0, Fold<L>(df, t0, u0));
    s1 = Fold<L + 1>(df, s1, Fold<L>(df, t1, u1));
    s2 = Fold<L + 1>(df, s2, Fold<L>(df, t2, u2));
    s3 = Fold<L + 1>(df, s3, Fold<L>(df, t3, u3));
  }
  pq = lq;
  StoreGroupScores(df, s0, s);
  if constexpr (R > 1) StoreGroupScores(df, s1, s + kDecodeStride);
  if constexpr (R > 2) StoreGroupScores(df, s2, s + 2 * kDecodeStride);
  if constexpr (R > 3) StoreGroupScores(df, s3, s + 3 * kDecodeStride);
  if (dv == D) return;
  for (int r = 0; r < R; ++r)
    for (int64_t i = 0; i < kGroupKeys; ++i) {
      float x = 0.f;
      for (int64_t e = dv; e < D; ++e)
        x += load_as_f32(krows[i], e, kDTypeOf<T>) * q[kDecodeRowChunk * dv + r * (D - dv) + (e - dv)];
      s[r * kDecodeStride + i] += x;
    }
}

template <class T>
void DecodeScoreRows(int R, const T* const* krows, const float* q, int64_t D, float* s, LineQueue& pq) {
  switch (R) {
    case 1: return DecodeScore<T, 1>(krows, q, D, s, pq);
    case 2: return DecodeScore<T, 2>(krows, q, D, s, pq);
    case 3: return DecodeScore<T, 3>(krows, q, D, s, pq);
    default: return DecodeScore<T, 4>(krows, q, D, s, pq);
  }
}

// O[r][col + c * lanes ...] += sum_{j in [a, e)} P[r][j] * V_j[col + c * lanes ...] for R rows
// and C vectors of columns, V rows read from the cache (vrows[j]). p: P at row 0 of the chunk
// (row stride kDecodeStride); o: O at the chunk's first row (stride dvp).
template <class T, int R, int C>
void DecodePv(const void* const* vrows, int64_t a, int64_t e, const float* p, int64_t col, float* o, int64_t dvp,
              LineQueue& pq) {
  static_assert(1 <= R && R <= 4, "the named accumulators cover 4 rows");
  const DF df;
  const VF z = hn::Zero(df);
  VF a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
  VF a20 = z, a21 = z, a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
  LineQueue lq = pq;
  for (int64_t j = a; j < e; ++j) {
    if constexpr (kPvIssues) lq.Issue();
    VF v0, v1, v2, v3;
    LoadWideRow<C>(static_cast<const T*>(vrows[j]) + col, kLanes, v0, v1, v2, v3);
    const float* pj = p + j;
    MulAddRow<C>(hn::Set(df, pj[0]), v0, v1, v2, v3, a00, a01, a02, a03);
    if constexpr (R > 1) MulAddRow<C>(hn::Set(df, pj[kDecodeStride]), v0, v1, v2, v3, a10, a11, a12, a13);
    if constexpr (R > 2) MulAddRow<C>(hn::Set(df, pj[2 * kDecodeStride]), v0, v1, v2, v3, a20, a21, a22, a23);
    if constexpr (R > 3) MulAddRow<C>(hn::Set(df, pj[3 * kDecodeStride]), v0, v1, v2, v3, a30, a31, a32, a33);
  }
  pq = lq;
  float* oc = o + col;
  AddRowTo<C>(df, oc, a00, a01, a02, a03);
  if constexpr (R > 1) AddRowTo<C>(df, oc + dvp, a10, a11, a12, a13);
  if constexpr (R > 2) AddRowTo<C>(df, oc + 2 * dvp, a20, a21, a22, a23);
  if constexpr (R > 3) AddRowTo<C>(df, oc + 3 * dvp, a30, a31, a32, a33);
}

template <class T, int C>
void DecodePvRows(int R, const void* const* vrows, int64_t a, int64_t e, const float* p, int64_t col, float* o,
                  int64_t dvp, LineQueue& pq) {
  switch (R) {
    case 1: return DecodePv<T, 1, C>(vrows, a, e, p, col, o, dvp, pq);
    case 2: return DecodePv<T, 2, C>(vrows, a, e, p, col, o, dvp, pq);
    case 3: return DecodePv<T, 3, C>(vrows, a, e, p, col, o, dvp, pq);
    default: return DecodePv<T, 4, C>(vrows, a, e, p, col, o, dvp, pq);
  }
}

// Rows [r0, r0 + R) += P V over keys [a, e) of the block, every column of Dv.
template <class T>
void DecodePvRange(const Geometry& g, int R, int64_t r0, int64_t a, int64_t e, const Scratch& w, LineQueue& pq) {
  if (a >= e) return;
  const int64_t full = g.Dv / kLanes * kLanes;
  const float* p = w.st + r0 * kDecodeStride;
  float* o = w.o + r0 * g.Dvp;
  int64_t col = 0;
  while (col < full) {
    const int64_t c = PvChunkVecs((full - col) / kLanes);
    if (c == kDecodeColVecs)
      DecodePvRows<T, kDecodeColVecs>(R, w.vrows, a, e, p, col, o, g.Dvp, pq);
    else if (c == 2)
      DecodePvRows<T, 2>(R, w.vrows, a, e, p, col, o, g.Dvp, pq);
    else
      DecodePvRows<T, 1>(R, w.vrows, a, e, p, col, o, g.Dvp, pq);
    col += c * kLanes;
  }
  for (; col < g.Dv; ++col)
    for (int64_t r = 0; r < R; ++r) {
      float part = 0.f;
      for (int64_t j = a; j < e; ++j) part += p[r * kDecodeStride + j] * load_as_f32(w.vrows[j], col, kDTypeOf<T>);
      o[r * g.Dvp + col] += part;
    }
}

// One kv head's pass over one softmax block of nk keys: scores, softmax, P V into w's state.
// kpos / vpos: head 0's K and V rows at the block's positions (kpos padded to kDecodeStride with
// the last key); koff / voff: this head's offsets from them; w0: the rows' ranges in the block.
template <class T>
void DecodeHeadBlock(const AttnParams& p, const Geometry& g, int64_t rows, int64_t nk, const T* const* kpos,
                     const T* const* vpos, int64_t koff, int64_t voff, const Scratch& w, const Scratch& w0,
                     LineQueue& pq) {
  const T* krows[kDecodeStride];
  for (int64_t i = 0; i < kDecodeStride; ++i) krows[i] = kpos[i] + koff;
  // Through w.vrows itself each store may alias the Scratch and the pointer is reloaded per key.
  const void** vrows = w.vrows;
  for (int64_t i = 0; i < nk; ++i) vrows[i] = vpos[i] + voff;
  for (int64_t i = 0; i < nk; i += kGroupKeys)
    for (int64_t r0 = 0; r0 < rows; r0 += kDecodeRowChunk) {
      const int R = static_cast<int>(std::min<int64_t>(kDecodeRowChunk, rows - r0));
      DecodeScoreRows<T>(R, krows + i, w.qt + r0 * g.D, g.D, w.st + r0 * kDecodeStride + i, pq);
    }
  if (p.softcap > 0.f)
    DecodeSoftmax<true>(rows, p.scale, p.softcap, w, w0.lo, w0.hi);
  else
    DecodeSoftmax<false>(rows, p.scale, p.softcap, w, w0.lo, w0.hi);
  RescaleRows(w, 0, rows, g.Dvp);
  // Keys every row of a chunk sees go through the chunk's register tile; the rest row by row.
  for (int64_t r0 = 0; r0 < rows; r0 += kDecodeRowChunk) {
    const int R = static_cast<int>(std::min<int64_t>(kDecodeRowChunk, rows - r0));
    const SharedKeys k = IntersectRowRanges(w0.lo, w0.hi, r0, r0 + R, nk);
    if (k.fast) DecodePvRange<T>(g, R, r0, k.a, k.e, w, pq);
    ForRowRemainders(w0.lo, w0.hi, r0, r0 + R, k,
                     [&](int64_t r, int64_t a, int64_t e) { DecodePvRange<T>(g, 1, r, a, e, w, pq); });
  }
}

// rows[i] = head 0's row of position j + i for i < n: one row lookup per run of positions one
// sequence stride apart (the whole span of a dense or packed cache, a page of a paged one) and
// adds within it, where a lookup per key weighs on a decode with one query row.
template <class T>
void RowPointers(const T* base, const AttnParams& p, int64_t b, const SeqSpan& seq, int64_t j, int64_t n,
                 int64_t batch_stride, int64_t seq_stride, const T** rows) {
  for (int64_t i = 0; i < n;) {
    const T* r = base + kv_row_offset(p, b, seq, j + i, batch_stride, seq_stride);
    const int64_t run = p.block_table ? std::min(n - i, p.page_size - (j + i) % p.page_size) : n - i;
    // A running pointer: r + t * seq_stride vectorizes into emulated 64-bit multiplies on AVX2.
    // It stops on the run's last row: one stride further may lie outside the address space.
    for (const int64_t end = i + run;;) {
      rows[i] = r;
      if (++i == end) break;
      r += seq_stride;
    }
  }
}

// One decode task: keys [kb, ke) of sequence b (its split's whole key range) for ALL kv heads,
// in softmax blocks of kDecodeKeys positions from kb, head by head within a block; or, where each
// head's keys lie closer together than a position's heads (a head-major cache), head by head
// over all blocks: then each head is two sequential streams, K and V, as in a plain read, where
// blocks outermost would walk Hkv streams of each at once. State per head (ws[hk]) follows
// RunTileBlocks' rules: a hidden key's score is -inf by select, and P V gives each row only the
// keys it sees, so a NaN in a hidden V row never reaches it.
template <class T>
void DecodeRange(const AttnParams& p, const Geometry& g, int64_t b, const SeqSpan& seq, int64_t rows, int64_t kb,
                 int64_t ke, const Scratch* ws) {
  const T* kbase = static_cast<const T*>(p.k);
  const T* vbase = static_cast<const T*>(p.v);
  const Scratch& w0 = ws[0];
  // Head 0's rows at the block's positions and the next block's; head hk's are hk head strides
  // further.
  const T *kpos[kDecodeStride], *vpos[kDecodeKeys], *knext[kDecodeKeys], *vnext[kDecodeKeys];
  const char* ahead[2 * kDecodeKeys];
  const int64_t row_bytes = std::max(g.D, g.Dv) * int64_t(sizeof(T));
  const bool whole_positions = g.D == g.Dv && p.k_head_stride == g.D && p.v_head_stride == g.Dv;
  // Inner steps of one head's block (a full block) that issue prefetches: the score loop's vector
  // steps per key group and, where P V issues, its keys per column chunk, per chunk of rows.
  const int64_t chunks = (rows + kDecodeRowChunk - 1) / kDecodeRowChunk;
  const int64_t steps = std::max<int64_t>(
      1, chunks * ((kDecodeKeys / kStepKeys) * (g.D / kLanes) + (kPvIssues ? kDecodeKeys * PvChunks(g.Dv) : 0)));
  const bool heads_outer = p.k_seq_stride < p.k_head_stride && p.v_seq_stride < p.v_head_stride;
  const int64_t head_group = heads_outer ? 1 : g.heads_kv;
  for (int64_t h0 = 0; h0 < g.heads_kv; h0 += head_group) {
    for (int64_t j0 = kb; j0 < ke; j0 += kDecodeKeys) {
      const int64_t nk = std::min(kDecodeKeys, ke - j0);
      // Rows that see none of the block keep their state exactly (alpha 1, p 0).
      if (!ClampRowRanges(w0, rows, j0, nk)) continue;
      // Lanes past the block's last key score a copy of it, then the softmax masks them.
      // The block prefetch_blocks ahead (none at 0), within this split's keys.
      const int64_t jn = j0 + g.prefetch_blocks * kDecodeKeys;
      const int64_t nn = g.prefetch_blocks > 0 ? std::clamp<int64_t>(ke - jn, 0, kDecodeKeys) : 0;
      RowPointers(kbase, p, b, seq, j0, nk, p.k_batch_stride, p.k_seq_stride, kpos);
      for (int64_t i = nk; i < kDecodeStride; ++i) kpos[i] = kpos[nk - 1];
      RowPointers(vbase, p, b, seq, j0, nk, p.v_batch_stride, p.v_seq_stride, vpos);
      RowPointers(kbase, p, b, seq, jn, nn, p.k_batch_stride, p.k_seq_stride, knext);
      RowPointers(vbase, p, b, seq, jn, nn, p.v_batch_stride, p.v_seq_stride, vnext);
      // When a position's heads lie side by side (head stride = row length, as in [S][Hkv][D]
      // caches and their pages), one queue walks the whole next block in address order, K then V
      // of each position (Hkv x D elements each), paced over all heads' inner steps of this block:
      // DRAM then sees two ascending streams, as a plain read does, instead of each head's rows
      // 2 KiB apart revisited Hkv times.
      // Otherwise each head queues its own rows of the next block.
      // next_block_queue: the next block's rows from head offsets koff / voff, `bytes` each,
      // spread over `over_steps` inner steps.
      auto next_block_queue = [&](int64_t koff, int64_t voff, int64_t bytes, int64_t over_steps) {
        for (int64_t i = 0; i < nn; ++i) {
          ahead[2 * i] = reinterpret_cast<const char*>(knext[i] + koff);
          ahead[2 * i + 1] = reinterpret_cast<const char*>(vnext[i] + voff);
        }
        return LineQueue{ahead, 2 * nn, bytes, (2 * nn * ((bytes + 63) / 64) + over_steps - 1) / over_steps};
      };
      LineQueue block_queue{};
      if (whole_positions) block_queue = next_block_queue(0, 0, g.heads_kv * row_bytes, steps * g.heads_kv);
      for (int64_t hk = h0; hk < h0 + head_group; ++hk) {
        const int64_t koff = hk * p.k_head_stride, voff = hk * p.v_head_stride;
        LineQueue head_queue{};
        if (!whole_positions) head_queue = next_block_queue(koff, voff, row_bytes, steps);
        DecodeHeadBlock<T>(p, g, rows, nk, kpos, vpos, koff, voff, ws[hk], w0,
                           whole_positions ? block_queue : head_queue);
      }
    }
  }
}

// One decode task (decode mode): split `split` of sequence b for all kv heads, leaving the
// outputs, or the partials of tiles tile0 + hk (layout as in tile mode: [tile][split]).
void DecodeTask(const AttnParams& p, const Geometry& g, int64_t b, int64_t split, unsigned char* base, float* partials,
                int64_t tile0) {
  Scratch* ws = reinterpret_cast<Scratch*>(base + g.off[kViews]);
  int64_t u0 = 0, u1 = 0, nb = 0;
  for (int64_t hk = 0; hk < g.heads_kv; ++hk) {
    ws[hk] = CarveScratch(g, base, hk);
    const Tile t = MakeTile(p, g, b, hk, 0);
    PrepareTile(p, g, t, ws[hk], true, &u0, &u1, &nb);
    ResetState(ws[hk], t.mp, g.Dvp);
  }
  const Tile t0 = MakeTile(p, g, b, 0, 0);
  // The visible keys [u0, u1) are cut into splits of whole softmax blocks, as even as blocks
  // allow: a split's time is its share of the keys and the call waits for the longest (block_kv's
  // 1008-key units, which only the packed path uses, had cut one 4096-key sequence 1072 / 3024).
  const int64_t blocks = u1 > u0 ? (u1 - u0 + kDecodeKeys - 1) / kDecodeKeys : 0;
  const int64_t kb = u0 + split * blocks / g.splits * kDecodeKeys;
  const int64_t ke = std::min(u1, u0 + (split + 1) * blocks / g.splits * kDecodeKeys);
  if (blocks > 0 && kb < ke) {
    switch (p.kv_dtype) {
      case DType::f16: DecodeRange<hwy::float16_t>(p, g, b, t0.seq, t0.rows, kb, ke, ws); break;
      case DType::bf16: DecodeRange<hwy::bfloat16_t>(p, g, b, t0.seq, t0.rows, kb, ke, ws); break;
      default: DecodeRange<float>(p, g, b, t0.seq, t0.rows, kb, ke, ws); break;
    }
  }
  for (int64_t hk = 0; hk < g.heads_kv; ++hk) {
    const Scratch& w = ws[hk];
    FinishTile(p, g, MakeTile(p, g, b, hk, 0), w,
               partials ? partials + ((tile0 + hk) * g.splits + split) * g.partial_floats : nullptr);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace ioattn::cpu
HWY_AFTER_NAMESPACE();

#endif  // IOATTN_CPU_DECODE_INL_H_
