// Decode benchmark (one query token per sequence against a KV cache), through the public
// ioattn_forward_kvcache entry point. Decode is memory-bound: the figure of merit is the K/V
// bytes read per second, reported against a plain vector read of the same K/V bytes by as many
// threads, timed before and after every call (of_read%: the median per-call ratio), and against a
// 1 GiB read measured once at the start (of_dram%, bench/lib: the best of 1, 2, 4 and 8 streams per
// thread; the paired reads use the method that won). model_MiB is the traffic model's DRAM bytes for the call on the
// detected host; of_model% the time those bytes take at the paired read's rate over the measured
// time (100% = the kernel moves only what the model says, as fast as a plain read).
// fma_GB/s is the K/V rate at which the call's arithmetic (2 flops per multiply-add, Q K^T and
// P V: 4 B Hq Sk D flops) would run at the FMA probe measured once at the start (ceiling/fma_peak
// prints it beside the theoretical peak, cores x FMA/cycle x lanes x 2 x clock); of_bound% divides
// GB/s by the lower of it and the paired read. Where fma_GB/s is under the read (few cores, GQA
// 4, a core with one 256-bit FMA per cycle), no kernel reaches the read, and of_bound% says how
// close this one comes to what the machine allows.
//
//   bench_decode --benchmark_filter='ceiling|B:8'
//   IOATTN_BENCH_TARGET=AVX2 bench_decode ...       probes and kernels on AVX2
//
// Shapes: a GQA decoder's, Hq = 32 query heads over Hkv = 8 KV heads (GQA 4), D = 128, f32 q/out
// (edge decoders keep activations in f32) over f16 or bf16 caches of 4k..32k tokens, positions
// outer ([B][S][Hkv][D], llama.cpp's and FlashAttention's layout); f16_groups reads one 1 GiB f16
// cache with Hq = 8, 16 and 32 (G = 1, 2, 4); f16_head_major reads a head-major cache
// ([B][Hkv][S][D], each head's keys contiguous) at G = 1 and 4.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "bench/lib/peers.h"
#include "common/dtype.h"
#include "common/hardware.h"
#include "common/planner.h"
#include "common/traffic.h"
#include "cpu/cpu_backend.h"
#include "hwy/aligned_allocator.h"
#include "ioattn/ioattn.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kHq = 32, kHkv = 8, kDim = 128;

struct Decode {
  int64_t batch, keys;
  ioattn::DType cache_dtype;
  // K and V on cache-line boundaries, as a framework's tensors are (a plain vector is 16-byte
  // aligned under glibc, so every 64-byte load would span two lines). On the H200 host's Xeon the
  // two alignments measured the same, paired read 21-22 GB/s and decode 67-75% of it at 2 threads.
  size_t elements;
  hwy::AlignedFreeUniquePtr<uint16_t[]> k, v;
  std::vector<float> q, out;
  std::vector<int32_t> seqlens;
  ioattn_kvcache cache{};
  ioattn_tensor tq{}, to{};

  Decode(int64_t b, int64_t s, int64_t hq, ioattn::DType t, bool head_major) : batch(b), keys(s), cache_dtype(t) {
    const int64_t row = kHkv * kDim;
    elements = size_t(b * s * row);
    k = hwy::AllocateAligned<uint16_t>(elements);
    v = hwy::AllocateAligned<uint16_t>(elements);
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.f, 1.f);
    for (size_t i = 0; i < elements; ++i) {
      ioattn::store_from_f32(k.get(), int64_t(i), t, dist(rng));
      ioattn::store_from_f32(v.get(), int64_t(i), t, dist(rng));
    }
    q.resize(size_t(b * hq * kDim));
    for (float& x : q) x = dist(rng);
    out.assign(q.size(), 0.f);
    seqlens.assign(size_t(b), int32_t(s));
    const int64_t seq_stride = head_major ? kDim : row, head_stride = head_major ? s * kDim : kDim;
    cache.k = {k.get(), int32_t(t), b, s, kHkv, kDim, s * row, seq_stride, head_stride};
    cache.v = {v.get(), int32_t(t), b, s, kHkv, kDim, s * row, seq_stride, head_stride};
    cache.seqlens = seqlens.data();
    tq = {q.data(), IOATTN_F32, b, 1, hq, kDim, hq * kDim, hq * kDim, kDim};
    to = {out.data(), IOATTN_F32, b, 1, hq, kDim, hq * kDim, hq * kDim, kDim};
  }
  double kv_bytes() const { return double(elements) * 2.0 * 2.0; }
};

