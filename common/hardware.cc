#include "common/hardware.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <type_traits>

#include "common/backend.h"
#include "common/calibration.h"
#include "common/cpu_cores.h"

namespace ioattn {

extern const char* const kBuiltinProfilesJson;

namespace {

using nlohmann::json;

const char* kind_name(DeviceKind k) { return k == DeviceKind::gpu ? "gpu" : "cpu"; }

// Reads one field with its type checked; a missing optional field keeps *out.
template <typename T>
bool read_field(const json& obj, const char* key, bool required, T* out, const std::string& where, std::string* error) {
  const auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) *error = where + ": missing field '" + key + "'";
    return !required;
  }
  bool ok;
  const char* wanted;
  if constexpr (std::is_same_v<T, std::string>) {
    ok = it->is_string();
    wanted = "a string";
  } else if constexpr (std::is_integral_v<T>) {
    ok = it->is_number_integer() || it->is_number_unsigned();
    wanted = "an integer";
  } else {
    ok = it->is_number();
    wanted = "a number";
  }
  if (!ok) {
    // The value as written (1e15 is a JSON number but not an integer), cut short if long.
    std::string got = it->dump();
    if (got.size() > 40) got = got.substr(0, 37) + "...";
    *error = where + ": field '" + key + "' must be " + wanted + ", got " + got;
    return false;
  }
  *out = it->get<T>();
  return true;
}

bool parse_level(const json& j, const std::string& where, MemoryLevel* out, std::string* error) {
  if (!j.is_object()) {
    *error = where + ": expected an object";
    return false;
  }
  MemoryLevel l;
  if (!read_field(j, "name", true, &l.name, where, error) ||
      !read_field(j, "size_bytes", true, &l.size_bytes, where, error) ||
      !read_field(j, "shared_by", false, &l.shared_by, where, error) ||
      !read_field(j, "line_bytes", false, &l.line_bytes, where, error) ||
      !read_field(j, "bandwidth_gbs", true, &l.bandwidth_gbs, where, error) ||
      !read_field(j, "partitions", false, &l.partitions, where, error) ||
      !read_field(j, "source", false, &l.source, where, error)) {
    return false;
  }
  const std::string at = where + " ('" + l.name + "')";
  if (l.size_bytes < 0)
    *error = at + ": field 'size_bytes' must be >= 0, got " + std::to_string(l.size_bytes);
  else if (l.shared_by < 1)
    *error = at + ": field 'shared_by' must be >= 1, got " + std::to_string(l.shared_by);
  else if (l.line_bytes < 1)
    *error = at + ": field 'line_bytes' must be >= 1, got " + std::to_string(l.line_bytes);
  else if (!(l.bandwidth_gbs > 0))
    *error = at + ": field 'bandwidth_gbs' must be > 0";
  else if (l.partitions < 1)
    *error = at + ": field 'partitions' must be >= 1";
  if (!error->empty()) return false;
  *out = std::move(l);
  return true;
}

bool parse_link(const json& j, const std::string& where, Link* out, std::string* error) {
  if (!j.is_object()) {
    *error = where + ": expected an object";
    return false;
  }
  Link l;
  if (!read_field(j, "name", true, &l.name, where, error) ||
      !read_field(j, "bandwidth_gbs", true, &l.bandwidth_gbs, where, error) ||
      !read_field(j, "latency_us", false, &l.latency_us, where, error) ||
      !read_field(j, "source", false, &l.source, where, error))
    return false;
  if (!(l.bandwidth_gbs > 0))
    *error = where + " ('" + l.name + "'): field 'bandwidth_gbs' must be > 0";
  else if (!(l.latency_us >= 0))
    *error = where + " ('" + l.name + "'): field 'latency_us' must be >= 0";
  if (!error->empty()) return false;
  *out = std::move(l);
  return true;
}

