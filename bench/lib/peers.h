// Peers and ceilings measured in the same run as the kernels (bench/bench_cpu, `ioattn bench`):
// the machine's fp32 FMA peak and read bandwidth, and standard attention with the score matrix
// materialized (OpenBLAS sgemm). Not part of libioattn, which needs no BLAS.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "common/cpu_cores.h"
#include "common/params.h"
#include "common/status.h"

namespace ioattn::peers {

// Physical cores `threads` threads occupy at one thread per core: at most the distinct cores of
// the affinity mask (SMT siblings count once).
int cores_for(int threads);

// The clock in GHz: `threads` threads each run a dependent chain of integer adds (one cycle each
// on every core in the table) for about `seconds` and divide by their own CPU time, so other
// processes on the cores do not lower it; the mean over the threads, best of 3 runs. With
// fma_per_cycle > 0 (core_fma's figure) the chain runs beside FMAs of the dispatched width that
// keep such a core's FMA pipes 83% busy: the clock the FMA probe runs at where the core lowers it
// for dense wide FMAs. 0 runs the adds alone.
double measure_clock_ghz(int threads, int fma_per_cycle, double seconds = 0.05);

// The FMA probe beside its theoretical figure: cores x FMA/cycle x lanes x 2 FLOP x measured
// clock. The probe: `threads` threads, each running independent FMA chains of the dispatched
// Highway vector in registers (12 with 16 vector registers, 24 with 32: latency x FMA ports is
// 8-10 on the x86 cores of core_fma's table, 16 on Neoverse V1/V2), 3 runs of about `seconds`.
struct FmaCeiling {
  double probe_gflops = 0;  // FLOPs over wall time, best of the 3 runs: the fp32 FMA peak
  // FLOPs over each thread's own CPU time, summed: the probe's rate while it runs, which other
  // processes sharing the cores do not lower (as the clock's); best of the same 3 runs.
  double probe_core_gflops = 0;
  double clock_ghz = 0;          // measure_clock_ghz under FMA load, the higher of before and after
  double integer_clock_ghz = 0;  // measure_clock_ghz without FMAs, for comparison
  int cores = 0, lanes = 0;
  std::string target;  // Highway target the probe ran
  CoreFma core;
  double theoretical_gflops() const;  // 0 when the core is not in the table
  // "2 cores x 2 FMA/cycle x 16 lanes x 2 x 2.90 GHz = 371.2 GFLOP/s (<core>, <target>; clock
  // under FMA load, 3.20 GHz integer-only)"; "theoretical peak unknown: ..." off the table.
  std::string describe() const;
  // (name, value) for a benchmark's counters: GFLOP/s, core_GFLOP/s, GHz, int_GHz and, when the
  // core is in the table, theory_GFLOP/s, of_theory% and core_of_theory%.
  std::vector<std::pair<std::string, double>> counters() const;
};
FmaCeiling measure_fma_ceiling(int threads, double seconds = 0.2);

// Restricts Highway's dispatch, the probes' and the kernels', to the target of that name
// ("AVX2", "SSE4", ...); false when this build or machine lacks it.
bool force_target(const std::string& name);
// force_target(IOATTN_BENCH_TARGET) when the variable is set; false (after a message naming the
// available targets on stderr) when it names none of them.
bool apply_target_env();

// One run of the FMA probe (about 50 ms), no best-of: to be timed right beside a kernel call,
// so that the ratio of the two sees the machine in one state (time_read_once's role for
// memory-bound kernels).
double fma_probe_once(int threads);

// Streams per thread the read probe tries: one sequential stream, or a thread's slice split into
// several parts read side by side (each a hardware-prefetcher stream of its own).
inline constexpr int kReadStreams[] = {1, 2, 4, 8};

// Read bandwidth in GB/s: `threads` threads each stream their own slice of one `bytes` buffer
// with vector loads into 8 accumulators, repeatedly, once per entry of kReadStreams; each method
// best of 3 runs of about `seconds`, the ceiling the best method. A buffer far larger than the
// last-level cache measures DRAM, a smaller one the cache.
struct ReadCeiling {
  double gbs = 0;
  int streams = 1;                                 // the method that won
  std::vector<std::pair<int, double>> by_streams;  // (streams per thread, GB/s) of each method
  // (name, value) for a benchmark's counters: GB/s, then s<streams>_GB/s of each method.
  std::vector<std::pair<std::string, double>> counters() const;
  std::string describe() const;  // "best: N stream(s) per thread"
};
ReadCeiling measure_read_ceiling(int threads, size_t bytes, double seconds = 0.2);

// Seconds for `threads` threads to read the n buffers (buffers[i], bytes[i] each) once, each
// thread a contiguous share of every buffer in `streams` parts side by side: the read time of
// exactly the bytes a memory-bound kernel streams, to be timed right beside it so that both see
// the machine in the same state.
double time_read_once(int threads, const void* const* buffers, const size_t* bytes, int n, int streams = 1);

// Standard attention, the way unfused frameworks compute it: per (batch, query head),
// S = scale * Q K^T materialized in fp32 by cblas_sgemm, masked (-inf) and soft-capped, a row
// softmax with Highway's Exp (normalized P written over S), then O = P V by cblas_sgemm. Same
// semantics as the kernels (docs/api.md) for dense requests with finite inputs (no varlen, cache or pages:
// unsupported). OpenBLAS and the softmax use `threads` threads. *scratch_bytes (may be null)
// receives the peak extra memory: S plus fp32 copies of one head's Q, K, V and O.
Status standard_attention(const AttnParams& p, int threads, size_t* scratch_bytes);

// The extra memory standard_attention allocates for p (what it reports in *scratch_bytes).
size_t standard_attention_scratch_bytes(const AttnParams& p);

}  // namespace ioattn::peers
