// cider/model/gguf.h — reading GGUF files (llama.cpp's format), memory-mapped: metadata, tensor directory, and
// dequantization of the common tensor types to float32.
//
// Layout (little-endian): magic "GGUF", version (2 or 3), tensor count (u64), metadata count (u64), metadata
// key/value pairs, tensor infos (name, n_dims, dims ne[0..n) with ne[0] the fastest-varying, type, offset), then
// padding to general.alignment (default 32) and the tensor data. open() validates every count, length, offset and
// size against the file (kCorrupt with the field and value); unknown metadata value types are kCorrupt, unknown
// tensor types are kept and rejected only when dequantized (kUnsupported naming the type).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "model/mapped_file.h"

namespace cider::model {

// ggml tensor types (values as in the file).
enum class GGMLType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15, kBF16 = 30,
};
const char* ggml_type_name(uint32_t type);  // "Q4_K", or "type 99" for unknown values

// A metadata value: scalars, strings, or arrays of them (arrays of arrays are rejected as unsupported).
using GGUFScalar = std::variant<uint64_t, int64_t, double, bool, std::string>;
struct GGUFValue {
  uint32_t type = 0;  // GGUF value type of the scalar, or of the elements for arrays
  bool is_array = false;
  std::vector<GGUFScalar> values;  // one element for scalars
};

struct GGUFTensor {
  std::string name;
  uint32_t type;               // a GGMLType value (possibly unknown)
  std::vector<int64_t> shape;  // row-major order: reversed ne, so a 2-D weight is [rows = ne[1], cols = ne[0]]
  const uint8_t* data = nullptr;
  size_t nbytes = 0;           // 0 for a type value cider does not know (its block size is unknown)
  int64_t numel() const;
};

// Whether the file at `path` starts with the GGUF magic (false when it cannot be read).
bool is_gguf_file(const std::string& path);

class GGUFFile {
 public:
  static std::shared_ptr<const GGUFFile> open(const std::string& path);

  uint32_t version() const { return version_; }
  bool has(const std::string& key) const { return metadata_.count(key) != 0; }
  // Typed access; a missing key or a type that does not convert is a cider::Error naming the key.
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;  // any integer type (or bool)
  double get_float(const std::string& key) const;  // any float or integer type
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;
  const std::map<std::string, GGUFValue>& metadata() const { return metadata_; }

  const GGUFTensor* find(const std::string& name) const;  // nullptr if absent
  const std::vector<GGUFTensor>& tensors() const { return tensors_; }
  const std::string& path() const { return file_->path(); }

 private:
  std::shared_ptr<const MappedFile> file_;
  uint32_t version_ = 0;
  std::map<std::string, GGUFValue> metadata_;
  std::vector<GGUFTensor> tensors_;
  std::map<std::string, size_t> index_;
};

// Dequantizes a whole tensor into out[numel] (row-major). Supports F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; anything else is kUnsupported naming the type and the tensor.
void dequantize_gguf_tensor(const GGUFTensor& t, float* out);

}  // namespace cider::model
