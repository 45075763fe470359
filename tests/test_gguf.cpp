// The GGUF reader and dequantizers against files written by gguf-py (llama.cpp's Python package) and gguf-py's own
// dequantization (tools/gen_gguf_fixtures.py -> tests/data/gguf/), plus one test per rejected input.
//
// Dequantized values must equal gguf-py's bit for bit: both evaluate the same float32 formulas in the same order
// with one rounding per operation (numpy never fuses, and cider builds with -ffp-contract=off), and the f16 -> f32
// scale conversion is exact. NaN inputs must give NaN (payload bits are not compared).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "support/test_support.h"

namespace cider::model {
namespace {

namespace fs = std::filesystem;

const std::string kDir = std::string(CIDER_SOURCE_DIR) + "/tests/data/gguf/";

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  // Unlink first: rewriting a file in place by truncation makes ext4 flush it on close (auto_da_alloc), which made
  // the many small files of the truncation test slow.
  std::remove(path.c_str());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

const nlohmann::json& manifest() {
  static const nlohmann::json m = [] {
    std::ifstream in(kDir + "manifest.json");
    if (!in) throw std::runtime_error("cannot open " + kDir + "manifest.json");
    return nlohmann::json::parse(in);
  }();
  return m;
}

const nlohmann::json& file_entry(const std::string& name) {
  for (const auto& f : manifest().at("files"))
    if (f.at("file") == name) return f;
  throw std::runtime_error("no manifest entry for " + name);
}

const std::vector<float>& reference() {
  static const std::vector<float> r = [] {
    auto b = read_bytes(kDir + "reference.bin");
    std::vector<float> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), v.size() * 4);
    return v;
  }();
  return r;
}

// A fresh directory for files this test writes; removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "cider_gguf_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs f, which must throw cider::Error with `code` and a message containing `needle`.
template <typename F>
void expect_error(F&& f, ErrorCode code, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected cider::Error (" << error_code_name(code) << ") containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

bool same_float(float got, float want) {
  if (std::isnan(want)) return std::isnan(got);
  uint32_t a, b;
  std::memcpy(&a, &got, 4);
  std::memcpy(&b, &want, 4);
  return a == b;
}

// ---------------------------------------------------------------------------------------------------------------
// A GGUF byte builder for the rejection tests (valid files come from gguf-py).

class Builder {
 public:
  Builder& u8(uint8_t v) { b_.push_back(v); return *this; }
  Builder& u32(uint32_t v) { return le(v, 4); }
  Builder& u64(uint64_t v) { return le(v, 8); }
  Builder& str(const std::string& s) {
    u64(s.size());
    b_.insert(b_.end(), s.begin(), s.end());
    return *this;
  }
  Builder& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b_.insert(b_.end(), {'G', 'G', 'U', 'F'});
    return u32(version).u64(n_tensors).u64(n_kv);
  }
  Builder& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(4).u32(v); }
  Builder& kv_str(const std::string& key, const std::string& v) { return str(key).u32(8).str(v); }
  // Tensor info with ne given fastest-first (as in the file).
  Builder& tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) u64(d);
    return u32(type).u64(offset);
  }
  Builder& pad(size_t alignment = 32) {
    while (b_.size() % alignment != 0) b_.push_back(0);
    return *this;
  }
  Builder& bytes(size_t n, uint8_t v = 0) {
    b_.insert(b_.end(), n, v);
    return *this;
  }
  const std::vector<uint8_t>& data() const { return b_; }

 private:
  Builder& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b_.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  std::vector<uint8_t> b_;
};

std::shared_ptr<const GGUFFile> open_bytes(const TempDir& dir, const std::vector<uint8_t>& bytes) {
  const std::string p = dir.file("t.gguf");
  write_bytes(p, bytes);
  return GGUFFile::open(p);
}

