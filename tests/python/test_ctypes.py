#!/usr/bin/env python3
"""Drives libcider_c.so from Python through ctypes (no third-party packages): affine quantization round trip,
a K4/V3 cache with attention, and an error message. Usage: test_ctypes.py path/to/libcider_c.so"""
import array
import ctypes
import math
import random
import sys

MAX_RANK = 8
F32, U32 = 0, 3


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_RANK)]


class KVConfig(ctypes.Structure):
    _fields_ = [("quantized", ctypes.c_int), ("k_bits", ctypes.c_int), ("v_bits", ctypes.c_int),
                ("group_size", ctypes.c_int), ("rotation", ctypes.c_int), ("seed", ctypes.c_uint64),
                ("scale_dtype", ctypes.c_int), ("plain_dtype", ctypes.c_int)]


def tensor(buf, dtype, shape):
    t = Tensor()
    t.data = buf.buffer_info()[0]
    t.dtype = dtype
    t.rank = len(shape)
    for i, d in enumerate(shape):
        t.shape[i] = d
    return t


def main(lib_path):
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


if __name__ == "__main__":
    main(sys.argv[1])