// The start-up read ceiling at 1 GiB, best of kReadStreams' methods; the paired reads use the
// method that won.
const ioattn::peers::ReadCeiling& dram_read(int threads) {
  static ioattn::peers::ReadCeiling cached[64];
  if (cached[threads].gbs == 0) cached[threads] = ioattn::peers::measure_read_ceiling(threads, size_t(1) << 30);
  return cached[threads];
}

double dram_read_gbs(int threads) { return dram_read(threads).gbs; }

const ioattn::peers::FmaCeiling& fma_ceiling(int threads) {
  static ioattn::peers::FmaCeiling cached[64];
  if (cached[threads].probe_gflops == 0) cached[threads] = ioattn::peers::measure_fma_ceiling(threads);
  return cached[threads];
}

double fma_peak_gflops(int threads) { return fma_ceiling(threads).probe_gflops; }

// The probe beside its theoretical figure; the label spells the latter out.
void BM_FmaPeak(benchmark::State& state) {
  const int threads = int(state.range(0));
  for (auto _ : state) fma_ceiling(threads);
  const ioattn::peers::FmaCeiling& c = fma_ceiling(threads);
  for (const auto& [name, value] : c.counters()) state.counters[name] = value;
  state.SetLabel(c.describe());
}

// The best method's GB/s, and each method's (s<streams per thread>_GB/s).
void BM_ReadBandwidth(benchmark::State& state) {
  const int threads = int(state.range(0));
  for (auto _ : state) dram_read(threads);
  const ioattn::peers::ReadCeiling& r = dram_read(threads);
  for (const auto& [name, value] : r.counters()) state.counters[name] = value;
  state.SetLabel(r.describe());
}

void BM_Decode(benchmark::State& state, ioattn::DType cache_dtype, bool head_major) {
  const int threads = int(state.range(2));
  Decode d(state.range(0), state.range(1), state.range(3), cache_dtype, head_major);
  ioattn_options opt;
  ioattn_options_default(&opt);
  opt.num_threads = threads;
  if (ioattn_forward_kvcache(&d.tq, &d.cache, nullptr, nullptr, &d.to, nullptr, &opt) != IOATTN_OK) {
    state.SkipWithError(ioattn_last_error());
    return;
  }
  // Each timed call is paired with a plain read of the same K and V bytes by as many threads,
  // just before and just after it: the shared VM's bandwidth drifts by 2x within minutes (noisy
  // neighbours) and moves within seconds too, so each call is judged against the mean of its two
  // reads and of_read% is the median of those per-call ratios (a burst of a neighbour's traffic
  // during one pair moves one sample, not the figure). The one-off 1 GiB read (dram_GB/s) is
  // reported beside it.
  const void* buffers[2] = {d.k.get(), d.v.get()};
  const size_t bytes[2] = {d.elements * 2, d.elements * 2};
  const int streams = dram_read(threads).streams;
  double total = 0, read_total = 0;
  std::vector<double> ratios;
  for (auto _ : state) {
    const double before = ioattn::peers::time_read_once(threads, buffers, bytes, 2, streams);
    const auto t0 = Clock::now();
    ioattn_forward_kvcache(&d.tq, &d.cache, nullptr, nullptr, &d.to, nullptr, &opt);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    state.SetIterationTime(dt);
    const double read = 0.5 * (before + ioattn::peers::time_read_once(threads, buffers, bytes, 2, streams));
    total += dt;
    read_total += read;
    ratios.push_back(read / dt);
  }
  std::nth_element(ratios.begin(), ratios.begin() + ratios.size() / 2, ratios.end());
  const double gbs = d.kv_bytes() * double(state.iterations()) / total * 1e-9;
  const double dram = dram_read_gbs(threads);
  state.counters["KV_MiB"] = d.kv_bytes() / double(1 << 20);
  state.counters["GB/s"] = gbs;
  const double read_gbs = d.kv_bytes() * double(state.iterations()) / read_total * 1e-9;
  state.counters["read_GB/s"] = read_gbs;
  state.counters["of_read%"] = 100.0 * ratios[ratios.size() / 2];
  state.counters["dram_GB/s"] = dram;
  state.counters["of_dram%"] = 100.0 * gbs / dram;
  const double flops = 4.0 * double(d.batch * state.range(3) * d.keys * kDim);
  const double fma_gbs = fma_peak_gflops(threads) * d.kv_bytes() / flops;
  state.counters["fma_GB/s"] = fma_gbs;
  state.counters["of_bound%"] = 100.0 * gbs / std::min(read_gbs, fma_gbs);
  // The traffic model's DRAM bytes for this call on the detected host with the plan the call
  // runs (K/V once, plus q, out and the split partials), and the time they would take at the
  // paired read's rate against the measured time: how far the kernel is from the model's floor.
  ioattn::Problem pr;
  pr.batch = d.batch;
  pr.heads_q = state.range(3);
  pr.heads_kv = kHkv;
  pr.seqlen_q = 1;
  pr.seqlen_k = d.keys;
  pr.head_dim = pr.head_dim_v = kDim;
  pr.kv_dtype = cache_dtype;
  const ioattn::HardwareProfile host = ioattn::detect_host();  // cached after the first call
  const double model = ioattn::predict_traffic(pr, ioattn::plan_cpu(pr, host, threads), host).flash_dram_bytes;
  state.counters["model_MiB"] = model / double(1 << 20);
  state.counters["of_model%"] = 100.0 * (model / (read_gbs * 1e9)) / (total / double(state.iterations()));
  state.SetLabel(std::string(ioattn::dtype_name(cache_dtype)) + (head_major ? " head-major" : "") + " cache, f32 q, " +
                 (fma_gbs < read_gbs ? "fma-bound" : "read-bound"));
}

