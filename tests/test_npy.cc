// The .npy reader and writer of the CLI: byte-exact headers as NumPy writes them, round trips,
// and rejection (never a crash, never an over-read) of every malformed input we can think of
// plus every truncation and single-byte corruption of a valid file.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/catch.h"
#include "tools/npy.h"

using namespace ioattn::cli;

namespace {

std::vector<unsigned char> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

// A version-1.0 file around an arbitrary header dict, padded as NumPy pads (to 64 bytes).
std::string v1_file(const std::string& dict, size_t data_bytes, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  const size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(major);
  out += char(0);
  const size_t n = header.size();
  out += char(n & 0xff);
  out += char(n >> 8 & 0xff);
  if (major != 1) {
    out += char(n >> 16 & 0xff);
    out += char(n >> 24 & 0xff);
  }
  return out + header + std::string(data_bytes, '\x01');
}

std::string parse_error(const std::string& file) {
  NpyArray a;
  std::string error;
  const auto b = bytes_of(file);
  if (parse_npy(b.data(), b.size(), &a, &error)) return "";
  CHECK(!error.empty());
  return error;
}

const std::string kGoodDict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";

std::string temp_path(const char* name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/ioattn_test_npy_" + std::to_string(::getpid()) + "_" + name;
}

}  // namespace

TEST_CASE("npy header bytes match NumPy's layout", "[npy]") {
  // np.save of a (2, 3) float32 array: 10-byte preamble, length 118 ('v'), dict, spaces, '\n'.
  const std::string h = npy_header_bytes(NpyDType::f32, {2, 3});
  REQUIRE(h.size() == 128);
  CHECK(h.substr(0, 10) == std::string("\x93NUMPY\x01\x00v\x00", 10));
  CHECK(h.substr(10, kGoodDict.size()) == kGoodDict);
  CHECK(h.back() == '\n');
  CHECK(h.find_first_not_of(' ', 10 + kGoodDict.size()) == h.size() - 1);
  // 1-tuples keep Python's trailing comma, 0-d arrays an empty tuple.
  CHECK(npy_header_bytes(NpyDType::f16, {5}).find("'descr': '<f2', 'fortran_order': False, 'shape': (5,), }") !=
        std::string::npos);
  CHECK(npy_header_bytes(NpyDType::f32, {}).find("'shape': (), }") != std::string::npos);
  for (const auto& shape : {std::vector<int64_t>{1}, {7, 1, 3, 9}, {123456789, 2, 3, 4, 5, 6, 7, 8}}) {
    CHECK(npy_header_bytes(NpyDType::f32, shape).size() % 64 == 0);
  }
}

TEST_CASE("npy round trip through a file, f32 and f16", "[npy]") {
  const std::string path = temp_path("roundtrip.npy");
  std::vector<float> f(2 * 3 * 4 * 5);
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(i) * 0.25f - 3.f;
  std::string error;
  REQUIRE(write_npy(path, NpyDType::f32, {2, 3, 4, 5}, f.data(), &error));
  NpyArray a;
  REQUIRE(read_npy(path, &a, &error));
  CHECK(a.dtype == NpyDType::f32);
  CHECK(a.shape == std::vector<int64_t>{2, 3, 4, 5});
  REQUIRE(a.data.size() == f.size() * 4);
  CHECK(std::memcmp(a.data.data(), f.data(), a.data.size()) == 0);

  std::vector<uint16_t> h = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000};
  REQUIRE(write_npy(path, NpyDType::f16, {5}, h.data(), &error));
  REQUIRE(read_npy(path, &a, &error));
  CHECK(a.dtype == NpyDType::f16);
  CHECK(a.shape == std::vector<int64_t>{5});
  CHECK(std::memcmp(a.data.data(), h.data(), 10) == 0);

  REQUIRE(write_npy(path, NpyDType::f32, {0, 3}, nullptr, &error));
  REQUIRE(read_npy(path, &a, &error));
  CHECK(a.shape == std::vector<int64_t>{0, 3});
  CHECK(a.data.empty());
  std::remove(path.c_str());

  CHECK_FALSE(read_npy(temp_path("does_not_exist.npy"), &a, &error));
  CHECK(error.find("No such file") != std::string::npos);
}

TEST_CASE("npy versions 2.0 and 3.0 and header spelling variants parse", "[npy]") {
  NpyArray a;
  std::string error;
  for (int major : {1, 2, 3}) {
    const auto b = bytes_of(v1_file(kGoodDict, 24, major));
    INFO("version " << major);
    REQUIRE(parse_npy(b.data(), b.size(), &a, &error));
    CHECK(a.shape == std::vector<int64_t>{2, 3});
  }
  // Key order, quotes, whitespace and the trailing comma are NumPy's choice, not the format's.
  const auto b = bytes_of(v1_file("{\"shape\":(2,3),\"fortran_order\":False,\"descr\":\"<f2\"}", 12));
  REQUIRE(parse_npy(b.data(), b.size(), &a, &error));
  CHECK(a.dtype == NpyDType::f16);
  CHECK(a.shape == std::vector<int64_t>{2, 3});
}

