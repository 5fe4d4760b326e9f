// The problem flags shared by plan, traffic, explain and bench (docs/api.md): shape, dtype, masking,
// and the hardware to plan for.
#pragma once

#include <string>
#include <vector>

#include "common/hardware.h"
#include "common/problem.h"
#include "tools/args.h"

namespace ioattn::cli {

struct ProblemRequest {
  Problem problem;
  float scale = 0.f;                      // <= 0: 1/sqrt(D)
  float softcap = 0.f;                    // 0: off
  std::vector<HardwareProfile> hardware;  // command-line order; the detected host when none given
};

// Declares --batch ... --softcap, and --hw/--hw-file when with_hardware.
void add_problem_flags(Args& a, bool with_hardware);

// Validates every flag (ranges, GQA divisibility, window syntax, profile names and files).
ProblemRequest read_problem_flags(const Args& a, bool with_hardware);

// "B=1 Hq=16 Hkv=16 Sq=4096 Sk=4096 D=128 f32 causal window=(-1,0)"
std::string describe(const Problem& pr);

// Binary-prefixed size, e.g. "1.50 MiB", for the human-readable tables.
std::string human_bytes(double bytes);

}  // namespace ioattn::cli
