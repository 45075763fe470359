#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/limits.h"

namespace cider {

namespace fs = std::filesystem;

std::string read_text_input(const std::string& path, const char* op, int64_t max_bytes) {
  if (max_bytes < 0) max_bytes = limits::kMaxTextBytes;
  struct stat st{};
  check(!path.empty(), ErrorCode::kIo, op, "the input file must be named; got \"\"");
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    fail(ErrorCode::kIo, op, "cannot read \"", path, "\": ", std::strerror(err));
  }
  check(!S_ISDIR(st.st_mode), ErrorCode::kIo, op, "cannot read \"", path, "\": it is a directory");
  check(!S_ISREG(st.st_mode) || st.st_size <= max_bytes, ErrorCode::kOutOfRange, op, "\"", path,
        "\" must hold at most ", max_bytes, " bytes; got ", static_cast<int64_t>(st.st_size));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    fail(ErrorCode::kIo, op, "cannot open \"", path, "\": ", std::strerror(err));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      fail(ErrorCode::kIo, op, "error while reading \"", path, "\": ", std::strerror(err));
    }
    if (n == 0) break;
    if (static_cast<int64_t>(out.size()) + n > max_bytes) {
      ::close(fd);
      fail(ErrorCode::kOutOfRange, op, "\"", path, "\" must hold at most ", max_bytes,
           " bytes (the limit on text inputs); got more");
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

void check_output_path(const std::string& path, const std::vector<std::string>& inputs, const char* op,
                       const char* what) {
  check(!path.empty(), ErrorCode::kInvalidArgument, op, what, " must name a file; got \"\"");
  struct stat out{};
  if (::lstat(path.c_str(), &out) != 0) {
    const int err = errno;
    check(err == ENOENT, ErrorCode::kIo, op, what, " \"", path, "\" cannot be checked: ", std::strerror(err));
    return;  // a new file
  }
  check(!S_ISLNK(out.st_mode), ErrorCode::kInvalidArgument, op, what,
        " must be a new path or a regular file; got a symbolic link \"", path, "\" (name its target instead)");
  check(S_ISREG(out.st_mode), ErrorCode::kInvalidArgument, op, what,
        " must be a new path or a regular file, which cider replaces; got \"", path, "\", which is ",
        S_ISDIR(out.st_mode) ? "a directory" : S_ISFIFO(out.st_mode) ? "a FIFO" : S_ISCHR(out.st_mode) ? "a character device"
        : S_ISBLK(out.st_mode) ? "a block device" : S_ISSOCK(out.st_mode) ? "a socket" : "not a regular file");
  auto same = [&](const struct stat& s) { return s.st_dev == out.st_dev && s.st_ino == out.st_ino; };
  for (const std::string& in : inputs) {
    struct stat st{};
    if (in.empty() || ::stat(in.c_str(), &st) != 0) continue;
    check(!same(st), ErrorCode::kInvalidArgument, op, what, " must not be one of the inputs; got \"", path,
          "\", which is \"", in, "\"");
    if (S_ISDIR(st.st_mode)) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(in, ec)) {
        struct stat f{};
        if (::stat(e.path().c_str(), &f) == 0)
          check(!same(f), ErrorCode::kInvalidArgument, op, what, " must not be one of the inputs; got \"", path,
                "\", which is \"", e.path().string(), "\" of the model \"", in, "\"");
      }
    }
  }
}

AtomicFile::AtomicFile(const std::string& path, const char* op) : path_(path), op_(op) {
  check(!path.empty(), ErrorCode::kInvalidArgument, op, "the output file must be named; got \"\"");
  std::string templ = path + ".XXXXXX";
  fd_ = ::mkstemp(templ.data());
  if (fd_ < 0) {
    const int err = errno;
    fail(ErrorCode::kIo, op, "cannot create a temporary file beside \"", path, "\": ", std::strerror(err));
  }
  tmp_ = templ;
  ::fchmod(fd_, 0644);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::fail_errno(const char* what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  tmp_.clear();
  fail(ErrorCode::kIo, op_, "cannot ", what, " \"", path_, "\" (through \"", path_, ".XXXXXX\"): ", std::strerror(err));
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail_errno("write", errno);
    }
    if (w == 0) fail_errno("write", EIO);
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail_errno("sync", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_errno("close", errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail_errno("rename the temporary file over", errno);
  committed_ = true;
}

}  // namespace cider
