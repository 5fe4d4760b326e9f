// The core table and /proc/cpuinfo's identity fields (common/cpu_cores.h).
#include "common/cpu_cores.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

namespace ioattn {
namespace {

// Vector FMA instructions a core issues per cycle at 128-, 256- and 512-bit width (0 = the width
// does not exist there). Sources: Intel's optimization manual and ARK ("# of AVX-512 FMA Units"),
// AMD's software optimization guides for families 17h and 19h, Arm's Neoverse software
// optimization guides. Where a core splits a wide op into narrower halves the rate halves: Zen
// and Zen+ run a 256-bit FMA as two 128-bit ops on their two 128-bit FMA pipes (1 a cycle), Zen 4
// a 512-bit one as two 256-bit ops on its two 256-bit pipes (1 a cycle, the lanes of 2 x 256 a
// cycle), client Ice Lake / Tiger Lake / Rocket Lake fuse ports 0 and 1 into their one 512-bit
// FMA. Neoverse V1's four 128-bit pipes pair up for its 256-bit SVE vectors (the SVE_256 target).
struct CoreRow {
  const char* vendor;      // vendor_id on x86; "ARM" for Arm's own cores (CPU implementer 0x41)
  int family;              // x86 cpu family; 0 on Arm
  int model_lo, model_hi;  // x86 model range, or the Arm CPU part
  const char* name;
  int fma128, fma256, fma512;
};

constexpr CoreRow kCores[] = {
    {"GenuineIntel", 6, 0x3C, 0x3C, "Intel Haswell", 2, 2, 0},
    {"GenuineIntel", 6, 0x3F, 0x3F, "Intel Haswell-EP", 2, 2, 0},
    {"GenuineIntel", 6, 0x45, 0x46, "Intel Haswell", 2, 2, 0},
    {"GenuineIntel", 6, 0x3D, 0x3D, "Intel Broadwell", 2, 2, 0},
    {"GenuineIntel", 6, 0x47, 0x47, "Intel Broadwell", 2, 2, 0},
    {"GenuineIntel", 6, 0x4F, 0x4F, "Intel Broadwell-EP", 2, 2, 0},
    {"GenuineIntel", 6, 0x56, 0x56, "Intel Broadwell-DE", 2, 2, 0},
    {"GenuineIntel", 6, 0x4E, 0x4E, "Intel Skylake client", 2, 2, 0},
    {"GenuineIntel", 6, 0x5E, 0x5E, "Intel Skylake client", 2, 2, 0},
    {"GenuineIntel", 6, 0x8E, 0x8E, "Intel Kaby/Coffee/Whiskey Lake", 2, 2, 0},
    {"GenuineIntel", 6, 0x9E, 0x9E, "Intel Kaby/Coffee Lake", 2, 2, 0},
    {"GenuineIntel", 6, 0xA5, 0xA6, "Intel Comet Lake", 2, 2, 0},
    // Skylake-SP, Cascade Lake, Cooper Lake: 2 x 512 on Gold 6xxx / Platinum; core_fma() drops to
    // 1 on Bronze, Silver and Gold 5xxx, which have one 512-bit FMA unit (ARK lists a few Gold 5
    // parts with two: there the probe reads about 200% of the theoretical figure, which shows it).
    {"GenuineIntel", 6, 0x55, 0x55, "Intel Skylake-SP/Cascade Lake Xeon", 2, 2, 2},
    {"GenuineIntel", 6, 0x6A, 0x6A, "Intel Ice Lake Xeon", 2, 2, 2},
    {"GenuineIntel", 6, 0x6C, 0x6C, "Intel Ice Lake Xeon", 2, 2, 2},
    {"GenuineIntel", 6, 0x7D, 0x7E, "Intel Ice Lake client", 2, 2, 1},
    {"GenuineIntel", 6, 0x8C, 0x8D, "Intel Tiger Lake", 2, 2, 1},
    {"GenuineIntel", 6, 0xA7, 0xA7, "Intel Rocket Lake", 2, 2, 1},
    // Golden / Raptor Cove server cores: ports 0 and 1 (fused for 512-bit) plus port 5's 512-bit
    // FMA; 256-bit FMAs issue on ports 0 and 1 only.
    {"GenuineIntel", 6, 0x8F, 0x8F, "Intel Xeon Sapphire Rapids", 2, 2, 2},
    {"GenuineIntel", 6, 0xCF, 0xCF, "Intel Xeon Emerald Rapids", 2, 2, 2},
    {"GenuineIntel", 6, 0xAD, 0xAE, "Intel Xeon Granite Rapids", 2, 2, 2},
    {"AuthenticAMD", 0x17, 0x00, 0x2F, "AMD Zen/Zen+", 2, 1, 0},
    {"AuthenticAMD", 0x17, 0x30, 0xFF, "AMD Zen 2", 2, 2, 0},
    {"AuthenticAMD", 0x19, 0x00, 0x0F, "AMD Zen 3", 2, 2, 0},
    {"AuthenticAMD", 0x19, 0x20, 0x5F, "AMD Zen 3", 2, 2, 0},
    {"AuthenticAMD", 0x19, 0x10, 0x1F, "AMD Zen 4", 2, 2, 1},
    {"AuthenticAMD", 0x19, 0x60, 0x7F, "AMD Zen 4", 2, 2, 1},
    {"AuthenticAMD", 0x19, 0xA0, 0xAF, "AMD Zen 4", 2, 2, 1},
    {"ARM", 0, 0xD0C, 0xD0C, "Arm Neoverse N1", 2, 0, 0},
    {"ARM", 0, 0xD49, 0xD49, "Arm Neoverse N2", 2, 0, 0},
    {"ARM", 0, 0xD40, 0xD40, "Arm Neoverse V1", 4, 2, 0},
    {"ARM", 0, 0xD4F, 0xD4F, "Arm Neoverse V2", 4, 0, 0},
};

long parse_number(const std::string& text) { return text.empty() ? -1 : std::strtol(text.c_str(), nullptr, 0); }

}  // namespace

CpuIdentity parse_cpuinfo(const std::string& text) {
  // The first processor's "key : value" fields (x86: vendor_id, cpu family, model, model name,
  // flags; AArch64: CPU implementer, CPU part); a blank line ends it.
  std::string vendor, family, model, implementer, part;
  CpuIdentity id;
  std::istringstream in(text);
  std::string line;
  bool seen = false;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) {
      if (seen && line.find_first_not_of(" \t") == std::string::npos) break;
      continue;
    }
    seen = true;
    std::string name = line.substr(0, colon);
    name.erase(name.find_last_not_of(" \t") + 1);
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    const std::string value = start == std::string::npos ? std::string() : line.substr(start);
    const std::pair<const char*, std::string*> fields[] = {
        {"vendor_id", &vendor}, {"cpu family", &family},           {"model", &model},  {"model name", &id.model_name},
        {"flags", &id.flags},   {"CPU implementer", &implementer}, {"CPU part", &part}};
    for (const auto& [key, dst] : fields)
      if (name == key) *dst = value;
  }
  if (vendor.empty() && parse_number(implementer) == 0x41) {
    id.vendor = "ARM";
    id.family = 0;
    id.model = parse_number(part);
  } else {
    id.vendor = vendor;
    id.family = parse_number(family);
    id.model = parse_number(model);
  }
  return id;
}

