// What a CPU core issues per cycle, from a table of documented cores: the fp32 FMA peak of the
// detected host profile (common/hardware.cc) and the theoretical figure the benchmarks' FMA probe
// is checked against (bench/lib/ceilings.cc) come from the same rows.
#pragma once

#include <string>

namespace ioattn {

// The fields of /proc/cpuinfo's first processor that identify its core.
struct CpuIdentity {
  std::string vendor;      // x86 vendor_id; "ARM" for Arm's own cores (CPU implementer 0x41)
  long family = -1;        // x86 cpu family; 0 on Arm
  long model = -1;         // x86 model, or the Arm CPU part
  std::string model_name;  // x86 "model name"
  std::string flags;       // x86 flags, space separated
};

// Parses /proc/cpuinfo text; fields it lacks stay empty or -1.
CpuIdentity parse_cpuinfo(const std::string& text);
// This machine's (read once).
const CpuIdentity& host_cpu_identity();

// A core's fp32 FMA issue rate at one vector width.
struct CoreFma {
  std::string core;       // the table's row, or "unknown core (<vendor> family F model M)"
  int fma_per_cycle = 0;  // vector FMA instructions per cycle per core; 0 = not known
};
CoreFma core_fma(const CpuIdentity& cpu, int vector_bits);

}  // namespace ioattn
