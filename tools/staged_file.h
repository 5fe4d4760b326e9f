// Output files that appear only on success: data goes to a temporary file in the destination's
// directory (so the final rename stays on one filesystem and is atomic), and the destination is
// replaced by rename() in commit(). A StagedFile destroyed before commit() removes its temporary,
// so an error anywhere leaves no file created and no existing file truncated (docs/api.md).
#pragma once

#include <string>

namespace ioattn::cli {

class StagedFile {
 public:
  // Creates the temporary now, so an unwritable destination is reported before any work is done.
  // Throws CliError(kExitUsage) naming `flag` and `path`.
  StagedFile(std::string flag, std::string path);
  ~StagedFile();
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  // Throws CliError(kExitInternal) on a write error (disk full).
  void write(const void* data, size_t bytes);
  // Flushes, closes and renames over the destination.
  void commit();

  const std::string& path() const { return path_; }
  // The directory entry commit() replaces, with the directory resolved (symlinks, "." and ".."),
  // so two spellings of one destination compare equal.
  const std::string& destination() const { return destination_; }

 private:
  std::string flag_, path_, temp_path_, destination_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace ioattn::cli
