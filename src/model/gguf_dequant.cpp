// Dequantization of GGUF tensors to float32: plain types converted here, block types by their decoders
// (quant/ggml_blocks.h, the reference: one block at a time, bit for bit gguf-py's numpy reference).
#include <cstring>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "model/gguf.h"
#include "model/gguf_types.h"
#include "quant/ggml_blocks.h"

namespace cider::model {

namespace {

constexpr const char* kOp = "gguf_dequantize";

inline float f16_at(const uint8_t* p) {
  return f16_to_f32(static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8)));
}

}  // namespace

void dequantize_gguf_tensor(const GGUFTensor& t, float* out) {
  const auto* tt = gguf_detail::ggml_type_traits(t.type);
  const auto type = static_cast<GGMLType>(t.type);
  const bool plain = type == GGMLType::kF32 || type == GGMLType::kF16 || type == GGMLType::kBF16;
  const quant::GgmlBlockFormat* bf = quant::ggml_block_format(t.type);
  check(tt != nullptr && (plain || bf != nullptr), ErrorCode::kUnsupported, kOp, "tensor '", t.name,
        "' type must be one of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; got ",
        ggml_type_name(t.type));

  // The tensor may be hand-made rather than from GGUFFile::open: re-check its geometry before touching memory.
  uint64_t numel = 1;
  for (int64_t d : t.shape) {
    check(d >= 0 && (d == 0 || numel <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) /
                                             static_cast<uint64_t>(d)),
          ErrorCode::kInvalidArgument, kOp, "tensor '", t.name, "' dimensions must be >= 0 with an int64 element ",
          "count; got ", shape_string(t.shape));
    numel *= static_cast<uint64_t>(d);
  }
  const uint64_t row = t.shape.empty() ? 1 : static_cast<uint64_t>(t.shape.back());
  const uint64_t bs = static_cast<uint64_t>(tt->block_size);
  check(row % bs == 0, ErrorCode::kCorrupt, kOp, "tensor '", t.name, "' row length must be a multiple of the ",
        tt->name, " block size ", bs, "; got ", row);
  const uint64_t nblocks = numel / bs;
  const uint64_t want = nblocks * static_cast<uint64_t>(tt->type_size);
  check(t.nbytes == want, ErrorCode::kCorrupt, kOp, "tensor '", t.name, "' byte size must be ", want, " for ",
        tt->name, " ", shape_string(t.shape), "; got ", t.nbytes);
  if (numel == 0) return;
  check(t.data != nullptr && out != nullptr, ErrorCode::kInvalidArgument, kOp, "tensor '", t.name,
        "' data and out must be non-null; got data=", static_cast<const void*>(t.data), " out=",
        static_cast<const void*>(out));

  const uint8_t* p = t.data;
  const size_t n = static_cast<size_t>(numel);
  switch (type) {
    case GGMLType::kF32:
      std::memcpy(out, p, n * 4);  // file bytes are little-endian float32, as is x86
      return;
    case GGMLType::kF16:
      for (size_t i = 0; i < n; ++i) out[i] = f16_at(p + 2 * i);
      return;
    case GGMLType::kBF16:
      for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
      return;
    default:
      break;
  }
  const size_t tsize = static_cast<size_t>(tt->type_size);
  for (uint64_t blk = 0; blk < nblocks; ++blk) bf->decode(p + blk * tsize, out + blk * bs);
}

}  // namespace cider::model