void expect_open_error(const std::vector<uint8_t>& bytes, ErrorCode code, const std::string& needle) {
  TempDir dir;
  expect_error([&] { open_bytes(dir, bytes); }, code, needle);
}

// ---------------------------------------------------------------------------------------------------------------
// Valid files from gguf-py

void check_metadata(const GGUFFile& g, const nlohmann::json& entries) {
  ASSERT_EQ(g.metadata().size(), entries.size());
  for (const auto& e : entries) {
    const std::string key = e.at("key");
    SCOPED_TRACE(key);
    ASSERT_TRUE(g.has(key));
    const GGUFValue& v = g.metadata().at(key);
    const uint32_t type = e.at("type");
    EXPECT_EQ(v.type, type);
    EXPECT_EQ(v.is_array, e.at("is_array").get<bool>());
    const auto& want = e.at("values");
    ASSERT_EQ(v.values.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const GGUFScalar& s = v.values[i];
      switch (type) {
        case 0: case 2: case 4: case 10:
          EXPECT_EQ(std::get<uint64_t>(s), want[i].get<uint64_t>()) << i;
          break;
        case 1: case 3: case 5: case 11:
          EXPECT_EQ(std::get<int64_t>(s), want[i].get<int64_t>()) << i;
          break;
        case 6: case 12:  // JSON holds the exact double (for f32: of the float32 value written)
          EXPECT_EQ(std::get<double>(s), want[i].get<double>()) << i;
          break;
        case 7:
          EXPECT_EQ(std::get<bool>(s), want[i].get<bool>()) << i;
          break;
        case 8:
          EXPECT_EQ(std::get<std::string>(s), want[i].get<std::string>()) << i;
          break;
        default:
          ADD_FAILURE() << "unexpected type " << type;
      }
    }
  }
}

// Tensor directory as gguf-py's reader sees it, and every value as gguf-py dequantizes it.
void check_tensors(const GGUFFile& g, const nlohmann::json& entries, std::set<uint32_t>* types_checked) {
  const auto file = read_bytes(g.path());
  ASSERT_EQ(g.tensors().size(), entries.size());
  for (size_t k = 0; k < entries.size(); ++k) {
    const auto& e = entries[k];
    const std::string name = e.at("name");
    SCOPED_TRACE(name);
    const GGUFTensor* t = g.find(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(&g.tensors()[k], t);  // file order kept
    EXPECT_EQ(t->type, e.at("type").get<uint32_t>());
    EXPECT_STREQ(ggml_type_name(t->type), e.at("type_name").get<std::string>().c_str());
    auto ne = e.at("ne").get<std::vector<int64_t>>();
    EXPECT_EQ(t->shape, std::vector<int64_t>(ne.rbegin(), ne.rend()));
    const size_t off = e.at("data_offset"), n = e.at("n_bytes");
    EXPECT_EQ(t->nbytes, n);
    ASSERT_LE(off + n, file.size());
    ASSERT_EQ(std::memcmp(t->data, file.data() + off, n), 0) << "data pointer is not at gguf-py's data_offset";
    if (!e.contains("ref_offset")) continue;

    const size_t count = e.at("ref_count"), roff = e.at("ref_offset");
    ASSERT_EQ(static_cast<size_t>(t->numel()), count);
    test::GuardedBuffer out(count * sizeof(float));
    out.fill_inside(0xCD);
    dequantize_gguf_tensor(*t, out.as<float>());
    EXPECT_TRUE(out.canaries_intact());
    const float* want = reference().data() + roff;
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i) {
      if (!same_float(out.as<float>()[i], want[i]) && bad++ < 5)
        ADD_FAILURE() << "element " << i << ": got " << out.as<float>()[i] << ", gguf-py " << want[i];
    }
    EXPECT_EQ(bad, 0u);
    types_checked->insert(t->type);
  }
}

