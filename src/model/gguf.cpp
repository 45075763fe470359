// GGUF reading: header, metadata, tensor directory. Every read goes through a bounds-checked cursor, so a corrupt or
// hostile file can only produce a cider::Error, never a read outside the mapping.
//
// File layout (little-endian; v2 and v3 are identical here, v1 had 32-bit counts and is not read):
//   u32 magic "GGUF" (bytes 47 47 55 46) | u32 version | u64 tensor_count | u64 kv_count
//   kv_count  x { string key | u32 value_type | value }
//   tensor_count x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
//   zero padding to a multiple of general.alignment (default 32), then the data area; a tensor's bytes start at
//   data_area + offset (offset a multiple of the alignment)
// string = u64 length + bytes (no terminator); value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool
// (one byte, 0 or 1), 8 string, 9 array (u32 element type, u64 count, elements), 10 u64, 11 i64, 12 f64.
#include "model/gguf.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>

#include "core/error.h"
#include "model/gguf_types.h"

namespace cider::model {

namespace gguf_detail {

// Block geometry of the ggml types (values as in the file; QK_K = 256 for the K-quants).
constexpr GGMLTypeTraits kTypes[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},          {2, "Q4_0", 32, 18},      {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},       {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},    {11, "Q3_K", 256, 110},    {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},    {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},    {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},   {23, "IQ4_XS", 256, 136},  {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},         {28, "F64", 1, 8},        {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},    {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},
    {40, "NVFP4", 64, 36},    {41, "Q1_0", 128, 18},
};

const GGMLTypeTraits* ggml_type_traits(uint32_t type) {
  for (const auto& t : kTypes)
    if (t.id == type) return &t;
  return nullptr;
}

}  // namespace gguf_detail

using gguf_detail::ggml_type_traits;

const char* ggml_type_name(uint32_t type) {
  if (const auto* t = ggml_type_traits(type)) return t->name;
  thread_local std::string buf;
  buf = "type " + std::to_string(type);
  return buf.c_str();
}

int64_t GGUFTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

constexpr const char* kOp = "gguf";

enum ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

const char* value_type_name(uint32_t t) {
  static const char* names[] = {"uint8", "int8",   "uint16", "int16", "uint32", "int32",  "float32",
                                "bool",  "string", "array",  "uint64", "int64", "float64"};
  return t < 13 ? names[t] : "unknown";
}

// Smallest encoded size of one value of a type: bounds an element count before anything is allocated.
uint64_t min_value_size(uint32_t t) {
  switch (t) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: case kString: return 8;
    default: return 0;
  }
}

// A bounds-checked little-endian reader over the mapping.
class Cursor {
 public:
  Cursor(const uint8_t* p, uint64_t size, const std::string& path) : p_(p), size_(size), path_(path) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, const std::string& what) const {
    check(n <= remaining(), ErrorCode::kCorrupt, kOp, "'", path_, "': ", what, " at offset ", pos_, " needs ", n,
          " bytes, which must lie inside the file; got only ", remaining(), " left");
  }
  uint64_t uint(int nbytes, const std::string& what) {
    need(static_cast<uint64_t>(nbytes), what);
    uint64_t v = 0;
    for (int i = nbytes - 1; i >= 0; --i) v = (v << 8) | p_[pos_ + static_cast<uint64_t>(i)];
    pos_ += static_cast<uint64_t>(nbytes);
    return v;
  }
  uint32_t u32(const std::string& what) { return static_cast<uint32_t>(uint(4, what)); }
  uint64_t u64(const std::string& what) { return uint(8, what); }
  std::string str(const std::string& what) {
    uint64_t n = u64(what + " length");
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
};

GGUFScalar read_scalar(Cursor& c, uint32_t type, const std::string& what, const std::string& path) {
  switch (type) {
    case kU8: return c.uint(1, what);
    case kU16: return c.uint(2, what);
    case kU32: return c.uint(4, what);
    case kU64: return c.uint(8, what);
    case kI8: return static_cast<int64_t>(static_cast<int8_t>(c.uint(1, what)));
    case kI16: return static_cast<int64_t>(static_cast<int16_t>(c.uint(2, what)));
    case kI32: return static_cast<int64_t>(static_cast<int32_t>(c.uint(4, what)));
    case kI64: return static_cast<int64_t>(c.uint(8, what));
    case kF32: {
      uint32_t u = static_cast<uint32_t>(c.uint(4, what));
      float f;
      std::memcpy(&f, &u, 4);
      return static_cast<double>(f);
    }
    case kF64: {
      uint64_t u = c.uint(8, what);
      double d;
      std::memcpy(&d, &u, 8);
      return d;
    }
    case kBool: {
      uint64_t b = c.uint(1, what);
      check(b <= 1, ErrorCode::kCorrupt, kOp, "'", path, "': ", what, " is a bool and must be 0 or 1; got ", b);
      return b == 1;
    }
    case kString: return c.str(what);
    default: break;
  }
  fail(ErrorCode::kInternal, kOp, "read_scalar called with type ", type);
}

}  // namespace

