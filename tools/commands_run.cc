// `ioattn run`: attention over .npy inputs, written to .npy outputs that appear only on success.
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <tuple>

#include "common/problem.h"
#include "tools/args.h"
#include "tools/attention_job.h"
#include "tools/cli.h"
#include "tools/npy.h"
#include "tools/staged_file.h"

namespace ioattn::cli {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + (s.size() == 1 ? ",)" : ")");
}

// An input array as a (B, S, H, D) host tensor; every problem names the flag and the file.
HostTensor load_input(const std::string& flag, const std::string& path) {
  NpyArray a;
  std::string error;
  if (!read_npy(path, &a, &error)) throw usage_error(flag + " " + quoted(path) + ": " + error);
  if (a.shape.size() != 4) {
    throw usage_error(flag + " " + quoted(path) + ": expected 4 dimensions (B, S, H, D), got shape " +
                      shape_str(a.shape));
  }
  if (a.shape[2] == 0) throw usage_error(flag + " " + quoted(path) + ": 0 heads (axis 2)");
  if (a.shape[3] == 0) throw usage_error(flag + " " + quoted(path) + ": head dim (axis 3) is 0");
  HostTensor t;
  t.dtype = a.dtype == NpyDType::f32 ? DType::f32 : DType::f16;
  t.batch = a.shape[0];
  t.seqlen = a.shape[1];
  t.heads = a.shape[2];
  t.head_dim = a.shape[3];
  t.bytes = std::move(a.data);
  return t;
}

void check_shapes(const HostTensor& q, const HostTensor& k, const HostTensor& v, const std::string& kp,
                  const std::string& vp) {
  auto fail = [](const std::string& flag, const std::string& path, const std::string& what) {
    throw usage_error(flag + " " + quoted(path) + ": " + what);
  };
  auto n = [](int64_t x) { return std::to_string(x); };
  const char* qt = q.dtype == DType::f32 ? "float32" : "float16";
  for (const auto& [t, flag, path] : {std::tuple{&k, "--k", kp}, std::tuple{&v, "--v", vp}}) {
    if (t->dtype != q.dtype) {
      fail(flag, path,
           std::string("dtype ") + (t->dtype == DType::f32 ? "float32" : "float16") + " differs from --q's " + qt +
               " (q, k and v share one dtype)");
    }
    if (t->batch != q.batch) fail(flag, path, "batch " + n(t->batch) + " differs from --q's " + n(q.batch));
  }
  if (k.head_dim != q.head_dim) fail("--k", kp, "head dim " + n(k.head_dim) + " differs from --q's " + n(q.head_dim));
  if (v.seqlen != k.seqlen) fail("--v", vp, "seqlen " + n(v.seqlen) + " differs from --k's " + n(k.seqlen));
  if (v.heads != k.heads) fail("--v", vp, "heads " + n(v.heads) + " differs from --k's " + n(k.heads));
  if (q.heads % k.heads != 0) {
    fail("--k", kp, n(k.heads) + " kv heads do not divide --q's " + n(q.heads) + " heads (GQA needs Hq % Hkv == 0)");
  }
}

void write_array(StagedFile& f, NpyDType dtype, const std::vector<int64_t>& shape, const void* data, size_t bytes) {
  const std::string header = npy_header_bytes(dtype, shape);
  f.write(header.data(), header.size());
  f.write(data, bytes);
}

std::string error_line(const char* what, const ErrorStats& e) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s max abs error %.3e (largest |ref| %.3e, %lld values", what, e.max_abs,
                e.max_ref_abs, static_cast<long long>(e.compared));
  std::string s = buf;
  if (e.mismatched_nonfinite > 0) {
    s += ", " + std::to_string(e.mismatched_nonfinite) + " NaN/inf mismatches";
  }
  return s + ")";
}

}  // namespace

