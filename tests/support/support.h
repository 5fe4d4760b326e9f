// The shared test harness: strided tensors in any storage dtype with NaN-filled padding and
// guard bytes, an attention case builder (AttnParams and the C ABI's ioattn_tensor from the same
// buffers), and the FlashAttention-2 tolerance rule of docs/testing.md against the fp64 oracle.
// Owned by the CPU-kernel work; others may add functions at the end.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/hardware.h"
#include "common/params.h"
#include "common/problem.h"
#include "common/status.h"
#include "ioattn/ioattn.h"

namespace ioattn::test {

// How a (B, S, H, D) tensor is laid out. Strides follow from the order and the pads; a broadcast
// axis gets stride 0 (every index on it reads the same elements).
struct Layout {
  enum Order { bshd, bhsd } order = bshd;
  int64_t row_pad = 0;    // elements between the end of one D row and the next row
  int64_t outer_pad = 0;  // extra elements after each block of the middle axis
  bool broadcast_batch = false;
  bool broadcast_heads = false;
  bool broadcast_seq = false;
};

// A tensor in its storage dtype inside a byte buffer framed by guard bytes. Everything the
// logical elements do not cover (row padding, gaps, alias-free slack) holds NaN, so a kernel that
// reads padding poisons its result and one that writes there is caught by padding_intact().
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t dim, const Layout& layout = {});

  DType dtype() const { return dtype_; }
  int64_t batch() const { return batch_; }
  int64_t seqlen() const { return seqlen_; }
  int64_t heads() const { return heads_; }
  int64_t dim() const { return dim_; }
  int64_t stride_batch() const { return stride_b_; }
  int64_t stride_seq() const { return stride_s_; }
  int64_t stride_head() const { return stride_h_; }
  int64_t offset(int64_t b, int64_t s, int64_t h) const { return b * stride_b_ + s * stride_s_ + h * stride_h_; }

  void* data() { return bytes_.data() + kGuard; }
  const void* data() const { return bytes_.data() + kGuard; }
  int64_t span_elements() const { return span_; }

  float get(int64_t b, int64_t s, int64_t h, int64_t d) const;
  void set(int64_t b, int64_t s, int64_t h, int64_t d, float value);  // rounds to the dtype (RNE)
  // Sets every logical element to f(b, s, h, d), rounded to the dtype.
  void fill(const std::function<float(int64_t, int64_t, int64_t, int64_t)>& f);
  void fill_normal(std::mt19937& rng, float stddev = 1.f);
  // Sets every element of the buffer, logical or not, to NaN (what outputs start as).
  void fill_nan();

  bool guards_intact() const;
  // True when no element outside the logical ones changed from NaN (outputs: nothing written
  // beyond Dv or between rows).
  bool padding_intact() const;

  ioattn_tensor abi();

 private:
  static constexpr size_t kGuard = 64;
  static constexpr unsigned char kGuardByte = 0xA5;
  DType dtype_ = DType::f32;
  int64_t batch_ = 0, seqlen_ = 0, heads_ = 0, dim_ = 0;
  int64_t stride_b_ = 0, stride_s_ = 0, stride_h_ = 0;
  int64_t span_ = 0;
  std::vector<unsigned char> bytes_;
  std::vector<unsigned char> logical_;  // 1 where an element is reachable by (b, s, h, d)
};

// One attention request for the tests. head_dim_v < 0 means head_dim; scale <= 0 means 1/sqrt(D).
struct AttnCase {
  int64_t batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1, seqlen_k = 1, head_dim = 64, head_dim_v = -1;
  DType dtype = DType::f32;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.f, scale = 0.f;
  Layout q_layout, k_layout, v_layout, o_layout;
  bool with_lse = true;
  int threads = 1;
  TilingOverride tiling;

  int64_t dv() const { return head_dim_v < 0 ? head_dim : head_dim_v; }
  std::string describe() const;
};

// The buffers of one case: inputs filled by the caller (or randomly), outputs NaN-filled.
struct AttnBuffers {
  Tensor q, k, v, out;
  std::vector<float> lse;  // [B][Hq][Sq], or empty

  AttnBuffers() = default;
  explicit AttnBuffers(const AttnCase& c);
  void randomize(std::mt19937& rng, float stddev = 1.f);
  void reset_outputs();  // NaN everywhere in out and lse
};

// AttnParams over the buffers, resolved as the API layer does (scale, threads).
AttnParams make_params(const AttnCase& c, AttnBuffers& bufs);

