// Integer rounding the planner, the traffic model, the outline and the kernels share.
#pragma once

#include <cstdint>

namespace ioattn {

// a / b rounded up, for a >= 0 and b > 0.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// a rounded up to a whole multiple of m > 0.
constexpr int64_t round_up(int64_t a, int64_t m) { return ceil_div(a, m) * m; }

}  // namespace ioattn
