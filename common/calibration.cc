#include "common/calibration.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/cpu_tiles.h"
#include "common/hardware.h"

namespace ioattn {
namespace {

using nlohmann::json;

std::string cpu_model() {
  std::istringstream in(read_text_file("/proc/cpuinfo"));
  std::string line, part;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\t')) name.pop_back();
    std::string value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    if (name == "model name") return value;
    // Arm kernels name no model; the implementer and part number identify the core.
    if (name == "CPU part" && part.empty()) part = "Arm CPU part " + value;
  }
  return part.empty() ? "unknown" : part;
}

const char* dtype_key(DType d) { return dtype_name(d); }

bool dtype_from_key(const std::string& s, DType* out) {
  for (DType d : {DType::f32, DType::f16, DType::bf16}) {
    if (s == dtype_name(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

// Fields of one entry, type-checked; a message names the origin, the entry and the field.
class Reader {
 public:
  Reader(const json& obj, std::string where, std::string* error) : obj_(obj), where_(std::move(where)), error_(error) {}

  template <class T>
  bool get(const char* key, T* out) {
    const auto it = obj_.find(key);
    if (it == obj_.end()) return fail(std::string("missing field '") + key + "'");
    bool ok;
    if constexpr (std::is_same_v<T, std::string>)
      ok = it->is_string();
    else if constexpr (std::is_integral_v<T>)
      ok = it->is_number_integer() || it->is_number_unsigned();
    else
      ok = it->is_number();
    if (!ok) return fail(std::string("field '") + key + "' has the wrong type: " + it->dump());
    *out = it->get<T>();
    return true;
  }
  bool fail(const std::string& what) {
    *error_ = where_ + ": " + what;
    return false;
  }

 private:
  const json& obj_;
  std::string where_;
  std::string* error_;
};

bool finite_positive(double x) { return std::isfinite(x) && x > 0; }

bool parse_prefill(const json& j, const std::string& where, PrefillCalibration* out, std::string* error) {
  if (!j.is_object()) return Reader(j, where, error).fail("expected an object");
  Reader r(j, where, error);
  PrefillCalibration e;
  if (!r.get("head_dim", &e.head_dim) || !r.get("block_q_factor", &e.block_q_factor) ||
      !r.get("block_kv_factor", &e.block_kv_factor) || !r.get("planned_block_q", &e.planned_block_q) ||
      !r.get("planned_block_kv", &e.planned_block_kv) || !r.get("planned_ms", &e.planned_ms) ||
      !r.get("best_ms", &e.best_ms))
    return false;
  if (e.head_dim < 1) return r.fail("field 'head_dim' must be >= 1");
  // Factors beyond 1/8..8 are no neighbourhood of the plan: a hand-edited or corrupt file.
  for (double f : {e.block_q_factor, e.block_kv_factor})
    if (!(f >= 0.125 && f <= 8)) return r.fail("block factors must lie in [0.125, 8]");
  if (!finite_positive(e.planned_ms) || !finite_positive(e.best_ms)) return r.fail("times must be > 0");
  *out = e;
  return true;
}

bool parse_decode(const json& j, const std::string& where, DecodeCalibration* out, std::string* error) {
  if (!j.is_object()) return Reader(j, where, error).fail("expected an object");
  Reader r(j, where, error);
  DecodeCalibration e;
  std::string dtype;
  if (!r.get("kv_dtype", &dtype) || !r.get("prefetch_blocks", &e.prefetch_blocks) ||
      !r.get("split_factor", &e.split_factor) || !r.get("planned_ms", &e.planned_ms) || !r.get("best_ms", &e.best_ms) ||
      !r.get("planned_gbs", &e.planned_gbs) || !r.get("best_gbs", &e.best_gbs))
    return false;
  if (!dtype_from_key(dtype, &e.kv_dtype)) return r.fail("field 'kv_dtype' must be \"f32\", \"f16\" or \"bf16\"");
  if (e.prefetch_blocks < 0 || e.prefetch_blocks > cpu_decode_max_prefetch_blocks)
    return r.fail("field 'prefetch_blocks' must be 0.." + std::to_string(cpu_decode_max_prefetch_blocks));
  if (e.split_factor < 1 || e.split_factor > 8) return r.fail("field 'split_factor' must be 1..8");
  if (!finite_positive(e.planned_ms) || !finite_positive(e.best_ms)) return r.fail("times must be > 0");
  *out = e;
  return true;
}

bool parse_key(const json& j, const std::string& where, MachineKey* out, std::string* error) {
  if (!j.is_object()) return Reader(j, where, error).fail("expected an object");
  Reader r(j, where, error);
  MachineKey k;
  if (!r.get("cpu_model", &k.cpu_model) || !r.get("simd_target", &k.simd_target) || !r.get("cores", &k.cores))
    return false;
  const auto caches = j.find("cache_bytes");
  if (caches == j.end() || !caches->is_array()) return r.fail("field 'cache_bytes' must be an array of integers");
  for (const json& c : *caches) {
    if (!c.is_number_integer()) return r.fail("field 'cache_bytes' must be an array of integers");
    k.cache_bytes.push_back(c.get<int64_t>());
  }
  *out = std::move(k);
  return true;
}

json key_json(const MachineKey& k) {
  return {
      {"cpu_model", k.cpu_model}, {"simd_target", k.simd_target}, {"cores", k.cores}, {"cache_bytes", k.cache_bytes}};
}

std::mutex g_path_mutex;
std::string g_path_override;
bool g_path_overridden = false;

struct Loaded {
  std::string path;
  std::shared_ptr<const Calibration> calibration;
  std::string note;
};
std::mutex g_loaded_mutex;
std::shared_ptr<const Loaded> g_loaded;

Loaded load(const std::string& path) {
  Loaded l;
  l.path = path;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return l;  // no file: not calibrated, nothing to say
  const std::string text = read_text_file(path);
  auto c = std::make_shared<Calibration>();
  std::string error;
  if (!parse_calibration_json(text, path, c.get(), &error)) {
    l.note = "calibration file " + error + "; not used";
    return l;
  }
  const MachineKey host = host_machine_key();
  const std::string diff = c->key.difference(host);
  if (!diff.empty()) {
    l.note = "calibration file " + path + " was measured on another machine (" + diff + "); not used";
    return l;
  }
  l.calibration = std::move(c);
  return l;
}

}  // namespace

std::string MachineKey::difference(const MachineKey& o) const {
  if (cpu_model != o.cpu_model) return "CPU '" + cpu_model + "' vs '" + o.cpu_model + "'";
  if (simd_target != o.simd_target) return "target " + simd_target + " vs " + o.simd_target;
  if (cores != o.cores) return "cores " + std::to_string(cores) + " vs " + std::to_string(o.cores);
  if (cache_bytes != o.cache_bytes) return "cache sizes differ";
  return {};
}

const PrefillCalibration* Calibration::prefill_for(int64_t head_dim) const {
  const PrefillCalibration* best = nullptr;
  for (const PrefillCalibration& e : prefill) {
    // Nearest head dim; a tie goes to the larger, whose blocks are the tighter fit.
    const int64_t d = std::llabs(e.head_dim - head_dim);
    if (!best || d < std::llabs(best->head_dim - head_dim) ||
        (d == std::llabs(best->head_dim - head_dim) && e.head_dim > best->head_dim))
      best = &e;
  }
  return best;
}

const DecodeCalibration* Calibration::decode_for(DType kv_dtype) const {
  for (const DecodeCalibration& e : decode)
    if (e.kv_dtype == kv_dtype) return &e;
  return nullptr;
}

MachineKey host_machine_key() {
  const HardwareProfile host = detect_host();
  MachineKey k;
  k.cpu_model = cpu_model();
  k.simd_target = host.simd_target;
  k.cores = host.cores;
  for (const MemoryLevel& l : host.levels)
    if (l.size_bytes > 0) k.cache_bytes.push_back(l.size_bytes);
  return k;
}

std::string calibration_path() {
  {
    std::lock_guard<std::mutex> lock(g_path_mutex);
    if (g_path_overridden) return g_path_override;
  }
  // The environment and the machine key are read once: the key costs a read of /proc/cpuinfo.
  static const std::string default_path = []() -> std::string {
    if (const char* env = std::getenv("IOATTN_TUNE_FILE")) return env;
    std::string dir;
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && xdg[0] == '/') {
      dir = xdg;
    } else if (const char* home = std::getenv("HOME"); home && home[0] == '/') {
      dir = std::string(home) + "/.cache";
    } else {
      return {};
    }
    // One file per machine key, so a home folder shared by several machines keeps each one's.
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx",
                  (unsigned long long)std::hash<std::string>{}(key_json(host_machine_key()).dump()));
    return dir + "/ioattn/tune-" + hash + ".json";
  }();
  return default_path;
}

std::string set_calibration_path(const std::string& path) {
  std::string previous;
  {
    std::lock_guard<std::mutex> lock(g_path_mutex);
    previous = g_path_overridden ? g_path_override : std::string();
    g_path_override = path;
    g_path_overridden = !path.empty();
  }
  reset_host_calibration();
  return previous;
}

std::string calibration_to_json(const HardwareProfile& host, const Calibration& c) {
  json doc = json::parse(profile_to_json(host));
  json prefill = json::array(), decode = json::array();
  for (const PrefillCalibration& e : c.prefill)
    prefill.push_back({{"head_dim", e.head_dim},
                       {"block_q_factor", e.block_q_factor},
                       {"block_kv_factor", e.block_kv_factor},
                       {"planned_block_q", e.planned_block_q},
                       {"planned_block_kv", e.planned_block_kv},
                       {"planned_ms", e.planned_ms},
                       {"best_ms", e.best_ms}});
  for (const DecodeCalibration& e : c.decode)
    decode.push_back({{"kv_dtype", dtype_key(e.kv_dtype)},
                      {"prefetch_blocks", e.prefetch_blocks},
                      {"split_factor", e.split_factor},
                      {"planned_ms", e.planned_ms},
                      {"best_ms", e.best_ms},
                      {"planned_gbs", e.planned_gbs},
                      {"best_gbs", e.best_gbs}});
  doc["calibration"] = {{"key", key_json(c.key)}, {"created", c.created}, {"library", c.library},
                        {"threads", c.threads},   {"prefill", prefill},   {"decode", decode}};
  return doc.dump(2) + "\n";
}

bool parse_calibration_json(const std::string& text, const std::string& origin, Calibration* out, std::string* error) {
  const json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    *error = origin + ": not a JSON object";
    return false;
  }
  const auto cal = doc.find("calibration");
  if (cal == doc.end() || !cal->is_object()) {
    *error = origin + ": no 'calibration' object (a hardware profile without one is not a tuning file)";
    return false;
  }
  const std::string where = origin + " calibration";
  Calibration c;
  Reader r(*cal, where, error);
  if (!r.get("created", &c.created) || !r.get("library", &c.library) || !r.get("threads", &c.threads)) return false;
  const auto key = cal->find("key");
  if (key == cal->end()) return r.fail("missing field 'key'");
  if (!parse_key(*key, where + ".key", &c.key, error)) return false;
  for (const char* list : {"prefill", "decode"}) {
    const auto it = cal->find(list);
    if (it == cal->end() || !it->is_array()) return r.fail(std::string("field '") + list + "' must be an array");
  }
  for (size_t i = 0; i < (*cal)["prefill"].size(); ++i) {
    PrefillCalibration e;
    if (!parse_prefill((*cal)["prefill"][i], where + ".prefill[" + std::to_string(i) + "]", &e, error)) return false;
    c.prefill.push_back(e);
  }
  for (size_t i = 0; i < (*cal)["decode"].size(); ++i) {
    DecodeCalibration e;
    if (!parse_decode((*cal)["decode"][i], where + ".decode[" + std::to_string(i) + "]", &e, error)) return false;
    c.decode.push_back(e);
  }
  c.file = origin;
  *out = std::move(c);
  return true;
}

namespace {

// The file written first and renamed over `path` once complete.
std::string temp_name(const std::string& path) { return path + ".tmp" + std::to_string(::getpid()); }

// Writes `text` to the temporary file of `path`, creating its folders (mkdir -p).
bool write_temp(const std::string& path, const std::string& text, std::string* error) {
  if (path.empty()) {
    *error = "no calibration file location: set IOATTN_TUNE_FILE, XDG_CACHE_HOME or HOME, or pass a path";
    return false;
  }
  for (size_t slash = path.find('/', 1); slash != std::string::npos; slash = path.find('/', slash + 1)) {
    const std::string dir = path.substr(0, slash);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      *error = path + ": cannot create folder " + dir;
      return false;
    }
  }
  const std::string tmp = temp_name(path);
  std::ofstream f(tmp, std::ios::trunc);
  f << text;
  f.close();
  if (!f) {
    std::remove(tmp.c_str());
    *error = path + ": cannot write " + tmp;
    return false;
  }
  return true;
}

}  // namespace

