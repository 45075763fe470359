#!/usr/bin/env python3
"""Writes GGUF twins of the mixture-of-experts HF fixtures (tests/data/hf_fixtures/{mixtral,qwen3_moe}) in the
layout llama.cpp's converter produces, for tests/test_model_hf.cpp (HFFixtureMoe.GgufTwin*).

Usage:  python3 tools/make_moe_gguf.py [--fixtures tests/data/hf_fixtures]
Needs:  gguf (llama.cpp's own Python package, PyPI) and numpy.

llama.cpp's convert_hf_to_gguf.py needs a tokenizer, which the fixtures do not have, so this script writes what the
converter writes for these architectures, following its source (conversion/llama.py, conversion/qwen.py of the
llama-cpp-python 0.3.36 sdist):
  mixtral    general.architecture "llama" with llama.expert_count / expert_used_count; attn_q / attn_k rows
             permuted for llama.cpp's adjacent-pair RoPE (LlamaModel.permute, k with the KV head count)
  qwen3_moe  "qwen3moe" with expert_feed_forward_length; no permutation
  both       per layer ffn_gate_inp (the router, F32), and the experts stacked into 3-D ffn_gate_exps / ffn_up_exps
             (E, Ie, hidden) and ffn_down_exps (E, hidden, Ie) (numpy order; GGUF ne is the reverse); norms F32
Two files per fixture: model-bf16.gguf (every matrix BF16: exactly the checkpoint, which is bfloat16, so its logits
are transformers' reference) and model-q8_0-experts.gguf (the expert tensors Q8_0 by gguf-py's quantizer, so
`--weights native` runs them in their blocks). Norms and routers F32. No tokenizer metadata (the tests feed ids).
"""
import argparse
import json
import os

import gguf
import numpy as np
import struct


def load_safetensors(path):
    """name → float32 array of a safetensors file of F32 / BF16 tensors (numpy has no bfloat16)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = np.frombuffer(data[b:e], dtype=np.uint16 if info["dtype"] == "BF16" else np.float32)
        a = (raw.astype(np.uint32) << 16).view(np.float32) if info["dtype"] == "BF16" else raw
        assert info["dtype"] in ("BF16", "F32"), info["dtype"]
        out[name] = a.reshape(info["shape"]).astype(np.float32)
    return out


def bf16_bits(a):
    """float32 array (exactly bf16-representable) → its bf16 bit patterns (uint16)."""
    return (np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def permute(w, n_head, n_head_kv):
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write(fixture_dir, name, experts_q8):
    cfg = json.load(open(os.path.join(fixture_dir, "config.json")))
    t = load_safetensors(os.path.join(fixture_dir, "model.safetensors"))
    mixtral = name == "mixtral"
    arch = "llama" if mixtral else "qwen3moe"
    out = os.path.join(fixture_dir, "model-q8_0-experts.gguf" if experts_q8 else "model-bf16.gguf")
    w = gguf.GGUFWriter(out, arch)
    L = cfg["num_hidden_layers"]
    H = cfg["hidden_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    E = cfg.get("num_local_experts", cfg.get("num_experts"))
    w.add_block_count(L)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"] if "rope_parameters" in cfg else cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    head_dim = cfg.get("head_dim") or H // heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    if not mixtral:
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_uint32("general.file_type", 1)

    def bf16(gname, a):
        w.add_tensor(gname, bf16_bits(a), raw_dtype=gguf.GGMLQuantizationType.BF16)

    def f32(gname, a):
        w.add_tensor(gname, np.ascontiguousarray(a, dtype=np.float32))

    def q8(gname, a):
        q = gguf.quants.quantize(np.ascontiguousarray(a, dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(gname, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    bf16("token_embd.weight", t["model.embed_tokens.weight"])
    f32("output_norm.weight", t["model.norm.weight"])
    bf16("output.weight", t["lm_head.weight"])
    for l in range(L):
        p = f"model.layers.{l}."
        b = f"blk.{l}."
        f32(b + "attn_norm.weight", t[p + "input_layernorm.weight"])
        f32(b + "ffn_norm.weight", t[p + "post_attention_layernorm.weight"])
        q, k = t[p + "self_attn.q_proj.weight"], t[p + "self_attn.k_proj.weight"]
        if mixtral:
            q, k = permute(q, heads, heads), permute(k, heads, kv_heads)
        bf16(b + "attn_q.weight", q)
        bf16(b + "attn_k.weight", k)
        bf16(b + "attn_v.weight", t[p + "self_attn.v_proj.weight"])
        bf16(b + "attn_output.weight", t[p + "self_attn.o_proj.weight"])
        if not mixtral:
            f32(b + "attn_q_norm.weight", t[p + "self_attn.q_norm.weight"])
            f32(b + "attn_k_norm.weight", t[p + "self_attn.k_norm.weight"])
        moe = mixtral or (l + 1) % cfg.get("decoder_sparse_step", 1) == 0
        if not moe:  # a dense layer (Qwen3-MoE's decoder_sparse_step)
            bf16(b + "ffn_gate.weight", t[p + "mlp.gate_proj.weight"])
            bf16(b + "ffn_up.weight", t[p + "mlp.up_proj.weight"])
            bf16(b + "ffn_down.weight", t[p + "mlp.down_proj.weight"])
            continue
        router, ex, names = (("block_sparse_moe.gate", "block_sparse_moe.experts", ("w1", "w3", "w2")) if mixtral
                             else ("mlp.gate", "mlp.experts", ("gate_proj", "up_proj", "down_proj")))
        f32(b + "ffn_gate_inp.weight", t[p + router + ".weight"])
        for part, gname in zip(names, ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")):
            (q8 if experts_q8 else bf16)(b + gname + ".weight",
                                          np.stack([t[f"{p}{ex}.{e}.{part}.weight"] for e in range(E)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out, os.path.getsize(out), "bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                       "hf_fixtures"))
    args = ap.parse_args()
    for name in ("mixtral", "qwen3_moe"):
        for experts_q8 in (False, True):
            write(os.path.join(args.fixtures, name), name, experts_q8)


if __name__ == "__main__":
    main()
