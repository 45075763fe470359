// Safetensors reading (memory-mapped, validated before anything is returned) and writing.
//
// File layout (all little-endian):
//   [0, 8)            u64 N, the header length
//   [8, 8 + N)        JSON object: name -> {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
//                     plus an optional "__metadata__": {string: string}; may be padded with trailing spaces
//   [8 + N, size)     the data area; a tensor's bytes are data_area[begin, end)
// Validation rules (each violation is kCorrupt naming the file, the tensor and the value; dtypes that safetensors
// defines but cider has no DType for are kUnsupported): see docs/checkpoint_formats.md.
#include "model/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "core/limits.h"
#include "model/json_brief.h"

namespace cider::model {

namespace {

constexpr const char* kOp = "safetensors";
constexpr const char* kMetadataKey = "__metadata__";

// Safetensors dtype names cider reads, and their DType.
struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypeNames[] = {
    {"F32", DType::kF32}, {"F16", DType::kF16}, {"BF16", DType::kBF16}, {"I8", DType::kI8},   {"U8", DType::kU8},
    {"I32", DType::kI32}, {"U32", DType::kU32}, {"BOOL", DType::kBool}, {"F64", DType::kF64},
};
// Dtypes the safetensors format defines but cider has no element type for: a valid file, an unsupported request.
constexpr const char* kKnownUnsupported[] = {"I16",     "U16",     "I64",     "U64",  "F8_E4M3", "F8_E5M2",
                                             "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",   "C64"};

bool parse_dtype(const std::string& s, DType* out) {
  for (const auto& d : kDTypeNames) {
    if (s == d.name) {
      *out = d.dtype;
      return true;
    }
  }
  return false;
}

bool is_known_unsupported(const std::string& s) {
  for (const char* n : kKnownUnsupported)
    if (s == n) return true;
  return false;
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Reads a JSON value as a non-negative integer that fits int64; false for anything else (floats, negatives, strings).
bool json_to_nonneg(const nlohmann::json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = v;
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}


// Parses the header, noting whether any key appears twice at the top level (nlohmann would keep the last silently,
// and two entries for one tensor name is a corrupt file, not something to guess about).
nlohmann::json parse_header(const std::string& path, const char* begin, const char* end) {
  std::string duplicate;
  std::set<std::string> seen;
  nlohmann::json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t event,
                                             nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key && parsed.is_string()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  check_json_nesting(begin, end, kOp, "'" + path + "': the header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(begin, end, cb, /*allow_exceptions=*/true);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kCorrupt, kOp, "'", path, "': the header must be valid JSON; got a parse error: ", e.what());
  }
  check(header.is_object(), ErrorCode::kCorrupt, kOp, "'", path, "': the header must be a JSON object; got ",
        header.type_name());
  check(duplicate.empty(), ErrorCode::kCorrupt, kOp, "'", path, "': header keys must be unique; got '", duplicate,
        "' twice");
  return header;
}

}  // namespace

const char* safetensors_dtype_name(DType t) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  return "?";
}

// ---------------------------------------------------------------------------------------------------------------
// SafetensorsFile

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto st = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  st->file_ = MappedFile::open(path);
  const uint8_t* base = st->file_->data();
  const uint64_t size = st->file_->size();

  check(size >= 8, ErrorCode::kCorrupt, kOp, "'", path, "': the file must hold at least the 8-byte header length; got ",
        size, " bytes");
  const uint64_t n = read_u64_le(base);
  check(n <= size - 8, ErrorCode::kCorrupt, kOp, "'", path,
        "': the header length must be at most the file size - 8 = ", size - 8, "; got ", n);
  check(n >= 2, ErrorCode::kCorrupt, kOp, "'", path, "': the header must hold a JSON object (>= 2 bytes); got ", n,
        " bytes");
  const char* hbegin = reinterpret_cast<const char*>(base + 8);
  nlohmann::json header = parse_header(path, hbegin, hbegin + n);

  const uint64_t data_size = size - 8 - n;
  const uint8_t* data_area = base + 8 + n;

