// Shared pieces of the `ioattn` command line: the error type that carries the contract's exit
// code, and the subcommands' entry points.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "ioattn/ioattn.h"

namespace ioattn::cli {

// Exit codes from docs/api.md.
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnsupported = 3;

// Thrown anywhere below a subcommand; main prints "ioattn <command>: <message>" on one line and
// exits with `code`. The CLI is a program, not the library: exceptions stop at main.
class CliError : public std::runtime_error {
 public:
  CliError(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

inline CliError usage_error(const std::string& message) { return CliError(kExitUsage, message); }
inline CliError unsupported_error(const std::string& message) { return CliError(kExitUnsupported, message); }
inline CliError internal_error(const std::string& message) { return CliError(kExitInternal, message); }

// A failed library call (`entry`, e.g. "ioattn_forward") as the contract's exit code: bad input
// 2, unsupported 3, anything else 1, with the library's message.
[[noreturn]] void throw_status(const char* entry, ioattn_status s);

// A user-supplied string quoted for a one-line message: non-printable bytes become \xNN and the
// text is cut at 200 bytes, so a hostile argument cannot spread a message over lines.
std::string quoted(const std::string& text);

// Each subcommand gets the arguments after its name and returns an exit code.
int cmd_demo(int argc, char** argv);
int cmd_run(int argc, char** argv);
int cmd_plan(int argc, char** argv);
int cmd_traffic(int argc, char** argv);
int cmd_explain(int argc, char** argv);
int cmd_hw(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_tune(int argc, char** argv);

// plan, traffic, explain or hw with `args` and --json: the JSON text `ioattn <command> <args> --json`
// prints, without its final newline (the Python package's ioattn.plan() and friends). Throws
// CliError as the command would; --help is a usage error here.
std::string model_json(const std::string& command, const std::vector<std::string>& args);

}  // namespace ioattn::cli
