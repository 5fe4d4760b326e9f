// Peers and ceilings measured in the same run as the kernels (bench/bench_cpu, `ioattn bench`):
// the machine's fp32 FMA peak and read bandwidth, and standard attention with the score matrix
// materialized (OpenBLAS sgemm). Not part of libioattn, which needs no BLAS.
#pragma once

#include <cstddef>

#include "common/params.h"
#include "common/status.h"

namespace ioattn::peers {

// fp32 FMA throughput in GFLOP/s: `threads` threads, each running 12 independent FMA chains of
// the widest Highway vector on registers only (4-cycle latency x 2 FMA ports = 8 chains keep a
// Zen 3 / Skylake core saturated; 12 leave margin). Best of 3 runs of about `seconds` each.
double measure_fma_peak(int threads, double seconds = 0.2);

// One run of the same probe (about 50 ms), no best-of: to be timed right beside a kernel call,
// so that the ratio of the two sees the machine in one state (time_read_once's role for
// memory-bound kernels).
double fma_probe_once(int threads);

// Read bandwidth in GB/s: `threads` threads each stream their own slice of one `bytes` buffer
// with vector loads into 8 accumulators, repeatedly; best of 3 runs of about `seconds` each. A
// buffer far larger than the last-level cache measures DRAM, a smaller one the cache.
double measure_read_bandwidth(int threads, size_t bytes, double seconds = 0.2);

// Seconds for `threads` threads to read the n buffers (buffers[i], bytes[i] each) once, each
// thread a contiguous share of every buffer: the read time of exactly the bytes a memory-bound
// kernel streams, to be timed right beside it so that both see the machine in the same state.
double time_read_once(int threads, const void* const* buffers, const size_t* bytes, int n);

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
