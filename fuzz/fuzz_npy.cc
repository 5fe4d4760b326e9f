// libFuzzer entry over the CLI's .npy reader: the in-memory parser and the file reader must agree
// on every input (same verdict, same array), an accepted array must be exactly as large as its
// header says, and re-encoding its header must parse back to the same dtype and shape.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tools/npy.h"

namespace {

using ioattn::cli::NpyArray;

[[noreturn]] void violated(const std::string& what) {
  std::fprintf(stderr, "fuzz_npy: %s\n", what.c_str());
  std::abort();
}

// read_npy takes a path; an anonymous memory file gives it one without touching the disk.
const std::string& scratch_path() {
  static const std::string path = [] {
    const int fd = memfd_create("fuzz_npy", 0);
    if (fd < 0) violated("memfd_create failed");
    return "/proc/self/fd/" + std::to_string(fd);
  }();
  return path;
}

void write_scratch(const uint8_t* data, size_t size) {
  const int fd = std::stoi(scratch_path().substr(std::string("/proc/self/fd/").size()));
  if (ftruncate(fd, 0) != 0 || (size > 0 && pwrite(fd, data, size, 0) != ssize_t(size)))
    violated("cannot write the scratch file");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  NpyArray parsed, read;
  std::string parse_error, read_error;
  const bool parsed_ok = ioattn::cli::parse_npy(data, size, &parsed, &parse_error);
  write_scratch(data, size);
  const bool read_ok = ioattn::cli::read_npy(scratch_path(), &read, &read_error);
  if (parsed_ok != read_ok)
    violated("parse_npy " + std::string(parsed_ok ? "accepted" : "rejected (" + parse_error + ")") + " but read_npy " +
             (read_ok ? "accepted" : "rejected (" + read_error + ")"));
  if (!parsed_ok) {
    if (parse_error.empty() || read_error.empty()) violated("rejected without a message");
    return 0;
  }
  if (parsed.dtype != read.dtype || parsed.shape != read.shape || parsed.data != read.data)
    violated("parse_npy and read_npy returned different arrays");
  size_t count = 1;
  for (int64_t d : parsed.shape) count *= size_t(d);
  if (count * ioattn::cli::npy_itemsize(parsed.dtype) != parsed.data.size())
    violated("data size does not match the header's shape");
  const std::string header = ioattn::cli::npy_header_bytes(parsed.dtype, parsed.shape);
  if (header.size() % 64 != 0) violated("re-encoded header is not 64-byte aligned");
  ioattn::cli::NpyHeader h;
  std::string error;
  if (!ioattn::cli::parse_npy_header(reinterpret_cast<const unsigned char*>(header.data()), header.size(), &h, &error))
    violated("re-encoded header does not parse: " + error);
  if (h.dtype != parsed.dtype || h.shape != parsed.shape || h.data_offset != header.size())
    violated("re-encoded header parses to a different array");
  return 0;
}