TEST(GGUF, MetadataOfEveryValueTypeMatchesGgufPy) {
  auto g = GGUFFile::open(kDir + "tensors.gguf");
  const auto& f = file_entry("tensors.gguf");
  EXPECT_EQ(g->version(), f.at("version").get<uint32_t>());
  check_metadata(*g, f.at("metadata"));
}

TEST(GGUF, TensorsOfEveryTypeDequantizeAsGgufPy) {
  auto g = GGUFFile::open(kDir + "tensors.gguf");
  std::set<uint32_t> types;
  check_tensors(*g, file_entry("tensors.gguf").at("tensors"), &types);
  // Every type dequantize_gguf_tensor supports was compared at least once.
  for (GGMLType t : {GGMLType::kF32, GGMLType::kF16, GGMLType::kBF16, GGMLType::kQ8_0, GGMLType::kQ4_0,
                     GGMLType::kQ4_1, GGMLType::kQ5_0, GGMLType::kQ5_1, GGMLType::kQ2_K, GGMLType::kQ3_K,
                     GGMLType::kQ4_K, GGMLType::kQ5_K, GGMLType::kQ6_K})
    EXPECT_EQ(types.count(static_cast<uint32_t>(t)), 1u) << ggml_type_name(static_cast<uint32_t>(t));
}

TEST(GGUF, CustomAlignmentIsHonoured) {
  auto g = GGUFFile::open(kDir + "align64.gguf");
  const auto& f = file_entry("align64.gguf");
  EXPECT_EQ(g->get_int("general.alignment"), 64);
  check_metadata(*g, f.at("metadata"));
  std::set<uint32_t> types;
  check_tensors(*g, f.at("tensors"), &types);
  EXPECT_EQ(types.size(), 3u);
}

TEST(GGUF, Version2IsRead) {
  // v2 and v3 little-endian files differ only in the version field.
  TempDir dir;
  auto bytes = read_bytes(kDir + "tensors.gguf");
  bytes[4] = 2;
  auto g = open_bytes(dir, bytes);
  EXPECT_EQ(g->version(), 2u);
  check_metadata(*g, file_entry("tensors.gguf").at("metadata"));
  std::set<uint32_t> types;
  check_tensors(*g, file_entry("tensors.gguf").at("tensors"), &types);
}

TEST(GGUF, TypedGetters) {
  auto g = GGUFFile::open(kDir + "tensors.gguf");
  EXPECT_EQ(g->get_string("general.architecture"), "cider-test");
  EXPECT_EQ(g->get_int("test.u8"), 200);
  EXPECT_EQ(g->get_int("test.i8"), -100);
  EXPECT_EQ(g->get_int("test.u32"), 4000000000LL);
  EXPECT_EQ(g->get_int("test.i64"), -(int64_t{1} << 62) - 3);
  EXPECT_EQ(g->get_int("test.u64_small"), 7);
  EXPECT_EQ(g->get_int("test.bool_true"), 1);
  EXPECT_EQ(g->get_int("test.bool_false"), 0);
  EXPECT_EQ(g->get_float("test.f32"), static_cast<double>(0.1f));
  EXPECT_EQ(g->get_float("test.f64"), 3.141592653589793);
  EXPECT_EQ(g->get_float("test.i16"), -30000.0);
  EXPECT_EQ(g->get_string_array("test.arr_str"), (std::vector<std::string>{"alpha", "", "\xc3\xbc\xc3\xb1\xc3\xae",
                                                                            "a b\nc"}));
  EXPECT_EQ(g->get_int_array("test.arr_i64"),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}));
  EXPECT_EQ(g->get_int_array("test.arr_u8"), (std::vector<int64_t>{0, 1, 255}));
  EXPECT_EQ(g->get_int_array("test.arr_bool"), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(g->get_float_array("test.arr_f64"), (std::vector<double>{1e300, -2.5, 0.1}));
  EXPECT_EQ(g->get_float_array("test.arr_i32"), (std::vector<double>{-5, 6, -7, 8}));
  EXPECT_EQ(g->get_float_array("test.arr_f32"),
            (std::vector<double>{0.5, -1.25, static_cast<double>(3.3f), static_cast<double>(1e-30f)}));
}

