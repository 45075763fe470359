#!/usr/bin/env python3
"""Drives libcider_c.so from Python through ctypes (no third-party packages): affine quantization round trip,
a K4/V3 cache with attention, an error message, and a model-level round trip on the embedded model cider-tiny
(load, tokenize, decode + greedy sampling = transformers' tokens, detokenize, trim, errors).
Usage: test_ctypes.py path/to/libcider_c.so"""
import array
import ctypes
import json
import math
import os
import random
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MAX_RANK = 8
F32, U32 = 0, 3


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_RANK)]


class KVConfig(ctypes.Structure):
    _fields_ = [("quantized", ctypes.c_int), ("k_bits", ctypes.c_int), ("v_bits", ctypes.c_int),
                ("group_size", ctypes.c_int), ("rotation", ctypes.c_int), ("seed", ctypes.c_uint64),
                ("scale_dtype", ctypes.c_int), ("plain_dtype", ctypes.c_int)]


class ModelOptions(ctypes.Structure):
    _fields_ = [("weights", ctypes.c_char_p), ("kv", ctypes.c_char_p), ("kv_rotation", ctypes.c_char_p),
                ("kv_group_size", ctypes.c_int), ("ctx", ctypes.c_int64), ("device", ctypes.c_char_p),
                ("threads", ctypes.c_int), ("kv_layout", ctypes.c_char_p), ("kv_outliers", ctypes.c_int),
                ("kv_values", ctypes.c_char_p), ("kv_recent", ctypes.c_char_p), ("imatrix", ctypes.c_char_p),
                ("head_weights", ctypes.c_char_p)]


MAX_EOS = 16


class ModelInfo(ctypes.Structure):
    _fields_ = [("vocab_size", ctypes.c_int64), ("context_length", ctypes.c_int64), ("hidden_size", ctypes.c_int64),
                ("num_layers", ctypes.c_int64), ("num_heads", ctypes.c_int64), ("num_kv_heads", ctypes.c_int64),
                ("head_dim", ctypes.c_int64), ("bos_id", ctypes.c_int32), ("num_eos", ctypes.c_int32),
                ("eos_ids", ctypes.c_int32 * MAX_EOS), ("weight_bytes", ctypes.c_size_t),
                ("architecture", ctypes.c_char_p), ("weights", ctypes.c_char_p), ("kv", ctypes.c_char_p),
                ("device", ctypes.c_char_p)]


class SamplerParams(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_double), ("top_k", ctypes.c_int64), ("top_p", ctypes.c_double),
                ("min_p", ctypes.c_double), ("repeat_penalty", ctypes.c_double), ("repeat_window", ctypes.c_int64),
                ("seed", ctypes.c_uint64)]


def header_fields():
    """The field names of each `typedef struct name { ... } name;` in include/cider/cider.h, in order."""
    with open(os.path.join(ROOT, "include", "cider", "cider.h"), encoding="utf-8") as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    structs = {}
    for name, body in re.findall(r"typedef struct (\w+) \{(.*?)\} \1;", text, flags=re.S):
        fields = []
        for decl in body.split(";"):
            decl = re.sub(r"\[[^\]]*\]", "", decl).strip()
            if decl:
                first, *rest = [d.strip() for d in decl.split(",")]
                fields += [re.findall(r"\w+", first)[-1]] + rest
        structs[name] = fields
    return structs


def check_layouts():
    """Each ctypes mirror names the header's fields in the header's order: a struct returned by value that is shorter
    than the C one is overwritten past its end (a crash or a silent corruption), so a new field must fail here."""
    structs = header_fields()
    for mirror, c_name in ((Tensor, "cider_tensor"), (KVConfig, "cider_kv_config"),
                           (ModelOptions, "cider_model_options"), (ModelInfo, "cider_model_info"),
                           (SamplerParams, "cider_sampler_params")):
        ours = [f[0] for f in mirror._fields_]
        assert c_name in structs, f"{c_name} not found in cider.h"
        assert ours == structs[c_name], f"ctypes {mirror.__name__} {ours} != cider.h {c_name} {structs[c_name]}"
    return len(structs)


