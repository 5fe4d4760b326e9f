#include "tools/npy.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

namespace ioattn::cli {

static_assert(std::endian::native == std::endian::little,
              "the .npy reader hands '<f4'/'<f2' bytes to the kernels unswapped");

namespace {

constexpr unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

// A recursive-descent reader for the subset of Python literal syntax NumPy writes into a header:
// a dict of string keys to strings, True/False and tuples of non-negative integers.
class DictParser {
 public:
  DictParser(const char* text, size_t size) : p_(text), end_(text + size) {}

  bool parse(NpyHeader* h, std::string* error) {
    bool have_descr = false, have_order = false, have_shape = false;
    skip_ws();
    if (!eat('{')) return fail(error, "header is not a dict (expected '{')");
    skip_ws();
    while (!at('}')) {
      std::string key;
      if (!string_literal(&key)) return fail(error, "header dict: expected a quoted key");
      skip_ws();
      if (!eat(':')) return fail(error, "header dict: expected ':' after key '" + key + "'");
      skip_ws();
      if (key == "descr") {
        if (have_descr) return fail(error, "header dict: duplicate key 'descr'");
        have_descr = true;
        std::string descr;
        if (!string_literal(&descr))
          return fail(error, "header 'descr' is not a string (structured dtypes are not supported)");
        if (!dtype_of(descr, &h->dtype, error)) return false;
      } else if (key == "fortran_order") {
        if (have_order) return fail(error, "header dict: duplicate key 'fortran_order'");
        have_order = true;
        bool fortran = false;
        if (word("True"))
          fortran = true;
        else if (!word("False"))
          return fail(error, "header 'fortran_order' is not True or False");
        if (fortran)
          return fail(error, "fortran_order=True is not supported (save a C-contiguous array: np.ascontiguousarray)");
      } else if (key == "shape") {
        if (have_shape) return fail(error, "header dict: duplicate key 'shape'");
        have_shape = true;
        if (!shape_tuple(&h->shape, error)) return false;
      } else {
        return fail(error, "header dict: unexpected key '" + key + "'");
      }
      skip_ws();
      if (eat(',')) {
        skip_ws();
        continue;
      }
      if (!at('}')) return fail(error, "header dict: expected ',' or '}'");
    }
    ++p_;
    // NumPy pads the dict with spaces and ends it with '\n'; anything else is not a header it wrote.
    for (; p_ < end_; ++p_)
      if (*p_ != ' ' && *p_ != '\n' && *p_ != '\t' && *p_ != '\r')
        return fail(error, "header: unexpected text after the dict");
    if (!have_descr) return fail(error, "header dict: missing key 'descr'");
    if (!have_order) return fail(error, "header dict: missing key 'fortran_order'");
    if (!have_shape) return fail(error, "header dict: missing key 'shape'");
    return true;
  }