TEST(GGUF, GettersRejectMissingKeysAndWrongTypes) {
  auto g = GGUFFile::open(kDir + "tensors.gguf");
  expect_error([&] { g->get_int("no.such.key"); }, ErrorCode::kInvalidArgument, "no.such.key");
  expect_error([&] { g->get_string("test.u8"); }, ErrorCode::kInvalidArgument, "must be a string; got uint8");
  expect_error([&] { g->get_int("test.f32"); }, ErrorCode::kInvalidArgument, "got float32");
  expect_error([&] { g->get_int("test.arr_i32"); }, ErrorCode::kInvalidArgument, "got an array of int32");
  expect_error([&] { g->get_float("test.string"); }, ErrorCode::kInvalidArgument, "got string");
  expect_error([&] { g->get_float("test.bool_true"); }, ErrorCode::kInvalidArgument, "got bool");
  expect_error([&] { g->get_string_array("test.arr_i32"); }, ErrorCode::kInvalidArgument, "array of strings");
  expect_error([&] { g->get_int_array("test.arr_f32"); }, ErrorCode::kInvalidArgument, "array of integers");
  expect_error([&] { g->get_float_array("test.arr_str"); }, ErrorCode::kInvalidArgument, "array of floats");
  expect_error([&] { g->get_int_array("test.u8"); }, ErrorCode::kInvalidArgument, "got uint8");
  // A uint64 beyond int64 does not silently wrap.
  expect_error([&] { g->get_int("test.u64"); }, ErrorCode::kOutOfRange, "9223372036854788153");
}

TEST(GGUF, KnownTypesWithoutDequantizerAreKeptAndRejectedAtDequantize) {
  auto g = GGUFFile::open(kDir + "tensors.gguf");
  for (const char* name : {"u.iq4_nl", "u.i32"}) {
    const GGUFTensor* t = g->find(name);
    ASSERT_NE(t, nullptr);
    std::vector<float> out(static_cast<size_t>(t->numel()));
    expect_error([&] { dequantize_gguf_tensor(*t, out.data()); }, ErrorCode::kUnsupported,
                 std::string("got ") + ggml_type_name(t->type));
  }
  EXPECT_EQ(g->find("no such tensor"), nullptr);
}

// ---------------------------------------------------------------------------------------------------------------
// Rejections

TEST(GGUFCorrupt, MissingAndEmptyFiles) {
  TempDir dir;
  expect_error([&] { GGUFFile::open(dir.file("absent.gguf")); }, ErrorCode::kIo, "absent.gguf");
  expect_error([&] { GGUFFile::open(dir.file("")); }, ErrorCode::kIo, "regular file");  // the directory itself
  expect_open_error({}, ErrorCode::kCorrupt, "magic");
}

TEST(GGUFCorrupt, BadMagic) {
  auto bytes = read_bytes(kDir + "tensors.gguf");
  bytes[3] = 'X';
  expect_open_error(bytes, ErrorCode::kCorrupt, "magic \"GGUF\"");
}

TEST(GGUFCorrupt, UnsupportedVersion) {
  for (uint32_t v : {0u, 1u, 4u, 0x03000000u}) {
    SCOPED_TRACE(v);
    expect_open_error(Builder().header(0, 0, v).data(), ErrorCode::kUnsupported,
                      "version must be 2 or 3 (little-endian); got " + std::to_string(v));
  }
}

