#include "tools/problem_flags.h"

#include <cmath>
#include <cstdio>
#include <tuple>

#include "tools/cli.h"

namespace ioattn::cli {

namespace {
// Bounds a request must meet before the model sees it: sequence lengths and head counts fit the
// C ABI's int32 fields (cu_seqlens, windows); 1024 is far above any head dim a kernel supports
// and keeps byte counts well inside double precision.
constexpr int64_t kMaxSeqlen = 2147483647;
constexpr int64_t kMaxHeads = 65536;
constexpr int64_t kMaxBatch = 1 << 20;
constexpr int64_t kMaxHeadDim = 1024;
}  // namespace

void add_problem_flags(Args& a, bool with_hardware) {
  a.option("--batch", "B", "batch size (default 1)");
  a.option("--heads", "H", "query heads (default 16)");
  a.option("--kv-heads", "H", "key/value heads, dividing --heads (default: --heads; fewer = GQA/MQA)");
  a.option("--seqlen-q", "N", "query length (default 4096)");
  a.option("--seqlen-k", "N", "key length (default: --seqlen-q)");
  a.option("--head-dim", "D", "head dim of q and k (default 128)");
  a.option("--head-dim-v", "D", "head dim of v and out (default: --head-dim)");
  a.option("--dtype", "T", "storage dtype f32|f16|bf16 (default f32)");
  a.flag("--causal", "bottom-right aligned causal mask");
  a.option("--window", "L,R", "sliding window, -1 = unbounded on that side");
  a.option("--scale", "S", "score scale; <= 0 means 1/sqrt(D) (only computed by bench)");
  a.option("--softcap", "C", "score softcap, 0 = off (only computed by bench)");
  if (with_hardware) {
    a.option("--hw", "NAME", "hardware profile: a name from `ioattn hw`, or host (default host)", true);
    a.option("--hw-file", "F.json", "custom hardware profile in the profiles.json schema", true);
  }
}

ProblemRequest read_problem_flags(const Args& a, bool with_hardware) {
  ProblemRequest r;
  Problem& pr = r.problem;
  pr.batch = int_option(a, "--batch", 1, 1, kMaxBatch);
  pr.heads_q = int_option(a, "--heads", 16, 1, kMaxHeads);
  pr.heads_kv = int_option(a, "--kv-heads", pr.heads_q, 1, kMaxHeads);
  if (pr.heads_q % pr.heads_kv != 0) {
    throw usage_error("--kv-heads: " + std::to_string(pr.heads_kv) + " does not divide --heads " +
                      std::to_string(pr.heads_q) + " (GQA needs Hq % Hkv == 0)");
  }
  pr.seqlen_q = int_option(a, "--seqlen-q", 4096, 1, kMaxSeqlen);
  pr.seqlen_k = int_option(a, "--seqlen-k", pr.seqlen_q, 1, kMaxSeqlen);
  pr.head_dim = int_option(a, "--head-dim", 128, 1, kMaxHeadDim);
  pr.head_dim_v = int_option(a, "--head-dim-v", pr.head_dim, 1, kMaxHeadDim);
  if (const auto d = a.value("--dtype")) {
    if (*d == "f32")
      pr.dtype = DType::f32;
    else if (*d == "f16")
      pr.dtype = DType::f16;
    else if (*d == "bf16")
      pr.dtype = DType::bf16;
    else
      throw usage_error("--dtype: expected f32, f16 or bf16, got " + quoted(*d));
  }
  pr.kv_dtype = pr.dtype;
  pr.causal = a.has("--causal");
  if (const auto w = a.value("--window")) std::tie(pr.window_left, pr.window_right) = parse_window("--window", *w);
  r.scale = float(double_option(a, "--scale", 0.0, -1e30, 1e30));
  r.softcap = float(double_option(a, "--softcap", 0.0, 0.0, 1e30));

  if (!with_hardware) return r;
  for (const auto& [flag, value] : a.given()) {
    HardwareProfile hw;
    std::string error;
    if (flag == "--hw") {
      if (!find_profile(value, &hw, &error)) throw usage_error("--hw: " + error);
    } else if (flag == "--hw-file") {
      if (!load_profile_file(value, &hw, &error)) throw usage_error("--hw-file: " + error);
    } else {
      continue;
    }
    r.hardware.push_back(std::move(hw));
  }
  if (r.hardware.empty()) {
    HardwareProfile hw;
    std::string error;
    if (!find_profile("host", &hw, &error)) throw internal_error("detecting the host: " + error);
    r.hardware.push_back(std::move(hw));
  }
  return r;
}

std::string describe(const Problem& pr) {
  std::string s = "B=" + std::to_string(pr.batch) + " Hq=" + std::to_string(pr.heads_q) +
                  " Hkv=" + std::to_string(pr.heads_kv) + " Sq=" + std::to_string(pr.seqlen_q) +
                  " Sk=" + std::to_string(pr.seqlen_k) + " D=" + std::to_string(pr.head_dim);
  if (pr.head_dim_v != pr.head_dim) s += " Dv=" + std::to_string(pr.head_dim_v);
  s += std::string(" ") + dtype_name(pr.dtype);
  if (pr.causal) s += " causal";
  if (pr.window_left >= 0 || pr.window_right >= 0) {
    s += " window=(" + std::to_string(pr.window_left) + "," + std::to_string(pr.window_right) + ")";
  }
  return s;
}

std::string human_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, kUnits[u]);
  return buf;
}

}  // namespace ioattn::cli
