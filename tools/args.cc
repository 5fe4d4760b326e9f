#include "tools/args.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "tools/cli.h"

namespace ioattn::cli {

std::string quoted(const std::string& text) {
  constexpr size_t kMaxShown = 200;
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (text.size() > kMaxShown) out += "...";
  return out + "'";
}

void Args::flag(const std::string& name, const std::string& help) { specs_.push_back({name, "", help, false, false}); }

void Args::option(const std::string& name, const std::string& metavar, const std::string& help, bool repeatable) {
  specs_.push_back({name, metavar, help, true, repeatable});
}

const Args::Spec* Args::find(const std::string& name) const {
  for (const Spec& s : specs_)
    if (s.name == name) return &s;
  return nullptr;
}

bool Args::parse(int argc, char** argv) {
  // --help wins over every other problem on the line, so a user can always ask what is accepted.
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return false;
    if (a == "--") break;
  }
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      throw usage_error("unexpected argument " + quoted(arg) + " (flags start with --; see --help)");
    }
    std::string name = arg;
    std::optional<std::string> inline_value;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
    }
    const Spec* spec = find(name);
    if (!spec) throw usage_error("unknown flag " + quoted(name) + " (see ioattn " + command_ + " --help)");
    if (!spec->repeatable && has(name)) throw usage_error(name + ": given more than once");
    if (!spec->takes_value) {
      if (inline_value) throw usage_error(name + ": takes no value, got " + quoted(*inline_value));
      given_.emplace_back(name, "");
      continue;
    }
    if (inline_value) {
      given_.emplace_back(name, *inline_value);
      continue;
    }
    // A following "--flag" is taken as the next flag, not as this one's value, so a forgotten
    // value is reported as missing rather than silently swallowing the next flag. Negative
    // numbers ("-1") do not start with "--" and stay usable as values.
    if (i + 1 >= argc || std::string(argv[i + 1]).compare(0, 2, "--") == 0) {
      throw usage_error(name + ": missing value (" + spec->metavar + ")");
    }
    given_.emplace_back(name, argv[++i]);
  }
  return true;
}

bool Args::has(const std::string& name) const {
  for (const auto& g : given_)
    if (g.first == name) return true;
  return false;
}

std::optional<std::string> Args::value(const std::string& name) const {
  for (const auto& g : given_)
    if (g.first == name) return g.second;
  return std::nullopt;
}

std::vector<std::string> Args::values(const std::string& name) const {
  std::vector<std::string> out;
  for (const auto& g : given_)
    if (g.first == name) out.push_back(g.second);
  return out;
}

std::string Args::help(const std::string& synopsis, const std::string& description) const {
  std::ostringstream os;
  os << "usage: ioattn " << command_ << " " << synopsis << "\n\n" << description << "\n";
  if (!specs_.empty()) os << "\nflags:\n";
  for (const Spec& s : specs_) {
    std::string left = "  " + s.name + (s.takes_value ? " " + s.metavar : "");
    if (left.size() < 24)
      left.resize(24, ' ');
    else
      left += "\n" + std::string(24, ' ');
    os << left << s.help << (s.repeatable ? " (repeatable)" : "") << "\n";
  }
  os << "  --help, -h            this text\n";
  os << "\nexit codes: 0 ok, 1 internal error, 2 bad usage or input, 3 unsupported on this build\n";
  return os.str();
}

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  const std::string kind = min >= 1 ? "a positive integer" : min == 0 ? "a non-negative integer" : "an integer";
  if (text.empty() || ptr != end || ec == std::errc::invalid_argument) {
    throw usage_error(flag + ": expected " + kind + ", got " + quoted(text));
  }
  if (ec == std::errc::result_out_of_range || v < min || v > max) {
    throw usage_error(flag + ": " + quoted(text) + " is out of range [" + std::to_string(min) + ", " +
                      std::to_string(max) + "]");
  }
  return v;
}

double parse_double(const std::string& flag, const std::string& text, double min, double max) {
  double v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ptr != end || ec == std::errc::invalid_argument || !std::isfinite(v)) {
    throw usage_error(flag + ": expected a finite number, got " + quoted(text));
  }
  if (ec == std::errc::result_out_of_range || v < min || v > max) {
    std::ostringstream os;
    os << flag << ": " << quoted(text) << " is out of range [" << min << ", " << max << "]";
    throw usage_error(os.str());
  }
  return v;
}

int64_t int_option(const Args& a, const std::string& flag, int64_t fallback, int64_t min, int64_t max) {
  const auto v = a.value(flag);
  return v ? parse_int(flag, *v, min, max) : fallback;
}

double double_option(const Args& a, const std::string& flag, double fallback, double min, double max) {
  const auto v = a.value(flag);
  return v ? parse_double(flag, *v, min, max) : fallback;
}

std::pair<int64_t, int64_t> parse_window(const std::string& flag, const std::string& text) {
  const size_t comma = text.find(',');
  if (comma == std::string::npos) {
    throw usage_error(flag + ": expected L,R (two integers >= -1, -1 = unbounded), got " + quoted(text));
  }
  // int32 bounds: the C ABI carries window sizes as int32_t.
  constexpr int64_t kMax = 2147483647;
  return {parse_int(flag + " (left)", text.substr(0, comma), -1, kMax),
          parse_int(flag + " (right)", text.substr(comma + 1), -1, kMax)};
}

}  // namespace ioattn::cli
