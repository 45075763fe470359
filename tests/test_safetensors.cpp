// Safetensors: the reader against a file written by Hugging Face's `safetensors` package
// (tools/gen_safetensors_fixture.py -> tests/data/safetensors/), writer -> reader round trips for every dtype and odd
// shapes, sharded directories, and one test per rejected input (corrupt files are made by mutating valid ones).
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "support/test_support.h"

namespace cider::model {
namespace {

namespace fs = std::filesystem;

const std::string kDir = std::string(CIDER_SOURCE_DIR) + "/tests/data/safetensors/";

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::remove(path.c_str());  // a fresh file, not an in-place rewrite (see test_gguf.cpp)
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

void write_text(const std::string& path, const std::string& s) {
  write_bytes(path, std::vector<uint8_t>(s.begin(), s.end()));
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "cider_st_XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

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

DType dtype_from_name(const std::string& s) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8, DType::kU8, DType::kI32, DType::kU32,
                  DType::kBool, DType::kF64})
    if (s == safetensors_dtype_name(t)) return t;
  throw std::runtime_error("unknown dtype " + s);
}

// Element i of a tensor's data as a double (exact for every dtype here except the 64-bit integers, not used).
double element(const StTensor& t, size_t i) {
  const uint8_t* p = t.data + i * static_cast<size_t>(dtype_size(t.dtype));
  switch (t.dtype) {
    case DType::kF32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::kF64: { double v; std::memcpy(&v, p, 8); return v; }
    case DType::kF16: { uint16_t v; std::memcpy(&v, p, 2); return f16_to_f32(v); }
    case DType::kBF16: { uint16_t v; std::memcpy(&v, p, 2); return bf16_to_f32(v); }
    case DType::kI32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::kU32: { uint32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::kI8: return static_cast<int8_t>(*p);
    case DType::kU8: case DType::kBool: return *p;
  }
  return 0;
}

// The header of a safetensors file as JSON, and a file rebuilt from a (possibly edited) header and the same data.
struct Parsed {
  nlohmann::ordered_json header;
  std::vector<uint8_t> data;
};
Parsed split(const std::vector<uint8_t>& file) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[static_cast<size_t>(i)];
  Parsed p;
  p.header = nlohmann::ordered_json::parse(file.begin() + 8, file.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  p.data.assign(file.begin() + 8 + static_cast<std::ptrdiff_t>(n), file.end());
  return p;
}
std::vector<uint8_t> join(const std::string& header_text, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  out.reserve(8 + header_text.size() + data.size());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(header_text.size() >> (8 * i)));
  for (char c : header_text) out.push_back(static_cast<uint8_t>(c));
  for (uint8_t b : data) out.push_back(b);
  return out;
}
std::vector<uint8_t> join(const nlohmann::ordered_json& header, const std::vector<uint8_t>& data) {
  return join(header.dump(), data);
}

// A small valid file written by cider's writer: a [2, 3] f32 tensor "a" then a [4] f16 tensor "b".
std::vector<uint8_t> valid_file(const TempDir& dir) {
  static const float a[6] = {1, 2, 3, 4, 5, 6};
  static const uint16_t b[4] = {0x3c00, 0x4000, 0x4200, 0x4400};
  SafetensorsWriter w;
  w.add("a", DType::kF32, {2, 3}, a);
  w.add("b", DType::kF16, {4}, b);
  w.set_metadata("format", "pt");
  w.write(dir.file("valid.safetensors"));
  return read_bytes(dir.file("valid.safetensors"));
}

void expect_open_error(const std::vector<uint8_t>& bytes, ErrorCode code, const std::string& needle) {
  TempDir dir;
  const std::string p = dir.file("bad.safetensors");
  write_bytes(p, bytes);
  expect_error([&] { SafetensorsFile::open(p); }, code, needle);
}

// ---------------------------------------------------------------------------------------------------------------

