// ggml's CPU flash attention (ggml_flash_attn_ext) against ioattn's C ABI, same shapes, same data,
// same thread count, alternating over rounds; medians. Built by bench/peers/run.sh.
//
// Memory layout is (B, S, H, D) for everything, as in llama.cpp: ggml gets q/K/V as permuted views
// of [D, H, S, B] tensors (what llama.cpp's graph passes to FLASH_ATTN_EXT) and writes its result
// as [D, Hq, Sq, B], which is (B, S, H, D) again. Decode also takes a head-major cache (layout
// bhsd: each kv head's keys contiguous, ggml's [D, S, H, B] without a permute), where ggml's
// per-head loop reads memory in order; both sides read the same bytes in either layout.
//   ggml:   q f32, K/V f16, mask f16 [Sk, Sq, 1, 1] (0 / -inf) for causal, NULL otherwise.
//   ioattn prefill: q, K, V f32 (the f16 values widened; "forward f32"); decode: f32 q, f16 cache.
//
// usage: ggml_vs_ioattn prefill B H S D causal threads rounds
//        ggml_vs_ioattn decode  B Hq Hkv D Sk threads rounds [bshd|bhsd]
// prints one line: mode shape threads ioattn_ms ggml_ms speedup metric_ioattn metric_ggml maxdiff
#include <ggml-cpu.h>
#include <ggml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ioattn/ioattn.hpp>
#include <random>
#include <string>
#include <vector>

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void check(ioattn_status s, const char* what) {
  if (s != IOATTN_OK) {
    std::fprintf(stderr, "%s: %s: %s\n", what, ioattn_status_string(s), ioattn_last_error());
    std::exit(1);
  }
}

// Contiguous (B, S, H, D), through the C++ API's view so the layout is written in one place.
ioattn_tensor bshd(void* p, ioattn::DTypeCode dt, int64_t B, int64_t S, int64_t H, int64_t D) {
  return ioattn::TensorView::contiguous(p, dt, B, S, H, D).raw;
}

struct Ggml {
  ggml_context* ctx = nullptr;
  ggml_cgraph* gf = nullptr;
  ggml_cplan plan{};
  std::vector<uint8_t> work;
  ggml_tensor *q = nullptr, *k = nullptr, *v = nullptr, *mask = nullptr, *out = nullptr;