bool parse_profile(const json& j, const std::string& origin, HardwareProfile* out, std::string* error) {
  error->clear();
  if (!j.is_object()) {
    *error = origin + ": expected a profile object";
    return false;
  }
  HardwareProfile hw;
  std::string kind;
  const std::string where = origin;
  if (!read_field(j, "name", true, &hw.name, where, error)) return false;
  const std::string at = origin + " profile '" + hw.name + "'";
  if (!read_field(j, "description", false, &hw.description, at, error) ||
      !read_field(j, "kind", true, &kind, at, error) || !read_field(j, "cores", true, &hw.cores, at, error) ||
      !read_field(j, "simd_bits", false, &hw.simd_bits, at, error) ||
      !read_field(j, "simd_target", false, &hw.simd_target, at, error) ||
      !read_field(j, "fma_gflops_per_core", true, &hw.fma_gflops_per_core, at, error) ||
      !read_field(j, "tensor_tflops", false, &hw.tensor_tflops, at, error) ||
      !read_field(j, "clock_ghz", false, &hw.clock_ghz, at, error) ||
      !read_field(j, "smem_per_block_bytes", false, &hw.smem_per_block_bytes, at, error) ||
      !read_field(j, "regs_per_sm", false, &hw.regs_per_sm, at, error) ||
      !read_field(j, "compute_capability", false, &hw.compute_capability, at, error) ||
      !read_field(j, "source", false, &hw.source, at, error)) {
    return false;
  }
  if (hw.name.empty())
    *error = at + ": field 'name' is empty";
  else if (kind != "cpu" && kind != "gpu")
    *error = at + ": field 'kind' must be \"cpu\" or \"gpu\", got \"" + kind + "\"";
  else if (hw.cores < 1)
    *error = at + ": field 'cores' must be >= 1, got " + std::to_string(hw.cores);
  else if (hw.simd_bits != 128 && hw.simd_bits != 256 && hw.simd_bits != 512)
    *error = at + ": field 'simd_bits' must be 128, 256 or 512, got " + std::to_string(hw.simd_bits);
  else if (!(hw.fma_gflops_per_core > 0))
    *error = at + ": field 'fma_gflops_per_core' must be > 0";
  if (!error->empty()) return false;
  hw.kind = kind == "gpu" ? DeviceKind::gpu : DeviceKind::cpu;

  const auto levels = j.find("levels");
  if (levels == j.end() || !levels->is_array() || levels->size() < 2) {
    *error = at + ": field 'levels' must be an array of at least 2 levels (caches, then off-chip memory)";
    return false;
  }
  for (size_t i = 0; i < levels->size(); ++i) {
    MemoryLevel l;
    if (!parse_level((*levels)[i], at + " levels[" + std::to_string(i) + "]", &l, error)) return false;
    const bool last = i + 1 == levels->size();
    if (last != (l.size_bytes == 0)) {
      *error = at + " levels[" + std::to_string(i) + "]: field 'size_bytes' must be 0 exactly for the last " +
               "(off-chip) level and > 0 for caches";
      return false;
    }
    if (!hw.levels.empty() && !last && l.size_bytes * l.shared_by < hw.levels.back().size_bytes) {
      *error = at + " levels[" + std::to_string(i) + "]: field 'size_bytes' is smaller than the level inside it";
      return false;
    }
    hw.levels.push_back(std::move(l));
  }
  if (const auto links = j.find("links"); links != j.end()) {
    if (!links->is_array()) {
      *error = at + ": field 'links' must be an array";
      return false;
    }
    for (size_t i = 0; i < links->size(); ++i) {
      Link l;
      if (!parse_link((*links)[i], at + " links[" + std::to_string(i) + "]", &l, error)) return false;
      hw.links.push_back(std::move(l));
    }
  }
  if (hw.kind == DeviceKind::gpu) {
    if (hw.smem_per_block_bytes <= 0 || hw.smem_per_block_bytes > hw.levels.front().size_bytes) {
      *error = at + ": field 'smem_per_block_bytes' must be > 0 and <= levels[0].size_bytes for a gpu";
      return false;
    }
  }
  *out = std::move(hw);
  return true;
}

std::vector<HardwareProfile> parse_builtins() {
  std::vector<HardwareProfile> out;
  const json doc = json::parse(kBuiltinProfilesJson, nullptr, false);
  if (doc.is_discarded() || !doc.contains("profiles")) return out;
  for (const json& j : doc["profiles"]) {
    HardwareProfile hw;
    std::string error;
    if (parse_profile(j, "built-in profiles.json", &hw, &error)) out.push_back(std::move(hw));
  }
  return out;
}