TEST(Safetensors, ReadsFileWrittenByHuggingFaceSafetensors) {
  std::ifstream in(kDir + "expected.json");
  ASSERT_TRUE(in) << kDir;
  const auto expected = nlohmann::json::parse(in);
  auto f = SafetensorsFile::open(kDir + "reference.safetensors");
  using StringMap = std::map<std::string, std::string>;
  EXPECT_EQ(f->metadata(), expected.at("metadata").get<StringMap>());
  const auto& tensors = expected.at("tensors");
  ASSERT_EQ(f->tensors().size(), tensors.size());
  for (auto it = tensors.begin(); it != tensors.end(); ++it) {
    SCOPED_TRACE(it.key());
    const StTensor* t = f->find(it.key());
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->name, it.key());
    EXPECT_EQ(t->dtype, dtype_from_name(it.value().at("dtype")));
    EXPECT_EQ(t->shape, it.value().at("shape").get<std::vector<int64_t>>());
    const auto& values = it.value().at("values");
    ASSERT_EQ(static_cast<size_t>(t->view().numel()), values.size());
    EXPECT_EQ(t->nbytes, values.size() * static_cast<size_t>(dtype_size(t->dtype)));
    for (size_t i = 0; i < values.size(); ++i) {
      const double want = values[i].is_boolean() ? (values[i].get<bool>() ? 1.0 : 0.0) : values[i].get<double>();
      ASSERT_EQ(element(*t, i), want) << i;
    }
  }
  EXPECT_EQ(f->find("absent"), nullptr);
}

TEST(Safetensors, RoundTripEveryDtypeAndOddShapes) {
  TempDir dir;
  auto rng = test::make_rng(1);
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {1}, {7}, {3, 5}, {3, 0, 2}, {2, 3, 5}, {1, 1, 1, 13}};
  const std::vector<DType> dtypes = {DType::kF32, DType::kF16, DType::kBF16, DType::kI8,  DType::kU8,
                                     DType::kI32, DType::kU32, DType::kBool, DType::kF64};
  struct Want {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Want> wants;
  for (DType t : dtypes) {
    for (const auto& s : shapes) {
      Want w{std::string(safetensors_dtype_name(t)) + ".r" + std::to_string(s.size()) + "." +
                 std::to_string(wants.size()),
             t, s, {}};
      int64_t n = 1;
      for (int64_t d : s) n *= d;
      w.bytes.resize(static_cast<size_t>(n) * static_cast<size_t>(dtype_size(t)));
      for (auto& b : w.bytes) b = static_cast<uint8_t>(t == DType::kBool ? rng() % 2 : rng());
      wants.push_back(std::move(w));
    }
  }
  SafetensorsWriter writer;
  for (const auto& w : wants) writer.add(w.name, w.dtype, w.shape, w.bytes.empty() ? nullptr : w.bytes.data());
  writer.set_metadata("format", "cider");
  writer.set_metadata("unicode", "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93");
  writer.set_metadata("", "empty key");
  const std::string path = dir.file("rt.safetensors");
  writer.write(path);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f->tensors().size(), wants.size());
  EXPECT_EQ(f->metadata(), (std::map<std::string, std::string>{
                               {"format", "cider"}, {"unicode", "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93"}, {"", "empty key"}}));
  for (const auto& w : wants) {
    SCOPED_TRACE(w.name);
    const StTensor* t = f->find(w.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, w.dtype);
    EXPECT_EQ(t->shape, w.shape);
    ASSERT_EQ(t->nbytes, w.bytes.size());
    if (!w.bytes.empty()) {
      EXPECT_EQ(std::memcmp(t->data, w.bytes.data(), w.bytes.size()), 0);
    }
    // Every tensor is naturally aligned in the mapping (the writer's layout guarantee).
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % static_cast<uintptr_t>(dtype_size(t->dtype)), 0u);
    TensorView v = t->view();
    EXPECT_EQ(v.rank, static_cast<int>(w.shape.size()));
    EXPECT_EQ(v.dtype, w.dtype);
  }

  // The layout the official reader requires: header length a multiple of 8, data packed without gaps and filling
  // the data area exactly.
  const auto bytes = read_bytes(path);
  Parsed p = split(bytes);
  EXPECT_EQ((bytes.size() - p.data.size()) % 8, 0u);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = p.header.begin(); it != p.header.end(); ++it)
    if (it.key() != "__metadata__") ranges.emplace_back(it.value()["data_offsets"][0], it.value()["data_offsets"][1]);
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = 0;
  for (const auto& r : ranges) {
    EXPECT_EQ(r.first, at);
    at = r.second;
  }
  EXPECT_EQ(at, p.data.size());
  // Header entries are in add() order.
  auto it = p.header.begin();
  EXPECT_EQ(it.key(), "__metadata__");
  for (const auto& w : wants) EXPECT_EQ((++it).key(), w.name);
}

TEST(Safetensors, EmptyFileOfNoTensors) {
  TempDir dir;
  SafetensorsWriter().write(dir.file("none.safetensors"));
  auto f = SafetensorsFile::open(dir.file("none.safetensors"));
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_TRUE(f->metadata().empty());
  EXPECT_EQ(read_bytes(dir.file("none.safetensors")).size(), 16u);  // 8 + "{}" padded to 8
}

