#!/usr/bin/env python3
"""Writes a random-weight GGUF with a real model's shapes and llama.cpp's Q4_K_M type mix, for speed and memory runs
of sizes no complete real checkpoint in the package lists has (issue 22's 7B moonshot). The weights are random
blocks with realistic scales (|w| about 0.02): the numbers it computes mean nothing, the bytes it streams and the
memory it takes are a real 7B's. Its tokenizer is the small Qwen2-style fixture of tests/data/tokenizers (2002
tokens), padded with control tokens up to the model's vocabulary.

Usage: python3 tools/make_random_gguf.py OUT.gguf [--shape qwen2-7b|llama3-8b|mixtral-8x7b|qwen3-next-80b|tiny-d128]
       [--layers N]
       [--ctx 131072]
       [--seed 0]   (--layers: fewer layers of the same shape, for per-layer speed runs that fit a device budget)
Needs gguf-py and NumPy (PyPI: pip install gguf numpy). Writes about 4.7 GB for qwen2-7b; not for the repository.
"""
import argparse
import os
import sys

import numpy as np
import gguf

SHAPES = {
    # Qwen2-7B (config.json of Qwen/Qwen2-7B): hidden 3584, 28 layers, 28 heads, 4 KV heads, FFN 18944, vocab 152064.
    "qwen2-7b": dict(arch="qwen2", hidden=3584, layers=28, heads=28, kv_heads=4, ffn=18944, vocab=152064,
                     rope_base=1000000.0, eps=1e-6, qkv_bias=True),
    # A tiny Llama with 128-wide heads (2 of them over 1 KV head), for the tests that need the tensor-core attention
    # kernels' head size at the model level (tests/cuda/test_cuda_model.cpp: the outlier key channels on the GPU);
    # tests/data/gguf_d128/model.gguf is this shape with --seed 128 --ctx 1024 (1.5 MB: mostly its tokenizer).
    "tiny-d128": dict(arch="llama", hidden=256, layers=2, heads=2, kv_heads=1, ffn=512, vocab=2048,
                      rope_base=10000.0, eps=1e-5, qkv_bias=False),
    # Llama-3-8B (config.json of meta-llama/Meta-Llama-3-8B): hidden 4096, 32 layers, 32 heads, 8 KV heads, FFN 14336,
    # vocab 128256, no biases: the CUDA serving benchmark's model (docs/benchmarks.md).
    "llama3-8b": dict(arch="llama", hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                      rope_base=500000.0, eps=1e-5, qkv_bias=False),
    # Mixtral-8x7B (config.json of mistralai/Mixtral-8x7B-v0.1): hidden 4096, 32 layers, 32 heads, 8 KV heads, 8 experts
    # of FFN 14336, 2 per token, vocab 32000; llama.cpp stores it as "llama" with experts (3-D ffn_*_exps tensors).
    "mixtral-8x7b": dict(arch="llama", hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=32000,
                         rope_base=1000000.0, eps=1e-5, qkv_bias=False, experts=8, experts_used=2),
    # Qwen3-Next-80B-A3B (config.json of Qwen/Qwen3-Next-80B-A3B-Instruct): hidden 2048, 48 layers (three gated
    # DeltaNet layers to one gated full-attention layer), 16 heads of 256 with 2 KV heads, partial rotary 64, 512
    # experts of 512 (10 per token) + a shared expert of 512, DeltaNet 16 key heads / 32 value heads of 128, conv 4,
    # vocab 151936; llama.cpp's "qwen3next" layout (tools/make_llamacpp_gguf.py's converter run).
    "qwen3-next-80b": dict(arch="qwen3next", hidden=2048, layers=48, heads=16, kv_heads=2, head_dim=256, ffn=5120,
                           vocab=151936, rope_base=10000000.0, eps=1e-6, qkv_bias=False, experts=512,
                           experts_used=10, expert_ffn=512, shared_ffn=512, rope_dims=64,
                           linear=dict(k_heads=16, v_heads=32, k_dim=128, v_dim=128, conv=4)),
}

Q4_K, Q6_K = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K
BLOCK_BYTES = {Q4_K: 144, Q6_K: 210}


def f16_bytes(v: float) -> np.ndarray:
    return np.frombuffer(np.float16(v).tobytes(), dtype=np.uint8)


