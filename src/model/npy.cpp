// .npy writing and reading (see npy.h). Header: magic "\x93NUMPY", version (1, 0), u16 header length, then a Python
// dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (…), } padded with spaces and a newline so that
// the data starts at a multiple of 64 bytes.
#include "model/npy.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"

namespace cider::model {

namespace {
constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kAlign = 64;
}  // namespace

void write_npy_f32(const std::string& path, const float* data, std::vector<int64_t> shape) {
  constexpr const char* op = "write_npy";
  int64_t numel = 1;
  for (int64_t d : shape) {
    check(d >= 0, ErrorCode::kInvalidArgument, op, "dimensions must be >= 0; got ", d);
    numel *= d;
  }
  check(data != nullptr || numel == 0, ErrorCode::kInvalidArgument, op, "data must not be null");
  std::ostringstream dict;
  dict << "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) dict << shape[i] << (shape.size() == 1 || i + 1 < shape.size() ? "," : "") << (i + 1 < shape.size() ? " " : "");
  dict << "), }";
  std::string header = dict.str();
  const size_t prefix = kMagicLen + 2 + 2;
  size_t total = prefix + header.size() + 1;
  header.append((kAlign - total % kAlign) % kAlign, ' ');
  header.push_back('\n');
  AtomicFile out(path, op);
  out.write(kMagic, kMagicLen);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const auto hl = static_cast<uint16_t>(header.size());
  const char hlb[2] = {static_cast<char>(hl & 0xff), static_cast<char>(hl >> 8)};
  out.write(hlb, 2);
  out.write(header.data(), header.size());
  out.write(data, static_cast<size_t>(numel) * 4);
  out.commit();
}

NpyArray read_npy_f32(const std::string& path) {
  constexpr const char* op = "read_npy";
  std::ifstream in(path, std::ios::binary);
  check(static_cast<bool>(in), ErrorCode::kIo, op, "cannot open '", path, "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  check(bytes.size() >= 10 && bytes.compare(0, kMagicLen, kMagic, kMagicLen) == 0, ErrorCode::kCorrupt, op, "'",
        path, "' is not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t hl = 0, off = 0;
  if (major == 1) {
    hl = static_cast<unsigned char>(bytes[8]) | (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    off = 10;
  } else {
    check(major == 2 || major == 3, ErrorCode::kCorrupt, op, "'", path, "': npy version must be 1, 2 or 3; got ", major);
    check(bytes.size() >= 12, ErrorCode::kCorrupt, op, "'", path, "' is truncated");
    for (int i = 0; i < 4; ++i) hl |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    off = 12;
  }
  check(off + hl <= bytes.size(), ErrorCode::kCorrupt, op, "'", path, "': header length ", hl, " passes the file end");
  const std::string h = bytes.substr(off, hl);
  check(h.find("'descr': '<f4'") != std::string::npos, ErrorCode::kCorrupt, op, "'", path,
        "': dtype must be '<f4'; header ", h);
  check(h.find("'fortran_order': False") != std::string::npos, ErrorCode::kCorrupt, op, "'", path,
        "': must be C order; header ", h);
  const size_t sp = h.find("'shape': (");
  check(sp != std::string::npos, ErrorCode::kCorrupt, op, "'", path, "': no shape in header ", h);
  const size_t close = h.find(')', sp);
  check(close != std::string::npos, ErrorCode::kCorrupt, op, "'", path, "': bad shape in header ", h);
  NpyArray a;
  std::string dims = h.substr(sp + 10, close - sp - 10);
  int64_t numel = 1;
  size_t pos = 0;
  while (pos < dims.size()) {
    while (pos < dims.size() && (dims[pos] == ' ' || dims[pos] == ',')) ++pos;
    if (pos >= dims.size()) break;
    size_t used = 0;
    const long long d = std::stoll(dims.substr(pos), &used);
    check(d >= 0 && used > 0, ErrorCode::kCorrupt, op, "'", path, "': bad dimension in ", h);
    a.shape.push_back(d);
    numel *= d;
    pos += used;
  }
  const size_t data_off = off + hl;
  check(bytes.size() - data_off == static_cast<size_t>(numel) * 4, ErrorCode::kCorrupt, op, "'", path, "': expected ",
        numel * 4, " data bytes for shape; got ", bytes.size() - data_off);
  a.data.resize(static_cast<size_t>(numel));
  std::memcpy(a.data.data(), bytes.data() + data_off, a.data.size() * 4);
  return a;
}

}  // namespace cider::model
