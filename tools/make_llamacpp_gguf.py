#!/usr/bin/env python3
"""Converts Hugging Face fixtures (tests/data/hf_fixtures, tools/make_hf_fixtures.py) to GGUF with llama.cpp's own
converter, for the GGUF twins in tests/test_model_hf.cpp (HFFixturePhi3.LlamaCppGgufTwin,
HFFixtureGemma2.LlamaCppGgufTwin).

Usage:  python3 tools/make_llamacpp_gguf.py LLAMA_CPP_DIR [phi3] [gemma2] [qwen3_next] [olmoe] [qwen3_5]   (no name: all)
        LLAMA_CPP_DIR: a llama.cpp source tree (convert_hf_to_gguf.py, conversion/, gguf-py/), e.g. the one vendored
        in the llama-cpp-python sdist (pip download llama-cpp-python --no-binary :all: --no-deps). Made with the tree
        of llama-cpp-python 0.3.36. Needs torch, numpy, safetensors.

Everything in the files is the converter's except the vocabulary: the fixtures have no tokenizer, so the model
class's set_vocab is replaced by a placeholder list of vocab_size tokens. Writes:
  tests/data/gguf_phi3/phi3_{bf16,q8_0}.gguf   the checkpoint's bf16 values (exact) and Q8_0 blocks: fused attn_qkv /
                                               ffn_up, rope_factors_long / rope_factors_short, rope.scaling.attn_factor,
                                               original_context_length, attention.sliding_window
  tests/data/gguf_gemma2/gemma2_bf16.gguf      the norms stored as 1 + w in float32 (Gemma2Model.modify_tensors),
                                               attn_logit_softcapping, final_logit_softcapping, attention.sliding_window
  tests/data/gguf_qwen3_next/qwen3_next_{bf16,q8_0}.gguf   (1 + w) norms stored as 1 + w, in_proj_qkvz regrouped into
                                               attn_qkv / attn_gate, ssm_ba as it is, ssm_a = −exp(A_log), ssm_dt.bias,
                                               ssm_conv1d (C, K), experts 3-D, shared expert *_shexp, rope.dimension_count
                                               the rotary dims (converted with --no-mtp)
  tests/data/gguf_olmoe/olmoe_bf16.gguf        whole-projection attn_q_norm / attn_k_norm, experts 3-D,
                                               attention.clamp_kqv
  tests/data/gguf_qwen3_5/qwen3_5_{bf16,q8_0}.gguf   "qwen35": in_proj_qkv as attn_qkv, in_proj_z as attn_gate,
                                               in_proj_b / in_proj_a as ssm_beta / ssm_alpha, the value heads of every
                                               linear-attention tensor in "tiled" order (value head j·Hk + i is key
                                               head i's j-th), rope.dimension_sections (interleaved MRoPE)
(The MoE twins are written by tools/make_moe_gguf.py: the converter's MoE classes need nothing different, but this
script's placeholder vocabulary would not change that, and the fixtures are bfloat16 checkpoints it reads as is.)
"""
import argparse
import importlib
import os
import runpy
import sys

# fixture → (converter module, model class, out types)
FIXTURES = {
    "phi3": ("conversion.phi", "Phi3MiniModel", ("bf16", "q8_0")),
    "gemma2": ("conversion.gemma", "Gemma2Model", ("bf16",)),
    "qwen3_next": ("conversion.qwen", "Qwen3NextModel", ("bf16", "q8_0")),
    "olmoe": ("conversion.olmo", "OlmoeModel", ("bf16",)),
    "qwen3_5": ("conversion.qwen", "Qwen3_5TextModel", ("bf16", "q8_0")),
}


def set_vocab(self):
    n = self.hparams["vocab_size"]
    self.gguf_writer.add_tokenizer_model("llama")
    self.gguf_writer.add_tokenizer_pre("default")
    self.gguf_writer.add_token_list([f"<t{i}>".encode() for i in range(n)])
    self.gguf_writer.add_token_scores([0.0] * n)
    self.gguf_writer.add_token_types([1] * n)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("llama_cpp")
    ap.add_argument("names", nargs="*", help="fixtures: " + ", ".join(sorted(FIXTURES)) + " (default: all)")
    args = ap.parse_args()
    for name in args.names:
        if name not in FIXTURES:
            ap.error(f"unknown fixture {name!r}; known: {', '.join(sorted(FIXTURES))}")
    args.names = args.names or sorted(FIXTURES)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    sys.path.insert(0, os.path.join(args.llama_cpp, "gguf-py"))
    sys.path.insert(0, args.llama_cpp)
    for name in args.names:
        module, cls, outtypes = FIXTURES[name]
        setattr(getattr(importlib.import_module(module), cls), "set_vocab", set_vocab)
        out = os.path.join(root, "tests", "data", f"gguf_{name}")
        os.makedirs(out, exist_ok=True)
        src = os.path.join(root, "tests", "data", "hf_fixtures", name)
        for outtype in outtypes:
            sys.argv = ["convert_hf_to_gguf.py", src, "--outtype", outtype,
                        "--outfile", os.path.join(out, f"{name}_{outtype}.gguf")]
            if name in ("qwen3_next", "qwen3_5"):
                sys.argv.append("--no-mtp")  # the fixture has no multi-token-prediction layers
            runpy.run_path(os.path.join(args.llama_cpp, "convert_hf_to_gguf.py"), run_name="__main__")


if __name__ == "__main__":
    main()
