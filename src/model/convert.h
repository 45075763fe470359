// cider/model/convert.h — `cider convert`: writes a model in cider's own format, which Model::load reads back without
// requantizing (the int8/int4 codes and scales are stored as computed, so they load bit for bit identical).
//
// Output directory (written as "<out_dir>.tmp-<pid>" then renamed, so a failure leaves nothing at out_dir; out_dir
// must not exist yet):
//   model.safetensors  tensors, HF module naming:
//     dense linear  "<module>.weight"   (N, K) bf16 or f32 (the --weights dtype)
//     int linear    "<module>.qweight"  int8 (N, K) [w8a8] or uint8 (N, K/2) [w4a8, nibble q + 8, element 2i low]
//                   "<module>.wscales"  float32 (N) per channel or (K/group, N) per group   (docs/formats.md §2, §3)
//     native linear "<module>.gblocks" uint8 (N, row bytes): a GGUF file's blocks unchanged, rows in the engine's order
//                   (llama q/k un-permuted, regrouped rows regrouped); its type in the metadata's "ggml_types". Layers
//                   whose GGUF type has no kernels are "<module>.weight" bf16, as --weights native loads them.
//     biases        "<module>.bias"     float32 (N)
//     norms         "<...>norm.weight"  float32 (dim), as stored by the source (see norm_weight_offset)
//     embedding     "model.embed_tokens.weight" (vocab, hidden) float as held, or "model.embed_tokens.gblocks" when
//                   native keeps it in blocks; "lm_head.*" unless the head is the embedding itself (tied, dense
//                   formats and native)
//     metadata      {"format": "cider", "version": "1", "weights": "<format>", "config": <ModelConfig JSON>,
//                    "source": "hf" | "mlx" | "gguf" | "cider"}, and for native "ggml_types": a JSON object naming
//                   every ".gblocks" tensor's block type, {"model.layers.0.self_attn.q_proj.gblocks": "Q4_K", ...}
//   config.json, generation_config.json, tokenizer.json, tokenizer_config.json, special_tokens_map.json,
//   chat_template.jinja: copied when the source directory has them;
//   tokenizer.gguf: for GGUF sources, a tensor-less GGUF holding the source's general.* and tokenizer.* metadata.
#pragma once

#include <string>

#include "model/model.h"

namespace cider::model {

// imatrix: an importance file (`cider imatrix`) weighting a requantizing format's fits (ModelOptions::imatrix);
// head_weights: the LM head's block type (ModelOptions::head_weights).
void convert_model(const std::string& in, const std::string& out_dir, WeightFormat format,
                   const ProgressFn& progress = {}, const std::string& imatrix = {},
                   std::optional<WeightFormat> head_weights = {});

}  // namespace cider::model
