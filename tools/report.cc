#include "tools/report.h"

#include <cstdio>
#include <sstream>

#include "tools/cli.h"
#include "tools/problem_flags.h"

namespace ioattn::cli {

using nlohmann::json;

const char* backend_name(BackendKind b) { return b == BackendKind::cpu ? "cpu" : "cuda"; }
const char* device_kind_name(DeviceKind k) { return k == DeviceKind::cpu ? "cpu" : "gpu"; }

json problem_json(const Problem& pr) {
  return {{"batch", pr.batch},
          {"heads", pr.heads_q},
          {"kv_heads", pr.heads_kv},
          {"seqlen_q", pr.seqlen_q},
          {"seqlen_k", pr.seqlen_k},
          {"head_dim", pr.head_dim},
          {"head_dim_v", pr.head_dim_v},
          {"dtype", dtype_name(pr.dtype)},
          {"causal", pr.causal},
          {"window_left", pr.window_left},
          {"window_right", pr.window_right}};
}

json plan_json(const Plan& p) {
  json j = {{"backend", backend_name(p.backend)},
            {"hardware", p.hardware},
            {"block_q", p.block_q},
            {"block_kv", p.block_kv},
            {"head_dim_padded", p.head_dim_padded},
            {"reg_rows", p.reg_rows},
            {"reg_cols", p.reg_cols},
            {"kv_splits", p.kv_splits},
            {"workers", p.workers},
            {"work_items", p.work_items},
            {"warps", p.warps},
            {"stages", p.stages},
            {"working_set_bytes", p.working_set_bytes},
            {"target_level", p.target_level},
            {"target_level_bytes", p.target_level_bytes},
            {"rationale", p.rationale},
            {"supported", p.supported},
            {"units", p.units},
            {"rows_per_unit", p.rows_per_unit},
            {"ctas_per_sm", p.ctas_per_sm}};
  if (p.backend == BackendKind::cuda) j["kernel"] = p.kernel;
  if (p.backend == BackendKind::cpu) {
    j["decode_prefetch_blocks"] = p.decode_prefetch_blocks;
    j["calibrated"] = p.calibrated;
    j["calibration"] = p.calibration;
  }
  return j;
}

json traffic_json(const TrafficReport& t) {
  json levels = json::array();
  for (const BoundaryTraffic& b : t.levels) {
    levels.push_back({{"name", b.name},
                      {"flash_bytes", b.flash_bytes},
                      {"standard_bytes", b.standard_bytes},
                      {"flash_read_bytes", b.flash_read_bytes},
                      {"flash_write_bytes", b.flash_write_bytes},
                      {"standard_read_bytes", b.standard_read_bytes},
                      {"standard_write_bytes", b.standard_write_bytes}});
  }
  return {{"hardware", t.hardware},
          {"flash_dram_bytes", t.flash_dram_bytes},
          {"standard_dram_bytes", t.standard_dram_bytes},
          {"levels", levels},
          {"flops", t.flops},
          {"flash_roofline_s", t.flash_roofline_s},
          {"standard_roofline_s", t.standard_roofline_s}};
}

json outline_json(const DesignOutline& o) {
  return {{"memoryTraffic", o.memoryTraffic},
          {"tiling", o.tiling},
          {"numericalStability", o.numericalStability},
          {"tradeoff", o.tradeoff},
          {"failureMode", o.failureMode}};
}

json profile_json(const HardwareProfile& hw) {
  const json j = json::parse(profile_to_json(hw), nullptr, false);
  if (j.is_discarded()) throw internal_error("profile '" + hw.name + "' did not serialize to valid JSON");
  return j;
}

std::string plan_text(const Plan& p, const HardwareProfile& hw) {
  std::ostringstream os;
  os << "hardware        " << p.hardware << " (" << device_kind_name(hw.kind) << ")";
  if (!hw.description.empty()) os << ": " << hw.description;
  os << "\nbackend         " << backend_name(p.backend) << "\nblocks          block_q " << p.block_q << " x block_kv "
     << p.block_kv << ", head dim padded to " << p.head_dim_padded;
  if (p.backend == BackendKind::cpu) {
    os << "\nregister tile   " << p.reg_rows << " rows x " << p.reg_cols << " columns";
  } else {
    os << "\nkernel          " << p.kernel << "\nCTA             " << p.warps << " warps, " << p.stages
       << " pipeline stages, " << p.ctas_per_sm << " resident per SM";
  }
  os << "\nkv splits       " << p.kv_splits << "\nworkers         " << p.workers << " (" << p.work_items
     << " work items)\nworking set     " << human_bytes(double(p.working_set_bytes)) << " (" << p.working_set_bytes
     << " B) fitted to " << p.target_level << " (" << human_bytes(double(p.target_level_bytes))
     << " per worker)\nwhy             " << p.rationale << "\n";
  if (p.backend == BackendKind::cpu && !p.calibration.empty()) os << "calibration     " << p.calibration << "\n";
  if (!p.supported)
    os << "supported       no: no kernel of this build runs this shape; figures are what one would need\n";
  return os.str();
}

std::string traffic_text(const TrafficReport& t) {
  std::ostringstream os;
  char line[160];
  std::snprintf(line, sizeof line, "%-12s %16s %16s %10s\n", "boundary", "flash", "standard", "std/flash");
  os << line;
  for (const BoundaryTraffic& b : t.levels) {
    std::snprintf(line, sizeof line, "%-12s %16s %16s %9.1fx\n", b.name.c_str(), human_bytes(b.flash_bytes).c_str(),
                  human_bytes(b.standard_bytes).c_str(), b.flash_bytes > 0 ? b.standard_bytes / b.flash_bytes : 0.0);
    os << line;
  }
  std::snprintf(line, sizeof line, "%.3g GFLOP; roofline time flash %.3g ms, standard %.3g ms\n", t.flops * 1e-9,
                t.flash_roofline_s * 1e3, t.standard_roofline_s * 1e3);
  os << line;
  return os.str();
}

std::string outline_text(const DesignOutline& o) {
  std::ostringstream os;
  os << "memory traffic:       " << o.memoryTraffic << "\n"
     << "tiling:               " << o.tiling << "\n"
     << "numerical stability:  " << o.numericalStability << "\n"
     << "tradeoff:             " << o.tradeoff << "\n"
     << "failure mode:         " << o.failureMode << "\n";
  return os.str();
}

std::string dump(const json& j) { return j.dump(2, ' ', false, json::error_handler_t::replace); }

}  // namespace ioattn::cli