TEST(Safetensors, HeaderPaddedWithSpacesAndGapsAreAccepted) {
  // Other writers pad the header with spaces; gaps in the data area are harmless and accepted.
  TempDir dir;
  Parsed p = split(valid_file(dir));
  p.header["b"]["data_offsets"] = {32, 40};
  std::vector<uint8_t> data = p.data;
  data.resize(40);
  std::memcpy(data.data() + 32, p.data.data() + 24, 8);
  const std::string path = dir.file("padded.safetensors");
  write_bytes(path, join(p.header.dump() + std::string(13, ' '), data));
  auto f = SafetensorsFile::open(path);
  ASSERT_NE(f->find("b"), nullptr);
  EXPECT_EQ(element(*f->find("b"), 3), 4.0);
  EXPECT_EQ(element(*f->find("a"), 5), 6.0);
}

TEST(Safetensors, WriterReplacesAtomicallyAndCleansUpOnFailure) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  const float x = 1.0f, y = 2.0f;
  SafetensorsWriter w1;
  w1.add("x", DType::kF32, {1}, &x);
  w1.write(path);
  SafetensorsWriter w2;
  w2.add("y", DType::kF32, {1}, &y);
  w2.write(path);  // overwrites
  auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->find("x"), nullptr);
  ASSERT_NE(f->find("y"), nullptr);

  // Cannot create the temporary file: kIo, nothing left behind.
  expect_error([&] { w1.write(dir.file("no/such/dir/m.safetensors")); }, ErrorCode::kIo, "no/such/dir");
  // The rename fails (the target is a non-empty directory): kIo, the temporary file is removed.
  fs::create_directory(dir.file("occupied"));
  write_text(dir.file("occupied/keep"), "x");
  expect_error([&] { w1.write(dir.file("occupied")); }, ErrorCode::kIo, "cannot rename");
  EXPECT_FALSE(fs::exists(dir.file("occupied.tmp")));
  EXPECT_TRUE(fs::exists(dir.file("occupied/keep")));
}

TEST(Safetensors, WriterRejectsBadTensors) {
  const float x[2] = {0, 0};
  SafetensorsWriter w;
  w.add("x", DType::kF32, {2}, x);
  expect_error([&] { w.add("x", DType::kF32, {2}, x); }, ErrorCode::kInvalidArgument, "unique; got 'x' twice");
  expect_error([&] { w.add("", DType::kF32, {2}, x); }, ErrorCode::kInvalidArgument, "non-empty");
  expect_error([&] { w.add("__metadata__", DType::kF32, {2}, x); }, ErrorCode::kInvalidArgument, "__metadata__");
  expect_error([&] { w.add("n", DType::kF32, {2, -1}, x); }, ErrorCode::kInvalidArgument, ">= 0; got (2, -1)");
  expect_error([&] { w.add("z", DType::kF32, {2}, nullptr); }, ErrorCode::kInvalidArgument, "non-null");
  expect_error([&] { w.add("r", DType::kF32, {1, 1, 1, 1, 1, 1, 1, 1, 1}, x); }, ErrorCode::kInvalidArgument,
               "rank must be at most 8; got 9");
  expect_error([&] { w.add("big", DType::kF64, {int64_t{1} << 40, int64_t{1} << 40}, x); },
               ErrorCode::kInvalidArgument, "fit in 64 bits");
  SafetensorsWriter bad_utf8;
  bad_utf8.add("\xff\xfe", DType::kF32, {2}, x);
  TempDir dir;
  expect_error([&] { bad_utf8.write(dir.file("u.safetensors")); }, ErrorCode::kInvalidArgument, "UTF-8");
  EXPECT_FALSE(fs::exists(dir.file("u.safetensors.tmp")));
}

// ---------------------------------------------------------------------------------------------------------------
// Directories

TEST(SafetensorsSet, SingleFileDirectoryAndOpenFile) {
  TempDir dir;
  const auto bytes = valid_file(dir);
  write_bytes(dir.file("model.safetensors"), bytes);
  for (const auto& set : {SafetensorsSet::open_dir(dir.path()), SafetensorsSet::open_dir(dir.path() + "/"),
                          SafetensorsSet::open_file(dir.file("model.safetensors"))}) {
    EXPECT_EQ(set.names(), (std::vector<std::string>{"a", "b"}));
    ASSERT_NE(set.find("a"), nullptr);
    EXPECT_EQ(element(*set.find("a"), 4), 5.0);
    EXPECT_EQ(set.find("c"), nullptr);
    EXPECT_EQ(set.metadata().at("format"), "pt");
  }
}