// Runs the CPU kernel directly (ioattn::cpu::forward) or through the C ABI (ioattn_forward).
Status run_cpu_kernel(const AttnCase& c, AttnBuffers& bufs);
ioattn_status run_c_abi(const AttnCase& c, AttnBuffers& bufs);

// The FlashAttention-2 rule: max|out - ref64| <= 2 * max|naive_same_dtype - ref64| + floor, with
// naive_same_dtype = naive_attention<float> (pairwise sums over the keys) rounded to the storage dtype, and floor two
// ulp of the output's magnitude in the storage dtype. NaN must appear exactly where the oracle has NaN; infinities must
// match. LSE is checked separately (fp32 storage), -inf exactly.
struct Verdict {
  bool ok = true;
  double err = 0, naive_err = 0, floor = 0;
  double lse_err = 0, lse_naive_err = 0, lse_floor = 0;
  int64_t nan_mismatches = 0, lse_mismatches = 0;
  bool guards_ok = true, padding_ok = true;
  std::string report() const;
};

// The rule's two references for one case's inputs: computed once, they check any number of runs
// over the same inputs (other plans, thread counts, targets).
struct Oracle {
  std::vector<double> out64, lse64;  // fp64: (B, Sq, Hq, Dv) dense, lse [B][Hq][Sq]
  std::vector<float> out32, lse32;   // naive_attention<float>, the same layouts
};
Oracle make_oracle(const AttnCase& c, const AttnBuffers& bufs);
Verdict check_against(const Oracle& oracle, const AttnCase& c, const AttnBuffers& bufs);
Verdict check_against_reference(const AttnCase& c, const AttnBuffers& bufs);

// Fills the case's inputs with normal values (seeded), NaN-fills the outputs, runs the CPU kernel
// and checks it; *status receives the kernel's status (the verdict is empty when it failed).
Verdict run_random_case(const AttnCase& c, uint32_t seed, Status* status, float stddev = 1.f);

// Relative size of one ulp at magnitude 1 in a storage dtype: 2^-23, 2^-10, 2^-7.
double dtype_epsilon(DType t);

// Every Highway target compiled into this binary that the CPU supports, or those that
// IOATTN_TEST_TARGETS names (space-separated, e.g. "SVE_256"): a run under an emulated vector
// length then skips the targets another run already covers. A name not among them fails.
std::vector<int64_t> compiled_targets();
std::string target_name(int64_t target);

// Restricts Highway dispatch to one target for its lifetime (SetSupportedTargetsForTest), then
// restores normal dispatch.
class TargetScope {
 public:
  explicit TargetScope(int64_t target);
  ~TargetScope();
  TargetScope(const TargetScope&) = delete;
  TargetScope& operator=(const TargetScope&) = delete;
};

// Bitwise equality of two outputs' logical elements (and lse), for determinism tests.
bool bitwise_equal(const AttnBuffers& a, const AttnBuffers& b);

// The inference tests' oracle: one sequence's attention through the reference in f64 and f32, on
// dense (S, H, D) f32 arrays holding the values the kernel reads (already rounded to the cache's
// storage type), so paging, packing and appending are checked rather than repeated.
struct SequenceMask {
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.f;
  float scale = 0.f;  // 0: 1 / sqrt(D)
};
struct SequenceOracle {
  std::vector<double> out64, lse64;  // [S][H][D] and [H][S]
  std::vector<float> out32, lse32;
};
// Params over contiguous (B, S, H, D) tensors of one storage type, as the API layer builds them
// (k_rows: the K/V batch stride in rows, Sk for a plain call, the cache's capacity for a cache).
AttnParams dense_params(const void* q, const void* k, const void* v, DType t, int64_t batch, int64_t sq, int64_t sk,
                        int64_t hq, int64_t hkv, int64_t d, int64_t k_rows);
SequenceOracle reference_sequence(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                                  int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, const SequenceMask& mask);

// A built-in hardware profile by name, REQUIREd to exist (the model tests: outline, planner,
// traffic).
HardwareProfile profile(const std::string& name);

// Every built-in CPU profile (common/profiles.json): the kernel tests force each one's plan
// through TilingOverride::profile, so a cache geometry nobody here owns still runs its blocks.
const std::vector<HardwareProfile>& cpu_profiles();

// A Problem for the model tests: Hq, Hkv, Sq, Sk, D (= Dv), one dtype for q/out and k/v, batch.
Problem make_problem(int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d, DType t = DType::f32,
                     int64_t batch = 1);

}  // namespace ioattn::test