std::shared_ptr<const GGUFFile> GGUFFile::open(const std::string& path) {
  auto g = std::shared_ptr<GGUFFile>(new GGUFFile());
  g->file_ = MappedFile::open(path);
  const uint8_t* base = g->file_->data();
  const uint64_t size = g->file_->size();
  Cursor c(base, size, path);

  c.need(4, "magic");
  check(std::memcmp(base, "GGUF", 4) == 0, ErrorCode::kCorrupt, kOp, "'", path,
        "': the file must start with the magic \"GGUF\"; got bytes ", static_cast<unsigned>(base[0]), " ",
        static_cast<unsigned>(base[1]), " ", static_cast<unsigned>(base[2]), " ", static_cast<unsigned>(base[3]));
  c.u32("magic");
  g->version_ = c.u32("version");
  if (g->version_ != 2 && g->version_ != 3) {
    // A big-endian v3 file reads as 0x03000000 here.
    fail(ErrorCode::kUnsupported, kOp, "'", path, "': version must be 2 or 3 (little-endian); got ", g->version_,
         (g->version_ & 0xffffu) == 0 ? " (a big-endian file?)" : "");
  }
  const uint64_t n_tensors = c.u64("tensor count");
  const uint64_t n_kv = c.u64("metadata count");
  // Each metadata pair takes at least 13 bytes (key length, type, one byte of value), each tensor info at least 24
  // (name length, n_dims, type, offset): counts that cannot fit are corrupt, and are caught before any allocation.
  check(n_kv <= c.remaining() / 13, ErrorCode::kCorrupt, kOp, "'", path,
        "': metadata count must fit in the file (at most ", c.remaining() / 13, " for its size); got ", n_kv);
  check(n_tensors <= c.remaining() / 24, ErrorCode::kCorrupt, kOp, "'", path,
        "': tensor count must fit in the file (at most ", c.remaining() / 24, " for its size); got ", n_tensors);

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.str("metadata key #" + std::to_string(i));
    const std::string what = "metadata '" + key + "'";
    uint32_t type = c.u32(what + " type");
    GGUFValue v;
    if (type == kArray) {
      uint32_t et = c.u32(what + " element type");
      check(et != kArray, ErrorCode::kUnsupported, kOp, "'", path, "': ", what,
            " is an array of arrays, which cider does not read");
      check(min_value_size(et) != 0, ErrorCode::kCorrupt, kOp, "'", path, "': ", what,
            " element type must be a GGUF value type (0..12); got ", et);
      uint64_t n = c.u64(what + " element count");
      check(n <= c.remaining() / min_value_size(et), ErrorCode::kCorrupt, kOp, "'", path, "': ", what,
            " element count must fit in the file (at most ", c.remaining() / min_value_size(et), " ",
            value_type_name(et), " values); got ", n);
      v.type = et;
      v.is_array = true;
      v.values.reserve(static_cast<size_t>(n));
      for (uint64_t k = 0; k < n; ++k) v.values.push_back(read_scalar(c, et, what + "[" + std::to_string(k) + "]", path));
    } else {
      check(min_value_size(type) != 0, ErrorCode::kCorrupt, kOp, "'", path, "': ", what,
            " value type must be a GGUF value type (0..12); got ", type);
      v.type = type;
      v.values.push_back(read_scalar(c, type, what, path));
    }
    check(g->metadata_.count(key) == 0, ErrorCode::kCorrupt, kOp, "'", path, "': metadata keys must be unique; got '",
          key, "' twice");
    g->metadata_.emplace(std::move(key), std::move(v));
  }

  uint64_t alignment = 32;
  if (auto it = g->metadata_.find("general.alignment"); it != g->metadata_.end()) {
    const GGUFValue& v = it->second;
    check(!v.is_array && v.type == kU32, ErrorCode::kCorrupt, kOp, "'", path,
          "': general.alignment must be a uint32; got ", v.is_array ? "an array of " : "", value_type_name(v.type));
    alignment = std::get<uint64_t>(v.values[0]);
    check(alignment != 0 && (alignment & (alignment - 1)) == 0, ErrorCode::kCorrupt, kOp, "'", path,
          "': general.alignment must be a power of two; got ", alignment);
  }

  struct Info {
    uint64_t offset;
  };
  std::vector<Info> infos;
  g->tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GGUFTensor t;
    t.name = c.str("tensor name #" + std::to_string(i));
    const std::string what = "tensor '" + t.name + "'";
    uint32_t n_dims = c.u32(what + " n_dims");
    check(n_dims <= 4, ErrorCode::kCorrupt, kOp, "'", path, "': ", what, " n_dims must be at most 4; got ", n_dims);
    std::vector<int64_t> ne(n_dims);
    // The product of the non-zero dimensions must fit int64 too: with a zero dimension the element count is 0, but
    // a product taken in another order (GGUFTensor::numel, shape in reverse) would pass through the others (found
    // by fuzz_gguf: tests/fuzz/regressions/gguf/tensor_dims_overflow_past_a_zero_dimension).
    uint64_t numel = 1, nonzero = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t v = c.u64(what + " ne[" + std::to_string(d) + "]");
      check(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) &&
                (v == 0 || nonzero <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / v),
            ErrorCode::kCorrupt, kOp, "'", path, "': ", what,
            " element count must fit in int64, and so must the product of its non-zero dimensions; got ne[", d,
            "] = ", v);
      ne[d] = static_cast<int64_t>(v);
      numel *= v;
      if (v != 0) nonzero *= v;
    }
    t.shape.assign(ne.rbegin(), ne.rend());
    t.type = c.u32(what + " type");
    infos.push_back({c.u64(what + " offset")});
    check(infos.back().offset % alignment == 0, ErrorCode::kCorrupt, kOp, "'", path, "': ", what,
          " data offset must be a multiple of the alignment ", alignment, "; got ", infos.back().offset);

    if (const auto* tt = ggml_type_traits(t.type)) {
      const uint64_t ne0 = n_dims == 0 ? 1 : static_cast<uint64_t>(ne[0]);
      check(ne0 % static_cast<uint64_t>(tt->block_size) == 0, ErrorCode::kCorrupt, kOp, "'", path, "': ", what,
            " row length ne[0] must be a multiple of the ", tt->name, " block size ", tt->block_size, "; got ", ne0);
      const uint64_t blocks = numel / static_cast<uint64_t>(tt->block_size);
      check(blocks <= std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(tt->type_size),
            ErrorCode::kCorrupt, kOp, "'", path, "': ", what, " byte size must fit in 64 bits; got ", numel,
            " elements of ", tt->name);
      t.nbytes = static_cast<size_t>(blocks * static_cast<uint64_t>(tt->type_size));
    }
    check(g->index_.count(t.name) == 0, ErrorCode::kCorrupt, kOp, "'", path, "': tensor names must be unique; got '",
          t.name, "' twice");
    g->index_[t.name] = g->tensors_.size();
    g->tensors_.push_back(std::move(t));
  }

  // The data area starts at the next multiple of the alignment after the tensor infos.
  const uint64_t end_infos = c.pos();
  const uint64_t data_start = end_infos + (alignment - end_infos % alignment) % alignment;
  struct Range {
    uint64_t begin, end;
    size_t tensor;
  };
  std::vector<Range> ranges;
  for (size_t i = 0; i < g->tensors_.size(); ++i) {
    GGUFTensor& t = g->tensors_[i];
    const uint64_t off = infos[i].offset;
    const uint64_t avail = size >= data_start ? size - data_start : 0;
    check(size >= data_start && off <= avail && t.nbytes <= avail - off, ErrorCode::kCorrupt, kOp, "'", path,
          "': tensor '", t.name, "' data [", off, ", +", t.nbytes, ") must lie inside the data area of ", avail,
          " bytes (file ", size, " bytes, data from ", data_start, "); got beyond its end");
    t.data = base + data_start + off;
    if (t.nbytes > 0) ranges.push_back({off, off + t.nbytes, i});
  }
  // No two tensors may share bytes (tensors of unknown types have unknown sizes and are left out of this check).
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t k = 1; k < ranges.size(); ++k)
    check(ranges[k].begin >= ranges[k - 1].end, ErrorCode::kCorrupt, kOp, "'", path, "': tensor data must not ",
          "overlap; got '", g->tensors_[ranges[k].tensor].name, "' at offset ", ranges[k].begin, " inside '",
          g->tensors_[ranges[k - 1].tensor].name, "' [", ranges[k - 1].begin, ", ", ranges[k - 1].end, ")");
  return g;
}