// Three shards written by cider's writer plus an index.json; returns the tensor values by name.
std::map<std::string, std::vector<float>> write_sharded(const TempDir& dir, nlohmann::json* index_out) {
  std::map<std::string, std::vector<float>> values;
  nlohmann::json wm = nlohmann::json::object();
  auto rng = test::make_rng(2);
  for (int s = 0; s < 3; ++s) {
    const std::string shard = "model-0000" + std::to_string(s + 1) + "-of-00003.safetensors";
    SafetensorsWriter w;
    w.set_metadata("shard", std::to_string(s));
    for (int k = 0; k < 3; ++k) {
      const std::string name = "layers." + std::to_string(s) + ".w" + std::to_string(k);
      values[name] = test::randn(rng, static_cast<size_t>(5 + k));
      w.add(name, DType::kF32, {static_cast<int64_t>(values[name].size())}, values[name].data());
      wm[name] = shard;
    }
    w.write(dir.file(shard));
  }
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", wm}};
  write_text(dir.file("model.safetensors.index.json"), index.dump(1));
  if (index_out) *index_out = index;
  return values;
}

TEST(SafetensorsSet, ShardedDirectoryWithIndex) {
  TempDir dir;
  auto values = write_sharded(dir, nullptr);
  auto set = SafetensorsSet::open_dir(dir.path());
  std::vector<std::string> want;
  for (const auto& kv : values) want.push_back(kv.first);
  EXPECT_EQ(set.names(), want);
  for (const auto& [name, v] : values) {
    SCOPED_TRACE(name);
    const StTensor* t = set.find(name);
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->nbytes, v.size() * 4);
    EXPECT_EQ(std::memcmp(t->data, v.data(), t->nbytes), 0);
  }
  EXPECT_EQ(set.metadata().at("shard"), "0");  // the first shard's
  // Each shard is mapped once: tensors of one shard sit in one mapping, at their header offsets' distance.
  const StTensor* w0 = set.find("layers.1.w0");
  const StTensor* w2 = set.find("layers.1.w2");
  auto shard = SafetensorsFile::open(dir.file("model-00002-of-00003.safetensors"));
  EXPECT_EQ(w2->data - w0->data, shard->find("layers.1.w2")->data - shard->find("layers.1.w0")->data);
}