// sysfs size strings: "32K", "512K", "32768K", "8M".
int64_t parse_size(const std::string& text) {
  if (text.empty()) return 0;
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (...) {
    return 0;
  }
  const char unit = used < text.size() ? text[used] : ' ';
  if (unit == 'K') return v << 10;
  if (unit == 'M') return v << 20;
  if (unit == 'G') return v << 30;
  return v;
}

// "0-1,4,6-7" -> 5 cpus.
int count_cpu_list(const std::string& text) {
  int count = 0;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const size_t dash = part.find('-');
    try {
      if (dash == std::string::npos) {
        if (!part.empty() && part != "\n") ++count;
      } else {
        count += std::stoi(part.substr(dash + 1)) - std::stoi(part.substr(0, dash)) + 1;
      }
    } catch (...) {
      return count;
    }
  }
  return std::max(count, 1);
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

// The CPUs this thread may run on, not the machine's: under taskset, a cgroup cpuset (containers)
// or a job scheduler's binding, a default team of every online CPU puts several threads on each
// allowed core (16 threads on 2 CPUs ran decode at half speed on the H200 host). OpenMP sizes its
// default team from the same mask.
int available_cpus() {
#ifdef __linux__
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? int(online) : int(std::max(1u, std::thread::hardware_concurrency()));
}

namespace {

HardwareProfile detect_host_uncached() {
  HardwareProfile hw;
  hw.name = "host";
  hw.kind = DeviceKind::cpu;
  hw.cores = available_cpus();

  cpu_backend().query_device(&hw);

  // sysfs reports no frequency inside many VMs; 3 GHz is a nominal server clock. FMAs per cycle
  // at the dispatched width come from the core table (common/cpu_cores.h): a Zen 4 issues one
  // 512-bit FMA a cycle, not two; a core off the table is assumed to have 2 FMA pipes.
  hw.clock_ghz = 3.0;
  const std::string khz = trim(read_text_file("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"));
  const int64_t max_khz = parse_size(khz);
  if (max_khz > 0) hw.clock_ghz = std::max(0.5, double(max_khz) * 1e-6);
  const CoreFma core = core_fma(host_cpu_identity(), hw.simd_bits);
  const int fma_per_cycle = core.fma_per_cycle > 0 ? core.fma_per_cycle : 2;
  hw.fma_gflops_per_core = (hw.simd_bits / 32) * fma_per_cycle * 2 * hw.clock_ghz;

  const std::string base = "/sys/devices/system/cpu/cpu0/cache/index";
  for (int i = 0; i < 8; ++i) {
    const std::string dir = base + std::to_string(i) + "/";
    const std::string type = trim(read_text_file(dir + "type"));
    if (type.empty()) break;
    if (type == "Instruction") continue;
    MemoryLevel l;
    const std::string level = trim(read_text_file(dir + "level"));
    l.name = "L" + level + (type == "Data" ? "d" : "");
    l.size_bytes = parse_size(trim(read_text_file(dir + "size")));
    l.shared_by = count_cpu_list(trim(read_text_file(dir + "shared_cpu_list")));
    const int64_t line = parse_size(trim(read_text_file(dir + "coherency_line_size")));
    if (line > 0) l.line_bytes = int(line);
    l.source = "sysfs " + dir;
    if (l.size_bytes > 0) hw.levels.push_back(l);
  }
  std::sort(hw.levels.begin(), hw.levels.end(),
            [](const MemoryLevel& a, const MemoryLevel& b) { return a.size_bytes < b.size_bytes; });
  if (hw.levels.empty()) {
    // No sysfs (a container without /sys): the smallest common x86/Arm hierarchy, flagged as such.
    hw.levels = {{"L1d", 32 << 10, 1, 64, 0, "nominal: no sysfs cache information"},
                 {"L2", 512 << 10, 1, 64, 0, "nominal: no sysfs cache information"}};
  }
  // Inner-level bandwidths: nominal 32 B (L1) and 16 B (others) per cycle per core.
  for (size_t i = 0; i < hw.levels.size(); ++i) {
    MemoryLevel& l = hw.levels[i];
    const double bytes_per_cycle = i == 0 ? 64.0 : i == 1 ? 32.0 : 16.0;
    l.bandwidth_gbs = bytes_per_cycle * hw.clock_ghz * hw.cores;
    l.source += "; bandwidth nominal " + std::to_string(int(bytes_per_cycle)) + " B/cycle/core";
  }
  MemoryLevel dram;
  dram.name = "DRAM";
  dram.shared_by = hw.cores;
  // ~12 GB/s per core is what a server DDR4/DDR5 channel share gives (27 GB/s measured on 2 Zen 3
  // cores); no portable interface reports the real figure.
  dram.bandwidth_gbs = 12.0 * hw.cores;
  dram.source = "nominal: 12 GB/s per core";
  hw.levels.push_back(dram);
  hw.description = "detected host: " + std::to_string(hw.cores) + " cores (" + core.core + ", " +
                   std::to_string(fma_per_cycle) + " FMA/cycle at " + std::to_string(hw.simd_bits) +
                   " bits), Highway target " + hw.simd_target;
  hw.source = "sysfs /sys/devices/system/cpu/cpu0/cache, sysconf, hwy::SupportedTargets(); FMA rate: " +
              std::to_string(hw.simd_bits / 32) + " lanes x " + std::to_string(fma_per_cycle) +
              " FMA/cycle (common/cpu_cores.h) x 2 FLOP x " + std::to_string(hw.clock_ghz) + " GHz";
  return hw;
}

}  // namespace

