// The tiling planner: invariants over a grid of problems on every built-in profile, monotone
// growth with cache size, thread-count independence of the split, and hand-checked plans,
// including FlashAttention-1's block rule.
#include <algorithm>
#include <numeric>
#include <vector>

#include "common/cpu_tiles.h"
#include "common/gpu_tiles.h"
#include "common/params.h"
#include "common/planner.h"
#include "cpu/cpu_backend.h"
#include "tests/catch.h"
#include "tests/support/support.h"

using namespace ioattn;
using ioattn::test::make_problem;
using ioattn::test::profile;

namespace {

int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

std::vector<Problem> grid() {
  std::vector<Problem> out;
  const int64_t lens[] = {1, 17, 512, 4096, 16384};
  const int64_t dims[] = {1, 7, 64, 128, 256, 512};
  const std::pair<int64_t, int64_t> heads[] = {{8, 8}, {32, 8}, {7, 1}};
  for (int64_t sq : lens)
    for (int64_t sk : lens)
      for (int64_t d : dims)
        for (auto [hq, hkv] : heads)
          for (DType t : {DType::f32, DType::bf16}) out.push_back(make_problem(hq, hkv, sq, sk, d, t));
  return out;
}

bool same(const Plan& a, const Plan& b) {
  return a.block_q == b.block_q && a.block_kv == b.block_kv && a.kv_splits == b.kv_splits &&
         a.working_set_bytes == b.working_set_bytes && a.workers == b.workers && a.rationale == b.rationale;
}

}  // namespace

TEST_CASE("CPU plans fit their level, divide by the register tile and never exceed the problem") {
  const auto problems = grid();
  for (const HardwareProfile& hw : builtin_profiles()) {
    if (hw.kind != DeviceKind::cpu) continue;
    const int lanes = hw.simd_bits / 32;
    const CpuRegisterTile tile = cpu_register_tile(hw.simd_bits);
    for (const Problem& pr : problems) {
      const Plan plan = plan_cpu(pr, hw);
      INFO(hw.name << " Sq=" << pr.seqlen_q << " Sk=" << pr.seqlen_k << " D=" << pr.head_dim << " Hq=" << pr.heads_q
                   << " Hkv=" << pr.heads_kv << ": " << plan.rationale);
      CHECK(plan.target_level == "L2");
      CHECK(plan.target_level_bytes == cpu_target_capacity(hw));
      CHECK(plan.working_set_bytes <= int64_t(kCpuCacheFill * double(plan.target_level_bytes)));
      CHECK(plan.working_set_bytes == cpu_working_set_bytes(plan.block_q, plan.block_kv, round_up(pr.head_dim, lanes),
                                                            round_up(pr.head_dim_v, lanes)));
      CHECK(plan.reg_rows == tile.rows);
      CHECK(plan.reg_cols == tile.vecs * lanes);
      CHECK(plan.block_q % plan.reg_rows == 0);
      CHECK(plan.block_q % (pr.heads_q / pr.heads_kv) == 0);  // whole query positions of a GQA group
      CHECK(plan.block_kv % plan.reg_cols == 0);
      CHECK(plan.head_dim_padded % lanes == 0);
      const int64_t quantum = std::lcm<int64_t>(plan.reg_rows, pr.heads_q / pr.heads_kv);
      CHECK(plan.block_q <= round_up(pr.seqlen_q * (pr.heads_q / pr.heads_kv), quantum));
      CHECK(plan.block_kv <= round_up(pr.seqlen_k, plan.reg_cols));
      CHECK(plan.kv_splits >= 1);
      CHECK(plan.kv_splits <= std::max<int64_t>(1, hw.cores));
      CHECK(plan.workers >= 1);
      CHECK(plan.workers <= hw.cores);
      CHECK(same(plan, plan_cpu(pr, hw)));  // deterministic
      CHECK_FALSE(plan.rationale.empty());
    }
  }
}

TEST_CASE("the split and the blocks do not depend on the thread count") {
  for (const HardwareProfile& hw : builtin_profiles()) {
    if (hw.kind != DeviceKind::cpu) continue;
    for (const Problem& pr : {make_problem(32, 8, 1, 16384, 128, DType::f16), make_problem(1, 1, 1, 4096, 64),
                              make_problem(16, 16, 4096, 4096, 128)}) {
      const Plan ref = plan_cpu(pr, hw, 1);
      for (int threads : {2, 3, 7, 64, 1000}) {
        const Plan p = plan_cpu(pr, hw, threads);
        INFO(hw.name << " threads=" << threads);
        CHECK(p.block_q == ref.block_q);
        CHECK(p.block_kv == ref.block_kv);
        CHECK(p.kv_splits == ref.kv_splits);
        CHECK(p.work_items == ref.work_items);
        CHECK(p.workers == std::min<int64_t>(threads, p.work_items));
      }
    }
  }
}