void DecodeArgs(benchmark::internal::Benchmark* b) {
  const int all = ioattn::default_threads();
  for (int64_t batch : {1, 2, 4, 8})
    for (int64_t keys : {4096, 16384, 32768}) b->Args({batch, keys, all, kHq});
  b->ArgNames({"B", "Sk", "threads", "Hq"})->UseManualTime()->MinTime(0.5)->Unit(benchmark::kMillisecond);
}

// The same 1 GiB f16 cache read by 1, 2 and 4 query heads per kv head: the bytes stay, the
// arithmetic per byte scales with G. On the 2-vCPU dev VM at 2 threads G = 1 / 2 / 4 read
// 88 / 81 / 72% of the paired read (bench/results/cpu-decode.md, 2026-12-04): what keeps decode
// from the read's bandwidth on few cores is the arithmetic between the prefetches.
void GroupArgs(benchmark::internal::Benchmark* b) {
  for (int64_t hq : {kHkv, 2 * kHkv, 4 * kHkv}) b->Args({8, 32768, ioattn::default_threads(), hq});
  b->ArgNames({"B", "Sk", "threads", "Hq"})->UseManualTime()->MinTime(0.5)->Unit(benchmark::kMillisecond);
}

// A head-major cache of 512 MiB at G = 1 and 4: each kv head is two sequential streams.
void HeadMajorArgs(benchmark::internal::Benchmark* b) {
  for (int64_t hq : {kHkv, 4 * kHkv}) b->Args({4, 32768, ioattn::default_threads(), hq});
  b->ArgNames({"B", "Sk", "threads", "Hq"})->UseManualTime()->MinTime(0.5)->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(BM_ReadBandwidth)
    ->Name("ceiling/dram_read")
    ->Arg(ioattn::default_threads())
    ->ArgName("threads")
    ->Iterations(1);
BENCHMARK(BM_FmaPeak)->Name("ceiling/fma_peak")->Arg(ioattn::default_threads())->ArgName("threads")->Iterations(1);
BENCHMARK_CAPTURE(BM_Decode, f16, ioattn::DType::f16, false)->Apply(DecodeArgs);
BENCHMARK_CAPTURE(BM_Decode, bf16, ioattn::DType::bf16, false)->Apply(DecodeArgs);
BENCHMARK_CAPTURE(BM_Decode, f16_groups, ioattn::DType::f16, false)->Apply(GroupArgs);
BENCHMARK_CAPTURE(BM_Decode, f16_head_major, ioattn::DType::f16, true)->Apply(HeadMajorArgs);

int main(int argc, char** argv) {
  if (!ioattn::peers::apply_target_env()) return 2;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