TEST(SafetensorsSet, IndexErrors) {
  {
    TempDir dir;
    nlohmann::json index;
    write_sharded(dir, &index);
    index["weight_map"]["extra"] = "model-00009-of-00003.safetensors";
    write_text(dir.file("model.safetensors.index.json"), index.dump());
    expect_error([&] { SafetensorsSet::open_dir(dir.path()); }, ErrorCode::kCorrupt,
                 "names shard 'model-00009-of-00003.safetensors' (for tensor 'extra'), which must exist");
  }
  {
    TempDir dir;
    nlohmann::json index;
    write_sharded(dir, &index);
    index["weight_map"]["layers.9.w0"] = "model-00001-of-00003.safetensors";
    write_text(dir.file("model.safetensors.index.json"), index.dump());
    expect_error([&] { SafetensorsSet::open_dir(dir.path()); }, ErrorCode::kCorrupt,
                 "places tensor 'layers.9.w0' in 'model-00001-of-00003.safetensors', which must contain it");
  }
  {
    TempDir dir;
    nlohmann::json index;
    write_sharded(dir, &index);
    index["weight_map"]["layers.0.w0"] = "../model-00001-of-00003.safetensors";
    write_text(dir.file("model.safetensors.index.json"), index.dump());
    expect_error([&] { SafetensorsSet::open_dir(dir.path()); }, ErrorCode::kCorrupt, "plain file name");
  }
  {
    TempDir dir;
    write_sharded(dir, nullptr);
    write_text(dir.file("model.safetensors.index.json"), "{\"weight_map\": {\"a\": ");
    expect_error([&] { SafetensorsSet::open_dir(dir.path()); }, ErrorCode::kCorrupt, "must be valid JSON");
    write_text(dir.file("model.safetensors.index.json"), "{\"metadata\": {}}");
    expect_error([&] { SafetensorsSet::open_dir(dir.path()); }, ErrorCode::kCorrupt, "\"weight_map\" object");
    write_text(dir.file("model.safetensors.index.json"), "{\"weight_map\": {\"a\": 3}}");
    expect_error([&] { SafetensorsSet::open_dir(dir.path()); }, ErrorCode::kCorrupt, "must be a shard file name");
    write_text(dir.file("model.safetensors.index.json"), "{\"weight_map\": {}}");
    expect_error([&] { SafetensorsSet::open_dir(dir.path()); }, ErrorCode::kCorrupt, "at least one tensor");
  }
  {
    TempDir dir;
    expect_error([&] { SafetensorsSet::open_dir(dir.path()); }, ErrorCode::kIo, "must contain model.safetensors");
    expect_error([&] { SafetensorsSet::open_dir(dir.file("absent")); }, ErrorCode::kIo, "absent");
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Rejections of corrupt files (each made by mutating a valid one)

TEST(SafetensorsCorrupt, MissingFile) {
  TempDir dir;
  expect_error([&] { SafetensorsFile::open(dir.file("absent.safetensors")); }, ErrorCode::kIo, "absent.safetensors");
}

TEST(SafetensorsCorrupt, TruncatedFile) {
  TempDir dir;
  const auto bytes = valid_file(dir);
  for (size_t n : {size_t{0}, size_t{5}}) {
    expect_open_error(std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n)),
                      ErrorCode::kCorrupt, "at least the 8-byte header length; got " + std::to_string(n));
  }
  // Cut inside the header: its length now reaches past the end.
  expect_open_error(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 20), ErrorCode::kCorrupt,
                    "header length must be at most the file size - 8 = 12");
  // Cut inside the data: the last tensor's offsets leave the data area.
  expect_open_error(std::vector<uint8_t>(bytes.begin(), bytes.end() - 1), ErrorCode::kCorrupt,
                    "must lie inside the data area of 31 bytes");
  // Every cut is rejected with kCorrupt (and, under the sanitizers, reads nothing outside the mapping).
  for (size_t n = 0; n < bytes.size(); ++n) {
    write_bytes(dir.file("c"), std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n)));
    try {
      SafetensorsFile::open(dir.file("c"));
      ADD_FAILURE() << "cut at " << n << " accepted";
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
    }
  }
}

TEST(SafetensorsCorrupt, HeaderLengthBeyondFile) {
  TempDir dir;
  auto bytes = valid_file(dir);
  const uint64_t size = bytes.size();
  for (uint64_t n : {size - 7, size, ~uint64_t{0}}) {
    auto b = bytes;
    for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
    expect_open_error(b, ErrorCode::kCorrupt, "header length must be at most the file size - 8 = " +
                                                  std::to_string(size - 8) + "; got " + std::to_string(n));
  }
  auto zero = bytes;
  std::memset(zero.data(), 0, 8);
  expect_open_error(zero, ErrorCode::kCorrupt, "must hold a JSON object (>= 2 bytes); got 0");
}

TEST(SafetensorsCorrupt, InvalidJson) {
  TempDir dir;
  auto bytes = valid_file(dir);
  auto b = bytes;
  b[8] = '[';  // the opening brace
  expect_open_error(b, ErrorCode::kCorrupt, "the header must be valid JSON");
  Parsed p = split(bytes);
  expect_open_error(join(std::string("[1, 2]  "), p.data), ErrorCode::kCorrupt, "must be a JSON object; got array");
  expect_open_error(join(std::string("{\"a\": 1,}"), p.data), ErrorCode::kCorrupt, "valid JSON");
  expect_open_error(join(std::string("{\"a\": \"\xff\"}"), p.data), ErrorCode::kCorrupt, "valid JSON");
  // Two entries for one name: nlohmann would silently keep the last.
  std::string text = p.header.dump();
  text.insert(1, "\"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, ");
  expect_open_error(join(text, p.data), ErrorCode::kCorrupt, "header keys must be unique; got 'b' twice");
}

TEST(SafetensorsCorrupt, UnknownDtype) {
  TempDir dir;
  Parsed p = split(valid_file(dir));
  auto h = p.header;
  h["a"]["dtype"] = "Q32";
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "tensor 'a' dtype must be a safetensors dtype; got 'Q32'");
  h["a"]["dtype"] = 32;
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "dtype must be a string; got 32");
  // A real safetensors dtype cider has no element type for is a valid file it cannot use.
  h["a"]["dtype"] = "I64";
  expect_open_error(join(h, p.data), ErrorCode::kUnsupported, "got I64");
}

