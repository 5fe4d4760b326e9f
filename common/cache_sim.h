// The set-occupancy model of a set-associative LRU cache level that the CPU traffic rules judge
// each reuse against (common/traffic_cpu*.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace ioattn::traffic_detail {

// Whether a use hits in a set-associative LRU level, set by set. A use of a line hits when fewer
// than `ways` other lines of its set were touched since its previous use; the lines touched in
// between (the window) are a few buffers. A contiguous buffer of B bytes puts B / way_bytes lines
// into every set (way_bytes = capacity / ways): the floor of that or one more, and which sets get
// one more depends on where the buffer starts, which is not known relative to the other buffers,
// so that is taken as independent per buffer. Where a footprint just exceeds a level this keeps
// what set-by-set LRU keeps (a buffer of 7.5 lines per set in an 8-way level: every set, since
// none gets 9), unlike random placement. The V copy is the exception: a key block's V lines are
// cc column chunks head_keys x chunk_row bytes apart (cpu/flash_kernel.cc, PackRows), so their
// sets are known: chunks whose offsets agree modulo the way size stack in the same sets (1024
// keys at 64 B per key per chunk is exactly one way of a 512 KiB 8-way L2), counted line by line.
class SetOccupancy {
 public:
  // capacity: bytes of the level (a worker's share); ways = 0: fully associative.
  SetOccupancy(double capacity, int ways, double line, double v_stride, double v_key_bytes, int64_t v_chunks);

  // Where own indexes `buffers`: the V copy's lines in the window, if any.
  static constexpr size_t kVCopy = size_t(-1);

  // Fraction of the lines of buffers[own] (own = kVCopy: of the V copy's v_keys keys) whose next
  // use hits, with the window's other contiguous buffers and v_keys keys of the V copy touched
  // since the previous use.
  double hit(const std::vector<double>& buffers, size_t own, double v_keys);

 private:
  struct Hist {
    std::vector<double> sets;   // [k]: fraction of the sets holding k V lines (the last entry: more than ways)
    std::vector<double> lines;  // [k]: fraction of the V lines lying in such sets
  };

  double compute(const std::vector<double>& buffers, size_t own, double v_keys);
  double fits(const std::vector<double>& buffers, double v_keys) const;
  std::vector<double> load(const std::vector<double>& buffers) const;
  static double at_most(const std::vector<double>& d, int n);
  const Hist& v_hist(double keys);

  double cap_;
  int ways_;
  double line_, v_stride_, v_key_bytes_;
  int64_t v_chunks_;
  int64_t sets_ = 1;
  double way_bytes_ = 0;
  std::map<int64_t, Hist> hist_;
  std::map<std::vector<double>, double> memo_;
};

}  // namespace ioattn::traffic_detail
