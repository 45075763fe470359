// cider/model/safetensors.h — reading (memory-mapped) and writing safetensors files, and Hugging Face directories
// of one or several shards.
//
// Format (docs/formats.md): 8-byte little-endian header length N, N bytes of JSON mapping tensor name ->
// {dtype, shape, data_offsets [begin, end)} relative to the end of the header, plus an optional "__metadata__"
// object of strings. open() validates everything before returning: header length within the file, valid JSON,
// known dtypes, offsets inside the data area, end - begin == numel * dtype size, no overlapping tensors.
// Every violation is a cider::Error (kCorrupt) naming the file, the tensor and the value.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/mapped_file.h"

namespace cider::model {

struct StTensor {
  std::string name;
  DType dtype;                  // F32, F16, BF16, I8, U8, I32, U32, BOOL, F64 ("I64" etc. are rejected at open)
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapping
  size_t nbytes = 0;
  TensorView view() const { return TensorView(data, dtype, shape); }
};

class SafetensorsFile {
 public:
  static std::shared_ptr<const SafetensorsFile> open(const std::string& path);

  const StTensor* find(const std::string& name) const;  // nullptr if absent
  const std::vector<StTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_->path(); }

 private:
  std::shared_ptr<const MappedFile> file_;
  std::vector<StTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model directory: `model.safetensors`, or the shards listed by `model.safetensors.index.json`
// (its "weight_map"), each shard opened once. A name listed in the index but missing from its shard is kCorrupt.
class SafetensorsSet {
 public:
  static SafetensorsSet open_dir(const std::string& dir);
  static SafetensorsSet open_file(const std::string& path);

  const StTensor* find(const std::string& name) const;  // nullptr if absent
  std::vector<std::string> names() const;              // sorted
  const std::map<std::string, std::string>& metadata() const;  // of the first shard

 private:
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, const StTensor*> index_;
};

// Builds a safetensors file; write() goes to "<path>.tmp" then renames, so a failed or interrupted write never
// leaves a half-written file at `path`. The header lists tensors in add() order; their data is packed with no gaps
// (the official safetensors reader rejects gaps), largest element size first, so every tensor starts at a multiple
// of its element size and the header is space-padded to a multiple of 8: all data is naturally aligned.
class SafetensorsWriter {
 public:
  // Copies nothing: `data` must stay valid until write() returns.
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data);
  void set_metadata(const std::string& key, const std::string& value);
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

const char* safetensors_dtype_name(DType t);  // "F32", "BF16", ...

}  // namespace cider::model
