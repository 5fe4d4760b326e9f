// Hardware profiles: the built-ins carry the figures and sources the planner relies on, the host
// is detected from sysfs and Highway, and custom profile files fail loudly when malformed.
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "common/backend.h"
#include "common/cpu_cores.h"
#include "common/hardware.h"
#include "tests/catch.h"

using namespace ioattn;

namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = "/tmp/ioattn_test_hw_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  return path;
}

HardwareProfile builtin(const std::string& name) {
  HardwareProfile hw;
  std::string error;
  REQUIRE(find_profile(name, &hw, &error));
  return hw;
}

}  // namespace

TEST_CASE("every required built-in profile exists, with sources for each figure") {
  const std::set<std::string> required = {"zen3",      "spr-xeon", "neoverse-v1", "neoverse-v2", "apple-m2",   "rpi5",
                                          "a100-80gb", "h100-sxm", "h200-sxm",    "rtx4090",     "jetson-orin"};
  std::set<std::string> names;
  for (const HardwareProfile& hw : builtin_profiles()) {
    INFO(hw.name);
    names.insert(hw.name);
    CHECK(std::regex_match(hw.name, std::regex("[a-z0-9]+(-[a-z0-9]+)*")));
    CHECK_FALSE(hw.source.empty());
    CHECK_FALSE(hw.description.empty());
    CHECK(hw.cores >= 1);
    CHECK(hw.fma_gflops_per_core > 0);
    REQUIRE(hw.levels.size() >= 3);
    CHECK(hw.dram().size_bytes == 0);
    CHECK(hw.dram().bandwidth_gbs > 0);
    for (size_t i = 0; i < hw.levels.size(); ++i) {
      INFO(hw.levels[i].name);
      CHECK_FALSE(hw.levels[i].source.empty());
      if (i + 1 < hw.levels.size()) CHECK(hw.levels[i].size_bytes > 0);
    }
    if (hw.kind == DeviceKind::gpu) {
      CHECK(hw.levels.front().name == "smem");
      CHECK(hw.smem_per_block_bytes <= hw.levels.front().size_bytes);
      CHECK(hw.tensor_tflops > 0);
    } else {
      CHECK(hw.levels.front().name == "L1d");
      CHECK(hw.level("L2") != nullptr);
    }
  }
  for (const std::string& n : required) CHECK(names.count(n) == 1);
  CHECK(names.size() == builtin_profiles().size());  // names are unique
}

TEST_CASE("zen3 and h200-sxm carry the datasheet figures") {
  const HardwareProfile zen3 = builtin("zen3");
  CHECK(zen3.cores == 2);
  CHECK(zen3.simd_bits == 256);
  CHECK(zen3.level("L1d")->size_bytes == 32 * 1024);
  CHECK(zen3.level("L2")->size_bytes == 512 * 1024);
  CHECK(zen3.level("L3")->size_bytes == 32 * 1024 * 1024);
  CHECK(zen3.level("L3")->shared_by == 8);
  CHECK(zen3.fma_gflops_per_core == Approx(128));

  const HardwareProfile h200 = builtin("h200-sxm");
  CHECK(h200.kind == DeviceKind::gpu);
  CHECK(h200.cores == 132);
  CHECK(h200.levels[0].size_bytes == 228 * 1024);
  CHECK(h200.smem_per_block_bytes == 227 * 1024);
  CHECK(h200.level("L2")->size_bytes == 50 * 1024 * 1024);
  CHECK(h200.level("L2")->partitions == 2);
  CHECK(h200.dram().bandwidth_gbs == Approx(4800));
  CHECK(h200.tensor_tflops == Approx(990).epsilon(0.01));
}

TEST_CASE("an unknown name lists the valid ones") {
  HardwareProfile hw;
  std::string error;
  CHECK_FALSE(find_profile("zen9", &hw, &error));
  CHECK(error.find("'zen9'") != std::string::npos);
  CHECK(error.find("host") != std::string::npos);
  CHECK(error.find("h200-sxm") != std::string::npos);
  CHECK(error.find("rpi5") != std::string::npos);
}