const CpuIdentity& host_cpu_identity() {
  static const CpuIdentity id = [] {
    std::ifstream in("/proc/cpuinfo");
    std::stringstream text;
    text << in.rdbuf();
    return parse_cpuinfo(text.str());
  }();
  return id;
}

CoreFma core_fma(const CpuIdentity& cpu, int vector_bits) {
  CoreFma out;
  char id[96];
  if (cpu.vendor == "ARM")
    std::snprintf(id, sizeof(id), "Arm CPU part 0x%lx", cpu.model);
  else
    std::snprintf(id, sizeof(id), "%s family 0x%lx model 0x%lx",
                  cpu.vendor.empty() ? "unknown vendor" : cpu.vendor.c_str(), cpu.family, cpu.model);
  out.core = std::string("unknown core (") + id + ")";
  for (const CoreRow& row : kCores) {
    if (cpu.vendor != row.vendor || cpu.family != row.family || cpu.model < row.model_lo || cpu.model > row.model_hi)
      continue;
    out.core = row.name;
    out.fma_per_cycle = vector_bits <= 128 ? row.fma128 : vector_bits <= 256 ? row.fma256 : row.fma512;
    if (row.family == 6 && row.model_lo == 0x55 && vector_bits > 256) {
      const std::string& name = cpu.model_name;
      if (name.find("Bronze") != std::string::npos || name.find("Silver") != std::string::npos ||
          name.find("Gold 5") != std::string::npos) {
        out.fma_per_cycle = 1;
      }
    }
    if (out.fma_per_cycle == 0) out.core += " (no FMA at this width)";
    break;
  }
  // A hypervisor may report a client model number for a server core (a 2-vCPU KVM guest on an
  // Emerald Rapids host reads model 0xA7, Rocket Lake, which has one 512-bit FMA unit): AMX
  // exists only on the Sapphire Rapids class of server cores, which have two.
  const std::string flags = " " + cpu.flags + " ";
  if (cpu.vendor == "GenuineIntel" && vector_bits > 256 && out.fma_per_cycle == 1 &&
      flags.find(" amx_tile ") != std::string::npos) {
    out.core += " as reported; AMX says a Sapphire Rapids class server core";
    out.fma_per_cycle = 2;
  }
  return out;
}

}  // namespace ioattn
