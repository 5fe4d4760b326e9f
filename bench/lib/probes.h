// Highway-dispatched pieces of the peers (bench/lib/probes.cc); internal to bench/lib.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ioattn::peers {

// Runs `iterations` iterations of 4 steps of independent FMA chains held in registers (12 on
// targets with 16 vector registers, 24 with 32); the result only keeps them alive.
float fma_chains(int64_t iterations);
// FLOPs one iteration of fma_chains performs on the dispatched target (4 x chains x 2 x lanes).
int64_t fma_flops_per_iteration();
// Dependent integer adds a step of fma_clock_chain for a core issuing fma_per_cycle FMAs a cycle
// at the dispatched width (24, 12 or 6; 12 when not known): its cycles a step.
int fma_clock_adds(int fma_per_cycle);
// `iterations` steps of 20 FMAs beside fma_clock_adds(fma_per_cycle) dependent integer adds,
// which set the pace at the clock the core holds while its FMA pipes run 83% busy.
uint64_t fma_clock_chain(int64_t iterations, int fma_per_cycle);
// fp32 lanes of the dispatched target's vector.
int float_lanes();
// Highway's name for the dispatched target ("AVX3", "AVX2", "NEON").
const char* probe_target();
// Whether the dispatched target's MulAdd is one FMA instruction.
bool probe_native_fma();
// Sums n floats (64-byte aligned, n a multiple of the widest target's vector) in `streams`
// (1, 2, 4 or 8) contiguous parts read side by side.
float read_stream(const float* data, size_t n, int streams = 1);
// Masks keys outside [lo, hi), soft-caps, and writes the normalized softmax of the row in place;
// returns the row's lse.
float softmax_row(float* row, int64_t n, int64_t lo, int64_t hi, float softcap);

}  // namespace ioattn::peers