TEST_CASE("CPU blocks grow monotonically with the cache") {
  const auto problems = grid();
  for (const HardwareProfile& base : builtin_profiles()) {
    if (base.kind != DeviceKind::cpu) continue;
    for (size_t i = 0; i < problems.size(); i += 7) {
      const Problem& pr = problems[i];
      Plan prev;
      for (double factor : {0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0}) {
        HardwareProfile hw = base;
        for (MemoryLevel& l : hw.levels) {
          if (l.name == "L2") l.size_bytes = int64_t(double(l.size_bytes) * factor);
        }
        const Plan plan = plan_cpu(pr, hw);
        INFO(base.name << " x" << factor << " Sq=" << pr.seqlen_q << " Sk=" << pr.seqlen_k << " D=" << pr.head_dim);
        if (factor > 0.125) {
          CHECK(plan.block_q >= prev.block_q);
          CHECK(plan.block_kv >= prev.block_kv);
        }
        prev = plan;
      }
    }
  }
}

TEST_CASE("hand-checked CPU plans") {
  const HardwareProfile zen3 = profile("zen3");
  SECTION("prefill, 16 heads x 4096, D=128 on zen3") {
    // Budget 0.75 * 512 KiB = 393216 B. With block_kv = 128 and Dp = 128:
    // ws = 4*(bq*128 + 128*128*2 + bq*128 + bq*128) + 8*bq = 131072 + 1544*bq <= 393216
    // -> bq <= 169.8 -> 168 (a multiple of the 6-row AVX2 tile).
    const Plan p = plan_cpu(make_problem(16, 16, 4096, 4096, 128), zen3);
    CHECK(p.block_q == 168);
    CHECK(p.block_kv == 128);
    CHECK(p.working_set_bytes == 131072 + 1544 * 168);
    CHECK(p.kv_splits == 1);
    CHECK(p.work_items == 16 * 25);
    CHECK(p.workers == 2);
  }
  SECTION("decode, GQA 32/8 heads over 16384 f16 keys on zen3") {
    // G = 4: rows per unit = 4, block_q = lcm(6, 4) = 12 covers them; with the rows exhausted
    // block_kv grows: 12*(4*256+8) + bkv*4*(256+12) <= 393216 -> bkv <= 355.3 -> 352.
    const Plan p = plan_cpu(make_problem(32, 8, 1, 16384, 128, DType::f16), zen3);
    CHECK(p.block_q == 12);
    CHECK(p.block_kv == 352);
    // Decode rows (G x Sq = 4 <= cpu_decode_max_rows) run one task per (sequence, split) over
    // all 8 kv heads, so the key axis reads position by position: one sequence on 2 cores
    // splits the keys 2 ways (16384 / 352 / 4 = 11 would allow more).
    CHECK(p.kv_splits == 2);
    CHECK(p.work_items == 2);
  }
  SECTION("decode of one head on 56 Sapphire Rapids cores splits the keys") {
    // 1 task < 56 cores: the key axis splits in the decode's own blocks, each split keeping
    // >= cpu_decode_min_split_keys = 256 keys: min(56, 16384 / 256 = 64) = 56. (block_kv, 96,
    // is the packed path's and no longer limits it: 4 blocks of 96 per split allowed only 42.)
    const Plan p = plan_cpu(make_problem(1, 1, 1, 16384, 128), profile("spr-xeon"));
    CHECK(p.block_q == 8);
    CHECK(p.block_kv == 96);
    CHECK(p.kv_splits == 56);
    CHECK(p.work_items == 56);
    // 4096 keys on 2 cores split 2 ways (4096 / 256 = 16 allowed); under 512 keys they do not.
    CHECK(plan_cpu(make_problem(32, 8, 1, 4096, 128, DType::f16), zen3).kv_splits == 2);
    CHECK(plan_cpu(make_problem(32, 8, 1, 511, 128, DType::f16), zen3).kv_splits == 1);
    CHECK(plan_cpu(make_problem(32, 8, 1, 512, 128, DType::f16), zen3).kv_splits == 2);
    // Two sequences already fill two cores.
    CHECK(plan_cpu(make_problem(32, 8, 1, 4096, 128, DType::f16, 2), zen3).kv_splits == 1);
  }
  SECTION("few units on many cores cap block_q") {
    const Plan p = plan_cpu(make_problem(1, 1, 4096, 4096, 64), profile("neoverse-v2"));
    // 1 unit, 72 cores: block_q <= round_up(4096 / 72, 6) = 60, so >= 69 tasks.
    CHECK(p.block_q <= 60);
    CHECK(p.work_items >= 69);
  }
}