  // Tensors as ne = [D, H, S, B] (BSHD memory), permuted to [D, S, H, B] for the op.
  void build(int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv, int64_t D, bool causal, int threads,
             bool head_major) {
    size_t bytes = size_t(B * Sq * Hq * D) * 4 + size_t(B * Sk * Hkv * D) * 2 * 2 + (causal ? size_t(Sk * Sq) * 2 : 0) +
                   size_t(B * Sq * Hq * D) * 4 + (64u << 20);
    ggml_init_params ip = {bytes, nullptr, false};
    ctx = ggml_init(ip);
    ggml_tensor* q4 = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, Hq, Sq, B);
    q = ggml_permute(ctx, q4, 0, 2, 1, 3);
    if (head_major) {
      k = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, Sk, Hkv, B);
      v = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, Sk, Hkv, B);
    } else {
      k = ggml_permute(ctx, ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, Hkv, Sk, B), 0, 2, 1, 3);
      v = ggml_permute(ctx, ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, Hkv, Sk, B), 0, 2, 1, 3);
    }
    if (causal) mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, Sk, Sq, 1, 1);
    out = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f / std::sqrt(float(D)), 0.0f, 0.0f);
    ggml_prec_set_acc(out, GGML_PREC_F32);  // what llama.cpp requests for FA
    gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    plan = ggml_graph_plan(gf, threads, nullptr);
    work.resize(plan.work_size + 64);
    plan.work_data = work.data();
  }
  void run() {
    if (ggml_graph_compute(gf, &plan) != GGML_STATUS_SUCCESS) {
      std::fprintf(stderr, "ggml_graph_compute failed\n");
      std::exit(1);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 9) {
    std::fprintf(stderr,
                 "usage: %s prefill B H S D causal threads rounds\n"
                 "       %s decode  B Hq Hkv D Sk threads rounds\n",
                 argv[0], argv[0]);
    return 2;
  }
  std::string mode = argv[1];
  bool decode = mode == "decode";
  int64_t B = std::atoll(argv[2]);
  int64_t Hq, Hkv, D, Sq, Sk;
  bool causal = false;
  if (decode) {
    Hq = std::atoll(argv[3]);
    Hkv = std::atoll(argv[4]);
    D = std::atoll(argv[5]);
    Sk = std::atoll(argv[6]);
    Sq = 1;
  } else {
    Hq = Hkv = std::atoll(argv[3]);
    Sq = Sk = std::atoll(argv[4]);
    D = std::atoll(argv[5]);
    causal = std::atoi(argv[6]) != 0;
  }
  int threads = std::atoi(argv[7]);
  int rounds = std::atoi(argv[8]);

  Ggml g;
  const bool head_major = decode && argc > 9 && std::string(argv[9]) == "bhsd";
  if (decode && argc > 9 && !head_major && std::string(argv[9]) != "bshd") {
    std::fprintf(stderr, "layout must be bshd or bhsd, not '%s'\n", argv[9]);
    return 2;
  }
  g.build(B, Sq, Sk, Hq, Hkv, D, causal, threads, head_major);

  const int64_t nq = B * Sq * Hq * D, nkv = B * Sk * Hkv * D;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> U(-1.f, 1.f);
  float* qd = static_cast<float*>(g.q->data);
  for (int64_t i = 0; i < nq; ++i) qd[i] = U(rng);
  std::vector<float> tmp(nkv);
  for (auto* t : {g.k, g.v}) {
    for (auto& x : tmp) x = U(rng);
    ggml_fp32_to_fp16_row(tmp.data(), static_cast<ggml_fp16_t*>(t->data), nkv);
  }
  if (g.mask) {
    auto* m = static_cast<ggml_fp16_t*>(g.mask->data);
    const ggml_fp16_t zero = ggml_fp32_to_fp16(0.f), ninf = ggml_fp32_to_fp16(-INFINITY);
    for (int64_t i = 0; i < Sq; ++i)
      for (int64_t j = 0; j < Sk; ++j) m[i * Sk + j] = j <= i + (Sk - Sq) ? zero : ninf;
  }

  // ioattn inputs: the same values.
  std::vector<float> kf, vf, out_io(nq);
  if (!decode) {
    kf.resize(nkv);
    vf.resize(nkv);
    ggml_fp16_to_fp32_row(static_cast<ggml_fp16_t*>(g.k->data), kf.data(), nkv);
    ggml_fp16_to_fp32_row(static_cast<ggml_fp16_t*>(g.v->data), vf.data(), nkv);
  }
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.causal = causal ? 1 : 0;
  opt.num_threads = threads;
  ioattn_tensor tq = bshd(qd, ioattn::DTypeCode::f32, B, Sq, Hq, D);
  ioattn_tensor to = bshd(out_io.data(), ioattn::DTypeCode::f32, B, Sq, Hq, D);
  std::vector<int32_t> seqlens(B, int32_t(Sk));
  ioattn_kvcache cache{};
  if (decode) {
    auto cache_view = [&](void* p) {
      return head_major
                 ? ioattn::TensorView::strided(p, ioattn::DTypeCode::f16, B, Sk, Hkv, D, Hkv * Sk * D, D, Sk * D).raw
                 : bshd(p, ioattn::DTypeCode::f16, B, Sk, Hkv, D);
    };
    cache.k = cache_view(g.k->data);
    cache.v = cache_view(g.v->data);
    cache.seqlens = seqlens.data();
    cache.block_table = nullptr;
  }
  ioattn_tensor tk = bshd(kf.data(), ioattn::DTypeCode::f32, B, Sk, Hkv, D);
  ioattn_tensor tv = bshd(vf.data(), ioattn::DTypeCode::f32, B, Sk, Hkv, D);
  auto run_io = [&] {
    if (decode)
      check(ioattn_forward_kvcache(&tq, &cache, nullptr, nullptr, &to, nullptr, &opt), "ioattn_forward_kvcache");
    else
      check(ioattn_forward(&tq, &tk, &tv, &to, nullptr, &opt), "ioattn_forward");
  };

  // Warm-up and agreement check.
  run_io();
  g.run();
  const float* og = static_cast<const float*>(g.out->data);
  double maxdiff = 0;
  for (int64_t i = 0; i < nq; ++i) maxdiff = std::max(maxdiff, double(std::fabs(og[i] - out_io[i])));

  std::vector<double> t_io, t_gg;
  for (int r = 0; r < rounds; ++r) {
    // alternate which goes first
    for (int k = 0; k < 2; ++k) {
      bool io_turn = (k == 0) == (r % 2 == 0);
      double t0 = now_ms();
      if (io_turn)
        run_io();
      else
        g.run();
      double dt = now_ms() - t0;
      (io_turn ? t_io : t_gg).push_back(dt);
    }
  }
  double mi = median(t_io), mg = median(t_gg);
  double metric_io, metric_gg;
  const char* unit;
  if (decode) {
    double bytes = double(nkv) * 2 * 2;  // K and V, f16
    metric_io = bytes / (mi * 1e6);
    metric_gg = bytes / (mg * 1e6);
    unit = "GB/s";
    std::printf("decode %s B=%lld Hq=%lld Hkv=%lld D=%lld Sk=%lld", head_major ? "bhsd" : "bshd", (long long)B,
                (long long)Hq, (long long)Hkv, (long long)D, (long long)Sk);
  } else {
    double flops = 4.0 * B * Hq * Sq * Sk * D * (causal ? 0.5 : 1.0);
    metric_io = flops / (mi * 1e6);
    metric_gg = flops / (mg * 1e6);
    unit = "GFLOP/s";
    std::printf("prefill B=%lld H=%lld S=%lld D=%lld %s", (long long)B, (long long)Hq, (long long)Sq, (long long)D,
                causal ? "causal" : "full");
  }
  std::printf(" threads=%d ioattn_ms=%.2f ggml_ms=%.2f speedup=%.2f ioattn_%s=%.1f ggml_%s=%.1f maxdiff=%.2e\n",
              threads, mi, mg, mg / mi, unit, metric_io, unit, metric_gg, maxdiff);
  ggml_free(g.ctx);
  return 0;
}
