// `ioattn demo`: the whole path on an embedded workload, from hardware detection to a checked
// result, in a few seconds on two cores.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>

#include "common/hardware.h"
#include "common/outline.h"
#include "common/planner.h"
#include "common/traffic.h"
#include "tools/args.h"
#include "tools/attention_job.h"
#include "tools/cli.h"
#include "tools/problem_flags.h"
#include "tools/report.h"

namespace ioattn::cli {

namespace {

// A causal prefill of one sequence: 8 heads of dim 64 over 1024 tokens is about 1.1 GFLOP, a
// few tens of milliseconds on two cores, and its K/V per head (256 KiB) straddles the L2 of
// most CPUs, so the plan has real choices to make.
constexpr int64_t kBatch = 1, kHeads = 8, kSeqlen = 1024, kHeadDim = 64;
constexpr uint32_t kSeed = 20260101;
constexpr int kRepeats = 5;

void fill_uniform(HostTensor& t, std::mt19937& rng) {
  // Uniform in [-1, 1) from the raw generator: the same values on every standard library,
  // unlike std::uniform_real_distribution.
  for (int64_t i = 0; i < t.count(); ++i) {
    store_from_f32(t.bytes.data(), i, t.dtype, float(double(rng()) / 2147483648.0 - 1.0));
  }
}

HostTensor converted(const HostTensor& t, DType to) {
  HostTensor r(to, t.batch, t.seqlen, t.heads, t.head_dim);
  for (int64_t i = 0; i < t.count(); ++i) store_from_f32(r.bytes.data(), i, to, t.at(i));
  return r;
}

// The FlashAttention-2 rule of docs/testing.md: the kernel may be off the fp64 reference by twice what
// a naive implementation in the kernel's own precision is off, plus two ulps of the output's
// storage dtype at the largest reference magnitude.
struct Verdict {
  ErrorStats err;
  double tolerance = 0;
  bool pass = false;
};

Verdict check_sample(const ForwardJob& job, const std::vector<int64_t>& heads) {
  Verdict v;
  double naive_err = 0;
  const double ulp = job.q->dtype == DType::f32 ? FLT_EPSILON : job.q->dtype == DType::f16 ? 0x1p-10 : 0x1p-7;
  const int64_t group = job.q->heads / job.k->heads;
  for (int64_t h : heads) {
    const int64_t first = h / group * group;
    std::vector<double> ref_out, ref_lse;
    std::vector<float> naive_out, naive_lse;
    reference_heads<double>(job, first, group, &ref_out, &ref_lse);
    reference_heads<float>(job, first, group, &naive_out, &naive_lse);
    const ErrorStats e = compare_out(*job.out, first, group, ref_out);
    v.err.max_abs = std::max(v.err.max_abs, e.max_abs);
    v.err.max_ref_abs = std::max(v.err.max_ref_abs, e.max_ref_abs);
    v.err.mismatched_nonfinite += e.mismatched_nonfinite;
    v.err.compared += e.compared;
    for (size_t i = 0; i < ref_out.size(); ++i) {
      naive_err = std::max(naive_err, std::fabs(double(round_to(job.q->dtype, naive_out[i])) - ref_out[i]));
    }
  }
  v.tolerance = 2 * naive_err + 2 * ulp * v.err.max_ref_abs;
  v.pass = v.err.mismatched_nonfinite == 0 && v.err.max_abs <= v.tolerance;
  return v;
}

void print_result(const char* backend, const ForwardJob& job, double seconds, const Verdict& v,
                  const std::vector<int64_t>& heads, double flops) {
  std::string hs;
  for (int64_t h : heads) {
    if (!hs.empty()) hs += ',';
    hs += std::to_string(h);
  }
  std::printf("%-5s %s: best of %d %.3f ms, %.2f GFLOP/s\n", backend, dtype_name(job.q->dtype), kRepeats, seconds * 1e3,
              flops / seconds * 1e-9);
  std::printf(
      "      check heads {%s} (%lld values) vs fp64 reference: max abs error %.3e, tolerance %.3e "
      "(2 x naive same-precision error + 2 ulp), %lld NaN/inf mismatches: %s\n",
      hs.c_str(), static_cast<long long>(v.err.compared), v.err.max_abs, v.tolerance,
      static_cast<long long>(v.err.mismatched_nonfinite), v.pass ? "PASS" : "FAIL");
}

}  // namespace

int cmd_demo(int argc, char** argv) {
  Args a("demo");
  a.option("--threads", "N", "CPU threads, 0 = library default (IOATTN_NUM_THREADS, else all cores)");
  if (!a.parse(argc, argv)) {
    std::cout << a.help("[--threads N]",
                        "Detects this machine, plans a causal prefill (B=1, 8 heads, 1024 tokens, head dim\n"
                        "64, f32, fixed random inputs), runs the CPU kernel (and the CUDA kernel in f16\n"
                        "when a GPU is usable), checks sampled heads against the fp64 reference, and\n"
                        "prints the plan, its design outline, predicted traffic (flash vs standard), time\n"
                        "and GFLOP/s. Exit 1 when a check fails.");
    return kExitOk;
  }
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.causal = 1;
  opt.num_threads = int32_t(int_option(a, "--threads", 0, 0, 4096));
  const int threads = opt.num_threads > 0 ? opt.num_threads : default_threads();

  std::mt19937 rng(kSeed);
  HostTensor q(DType::f32, kBatch, kSeqlen, kHeads, kHeadDim), k(DType::f32, kBatch, kSeqlen, kHeads, kHeadDim),
      v(DType::f32, kBatch, kSeqlen, kHeads, kHeadDim), out(DType::f32, kBatch, kSeqlen, kHeads, kHeadDim);
  fill_uniform(q, rng);
  fill_uniform(k, rng);
  fill_uniform(v, rng);
  ForwardJob job{&q, &k, &v, &out, nullptr, opt};
  const Problem pr = problem_of_job(job);

  const HardwareProfile host = detect_host();
  const Plan plan = plan_cpu(pr, host, threads);
  const TrafficReport traffic = predict_traffic(pr, plan, host);
  std::cout << "ioattn " << ioattn_version() << " demo: " << describe(pr) << "\n\n"
            << "== plan (" << threads << " threads)\n"
            << plan_text(plan, host) << "\n== design outline\n"
            << outline_text(designOutline(pr, plan, host)) << "\n== predicted traffic, flash vs standard\n"
            << traffic_text(traffic) << "\n== run\n";

  const std::vector<int64_t> sample = {0, kHeads - 1};
  const double flops = forward_flops(pr);
  const double cpu_s = run_forward(job, kRepeats);
  const Verdict cpu_v = check_sample(job, sample);
  print_result("cpu", job, cpu_s, cpu_v, sample, flops);
  bool pass = cpu_v.pass;

  if (ioattn_backend_available(IOATTN_BACKEND_CUDA)) {
    // Tensor-core kernels take 16-bit inputs; the reference reads the same rounded values.
    const HostTensor qh = converted(q, DType::f16), kh = converted(k, DType::f16), vh = converted(v, DType::f16);
    HostTensor oh(DType::f16, kBatch, kSeqlen, kHeads, kHeadDim);
    ForwardJob gpu_job{&qh, &kh, &vh, &oh, nullptr, opt};
    gpu_job.options.backend = IOATTN_BACKEND_CUDA;
    try {
      const double gpu_s = run_forward(gpu_job, kRepeats);
      const Verdict gpu_v = check_sample(gpu_job, sample);
      print_result("cuda", gpu_job, gpu_s, gpu_v, sample, flops);
      pass = pass && gpu_v.pass;
    } catch (const CliError& e) {
      if (e.code() != kExitUnsupported) throw;
      std::printf("cuda  unsupported for this workload: %s\n", e.what());
    }
  } else {
    std::printf("cuda  not run: %s\n", cuda_unavailable_reason().c_str());
  }
  std::printf("\n%s\n", pass ? "demo: PASS" : "demo: FAIL");
  return pass ? kExitOk : kExitInternal;
}

}  // namespace ioattn::cli
