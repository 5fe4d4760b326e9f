// Shared by the outsider sweeps (test_contract_sweep.cc, test_contract_cli.cc): run the ioattn
// binary named by IOATTN_CLI and look at what it left in a scratch directory. Only the C++
// standard library and POSIX, so the sweeps stay independent of the project's own test helpers.
#pragma once

#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/catch.h"

namespace ioattn::contract {

// IEEE binary16 for the sweeps' own f16 encoding. GCC accepts _Float16 in C++ on AArch64 only
// from version 13; __fp16 is the same format there, converting with nearest-even rounding.
#if defined(__aarch64__)
using Half = __fp16;
#else
using Half = _Float16;
#endif

inline uint16_t f16_bits(float x) {
  const Half h = static_cast<Half>(x);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
inline float f16_value(uint16_t b) {
  Half h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}

struct CliResult {
  int code = -1;
  std::string out, err;
};

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// A NumPy .npy file as the CLI wrote it: its dtype string, shape and raw data.
struct Npy {
  std::string descr;
  std::vector<int64_t> shape;
  std::string data;
};

// Version 1 has a 2-byte header length at offset 8, later versions 4 bytes.
inline Npy read_npy(const std::string& path) {
  const std::string f = read_file(path);
  REQUIRE(f.size() >= 10);
  REQUIRE(f.compare(0, 6, "\x93NUMPY") == 0);
  const size_t start = f[6] == 1 ? 10 : 12;
  size_t len = 0;
  for (size_t i = 8; i < start; ++i) len |= size_t(uint8_t(f[i])) << (8 * (i - 8));
  const std::string header = f.substr(start, len);
  Npy n;
  const size_t d = header.find("'descr'");
  REQUIRE(d != std::string::npos);
  const size_t q1 = header.find('\'', header.find(':', d) + 1);
  n.descr = header.substr(q1 + 1, header.find('\'', q1 + 1) - q1 - 1);
  const size_t open = header.find('(', header.find("'shape'")), close = header.find(')', open);
  std::istringstream dims(header.substr(open + 1, close - open - 1));
  for (std::string tok; std::getline(dims, tok, ',');)
    if (tok.find_first_of("0123456789") != std::string::npos) n.shape.push_back(std::stoll(tok));
  n.data = f.substr(start + len);
  return n;
}

// A fresh directory under TMPDIR, removed with its contents at scope exit.
class Scratch {
 public:
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp ? tmp : "/tmp") + "/ioattn_contract_XXXXXX";
    REQUIRE(::mkdtemp(templ.data()) != nullptr);
    dir_ = templ;
  }
  ~Scratch() {
    const std::string cmd = "rm -rf '" + dir_ + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", dir_.c_str());
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  std::string operator/(const std::string& name) const { return dir_ + "/" + name; }
  std::string name() const { return dir_.substr(dir_.rfind('/') + 1); }
  // Names in the directory, sorted.
  std::vector<std::string> listing() const {
    const std::string list = dir_ + ".list";
    const std::string cmd = "ls -A '" + dir_ + "' > '" + list + "'";
    std::vector<std::string> names;
    if (std::system(cmd.c_str()) != 0) return names;
    std::istringstream in(read_file(list));
    for (std::string n; std::getline(in, n);) names.push_back(n);
    std::remove(list.c_str());
    return names;
  }

 private:
  std::string dir_;
};

// Runs `ioattn args...` with stdout and stderr captured into `capture` (removed again after
// reading, so a test can list that directory for files a failure should not have created).
inline CliResult run_cli(const Scratch& capture, const std::vector<std::string>& args) {
  const char* exe = std::getenv("IOATTN_CLI");
  REQUIRE(exe != nullptr);
  std::string cmd = std::string("'") + exe + "'";
  for (const std::string& a : args) cmd += " '" + a + "'";
  const std::string out = capture / ".stdout", err = capture / ".stderr";
  cmd += " > '" + out + "' 2> '" + err + "'";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

}  // namespace ioattn::contract
