// One attention forward at a given shape on one thread, for measuring its memory traffic under
// valgrind's cachegrind (bench/traffic/run_cachegrind.sh) or with hardware counters.
//
//   traffic_run --kernel flash|standard|none --heads H --seqlen S --dim D [--causal]
//               [--dtype f32|bf16] [--calls N] [--counters]
//
// The flash kernel runs as a user's call runs it: ioattn_forward with default options but one
// thread, so the library plans it (cpu::plan_for_params, for the profile IOATTN_HW_PROFILE names:
// run_cachegrind.sh sets the one whose caches cachegrind simulates).
//
// `none` does everything the other two do except the forward calls: the same allocation,
// initialization, planning and cache sweep, so that subtracting its cachegrind counts from a
// kernel run's leaves exactly the forwards' traffic (process start-up, the dynamic loader and
// OpenBLAS's initialization are identical in both). The inputs are swept out of the simulated
// caches before the first call, so it starts cold, as TrafficOptions::cold_scratch assumes;
// --calls 2 minus --calls 1 is the steady state of repeated calls, the model's default.
//
// The first stdout line, "ioattn-traffic-run key=value ...", records the shape, the calls and the
// plan the CPU kernel ran, so a recorded sample can be compared with predict_traffic without
// re-planning.
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/lib/peers.h"
#include "common/dtype.h"
#include "common/params.h"
#include "common/planner.h"
#include "cpu/cpu_backend.h"
#include "ioattn/ioattn.h"

namespace {

struct Args {
  std::string kernel = "flash";
  int64_t heads = 1, seqlen = 1024, dim = 64;
  bool causal = false;
  ioattn::DType dtype = ioattn::DType::f32;
  bool counters = false;
  int64_t calls = 1;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "traffic_run: %s\nusage: traffic_run --kernel flash|standard|none --heads H --seqlen S --dim D "
               "[--causal] [--dtype f32|bf16] [--calls N] [--counters]\n",
               why.c_str());
  std::exit(2);
}

int64_t positive(const char* flag, const char* text) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < 1 || v > (1 << 20))
    usage(std::string(flag) + " wants a positive integer, got '" + text + "'");
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(f + " needs a value");
      return argv[++i];
    };
    if (f == "--kernel") {
      a.kernel = value();
      if (a.kernel != "flash" && a.kernel != "standard" && a.kernel != "none")
        usage("--kernel: unknown '" + a.kernel + "'");
    } else if (f == "--heads") {
      a.heads = positive("--heads", value());
    } else if (f == "--seqlen") {
      a.seqlen = positive("--seqlen", value());
    } else if (f == "--dim") {
      a.dim = positive("--dim", value());
    } else if (f == "--causal") {
      a.causal = true;
    } else if (f == "--counters") {
      a.counters = true;
    } else if (f == "--calls") {
      a.calls = positive("--calls", value());
    } else if (f == "--dtype") {
      const std::string t = value();
      if (t == "f32")
        a.dtype = ioattn::DType::f32;
      else if (t == "bf16")
        a.dtype = ioattn::DType::bf16;
      else
        usage("--dtype: unknown '" + t + "' (f32, bf16)");
    } else {
      usage("unknown flag '" + f + "'");
    }
  }
  return a;
}

// Deterministic values in [-1, 1) that are never all zero (zeros would hide unwritten outputs
// and make no difference to traffic, but the kernels' exp paths should see real scores).
void fill(std::vector<unsigned char>& buf, ioattn::DType t, uint64_t seed) {
  const size_t n = buf.size() / ioattn::dtype_bytes(t);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const float v = float(int64_t(x >> 40) - (int64_t(1) << 23)) / float(1 << 23);
    ioattn::store_from_f32(buf.data(), int64_t(i), t, v);
  }
}

// Reads and writes a buffer four times the simulated L2 so no input line is still cached when
// the forward starts.
void sweep_caches() {
  static std::vector<float> junk(1 << 20, 1.0f);
  for (float& v : junk) v = v * 0.5f + 1.0f;
  volatile float sink = junk[junk.size() / 2];
  (void)sink;
}

// Hardware counters around the forward, where the kernel exposes them: L1d read misses and
// last-level-cache misses. On virtual machines without a PMU perf_event_open fails (ENOENT,
// EOPNOTSUPP or EACCES); that is reported as "unavailable" and the run continues.
struct Counters {
  int l1d = -1, llc = -1;
  std::string why;
  static int open_one(uint32_t type, uint64_t config) {
    perf_event_attr attr;
    std::memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = type;
    attr.config = config;
    attr.disabled = 1;
    attr.exclude_kernel = 1;
    attr.exclude_hv = 1;
    return int(syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0));
  }
  void open() {
    l1d = open_one(PERF_TYPE_HW_CACHE, PERF_COUNT_HW_CACHE_L1D | (PERF_COUNT_HW_CACHE_OP_READ << 8) |
                                           (PERF_COUNT_HW_CACHE_RESULT_MISS << 16));
    if (l1d < 0) {
      why = std::string("perf_event_open(L1D read misses): ") + std::strerror(errno);
      return;
    }
    llc = open_one(PERF_TYPE_HW_CACHE, PERF_COUNT_HW_CACHE_LL | (PERF_COUNT_HW_CACHE_OP_READ << 8) |
                                           (PERF_COUNT_HW_CACHE_RESULT_MISS << 16));
    if (llc < 0) why = std::string("perf_event_open(LLC read misses): ") + std::strerror(errno);
  }
  void toggle(bool on) {
    for (int fd : {l1d, llc})
      if (fd >= 0) ioctl(fd, on ? PERF_EVENT_IOC_ENABLE : PERF_EVENT_IOC_DISABLE, 0);
  }
  void report() {
    if (l1d < 0 || llc < 0) {
      std::printf("hardware counters: unavailable (%s)\n", why.c_str());
    } else {
      uint64_t a = 0, b = 0;
      if (read(l1d, &a, sizeof a) != sizeof a || read(llc, &b, sizeof b) != sizeof b) {
        std::printf("hardware counters: unavailable (read: %s)\n", std::strerror(errno));
      } else {
        std::printf("hardware counters: L1D read misses %llu (%.0f bytes), LLC read misses %llu (%.0f bytes)\n",
                    (unsigned long long)a, 64.0 * double(a), (unsigned long long)b, 64.0 * double(b));
      }
    }
    for (int fd : {l1d, llc})
      if (fd >= 0) close(fd);
  }
};

