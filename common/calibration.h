// Calibration: plan choices timed on the machine that runs them (`ioattn tune`), kept in a
// per-machine file next to the cache-derived plan they adjust.
//
// The planner derives blocks from cache sizes, which says what fits but not what runs fastest:
// prefetchers, fill buffers and L2 latency differ between cores with the same caches. A tuning
// run times a few candidates around the cache-derived plan for each problem class (prefill by
// head dim, decode by cache dtype) and stores the winners as factors of that plan, so they
// carry over to other sequence lengths and batch sizes the way the planner's own rules do. A
// factor never depends on the thread count, so a calibrated plan, like the planner's, gives the
// same bits for any number of threads.
//
// The file is the hardware-profile JSON (profiles.json's schema) of the host it was measured on,
// with a "calibration" object added: the machine key, then the entries. It is used only where
// the key matches the running host; otherwise plans stay cache-derived and `ioattn explain`
// says why.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace ioattn {

struct HardwareProfile;

// What identifies a machine for calibration: timings from another CPU model, SIMD target, core
// count (an affinity mask changes it) or cache hierarchy say nothing about this one.
struct MachineKey {
  std::string cpu_model;  // /proc/cpuinfo "model name" (or the Arm "CPU part"), "unknown" if absent
  std::string simd_target;
  int cores = 0;
  std::vector<int64_t> cache_bytes;  // per-instance sizes of the caches, innermost first

  bool operator==(const MachineKey& o) const {
    return cpu_model == o.cpu_model && simd_target == o.simd_target && cores == o.cores && cache_bytes == o.cache_bytes;
  }
  // The first field that differs from `o`, as "cores 16 vs 2"; empty when equal.
  std::string difference(const MachineKey& o) const;
};

// Prefill (query rows per kv head above the decode limit): block_q and block_kv as multiples of
// the cache-derived plan's. Measured at one head dim; applied to problems of the nearest head dim.
struct PrefillCalibration {
  int head_dim = 0;
  double block_q_factor = 1, block_kv_factor = 1;
  int planned_block_q = 0, planned_block_kv = 0;  // the tuning problem's cache-derived blocks
  // The cache-derived candidate's median time, and that times the chosen one's median ratio to it
  // (each round timed side by side).
  double planned_ms = 0, best_ms = 0;
};

// Decode: the software prefetch distance in 32-key blocks (0: none, the hardware prefetchers
// alone) and a multiple of the planned key splits. Keyed by the cache's dtype.
struct DecodeCalibration {
  DType kv_dtype = DType::f16;
  int prefetch_blocks = 1;
  int split_factor = 1;
  double planned_ms = 0, best_ms = 0;
  double planned_gbs = 0, best_gbs = 0;  // K/V bytes read per second
};

struct Calibration {
  MachineKey key;
  std::string file;     // where it was read from or written to
  std::string created;  // UTC time of the tuning run, ISO 8601
  std::string library;  // ioattn version that measured it
  int threads = 0;      // threads the candidates were timed with
  std::vector<PrefillCalibration> prefill;
  std::vector<DecodeCalibration> decode;

  const PrefillCalibration* prefill_for(int64_t head_dim) const;
  const DecodeCalibration* decode_for(DType kv_dtype) const;
};

// A tuning run (ioattn_tune): threads to time with (0: the library default), small problems for
// a smoke run, and a progress callback after each timed call.
struct TuneRequest {
  int threads = 0;
  bool quick = false;
  void (*progress)(int done, int total, const char* what, void* user) = nullptr;
  void* user = nullptr;
};

// The running host's key (detect_host's caches and target, /proc/cpuinfo's model).
MachineKey host_machine_key();

// The calibration file in effect: set_calibration_path's value if set, else the environment
// variable IOATTN_TUNE_FILE, read once (an empty value turns calibration off), else
// $XDG_CACHE_HOME/ioattn/tune-<key hash>.json (XDG_CACHE_HOME defaulting to ~/.cache). Empty when
// calibration is off or no location can be formed.
std::string calibration_path();
// A process-wide override of the location (the CLI's --tune-file); "" returns to the default
// rule. Returns the override it replaced ("" for none).
std::string set_calibration_path(const std::string& path);

// The JSON document written to a calibration file: profile_to_json's object of `host` plus the
// "calibration" member.
std::string calibration_to_json(const HardwareProfile& host, const Calibration& c);
// Parses the "calibration" member of a profile document; false with a message naming the file
// and field when malformed. `origin` names the text in messages.
bool parse_calibration_json(const std::string& text, const std::string& origin, Calibration* out, std::string* error);

// Whether `path` can be written (creating its folders): a tuning run checks before it times
// anything. False with a message naming the path.
bool check_calibration_path(const std::string& path, std::string* error);

// Writes `c` for `host` to `path` (creating its folder), replacing any earlier file only once the
// new one is complete. False with a message naming the path on failure; no file is left half
// written.
bool write_calibration_file(const std::string& path, const HardwareProfile& host, const Calibration& c,
                            std::string* error);

// The calibration in effect for the running host: read from calibration_path() at the first call
// and kept until the path changes or reset_host_calibration. Null when there is none, it is malformed or it
// belongs to another machine; *note (if given) then says which, or is empty when no file exists.
std::shared_ptr<const Calibration> host_calibration(std::string* note = nullptr);
// Forgets what host_calibration read, so the next call reads the file again (after a tuning run).
void reset_host_calibration();

}  // namespace ioattn