bool check_calibration_path(const std::string& path, std::string* error) {
  // A folder at the path lets the temporary file be written but not renamed over it.
  struct stat st {};
  if (!path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    *error = path + ": is a folder, not a file";
    return false;
  }
  if (!write_temp(path, "", error)) return false;
  std::remove(temp_name(path).c_str());
  return true;
}

bool write_calibration_file(const std::string& path, const HardwareProfile& host, const Calibration& c,
                            std::string* error) {
  if (!write_temp(path, calibration_to_json(host, c), error)) return false;
  const std::string tmp = temp_name(path);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    *error = path + ": cannot replace it with " + tmp;
    return false;
  }
  return true;
}

std::shared_ptr<const Calibration> host_calibration(std::string* note) {
  // Kept until set_calibration_path or a tuning run resets it: a kernel call pays one lock.
  std::lock_guard<std::mutex> lock(g_loaded_mutex);
  if (!g_loaded) {
    const std::string path = calibration_path();
    g_loaded = std::make_shared<const Loaded>(path.empty() ? Loaded{} : load(path));
  }
  if (note) *note = g_loaded->note;
  return g_loaded->calibration;
}

void reset_host_calibration() {
  std::lock_guard<std::mutex> lock(g_loaded_mutex);
  g_loaded.reset();
}

}  // namespace ioattn