TEST_CASE("the host profile comes from sysfs and Highway") {
  HardwareProfile host;
  std::string error;
  REQUIRE(find_profile("host", &host, &error));
  CHECK(host.name == "host");
  CHECK(host.kind == DeviceKind::cpu);
  CHECK(host.cores >= 1);
  CHECK_FALSE(host.simd_target.empty());
  CHECK((host.simd_bits == 128 || host.simd_bits == 256 || host.simd_bits == 512));
  // FMAs per cycle at the dispatched width from the core table, 2 off it.
  const CoreFma core = core_fma(host_cpu_identity(), host.simd_bits);
  const int per_cycle = core.fma_per_cycle > 0 ? core.fma_per_cycle : 2;
  CHECK(host.fma_gflops_per_core == Approx(host.simd_bits / 32 * per_cycle * 2 * host.clock_ghz));
  CHECK(host.description.find(core.core) != std::string::npos);
  REQUIRE(host.levels.size() >= 2);
  CHECK(host.dram().size_bytes == 0);
  for (size_t i = 1; i + 1 < host.levels.size(); ++i) CHECK(host.levels[i].size_bytes >= host.levels[i - 1].size_bytes);
  // Where sysfs describes the L1 data cache, the profile must report exactly that.
  std::ifstream size_file("/sys/devices/system/cpu/cpu0/cache/index0/size");
  std::ifstream type_file("/sys/devices/system/cpu/cpu0/cache/index0/type");
  std::string size, type;
  if (size_file >> size && type_file >> type && type == "Data") {
    REQUIRE(host.level("L1d") != nullptr);
    CHECK(host.level("L1d")->size_bytes == std::stoll(size) * 1024);
  }
  // Cached: the second call answers the same.
  CHECK(detect_host().levels.size() == host.levels.size());
}

#ifdef __linux__
TEST_CASE("the default thread count follows the affinity mask, not the online CPU count") {
  cpu_set_t all;
  REQUIRE(sched_getaffinity(0, sizeof(all), &all) == 0);
  CHECK(available_cpus() == CPU_COUNT(&all));
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; ++c)
    if (CPU_ISSET(c, &all)) first = c;
  REQUIRE(first >= 0);
  // A thread bound to one CPU (as taskset or a container's cpuset binds a process) sees one.
  int seen = 0, bound = -1;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    bound = sched_setaffinity(0, sizeof(one), &one);
    seen = available_cpus();
  });
  t.join();
  REQUIRE(bound == 0);
  CHECK(seen == 1);
}
#endif

#if !IOATTN_HAVE_CUDA
TEST_CASE("a build without CUDA detects no GPU") {
  HardwareProfile gpu;
  CHECK_FALSE(detect_gpu(&gpu));
  CHECK_FALSE(gpu_backend().query_device(&gpu));
  CHECK_FALSE(gpu_backend().available());
}
#endif

TEST_CASE("profile_to_json round-trips through load_profile_file") {
  for (const HardwareProfile& hw : builtin_profiles()) {
    INFO(hw.name);
    const std::string path = write_temp(hw.name + ".json", profile_to_json(hw));
    HardwareProfile back;
    std::string error;
    REQUIRE(load_profile_file(path, &back, &error));
    CHECK(back.name == hw.name);
    CHECK(back.kind == hw.kind);
    CHECK(back.cores == hw.cores);
    CHECK(back.simd_bits == hw.simd_bits);
    CHECK(back.fma_gflops_per_core == hw.fma_gflops_per_core);
    CHECK(back.smem_per_block_bytes == hw.smem_per_block_bytes);
    REQUIRE(back.levels.size() == hw.levels.size());
    for (size_t i = 0; i < hw.levels.size(); ++i) {
      CHECK(back.levels[i].name == hw.levels[i].name);
      CHECK(back.levels[i].size_bytes == hw.levels[i].size_bytes);
      CHECK(back.levels[i].shared_by == hw.levels[i].shared_by);
      CHECK(back.levels[i].partitions == hw.levels[i].partitions);
      CHECK(back.levels[i].bandwidth_gbs == hw.levels[i].bandwidth_gbs);
    }
    std::remove(path.c_str());
  }
}

