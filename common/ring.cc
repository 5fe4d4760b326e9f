#include "common/ring.h"

#include <algorithm>
#include <cstdio>

#include "common/traffic.h"

namespace ioattn {
namespace {

std::string fmt(const char* f, double a, double b = 0, double c = 0) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

double roofline_s(const Problem& pr, const HardwareProfile& hw, int threads, double* dram_bytes, Plan* plan_out) {
  const Plan plan = plan_for(pr, hw, threads);
  const TrafficReport t = predict_traffic(pr, plan, hw);
  if (dram_bytes) *dram_bytes = t.flash_dram_bytes;
  if (plan_out) *plan_out = plan;
  return t.flash_roofline_s;
}

}  // namespace

bool predict_ring(const Problem& pr, const HardwareProfile& hw, int ranks, const Link& link, int threads,
                  RingModel* out, std::string* error) {
  const int64_t per = pr.causal ? 2 * int64_t(ranks) : int64_t(ranks);
  if (ranks < 1) {
    *error = "ranks=" + std::to_string(ranks) + ": must be >= 1";
  } else if (pr.seqlen_q != pr.seqlen_k) {
    *error = "ring attention shards one sequence: seqlen_q (" + std::to_string(pr.seqlen_q) +
             ") must equal seqlen_k (" + std::to_string(pr.seqlen_k) + ")";
  } else if (pr.seqlen_q % per != 0) {
    *error = "seqlen " + std::to_string(pr.seqlen_q) + " must be divisible by " + std::to_string(per) +
             (pr.causal ? " (2 x ranks: the zigzag layout's chunks)" : " (ranks)");
  } else if (pr.window_left >= 0 || pr.window_right >= 0) {
    *error = "the ring model covers full and causal masks; a sliding window leaves steps empty that it does not count";
  } else if (ranks > 1 && !(link.bandwidth_gbs > 0)) {
    *error = "link '" + link.name + "': bandwidth must be > 0";
  }
  if (!error->empty()) return false;

  RingModel m;
  m.ranks = ranks;
  m.link = link;
  m.zigzag = pr.causal;
  m.shard_seqlen = pr.seqlen_q / ranks;
  m.diagonal_step = pr;
  m.diagonal_step.seqlen_q = m.diagonal_step.seqlen_k = m.shard_seqlen;
  // Off the diagonal, zigzag leaves every rank two of its four chunk pairs fully visible and two
  // fully masked: the same work as all its queries against half a shard of keys, unmasked.
  m.ring_step = m.diagonal_step;
  m.ring_step.causal = false;
  if (pr.causal) m.ring_step.seqlen_k = m.shard_seqlen / 2;

  double diag_bytes = 0, ring_bytes = 0;
  const double diag_s = roofline_s(m.diagonal_step, hw, threads, &diag_bytes, nullptr);
  m.compute_s_per_step = roofline_s(m.ring_step, hw, threads, &ring_bytes, &m.ring_step_plan);
  m.flops_per_step = forward_flops(m.ring_step);
  m.link_bytes_per_step =
      double(pr.batch * pr.heads_kv * m.shard_seqlen * (pr.head_dim + pr.head_dim_v) * dtype_bytes(pr.kv_dtype));
  m.transfer_s_per_step = ranks > 1 ? m.link_bytes_per_step / (link.bandwidth_gbs * 1e9) + link.latency_us * 1e-6 : 0;
  m.hides = m.compute_s_per_step >= m.transfer_s_per_step;

  // Each later step's partial merges into the running (O, lse): the running O and lse read and
  // written, the partial read, in fp32.
  const double merge_bytes = 3.0 * double(pr.batch * m.shard_seqlen * pr.heads_q) * double(pr.head_dim_v * 4 + 4);
  const double dram_gbs = hw.dram().bandwidth_gbs;
  const double merge_s = dram_gbs > 0 ? merge_bytes / (dram_gbs * 1e9) : 0;
  const int later = ranks - 1;
  // What is sent is read from memory and what arrives is written to it.
  m.rank_dram_bytes = diag_bytes + later * (ring_bytes + 2 * m.link_bytes_per_step + merge_bytes);
  // Step i computes while shard i + 1 travels; the last step has nothing left to receive.
  if (ranks == 1) {
    m.rank_time_s = diag_s;
  } else {
    m.rank_time_s = std::max(diag_s, m.transfer_s_per_step) +
                    (later - 1) * std::max(m.compute_s_per_step, m.transfer_s_per_step) + m.compute_s_per_step +
                    later * merge_s;
  }
  m.single_device_time_s = roofline_s(pr, hw, threads, nullptr, nullptr);
  m.predicted_efficiency = m.rank_time_s > 0 ? m.single_device_time_s / (ranks * m.rank_time_s) : 0;

  m.summary =
      std::to_string(ranks) + " ranks of " + hw.name + " over " + link.name + " (" +
      fmt("%.4g GB/s", link.bandwidth_gbs) + " per direction), " + std::to_string(m.shard_seqlen) + " rows each" +
      (m.zigzag ? " in the zigzag layout" : "") + ": per step " + fmt("%.3g MB", m.link_bytes_per_step / 1e6) +
      " of K/V on the link take " + fmt("%.3g ms", m.transfer_s_per_step * 1e3) + " against " +
      fmt("%.3g ms", m.compute_s_per_step * 1e3) + " of compute, so communication " +
      (ranks == 1 ? std::string("does not arise")
       : m.hides  ? std::string("hides under compute")
                  : "does not hide (" + fmt("%.2gx", m.transfer_s_per_step / m.compute_s_per_step) + " the compute)") +
      "; predicted scaling efficiency " + fmt("%.0f%%", 100 * m.predicted_efficiency) +
      (m.predicted_efficiency > 1 ? " (above 100%: a shard's K/V stays in a cache level the whole sequence's "
                                    "does not)"
                                  : "");
  *out = std::move(m);
  return true;
}

}  // namespace ioattn