TEST(GGUFCorrupt, CountsBeyondTheFile) {
  auto bytes = read_bytes(kDir + "tensors.gguf");
  auto set_u64 = [](std::vector<uint8_t> b, size_t at, uint64_t v) {
    for (int i = 0; i < 8; ++i) b[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
    return b;
  };
  expect_open_error(set_u64(bytes, 8, uint64_t{1} << 40), ErrorCode::kCorrupt, "tensor count must fit");
  expect_open_error(set_u64(bytes, 16, ~uint64_t{0}), ErrorCode::kCorrupt, "metadata count must fit");
  // A count within that bound but larger than the entries present runs into the end of the file.
  expect_open_error(Builder().header(0, 2).kv_u32("a", 1).bytes(9).data(), ErrorCode::kCorrupt,
                    "metadata '' type at offset 49 needs 4 bytes, which must lie inside the file; got only 1 left");
  auto arr = Builder().header(0, 1).str("a").u32(9).u32(5).u64(1000).u32(1).data();
  expect_open_error(arr, ErrorCode::kCorrupt, "element count must fit");
}

TEST(GGUFCorrupt, StringLengthBeyondTheFile) {
  auto key = Builder().header(0, 1).u64(1000).bytes(20, 'k').data();
  expect_open_error(key, ErrorCode::kCorrupt, "metadata key #0 at offset 32 needs 1000 bytes");
  auto val = Builder().header(0, 1).str("k").u32(8).u64(~uint64_t{0} - 3).bytes(8).data();
  expect_open_error(val, ErrorCode::kCorrupt, "metadata 'k'");
  auto arr = Builder().header(0, 1).str("k").u32(9).u32(8).u64(2).str("ok").u64(500).bytes(10).data();
  expect_open_error(arr, ErrorCode::kCorrupt, "metadata 'k'[1]");
  auto tname = Builder().header(1, 0).u64(99999).bytes(30).data();
  expect_open_error(tname, ErrorCode::kCorrupt, "tensor name #0");
}

TEST(GGUFCorrupt, BadMetadataValues) {
  expect_open_error(Builder().header(0, 1).str("k").u32(13).u64(0).data(), ErrorCode::kCorrupt,
                    "value type must be a GGUF value type (0..12); got 13");
  expect_open_error(Builder().header(0, 1).str("k").u32(9).u32(77).u64(0).data(), ErrorCode::kCorrupt,
                    "element type must be a GGUF value type (0..12); got 77");
  expect_open_error(Builder().header(0, 1).str("k").u32(9).u32(9).u64(0).data(), ErrorCode::kUnsupported,
                    "array of arrays");
  expect_open_error(Builder().header(0, 1).str("k").u32(7).u8(2).data(), ErrorCode::kCorrupt,
                    "must be 0 or 1; got 2");
  expect_open_error(Builder().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).data(), ErrorCode::kCorrupt,
                    "keys must be unique; got 'k' twice");
  expect_open_error(Builder().header(0, 1).kv_u32("general.alignment", 48).data(), ErrorCode::kCorrupt,
                    "power of two; got 48");
  expect_open_error(Builder().header(0, 1).kv_u32("general.alignment", 0).data(), ErrorCode::kCorrupt,
                    "power of two; got 0");
  expect_open_error(Builder().header(0, 1).kv_str("general.alignment", "32").data(), ErrorCode::kCorrupt,
                    "general.alignment must be a uint32; got string");
}

TEST(GGUFCorrupt, EmptyArraysAndStringsAreValid) {
  TempDir dir;
  auto g = open_bytes(dir, Builder().header(0, 2).str("e").u32(9).u32(8).u64(0).kv_str("s", "").data());
  EXPECT_TRUE(g->get_string_array("e").empty());
  EXPECT_EQ(g->get_string("s"), "");
  EXPECT_TRUE(g->tensors().empty());
}