TEST(SafetensorsCorrupt, BadShapes) {
  TempDir dir;
  Parsed p = split(valid_file(dir));
  auto h = p.header;
  h["a"]["shape"] = {2, -3};
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "shape entries must be non-negative integers; got [2,-3]");
  h["a"]["shape"] = {2, 3.0};
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "non-negative integers");
  h["a"]["shape"] = "6";
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "shape must be an array");
  h["a"]["shape"] = {uint64_t{1} << 62, 16};
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "must fit in 64 bits");
  h["a"]["shape"] = std::vector<int>(9, 1);
  expect_open_error(join(h, p.data), ErrorCode::kUnsupported, "rank must be at most 8; got 9");
  h = p.header;
  h["a"].erase("shape");
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "must have a 'shape' field");
  h = p.header;
  h["a"] = "x";
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "tensor 'a' must be an object");
}

TEST(SafetensorsCorrupt, OffsetsOutsideData) {
  TempDir dir;
  Parsed p = split(valid_file(dir));
  auto h = p.header;
  h["b"]["data_offsets"] = {32, 40};
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt,
                    "tensor 'b' data_offsets must lie inside the data area of 32 bytes; got [32, 40]");
  h["b"]["data_offsets"] = {~uint64_t{0} - 7, ~uint64_t{0}};
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "two non-negative integers");
  h["b"]["data_offsets"] = {30, 22};
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "begin <= end; got [30, 22]");
  h["b"]["data_offsets"] = {24};
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "two non-negative integers");
  h["b"]["data_offsets"] = {-8, 0};
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "two non-negative integers");
}

TEST(SafetensorsCorrupt, SizeMismatch) {
  TempDir dir;
  Parsed p = split(valid_file(dir));
  auto h = p.header;
  h["a"]["shape"] = {2, 2};
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "tensor 'a' byte size end - begin must be numel x dtype "
                                                          "size = 16 for F32 (2, 2); got 24");
  h = p.header;
  h["b"]["dtype"] = "F32";
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "must be numel x dtype size = 16 for F32 (4); got 8");
}

TEST(SafetensorsCorrupt, OverlappingTensors) {
  TempDir dir;
  Parsed p = split(valid_file(dir));
  auto h = p.header;
  h["b"]["data_offsets"] = {20, 28};
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt,
                    "must not overlap; got 'b' at [20, 28) overlapping 'a' ending at 24");
  // Two tensors on the very same bytes overlap too.
  h["b"]["dtype"] = "F32";
  h["b"]["shape"] = {2, 3};
  h["b"]["data_offsets"] = {0, 24};
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "must not overlap");
  // Empty tensors occupy no bytes and may sit anywhere in the data area.
  h = p.header;
  h["e"] = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {4, 4}}};
  TempDir d2;
  write_bytes(d2.file("e"), join(h, p.data));
  EXPECT_EQ(SafetensorsFile::open(d2.file("e"))->find("e")->nbytes, 0u);
}

TEST(SafetensorsCorrupt, BadMetadata) {
  TempDir dir;
  Parsed p = split(valid_file(dir));
  auto h = p.header;
  h["__metadata__"]["n"] = 3;
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "__metadata__ value of 'n' must be a string; got 3");
  h["__metadata__"] = {1, 2};
  expect_open_error(join(h, p.data), ErrorCode::kCorrupt, "__metadata__ must be an object of strings");
}

TEST(SafetensorsCorrupt, RandomByteFlipsNeverCrash) {
  TempDir dir;
  const auto bytes = valid_file(dir);
  Parsed p = split(bytes);
  const size_t header_end = bytes.size() - p.data.size();
  auto rng = test::make_rng(3);
  int opened = 0, rejected = 0;
  for (int iter = 0; iter < 300; ++iter) {
    auto b = bytes;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) b[rng() % header_end] = static_cast<uint8_t>(rng());
    write_bytes(dir.file("f"), b);
    try {
      auto f = SafetensorsFile::open(dir.file("f"));
      for (const auto& t : f->tensors()) {
        // Whatever was accepted is consistent: inside the file and sized by its dtype and shape.
        EXPECT_EQ(t.nbytes, static_cast<size_t>(t.view().numel()) * static_cast<size_t>(dtype_size(t.dtype)));
        unsigned sum = 0;  // touch every byte: an accepted tensor must lie inside the mapping
        for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
        (void)sum;
      }
      ++opened;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_EQ(opened + rejected, 300);
  EXPECT_GT(rejected, 0);
}

}  // namespace
}  // namespace cider::model
