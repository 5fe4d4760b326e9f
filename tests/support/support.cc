#include "tests/support/support.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "common/backend.h"
#include "common/reference.h"
#include "hwy/targets.h"
#include "tests/catch.h"

namespace ioattn::test {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Element strides of a layout: the order decides nesting, pads open gaps that must stay NaN.
void strides_of(const Layout& l, int64_t seqlen, int64_t heads, int64_t dim, int64_t* sb, int64_t* ss, int64_t* sh) {
  if (l.order == Layout::bshd) {
    *sh = dim + l.row_pad;
    *ss = heads * *sh + l.outer_pad;
    *sb = seqlen * *ss;
  } else {
    *ss = dim + l.row_pad;
    *sh = seqlen * *ss + l.outer_pad;
    *sb = heads * *sh;
  }
  if (l.broadcast_batch) *sb = 0;
  if (l.broadcast_seq) *ss = 0;
  if (l.broadcast_heads) *sh = 0;
}

}  // namespace

Tensor::Tensor(DType dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t dim, const Layout& layout)
    : dtype_(dtype), batch_(batch), seqlen_(seqlen), heads_(heads), dim_(dim) {
  strides_of(layout, seqlen, heads, dim, &stride_b_, &stride_s_, &stride_h_);
  const bool empty = batch == 0 || seqlen == 0 || heads == 0 || dim == 0;
  span_ = empty ? 0 : (batch - 1) * stride_b_ + (seqlen - 1) * stride_s_ + (heads - 1) * stride_h_ + dim;
  bytes_.assign(2 * kGuard + size_t(span_) * size_t(dtype_bytes(dtype)), kGuardByte);
  logical_.assign(size_t(span_), 0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seqlen; ++s)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < dim; ++d) logical_[size_t(offset(b, s, h) + d)] = 1;
  fill_nan();
}

float Tensor::get(int64_t b, int64_t s, int64_t h, int64_t d) const {
  return load_as_f32(data(), offset(b, s, h) + d, dtype_);
}

void Tensor::set(int64_t b, int64_t s, int64_t h, int64_t d, float value) {
  store_from_f32(data(), offset(b, s, h) + d, dtype_, value);
}

void Tensor::fill(const std::function<float(int64_t, int64_t, int64_t, int64_t)>& f) {
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t s = 0; s < seqlen_; ++s)
      for (int64_t h = 0; h < heads_; ++h)
        for (int64_t d = 0; d < dim_; ++d) set(b, s, h, d, f(b, s, h, d));
}

void Tensor::fill_normal(std::mt19937& rng, float stddev) {
  std::normal_distribution<float> dist(0.f, stddev);
  fill([&](int64_t, int64_t, int64_t, int64_t) { return dist(rng); });
}

void Tensor::fill_nan() {
  for (int64_t i = 0; i < span_; ++i) store_from_f32(data(), i, dtype_, kNaN);
}

bool Tensor::guards_intact() const {
  const size_t tail = kGuard + size_t(span_) * size_t(dtype_bytes(dtype_));
  for (size_t i = 0; i < kGuard; ++i)
    if (bytes_[i] != kGuardByte || bytes_[tail + i] != kGuardByte) return false;
  return true;
}

bool Tensor::padding_intact() const {
  const int eb = dtype_bytes(dtype_);
  unsigned char nan_bits[4];
  {
    std::vector<unsigned char> one(static_cast<size_t>(eb));
    store_from_f32(one.data(), 0, dtype_, kNaN);
    std::memcpy(nan_bits, one.data(), size_t(eb));
  }
  const unsigned char* base = bytes_.data() + kGuard;
  for (int64_t i = 0; i < span_; ++i)
    if (!logical_[size_t(i)] && std::memcmp(base + i * eb, nan_bits, size_t(eb)) != 0) return false;
  return true;
}

ioattn_tensor Tensor::abi() {
  return {data(), static_cast<int32_t>(dtype_), batch_, seqlen_, heads_, dim_, stride_b_, stride_s_, stride_h_};
}

std::string AttnCase::describe() const {
  std::ostringstream o;
  o << "B=" << batch << " Hq=" << heads_q << " Hkv=" << heads_kv << " Sq=" << seqlen_q << " Sk=" << seqlen_k
    << " D=" << head_dim << " Dv=" << dv() << " dtype=" << dtype_name(dtype) << " causal=" << causal << " window=("
    << window_left << "," << window_right << ") softcap=" << softcap << " scale=" << scale << " threads=" << threads
    << " tiling=(" << tiling.block_q << "," << tiling.block_kv << "," << tiling.kv_splits
    << ") plan=" << (tiling.profile ? tiling.profile->name : "host");
  return o.str();
}

