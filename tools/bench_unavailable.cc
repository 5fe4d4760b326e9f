// `ioattn bench` in a build without the benchmarks (IOATTN_BUILD_BENCH=OFF): the command stays in
// the table and says so instead of measuring. The real one is bench/cli/commands_bench.cc.
#include "tools/cli.h"

namespace ioattn::cli {

int cmd_bench(int, char**) {
  throw unsupported_error("this build has no benchmarks (configure with -DIOATTN_BUILD_BENCH=ON)");
}

}  // namespace ioattn::cli
