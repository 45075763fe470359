// Read-only memory mapping of a whole file (POSIX mmap). The mapping is private and read-only, so a checkpoint's
// pages are shared with the page cache and never copied; an empty file maps to (nullptr, 0) since mmap of length 0
// is an error.
#include "model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace cider::model {

namespace {

// Closes a file descriptor on every path out of open() (the mapping stays valid after close).
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    fail(ErrorCode::kIo, "mapped_file", "cannot open '", path, "': ", std::strerror(err));
  }
  FdGuard guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    fail(ErrorCode::kIo, "mapped_file", "cannot stat '", path, "': ", std::strerror(err));
  }
  check(S_ISREG(st.st_mode), ErrorCode::kIo, "mapped_file", "'", path, "' must be a regular file; got mode 0",
        std::oct, static_cast<unsigned>(st.st_mode));

  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ == 0) return file;

  void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    file->size_ = 0;
    fail(ErrorCode::kIo, "mapped_file", "cannot map '", path, "' (", static_cast<size_t>(st.st_size),
         " bytes): ", std::strerror(err));
  }
  file->data_ = static_cast<const uint8_t*>(p);
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace cider::model
