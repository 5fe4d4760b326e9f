// A strict reader and writer for NumPy's .npy format (versions 1.0, 2.0 and 3.0), limited to what
// `ioattn run` exchanges: little-endian float32 and float16 arrays in C order. Everything else
// (big-endian, Fortran order, other dtypes, malformed or oversized headers, truncated or padded
// data) is rejected with a message that says what was found. The parser never trusts a size in
// the file before checking it against the bytes actually present.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ioattn::cli {

enum class NpyDType { f32, f16 };

constexpr size_t npy_itemsize(NpyDType t) { return t == NpyDType::f32 ? 4 : 2; }
constexpr const char* npy_descr(NpyDType t) { return t == NpyDType::f32 ? "<f4" : "<f2"; }

struct NpyHeader {
  NpyDType dtype = NpyDType::f32;
  std::vector<int64_t> shape;
  size_t data_offset = 0;  // bytes before the array data (magic + version + length + dict)
  size_t data_bytes = 0;   // product(shape) * itemsize, overflow-checked
};

struct NpyArray {
  NpyDType dtype = NpyDType::f32;
  std::vector<int64_t> shape;
  std::vector<unsigned char> data;  // raw little-endian elements, C order
  int64_t count() const;
};

// Headers longer than this are refused before anything is allocated for them; a 4-D float
// array needs about 120 bytes, and NumPy's own loader refuses over 10000 by default.
inline constexpr size_t kNpyMaxHeaderBytes = 65536;

// Parses the preamble and header dict from the first `size` bytes of a file. On success fills
// *h (data_offset within those bytes). False and *error when malformed or when `size` is too
// short to hold the whole header.
bool parse_npy_header(const unsigned char* bytes, size_t size, NpyHeader* h, std::string* error);

// A whole .npy image in memory: header, then exactly data_bytes of data (no more, no less).
bool parse_npy(const unsigned char* bytes, size_t size, NpyArray* out, std::string* error);

// Reads a file; *error names the problem but not the path (the caller adds the flag and path).
bool read_npy(const std::string& path, NpyArray* out, std::string* error);

// The bytes of a version-1.0 header (version 2.0 when the dict needs more than 65535 bytes),
// padded so the data starts on a 64-byte boundary as NumPy writes it.
std::string npy_header_bytes(NpyDType dtype, const std::vector<int64_t>& shape);

// Writes header and data to `path` directly (not atomically; the CLI stages its outputs).
bool write_npy(const std::string& path, NpyDType dtype, const std::vector<int64_t>& shape, const void* data,
               std::string* error);

}  // namespace ioattn::cli