TEST_CASE("CPU plans say a head dim past the kernels' limit is unsupported") {
  const int64_t dmax = cpu_max_head_dim;
  for (const HardwareProfile& hw : ioattn::test::cpu_profiles())
    for (const auto& [d, dv] : {std::pair<int64_t, int64_t>{dmax, dmax}, {dmax + 1, dmax}, {64, dmax + 1}}) {
      INFO(hw.name << " D=" << d << " Dv=" << dv);
      Problem pr = make_problem(8, 8, 512, 512, d);
      pr.head_dim_v = dv;
      const Plan plan = plan_cpu(pr, hw);
      const bool fits = d <= dmax && dv <= dmax;
      CHECK(plan.supported == fits);
      CHECK((plan.rationale.find("unsupported") != std::string::npos) == !fits);
      CHECK(plan.block_q > 0);
    }
}

TEST_CASE("an overridden CPU tile carries its own working set") {
  // cpu::plan_for_params plans on the host, then replaces the tile with AttnParams::tiling. The
  // working set must be the one of the tile that runs (the traffic model spills a working set
  // larger than a level's share there), counted by hand here: fp32 Q^T (block_q x Dp), the K and
  // V blocks (block_kv x Dp and block_kv x Dvp), the scores (block_q x block_kv) and O
  // (block_q x Dvp), plus 8 bytes of running max and sum per row.
  AttnParams p;
  p.batch = 1;
  p.heads_q = p.heads_kv = 1;
  p.seqlen_q = p.seqlen_k = 2048;
  p.head_dim = 64;
  p.head_dim_v = 40;  // Dv pads on its own: 40 is a whole number of 8-lane vectors, not of 16
  p.num_threads = 1;
  const Plan planned = cpu::plan_for_params(p);
  const int64_t lanes = std::max(4, planning_host().simd_bits / 32);  // IOATTN_HW_PROFILE may set it
  const int64_t dp = planned.head_dim_padded, dvp = round_up(40, lanes);
  auto by_hand = [&](int64_t bq, int64_t bkv) {
    return 4 * (bq * dp + bkv * dp + bkv * dvp + bq * bkv + bq * dvp) + 8 * bq;
  };
  CHECK(planned.working_set_bytes == by_hand(planned.block_q, planned.block_kv));
  SECTION("both blocks") {
    p.tiling.block_q = 24;
    p.tiling.block_kv = 32;
    const Plan q = cpu::plan_for_params(p);
    REQUIRE(q.block_q == 24);
    REQUIRE(q.block_kv == 32);
    CHECK(q.working_set_bytes == by_hand(24, 32));
    CHECK(q.working_set_bytes < planned.working_set_bytes);
  }
  SECTION("one block: the other stays the planner's") {
    p.tiling.block_kv = 16;
    const Plan q = cpu::plan_for_params(p);
    REQUIRE(q.block_q == planned.block_q);
    REQUIRE(q.block_kv == 16);
    CHECK(q.working_set_bytes == by_hand(planned.block_q, 16));
  }
}