  struct Range {
    uint64_t begin, end;
    size_t tensor;
  };
  std::vector<Range> ranges;

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& e = it.value();
    if (name == kMetadataKey) {
      check(e.is_object(), ErrorCode::kCorrupt, kOp, "'", path, "': __metadata__ must be an object of strings; got ",
            brief(e));
      for (auto m = e.begin(); m != e.end(); ++m) {
        check(m.value().is_string(), ErrorCode::kCorrupt, kOp, "'", path, "': __metadata__ value of '", m.key(),
              "' must be a string; got ", brief(m.value()));
        st->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    check(e.is_object(), ErrorCode::kCorrupt, kOp, "'", path, "': tensor '", name,
          "' must be an object {dtype, shape, data_offsets}; got ", brief(e));
    for (const char* field : {"dtype", "shape", "data_offsets"})
      check(e.contains(field), ErrorCode::kCorrupt, kOp, "'", path, "': tensor '", name, "' must have a '", field,
            "' field; got ", brief(e));

    StTensor t;
    t.name = name;
    const auto& jd = e.at("dtype");
    check(jd.is_string(), ErrorCode::kCorrupt, kOp, "'", path, "': tensor '", name, "' dtype must be a string; got ",
          brief(jd));
    const std::string dname = jd.get<std::string>();
    if (!parse_dtype(dname, &t.dtype)) {
      check(!is_known_unsupported(dname), ErrorCode::kUnsupported, kOp, "'", path, "': tensor '", name,
            "' dtype must be one of F32, F16, BF16, I8, U8, I32, U32, BOOL, F64; got ", dname);
      fail(ErrorCode::kCorrupt, kOp, "'", path, "': tensor '", name, "' dtype must be a safetensors dtype; got '",
           dname, "'");
    }

    const auto& js = e.at("shape");
    check(js.is_array(), ErrorCode::kCorrupt, kOp, "'", path, "': tensor '", name, "' shape must be an array; got ",
          brief(js));
    check(js.size() <= static_cast<size_t>(kMaxRank), ErrorCode::kUnsupported, kOp, "'", path, "': tensor '", name,
          "' rank must be at most ", kMaxRank, "; got ", js.size());
    // numel * element size must not overflow; anything beyond the data area fails the size check below anyway.
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : js) {
      uint64_t v = 0;
      check(json_to_nonneg(d, &v), ErrorCode::kCorrupt, kOp, "'", path, "': tensor '", name,
            "' shape entries must be non-negative integers; got ", brief(js));
      t.shape.push_back(static_cast<int64_t>(v));
      if (v != 0 && numel > std::numeric_limits<uint64_t>::max() / v) overflow = true;
      numel *= v;
    }
    const uint64_t esize = static_cast<uint64_t>(dtype_size(t.dtype));
    if (numel > std::numeric_limits<uint64_t>::max() / esize) overflow = true;
    check(!overflow, ErrorCode::kCorrupt, kOp, "'", path, "': tensor '", name,
          "' shape's byte size must fit in 64 bits; got shape ", shape_string(t.shape));
    const uint64_t want = numel * esize;

    const auto& jo = e.at("data_offsets");
    uint64_t b = 0, en = 0;
    check(jo.is_array() && jo.size() == 2 && json_to_nonneg(jo[0], &b) && json_to_nonneg(jo[1], &en),
          ErrorCode::kCorrupt, kOp, "'", path, "': tensor '", name,
          "' data_offsets must be two non-negative integers [begin, end]; got ", brief(jo));
    check(b <= en, ErrorCode::kCorrupt, kOp, "'", path, "': tensor '", name,
          "' data_offsets must have begin <= end; got [", b, ", ", en, "]");
    check(en <= data_size, ErrorCode::kCorrupt, kOp, "'", path, "': tensor '", name,
          "' data_offsets must lie inside the data area of ", data_size, " bytes; got [", b, ", ", en, "]");
    check(en - b == want, ErrorCode::kCorrupt, kOp, "'", path, "': tensor '", name, "' byte size end - begin must be ",
          "numel x dtype size = ", want, " for ", dname, " ", shape_string(t.shape), "; got ", en - b);

    t.data = data_area + b;
    t.nbytes = static_cast<size_t>(want);
    ranges.push_back({b, en, st->tensors_.size()});
    st->tensors_.push_back(std::move(t));
  }