AttnBuffers::AttnBuffers(const AttnCase& c)
    : q(c.dtype, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.q_layout),
      k(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.k_layout),
      v(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.dv(), c.v_layout),
      out(c.dtype, c.batch, c.seqlen_q, c.heads_q, c.dv(), c.o_layout) {
  if (c.with_lse) lse.assign(size_t(c.batch * c.heads_q * c.seqlen_q), kNaN);
}

void AttnBuffers::randomize(std::mt19937& rng, float stddev) {
  q.fill_normal(rng, stddev);
  k.fill_normal(rng, stddev);
  v.fill_normal(rng, stddev);
}

void AttnBuffers::reset_outputs() {
  out.fill_nan();
  std::fill(lse.begin(), lse.end(), kNaN);
}

AttnParams make_params(const AttnCase& c, AttnBuffers& bufs) {
  AttnParams p;
  p.q = bufs.q.data();
  p.k = bufs.k.data();
  p.v = bufs.v.data();
  p.out = bufs.out.data();
  p.lse = bufs.lse.empty() ? nullptr : bufs.lse.data();
  p.io_dtype = p.kv_dtype = c.dtype;
  p.batch = c.batch;
  p.heads_q = c.heads_q;
  p.heads_kv = c.heads_kv;
  p.head_dim = c.head_dim;
  p.head_dim_v = c.dv();
  p.seqlen_q = c.seqlen_q;
  p.seqlen_k = c.seqlen_k;
  p.q_batch_stride = bufs.q.stride_batch();
  p.q_seq_stride = bufs.q.stride_seq();
  p.q_head_stride = bufs.q.stride_head();
  p.k_batch_stride = bufs.k.stride_batch();
  p.k_seq_stride = bufs.k.stride_seq();
  p.k_head_stride = bufs.k.stride_head();
  p.v_batch_stride = bufs.v.stride_batch();
  p.v_seq_stride = bufs.v.stride_seq();
  p.v_head_stride = bufs.v.stride_head();
  p.o_batch_stride = bufs.out.stride_batch();
  p.o_seq_stride = bufs.out.stride_seq();
  p.o_head_stride = bufs.out.stride_head();
  p.lse_batch_stride = c.heads_q * c.seqlen_q;
  p.lse_head_stride = c.seqlen_q;
  p.scale = c.scale != 0.f ? c.scale : float(1.0 / std::sqrt(double(c.head_dim)));
  p.softcap = c.softcap;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.num_threads = c.threads;
  p.tiling = c.tiling;
  return p;
}

Status run_cpu_kernel(const AttnCase& c, AttnBuffers& bufs) { return cpu_backend().forward(make_params(c, bufs)); }

ioattn_status run_c_abi(const AttnCase& c, AttnBuffers& bufs) {
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.scale = c.scale;
  opt.causal = c.causal ? 1 : 0;
  opt.window_left = int32_t(c.window_left);
  opt.window_right = int32_t(c.window_right);
  opt.softcap = c.softcap;
  opt.backend = IOATTN_BACKEND_CPU;
  opt.num_threads = c.threads;
  const ioattn_tensor q = bufs.q.abi(), k = bufs.k.abi(), v = bufs.v.abi(), out = bufs.out.abi();
  return ioattn_forward(&q, &k, &v, &out, bufs.lse.empty() ? nullptr : bufs.lse.data(), &opt);
}

double dtype_epsilon(DType t) {
  switch (t) {
    case DType::f32: return std::ldexp(1.0, -23);
    case DType::f16: return std::ldexp(1.0, -10);
    case DType::bf16: return std::ldexp(1.0, -7);
  }
  return 0;
}

std::string Verdict::report() const {
  std::ostringstream o;
  o << "out: err " << err << " vs 2 * naive " << naive_err << " + floor " << floor << "; lse: err " << lse_err
    << " vs 2 * naive " << lse_naive_err << " + floor " << lse_floor << "; NaN/inf mismatches " << nan_mismatches
    << ", lse mismatches " << lse_mismatches << "; guards " << (guards_ok ? "ok" : "BROKEN") << ", padding "
    << (padding_ok ? "ok" : "WRITTEN");
  return o.str();
}

