// cider/model/gguf_types.h — internal to the GGUF reader: the block geometry of every ggml tensor type cider knows
// (so a tensor's byte size can be checked against the file even for types cider cannot dequantize).
#pragma once

#include <cstdint>

namespace cider::model::gguf_detail {

struct GGMLTypeTraits {
  uint32_t id;
  const char* name;
  int64_t block_size;  // elements per block (1 for plain types)
  int64_t type_size;   // bytes per block
};

// nullptr for a type value cider does not know (its size is then unknown).
const GGMLTypeTraits* ggml_type_traits(uint32_t type);

}  // namespace cider::model::gguf_detail