  // No two tensors may share a byte (empty tensors occupy none).
  std::sort(ranges.begin(), ranges.end(), [](const Range& x, const Range& y) {
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  uint64_t prev_end = 0;
  size_t prev = 0;
  bool have_prev = false;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;
    check(!have_prev || r.begin >= prev_end, ErrorCode::kCorrupt, kOp, "'", path,
          "': tensor data must not overlap; got '", st->tensors_[r.tensor].name, "' at [", r.begin, ", ", r.end,
          ") overlapping '", st->tensors_[prev].name, "' ending at ", prev_end);
    prev_end = r.end;
    prev = r.tensor;
    have_prev = true;
  }

  // Keep file order (by data offset) for tensors(): it is the order the writer laid them out.
  std::vector<StTensor> ordered;
  ordered.reserve(st->tensors_.size());
  for (const Range& r : ranges) ordered.push_back(std::move(st->tensors_[r.tensor]));
  st->tensors_ = std::move(ordered);
  for (size_t i = 0; i < st->tensors_.size(); ++i) st->index_[st->tensors_[i].name] = i;
  return st;
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------------------------
// SafetensorsSet

namespace {

bool file_exists(const std::string& path) {
  struct stat s {};
  return ::stat(path.c_str(), &s) == 0;
}

}  // namespace

SafetensorsSet SafetensorsSet::open_file(const std::string& path) {
  SafetensorsSet set;
  set.files_.push_back(SafetensorsFile::open(path));
  for (const auto& t : set.files_[0]->tensors()) set.index_[t.name] = &t;
  return set;
}

SafetensorsSet SafetensorsSet::open_dir(const std::string& dir) {
  const char* op = "safetensors_dir";
  const std::string prefix = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  const std::string index_path = prefix + "model.safetensors.index.json";
  if (!file_exists(index_path)) {
    const std::string single = prefix + "model.safetensors";
    check(file_exists(single), ErrorCode::kIo, op, "'", dir,
          "' must contain model.safetensors or model.safetensors.index.json; got neither");
    return open_file(single);
  }

  const std::string text = read_text_input(index_path, op);
  check_json_nesting(text.data(), text.data() + text.size(), op, "'" + index_path + "'");
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kCorrupt, op, "'", index_path, "' must be valid JSON; got a parse error: ", e.what());
  }
  check(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), ErrorCode::kCorrupt,
        op, "'", index_path, "' must be an object with a \"weight_map\" object; got ", brief(index));
  const auto& wm = index["weight_map"];
  check(!wm.empty(), ErrorCode::kCorrupt, op, "'", index_path, "' weight_map must name at least one tensor; got {}");

  // Each shard once, in sorted file-name order (files_[0] is the first shard, whose metadata metadata() returns).
  std::map<std::string, std::vector<std::string>> by_shard;
  for (auto it = wm.begin(); it != wm.end(); ++it) {
    check(it.value().is_string(), ErrorCode::kCorrupt, op, "'", index_path, "' weight_map['", it.key(),
          "'] must be a shard file name; got ", brief(it.value()));
    const std::string shard = it.value().get<std::string>();
    // Shards live beside the index: a name that leaves the directory is not a shard of this model.
    check(!shard.empty() && shard.find('/') == std::string::npos && shard != "." && shard != "..",
          ErrorCode::kCorrupt, op, "'", index_path, "' weight_map['", it.key(),
          "'] must be a plain file name in the same directory; got '", shard, "'");
    by_shard[shard].push_back(it.key());
  }

  SafetensorsSet set;
  for (const auto& [shard, names] : by_shard) {
    const std::string shard_path = prefix + shard;
    check(file_exists(shard_path), ErrorCode::kCorrupt, op, "'", index_path, "' names shard '", shard,
          "' (for tensor '", names.front(), "'), which must exist; got no such file");
    auto f = SafetensorsFile::open(shard_path);
    for (const auto& name : names) {
      const StTensor* t = f->find(name);
      check(t != nullptr, ErrorCode::kCorrupt, op, "'", index_path, "' places tensor '", name, "' in '", shard,
            "', which must contain it; got no such tensor there");
      set.index_[name] = t;
    }
    set.files_.push_back(std::move(f));
  }
  return set;
}

