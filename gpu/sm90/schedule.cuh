// The persistent grid's static tile order. A work tile is one (query block, query head,
// sequence); CTA c of a grid of P takes the work tiles at positions c, c + P, c + 2P, ...
// (gpu/sm90/flash_fwd.cuh), so the order alone decides which work tiles run at the same time and
// how evenly the CTAs are loaded.
//
// The (sequence, kv head) pairs are cut into sections whose K and V fit in a share of the L2.
// Without a mask the share is a sixth: every CTA sweeps all of the section's keys at its own
// pace, so the keys the slowest CTA still needs must outlive those the fastest has streamed in
// since, and Q and O passing through; sections of half the L2 lost K and V to HBM before their
// last reader. Under a causal mask or a window it is half, what data every SM reads gets on a
// two-partition L2 (common/hardware.h): there a section's work tiles are unequal, and fewer of
// them per section leave the CTAs unevenly loaded (the balance case of tests/test_sm90_schedule.cc).
//
// Within a section the query blocks run from the last to the first, each block's work tiles being
// the section's pairs in order with a GQA group's query heads adjacent: the CTAs running at once
// stream the K/V of one section, from L2 after its first reader, as the one-CTA-per-tile grid did
// when the hardware launched a head's query blocks together; and under a causal mask each CTA's
// heaviest work tiles (the last query blocks, which see the most keys) come first.
//
// A static split has no dispatcher to even out unequal work tiles, so the order does: each run of
// P positions (a round) takes P consecutive work tiles of the section, which under a causal mask
// get lighter along it, and every second round is reversed, so a CTA that drew a heavier one in
// one round draws a lighter one in the next. Sections are rounded down to a whole number of
// round pairs where a pair's work tiles allow it, because a section's last round, when unpaired
// or cut short, leaves the CTAs unevenly loaded and a following section repeats that.
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "common/params.h"

namespace ioattn::gpu::sm90 {

struct TileCoord {
  int m_block, h, b;
};

struct TileSchedule {
  int m_blocks;  // query blocks per (sequence, query head)
  int group;     // query heads per kv head
  int heads_kv;
  int pairs;          // (sequence, kv head) pairs
  int section_pairs;  // pairs per section; the last section may have fewer
  int tiles;
  int ctas;  // the grid: min(SMs, tiles)

  IOATTN_HD TileCoord tile(int t) const {
    const int section_tiles = section_pairs * m_blocks * group;
    const int section = t / section_tiles;
    const int first_pair = section * section_pairs;
    const int pairs_here = pairs - first_pair < section_pairs ? pairs - first_pair : section_pairs;
    int r = t - section * section_tiles;
    const int round = r / ctas;
    if (round % 2) {
      const int left = pairs_here * m_blocks * group - round * ctas;
      r = round * ctas + (left < ctas ? left : ctas) - 1 - (r - round * ctas);
    }
    const int block_tiles = pairs_here * group;
    const int m_rank = r / block_tiles;
    const int in_block = r - m_rank * block_tiles;
    const int pair = first_pair + in_block / group;
    const int b = pair / heads_kv;
    return {m_blocks - 1 - m_rank, (pair - b * heads_kv) * group + in_block % group, b};
  }
};

// The dispatcher has checked flash_fwd_tiles_fit (launch.h), so the tile count is an int.
inline TileSchedule make_schedule(const AttnParams& p, int block_q, int head_dim, int sms, int64_t l2_bytes) {
  TileSchedule s;
  s.m_blocks = int((p.seqlen_q + block_q - 1) / block_q);
  s.group = int(p.heads_q / p.heads_kv);
  s.heads_kv = int(p.heads_kv);
  s.pairs = int(p.batch * p.heads_kv);
  s.tiles = s.m_blocks * int(p.heads_q * p.batch);
  s.ctas = s.tiles < sms ? s.tiles : sms;
  const int64_t kv_bytes = 2 * p.seqlen_k * head_dim * 2;  // K and V of one pair, 2-byte elements
  const bool banded = p.causal || p.window_left >= 0 || p.window_right >= 0;
  const int64_t fit = l2_bytes / (banded ? 2 : 6) / kv_bytes;
  const int64_t most = fit < 1 ? 1 : fit > s.pairs ? s.pairs : fit;
  const int64_t pair_tiles = int64_t(s.m_blocks) * s.group;
  const int64_t round_pairs = most * pair_tiles / (2 * s.ctas);
  const int64_t whole = round_pairs * 2 * s.ctas / pair_tiles;
  s.section_pairs = int(round_pairs == 0 ? most : whole < 1 ? 1 : whole);
  return s;
}

}  // namespace ioattn::gpu::sm90
