// cider/model/loader.h — turning a checkpoint on disk into Weights (model/transformer.h) in the requested format.
//
// Sources (detected from the path):
//   * Hugging Face directory: config.json + model.safetensors or shards (model.safetensors.index.json); f32/f16/bf16.
//   * MLX-quantized directory: the same, with a "quantization" config entry; quantized modules hold weight (uint32
//     codes), scales and biases (MLX affine, docs/formats.md), per-module overrides honoured.
//   * GGUF file: metadata → config (model/config.h), tensors dequantized to float32 then converted. llama.cpp's
//     converter permutes the rows of attn_q/attn_k of "llama" models (each head's halves interleaved, for its
//     adjacent-pair RoPE); the loader undoes it so HF's rotate_half RoPE applies. Gemma 3 GGUF norms hold 1 + w, so
//     the config's norm_weight_offset is 0 for them.
//   * cider-converted directory: model.safetensors with metadata format = "cider" (model/convert.h); int8/int4 codes
//     and scales are used as stored (in place from the mapping when aligned), never requantized; a directory
//     converted with --weights native holds a GGUF file's blocks as "<module>.gblocks" (types in the metadata's
//     "ggml_types"), used in place like the GGUF file's own.
// Formats (--weights): f32 / bf16 keep linear weights dense (bf16 tensors of the checkpoint used in place from the
// mapping, others converted once); w8a8[-gN] quantizes symmetric int8 per channel or per group of N; w4a8 quantizes
// symmetric int4 per group (model/weight_format.cpp; MLX sources with a finer group keep it). Embeddings and norms stay
// float; with tied embeddings the head is the embedding itself (f32/bf16) or a quantized copy of it (int formats).
// Every tensor is checked against the config (dtype, shape; missing and unexpected tensors named).
#pragma once

#include <string>

#include "model/model.h"
#include "model/transformer.h"

namespace cider::model {

// Fills impl.config, impl.w, impl.source, impl.tokenizer (or impl.tokenizer_error) from `path`.
void load_model_files(const std::string& path, WeightFormat format, const ProgressFn& progress, Model::Impl& impl);

// For the CPU, where the kernel table asks for it (KernelTable::ggml_interleave): every native-weight linear layer of
// an interleavable format (quant::ggml_interleavable) with N a multiple of 8 gets its rows interleaved
// (quant/ggml_interleave.h, nn::LinearWeights::interleaved), in place: in the model's own buffers, or in a mapped
// file's pages made writable for it (private copies of those pages replace the file's: no more memory). Bytes the
// embedding lookup reads, and bytes shared in part with another layer, keep the file's order. Returns the number of
// tensors interleaved.
int interleave_for_kernels(Weights& w, const kernels::KernelTable& kt);

}  // namespace cider::model
