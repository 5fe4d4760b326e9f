#include "common/cache_sim.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace ioattn::traffic_detail {

SetOccupancy::SetOccupancy(double capacity, int ways, double line, double v_stride, double v_key_bytes,
                           int64_t v_chunks)
    : cap_(capacity), ways_(ways), line_(line), v_stride_(v_stride), v_key_bytes_(v_key_bytes), v_chunks_(v_chunks) {
  sets_ = ways > 0 ? std::max<int64_t>(1, int64_t(capacity / (double(ways) * line))) : 1;
  way_bytes_ = double(sets_) * line;
}

double SetOccupancy::hit(const std::vector<double>& buffers, size_t own, double v_keys) {
  if (own != kVCopy && buffers[own] <= 0) return 1.0;
  if (ways_ <= 0) return fits(buffers, v_keys);
  // The same windows recur for every tile and block of a shape: remember them.
  std::vector<double> key = buffers;
  key.push_back(double(own));
  key.push_back(v_keys);
  auto it = memo_.find(key);
  if (it != memo_.end()) return it->second;
  const double h = compute(buffers, own, v_keys);
  memo_.emplace(std::move(key), h);
  return h;
}

double SetOccupancy::compute(const std::vector<double>& buffers, size_t own, double v_keys) {
  const Hist& v = v_hist(v_keys);
  // Exact where no set can overflow (at most ways lines in every set: every use hits) or every
  // set does.
  double most = 0, least = 0;
  for (double b : buffers) {
    most += std::ceil(b / way_bytes_);
    least += std::floor(b / way_bytes_);
  }
  size_t kmax = 0;
  for (size_t k = 0; k < v.sets.size(); ++k)
    if (v.sets[k] > 0) kmax = k;
  if (most + double(kmax) <= double(ways_)) return 1.0;
  if (least > double(ways_)) return 0.0;
  double hit = 0;
  if (own == kVCopy) {
    const std::vector<double> u = load(buffers);
    for (size_t k = 1; k < v.lines.size(); ++k) hit += v.lines[k] * at_most(u, ways_ - int(k));
    return hit;
  }
  const double x = buffers[own] / way_bytes_, f = std::floor(x), phi = x - f;
  std::vector<double> others = buffers;
  others.erase(others.begin() + std::ptrdiff_t(own));
  const std::vector<double> u = load(others);
  // The buffer's own lines in the set of a random one of its lines (size-biased: f + 1 with
  // probability (f + 1) phi / x, f otherwise).
  for (int m = int(f); m <= int(f) + 1; ++m) {
    const double pm = (m == int(f) ? f * (1 - phi) : (f + 1) * phi) / x;
    for (size_t k = 0; k < v.sets.size(); ++k) hit += pm * v.sets[k] * at_most(u, ways_ - m - int(k));
  }
  return hit;
}

double SetOccupancy::fits(const std::vector<double>& buffers, double v_keys) const {
  double bytes = v_keys * v_key_bytes_ * double(v_chunks_);
  for (double b : buffers) bytes += b;
  return bytes <= cap_ ? 1.0 : 0.0;
}

// Distribution of the lines per set of independent contiguous buffers, truncated: entry
// ways + 1 stands for more than ways.
std::vector<double> SetOccupancy::load(const std::vector<double>& buffers) const {
  std::vector<double> d(size_t(ways_) + 2, 0.0);
  d[0] = 1;
  for (double b : buffers) {
    const double x = b / way_bytes_, f = std::floor(x), phi = x - f;
    std::vector<double> n(d.size(), 0.0);
    for (size_t i = 0; i < d.size(); ++i) {
      n[std::min(d.size() - 1, i + size_t(f))] += d[i] * (1 - phi);
      n[std::min(d.size() - 1, i + size_t(f) + 1)] += d[i] * phi;
    }
    d = n;
  }
  return d;
}

double SetOccupancy::at_most(const std::vector<double>& d, int n) {
  double p = 0;
  for (int i = 0; i <= n && i < int(d.size()); ++i) p += d[size_t(i)];
  return p;
}

// V lines per set for a run of `keys` consecutive keys: chunk c starts c * stride bytes after
// chunk 0 and holds keys * v_key_bytes; where the run starts only rotates the sets.
const SetOccupancy::Hist& SetOccupancy::v_hist(double keys) {
  const int64_t nkeys = int64_t(keys);
  auto it = hist_.find(nkeys);
  if (it != hist_.end()) return it->second;
  Hist h;
  h.sets.assign(size_t(ways_) + 2, 0.0);
  h.lines.assign(size_t(ways_) + 2, 0.0);
  const int64_t len = int64_t(std::ceil(double(nkeys) * v_key_bytes_ / line_));
  if (len <= 0 || v_chunks_ <= 0) {
    h.sets[0] = 1;
    return hist_.emplace(nkeys, h).first->second;
  }
  std::vector<int64_t> add(size_t(sets_) + 1, 0);
  int64_t base = 0;
  for (int64_t c = 0; c < v_chunks_; ++c) {
    const int64_t start = int64_t(std::fmod(double(c) * v_stride_ / line_, double(sets_)));
    base += len / sets_;
    const int64_t rem = len % sets_, end = start + rem;
    add[size_t(start)] += 1;
    add[size_t(std::min(end, sets_))] -= 1;
    if (end > sets_) {
      add[0] += 1;
      add[size_t(end - sets_)] -= 1;
    }
  }
  int64_t run = 0;
  const double total = double(len * v_chunks_);
  for (int64_t s = 0; s < sets_; ++s) {
    run += add[size_t(s)];
    const int64_t k = base + run;
    const size_t at = size_t(std::min<int64_t>(k, ways_ + 1));
    h.sets[at] += 1.0 / double(sets_);
    h.lines[at] += double(k) / total;
  }
  return hist_.emplace(nkeys, h).first->second;
}

}  // namespace ioattn::traffic_detail