 private:
  static bool fail(std::string* error, const std::string& m) {
    *error = m;
    return false;
  }
  bool at(char c) const { return p_ < end_ && *p_ == c; }
  bool eat(char c) {
    if (!at(c)) return false;
    ++p_;
    return true;
  }
  void skip_ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool word(const char* w) {
    const size_t n = std::strlen(w);
    if (size_t(end_ - p_) < n || std::memcmp(p_, w, n) != 0) return false;
    p_ += n;
    return true;
  }
  // Python string literal without escapes (NumPy never writes any in these keys and values).
  bool string_literal(std::string* out) {
    if (!at('\'') && !at('"')) return false;
    const char quote = *p_++;
    const char* begin = p_;
    while (p_ < end_ && *p_ != quote) {
      if (*p_ == '\\' || *p_ == '\n') return false;
      ++p_;
    }
    if (p_ >= end_) return false;
    out->assign(begin, p_);
    ++p_;
    return true;
  }
  bool shape_tuple(std::vector<int64_t>* shape, std::string* error) {
    shape->clear();
    if (!eat('(')) return fail(error, "header 'shape' is not a tuple");
    skip_ws();
    bool trailing_comma = false;
    while (!at(')')) {
      if (p_ >= end_ || *p_ < '0' || *p_ > '9') return fail(error, "header 'shape': expected a non-negative integer");
      int64_t v = 0;
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
        if (v > (std::numeric_limits<int64_t>::max() - 9) / 10)
          return fail(error, "header 'shape': dimension too large");
        v = v * 10 + (*p_++ - '0');
      }
      if (shape->size() >= 32) return fail(error, "header 'shape': more than 32 dimensions");
      shape->push_back(v);
      skip_ws();
      trailing_comma = eat(',');
      skip_ws();
      if (!trailing_comma && !at(')')) return fail(error, "header 'shape': expected ',' or ')'");
    }
    ++p_;
    // "(5)" is the integer 5 in Python, not a tuple; NumPy writes "(5,)".
    if (shape->size() == 1 && !trailing_comma) return fail(error, "header 'shape': a 1-tuple needs a trailing comma");
    return true;
  }
  static bool dtype_of(const std::string& descr, NpyDType* t, std::string* error) {
    if (descr == "<f4" || descr == "=f4")
      *t = NpyDType::f32;
    else if (descr == "<f2" || descr == "=f2")
      *t = NpyDType::f16;
    else if (descr == ">f4" || descr == ">f2")
      return fail(error, "big-endian dtype '" + descr + "' is not supported (convert with arr.astype('<" +
                             descr.substr(1) + "'))");
    else
      return fail(error, "dtype '" + descr + "' is not supported (expected float32 '<f4' or float16 '<f2')");
    return true;
  }

  const char* p_;
  const char* end_;
};

}  // namespace

int64_t NpyArray::count() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool parse_npy_header(const unsigned char* bytes, size_t size, NpyHeader* h, std::string* error) {
  if (size < 10) {
    *error = size < 6 || std::memcmp(bytes, kMagic, 6) != 0 ? "not a .npy file (too short for the magic string)"
                                                            : "truncated .npy preamble";
    return false;
  }
  if (std::memcmp(bytes, kMagic, 6) != 0) {
    *error = "not a .npy file (bad magic string)";
    return false;
  }
  const int major = bytes[6], minor = bytes[7];
  if (major < 1 || major > 3 || minor != 0) {
    *error = "unsupported .npy version " + std::to_string(major) + "." + std::to_string(minor) +
             " (expected 1.0, 2.0 or 3.0)";
    return false;
  }
  size_t header_len = 0, prefix = 0;
  if (major == 1) {
    header_len = size_t(bytes[8]) | size_t(bytes[9]) << 8;
    prefix = 10;
  } else {
    if (size < 12) {
      *error = "truncated .npy preamble";
      return false;
    }
    header_len = size_t(bytes[8]) | size_t(bytes[9]) << 8 | size_t(bytes[10]) << 16 | size_t(bytes[11]) << 24;
    prefix = 12;
  }
  if (header_len > kNpyMaxHeaderBytes) {
    *error = "header length " + std::to_string(header_len) + " exceeds the " + std::to_string(kNpyMaxHeaderBytes) +
             "-byte limit";
    return false;
  }
  if (size - prefix < header_len) {
    *error = "truncated header: " + std::to_string(header_len) + " bytes declared, " + std::to_string(size - prefix) +
             " present";
    return false;
  }
  const char* text = reinterpret_cast<const char*>(bytes + prefix);
  for (size_t i = 0; i < header_len; ++i) {
    // Version 1/2 headers are latin-1 and 3 is UTF-8, but a dict of our keys is plain ASCII.
    if (static_cast<unsigned char>(text[i]) >= 0x80 || text[i] == '\0') {
      *error = "header contains a non-ASCII or NUL byte at offset " + std::to_string(prefix + i);
      return false;
    }
  }
  NpyHeader parsed;
  if (!DictParser(text, header_len).parse(&parsed, error)) return false;
  size_t elems = 1;
  for (int64_t d : parsed.shape) {
    if (__builtin_mul_overflow(elems, size_t(d), &elems)) {
      *error = "header 'shape': element count overflows";
      return false;
    }
  }
  if (__builtin_mul_overflow(elems, npy_itemsize(parsed.dtype), &parsed.data_bytes)) {
    *error = "header 'shape': byte count overflows";
    return false;
  }
  parsed.data_offset = prefix + header_len;
  *h = std::move(parsed);
  return true;
}