const GGUFTensor* GGUFFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------------------------
// Typed metadata access

namespace {

const GGUFValue& lookup(const std::map<std::string, GGUFValue>& m, const std::string& key, const std::string& path) {
  auto it = m.find(key);
  check(it != m.end(), ErrorCode::kInvalidArgument, kOp, "'", path, "': metadata key '", key,
        "' must be present; got no such key");
  return it->second;
}

bool is_int_type(uint32_t t) {
  return t == kU8 || t == kI8 || t == kU16 || t == kI16 || t == kU32 || t == kI32 || t == kU64 || t == kI64;
}
bool is_float_type(uint32_t t) { return t == kF32 || t == kF64; }

std::string describe(const GGUFValue& v) {
  return std::string(v.is_array ? "an array of " : "") + value_type_name(v.type);
}

int64_t scalar_to_int(const GGUFScalar& s, const std::string& key, const std::string& path) {
  if (const auto* u = std::get_if<uint64_t>(&s)) {
    check(*u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), ErrorCode::kOutOfRange, kOp, "'", path,
          "': metadata '", key, "' must fit in int64; got ", *u);
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&s)) return *i;
  if (const auto* b = std::get_if<bool>(&s)) return *b ? 1 : 0;
  fail(ErrorCode::kInternal, kOp, "metadata '", key, "' is not an integer");
}

