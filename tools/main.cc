// `ioattn`: the command line over the library (docs/api.md, "CLI"). Each subcommand lives in a
// commands_*.cc; this file dispatches and turns errors into the contract's exit codes.
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "ioattn/ioattn.h"
#include "tools/cli.h"

namespace {

struct Command {
  const char* name;
  int (*fn)(int, char**);
  const char* summary;
};

constexpr Command kCommands[] = {
    {"demo", ioattn::cli::cmd_demo, "detect, plan, run and check an embedded workload"},
    {"run", ioattn::cli::cmd_run, "attention over .npy inputs into .npy outputs"},
    {"plan", ioattn::cli::cmd_plan, "the tiling chosen for a problem on given hardware"},
    {"traffic", ioattn::cli::cmd_traffic, "predicted bytes per memory boundary, flash vs standard"},
    {"explain", ioattn::cli::cmd_explain, "the design outline of a plan, with its numbers"},
    {"hw", ioattn::cli::cmd_hw, "built-in hardware profiles and the detected host"},
    {"bench", ioattn::cli::cmd_bench, "flash vs standard attention, measured at one shape"},
    {"tune", ioattn::cli::cmd_tune, "calibrate the CPU plans on this machine (a per-machine file)"},
};

void print_usage(std::FILE* to) {
  std::fprintf(to, "usage: ioattn <command> [flags]   (ioattn <command> --help for its flags)\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(to, "  %-9s %s\n", c.name, c.summary);
  std::fprintf(to, "\nexit codes: 0 ok, 1 internal error, 2 bad usage or input, 3 unsupported on this build\n");
}

// One line on stderr, whatever the message holds.
void report(const std::string& command, const std::string& message) {
  std::string line = "ioattn" + (command.empty() ? "" : " " + command) + ": " + message;
  for (char& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ioattn::cli;
  if (argc < 2) {
    print_usage(stderr);
    return kExitUsage;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    print_usage(stdout);
    return kExitOk;
  }
  if (name == "--version") {
    std::printf("ioattn %s\n", ioattn_version());
    return kExitOk;
  }
  for (const Command& c : kCommands) {
    if (name != c.name) continue;
    try {
      const int rc = c.fn(argc - 2, argv + 2);
      std::cout.flush();
      if (!std::cout) {
        report(name, "error writing to standard output");
        return kExitInternal;
      }
      return rc;
    } catch (const CliError& e) {
      report(name, e.what());
      return e.code();
    } catch (const std::bad_alloc&) {
      report(name, "out of memory");
      return kExitInternal;
    } catch (const std::exception& e) {
      report(name, std::string("internal error: ") + e.what());
      return kExitInternal;
    }
  }
  report("", "unknown command " + quoted(name) + " (see ioattn --help)");
  return kExitUsage;
}
