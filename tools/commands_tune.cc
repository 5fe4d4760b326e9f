// tune: calibrate the CPU backend's plans on this machine (ioattn_tune) and show what was kept.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "common/calibration.h"
#include "ioattn/ioattn.h"
#include "tools/args.h"
#include "tools/cli.h"

namespace ioattn::cli {
namespace {

// One line per timed call on stderr, rewritten in place on a terminal.
void progress(int32_t done, int32_t total, const char* what, void* user) {
  const bool tty = *static_cast<bool*>(user);
  std::fprintf(stderr, tty ? "\r[%3d/%3d] %-48s" : "[%d/%d] %s\n", done, total, what);
  if (tty && done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

std::string results_text(const Calibration& c, const std::string& path) {
  std::ostringstream os;
  char line[256];
  os << "calibration file " << path << "\n"
     << c.key.cpu_model << ", " << c.key.simd_target << ", " << c.key.cores << " cores; timed with " << c.threads
     << " threads\n\n";
  std::snprintf(line, sizeof line, "%-12s %-28s %12s %12s %7s\n", "prefill", "chosen", "planned ms", "chosen ms",
                "gain");
  os << line;
  for (const PrefillCalibration& e : c.prefill) {
    char chosen[64];
    std::snprintf(chosen, sizeof chosen, "block_q x%g, block_kv x%g", e.block_q_factor, e.block_kv_factor);
    std::snprintf(line, sizeof line, "D=%-10d %-28s %12.2f %12.2f %6.2fx\n", e.head_dim, chosen, e.planned_ms,
                  e.best_ms, e.planned_ms / e.best_ms);
    os << line;
  }
  std::snprintf(line, sizeof line, "\n%-12s %-28s %12s %12s %7s\n", "decode", "chosen", "planned GB/s", "chosen GB/s",
                "gain");
  os << line;
  for (const DecodeCalibration& e : c.decode) {
    char chosen[64];
    std::snprintf(chosen, sizeof chosen, "prefetch %d, splits x%d", e.prefetch_blocks, e.split_factor);
    std::snprintf(line, sizeof line, "%-12s %-28s %12.1f %12.1f %6.2fx\n", dtype_name(e.kv_dtype), chosen,
                  e.planned_gbs, e.best_gbs, e.planned_ms / e.best_ms);
    os << line;
  }
  return os.str();
}

}  // namespace

int cmd_tune(int argc, char** argv) {
  Args args("tune");
  args.option("--tune-file", "F.json", "where to write (default: ioattn_tune_path(); IOATTN_TUNE_FILE overrides it)");
  args.option("--threads", "N", "threads to time with (default: the library's, IOATTN_NUM_THREADS or all cores)");
  args.flag("--quick", "tiny problems, seconds: a smoke test of the run, not a calibration to keep");
  args.flag("--json", "print the calibration file's JSON instead of the table");
  if (!args.parse(argc, argv)) {
    std::cout << args.help("[--tune-file F.json] [--threads N] [--quick] [--json]",
                           "Times plan candidates around the cache-derived plan on this machine (prefill\n"
                           "block sizes at D = 64 and 128; decode prefetch distance and key splits for\n"
                           "f16, bf16 and f32 caches) and writes the winners to a per-machine file that\n"
                           "every later call on this machine applies. Under a minute on 2 cores; progress\n"
                           "goes to stderr. A candidate replaces the cache-derived plan only when it is\n"
                           "at least 3% faster.");
    return kExitOk;
  }
  ioattn_tune_options opt;
  ioattn_tune_options_default(&opt);
  const std::string path = args.value("--tune-file").value_or(ioattn_tune_path());
  if (path.empty())
    throw usage_error("no calibration file location (IOATTN_TUNE_FILE is empty, or HOME is unset): pass --tune-file");
  opt.path = path.c_str();
  opt.num_threads = int(int_option(args, "--threads", 0, 1, 4096));
  opt.quick = args.has("--quick") ? 1 : 0;
  bool tty = isatty(STDERR_FILENO) != 0;
  opt.progress = progress;
  opt.user = &tty;
  if (const ioattn_status s = ioattn_tune(&opt); s != IOATTN_OK) throw_status("ioattn_tune", s);

  // What was written, read back as every later call will read it.
  Calibration c;
  std::string error;
  std::ifstream f(path);
  std::ostringstream text;
  text << f.rdbuf();
  if (!parse_calibration_json(text.str(), path, &c, &error)) throw internal_error("reading back: " + error);
  std::cout << (args.has("--json") ? text.str() : results_text(c, path));
  return kExitOk;
}

}  // namespace ioattn::cli
