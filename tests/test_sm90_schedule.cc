// The sm_90a forward's persistent tile order (gpu/sm90/schedule.cuh) on the host, so that every
// machine's test run checks it, GPU or not: every work tile once, each CTA's work tiles heaviest
// first within a section, a section's pairs together and its K/V within its share of the L2, and
// causal work even over 132 SMs without a dispatcher.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "common/params.h"
#include "gpu/sm90/schedule.cuh"
#include "tests/catch.h"

using ioattn::AttnParams;

namespace {

// The fields make_schedule reads.
AttnParams shape(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seqlen_q, int64_t seqlen_k) {
  AttnParams p;
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  return p;
}

}  // namespace

TEST_CASE("sm_90a schedule: every work tile once, heaviest first per CTA, a section's pairs together", "[sm90]") {
  struct Shape {
    int64_t batch, heads_q, heads_kv, sq, sk, l2;
  };
  // One section; several, the last one short; one pair per section (K/V past its share of the
  // L2); a pair with more work tiles than two rounds; fewer work tiles than SMs.
  const Shape shapes[] = {{3, 8, 2, 300, 300, 1 << 20},     {5, 6, 3, 129, 1000, 1 << 20},   {2, 4, 4, 1, 7, 1 << 20},
                          {7, 2, 1, 640, 4096, 1 << 20},    {4, 16, 16, 257, 50, 0},         {1, 1, 1, 128, 1, 1 << 30},
                          {2, 16, 2, 6000, 6000, 50 << 20}, {32, 32, 32, 512, 512, 50 << 20}};
  for (const Shape& sh : shapes)
    for (const int sms : {1, 7, 132, 100000})
      for (const int mask : {0, 1, 2}) {  // none, causal, a window
        AttnParams p = shape(sh.batch, sh.heads_q, sh.heads_kv, sh.sq, sh.sk);
        p.causal = mask == 1;
        if (mask == 2) p.window_left = 64;
        const ioattn::gpu::sm90::TileSchedule sched = ioattn::gpu::sm90::make_schedule(p, 128, 64, sms, sh.l2);
        INFO("B=" << sh.batch << " Hq=" << sh.heads_q << " Hkv=" << sh.heads_kv << " Sq=" << sh.sq << " Sk=" << sh.sk
                  << " mask=" << mask << " SMs=" << sms << " section_pairs=" << sched.section_pairs);
        const int64_t m_blocks = (sh.sq + 127) / 128, group = sh.heads_q / sh.heads_kv;
        // A section's K and V fit its share of the L2: half under a mask, a sixth without.
        const int64_t kv_bytes = 2 * sh.sk * 64 * 2;
        CHECK((sched.section_pairs == 1 || sched.section_pairs * kv_bytes <= sh.l2 / (mask ? 2 : 6)));
        REQUIRE(sched.tiles == m_blocks * sh.heads_q * sh.batch);
        REQUIRE(sched.ctas == std::min<int64_t>(sms, sched.tiles));
        const int64_t section_tiles = sched.section_pairs * m_blocks * group;
        std::vector<int> seen(size_t(sched.tiles), 0);
        std::vector<ioattn::gpu::sm90::TileCoord> coords;
        for (int t = 0; t < sched.tiles; ++t) {
          const ioattn::gpu::sm90::TileCoord c = sched.tile(t);
          REQUIRE(c.m_block >= 0);
          REQUIRE(c.m_block < m_blocks);
          REQUIRE(c.h >= 0);
          REQUIRE(c.h < sh.heads_q);
          REQUIRE(c.b >= 0);
          REQUIRE(c.b < sh.batch);
          ++seen[size_t((c.b * sh.heads_q + c.h) * m_blocks + c.m_block)];
          coords.push_back(c);
        }
        for (const int n : seen) REQUIRE(n == 1);
        auto pair_of = [&](const ioattn::gpu::sm90::TileCoord& c) { return c.b * sh.heads_kv + c.h / group; };
        for (int t = 0; t < sched.tiles; ++t) {
          const ioattn::gpu::sm90::TileCoord& c = coords[size_t(t)];
          if (t % section_tiles == 0) CHECK(c.m_block == m_blocks - 1);
          // A CTA's next work tile in the same section is never a later query block.
          const int next = t + sched.ctas;
          if (next < sched.tiles && next / section_tiles == t / section_tiles)
            CHECK(coords[size_t(next)].m_block <= c.m_block);
          // Neighbours in one round of one query block: the same kv head's next or previous query
          // head, or a neighbouring pair.
          const int after = t + 1;
          if (after < sched.tiles && after / section_tiles == t / section_tiles &&
              after % section_tiles / sched.ctas == t % section_tiles / sched.ctas &&
              coords[size_t(after)].m_block == c.m_block) {
            const int64_t step = pair_of(coords[size_t(after)]) - pair_of(c);
            CHECK((step == 1 || step == -1 || (step == 0 && std::abs(coords[size_t(after)].h - c.h) == 1)));
          }
        }
      }
}

TEST_CASE("sm_90a schedule: causal work evens out over 132 SMs without a dispatcher", "[sm90]") {
  struct Shape {
    int64_t batch, heads_q, heads_kv, s, d;
  };
  // FlashAttention's benchmark shapes (B x S = 16k, H x D = 2048; S = 16384 at both head dims,
  // where a quarter of the L2 per section left the CTAs uneven) and two GQA ones, causal at
  // Sq = Sk: a work tile of query block m does m + 1 key tiles. 1.031 is the quantization of equal
  // work tiles (4096 over 132 SMs, 32 against 31.03 rounds); without the reversed rounds the
  // busiest CTA carries up to 1.36x the mean.
  const Shape shapes[] = {{32, 32, 32, 512, 64},  {16, 16, 16, 1024, 128}, {8, 16, 16, 2048, 128},
                          {2, 16, 16, 8192, 128}, {1, 16, 16, 16384, 128}, {1, 32, 32, 16384, 64},
                          {2, 16, 2, 6000, 128},  {16, 48, 6, 130, 128}};
  for (const Shape& sh : shapes) {
    AttnParams p = shape(sh.batch, sh.heads_q, sh.heads_kv, sh.s, sh.s);
    p.causal = true;
    const ioattn::gpu::sm90::TileSchedule sched =
        ioattn::gpu::sm90::make_schedule(p, 128, int(sh.d), 132, int64_t(50) << 20);
    std::vector<double> load(size_t(sched.ctas), 0.0);
    double total = 0;
    for (int t = 0; t < sched.tiles; ++t) {
      const double work = sched.tile(t).m_block + 1;
      load[size_t(t % sched.ctas)] += work;
      total += work;
    }
    INFO("B=" << sh.batch << " Hq=" << sh.heads_q << " Hkv=" << sh.heads_kv << " S=" << sh.s << " D=" << sh.d);
    CHECK(*std::max_element(load.begin(), load.end()) <= 1.035 * total / sched.ctas);
  }
}