TEST_CASE("GPU plans take their tile from the constexpr table") {
  const auto problems = grid();
  for (const HardwareProfile& hw : builtin_profiles()) {
    if (hw.kind != DeviceKind::gpu) continue;
    for (const Problem& pr : problems) {
      const Plan plan = plan_gpu(pr, hw);
      INFO(hw.name << " D=" << pr.head_dim << ": " << plan.rationale);
      CHECK(plan.backend == BackendKind::cuda);
      CHECK(plan.target_level == "smem");
      CHECK(plan.target_level_bytes == hw.smem_per_block_bytes);
      CHECK(plan.working_set_bytes <= hw.smem_per_block_bytes);
      CHECK(plan.head_dim_padded >= pr.head_dim);
      CHECK(plan.ctas_per_sm >= 1);
      CHECK(plan.workers <= hw.cores * plan.ctas_per_sm);
      const bool decode = gpu_decode_rows(pr.heads_q / pr.heads_kv, pr.seqlen_q);
      // Hopper profiles plan the sm_90a prefill for the head dims its table holds.
      const GpuTileSm90 h = gpu_tile_sm90(int(pr.head_dim));
      const bool f32 = pr.dtype == DType::f32;
      if (!decode && !f32 && hw.compute_capability == 90 && h.supported && pr.head_dim == pr.head_dim_v) {
        CHECK(plan.kernel == "sm90");
        CHECK(plan.block_q == h.block_q);
        CHECK(plan.block_kv == h.block_kv);
        CHECK(plan.warps == 4 * (h.consumer_wgs + 1));
        CHECK(plan.stages == h.stages);
        CHECK(plan.working_set_bytes == gpu_tile_sm90_smem_bytes(h, int(pr.head_dim)));
        CHECK(plan.ctas_per_sm == 1);
        continue;
      }
      const GpuTile t = decode ? gpu_decode_tile(int(pr.head_dim)) : gpu_tile(int(pr.head_dim));
      const bool fits = t.supported && gpu_tile_smem_bytes(t, int(pr.head_dim)) <= hw.smem_per_block_bytes;
      // f32, head dims without a tile, or a tile this GPU cannot hold: the portable kernel.
      CHECK(plan.supported == (std::max(pr.head_dim, pr.head_dim_v) <= kGpuPortableMaxHeadDim));
      CHECK(plan.kernel == (f32 || !fits ? "portable" : decode ? "decode" : "sm80"));
      if (fits && !f32) {
        CHECK(plan.block_q == t.block_q);
        CHECK(plan.block_kv == t.block_kv);
        CHECK(plan.warps == t.warps);
        CHECK(plan.stages == t.stages);
        CHECK(plan.working_set_bytes == gpu_tile_smem_bytes(t, int(pr.head_dim)));
      } else {
        CHECK(plan.rationale.find("portable") != std::string::npos);
      }
    }
  }
  const HardwareProfile h200 = profile("h200-sxm");
  for (int d : {64, 96, 128, 256}) CHECK(plan_gpu(make_problem(16, 16, 4096, 4096, d, DType::bf16), h200).supported);
  // D = 80 has no tile: the portable kernel runs it; the figures are for D padded to 96.
  const Plan odd = plan_gpu(make_problem(16, 16, 4096, 4096, 80, DType::bf16), h200);
  CHECK(odd.supported);
  CHECK(odd.kernel == "portable");
  CHECK(odd.head_dim_padded == 96);
  // Past the portable kernel's registers: unsupported.
  CHECK_FALSE(plan_gpu(make_problem(16, 16, 4096, 4096, 320, DType::bf16), h200).supported);
  // f32 (the CLI's default dtype) has no tensor-core kernel: the plan says so, as the dispatch does.
  const Plan f32 = plan_gpu(make_problem(16, 16, 4096, 4096, 128, DType::f32), h200);
  CHECK(f32.supported);
  CHECK(f32.kernel == "portable");
  CHECK(f32.rationale.find("f32 has no tensor-core kernel") != std::string::npos);
  // The table's D=256 tile needs more than an RTX 4090's 99 KiB per block: the portable kernel.
  if (gpu_tile_smem_bytes(gpu_tile(256), 256) > profile("rtx4090").smem_per_block_bytes) {
    const Plan small = plan_gpu(make_problem(16, 16, 4096, 4096, 256, DType::bf16), profile("rtx4090"));
    CHECK(small.supported);
    CHECK(small.kernel == "portable");
  }
}