Oracle make_oracle(const AttnCase& c, const AttnBuffers& bufs) {
  AttnBuffers& in = const_cast<AttnBuffers&>(bufs);  // make_params takes the buffers' pointers only
  AttnParams p = make_params(c, in);
  const int64_t dv = c.dv();
  // The oracle writes a dense (B, Sq, Hq, Dv) output; lse keeps the [B][Hq][Sq] layout.
  p.o_batch_stride = c.seqlen_q * c.heads_q * dv;
  p.o_seq_stride = c.heads_q * dv;
  p.o_head_stride = dv;
  const size_t n_out = size_t(c.batch * c.seqlen_q * c.heads_q * dv), n_lse = size_t(c.batch * c.heads_q * c.seqlen_q);
  Oracle o{std::vector<double>(n_out), std::vector<double>(n_lse), std::vector<float>(n_out),
           std::vector<float>(n_lse)};
  naive_attention<double>(p, o.out64.data(), o.lse64.data());
  naive_attention<float>(p, o.out32.data(), o.lse32.data());
  return o;
}

Verdict check_against(const Oracle& oracle, const AttnCase& c, const AttnBuffers& bufs) {
  const int64_t dv = c.dv();
  const size_t n_lse = size_t(c.batch * c.heads_q * c.seqlen_q);
  const std::vector<double>&out64 = oracle.out64, &lse64 = oracle.lse64;
  const std::vector<float>&out32 = oracle.out32, &lse32 = oracle.lse32;
  Verdict v;
  double magnitude = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t s = 0; s < c.seqlen_q; ++s)
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t d = 0; d < dv; ++d) {
          const size_t i = size_t(((b * c.seqlen_q + s) * c.heads_q + h) * dv + d);
          const double want = out64[i];
          const double naive = round_to(c.dtype, out32[i]);
          const double got = bufs.out.get(b, s, h, d);
          if (std::isnan(want) || std::isnan(got) || std::isinf(want) || std::isinf(got)) {
            const bool same = (std::isnan(want) && std::isnan(got)) || (!std::isnan(want) && got == want);
            if (!same) ++v.nan_mismatches;
            continue;
          }
          magnitude = std::max(magnitude, std::fabs(want));
          v.err = std::max(v.err, std::fabs(got - want));
          if (!std::isnan(naive)) v.naive_err = std::max(v.naive_err, std::fabs(naive - want));
        }
  v.floor = 2 * dtype_epsilon(c.dtype) * magnitude;

  if (!bufs.lse.empty()) {
    double lse_magnitude = 0;
    for (size_t i = 0; i < n_lse; ++i) {
      const double want = lse64[i], naive = lse32[i], got = bufs.lse[i];
      if (std::isnan(want) || std::isnan(got) || std::isinf(want) || std::isinf(got)) {
        const bool same = (std::isnan(want) && std::isnan(got)) || (!std::isnan(want) && float(want) == float(got));
        if (!same) ++v.lse_mismatches;
        continue;
      }
      lse_magnitude = std::max(lse_magnitude, std::fabs(want));
      v.lse_err = std::max(v.lse_err, std::fabs(got - want));
      if (!std::isnan(naive)) v.lse_naive_err = std::max(v.lse_naive_err, std::fabs(naive - want));
    }
    v.lse_floor = 2 * dtype_epsilon(DType::f32) * lse_magnitude;
  }
  v.guards_ok = bufs.q.guards_intact() && bufs.k.guards_intact() && bufs.v.guards_intact() && bufs.out.guards_intact();
  v.padding_ok =
      bufs.q.padding_intact() && bufs.k.padding_intact() && bufs.v.padding_intact() && bufs.out.padding_intact();
  v.ok = v.err <= 2 * v.naive_err + v.floor && v.lse_err <= 2 * v.lse_naive_err + v.lse_floor &&
         v.nan_mismatches == 0 && v.lse_mismatches == 0 && v.guards_ok && v.padding_ok;
  return v;
}

Verdict check_against_reference(const AttnCase& c, const AttnBuffers& bufs) {
  return check_against(make_oracle(c, bufs), c, bufs);
}

Verdict run_random_case(const AttnCase& c, uint32_t seed, Status* status, float stddev) {
  std::mt19937 rng(seed);
  AttnBuffers bufs(c);
  bufs.randomize(rng, stddev);
  *status = run_cpu_kernel(c, bufs);
  if (!status->is_ok()) return Verdict{};
  return check_against_reference(c, bufs);
}

