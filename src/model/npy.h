// cider/model/npy.h — NumPy .npy files of float32 arrays (format version 1.0, little-endian '<f4', C order), for
// `cider logits` and for reading reference logits in tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cider::model {

// Writes data (numel = product of shape) to `path` via "<path>.tmp" + rename, so a failure never leaves a partial
// file at `path`. kIo naming the path on failure; kInvalidArgument for a negative dimension or null data.
void write_npy_f32(const std::string& path, const float* data, std::vector<int64_t> shape);

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// Reads a version 1.x/2.x .npy file holding '<f4' data in C order; kCorrupt naming the file otherwise.
NpyArray read_npy_f32(const std::string& path);

}  // namespace cider::model