TEST_CASE("hand-checked GPU plans: residency and flash-decoding splits") {
  const HardwareProfile h200 = profile("h200-sxm");
  // The sm_90a prefill: 32 + 2 x 2 x 32 KiB of tiles + 2 KiB, and O's 32 KiB staging buffer;
  // one CTA of 384 threads per SM. D = 256 has no room for the staging buffer.
  const Plan hopper = plan_gpu(make_problem(16, 16, 4096, 4096, 128, DType::bf16), h200);
  CHECK(hopper.kernel == "sm90");
  CHECK(hopper.working_set_bytes == 194 * 1024);
  CHECK(plan_gpu(make_problem(16, 16, 4096, 4096, 256, DType::bf16), h200).working_set_bytes == 194 * 1024);
  CHECK(hopper.warps == 12);
  CHECK(hopper.ctas_per_sm == 1);
  CHECK(hopper.work_items == 16 * (4096 / 128));
  // The sm_80 kernel's residency on the same chip (a profile that is not compute capability 9.0).
  HardwareProfile sm80 = h200;
  sm80.compute_capability = 80;
  const Plan p = plan_gpu(make_problem(16, 16, 4096, 4096, 128, DType::bf16), sm80);
  CHECK(p.kernel == "sm80");
  const GpuTile t = gpu_tile(128);
  const int64_t smem = gpu_tile_smem_bytes(t, 128);
  // Resident CTAs per SM: shared memory (228 KiB / (tile + 1 KiB reserved)) and registers
  // (65536 / (threads * 255)) both bound it.
  const int64_t expect = std::min<int64_t>(233472 / (smem + 1024), 65536 / (t.warps * 32 * 255));
  CHECK(p.ctas_per_sm == std::max<int64_t>(1, expect));
  CHECK(p.work_items == 16 * (4096 / t.block_q));
  CHECK(p.kv_splits == 1);
  // Decode fills the resident slots of one wave: the D = 128 decode tile (106 KiB) leaves two
  // CTAs per SM, 264 slots. 8 x 32 kv heads = 256 CTAs: no split...
  const Plan whole = plan_gpu(make_problem(32, 32, 1, 4096, 128, DType::bf16, 8), h200);
  CHECK(whole.ctas_per_sm == 2);
  CHECK(whole.kv_splits == 1);
  // ...one sequence of 8 heads is 8 CTAs: the 131072 keys split floor(264 / 8) = 33 ways.
  const Plan d = plan_gpu(make_problem(8, 8, 1, 131072, 128, DType::bf16), h200);
  CHECK(d.kv_splits == 264 / 8);
  CHECK(d.work_items == 8 * d.kv_splits);
  // GQA decode packs the 4 query heads of a kv head into one CTA: 8 x 8 = 64 CTAs, split
  // floor(264 / 64) = 4 ways (the prefill count, 8 x 32 CTAs of one head each, would not split).
  const Plan g = plan_gpu(make_problem(32, 8, 1, 131072, 128, DType::bf16, 8), h200);
  CHECK(g.units == 64);
  CHECK(g.rows_per_unit == 4);
  CHECK(g.block_q == kGpuDecodeMaxRows);
  CHECK(g.kv_splits == 4);
  CHECK(g.work_items == 256);
  // Short caches keep >= 4 blocks of 64 keys per split: 1000 keys = 16 blocks, 4 splits.
  CHECK(plan_gpu(make_problem(8, 8, 1, 1000, 128, DType::bf16), h200).kv_splits == 4);
  // 16 rows per kv head still decode (G = 8, Sq = 2); 17 would not fit the tile.
  CHECK(plan_gpu(make_problem(32, 4, 2, 4096, 128, DType::bf16), h200).block_q == kGpuDecodeMaxRows);
  CHECK(plan_gpu(make_problem(17, 1, 1, 4096, 128, DType::bf16), h200).block_q == gpu_tile(128).block_q);
}

TEST_CASE("FlashAttention-1's rule Bc = ceil(M/4d), Br = min(Bc, d)") {
  // M = 100 KiB of fp32 = 25600 elements, d = 64: Bc = ceil(25600 / 256) = 100, Br = min(100, 64) = 64.
  PaperBlocks b = flash1_paper_blocks(100 * 1024 / 4, 64);
  CHECK(b.block_kv == 100);
  CHECK(b.block_q == 64);
  // d = 128: Bc = 50, Br = 50 (Bc < d).
  b = flash1_paper_blocks(25600, 128);
  CHECK(b.block_kv == 50);
  CHECK(b.block_q == 50);
  // A100's 192 KiB of SRAM per SM in bf16 (98304 elements), d = 64: Bc = 384, Br = 64.
  b = flash1_paper_blocks(98304, 64);
  CHECK(b.block_kv == 384);
  CHECK(b.block_q == 64);
  // The rule's point: Q, K, V and O blocks (Br*d, 2*Bc*d, Br*d elements) fit M, up to the
  // rounding of the ceiling (at most one extra key row per block).
  for (int64_t m : {4096, 25600, 98304, 1 << 20}) {
    for (int64_t d : {16, 64, 128, 256}) {
      const PaperBlocks p = flash1_paper_blocks(m, d);
      CHECK(p.block_kv * d * 4 <= m + 4 * d);
      CHECK(2 * p.block_q * d + 2 * p.block_kv * d <= m + 2 * d);
    }
  }
  // Our CPU planner is the same construction with more in the working set (the score block and
  // the m, l rows) and the register tile's divisibility: when both are neutralized, i.e. a
  // budget of M elements of fp32 and blocks set to the paper's, the planner's working-set
  // formula without the score block equals the paper's Q + K + V + O accounting.
  const int64_t d = 64, m = 25600;
  const PaperBlocks p = flash1_paper_blocks(m, d);
  const int64_t ours = cpu_working_set_bytes(p.block_q, p.block_kv, d, d) - 4 * p.block_q * p.block_kv - 8 * p.block_q;
  CHECK(ours == 4 * (p.block_q * d + 2 * p.block_kv * d + p.block_q * d));
  CHECK(ours <= 4 * m);
}