std::vector<int64_t> compiled_targets() {
  std::vector<int64_t> all = hwy::SupportedAndGeneratedTargets();
  const char* only = std::getenv("IOATTN_TEST_TARGETS");
  if (only == nullptr || *only == '\0') return all;
  std::vector<int64_t> picked;
  std::istringstream names(only);
  for (std::string name; names >> name;) {
    const auto it = std::find_if(all.begin(), all.end(), [&](int64_t t) { return name == hwy::TargetName(t); });
    if (it == all.end()) {
      // Called while Catch builds a generator, where a failed assertion cannot unwind: say it and
      // stop, so a misspelt name fails the run instead of testing nothing.
      std::fprintf(stderr, "IOATTN_TEST_TARGETS names '%s', which this binary and CPU do not run\n", name.c_str());
      std::exit(2);
    }
    picked.push_back(*it);
  }
  return picked;
}

std::string target_name(int64_t target) { return hwy::TargetName(target); }

TargetScope::TargetScope(int64_t target) { hwy::SetSupportedTargetsForTest(target); }
TargetScope::~TargetScope() { hwy::SetSupportedTargetsForTest(0); }

bool bitwise_equal(const AttnBuffers& a, const AttnBuffers& b) {
  const size_t n = size_t(a.out.span_elements()) * size_t(dtype_bytes(a.out.dtype()));
  if (a.out.span_elements() != b.out.span_elements() || a.lse.size() != b.lse.size()) return false;
  if (std::memcmp(a.out.data(), b.out.data(), n) != 0) return false;
  return std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0;
}

AttnParams dense_params(const void* q, const void* k, const void* v, DType t, int64_t batch, int64_t sq, int64_t sk,
                        int64_t hq, int64_t hkv, int64_t d, int64_t k_rows) {
  AttnParams p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.io_dtype = p.kv_dtype = t;
  p.batch = batch;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.head_dim = p.head_dim_v = d;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.q_seq_stride = p.o_seq_stride = hq * d;
  p.q_head_stride = p.o_head_stride = d;
  p.q_batch_stride = p.o_batch_stride = sq * hq * d;
  p.k_seq_stride = p.v_seq_stride = hkv * d;
  p.k_head_stride = p.v_head_stride = d;
  p.k_batch_stride = p.v_batch_stride = k_rows * hkv * d;
  p.lse_head_stride = sq;
  p.lse_batch_stride = hq * sq;
  p.scale = float(1.0 / std::sqrt(double(d)));
  return p;
}

SequenceOracle reference_sequence(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                  int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d,
                                  const SequenceMask& mask) {
  AttnParams p = dense_params(q.data(), k.data(), v.data(), DType::f32, 1, sq, sk, hq, hkv, d, sk);
  p.scale = mask.scale > 0 ? mask.scale : float(1.0 / std::sqrt(double(d)));
  p.softcap = mask.softcap;
  p.causal = mask.causal;
  p.window_left = mask.window_left;
  p.window_right = mask.window_right;
  SequenceOracle o;
  o.out64.assign(size_t(sq * hq * d), 0);
  o.lse64.assign(size_t(hq * sq), 0);
  o.out32.assign(o.out64.size(), 0);
  o.lse32.assign(o.lse64.size(), 0);
  naive_attention<double>(p, o.out64.data(), o.lse64.data());
  naive_attention<float>(p, o.out32.data(), o.lse32.data());
  return o;
}

HardwareProfile profile(const std::string& name) {
  HardwareProfile hw;
  std::string error;
  REQUIRE(find_profile(name, &hw, &error));
  return hw;
}

const std::vector<HardwareProfile>& cpu_profiles() {
  static const std::vector<HardwareProfile> cpus = [] {
    std::vector<HardwareProfile> v;
    for (const HardwareProfile& hw : builtin_profiles())
      if (hw.kind == DeviceKind::cpu) v.push_back(hw);
    return v;
  }();
  return cpus;
}

Problem make_problem(int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d, DType t, int64_t batch) {
  Problem p;
  p.batch = batch;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.seqlen_q = sq;
  p.seqlen_k = sk;
  p.head_dim = p.head_dim_v = d;
  p.dtype = p.kv_dtype = t;
  return p;
}

}  // namespace ioattn::test
