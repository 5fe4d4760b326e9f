// Highway-dispatched pieces of the peers (bench/lib/probes.cc); internal to bench/lib.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ioattn::peers {

// Runs `iterations` steps of 12 independent FMA chains; the result only keeps them alive.
float fma_chains(int64_t iterations);
// FLOPs one step of fma_chains performs on the dispatched target (12 x 2 x lanes).
int64_t fma_flops_per_iteration();
// Sums n floats (64-byte aligned, n a multiple of 8 vectors of the widest target).
float read_stream(const float* data, size_t n);
// Masks keys outside [lo, hi), soft-caps, and writes the normalized softmax of the row in place;
// returns the row's lse.
float softmax_row(float* row, int64_t n, int64_t lo, int64_t hi, float softcap);

}  // namespace ioattn::peers
