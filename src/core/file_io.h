// cider/core/file_io.h — reading inputs and writing outputs safely.
//
//   * read_text_input: a whole text input (a file, /dev/stdin, a pipe) with a size limit, so /dev/zero or a huge file
//     is a clear error instead of unbounded memory;
//   * check_output_path: an output path must be a new path or an existing regular file (never a symlink, FIFO,
//     device or directory), and never one of the command's inputs;
//   * AtomicFile: writes to a unique temporary file beside the target and renames it over the target only when every
//     byte is written and synced, so the target is either the old file or the complete new one. Every failure names
//     the file and the system's reason (strerror), e.g. "No space left on device".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cider {

// The bytes of `path`; Error(kIo) naming `op` and the path if it cannot be read or is a directory; Error(kOutOfRange)
// if it holds more than `max_bytes` (limits::kMaxTextBytes by default).
std::string read_text_input(const std::string& path, const char* op, int64_t max_bytes = -1);

// Error(kInvalidArgument) naming `op` and `what` (e.g. "--out") unless `path` is non-empty and either does not exist
// or is a regular file that is not a symlink; and unless it is none of `inputs` (the same file, compared by device
// and inode; for an input directory, any file directly inside it).
void check_output_path(const std::string& path, const std::vector<std::string>& inputs, const char* op,
                       const char* what);

class AtomicFile {
 public:
  AtomicFile(const std::string& path, const char* op);  // creates "<path>.XXXXXX" (mode 0644)
  ~AtomicFile();                                         // removes the temporary file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t n);
  void commit();  // fsync, close, rename over the target

 private:
  [[noreturn]] void fail_errno(const char* what, int err);
  std::string path_, tmp_;
  const char* op_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace cider