TEST_CASE("IOATTN_HW_PROFILE's value: a CPU profile's name or file, else the detected host") {
  CHECK(planning_profile("").name == "host");
  CHECK(planning_profile("zen3").levels[1].size_bytes == 524288);
  // A GPU profile, a file that does not exist: the host, saying what was ignored.
  for (const char* value : {"h200-sxm", "/nonexistent/profile.json"}) {
    const HardwareProfile hw = planning_profile(value);
    CHECK(hw.name == "host");
    CHECK(hw.description.find(std::string("IOATTN_HW_PROFILE='") + value + "'") != std::string::npos);
  }
  HardwareProfile zen3;
  std::string error;
  REQUIRE(find_profile("zen3", &zen3, &error));
  zen3.name = "zen3-file";
  const std::string path = write_temp("zen3-file.json", profile_to_json(zen3));
  CHECK(planning_profile(path).name == "zen3-file");
  std::remove(path.c_str());
}

TEST_CASE("a malformed profile file is an error naming the file and the field") {
  const std::string good = R"({"name": "tiny", "kind": "cpu", "cores": 1, "fma_gflops_per_core": 10,
    "levels": [{"name": "L1d", "size_bytes": 1024, "bandwidth_gbs": 10},
               {"name": "DRAM", "size_bytes": 0, "bandwidth_gbs": 1}]})";
  HardwareProfile hw;
  std::string error;
  const std::string good_path = write_temp("good.json", good);
  REQUIRE(load_profile_file(good_path, &hw, &error));
  CHECK(hw.name == "tiny");
  std::remove(good_path.c_str());

  struct Bad {
    std::string text, field;
  };
  const Bad cases[] = {
      {"{not json", "not valid JSON"},
      {R"({"kind": "cpu"})", "'name'"},
      {R"({"name": "x", "kind": "tpu", "cores": 1, "fma_gflops_per_core": 1, "levels": []})", "'kind'"},
      {R"({"name": "x", "kind": "cpu", "cores": "two", "fma_gflops_per_core": 1})",
       R"('cores' must be an integer, got "two")"},
      {R"({"name": "x", "kind": "cpu", "cores": 1, "fma_gflops_per_core": 1, "levels": [{"name": "L1d", "size_bytes": 1e15, "bandwidth_gbs": 1}, {"name": "DRAM", "size_bytes": 0, "bandwidth_gbs": 1}]})",
       "'size_bytes' must be an integer, got 1"},
      {R"({"name": "x", "kind": "cpu", "cores": 0, "fma_gflops_per_core": 1})", "'cores'"},
      {R"({"name": "x", "kind": "cpu", "cores": 1, "fma_gflops_per_core": 1, "levels": [{"name": "DRAM", "size_bytes": 0, "bandwidth_gbs": 1}]})",
       "'levels'"},
      {R"({"name": "x", "kind": "cpu", "cores": 1, "fma_gflops_per_core": 1, "levels": [{"name": "L1d", "size_bytes": 1024, "bandwidth_gbs": 1}, {"name": "DRAM", "size_bytes": 5, "bandwidth_gbs": 1}]})",
       "'size_bytes'"},
      {R"({"name": "x", "kind": "cpu", "cores": 1, "fma_gflops_per_core": 1, "levels": [{"name": "L1d", "size_bytes": 1024}, {"name": "DRAM", "size_bytes": 0, "bandwidth_gbs": 1}]})",
       "'bandwidth_gbs'"},
      {R"({"name": "x", "kind": "gpu", "cores": 1, "fma_gflops_per_core": 1, "levels": [{"name": "smem", "size_bytes": 1024, "bandwidth_gbs": 1}, {"name": "HBM", "size_bytes": 0, "bandwidth_gbs": 1}]})",
       "'smem_per_block_bytes'"},
  };
  int i = 0;
  for (const Bad& bad : cases) {
    const std::string path = write_temp("bad" + std::to_string(i++) + ".json", bad.text);
    INFO(bad.text);
    error.clear();
    CHECK_FALSE(load_profile_file(path, &hw, &error));
    CHECK(error.find(path) != std::string::npos);
    CHECK(error.find(bad.field) != std::string::npos);
    std::remove(path.c_str());
  }
  CHECK_FALSE(load_profile_file("/nonexistent/ioattn.json", &hw, &error));
  CHECK(error.find("/nonexistent/ioattn.json") != std::string::npos);
}