std::string read_text_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

const MemoryLevel* HardwareProfile::level(const std::string& level_name) const {
  for (const MemoryLevel& l : levels) {
    if (l.name == level_name) return &l;
  }
  return nullptr;
}

const std::vector<HardwareProfile>& builtin_profiles() {
  static const std::vector<HardwareProfile> profiles = parse_builtins();
  return profiles;
}

std::string profile_names() {
  std::string names = "host";
  for (const HardwareProfile& hw : builtin_profiles()) names += ", " + hw.name;
  return names;
}

HardwareProfile detect_host() {
  static std::once_flag once;
  static HardwareProfile host;
  std::call_once(once, [] { host = detect_host_uncached(); });
  return host;
}

int default_threads() {
  if (const char* env = std::getenv("IOATTN_NUM_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n >= 1 && n <= 4096) return int(n);
  }
  return std::max(1, detect_host().cores);
}

HardwareProfile planning_profile(const std::string& value) {
  for (const HardwareProfile& hw : builtin_profiles())
    if (hw.name == value && hw.kind == DeviceKind::cpu) return hw;
  HardwareProfile file;
  std::string error;
  if (!value.empty() && load_profile_file(value, &file, &error) && file.kind == DeviceKind::cpu) return file;
  HardwareProfile host = detect_host();
  if (!value.empty()) host.description += "; IOATTN_HW_PROFILE='" + value + "' is no CPU profile, ignored";
  return host;
}

namespace {

// The detected host with the calibration in effect for it (common/calibration.h).
HardwareProfile calibrated_host() {
  HardwareProfile host = detect_host();
  host.calibration = host_calibration(&host.calibration_note);
  return host;
}

}  // namespace

std::shared_ptr<const HardwareProfile> planning_host_shared() {
  static std::once_flag once;
  static bool detected = false;
  static std::shared_ptr<const HardwareProfile> planned;
  std::call_once(once, [] {
    const char* env = std::getenv("IOATTN_HW_PROFILE");
    planned = std::make_shared<const HardwareProfile>(planning_profile(env ? env : ""));
    detected = !env || !env[0];
  });
  if (!detected) return planned;
  static std::mutex mutex;
  static std::shared_ptr<const HardwareProfile> cached;
  std::string note;
  std::shared_ptr<const Calibration> calibration = host_calibration(&note);
  std::lock_guard<std::mutex> lock(mutex);
  if (!cached || cached->calibration != calibration || cached->calibration_note != note) {
    auto host = std::make_shared<HardwareProfile>(detect_host());
    host->calibration = std::move(calibration);
    host->calibration_note = std::move(note);
    cached = std::move(host);
  }
  return cached;
}

HardwareProfile planning_host() { return *planning_host_shared(); }

bool find_profile(const std::string& name, HardwareProfile* out, std::string* error) {
  if (name == "host") {
    *out = calibrated_host();
    return true;
  }
  for (const HardwareProfile& hw : builtin_profiles()) {
    if (hw.name == name) {
      *out = hw;
      return true;
    }
  }
  if (error) *error = "unknown hardware profile '" + name + "'; valid names: " + profile_names();
  return false;
}

bool detect_gpu(HardwareProfile* out) {
  HardwareProfile hw;
  if (!gpu_backend().query_device(&hw)) return false;
  // The runtime reports no L2 partitioning; take it from the built-in profile of the same chip.
  for (const HardwareProfile& known : builtin_profiles()) {
    if (known.kind != DeviceKind::gpu || known.cores != hw.cores || hw.levels.size() < 2) continue;
    const MemoryLevel* l2 = known.level("L2");
    if (l2 && l2->size_bytes == hw.levels[1].size_bytes) {
      hw.levels[1].partitions = l2->partitions;
      if (!(hw.levels[1].bandwidth_gbs > 0)) hw.levels[1].bandwidth_gbs = l2->bandwidth_gbs;
      if (!(hw.levels[0].bandwidth_gbs > 0)) hw.levels[0].bandwidth_gbs = known.levels[0].bandwidth_gbs;
      hw.source += "; L2 partitions from built-in profile " + known.name;
    }
  }
  *out = std::move(hw);
  return true;
}

bool parse_profile_json(const std::string& text, const std::string& origin, HardwareProfile* out, std::string* error) {
  const json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded()) {
    *error = origin + ": not valid JSON";
    return false;
  }
  // Accept one profile object or a {"profiles": [one]} document like profiles.json.
  if (doc.is_object() && doc.contains("profiles")) {
    const json& list = doc["profiles"];
    if (!list.is_array() || list.size() != 1) {
      *error = origin + ": field 'profiles' must be an array holding exactly one profile";
      return false;
    }
    return parse_profile(list[0], origin, out, error);
  }
  return parse_profile(doc, origin, out, error);
}

