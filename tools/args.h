// A strict flag parser: every flag is declared, unknown flags, missing values, stray positional
// arguments and repeats of single-valued flags are usage errors (exit 2) naming the flag.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ioattn::cli {

class Args {
 public:
  explicit Args(std::string command) : command_(std::move(command)) {}

  // A boolean switch: present or not.
  void flag(const std::string& name, const std::string& help);
  // A flag with a value ("--name V" or "--name=V"); repeatable flags keep every value in order.
  void option(const std::string& name, const std::string& metavar, const std::string& help, bool repeatable = false);

  // Parses argv[0..argc). Returns false when --help/-h was given (the caller prints help()),
  // throws CliError(kExitUsage) on anything malformed.
  bool parse(int argc, char** argv);

  bool has(const std::string& name) const;
  std::optional<std::string> value(const std::string& name) const;
  std::vector<std::string> values(const std::string& name) const;
  // Every (flag, value) given, in command-line order: how --hw and --hw-file interleave.
  const std::vector<std::pair<std::string, std::string>>& given() const { return given_; }

  // The --help text: synopsis, description, then one line per declared flag.
  std::string help(const std::string& synopsis, const std::string& description) const;

  const std::string& command() const { return command_; }

 private:
  struct Spec {
    std::string name, metavar, help;
    bool takes_value = false, repeatable = false;
  };
  const Spec* find(const std::string& name) const;

  std::string command_;
  std::vector<Spec> specs_;
  std::vector<std::pair<std::string, std::string>> given_;
};

// Typed, range-checked values. Each throws CliError(kExitUsage) with a message such as
// "--head-dim: expected a positive integer, got 'abc'" or "--heads: 0 is out of range [1, 65536]".
int64_t parse_int(const std::string& flag, const std::string& text, int64_t min, int64_t max);
double parse_double(const std::string& flag, const std::string& text, double min, double max);

int64_t int_option(const Args& a, const std::string& flag, int64_t fallback, int64_t min, int64_t max);
double double_option(const Args& a, const std::string& flag, double fallback, double min, double max);

// "--window L,R": two integers >= -1 (-1 = unbounded on that side).
std::pair<int64_t, int64_t> parse_window(const std::string& flag, const std::string& text);

}  // namespace ioattn::cli