TEST_CASE("the core table reads /proc/cpuinfo's first processor and its FMA rate per width") {
  // A Zen 4 issues a 512-bit FMA as two 256-bit halves: one a cycle, where AVX2 issues two.
  const std::string zen4 =
      "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
      "model name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f\n\n"
      "processor\t: 1\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n";
  const CpuIdentity id = parse_cpuinfo(zen4);
  CHECK(id.vendor == "AuthenticAMD");
  CHECK(id.family == 25);
  CHECK(id.model == 17);
  CHECK(id.model_name == "AMD EPYC");
  CHECK(core_fma(id, 512).core == "AMD Zen 4");
  CHECK(core_fma(id, 512).fma_per_cycle == 1);
  CHECK(core_fma(id, 256).fma_per_cycle == 2);

  // Skylake-SP: two 512-bit units on Gold 6xxx, one on Silver; a hypervisor's client model
  // number with AMX is a Sapphire Rapids class server core (two).
  CpuIdentity skx = parse_cpuinfo(
      "vendor_id : GenuineIntel\ncpu family : 6\nmodel : 85\n"
      "model name : Intel(R) Xeon(R) Gold 6248 CPU\n");
  CHECK(core_fma(skx, 512).fma_per_cycle == 2);
  skx.model_name = "Intel(R) Xeon(R) Silver 4214 CPU";
  CHECK(core_fma(skx, 512).fma_per_cycle == 1);
  CpuIdentity rkl = parse_cpuinfo("vendor_id : GenuineIntel\ncpu family : 6\nmodel : 167\nflags : avx512f\n");
  CHECK(core_fma(rkl, 512).fma_per_cycle == 1);
  rkl.flags = "avx512f amx_tile amx_bf16";
  CHECK(core_fma(rkl, 512).fma_per_cycle == 2);

  // Arm's cores by CPU part; an AVX2-only core has no 512-bit FMA; an unknown core says so.
  const CpuIdentity v1 = parse_cpuinfo("processor : 0\nCPU implementer : 0x41\nCPU part : 0xd40\n");
  CHECK(v1.vendor == "ARM");
  CHECK(core_fma(v1, 128).core == "Arm Neoverse V1");
  CHECK(core_fma(v1, 128).fma_per_cycle == 4);
  CHECK(core_fma(v1, 256).fma_per_cycle == 2);
  const CpuIdentity zen3 = parse_cpuinfo("vendor_id : AuthenticAMD\ncpu family : 25\nmodel : 1\n");
  CHECK(core_fma(zen3, 256).fma_per_cycle == 2);
  CHECK(core_fma(zen3, 512).fma_per_cycle == 0);
  CHECK(core_fma(zen3, 512).core.find("no FMA at this width") != std::string::npos);
  const CoreFma unknown = core_fma(parse_cpuinfo("vendor_id : HygonGenuine\ncpu family : 24\nmodel : 0\n"), 256);
  CHECK(unknown.fma_per_cycle == 0);
  CHECK(unknown.core == "unknown core (HygonGenuine family 0x18 model 0x0)");
  CHECK(core_fma(parse_cpuinfo(""), 256).fma_per_cycle == 0);
}
