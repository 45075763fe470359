// Shared helpers of the fuzz harnesses (tests/fuzz/fuzz_*.cpp): hostile bytes as a file or a model directory for the
// APIs that only take paths, the "a cider::Error is the expected outcome" wrapper, and input splitting.
//
// Each harness defines LLVMFuzzerTestOneInput. It is linked either with libFuzzer (clang, tests/fuzz/CMakeLists.txt,
// scripts/fuzz.sh) or with tests/fuzz/replay_main.cpp (any compiler, the regular CTest build: fuzz_replay_<name>).
//
// The library's contract (src/model/*.h): every malformed input is a cider::Error. So only cider::Error is caught;
// anything else (another exception type, a sanitizer report, a signal) escapes and is a finding.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace cider::fuzz {

// The libFuzzer build compiles no x86 ISA kernels (tests/fuzz/CMakeLists.txt): ask for the reference kernels unless
// the environment already chose a level.
#ifdef CIDER_FUZZ_REF_KERNELS
inline const bool kRefKernelsRequested = [] { return ::setenv("CIDER_ISA", "ref", 0) == 0; }();
#endif

// CIDER_FUZZ_VERBOSE=1: print every cider::Error the harness swallows (to see how far a seed gets).
inline bool verbose() {
  static const bool v = [] {
    const char* e = std::getenv("CIDER_FUZZ_VERBOSE");
    return e != nullptr && *e != '\0' && *e != '0';
  }();
  return v;
}

// Runs f(); a cider::Error (the documented outcome of bad input) is swallowed, anything else propagates.
// An invariant the library promises: aborts with "invariant violated: <what>" (scripts/fuzz.sh reports that line).
inline void require(bool cond, const char* what) {
  if (!cond) {
    std::fprintf(stderr, "fuzz harness: invariant violated: %s\n", what);
    std::abort();
  }
}

template <typename F>
inline void expect_errors(F&& f) {
  try {
    f();
  } catch (const cider::Error& e) {
    if (verbose()) std::fprintf(stderr, "  (expected) cider::Error: %.300s\n", e.what());
  }
}

// Runs f() where the library promises success (e.g. re-reading what it just wrote): a cider::Error here is a finding,
// reported with its message.
template <typename F>
inline void expect_success(const char* what, F&& f) {
  try {
    f();
  } catch (const cider::Error& e) {
    std::fprintf(stderr, "fuzz harness: %s must succeed; got cider::Error: %s\n", what, e.what());
    std::abort();
  }
}

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "fuzz harness: %s: %s\n", what, std::strerror(errno));
  std::abort();
}

// Where per-process scratch files go: $CIDER_FUZZ_TMP, else /dev/shm (tmpfs) when writable, else $TMPDIR or /tmp.
inline std::string scratch_root() {
  if (const char* t = std::getenv("CIDER_FUZZ_TMP"); t && *t) return t;
  if (::access("/dev/shm", W_OK) == 0) return "/dev/shm";
  if (const char* t = std::getenv("TMPDIR"); t && *t) return t;
  return "/tmp";
}

// A per-process scratch directory, created on first use and removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string d = scratch_root() + "/cider-fuzz-" + std::to_string(::getpid());
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
    std::filesystem::create_directories(d, ec);
    if (ec) die("cannot create the scratch directory");
    std::atexit([] {
      std::error_code e;
      std::filesystem::remove_all(scratch_root() + "/cider-fuzz-" + std::to_string(::getpid()), e);
    });
    return d;
  }();
  return dir;
}

inline void write_all(int fd, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t off = 0;
  while (off < size) {
    const ssize_t n = ::pwrite(fd, p + off, size - off, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      die("pwrite");
    }
    off += static_cast<size_t>(n);
  }
}

// The input bytes as a regular file that the library opens by path. One file per process, rewritten every iteration:
// an anonymous memfd named through /proc/self/fd (no disk traffic), or a file in the scratch directory if memfd is
// unavailable.
class InputFile {
 public:
  explicit InputFile(const char* name) {
#ifdef MFD_CLOEXEC
    fd_ = ::memfd_create(name, MFD_CLOEXEC);
    if (fd_ >= 0) path_ = "/proc/self/fd/" + std::to_string(fd_);
#endif
    if (fd_ < 0) {
      path_ = scratch_dir() + "/" + name;
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd_ < 0) die("cannot create the input file");
    }
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Replaces the file's contents with data[0, size) and returns its path.
  const std::string& set(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) die("ftruncate");
    write_all(fd_, data, size);
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Writes bytes to a file (replacing it).
inline void write_file(const std::string& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) die("cannot write a scratch file");
  write_all(fd, bytes.data(), bytes.size());
  ::close(fd);
}

// Splits data at 0x00 bytes into at most `max_parts` parts (the last part keeps any further 0x00 bytes). Missing
// parts are empty strings; `present` says how many separators were found + 1.
struct Parts {
  std::vector<std::string_view> parts;
  size_t present = 0;
};
inline Parts split_nul(const uint8_t* data, size_t size, size_t max_parts) {
  Parts r;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (r.parts.size() + 1 < max_parts) {
    const size_t z = rest.find('\0');
    if (z == std::string_view::npos) break;
    r.parts.push_back(rest.substr(0, z));
    rest.remove_prefix(z + 1);
  }
  r.parts.push_back(rest);
  r.present = r.parts.size();
  while (r.parts.size() < max_parts) r.parts.emplace_back();
  return r;
}

// Where the repository's test data lives: $CIDER_SOURCE_DIR, else the source directory compiled in.
inline std::string source_dir() {
  if (const char* s = std::getenv("CIDER_SOURCE_DIR"); s && *s) return s;
#ifdef CIDER_SOURCE_DIR
  return CIDER_SOURCE_DIR;
#else
  return ".";
#endif
}

// Reads a whole file (aborts if it cannot: the harness's own fixtures must exist).
inline std::string read_fixture(const std::string& relative) {
  const std::string path = source_dir() + "/" + relative;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    std::fprintf(stderr, "fuzz harness: cannot open fixture %s (set CIDER_SOURCE_DIR)\n", path.c_str());
    std::abort();
  }
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("read");
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// Well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, at most U+10FFFF), written independently of the
// library's own check so that the two can be compared.
inline bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if (c >= 0xC2 && c <= 0xDF) { n = 1; cp = c & 0x1Fu; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 2; cp = c & 0x0Fu; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 3; cp = c & 0x07u; }
    else return false;
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<uint8_t>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n + 1;
  }
  return true;
}

// Little-endian reads from a byte cursor (zeros past the end), to derive values from the input.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return i_ >= n_; }
  size_t left() const { return i_ < n_ ? n_ - i_ : 0; }
  uint8_t u8() { return i_ < n_ ? p_[i_++] : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= static_cast<uint32_t>(u8()) << (8 * k);
    return v;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t i_ = 0;
};

}  // namespace cider::fuzz
