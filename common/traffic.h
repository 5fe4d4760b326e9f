// The traffic model: bytes a plan moves across each boundary of the memory hierarchy, for flash
// attention (tiled, S never materialized) and for standard attention (S and P written to and
// read back from memory), accounting for what stays resident in a level.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/planner.h"

namespace ioattn {

struct BoundaryTraffic {
  std::string name;  // "L1d-L2", "L2-L3", "L3-DRAM", "smem-L2", "L2-HBM"
  double flash_bytes = 0;
  double standard_bytes = 0;
  // The same totals split by direction: reads into the inner level, writes out of it.
  double flash_read_bytes = 0, flash_write_bytes = 0;
  double standard_read_bytes = 0, standard_write_bytes = 0;
};

struct TrafficReport {
  std::string hardware;
  std::vector<BoundaryTraffic> levels;  // innermost boundary first, the off-chip one last
  double flash_dram_bytes = 0;          // = levels.back().flash_bytes
  double standard_dram_bytes = 0;
  double flops = 0;
  // Roofline time implied by compute peak and off-chip bandwidth, seconds.
  double flash_roofline_s = 0, standard_roofline_s = 0;
  // GPU only (0 on a CPU): bytes the L2 slices look up at their tag stage, what Nsight Compute
  // counts as lts__t_bytes. Not a boundary of its own: the SMs' requests in 32-byte sectors
  // (lts__t_sectors_srcunit_tex) plus the lookups forwarded between L2 partitions, the part
  // given on its own as *_l2_fabric_bytes (srcunit_ltcfabric; gpu_traffic says when).
  double flash_l2_lookup_bytes = 0, standard_l2_lookup_bytes = 0;
  double flash_l2_fabric_bytes = 0, standard_l2_fabric_bytes = 0;
};

// How the CPU baseline's sgemm blocks its loops (GotoBLAS: driver/level3/level3.c), for the L1d-L2
// traffic of the two GEMMs. The defaults are OpenBLAS 0.3.21's single-precision values on Zen and
// Haswell, read at run time from its DYNAMIC_ARCH table (gotoblas_ZEN: sgemm_p = sgemm_q = 320,
// unroll_m = 8), and the tile of its sgemm_kernel_HASWELL (16 rows x 12 columns per step, from
// the disassembly: 16 floats of packed A and a 12-column B panel per k).
struct GemmBlocking {
  int64_t p = 320;        // rows of A packed per block (GEMM_P)
  int64_t q = 320;        // depth of a packed block (GEMM_Q)
  int64_t unroll = 8;     // packing granularity of rows (GEMM_UNROLL_M): remainder blocks round to it
  int64_t kernel_m = 16;  // rows of the micro-kernel's tile
  int64_t kernel_n = 12;  // columns of the micro-kernel's tile: the B chunk held while A streams
};

// What standard attention does with the score matrix S, in units of one fp32 S (B*Hq*Sq*Sk*4
// bytes) moved per pass over it.
struct StandardPasses {
  double s_reads = 2;   // the project's baseline: softmax reads S, the PV sgemm reads P
  double s_writes = 2;  // the QK^T sgemm writes S, the in-place softmax writes P
  std::string name = "baseline (sgemm QK^T -> S fp32, in-place softmax, sgemm PV)";
  // The implementation converts each (batch, q head)'s Q, K and V into fp32 scratch copies that
  // its GEMMs read, and accumulates O in an fp32 copy that is converted out at the end, as the
  // project's baseline does (bench/lib/standard_attention.cc). Where S does not stay in a level,
  // its passes evict the copies between their write and their read, so each copy crosses twice.
  bool staged_fp32_copies = false;
  GemmBlocking gemm;  // CPU: the sgemm's blocking, for its L1d-L2 traffic
  // Bytes per (query, key) of a mask that one pass per (batch, head) reads, broadcast over them
  // (PyTorch MATH's fp32 additive causal mask: 4); 0 for none.
  double broadcast_mask_bytes = 0;
  // GPU: Q, K and V are converted to fp32 copies first, the Q and K copies scaled by sqrt(scale)
  // in two more passes, both GEMMs run on fp32 operands and O is written in fp32 and converted
  // back (PyTorch MATH on f16/bf16 inputs: the kernels of bench/traffic/samples/gpu/math_*.txt).
  bool fp32_upcast = false;
  // GPU: the output tiles of the two GEMMs, extent along the queries x along the keys (S = Q K^T)
  // or the value dims (O = P V). An operand is read once per tile across it: K once per tile row
  // of queries, Q once per tile column of keys, V once per tile row, P once per tile column.
  int qk_tile_q = 128, qk_tile_k = 128, pv_tile_q = 128, pv_tile_d = 128;
};

// How a run starts. The default is the steady state of repeated calls: scratch memory is warm.
struct TrafficOptions {
  // The kernels' scratch (the flash workers' tiles; the baseline's S and fp32 copies) is freshly
  // allocated and its first touch fills it from memory, as in one cold call (and as a cache
  // simulator counts it, docs/traffic.md).
  bool cold_scratch = false;
  // Associativity of the CPU caches, for the reuse of a footprint near a level's capacity and for
  // set aliasing (the hardware profiles record sizes only). 8: zen3's L1d and L2, and what the
  // cachegrind comparison simulates; 0 treats every level as fully associative.
  int cache_ways = 8;
};

// The project's CPU baseline (bench/lib/standard_attention.cc) counted in the lines it brings
// into a level: cblas_sgemm with beta = 0 first zeroes S (a write-allocating pass), then adds
// Q K^T into it (a second pass); the softmax reads S and rewrites it in place (one pass: the lines
// are already there); the PV sgemm reads P. Plus the per-head fp32 staging copies.
StandardPasses cpu_baseline_passes();

// PyTorch's unfused MATH path on CUDA (f16/bf16 upcast to fp32, softmax, the _safe_softmax
// masking passes): calibrated on the three Nsight Compute measurements of
// bench/results/reference-figures.md, which show 5.36-5.5 reads and 3.7-3.8 writes of an fp32 S;
// see docs/model.md.
StandardPasses pytorch_math_passes();
// The same with is_causal: one more pass that reads S and a broadcast fp32 mask and writes S
// (from the kernel list of the causal Nsight Compute samples in bench/traffic/samples/gpu).
StandardPasses pytorch_math_passes(bool causal);

TrafficReport predict_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw);
TrafficReport predict_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw,
                              const StandardPasses& standard);
TrafficReport predict_traffic(const Problem& pr, const Plan& plan, const HardwareProfile& hw,
                              const StandardPasses& standard, const TrafficOptions& options);

}  // namespace ioattn
