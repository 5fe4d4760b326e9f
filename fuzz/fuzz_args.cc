// libFuzzer entry over the CLI's argument handling: the input is split at NUL bytes into argv, then
// parsed with the problem flags shared by plan/traffic/explain/bench. A usage error (CliError) is
// the expected way to refuse; any other exception escaping, a crash, or an accepted problem that
// breaks the documented ranges is a finding.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tools/args.h"
#include "tools/cli.h"
#include "tools/problem_flags.h"

namespace {
[[noreturn]] void violated(const std::string& what) {
  std::fprintf(stderr, "fuzz_args: %s\n", what.c_str());
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t kMaxArgs = 64;
  std::vector<std::string> tokens;
  if (size > 0) tokens.emplace_back();
  for (size_t i = 0; i < size && tokens.size() <= kMaxArgs; ++i) {
    if (data[i] == 0)
      tokens.emplace_back();
    else
      tokens.back() += char(data[i]);
  }
  std::vector<char*> argv;
  for (std::string& t : tokens) argv.push_back(t.data());

  ioattn::cli::Args args("plan");
  ioattn::cli::add_problem_flags(args, true);
  args.flag("--json", "machine-readable output");
  try {
    if (!args.parse(int(argv.size()), argv.data())) return 0;
    // Profile files would make the fuzzer read arbitrary paths; built-in names are exercised,
    // and "host" (the detected machine) only when asked for by name.
    if (args.has("--hw-file")) return 0;
    const ioattn::cli::ProblemRequest r = ioattn::cli::read_problem_flags(args, args.has("--hw"));
    const ioattn::Problem& p = r.problem;
    if (p.batch < 1 || p.heads_q < 1 || p.heads_kv < 1 || p.heads_q % p.heads_kv != 0 || p.seqlen_q < 1 ||
        p.seqlen_k < 1 || p.head_dim < 1 || p.head_dim_v < 1 || p.window_left < -1 || p.window_right < -1 ||
        !(r.softcap >= 0))
      violated("accepted an out-of-range problem: " + ioattn::cli::describe(p));
    if (ioattn::cli::describe(p).find('\n') != std::string::npos) violated("describe() spans lines");
  } catch (const ioattn::cli::CliError& e) {
    // main() folds the message onto one line, so only an empty one would fail the contract.
    if (std::string(e.what()).empty()) violated("usage error without a message");
    if (e.code() != ioattn::cli::kExitUsage && e.code() != ioattn::cli::kExitInternal)
      violated("unexpected exit code " + std::to_string(e.code()));
  }
  return 0;
}