// One forward through the public C ABI, as a user calls it: default options, one thread.
bool flash_call(const Args& a, std::vector<unsigned char>* q, std::vector<unsigned char>* k,
                std::vector<unsigned char>* v, std::vector<unsigned char>* o) {
  const ioattn_dtype dt = a.dtype == ioattn::DType::f32 ? IOATTN_F32 : IOATTN_BF16;
  const int64_t ss = a.heads * a.dim;
  ioattn_tensor tq{q->data(), dt, 1, a.seqlen, a.heads, a.dim, a.seqlen * ss, ss, a.dim};
  ioattn_tensor tk = tq, tv = tq, to = tq;
  tk.data = k->data();
  tv.data = v->data();
  to.data = o->data();
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.causal = a.causal;
  opt.num_threads = 1;
  if (ioattn_forward(&tq, &tk, &tv, &to, nullptr, &opt) == IOATTN_OK) return true;
  std::fprintf(stderr, "traffic_run: ioattn_forward failed: %s\n", ioattn_last_error());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const int64_t elems = a.seqlen * a.heads * a.dim;
  const size_t eb = ioattn::dtype_bytes(a.dtype);
  std::vector<unsigned char> q(size_t(elems) * eb), k(size_t(elems) * eb), v(size_t(elems) * eb), o(size_t(elems) * eb);
  fill(q, a.dtype, 1);
  fill(k, a.dtype, 2);
  fill(v, a.dtype, 3);
  fill(o, a.dtype, 4);

  ioattn::AttnParams p;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.out = o.data();
  p.io_dtype = p.kv_dtype = a.dtype;
  p.batch = 1;
  p.heads_q = p.heads_kv = a.heads;
  p.head_dim = p.head_dim_v = a.dim;
  p.seqlen_q = p.seqlen_k = a.seqlen;
  p.q_seq_stride = p.k_seq_stride = p.v_seq_stride = p.o_seq_stride = a.heads * a.dim;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = a.dim;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = elems;
  p.scale = 1.0f / std::sqrt(float(a.dim));
  p.causal = a.causal;
  p.num_threads = 1;
  // The plan ioattn_forward computes for this call (the same function, the same profile); planning
  // in every mode keeps the profile's detection or loading out of the difference from `none`.
  const ioattn::Plan plan = ioattn::cpu::plan_for_params(p);
  std::printf(
      "ioattn-traffic-run kernel=%s batch=1 heads=%lld heads_kv=%lld seqlen=%lld dim=%lld dtype=%s causal=%d "
      "threads=1 calls=%lld hardware=%s block_q=%d block_kv=%d head_dim_padded=%d reg_rows=%d reg_cols=%d "
      "kv_splits=%d workers=%d working_set=%lld simd_bits=%d target=%s\n",
      a.kernel.c_str(), (long long)a.heads, (long long)a.heads, (long long)a.seqlen, (long long)a.dim,
      ioattn::dtype_name(a.dtype), int(a.causal), (long long)a.calls, plan.hardware.c_str(), plan.block_q,
      plan.block_kv, plan.head_dim_padded, plan.reg_rows, plan.reg_cols, plan.kv_splits, plan.workers,
      (long long)plan.working_set_bytes, ioattn::cpu::dispatch_target_name() == "AVX3" ? 512 : 256,
      ioattn::cpu::dispatch_target_name().c_str());
  std::fflush(stdout);

  Counters ctr;
  if (a.counters) ctr.open();
  sweep_caches();
  ctr.toggle(true);
  int rc = 0;
  for (int64_t c = 0; c < a.calls && rc == 0; ++c) {
    if (a.kernel == "flash") {
      rc = flash_call(a, &q, &k, &v, &o) ? 0 : 1;
    } else if (a.kernel == "standard") {
      const ioattn::Status s = ioattn::peers::standard_attention(p, 1, nullptr);
      if (!s.is_ok()) {
        std::fprintf(stderr, "traffic_run: standard attention failed: %s\n", s.message.c_str());
        rc = 1;
      }
    }
  }
  ctr.toggle(false);
  if (a.counters) ctr.report();
  // One output element shows the forward ran; reading more would add misses that differ between
  // a kernel run (O just written) and the `none` run, and so would not cancel.
  std::printf("out[0] %.6g\n", double(ioattn::load_as_f32(o.data(), 0, a.dtype)));
  return rc;
}