namespace {
bool check_data_size(const NpyHeader& h, size_t available, std::string* error) {
  if (available < h.data_bytes) {
    *error =
        "truncated data: shape needs " + std::to_string(h.data_bytes) + " bytes, file has " + std::to_string(available);
    return false;
  }
  if (available > h.data_bytes) {
    *error = std::to_string(available - h.data_bytes) + " unexpected trailing bytes after the " +
             std::to_string(h.data_bytes) + " data bytes";
    return false;
  }
  return true;
}
}  // namespace

bool parse_npy(const unsigned char* bytes, size_t size, NpyArray* out, std::string* error) {
  NpyHeader h;
  if (!parse_npy_header(bytes, size, &h, error)) return false;
  if (!check_data_size(h, size - h.data_offset, error)) return false;
  out->dtype = h.dtype;
  out->shape = h.shape;
  out->data.assign(bytes + h.data_offset, bytes + h.data_offset + h.data_bytes);
  return true;
}

bool read_npy(const std::string& path, NpyArray* out, std::string* error) {
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    *error = std::strerror(errno);
    return false;
  }
  // The file length bounds every allocation below: a header cannot make us reserve more than
  // the file holds.
  if (std::fseek(f.get(), 0, SEEK_END) != 0) {
    *error = "cannot seek (not a regular file?)";
    return false;
  }
  const long end = std::ftell(f.get());
  if (end < 0 || std::fseek(f.get(), 0, SEEK_SET) != 0) {
    *error = "cannot determine the file size (not a regular file?)";
    return false;
  }
  const size_t file_size = size_t(end);
  std::vector<unsigned char> head(std::min(file_size, 12 + kNpyMaxHeaderBytes));
  if (std::fread(head.data(), 1, head.size(), f.get()) != head.size()) {
    *error = "read error";
    return false;
  }
  NpyHeader h;
  if (!parse_npy_header(head.data(), head.size(), &h, error)) return false;
  if (!check_data_size(h, file_size - h.data_offset, error)) return false;
  out->dtype = h.dtype;
  out->shape = h.shape;
  out->data.resize(h.data_bytes);
  if (std::fseek(f.get(), long(h.data_offset), SEEK_SET) != 0 ||
      std::fread(out->data.data(), 1, h.data_bytes, f.get()) != h.data_bytes) {
    *error = "read error in the data section";
    return false;
  }
  return true;
}

std::string npy_header_bytes(NpyDType dtype, const std::vector<int64_t>& shape) {
  std::string dict = std::string("{'descr': '") + npy_descr(dtype) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]);
    if (i + 1 < shape.size() || shape.size() == 1) dict += ",";
    if (i + 1 < shape.size()) dict += " ";
  }
  dict += "), }";
  // Data aligned to 64 bytes (NumPy's choice, so memory-mapped data is aligned for any SIMD).
  const size_t v1_total = (10 + dict.size() + 1 + 63) / 64 * 64;
  const bool v1 = v1_total - 10 <= 65535;  // the 1.0 header length is a uint16
  const size_t prefix = v1 ? 10 : 12;
  const size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';
  std::string out(reinterpret_cast<const char*>(kMagic), 6);
  out += char(v1 ? 1 : 2);
  out += char(0);
  const size_t len = dict.size();
  out += char(len & 0xff);
  out += char((len >> 8) & 0xff);
  if (!v1) {
    out += char((len >> 16) & 0xff);
    out += char((len >> 24) & 0xff);
  }
  return out + dict;
}

bool write_npy(const std::string& path, NpyDType dtype, const std::vector<int64_t>& shape, const void* data,
               std::string* error) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    *error = std::strerror(errno);
    return false;
  }
  size_t count = 1;
  for (int64_t d : shape) count *= size_t(d);
  const std::string header = npy_header_bytes(dtype, shape);
  const size_t bytes = count * npy_itemsize(dtype);
  const bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
                  (bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes);
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    *error = "write error";
    return false;
  }
  return true;
}

}  // namespace ioattn::cli
