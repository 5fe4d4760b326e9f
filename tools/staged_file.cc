#include "tools/staged_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tools/cli.h"

namespace ioattn::cli {

StagedFile::StagedFile(std::string flag, std::string path) : flag_(std::move(flag)), path_(std::move(path)) {
  if (path_.empty()) throw usage_error(flag_ + ": empty path");
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw usage_error(flag_ + " " + quoted(path_) + ": is a directory");
  }
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash);
  const std::string base = slash == std::string::npos ? path_ : path_.substr(slash + 1);
  // A dot-prefixed name keeps the temporary out of casual listings while it is being written.
  std::string templ = dir + "/." + base + ".ioattn-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  fd_ = ::mkstemp(buf.data());
  if (fd_ < 0) {
    throw usage_error(flag_ + " " + quoted(path_) + ": cannot create a file in " + quoted(dir) + ": " +
                      std::strerror(errno));
  }
  temp_path_.assign(buf.data());
  // mkstemp just created a file in `dir`, so the directory exists and resolves.
  char resolved[PATH_MAX];
  destination_ = (::realpath(dir.c_str(), resolved) ? std::string(resolved) : dir) + "/" + base;
  // mkstemp creates 0600; give the result the permissions a plain open(O_CREAT, 0666) would.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd_, 0666 & ~mask);
}

StagedFile::~StagedFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
}

void StagedFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw internal_error(flag_ + " " + quoted(path_) + ": write failed: " + std::strerror(errno));
    p += n;
    bytes -= size_t(n);
  }
}

void StagedFile::commit() {
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw internal_error(flag_ + " " + quoted(path_) + ": close failed: " + std::strerror(errno));
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    throw internal_error(flag_ + " " + quoted(path_) +
                         ": cannot rename the finished file into place: " + std::strerror(errno));
  }
  committed_ = true;
}

}  // namespace ioattn::cli