def model_round_trip(lib):
    """cider-tiny with f32 weights and cache: greedy decoding through cider_decode + cider_sample gives transformers'
    tokens (tests/data/cider_tiny/reference.json), and the text round-trips through the tokenizer."""
    lib.cider_sampler_params_default.restype = SamplerParams
    lib.cider_model_options_default.restype = ModelOptions
    c = ctypes
    with open(os.path.join(ROOT, "tests", "data", "cider_tiny", "reference.json"), encoding="utf-8") as f:
        ref = json.load(f)[0]
    opts = lib.cider_model_options_default()
    opts.weights, opts.kv = b"f32", b"f32"
    model = c.c_void_p()
    path = os.path.join(ROOT, "models", "cider-tiny").encode()
    assert lib.cider_model_load(path, c.byref(opts), c.byref(model)) == 0, lib.cider_last_error()
    info = ModelInfo()
    assert lib.cider_model_info_get(model, c.byref(info)) == 0, lib.cider_last_error()
    assert (info.vocab_size, info.architecture, info.weights, info.kv) == (4096, b"llama", b"f32", b"f32"), info
    vocab = info.vocab_size

    prompt = ref["prompt"].encode()
    n = c.c_int64()
    ids = (c.c_int32 * 64)()
    assert lib.cider_tokenize(model, prompt, c.c_size_t(len(prompt)), 1, ids, c.c_int64(64), c.byref(n)) == 0
    assert list(ids[:n.value]) == ref["ids"], (list(ids[:n.value]), ref["ids"])

    session, sampler = c.c_void_p(), c.c_void_p()
    assert lib.cider_session_create(model, c.byref(session)) == 0, lib.cider_last_error()
    params = lib.cider_sampler_params_default()
    params.temperature = 0.0
    assert lib.cider_sampler_create(c.byref(params), c.byref(sampler)) == 0, lib.cider_last_error()
    want = ref["greedy"][len(ref["ids"]):]
    tokens = list(ref["ids"])
    logits = (c.c_float * vocab)()
    pending = tokens
    for _ in want:
        arr = (c.c_int32 * len(pending))(*pending)
        assert lib.cider_decode(session, arr, c.c_int64(len(pending)), logits, c.c_size_t(vocab), 0) == 0, \
            lib.cider_last_error()
        hist = (c.c_int32 * len(tokens))(*tokens)
        tok = c.c_int32()
        assert lib.cider_sample(sampler, logits, c.c_int64(vocab), hist, c.c_int64(len(tokens)), c.byref(tok)) == 0
        assert tok.value == max(range(vocab), key=lambda i: (logits[i], -i))  # greedy: the first largest logit
        tokens.append(tok.value)
        pending = [tok.value]
    assert tokens[len(ref["ids"]):] == want, (tokens, want)
    pos = c.c_int64()
    assert lib.cider_session_position(session, c.byref(pos)) == 0 and pos.value == len(tokens) - 1

    arr = (c.c_int32 * len(tokens))(*tokens)
    length = c.c_size_t()
    text = c.create_string_buffer(1024)
    assert lib.cider_detokenize(model, arr, c.c_int64(len(tokens)), 1, text, c.c_size_t(1024), c.byref(length)) == 0
    assert text.value.startswith(prompt) and len(text.value) == length.value > len(prompt), text.value

    removed = c.c_int64()
    assert lib.cider_session_trim(session, c.c_int64(3), c.byref(removed)) == 0 and removed.value == 3
    bad = (c.c_int32 * 1)(vocab)
    assert lib.cider_decode(session, bad, c.c_int64(1), logits, c.c_size_t(vocab), 0) == 4  # CIDER_ERR_OUT_OF_RANGE
    msg = lib.cider_last_error().decode()
    assert "cider_decode" in msg and f"got {vocab}" in msg, msg
    lib.cider_sampler_free(sampler)
    lib.cider_session_free(session)
    lib.cider_model_free(model)
    return len(want), text.value.decode()


def tensor(buf, dtype, shape):
    t = Tensor()
    t.data = buf.buffer_info()[0]
    t.dtype = dtype
    t.rank = len(shape)
    for i, d in enumerate(shape):
        t.shape[i] = d
    return t