int cmd_run(int argc, char** argv) {
  Args a("run");
  a.option("--q", "Q.npy", "queries (B, Sq, Hq, D), float32 or float16, C order");
  a.option("--k", "K.npy", "keys (B, Sk, Hkv, D), same dtype as q");
  a.option("--v", "V.npy", "values (B, Sk, Hkv, Dv), same dtype as q");
  a.option("--out", "O.npy", "output (B, Sq, Hq, Dv), q's dtype; written only on success");
  a.option("--lse", "L.npy", "log-sum-exp (B, Hq, Sq) float32; written only on success");
  a.flag("--causal", "bottom-right aligned causal mask");
  a.option("--window", "L,R", "sliding window, -1 = unbounded on that side");
  a.option("--softcap", "C", "score softcap c * tanh(s / c), 0 = off");
  a.option("--scale", "S", "score scale; <= 0 means 1/sqrt(D)");
  a.option("--backend", "cpu|cuda", "where to compute (default cpu)");
  a.option("--threads", "N", "CPU threads, 0 = library default (IOATTN_NUM_THREADS, else all cores)");
  a.flag("--check", "also report the max abs error against the fp64 reference");
  if (!a.parse(argc, argv)) {
    std::cout << a.help("--q Q.npy --k K.npy --v V.npy --out O.npy [--lse L.npy] [options]",
                        "Exact attention over .npy arrays (see docs/api.md for the semantics). Inputs are\n"
                        "little-endian float32 or float16 in C order; on any error no output file is\n"
                        "created or truncated.");
    return kExitOk;
  }
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.causal = a.has("--causal") ? 1 : 0;
  if (const auto w = a.value("--window")) {
    const auto [l, r] = parse_window("--window", *w);
    opt.window_left = int32_t(l);
    opt.window_right = int32_t(r);
  }
  opt.softcap = float(double_option(a, "--softcap", 0.0, 0.0, 3.0e38));
  opt.scale = float(double_option(a, "--scale", 0.0, -3.0e38, 3.0e38));
  opt.num_threads = int32_t(int_option(a, "--threads", 0, 0, 4096));
  if (const auto b = a.value("--backend")) {
    if (*b == "cpu")
      opt.backend = IOATTN_BACKEND_CPU;
    else if (*b == "cuda")
      opt.backend = IOATTN_BACKEND_CUDA;
    else
      throw usage_error("--backend: expected cpu or cuda, got " + quoted(*b));
  }
  // Checked after the values above, so a malformed value the user typed is named before a flag
  // they have not typed yet.
  for (const char* required : {"--q", "--k", "--v", "--out"}) {
    if (!a.has(required)) throw usage_error(std::string("missing required flag ") + required);
  }
  const std::string out_path = *a.value("--out");
  const auto lse_path = a.value("--lse");
  if (lse_path && *lse_path == out_path) throw usage_error("--lse: same path as --out " + quoted(out_path));

  const std::string qp = *a.value("--q"), kp = *a.value("--k"), vp = *a.value("--v");
  const HostTensor q = load_input("--q", qp);
  const HostTensor k = load_input("--k", kp);
  const HostTensor v = load_input("--v", vp);
  check_shapes(q, k, v, kp, vp);
  if (opt.backend == IOATTN_BACKEND_CUDA && !ioattn_backend_available(IOATTN_BACKEND_CUDA)) {
    throw unsupported_error("--backend cuda: " + cuda_unavailable_reason());
  }

  // Created before computing so an unwritable destination fails fast; removed unless committed.
  StagedFile out_file("--out", out_path);
  std::unique_ptr<StagedFile> lse_file;
  if (lse_path) lse_file = std::make_unique<StagedFile>("--lse", *lse_path);
  // Another spelling of --out's path (./o.npy, a symlinked directory) would rename the LSE over
  // the output after it was committed.
  if (lse_file && lse_file->destination() == out_file.destination()) {
    throw usage_error("--lse " + quoted(*lse_path) + ": names the same file as --out " + quoted(out_path));
  }

  HostTensor out(q.dtype, q.batch, q.seqlen, q.heads, v.head_dim);
  std::vector<float> lse;
  const bool want_lse = lse_path || a.has("--check");
  ForwardJob job{&q, &k, &v, &out, want_lse ? &lse : nullptr, opt};
  const double seconds = run_forward(job, 1);
  const Problem pr = problem_of_job(job);

  std::string check;
  if (a.has("--check")) {
    std::vector<double> ref_out, ref_lse;
    reference_heads<double>(job, 0, q.heads, &ref_out, &ref_lse);
    check = "check vs fp64 reference: " + error_line("out", compare_out(out, 0, q.heads, ref_out)) + "; " +
            error_line("lse", compare_lse(lse, q.batch, q.heads, q.seqlen, 0, q.heads, ref_lse)) + "\n";
  }

  write_array(out_file, q.dtype == DType::f32 ? NpyDType::f32 : NpyDType::f16, {q.batch, q.seqlen, q.heads, v.head_dim},
              out.bytes.data(), out.bytes.size());
  if (lse_file) {
    write_array(*lse_file, NpyDType::f32, {q.batch, q.heads, q.seqlen}, lse.data(), lse.size() * sizeof(float));
  }
  out_file.commit();
  if (lse_file) lse_file->commit();

  const double flops = forward_flops(pr);
  std::ostringstream os;
  os << out_path << ": q " << shape_str({q.batch, q.seqlen, q.heads, q.head_dim}) << " k "
     << shape_str({k.batch, k.seqlen, k.heads, k.head_dim}) << " v "
     << shape_str({v.batch, v.seqlen, v.heads, v.head_dim}) << " -> out "
     << shape_str({q.batch, q.seqlen, q.heads, v.head_dim}) << " on "
     << (opt.backend == IOATTN_BACKEND_CUDA ? "cuda" : "cpu") << std::fixed << std::setprecision(3) << " in "
     << seconds * 1e3 << " ms (" << std::setprecision(2) << (seconds > 0 ? flops / seconds * 1e-9 : 0.0)
     << " GFLOP/s)\n";
  std::cout << os.str() << check;
  return kExitOk;
}

}  // namespace ioattn::cli
