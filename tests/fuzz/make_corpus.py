#!/usr/bin/env python3
"""Writes the fuzz seed corpora, tests/fuzz/corpus/<harness>/, from the repository's test fixtures plus hand-made
edge cases (standard library only). Run from anywhere: python3 tests/fuzz/make_corpus.py

Kept small (the whole corpus directory well under 2 MB): only fixtures below ~64 KB are copied, tokenizer.json
fixtures are also cut down to their first few hundred tokens. Re-running rewrites the seeds it owns (files named
seed_*) and leaves any other file (e.g. inputs a fuzzing run added by hand) alone.
"""
import json
import os
import struct
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def data(*parts):
    return os.path.join(ROOT, *parts)


def read(*parts):
    with open(data(*parts), "rb") as f:
        return f.read()


def put(harness, name, payload):
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(payload, str):
        payload = payload.encode("utf-8")
    with open(os.path.join(d, "seed_" + name), "wb") as f:
        f.write(payload)


def clear(harness):
    d = os.path.join(CORPUS, harness)
    if os.path.isdir(d):
        for n in os.listdir(d):
            if n.startswith("seed_"):
                os.remove(os.path.join(d, n))


# ---- safetensors ---------------------------------------------------------------------------------------------------

def safetensors(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape, bytes)."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    blob = b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blob += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blob


