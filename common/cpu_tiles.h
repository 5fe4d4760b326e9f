// The CPU register tile, shared by the planner (plan_cpu) and the Highway kernels so that block
// sizes are always whole multiples of what the micro-kernel consumes. Owned by cpu/.
#pragma once

namespace ioattn {

struct CpuRegisterTile {
  int rows;  // query rows held in registers by the micro-kernel
  int vecs;  // vectors of columns per row
};

// simd_bits: width of the dispatched target (128 SSE4/NEON, 256 AVX2, 512 AVX-512).
// AVX2 has 16 vector registers: 6 rows x 2 vectors = 12 accumulators + 2 loads + 1 broadcast.
// AVX-512 has 32: 8 rows x 3 vectors = 24 accumulators + 3 loads + 1 broadcast.
constexpr CpuRegisterTile cpu_register_tile(int simd_bits) {
  return simd_bits >= 512 ? CpuRegisterTile{8, 3} : CpuRegisterTile{6, 2};
}

}  // namespace ioattn