def main(lib_path):
    print(f"ctypes: the mirrors of the {check_layouts()} structs of cider.h name its fields in order")
    lib = ctypes.CDLL(lib_path)
    lib.cider_last_error.restype = ctypes.c_char_p
    lib.cider_kv_config_default.restype = KVConfig
    rng = random.Random(20261129)

    # Affine quantize -> dequantize: every element within one quantization step of the input.
    rows, k = 3, 128
    w = array.array("f", [rng.gauss(0, 1) for _ in range(rows * k)])
    packed = array.array("I", [0] * (rows * k * 4 // 32))
    scales = array.array("f", [0.0] * (rows * 2))
    biases = array.array("f", [0.0] * (rows * 2))
    deq = array.array("f", [0.0] * (rows * k))
    tw, tp = tensor(w, F32, [rows, k]), tensor(packed, U32, [rows, k // 8])
    ts, tb, td = tensor(scales, F32, [rows, 2]), tensor(biases, F32, [rows, 2]), tensor(deq, F32, [rows, k])
    assert lib.cider_affine_quantize(ctypes.byref(tw), 64, 4, ctypes.byref(tp), ctypes.byref(ts), ctypes.byref(tb)) == 0
    assert lib.cider_affine_dequantize(ctypes.byref(tp), ctypes.byref(ts), ctypes.byref(tb), 64, 4, ctypes.byref(td)) == 0
    for i in range(rows * k):
        step = abs(scales[(i // k) * 2 + (i % k) // 64])
        assert abs(w[i] - deq[i]) <= 1.5 * step + 1e-6, (i, w[i], deq[i], step)

    # An error: bits 7 is rejected with a message naming the op and the value.
    assert lib.cider_affine_quantize(ctypes.byref(tw), 64, 7, ctypes.byref(tp), ctypes.byref(ts), ctypes.byref(tb)) == 1
    msg = lib.cider_last_error().decode()
    assert "affine_quantize" in msg and "got 7" in msg, msg

    # Attention through three caches against float attention on the original data: a plain f32 cache must agree
    # to float32 rounding; K8/V8 and K4/V3 (on the default rotation) within their quantization error (3-bit values of N(0,1)
    # data carry about 20% relative error per value, which averaging over keys does not remove).
    T, D = 40, 64
    keys = array.array("f", [rng.gauss(0, 1) for _ in range(T * D)])
    values = array.array("f", [rng.gauss(0, 1) for _ in range(T * D)])
    q = array.array("f", [rng.gauss(0, 1) for _ in range(D)])
    scale = 1.0 / math.sqrt(D)
    s = [scale * sum(q[d] * keys[j * D + d] for d in range(D)) for j in range(T)]
    m = max(s)
    p = [math.exp(x - m) for x in s]
    z = sum(p)
    ref = [sum(p[j] / z * values[j * D + d] for j in range(T)) for d in range(D)]
    errors = {}
    for name, quantized, bits in (("f32", 0, (0, 0)), ("k8v8", 1, (8, 8)), ("k4v3", 1, (4, 3))):
        cfg = lib.cider_kv_config_default()
        cfg.quantized = quantized
        cfg.plain_dtype = F32
        if quantized:
            cfg.k_bits, cfg.v_bits = bits
        cache = ctypes.c_void_p()
        assert lib.cider_kv_cache_create(ctypes.byref(cfg), ctypes.byref(cache)) == 0, lib.cider_last_error()
        out = array.array("f", [0.0] * D)
        tk, tv = tensor(keys, F32, [1, 1, T, D]), tensor(values, F32, [1, 1, T, D])
        tq, to = tensor(q, F32, [1, 1, 1, D]), tensor(out, F32, [1, 1, 1, D])
        assert lib.cider_kv_cache_append(cache, ctypes.byref(tk), ctypes.byref(tv)) == 0, lib.cider_last_error()
        assert lib.cider_attention(ctypes.byref(tq), cache, ctypes.c_float(scale), 1, ctypes.c_int64(0), None,
                                   ctypes.byref(to)) == 0, lib.cider_last_error()
        lib.cider_kv_cache_free(cache)
        errors[name] = math.sqrt(sum((out[d] - ref[d]) ** 2 for d in range(D)) / sum(r * r for r in ref))
    assert errors["f32"] < 1e-5, errors
    assert errors["k8v8"] < 0.02, errors
    assert errors["k4v3"] < 0.5, errors
    print("ctypes: affine round trip ok, error message ok, attention relative errors " +
          ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))
    n_tokens, text = model_round_trip(lib)
    print(f"ctypes: cider-tiny greedy {n_tokens} tokens = transformers': {text!r}")


if __name__ == "__main__":
    main(sys.argv[1])