def seeds_safetensors():
    clear("safetensors")
    put("safetensors", "reference.safetensors", read("tests", "data", "safetensors", "reference.safetensors"))
    put("safetensors", "llama_index.json", read("tests", "data", "hf_fixtures", "llama", "model.safetensors.index.json"))
    put("safetensors", "empty_header", struct.pack("<Q", 2) + b"{}")
    put("safetensors", "metadata_only", safetensors([], {"format": "pt", "k": "v"}))
    put("safetensors", "all_dtypes", safetensors([
        ("f32", "F32", [2], struct.pack("<2f", 1.0, -2.0)),
        ("f16", "F16", [2], b"\x00\x3c\x00\xc0"),
        ("bf16", "BF16", [1, 2], b"\x80\x3f\x00\xc0"),
        ("i8", "I8", [3], b"\x01\xff\x7f"),
        ("u8", "U8", [1], b"\xff"),
        ("i32", "I32", [1], struct.pack("<i", -7)),
        ("u32", "U32", [1], struct.pack("<I", 7)),
        ("b", "BOOL", [2], b"\x00\x01"),
        ("f64", "F64", [1], struct.pack("<d", 0.5)),
        ("scalar", "F32", [], struct.pack("<f", 3.0)),
        ("empty", "F32", [0, 4], b""),
    ], {"format": "cider", "version": "1"}))
    put("safetensors", "unsupported_dtype", safetensors([("x", "I64", [1], b"\x00" * 8)]))
    put("safetensors", "index_minimal.json",
        json.dumps({"metadata": {"total_size": 8}, "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "model.norm.weight": "model-00002-of-00002.safetensors"}}))


# ---- gguf ----------------------------------------------------------------------------------------------------------

GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STR, GGUF_ARR, GGUF_U64, GGUF_F64 = 4, 5, 6, 7, 8, 9, 10, 12


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(t, v):
    if t == GGUF_U32:
        return struct.pack("<I", v)
    if t == GGUF_I32:
        return struct.pack("<i", v)
    if t == GGUF_F32:
        return struct.pack("<f", v)
    if t == GGUF_BOOL:
        return struct.pack("<B", 1 if v else 0)
    if t == GGUF_STR:
        return gguf_str(v)
    if t == GGUF_U64:
        return struct.pack("<Q", v)
    if t == GGUF_F64:
        return struct.pack("<d", v)
    raise ValueError(t)


def gguf(kvs, tensors=(), alignment=32):
    """kvs: list of (key, type, value) where type may be (GGUF_ARR, elem_type); tensors: (name, dims ne[], type, raw)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, t, v in kvs:
        out += gguf_str(key)
        if isinstance(t, tuple):
            out += struct.pack("<IIQ", GGUF_ARR, t[1], len(v))
            for e in v:
                out += gguf_value(t[1], e)
        else:
            out += struct.pack("<I", t) + gguf_value(t, v)
    offsets, off = [], 0
    for _, _, _, raw in tensors:
        offsets.append(off)
        off += len(raw)
        off += (alignment - off % alignment) % alignment
    for (name, ne, typ, _), o in zip(tensors, offsets):
        out += gguf_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", typ, o)
    out += b"\x00" * ((alignment - len(out) % alignment) % alignment)
    blob = b""
    for (_, _, _, raw), o in zip(tensors, offsets):
        blob += b"\x00" * (o - len(blob)) + raw
    return out + blob


def tiny_vocab(model):
    if model == "gpt2":
        toks = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "Ġa", "ab", "<|endoftext|>"]
        merges = ["Ġ a", "a b"]
    else:
        toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["▁", "▁a", "a", "b", "ab"]
        merges = ["▁ a", "a b"]
    return toks, merges


def gguf_model(arch, tok_model, extra=()):
    toks, merges = tiny_vocab(tok_model)
    p = arch + "."
    kvs = [("general.architecture", GGUF_STR, arch),
           (p + "context_length", GGUF_U32, 64), (p + "embedding_length", GGUF_U32, 8),
           (p + "block_count", GGUF_U32, 1), (p + "feed_forward_length", GGUF_U32, 16),
           (p + "attention.head_count", GGUF_U32, 2), (p + "attention.head_count_kv", GGUF_U32, 1),
           (p + "attention.layer_norm_rms_epsilon", GGUF_F32, 1e-6), (p + "rope.freq_base", GGUF_F32, 10000.0),
           ("tokenizer.ggml.model", GGUF_STR, tok_model), ("tokenizer.ggml.pre", GGUF_STR, "default"),
           ("tokenizer.ggml.tokens", (GGUF_ARR, GGUF_STR), toks),
           ("tokenizer.ggml.token_type", (GGUF_ARR, GGUF_I32), [1] * len(toks)),
           ("tokenizer.ggml.merges", (GGUF_ARR, GGUF_STR), merges),
           ("tokenizer.ggml.bos_token_id", GGUF_U32, 1), ("tokenizer.ggml.eos_token_id", GGUF_U32, 2)]
    if tok_model == "llama":
        kvs.append(("tokenizer.ggml.scores", (GGUF_ARR, GGUF_F32), [float(-i) for i in range(len(toks))]))
    kvs += list(extra)
    emb = struct.pack("<%df" % (8 * len(toks)), *([0.01] * (8 * len(toks))))
    tensors = [("token_embd.weight", [8, len(toks)], 0, emb),
               ("blk.0.attn_q.weight", [8, 8], 0, struct.pack("<64f", *([0.5] * 64))),
               ("blk.0.attn_k.weight", [32, 1], 8, b"\x00\x3c" + bytes(range(32))),  # Q8_0: one block of 34 bytes
               ("output_norm.weight", [8], 1, b"\x00\x3c" * 8)]
    return gguf(kvs, tensors)


def seeds_gguf():
    clear("gguf")
    for f in ("align64.gguf", "tensors.gguf"):
        put("gguf", f, read("tests", "data", "gguf", f))
    for f in ("gpt2_vocab.gguf", "llama2_vocab.gguf", "gemma_vocab.gguf"):
        put("gguf", f, read("tests", "data", "tokenizers", f))
    put("gguf", "llama_tiny.gguf", gguf_model("llama", "gpt2"))
    put("gguf", "qwen3_tiny.gguf", gguf_model("qwen3", "gpt2", [("qwen3.attention.key_length", GGUF_U32, 4),
                                                                 ("qwen3.attention.value_length", GGUF_U32, 4)]))
    put("gguf", "gemma3_tiny.gguf", gguf_model("gemma3", "llama", [
        ("gemma3.attention.sliding_window", GGUF_U32, 8), ("gemma3.attention.sliding_window_pattern", GGUF_U32, 2),
        ("gemma3.final_logit_softcapping", GGUF_F32, 30.0), ("gemma3.rope.scaling.type", GGUF_STR, "linear"),
        ("gemma3.rope.scaling.factor", GGUF_F32, 8.0)]))
    put("gguf", "header_only.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    put("gguf", "v2_one_kv.gguf", b"GGUF" + struct.pack("<IQQ", 2, 0, 1) + gguf_str("general.alignment") +
        struct.pack("<II", GGUF_U32, 64))


# ---- config --------------------------------------------------------------------------------------------------------

def cider_config(arch="llama", V=16, H=32, I=32, L=1, heads=2, kv=1, D=16, maxpos=64, qkv_bias=False, o_bias=False,
                 mlp_bias=False, qk_norm=False, sandwich=False, act="silu", tie=True, sliding=None, window=0,
                 rope_scaling=0, dtype="bfloat16", softcap="0", norm_offset="0"):
    def rope(theta="10000", scaling=0):
        return {"theta": theta, "scaling": scaling, "factor": "2" if scaling else "1", "low_freq_factor": "1",
                "high_freq_factor": "4", "original_max_position": 8192, "freq_factors": []}
    return json.dumps({
        "arch": arch, "vocab_size": V, "hidden_size": H, "intermediate_size": I, "num_layers": L, "num_heads": heads,
        "num_kv_heads": kv, "head_dim": D, "max_position": maxpos, "bos_token_id": 1, "eos_token_ids": [2],
        "rms_norm_eps": "9.9999999999999995e-07", "norm_weight_offset": norm_offset, "qkv_bias": qkv_bias,
        "o_bias": o_bias, "mlp_bias": mlp_bias, "qk_norm": qk_norm, "sandwich_norms": sandwich, "activation": act,
        "attn_scale": "0.5", "embed_scale": "1", "final_logit_softcap": softcap, "tie_word_embeddings": tie,
        "rope": rope(scaling=rope_scaling), "rope_local": rope(), "sliding_window": window,
        "layer_sliding": sliding if sliding is not None else [0] * L, "dtype": dtype}, indent=1)


CIDER_CONFIGS = {
    "llama": cider_config(),
    "llama_untied_2layers": cider_config(L=2, tie=False, mlp_bias=True, o_bias=True, rope_scaling=1),
    "qwen2": cider_config(arch="qwen2", qkv_bias=True, dtype="float32"),
    "qwen3": cider_config(arch="qwen3", qk_norm=True, kv=2),
    "gemma3": cider_config(arch="gemma3", L=2, qk_norm=True, sandwich=True, act="gelu_tanh", sliding=[1, 0], window=8,
                           softcap="30", norm_offset="1"),
    "mistral_g64": cider_config(arch="mistral", H=64, I=64, heads=2, kv=1, D=32, tie=False),
}


def hf_tiny(name):
    c = json.loads(read("tests", "data", "hf_fixtures", name, "config.json"))
    c.update({"vocab_size": 16, "hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 4, "max_position_embeddings": 64, "bos_token_id": 1,
              "eos_token_id": 2})
    c["num_hidden_layers"] = 2
    if name == "gemma3":
        c["layer_types"] = ["sliding_attention", "full_attention"]
    elif "layer_types" in c:
        c["layer_types"] = c["layer_types"][:2]
    c.pop("pad_token_id", None)
    return json.dumps(c, indent=1)


def seeds_config():
    clear("config")
    for m in ("gemma3", "llama", "mistral", "qwen2", "qwen3"):
        put("config", m + "_config.json", read("tests", "data", "hf_fixtures", m, "config.json"))
        put("config", m + "_generation_config.json", read("tests", "data", "hf_fixtures", m, "generation_config.json"))
    put("config", "cider_tiny_config.json", read("models", "cider-tiny", "config.json"))
    put("config", "cider_tiny_generation_config.json", read("models", "cider-tiny", "generation_config.json"))
    for k, v in CIDER_CONFIGS.items():
        put("config", "cider_" + k + ".json", v)
    # (An MLX config with "quantization" {group_size, bits, mode, per-module overrides} is in regressions/config.)
    put("config", "mlx_quantization_plain.json", json.dumps({"model_type": "llama", "quantization": {"group_size": 64,
                                                                                                       "bits": 4}}))
    put("config", "quantization_config_gptq.json", json.dumps({"quantization_config": {"quant_method": "gptq"}}))
    put("config", "llama3_rope.json", json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 16, "hidden_size": 8,
        "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "max_position_embeddings": 64, "rope_theta": 500000.0, "torch_dtype": "bfloat16", "eos_token_id": [1, 2],
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}}))
    put("config", "generation_eos_list.json", json.dumps({"bos_token_id": 0, "eos_token_id": [1, 2, 3]}))
    put("config", "empty_object.json", "{}")
    put("config", "not_an_object.json", "[1, 2, 3]")


# ---- cider_format --------------------------------------------------------------------------------------------------
# 4 flag bytes (mode, target, kind, seed), then config \0 weights \0 version (see fuzz_cider_format.cpp).

def seeds_cider_format():
    clear("cider_format")
    for name, cfg in CIDER_CONFIGS.items():
        for weights in (["f32", "bf16", "w8a8", "w4a8"] if name != "mistral_g64" else
                        ["w8a8-g64", "w4a8", "w8a8-g128"]):
            mode = 0x02  # cider directory, forward pass
            put("cider_format", "%s_%s" % (name, weights),
                bytes([mode, 0, 0, 7]) + cfg.encode() + b"\0" + weights.encode() + b"\0" + b"1")
    put("cider_format", "llama_f32_missing_tensor", bytes([0x02, 3, 1, 0]) + CIDER_CONFIGS["llama"].encode())
    put("cider_format", "llama_f32_wrong_shape", bytes([0x02, 5, 3, 0]) + CIDER_CONFIGS["llama"].encode())
    put("cider_format", "llama_f32_values_from_input", bytes([0x42, 0, 0, 0]) + CIDER_CONFIGS["llama"].encode() +
        b"\0f32\x001\0" + struct.pack("<8f", 1.0, -1.0, 0.0, float("inf"), float("nan"), 1e30, -1e-30, 65504.0))
    put("cider_format", "llama_w8a8_values_from_input", bytes([0x42, 0, 0, 0]) + CIDER_CONFIGS["llama"].encode() +
        b"\0w8a8\x001\0" + struct.pack("<8f", 1.0, -1.0, 0.0, 3.4e38, 1e-45, 1e30, -1e-30, 65504.0))
    put("cider_format", "llama_version_2", bytes([0x02, 0, 0, 0]) + CIDER_CONFIGS["llama"].encode() + b"\0f32\x002")
    put("cider_format", "llama_no_config_key", bytes([0x06, 0, 0, 0]) + CIDER_CONFIGS["llama"].encode())
    for m in ("gemma3", "llama", "mistral", "qwen2", "qwen3"):
        for weights, mode in (("f32", 0x03), ("bf16", 0x83), ("w8a8", 0x03)):
            put("cider_format", "hf_%s_%s" % (m, weights), bytes([mode, 0, 0, 3]) + hf_tiny(m).encode() + b"\0" +
                weights.encode())


# ---- tokenizer -----------------------------------------------------------------------------------------------------
# <tokenizer.json> \0 <text>; a first part of 0/1 bytes picks a fixture tokenizer (fuzz_tokenizer.cpp's list order:
# gpt2, llama3, qwen2, llama2, gemma, mistral_metaspace, metaspace_split, bytelevel_prefix, cider-tiny).

TOKENIZER_FIXTURES = ["gpt2", "llama3", "qwen2", "llama2", "gemma", "mistral_metaspace", "metaspace_split",
                      "bytelevel_prefix"]


def shrink_tokenizer(j, keep=320):
    m = j["model"]
    vocab = {t: i for t, i in m["vocab"].items() if i < keep}
    added = j.get("added_tokens") or []
    for a in added:
        vocab.setdefault(a["content"], a["id"])
    merges = []
    for mg in m.get("merges", []):
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        if a in vocab and b in vocab and (a + b) in vocab:
            merges.append(mg)
    m["vocab"] = vocab
    m["merges"] = merges
    return j


def seeds_tokenizer():
    clear("tokenizer")
    texts = ["Hello, world!", " leading and  double  spaces ", "don't STOP 12345 678", "tabs\tand\nnewlines\r\n",
             "caf\u00e9 na\u00efve \u00c5ngstr\u00f6m", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
             "emoji \U0001F600\U0001F44D\U0001F3FD", "<|endoftext|><s></s><|im_start|>user",
             "\u0301combining e\u0301", "\u00a0\u2009\u3000 unicode spaces"]
    # Texts from the fixtures' own case lists, a few per fixture.
    for f in TOKENIZER_FIXTURES[:4]:
        cases = json.loads(read("tests", "data", "tokenizers", f + ".cases.json"))["cases"]
        for c in cases[:40:8]:
            t = c.get("text") if isinstance(c, dict) else None
            if isinstance(t, str) and len(t.encode()) < 400:
                texts.append(t)
    for i, t in enumerate(texts):
        put("tokenizer", "fixture%d_text%d" % (i % 9, i), bytes([i % 9]) + b"\0" + t.encode())
    put("tokenizer", "fixture0_ids", b"\0" + struct.pack("<8i", 0, 1, 2, 100, 1999, 2000, -1, 0x7fffffff))
    put("tokenizer", "fixture_invalid_utf8", b"\x03\0abc\xff\xfe\xc3(")
    for f in TOKENIZER_FIXTURES:
        j = shrink_tokenizer(json.loads(read("tests", "data", "tokenizers", f + ".json")))
        put("tokenizer", "json_tiny_" + f, json.dumps(j, separators=(",", ":"), ensure_ascii=False).encode() + b"\0" +
            b"Hello world, caf\xc3\xa9 12345!")
    put("tokenizer", "json_full_gpt2", read("tests", "data", "tokenizers", "gpt2.json") + b"\0The quick brown fox")
    put("tokenizer", "json_wordlevel_unsupported", b'{"model":{"type":"WordLevel","vocab":{"a":0}}}\0a')


# ---- chat_format ---------------------------------------------------------------------------------------------------
# byte 0: format (low 3 bits) | 0x08 system | 0x10 family tokenizer | 0x20 scrambled roles; byte 1: arch | flags;
# then system? \0 user \0 assistant \0 user ...

def seeds_chat_format():
    clear("chat_format")
    for name in ("chatml", "llama3", "gemma", "mistral", "llama2", "raw", "ChatML", ""):
        put("chat_format", "name_" + (name or "empty"), name)
    for f in range(6):
        put("chat_format", "fmt%d_one_turn" % f, bytes([f, f]) + b"What is 2+2?")
        put("chat_format", "fmt%d_system_family" % f, bytes([f | 0x18, f]) +
            b"You are terse.\0  Hi there  \0Hello! How can I help?\0Tell me a joke.")
        put("chat_format", "fmt%d_specials" % f, bytes([f | 0x10, 0]) +
            b"<|im_start|>user<|im_end|>\0[INST] </s><s><end_of_turn><|eot_id|>")
        put("chat_format", "fmt%d_scrambled" % f, bytes([f | 0x28, 0x0a]) + b"sys\0u1\0a1\0u2")
    put("chat_format", "utf8", bytes([1, 0]) + "caf\u00e9 \U0001F600 \u65e5\u672c".encode())


def main():
    seeds_safetensors()
    seeds_gguf()
    seeds_config()
    seeds_cider_format()
    seeds_tokenizer()
    seeds_chat_format()
    total = 0
    for dirpath, _, files in os.walk(CORPUS):
        for f in files:
            total += os.path.getsize(os.path.join(dirpath, f))
    print("corpus: %d bytes under %s" % (total, os.path.relpath(CORPUS, ROOT)))
    if total > 2 * 1024 * 1024:
        sys.exit("corpus larger than 2 MB")


if __name__ == "__main__":
    main()