bool load_profile_file(const std::string& path, HardwareProfile* out, std::string* error) {
  std::ifstream f(path);
  if (!f) {
    *error = path + ": cannot open";
    return false;
  }
  std::ostringstream s;
  s << f.rdbuf();
  return parse_profile_json(s.str(), path, out, error);
}

std::string profile_to_json(const HardwareProfile& hw) {
  json levels = json::array();
  for (const MemoryLevel& l : hw.levels) {
    json jl = {{"name", l.name},
               {"size_bytes", l.size_bytes},
               {"shared_by", l.shared_by},
               {"line_bytes", l.line_bytes},
               {"bandwidth_gbs", l.bandwidth_gbs},
               {"source", l.source}};
    if (l.partitions != 1) jl["partitions"] = l.partitions;
    levels.push_back(jl);
  }
  json j = {{"name", hw.name},
            {"description", hw.description},
            {"kind", kind_name(hw.kind)},
            {"cores", hw.cores},
            {"fma_gflops_per_core", hw.fma_gflops_per_core},
            {"clock_ghz", hw.clock_ghz},
            {"source", hw.source},
            {"levels", levels}};
  if (!hw.links.empty()) {
    json links = json::array();
    for (const Link& l : hw.links)
      links.push_back(
          {{"name", l.name}, {"bandwidth_gbs", l.bandwidth_gbs}, {"latency_us", l.latency_us}, {"source", l.source}});
    j["links"] = links;
  }
  if (hw.kind == DeviceKind::cpu) {
    j["simd_bits"] = hw.simd_bits;
    j["simd_target"] = hw.simd_target;
  } else {
    j["tensor_tflops"] = hw.tensor_tflops;
    j["smem_per_block_bytes"] = hw.smem_per_block_bytes;
    j["regs_per_sm"] = hw.regs_per_sm;
    j["compute_capability"] = hw.compute_capability;
  }
  return j.dump(2);
}

}  // namespace ioattn