double scalar_to_double(const GGUFScalar& s) {
  if (const auto* d = std::get_if<double>(&s)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&s)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&s)) return static_cast<double>(*i);
  return 0.0;
}

}  // namespace

std::string GGUFFile::get_string(const std::string& key) const {
  const GGUFValue& v = lookup(metadata_, key, path());
  check(!v.is_array && v.type == kString, ErrorCode::kInvalidArgument, kOp, "'", path(), "': metadata '", key,
        "' must be a string; got ", describe(v));
  return std::get<std::string>(v.values[0]);
}

int64_t GGUFFile::get_int(const std::string& key) const {
  const GGUFValue& v = lookup(metadata_, key, path());
  check(!v.is_array && (is_int_type(v.type) || v.type == kBool), ErrorCode::kInvalidArgument, kOp, "'", path(),
        "': metadata '", key, "' must be an integer or bool; got ", describe(v));
  return scalar_to_int(v.values[0], key, path());
}

double GGUFFile::get_float(const std::string& key) const {
  const GGUFValue& v = lookup(metadata_, key, path());
  check(!v.is_array && (is_float_type(v.type) || is_int_type(v.type)), ErrorCode::kInvalidArgument, kOp, "'", path(),
        "': metadata '", key, "' must be a float or integer; got ", describe(v));
  return scalar_to_double(v.values[0]);
}

std::vector<std::string> GGUFFile::get_string_array(const std::string& key) const {
  const GGUFValue& v = lookup(metadata_, key, path());
  check(v.is_array && v.type == kString, ErrorCode::kInvalidArgument, kOp, "'", path(), "': metadata '", key,
        "' must be an array of strings; got ", describe(v));
  std::vector<std::string> out;
  out.reserve(v.values.size());
  for (const auto& s : v.values) out.push_back(std::get<std::string>(s));
  return out;
}

std::vector<int64_t> GGUFFile::get_int_array(const std::string& key) const {
  const GGUFValue& v = lookup(metadata_, key, path());
  check(v.is_array && (is_int_type(v.type) || v.type == kBool), ErrorCode::kInvalidArgument, kOp, "'", path(),
        "': metadata '", key, "' must be an array of integers or bools; got ", describe(v));
  std::vector<int64_t> out;
  out.reserve(v.values.size());
  for (const auto& s : v.values) out.push_back(scalar_to_int(s, key, path()));
  return out;
}

std::vector<double> GGUFFile::get_float_array(const std::string& key) const {
  const GGUFValue& v = lookup(metadata_, key, path());
  check(v.is_array && (is_float_type(v.type) || is_int_type(v.type)), ErrorCode::kInvalidArgument, kOp, "'", path(),
        "': metadata '", key, "' must be an array of floats or integers; got ", describe(v));
  std::vector<double> out;
  out.reserve(v.values.size());
  for (const auto& s : v.values) out.push_back(scalar_to_double(s));
  return out;
}

bool is_gguf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace cider::model
