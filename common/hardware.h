// Hardware profiles: the detected host (sysfs, Highway's dispatch target, the CUDA device) or a
// named built-in profile from common/profiles.json, each figure carrying its source.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ioattn {

struct Calibration;

enum class DeviceKind { cpu, gpu };

// One level of the memory hierarchy, innermost first. For a CPU: L1d, L2, L3, then DRAM; for a
// GPU: shared memory (per SM), L2, then HBM/DRAM. The last level is the off-chip memory.
struct MemoryLevel {
  std::string name;          // "L1d", "L2", "L3", "DRAM", "smem", "HBM"
  int64_t size_bytes = 0;    // capacity of one instance (0 for the off-chip level: unbounded)
  int shared_by = 1;         // cores (CPU) or SMs (GPU) sharing one instance
  int line_bytes = 64;       // cache line or sector transfer size
  double bandwidth_gbs = 0;  // sustained read bandwidth into the level above, whole chip
  std::string source;        // where the figures came from (datasheet URL, sysfs, measured)
  // Instances that each cache their own copy of data read by all cores: A100/H100 L2 is two
  // partitions, each caching for the SMs wired to it, so data every SM reads occupies both and
  // the capacity it sees is size_bytes / partitions.
  int partitions = 1;
};

// A link to another device of the same kind, for spreading one problem over several (ring
// attention): NVLink or PCIe between GPUs, a network between CPU hosts.
struct Link {
  std::string name;          // "NVLink4", "PCIe5", "100GbE"
  double bandwidth_gbs = 0;  // per direction: a ring step sends and receives at once
  double latency_us = 0;     // per message
  std::string source;
};

struct HardwareProfile {
  std::string name;         // "zen3", "h200-sxm", "host", ...
  std::string description;  // "AMD EPYC 7003 (Milan) core, Zen 3"
  DeviceKind kind = DeviceKind::cpu;
  int cores = 1;                   // CPU cores, or GPU SMs
  int simd_bits = 256;             // CPU: widest vector Highway dispatches to
  std::string simd_target;         // CPU: Highway target name ("AVX2", "AVX3", "NEON", "SVE2")
  double fma_gflops_per_core = 0;  // fp32 FMA peak per core (CPU) or per SM (GPU, fp32 CUDA cores)
  double tensor_tflops = 0;        // GPU: dense bf16/f16 tensor-core peak, whole chip
  double clock_ghz = 0;
  // GPU only.
  int64_t smem_per_block_bytes = 0;  // opt-in maximum per thread block
  int regs_per_sm = 0;
  int compute_capability = 0;       // major * 10 + minor (90: Hopper, whose plans take the sm_90a kernel); 0 unknown
  std::vector<MemoryLevel> levels;  // innermost first, off-chip last
  std::vector<Link> links;          // to peers, fastest first; may be empty
  std::string source;               // provenance of the profile as a whole
  // CPU: plan choices measured on this machine (common/calibration.h), or null. Only the detected
  // host carries one; calibration_note says why a file was not used.
  std::shared_ptr<const Calibration> calibration;
  std::string calibration_note;

  const MemoryLevel* level(const std::string& level_name) const;
  const MemoryLevel& dram() const { return levels.back(); }
};

// Built-in profiles in the order of profiles.json.
const std::vector<HardwareProfile>& builtin_profiles();

// "host" detects this machine (and is cached); any other name looks up a built-in profile.
// Returns false and fills *error (naming the value and the valid names) when unknown.
bool find_profile(const std::string& name, HardwareProfile* out, std::string* error);

// Detected host CPU: sysfs caches and sharing, core count (available_cpus() at the first call),
// Highway's dispatch target.
HardwareProfile detect_host();

// The profile the CPU backend plans for: planning_profile of the environment variable
// IOATTN_HW_PROFILE (read once, at the first call). Lets a cache simulator's run plan for the
// hierarchy it simulates (docs/api.md).
HardwareProfile planning_host();
// The same profile, shared rather than copied (a kernel call plans with it): rebuilt only when
// the calibration in effect changes.
std::shared_ptr<const HardwareProfile> planning_host_shared();

// The CPU profile `value` names: a built-in profile, else a JSON profile file; the detected host
// for an empty value, and for one that names neither, with the value quoted in its description.
HardwareProfile planning_profile(const std::string& value);

// CPUs the calling thread's affinity mask allows (all online CPUs where there is no mask).
int available_cpus();

// Detected CUDA device 0 (the CUDA backend's device query), when this build has CUDA and a
// device is visible.
bool detect_gpu(HardwareProfile* out);

// A custom profile from a JSON file in the same schema as profiles.json; false and a message
// naming the file and the offending field when malformed.
bool load_profile_file(const std::string& path, HardwareProfile* out, std::string* error);

// JSON text of a profile (the schema load_profile_file reads).
std::string profile_to_json(const HardwareProfile& hw);

// Parses JSON text in the schema of profiles.json (one profile object); `origin` names the
// text in messages (a file name, "built-in").
bool parse_profile_json(const std::string& text, const std::string& origin, HardwareProfile* out, std::string* error);

// A whole text file (sysfs, /proc, JSON); empty when it cannot be read.
std::string read_text_file(const std::string& path);

// Worker count the library uses when the caller passes 0: IOATTN_NUM_THREADS, else all cores.
int default_threads();

// The names find_profile accepts: "host" then the built-ins, comma separated.
std::string profile_names();

}  // namespace ioattn