TEST(GGUFCorrupt, TensorOffsetOutsideTheFile) {
  // Header 24 + name (8+1) + n_dims 4 + ne 8 + type 4 + offset 8 = 57 -> data at 64; 4 floats need 16 bytes.
  auto b = Builder().header(1, 0).tensor("w", {4}, 0, 0).pad().bytes(15).data();
  expect_open_error(b, ErrorCode::kCorrupt, "tensor 'w' data [0, +16) must lie inside the data area of 15 bytes");
  auto far = Builder().header(1, 0).tensor("w", {4}, 0, uint64_t{1} << 62).pad().bytes(16).data();
  expect_open_error(far, ErrorCode::kCorrupt, "must lie inside the data area");
  auto wrap = Builder().header(1, 0).tensor("w", {4}, 0, ~uint64_t{0} - 31).pad().bytes(16).data();
  expect_open_error(wrap, ErrorCode::kCorrupt, "must lie inside the data area");
  // Even an empty tensor's offset must be inside the file.
  auto empty = Builder().header(1, 0).tensor("w", {0}, 0, 64).pad().bytes(16).data();
  expect_open_error(empty, ErrorCode::kCorrupt, "must lie inside the data area");
  TempDir dir;
  auto ok = open_bytes(dir, Builder().header(1, 0).tensor("w", {4}, 0, 0).pad().bytes(16).data());
  EXPECT_EQ(ok->find("w")->nbytes, 16u);
}

TEST(GGUFCorrupt, MisalignedTensorOffset) {
  auto b = Builder().header(1, 0).tensor("w", {4}, 0, 4).pad().bytes(64).data();
  expect_open_error(b, ErrorCode::kCorrupt, "data offset must be a multiple of the alignment 32; got 4");
  auto b64 = Builder().header(1, 1).kv_u32("general.alignment", 64).tensor("w", {4}, 0, 32).pad(64).bytes(128).data();
  expect_open_error(b64, ErrorCode::kCorrupt, "multiple of the alignment 64; got 32");
}

TEST(GGUFCorrupt, BadTensorGeometry) {
  expect_open_error(Builder().header(1, 0).tensor("w", {48, 2}, 2, 0).pad().bytes(64).data(), ErrorCode::kCorrupt,
                    "row length ne[0] must be a multiple of the Q4_0 block size 32; got 48");
  expect_open_error(Builder().header(1, 0).tensor("w", {128}, 12, 0).pad().bytes(160).data(), ErrorCode::kCorrupt,
                    "multiple of the Q4_K block size 256; got 128");
  expect_open_error(Builder().header(1, 0).tensor("w", {1, 1, 1, 1, 1}, 0, 0).pad().bytes(4).data(),
                    ErrorCode::kCorrupt, "n_dims must be at most 4; got 5");
  expect_open_error(Builder().header(1, 0).tensor("w", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 0).pad().data(),
                    ErrorCode::kCorrupt, "element count must fit in int64");
  expect_open_error(Builder().header(1, 0).tensor("w", {uint64_t{1} << 63}, 0, 0).pad().data(), ErrorCode::kCorrupt,
                    "element count must fit in int64");
  // A zero dimension makes the count 0, but the other dimensions' product must still fit (fuzz_gguf's finding).
  expect_open_error(Builder().header(1, 0).tensor("w", {0, uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0).pad().data(),
                    ErrorCode::kCorrupt, "so must the product of its non-zero dimensions; got ne[2] = 1099511627776");
  auto dup = Builder().header(2, 0).tensor("w", {4}, 0, 0).tensor("w", {4}, 0, 32).pad().bytes(64).data();
  expect_open_error(dup, ErrorCode::kCorrupt, "tensor names must be unique; got 'w' twice");
  auto overlap = Builder().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {4}, 0, 32).pad().bytes(64).data();
  expect_open_error(overlap, ErrorCode::kCorrupt, "must not overlap; got 'b' at offset 32 inside 'a' [0, 64)");
}