def random_blocks(rng, qtype, rows: int, cols: int) -> np.ndarray:
    """rows × (cols / 256) super-blocks of random codes and scales, the f16 fields set to finite sizes."""
    nb = cols // 256
    b = rng.integers(0, 256, size=(rows * nb, BLOCK_BYTES[qtype]), dtype=np.uint8)
    if qtype == Q4_K:  # w = d·sc·q − dmin·m, sc and m 6-bit, q 4-bit: d ≈ 0.02 / (32 · 8)
        b[:, 0:2] = f16_bytes(8e-5)
        b[:, 2:4] = f16_bytes(8e-5)
    else:  # Q6_K: w = d·sc·(q − 32), sc int8: d ≈ 0.02 / (64 · 16)
        b[:, 208:210] = f16_bytes(2e-5)
    return b.reshape(rows, nb * BLOCK_BYTES[qtype])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", default="qwen2-7b", choices=sorted(SHAPES))
    ap.add_argument("--ctx", type=int, default=131072)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0, help="layers (default: the model's)")
    a = ap.parse_args()
    s = dict(SHAPES[a.shape])
    if a.layers > 0:
        s["layers"] = a.layers
    rng = np.random.default_rng(a.seed)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tok = gguf.GGUFReader(os.path.join(root, "tests", "data", "tokenizers", "qwen2_vocab.gguf"))

    def field(name):
        f = tok.fields[name]
        return [f.parts[i] for i in f.data]

    tokens = [bytes(t).decode("utf-8") for t in field("tokenizer.ggml.tokens")]
    types = [int(t[0]) for t in field("tokenizer.ggml.token_type")]
    merges = [bytes(m).decode("utf-8") for m in field("tokenizer.ggml.merges")]
    eos = int(tok.fields["tokenizer.ggml.eos_token_id"].parts[-1][0])
    pad = s["vocab"] - len(tokens)
    tokens += [f"<|pad_{i}|>" for i in range(pad)]
    types += [int(gguf.TokenType.CONTROL)] * pad

    arch, H, L, nh, nkv, I, V = s["arch"], s["hidden"], s["layers"], s["heads"], s["kv_heads"], s["ffn"], s["vocab"]
    D = s.get("head_dim", H // nh)
    lin = s.get("linear")  # hybrid: every fourth layer full attention, the others gated DeltaNet
    Ie = s.get("expert_ffn", I)
    w = gguf.GGUFWriter(a.out, arch)
    w.add_name(f"random {a.shape} (cider tools/make_random_gguf.py, seed {a.seed})")
    w.add_context_length(a.ctx)
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(I)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    E = s.get("experts", 0)
    if E:
        w.add_expert_count(E)
        w.add_expert_used_count(s["experts_used"])
        if "expert_ffn" in s:
            w.add_expert_feed_forward_length(Ie)
        if "shared_ffn" in s:
            w.add_expert_shared_feed_forward_length(s["shared_ffn"])
    if "head_dim" in s:
        w.add_key_length(D)
        w.add_value_length(D)
    if "rope_dims" in s:
        w.add_rope_dimension_count(s["rope_dims"])
    if lin:
        w.add_ssm_conv_kernel(lin["conv"])
        w.add_ssm_state_size(lin["k_dim"])
        w.add_ssm_group_count(lin["k_heads"])
        w.add_ssm_time_step_rank(lin["v_heads"])
        w.add_ssm_inner_size(lin["v_dim"] * lin["v_heads"])
        w.add_full_attention_interval(4)
        w.add_array(f"{arch}.attention.recurrent_layers", [(l + 1) % 4 != 0 for l in range(L)])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)

    # (name, qtype or None for F32, rows, cols): llama.cpp's Q4_K_M keeps attn_v and ffn_down in Q6_K on part of the
    # layers (here every other one) and the output layer in Q6_K.
    plan = [("token_embd.weight", Q4_K, V, H)]
    for l in range(L):
        p = f"blk.{l}."
        more = l % 2 == 0
        if lin and (l + 1) % 4 != 0:  # gated DeltaNet: q|k|v, z, b|a, A (negative), dt bias, conv (C, K), norm, out
            kd, vd = lin["k_heads"] * lin["k_dim"], lin["v_heads"] * lin["v_dim"]
            plan += [(p + "attn_norm.weight", None, 1, H), (p + "post_attention_norm.weight", None, 1, H),
                     (p + "attn_qkv.weight", Q4_K, 2 * kd + vd, H), (p + "attn_gate.weight", Q4_K, vd, H),
                     (p + "ssm_ba.weight", None, 2 * lin["v_heads"], H), (p + "ssm_a", None, 1, lin["v_heads"]),
                     (p + "ssm_dt.bias", None, 1, lin["v_heads"]), (p + "ssm_conv1d.weight", None, 2 * kd + vd, lin["conv"]),
                     (p + "ssm_norm.weight", None, 1, lin["v_dim"]), (p + "ssm_out.weight", Q4_K, H, vd)]
        elif lin:  # gated full attention: q_proj holds each head's query and gate; q/k norms per head
            plan += [(p + "attn_norm.weight", None, 1, H), (p + "post_attention_norm.weight", None, 1, H),
                     (p + "attn_q.weight", Q4_K, 2 * nh * D, H), (p + "attn_k.weight", Q4_K, nkv * D, H),
                     (p + "attn_v.weight", Q6_K if more else Q4_K, nkv * D, H),
                     (p + "attn_output.weight", Q4_K, H, nh * D), (p + "attn_q_norm.weight", None, 1, D),
                     (p + "attn_k_norm.weight", None, 1, D)]
        else:
            plan += [(p + "attn_norm.weight", None, 1, H), (p + "ffn_norm.weight", None, 1, H),
                     (p + "attn_q.weight", Q4_K, nh * D, H), (p + "attn_k.weight", Q4_K, nkv * D, H),
                     (p + "attn_v.weight", Q6_K if more else Q4_K, nkv * D, H),
                     (p + "attn_output.weight", Q4_K, H, nh * D)]
        if E:  # router F32 (E, H); experts (E, I, H) and (E, H, I), numpy order (GGUF ne reversed)
            plan += [(p + "ffn_gate_inp.weight", None, E, H), (p + "ffn_gate_exps.weight", Q4_K, (E, Ie), H),
                     (p + "ffn_up_exps.weight", Q4_K, (E, Ie), H),
                     (p + "ffn_down_exps.weight", Q6_K if more else Q4_K, (E, H), Ie)]
            if "shared_ffn" in s:  # the shared expert and its gate (1, H)
                Is = s["shared_ffn"]
                plan += [(p + "ffn_gate_inp_shexp.weight", None, (1,), H), (p + "ffn_gate_shexp.weight", Q4_K, Is, H),
                         (p + "ffn_up_shexp.weight", Q4_K, Is, H), (p + "ffn_down_shexp.weight", Q6_K, H, Is)]
        else:
            plan += [(p + "ffn_gate.weight", Q4_K, I, H), (p + "ffn_up.weight", Q4_K, I, H),
                     (p + "ffn_down.weight", Q6_K if more else Q4_K, H, I)]
        if s["qkv_bias"]:
            plan += [(p + "attn_q.bias", None, 1, nh * D), (p + "attn_k.bias", None, 1, nkv * D),
                     (p + "attn_v.bias", None, 1, nkv * D)]
    plan += [("output_norm.weight", None, 1, H), ("output.weight", Q6_K, V, H)]
    def lead(rows):  # rows: a count, or the leading dims of a 3-D tensor
        return list(rows) if isinstance(rows, tuple) else [rows]

    def count(rows):
        return int(np.prod(rows)) if isinstance(rows, tuple) else rows

    for name, qt, rows, cols in plan:
        if qt is None:
            shape = lead(rows) + [cols] if isinstance(rows, tuple) else ([cols] if rows == 1 else [rows, cols])
            w.add_tensor_info(name, shape, np.dtype(np.float32), count(rows) * cols * 4)
        else:
            nbytes = count(rows) * (cols // 256) * BLOCK_BYTES[qt]
            w.add_tensor_info(name, lead(rows) + [nbytes // count(rows)], np.dtype(np.uint8), nbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = 0
    for name, qt, rows, cols in plan:
        if qt is None:
            if name.endswith("norm.weight"):
                t = np.ones(cols, np.float32)
            elif name.endswith("ssm_a"):  # −exp(A_log): decay rates, negative
                t = -rng.uniform(0.5, 4.0, cols).astype(np.float32)
            elif name.endswith("ssm_conv1d.weight"):
                t = rng.normal(0.0, 0.5, count(rows) * cols).astype(np.float32)
            else:
                t = rng.normal(0.0, 0.02, count(rows) * cols).astype(np.float32)
        else:
            t = random_blocks(rng, qt, count(rows), cols)
        w.write_tensor_data(t)
        total += t.nbytes
    w.close()
    print(f"wrote {a.out}: {a.shape}, {len(plan)} tensors, {total / 2**30:.2f} GiB of tensor data", file=sys.stderr)


if __name__ == "__main__":
    main()