TEST_CASE("npy rejects malformed files with a message saying what is wrong", "[npy]") {
  const std::string good = v1_file(kGoodDict, 24);
  REQUIRE(parse_error(good).empty());

  CHECK(parse_error("").find("not a .npy file") != std::string::npos);
  CHECK(parse_error("\x93NUM").find("not a .npy file") != std::string::npos);
  CHECK(parse_error("PK\x03\x04 this is a zip file").find("bad magic") != std::string::npos);
  CHECK(parse_error(std::string("\x93NUMPY\x01\x00", 8)).find("truncated") != std::string::npos);
  std::string v = good;
  v[6] = 4;
  CHECK(parse_error(v).find("version 4.0") != std::string::npos);
  v = good;
  v[7] = 1;
  CHECK(parse_error(v).find("version 1.1") != std::string::npos);
  // Declared header longer than the file.
  CHECK(parse_error(good.substr(0, 60)).find("truncated header") != std::string::npos);
  // A version-2 header length of 4 GiB is refused before anything is allocated for it.
  CHECK(parse_error(std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff{}", 14)).find("limit") != std::string::npos);

  struct Case {
    std::string dict, expect;
  };
  const Case cases[] = {
      {"['descr', '<f4']", "not a dict"},
      {"{'descr': '<f4', 'fortran_order': False}", "missing key 'shape'"},
      {"{'shape': (2, 3), 'fortran_order': False}", "missing key 'descr'"},
      {"{'descr': '<f4', 'shape': (2, 3)}", "missing key 'fortran_order'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", "duplicate key 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'extra': 1}", "unexpected key 'extra'"},
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}", "fortran_order=True"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3)}", "not True or False"},
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3)}", "dtype '<f8' is not supported"},
      {"{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3)}", "dtype '|u1' is not supported"},
      {"{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3)}", "big-endian"},
      {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", "structured"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3]}", "not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3)}", "non-negative integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2.0, 3)}", "expected ',' or ')'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6)}", "trailing comma"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", "too large"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296)}", "overflows"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} junk", "after the dict"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3)}", "dtype '<f4, ' is not supported"},
      {"{'descr' '<f4', 'fortran_order': False, 'shape': (2, 3)}", "expected ':' after key 'descr'"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3)}", "expected ',' or '}'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", "expected ',' or '}'"},
      {"{'descr': '<f4', 'fortran_order': False, 3: (2, 3)}", "expected a quoted key"},
      {std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}") + '\0', "NUL"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), '\xc3\xa9': 1}", "non-ASCII"},
  };
  for (const Case& c : cases) {
    INFO(c.dict);
    CHECK(parse_error(v1_file(c.dict, 24)).find(c.expect) != std::string::npos);
  }
  // Data shorter or longer than the shape says.
  CHECK(parse_error(v1_file(kGoodDict, 23)).find("truncated data: shape needs 24 bytes, file has 23") !=
        std::string::npos);
  CHECK(parse_error(v1_file(kGoodDict, 25)).find("1 unexpected trailing bytes") != std::string::npos);
}

TEST_CASE("npy: every truncation and every single-byte corruption of a header is handled", "[npy]") {
  const std::string good = v1_file("{'descr': '<f2', 'fortran_order': False, 'shape': (1, 2, 3, 1), }", 12);
  NpyArray a;
  std::string error;
  for (size_t n = 0; n < good.size(); ++n) {
    // Exact-size buffers: under ASan any read past the prefix is reported.
    std::vector<unsigned char> b(good.begin(), good.begin() + long(n));
    INFO("prefix " << n);
    CHECK_FALSE(parse_npy(b.data(), b.size(), &a, &error));
  }
  const size_t header_end = good.size() - 12;
  for (size_t i = 0; i < header_end; ++i) {
    for (int value : {0x00, 0x0a, 0x20, int('\''), int('('), int(')'), int(','), int('9'), 0x7f, 0xff}) {
      std::vector<unsigned char> b(good.begin(), good.end());
      b[i] = static_cast<unsigned char>(value);
      error.clear();
      if (parse_npy(b.data(), b.size(), &a, &error)) {
        // A corruption that still parses must describe exactly the bytes present.
        CHECK(a.data.size() == size_t(a.count()) * npy_itemsize(a.dtype));
      } else {
        CHECK(!error.empty());
      }
    }
  }
}