TEST(GGUFCorrupt, UnknownTensorTypeKeptAtOpenRejectedAtDequantize) {
  TempDir dir;
  auto g = open_bytes(dir, Builder().header(2, 0).tensor("odd", {8}, 99, 0).tensor("w", {4}, 0, 32).pad()
                               .bytes(64).data());
  const GGUFTensor* t = g->find("odd");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, 99u);
  EXPECT_EQ(t->nbytes, 0u);
  EXPECT_STREQ(ggml_type_name(99), "type 99");
  std::vector<float> out(8);
  expect_error([&] { dequantize_gguf_tensor(*t, out.data()); }, ErrorCode::kUnsupported, "got type 99");
  EXPECT_EQ(g->find("w")->nbytes, 16u);
}

TEST(GGUFCorrupt, TruncatedFiles) {
  // Every prefix of the header region and a sample of data-region cuts: always kCorrupt, never a crash (the
  // sanitizer build checks no byte outside the mapping is read).
  TempDir dir;
  const auto bytes = read_bytes(kDir + "tensors.gguf");
  const auto& tensors = file_entry("tensors.gguf").at("tensors");
  const size_t data_start = tensors[0].at("data_offset");
  std::vector<size_t> cuts;
  for (size_t n = 0; n < data_start; ++n) cuts.push_back(n);
  for (const auto& t : tensors) cuts.push_back(t.at("data_offset").get<size_t>() + t.at("n_bytes").get<size_t>() - 1);
  for (size_t n : cuts) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    try {
      open_bytes(dir, cut);
      ADD_FAILURE() << "a file cut to " << n << " bytes was accepted";
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), ErrorCode::kCorrupt) << n << ": " << e.what();
    }
  }
}

TEST(GGUFCorrupt, RandomByteFlipsNeverCrash) {
  // Random corruption of the header region: open either succeeds (then every supported tensor dequantizes) or
  // throws cider::Error. Under ASan/UBSan this is the out-of-bounds check.
  TempDir dir;
  const auto bytes = read_bytes(kDir + "tensors.gguf");
  const size_t data_start = file_entry("tensors.gguf").at("tensors")[0].at("data_offset");
  auto rng = test::make_rng(7);
  int opened = 0, rejected = 0;
  for (int iter = 0; iter < 400; ++iter) {
    auto b = bytes;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % data_start] = static_cast<uint8_t>(rng());
    try {
      auto g = open_bytes(dir, b);
      for (const auto& t : g->tensors()) {
        if (t.nbytes == 0) continue;  // unknown type or empty: nothing to decode (and numel may be anything)
        std::vector<float> out(static_cast<size_t>(std::max<int64_t>(t.numel(), 0)));
        try {
          dequantize_gguf_tensor(t, out.data());
        } catch (const Error&) {
        }
      }
      ++opened;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_EQ(opened + rejected, 400);
  EXPECT_GT(rejected, 0);
}

TEST(GGUFCorrupt, DequantizeChecksHandMadeTensors) {
  std::vector<uint8_t> block(34, 0);
  std::vector<float> out(64);
  GGUFTensor t;
  t.name = "x";
  t.type = static_cast<uint32_t>(GGMLType::kQ8_0);
  t.shape = {1, 32};
  t.data = block.data();
  t.nbytes = 33;
  expect_error([&] { dequantize_gguf_tensor(t, out.data()); }, ErrorCode::kCorrupt, "byte size must be 34");
  t.shape = {1, 16};
  t.nbytes = 34;
  expect_error([&] { dequantize_gguf_tensor(t, out.data()); }, ErrorCode::kCorrupt, "block size 32; got 16");
  t.shape = {1, 32};
  t.data = nullptr;
  expect_error([&] { dequantize_gguf_tensor(t, out.data()); }, ErrorCode::kInvalidArgument, "non-null");
  t.data = block.data();
  block[0] = 0x00;
  block[1] = 0x3c;  // d = 1.0
  block[2] = static_cast<uint8_t>(-7);
  dequantize_gguf_tensor(t, out.data());
  EXPECT_EQ(out[0], -7.0f);
  EXPECT_EQ(out[1], 0.0f);
}

}  // namespace
}  // namespace cider::model
