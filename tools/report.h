// Plans, traffic predictions, design outlines and hardware profiles rendered for people (aligned
// text) and for programs (nlohmann::json with docs/api.md's keys).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "common/hardware.h"
#include "common/outline.h"
#include "common/planner.h"
#include "common/traffic.h"

namespace ioattn::cli {

const char* backend_name(BackendKind b);
const char* device_kind_name(DeviceKind k);

nlohmann::json problem_json(const Problem& pr);
// docs/api.md keys (backend, hardware, block_q, block_kv, kv_splits, workers, working_set_bytes,
// target_level, target_level_bytes) plus every other Plan field.
nlohmann::json plan_json(const Plan& plan);
// hardware, flash_dram_bytes, standard_dram_bytes, levels [{name, flash_bytes, standard_bytes}],
// flops and the roofline times.
nlohmann::json traffic_json(const TrafficReport& t);
// Exactly memoryTraffic, tiling, numericalStability, tradeoff, failureMode.
nlohmann::json outline_json(const DesignOutline& o);
nlohmann::json profile_json(const HardwareProfile& hw);

std::string plan_text(const Plan& plan, const HardwareProfile& hw);
std::string traffic_text(const TrafficReport& t);
std::string outline_text(const DesignOutline& o);

// JSON as text; invalid UTF-8 (a custom profile's name, say) is replaced rather than thrown on.
std::string dump(const nlohmann::json& j);

}  // namespace ioattn::cli