const StTensor* SafetensorsSet::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& kv : index_) out.push_back(kv.first);
  return out;  // std::map iterates in sorted order
}

const std::map<std::string, std::string>& SafetensorsSet::metadata() const {
  static const std::map<std::string, std::string> kEmpty;
  return files_.empty() ? kEmpty : files_.front()->metadata();
}

// ---------------------------------------------------------------------------------------------------------------
// SafetensorsWriter

void SafetensorsWriter::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data) {
  const char* op = "safetensors_writer";
  check(!name.empty(), ErrorCode::kInvalidArgument, op, "tensor names must be non-empty; got \"\"");
  check(name != kMetadataKey, ErrorCode::kInvalidArgument, op, "a tensor must not be named __metadata__; got '", name,
        "'");
  for (const auto& e : entries_)
    check(e.name != name, ErrorCode::kInvalidArgument, op, "tensor names must be unique; got '", name, "' twice");
  check(std::string(safetensors_dtype_name(dtype)) != "?", ErrorCode::kInvalidArgument, op,
        "dtype must be a DType; got ", static_cast<int>(dtype));
  check(shape.size() <= static_cast<size_t>(kMaxRank), ErrorCode::kInvalidArgument, op, "tensor '", name,
        "' rank must be at most ", kMaxRank, "; got ", shape.size());
  uint64_t numel = 1;
  for (int64_t d : shape) {
    check(d >= 0, ErrorCode::kInvalidArgument, op, "tensor '", name, "' dimensions must be >= 0; got ",
          shape_string(shape));
    check(d == 0 || numel <= std::numeric_limits<uint64_t>::max() / 8 / static_cast<uint64_t>(d),
          ErrorCode::kInvalidArgument, op, "tensor '", name, "' byte size must fit in 64 bits; got ",
          shape_string(shape));
    numel *= static_cast<uint64_t>(d);
  }
  check(data != nullptr || numel == 0, ErrorCode::kInvalidArgument, op, "tensor '", name,
        "' data must be non-null for a non-empty tensor; got nullptr for ", shape_string(shape));
  entries_.push_back({name, dtype, shape, data});
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

void SafetensorsWriter::write(const std::string& path) const {
  const char* op = "safetensors_writer";

  // Data layout: tensors sorted by element size, largest first (stable, so add() order within a size), packed
  // back to back. The official safetensors reader rejects gaps between tensors, so alignment cannot come from
  // padding; with power-of-two element sizes in decreasing order every tensor's offset is a multiple of its own
  // element size, and the data area starts 8-aligned in the file (header padded to a multiple of 8), so every
  // tensor is naturally aligned in the mapping.
  std::vector<size_t> order(entries_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return dtype_size(entries_[a].dtype) > dtype_size(entries_[b].dtype);
  });
  std::vector<uint64_t> begin(entries_.size()), nbytes(entries_.size());
  uint64_t offset = 0;
  for (size_t i : order) {
    uint64_t n = static_cast<uint64_t>(dtype_size(entries_[i].dtype));
    for (int64_t d : entries_[i].shape) n *= static_cast<uint64_t>(d);
    begin[i] = offset;
    nbytes[i] = n;
    offset += n;
  }

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    header[kMetadataKey] = std::move(m);
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    header[e.name] = {{"dtype", safetensors_dtype_name(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {begin[i], begin[i] + nbytes[i]}}};
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kInvalidArgument, op, "tensor names and metadata must be valid UTF-8; got: ", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  uint8_t len_bytes[8];
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(len >> (8 * i));

  AtomicFile out(path, op);
  out.write(len_bytes, 8);
  out.write(text.data(), text.size());
  for (size_t i : order) out.write(entries_[i].data, static_cast<size_t>(nbytes[i]));
  out.commit();
}

}  // namespace cider::model
