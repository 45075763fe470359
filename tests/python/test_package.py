"""The Python package `cider` (pip install .): every public function on fresh random inputs against NumPy float64
references (tolerances from the arithmetic, written next to each check), MLX's own vectors, the seeds' cache
semantics, and the model level against the `cider` CLI (its path in $CIDER_CLI).

Run: pytest tests/python (scripts/test_python.sh builds the wheel, installs it into a fresh venv and runs this).
Seeds: $CIDER_TEST_SEED, else a fresh one, printed in the header (pytest -s shows it; failures print it too).
"""
import json
import os
import pickle
import subprocess

import ml_dtypes
import numpy as np
import pytest

import cider

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "models", "cider-tiny")
BF16 = np.dtype(ml_dtypes.bfloat16)
# Unit roundoff of each dtype: relative error of one rounding to it.
EPS = {np.dtype(np.float32): 2.0 ** -24, np.dtype(np.float16): 2.0 ** -11, BF16: 2.0 ** -8}
SEED = int(os.environ.get("CIDER_TEST_SEED", np.random.SeedSequence().entropy % (2 ** 32)))
print(f"cider python tests: CIDER_TEST_SEED={SEED}")


@pytest.fixture
def rng(request):
    # One stream per test, reproducible from SEED and the test's name.
    return np.random.default_rng([SEED, sum(map(ord, request.node.name))])


def unpack(packed: np.ndarray, bits: int, dim: int) -> np.ndarray:
    """MLX's packing: a little-endian bit stream, code i at bits [i·bits, (i+1)·bits)."""
    raw = np.ascontiguousarray(packed).view(np.uint8)
    stream = np.unpackbits(raw, axis=-1, bitorder="little")
    stream = stream[..., : dim * bits].reshape(packed.shape[:-1] + (dim, bits)).astype(np.int64)
    return stream @ (1 << np.arange(bits, dtype=np.int64))


def f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


# ---- quantize / dequantize / quantized_matmul ---------------------------------------------------------------------
def mlx_cases():
    d = os.path.join(ROOT, "tests", "data", "mlx_affine")
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    for case in manifest["cases"]:
        raw = open(os.path.join(d, case["name"] + ".bin"), "rb").read()
        arrays = {}
        for name, f in case["files"].items():
            dt = BF16 if f["dtype"] == "bfloat16" else np.dtype(f["dtype"])
            arrays[name] = np.frombuffer(raw[f["offset"]: f["offset"] + f["nbytes"]], dtype=dt).reshape(f["shape"])
        yield case, arrays


def test_quantize_and_dequantize_equal_mlx_bit_for_bit():
    n = 0
    for case, a in mlx_cases():
        gs, bits = case["group_size"], case["bits"]
        q, s, b = cider.quantize(a["w"], group_size=gs, bits=bits)
        assert q.dtype == np.uint32 and s.dtype == a["w"].dtype, case["name"]
        assert np.array_equal(q, a["packed"]), case["name"]
        assert s.tobytes() == a["scales"].tobytes() and b.tobytes() == a["biases"].tobytes(), case["name"]
        d = cider.dequantize(a["packed"], a["scales"], a["biases"], group_size=gs, bits=bits)
        assert d.tobytes() == a["dequantized"].tobytes(), case["name"]
        # The NumPy unpacking used below reads MLX's codes: s·c + b in the dtype, rounded after the multiply and
        # after the add, is MLX's dequantization.
        dt = a["w"].dtype
        c = unpack(a["packed"], bits, a["w"].shape[-1]).astype(dt)
        want = np.repeat(a["scales"], gs, -1) * c + np.repeat(a["biases"], gs, -1)
        assert want.dtype == dt and np.array_equal(want, a["dequantized"]), case["name"]
        n += 1
    assert n == 54


def test_quantized_matmul_matches_mlx():
    for case, a in mlx_cases():
        gs, bits = case["group_size"], case["bits"]
        eps = EPS[a["y_t"].dtype]
        for transpose, x, y in ((True, a["x_t"], a["y_t"]), (False, a["x_n"], a["y_n"])):
            got = cider.quantized_matmul(x, a["packed"], a["scales"], a["biases"], transpose=transpose,
                                         group_size=gs, bits=bits)
            assert got.shape == y.shape and got.dtype == y.dtype
            wd = f64(a["dequantized"]) if transpose else f64(a["dequantized"]).T
            bias = np.repeat(f64(a["biases"]), gs, -1) if transpose else np.repeat(f64(a["biases"]), gs, -1).T
            xs = np.abs(f64(x))
            # MLX rounds its dequantized weights and sums in the input dtype, cider sums q·s + b in float32: they
            # agree to K·eps·Σ|x·w| + eps·Σ|x|·(|w| + 2|b|) + eps·|y| (tests/test_mlx_vectors.cpp).
            k = x.shape[-1]
            tol = k * eps * (xs @ np.abs(wd).T) + eps * (xs @ (np.abs(wd) + 2 * np.abs(bias)).T) + eps * np.abs(f64(y))
            assert not np.isnan(f64(got)).any()
            assert (np.abs(f64(got) - f64(y)) <= tol).all(), case["name"]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_quantize_round_trip_against_float64(rng, dtype):
    for bits in (2, 3, 4, 5, 6, 8):
        for gs in (32, 64, 128):
            rows = int(rng.integers(1, 6))
            k = gs * int(rng.integers(1, 4))
            w = (rng.standard_normal((2, rows, k)) * rng.uniform(0.1, 4)).astype(dtype)
            q, s, b = cider.quantize(w, gs, bits)
            assert q.shape == (2, rows, k * bits // 32) and s.shape == b.shape == (2, rows, k // gs)
            c = unpack(q, bits, k)
            assert c.min() >= 0 and c.max() <= 2 ** bits - 1
            sd, bd = np.repeat(f64(s), gs, -1), np.repeat(f64(b), gs, -1)
            what = sd * c + bd
            # Each value goes to the nearest point of its group's grid b + s·{0 … 2^bits − 1}: within half a step
            # inside the grid's range, else at the nearer end (MLX puts 0 and the larger-magnitude end exactly on
            # the grid, so the other end can fall outside), the step and bias themselves rounded to the dtype:
            # |w − (s·c + b)| <= |s|/2 + distance outside the range + 2·eps·(|b| + |s|·(2^bits − 1)).
            e = EPS[np.dtype(dtype)]
            top = bd + sd * (2 ** bits - 1)
            outside = np.maximum(np.maximum(np.minimum(bd, top) - f64(w), f64(w) - np.maximum(bd, top)), 0)
            tol = np.abs(sd) / 2 + outside + 2 * e * (np.abs(bd) + np.abs(sd) * (2 ** bits - 1))
            assert (np.abs(f64(w) - what) <= tol).all(), (bits, gs)
            d = cider.dequantize(q, s, b, gs, bits)
            assert d.dtype == np.dtype(dtype)
            # dequantize = s·c + b computed in float32, rounded to the dtype.
            assert (np.abs(f64(d) - what) <= (2 ** -24 * 3 + e) * (np.abs(sd * c) + np.abs(bd))).all(), (bits, gs)


@pytest.mark.parametrize("transpose", [True, False])
def test_quantized_matmul_against_float64(rng, transpose):
    for bits, gs in ((4, 64), (3, 32), (8, 128), (6, 64)):
        m, n, k = int(rng.integers(1, 9)), int(rng.integers(1, 40)), gs * int(rng.integers(1, 4))
        if not transpose:
            n = gs * int(rng.integers(1, 3))  # the output dim carries the groups then
        w = rng.standard_normal((n, k) if transpose else (k, n)).astype(np.float32)
        q, s, b = cider.quantize(w, gs, bits)
        x = rng.standard_normal((3, m, k)).astype(np.float32)
        y = cider.quantized_matmul(x, q, s, b, transpose=transpose, group_size=gs, bits=bits)
        assert y.shape == (3, m, n) and y.dtype == np.float32
        wd = f64(cider.dequantize(q, s, b, gs, bits))
        wd = wd.T if transpose else wd
        want = f64(x) @ wd
        # float32 sums of K products, each of q·s + b (2 roundings): (K + 2)·u·Σ|x·w| per output.
        tol = (k + 2) * 2.0 ** -24 * (np.abs(f64(x)) @ np.abs(wd)) * 2
        assert (np.abs(f64(y) - want) <= tol).all()
        # A batch of weights broadcasts against x's batch (NumPy rules).
        wb = np.stack([q, q])
        yb = cider.quantized_matmul(x[:1], wb, np.stack([s, s]), np.stack([b, b]), transpose, gs, bits)
        assert yb.shape == (2, m, n) and np.array_equal(yb[0], y[0]) and np.array_equal(yb[1], y[0])


def test_quantize_errors_name_the_operation_and_never_crash():
    w = np.ones((4, 64), np.float32)
    with pytest.raises(cider.ArgumentError, match=r"\[affine_quantize\] group_size must be one of 32, 64, 128; got 48"):
        cider.quantize(w, 48, 4)
    with pytest.raises(ValueError, match="bits"):
        cider.quantize(w, 64, 7)
    with pytest.raises(TypeError, match=r"\[cider.quantize\] w must be float32, float16, bfloat16; got float64"):
        cider.quantize(w.astype(np.float64))
    bad = w.copy()
    bad[1, 3] = np.nan
    with pytest.raises(cider.ArgumentError, match="finite"):
        cider.quantize(bad)
    with pytest.raises(cider.Error):
        cider.quantize(np.ones((4, 40), np.float32), 32, 4)  # K not a multiple of the group
    q, s, b = cider.quantize(w)
    with pytest.raises(cider.ArgumentError):
        cider.quantized_matmul(np.ones((2, 32), np.float32), q, s, b)  # K of x != K of w
    with pytest.raises(TypeError):
        cider.dequantize(q.astype(np.int32), s, b)
    try:
        cider.quantize(w, 48, 4)
    except cider.Error as e:
        assert e.code == 1


# ---- the KV cache -------------------------------------------------------------------------------------------------
def bytes_per_position(d_k, d_v, k_bits, v_bits, gs, scale_bytes):
    return (d_k * k_bits // 8) + (d_v * v_bits // 8) + 2 * scale_bytes * (d_k // gs + d_v // gs)


def test_kv_cache_follows_the_seeds_semantics(rng):
    # rotation "none": exactly the seeds' AsymmetricQuantizedKVCache (which rotates outside the cache).
    B, H, D, gs = 1, 2, 64, 64
    cache = cider.KVCache(k_bits=4, v_bits=3, group_size=gs, rotation="none")
    assert cache.empty() and cache.offset == 0 and cache.nbytes == 0 and cache.state is None
    assert cache.meta_state[:3] == ("64", "4", "3") and cache.is_trimmable()
    keys, values = [], []
    for n in (1, 254, 1, 1, 300):  # growth in steps of 256: capacity 256, 256, 512, 512, 768
        k = rng.standard_normal((B, H, n, D)).astype(np.float16)
        v = rng.standard_normal((B, H, n, D)).astype(np.float16)
        keys.append(k)
        values.append(v)
        (kq, ks, kb), (vq, vs, vb) = cache.update_and_fetch(k, v)
        off = sum(x.shape[2] for x in keys)
        assert cache.offset == off and kq.shape == (B, H, off, D * 4 // 32) and vq.shape == (B, H, off, D * 3 // 32)
        cap = -(-off // 256) * 256
        assert cache.nbytes == B * H * cap * bytes_per_position(D, D, 4, 3, gs, 2)
        # What was appended is stored as mx.quantize stores it (same dtype: float16 scales from float16 data).
        wq, wsc, wb = cider.quantize(np.concatenate(keys, 2), gs, 4)
        assert np.array_equal(kq, wq) and np.array_equal(ks, wsc) and np.array_equal(kb, wb)
        wq, wsc, wb = cider.quantize(np.concatenate(values, 2), gs, 3)
        assert np.array_equal(vq, wq) and np.array_equal(vs, wsc) and np.array_equal(vb, wb)
    assert not kq.flags.writeable
    # trim, then appends continue from there.
    assert cache.trim(10) == 10 and cache.offset == 547
    assert cache.trim(10_000) == 547 and cache.offset == 0 and not cache.empty()
    k = rng.standard_normal((B, H, 3, D)).astype(np.float16)
    (kq, _, _), _ = cache.update_and_fetch(k, k)
    assert kq.shape[2] == 3 and np.array_equal(kq, cider.quantize(k, gs, 4)[0])


@pytest.mark.parametrize("layout", ["token", "channel"])
def test_kv_state_round_trips_through_pickle_and_from_state(rng, layout):
    cache = cider.KVCache(k_bits=4, v_bits=4, group_size=32, rotation="hadamard", layout=layout, seed=7,
                          scale_dtype="bfloat16")
    k = rng.standard_normal((2, 2, 70, 64)).astype(np.float32)
    v = rng.standard_normal((2, 2, 70, 32)).astype(np.float32)
    cache.update_and_fetch(k, v)
    st, meta = cache.state, cache.meta_state
    assert meta == ("32", "4", "4", "hadamard", layout, "7", "bfloat16")
    assert len(st[0]) == (4 if layout == "channel" else 3) and len(st[1]) == 3
    if layout == "channel":  # scales per block of 32 positions and channel; the newest 6 positions in bf16
        assert st[0][1].shape == (2, 2, 3, 64) and st[0][3].shape == (2, 2, 32, 64) and st[0][3].dtype == BF16
    for other in (pickle.loads(pickle.dumps(cache)), cider.KVCache.from_state(st, meta)):
        assert other.offset == 70 and other.meta_state == meta
        for a, b in zip(sum(map(list, other.state), []), sum(map(list, st), [])):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        q = rng.standard_normal((2, 4, 5, 64)).astype(np.float32)
        assert np.array_equal(cider.attention(q, other, 0.125, "causal"), cider.attention(q, cache, 0.125, "causal"))
    # Snapshots: restore brings back the state and the length.
    snap = cache.snapshot()
    cache.trim(30)
    cache.update_and_fetch(k[:, :, :5], v[:, :, :5])
    cache.restore(snap)
    assert cache.offset == 70 and all(np.array_equal(a, b) for a, b in zip(cache.state[1], st[1]))
    # Assigning state checks every array against the configuration.
    bad = (st[0], (st[1][0][..., :-1], st[1][1], st[1][2]))
    with pytest.raises(cider.ArgumentError, match="value codes"):
        cider.KVCache.from_state(bad, meta)
    with pytest.raises(cider.ArgumentError, match="empty cache"):
        cache.meta_state = ("64", "4", "3")


def test_seed_meta_state_and_plain_caches(rng):
    cache = cider.KVCache()
    cache.meta_state = ("32", "2", "8")  # the seeds' three strings: the rest stays
    assert cache.meta_state[:4] == ("32", "2", "8", "hadamard")
    plain = cider.KVCache(format="bf16")
    assert plain.meta_state == ("bf16", "none", "0") and not plain.quantized
    k = rng.standard_normal((1, 1, 4, 32)).astype(np.float32)
    keys, values = plain.update_and_fetch(k, k)
    assert keys.dtype == BF16 and np.array_equal(keys, k.astype(BF16))
    again = pickle.loads(pickle.dumps(plain))
    assert np.array_equal(again.state[0], keys)


def dequantized_cache(cache):
    """The cache's stored keys and values as float64 [B, H, L, D], in the rotated basis (NumPy, from the state)."""
    st = cache.state
    meta = cache.meta_state
    gs, kb, vb, layout = int(meta[0]), int(meta[1]), int(meta[2]), meta[4]
    (kq, ks, kbias, *window), (vq, vs, vbias) = st
    L = kq.shape[2]
    dk = window[0].shape[-1] if window else ks.shape[-1] * gs
    dv = vs.shape[-1] * gs
    values = f64(np.repeat(vs, gs, -1)) * unpack(vq, vb, dv) + f64(np.repeat(vbias, gs, -1))
    if layout == "token":
        keys = f64(np.repeat(ks, gs, -1)) * unpack(kq, kb, dk) + f64(np.repeat(kbias, gs, -1))
    else:  # per channel over blocks of gs positions; the incomplete last block is the bf16 window
        blocks = np.repeat(np.arange(-(-L // gs)), gs)[:L]
        keys = f64(ks[:, :, blocks, :]) * unpack(kq, kb, dk) + f64(kbias[:, :, blocks, :])
        full = L // gs * gs
        keys[:, :, full:, :] = f64(window[0][:, :, : L - full, :])
    return keys, values


def rotation_matrix(kind, dim, seed):
    """The cache's rotation R (stored row = row·R), read back from a plain float32 cache with that rotation."""
    c = cider.KVCache(format="f32", rotation=kind, seed=seed)
    eye = np.eye(dim, dtype=np.float32)[None, None]
    keys, _ = c.update_and_fetch(eye, eye)
    return f64(keys[0, 0])


@pytest.mark.parametrize("rotation,layout,bits", [("none", "token", (4, 3)), ("hadamard", "token", (8, 4)),
                                                  ("so4-full", "token", (4, 3)), ("hadamard", "channel", (4, 4)),
                                                  ("none", "channel", (5, 5))])
def test_gqa_attention_against_float64(rng, rotation, layout, bits):
    B, Hkv, group, D, kL, L, seed = 2, 2, 3, 64, int(rng.integers(70, 200)), 4, 11
    cache = cider.KVCache(k_bits=bits[0], v_bits=bits[1], group_size=32, rotation=rotation, layout=layout, seed=seed)
    k = rng.standard_normal((B, Hkv, kL, D)).astype(np.float32)
    v = rng.standard_normal((B, Hkv, kL, D)).astype(np.float32)
    cache.update_and_fetch(k[:, :, : kL // 2], v[:, :, : kL // 2])
    cache.update_and_fetch(k[:, :, kL // 2:], v[:, :, kL // 2:])
    q = rng.standard_normal((B, Hkv * group, L, D)).astype(np.float32)
    scale = D ** -0.5
    R = rotation_matrix(rotation, D, seed)
    Rk = np.eye(D) if layout == "channel" else R  # per-channel keys are not rotated
    kd, vd = dequantized_cache(cache)
    kd = np.repeat(kd, group, axis=1)
    vd = np.repeat(vd, group, axis=1)
    qr = f64(q) @ Rk
    pos_q = np.arange(kL - L, kL)[:, None]
    pos_k = np.arange(kL)[None, :]
    masks = {"none": None, "causal": pos_k <= pos_q, "window": (pos_k <= pos_q) & (pos_k > pos_q - 40)}
    bool_mask = rng.random((B, 1, L, kL)) < 0.7
    bool_mask[..., -1] = True
    additive = np.where(rng.random((1, Hkv * group, L, kL)) < 0.2, -np.inf, rng.standard_normal((1, 1, L, kL)))
    additive[..., 0] = 0.0
    cases = [(None, 0, None), ("causal", 0, masks["causal"]), ("causal", 40, masks["window"]),
             (bool_mask, 0, bool_mask), (additive.astype(np.float32), 0, additive)]
    vmax = np.abs(vd).max()
    # Only the query is rounded before the scores (to 16 bits per element against max|q|: step max|q|/127/256),
    # moving each score by δ <= scale·Σ_k (step/2)·|k̂_jk| and the output by (e^{2δ} − 1)·max|v̂| (docs/kv_cache.md
    # §3); float32 sums add 2e-5·max|v̂| (as tests/test_attention.cpp).
    step = np.abs(q).max(axis=-1, keepdims=True) / 127 / 256
    delta = scale * (step[..., 0].max() / 2) * np.abs(kd).sum(-1).max()
    tol = (np.expm1(2 * delta) + 2e-5) * vmax
    for mask, window, m in cases:
        got = cider.attention(q, cache, scale, mask, window)
        s = np.einsum("bhld,bhkd->bhlk", qr, kd) * scale
        if m is not None:
            s = np.where(m, s, -np.inf) if m.dtype == np.bool_ else s + m
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        want = (p @ vd) @ R.T  # values come back out of the rotation
        assert got.shape == (B, Hkv * group, L, D) and got.dtype == np.float32
        assert not np.isnan(got).any()
        err = np.abs(f64(got) - want).max()
        assert err <= tol, (mask if isinstance(mask, str) else type(mask), window, err, tol)


def test_attention_and_cache_errors(rng):
    cache = cider.KVCache()
    q = np.zeros((1, 2, 1, 64), np.float32)
    with pytest.raises(cider.ArgumentError, match="empty"):
        cider.attention(q, cache, 1.0)
    k = rng.standard_normal((1, 2, 3, 64)).astype(np.float32)
    cache.update_and_fetch(k, k)
    with pytest.raises(cider.ArgumentError):
        cache.update_and_fetch(k[..., :32], k[..., :32])  # head dims are fixed by the first append
    with pytest.raises(cider.ArgumentError):
        cider.attention(np.zeros((1, 3, 1, 64), np.float32), cache, 1.0)  # 3 heads over 2
    with pytest.raises(cider.ArgumentError, match="causal"):
        cider.attention(q, cache, 1.0, "sliding")
    with pytest.raises(cider.ArgumentError):
        cider.KVCache(k_bits=7)
    with pytest.raises(cider.ArgumentError):
        cider.KVCache(rotation="fourier")
    with pytest.raises(cider.ArgumentError, match="scale_dtype"):
        cider.KVCache(scale_dtype="int8")
    bad = k.copy()
    bad[0, 0, 0, 0] = np.inf
    with pytest.raises(cider.ArgumentError, match="finite"):
        cache.update_and_fetch(bad, bad)
    assert cache.offset == 3


# ---- linear layers ------------------------------------------------------------------------------------------------
def linear_bound(x, w, w_step_rows, bias_abs=0.0):
    """|y − x·wᵀ| for int8 activations per token (step max|x|/127) and weights within w_step/2 of w:
    Σ_k |Δx||w| + |x||Δw| + |Δx||Δw|, plus float32 rounding of the sums (K·u·Σ|x||w|)."""
    xs = np.abs(f64(x))
    dx = xs.max(-1, keepdims=True) / 127 / 2
    dw = w_step_rows / 2
    aw = np.abs(f64(w))
    k = x.shape[-1]
    return dx * aw.sum(-1) + xs @ dw.T + dx * dw.sum(-1) + (k + 4) * 2.0 ** -24 * (xs @ (aw + dw).T + bias_abs) * 4


@pytest.mark.parametrize("cls,qmax", [(cider.Int8Linear, 127), (cider.W4A8Linear, 7)])
def test_linear_layers_against_float64(rng, cls, qmax):
    for gs in (0, 64, 128):
        n, k = int(rng.integers(1, 50)), 128 * int(rng.integers(1, 3))
        w = rng.standard_normal((n, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        layer = cls.from_float(w, bias=bias, group_size=gs)
        assert (layer.input_dims, layer.output_dims, layer.group_size) == (k, n, gs) and layer.nbytes > 0
        g = k if gs == 0 else gs
        wmax = np.abs(f64(w)).reshape(n, k // g, g).max(-1)  # symmetric: step max|w|/qmax per channel or group
        step = np.repeat(wmax / qmax, g, -1)
        for m in (1, int(rng.integers(2, 20))):  # one row: the GEMV kernel; several: GEMM
            x = rng.standard_normal((m, k)).astype(np.float32)
            y = layer(x)
            want = f64(x) @ f64(w).T + f64(bias)
            assert y.shape == (m, n) and y.dtype == np.float32
            assert (np.abs(f64(y) - want) <= linear_bound(x, w, step, np.abs(bias))).all(), (gs, m)
        # Other input dtypes give their own dtype back.
        xb = rng.standard_normal((2, 3, k)).astype(BF16)
        assert layer(xb).dtype == BF16 and layer(xb).shape == (2, 3, n)


def test_linear_from_mlx_requantizes_the_dequantized_weight(rng):
    n, k = 24, 256
    w = rng.standard_normal((n, k)).astype(np.float16)
    q, s, b = cider.quantize(w, 64, 4)
    wd = f64(cider.dequantize(q, s, b, 64, 4))
    for cls, qmax in ((cider.Int8Linear, 127), (cider.W4A8Linear, 7)):
        layer = cls.from_mlx(q, s, b, bits=4, group_size=64, target_group_size=64)
        x = rng.standard_normal((5, k)).astype(np.float32)
        step = np.repeat(np.abs(wd).reshape(n, k // 64, 64).max(-1) / qmax, 64, -1)
        assert (np.abs(f64(layer(x)) - f64(x) @ wd.T) <= linear_bound(x, wd, step)).all()
    # The seeds' name and a layer object with .weight / .bias work too.
    class Lin:
        weight = w.astype(np.float32)
        bias = None
    assert cider.CiderLinear.from_float(Lin(), clip_percentile=99.9).output_dims == n
    with pytest.raises(cider.ArgumentError, match="clip_percentile"):
        cider.Int8Linear.from_float(w, clip_percentile=150.0)
    with pytest.raises(cider.ArgumentError):
        cider.Int8Linear.from_float(w, group_size=48)
    with pytest.raises(cider.ArgumentError):
        cider.Int8Linear.from_float(w)(np.ones((2, 100), np.float32))


# ---- model level --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    return cider.load(TINY)


def cli():
    path = os.environ.get("CIDER_CLI")
    if not path:
        pytest.skip("set CIDER_CLI to the built `cider` (scripts/test_python.sh does)")
    return path


def run_cli(*args):
    r = subprocess.run([cli(), *args], capture_output=True, text=True, check=True)
    return r.stdout


def test_load_and_tokenizer_match_transformers(tiny):
    ref = json.load(open(os.path.join(ROOT, "tests", "data", "cider_tiny", "reference.json")))
    f32 = cider.load(TINY, weights="f32", kv="f32")
    assert tiny.info["architecture"] == "llama" and tiny.info["vocab_size"] == 4096
    for e in ref:
        ids = tiny.tokenizer.encode(e["prompt"])
        assert ids == e["ids"]
        assert tiny.tokenizer.decode(ids, skip_special_tokens=True) == e["prompt"]
        # f32 weights and cache: transformers' greedy continuation, and its logits to float32 summation error.
        g = f32.generate(ids, max_tokens=len(e["greedy"]) - len(ids), temperature=0)
        assert g.tokens == e["greedy"][len(ids):]
        logits = f32.logits(ids)
        want = np.array(e["logits"], np.float64).reshape(logits.shape)
        assert np.abs(logits - want).max() <= 1e-3 * np.abs(want).max()


@pytest.mark.parametrize("sampling", [["--temperature", "0"], ["--temperature", "0.9", "--seed", "1234"],
                                      ["--temperature", "0.7", "--top-k", "10", "--top-p", "0.8", "--min-p", "0.02",
                                       "--repeat-penalty", "1.2", "--seed", "77"]])
def test_generate_equals_the_cli(tiny, sampling):
    out = run_cli("generate", "-m", TINY, "-p", "The Python interpreter", "--max-tokens", "40", *sampling)
    opts = dict(zip(sampling[::2], sampling[1::2]))
    kw = dict(temperature=float(opts["--temperature"]), seed=int(opts.get("--seed", 0)))
    if "--top-k" in opts:
        kw.update(top_k=int(opts["--top-k"]), top_p=float(opts["--top-p"]), min_p=float(opts["--min-p"]),
                  repetition_penalty=float(opts["--repeat-penalty"]))
    g = tiny.generate("The Python interpreter", max_tokens=40, **kw)
    assert out == g.text + "\n"
    assert g.generation_tokens == len(g.tokens) and g.prompt_tokens == 4 and g.finish_reason in ("max tokens", "eos")
    pieces = list(tiny.generate("The Python interpreter", max_tokens=40, stream=True, **kw))
    assert "".join(pieces) == g.text and len(pieces) > 1


def test_streams_stop_early_and_report_stats(tiny):
    s = tiny.generate("Once upon a time", max_tokens=200, temperature=0, stream=True)
    first = next(iter(s))
    s.close()  # stops the worker at its next token
    assert isinstance(first, str) and s.result is None
    s = tiny.generate("Once upon a time", max_tokens=12, temperature=0, stream=True)
    text = "".join(s)
    assert s.result.text == text and s.result.generation_tokens == 12 and s.result.generation_tps > 0
    g = tiny.generate("Once upon a time", max_tokens=50, temperature=0, stop=["the"])
    assert "the" not in g.text and g.finish_reason in ("stop string", "eos", "max tokens")
    with pytest.raises(cider.ArgumentError):
        tiny.generate("x", max_tokens=5, temperature=-1)
    with pytest.raises(cider.ArgumentError):
        tiny.generate([999999], max_tokens=5)


def test_chat_messages_and_sessions(tiny):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is Python?"}]
    assert tiny.chat_format == "raw"  # a base model: the conversation as plain text
    prompt = tiny.chat_prompt(msgs)
    assert "What is Python?" in prompt
    g = tiny.generate(msgs, max_tokens=10, temperature=0)
    assert g.tokens == tiny.generate(prompt, max_tokens=10, temperature=0).tokens
    with pytest.raises(cider.ArgumentError, match="role"):
        tiny.chat_prompt([{"role": "assistant", "content": "hi"}])
    # A session continues where it stopped; decode returns the logits the model gives for the whole sequence.
    s = tiny.session()
    ids = tiny.tokenizer.encode("The Python interpreter reads")
    last = s.decode(ids[:3])
    rows = s.decode(ids[3:], all_logits=True)
    whole = tiny.logits(ids)
    assert s.position == len(ids) and s.kv_bytes > 0
    assert np.allclose(last, whole[2], rtol=0, atol=1e-4 * np.abs(whole).max())
    assert np.allclose(rows, whole[3:], rtol=0, atol=1e-4 * np.abs(whole).max())
    assert s.trim(2) == 2 and s.position == len(ids) - 2


def test_perplexity_equals_the_cli(tiny, tmp_path):
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()[:6000]
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    r = tiny.perplexity(text, ctx=128, baseline={"kv": "bf16"})
    assert r.windows >= 3 and r.kl is not None and r.kl >= 0 and 0 < r.top1 <= 1 and r.ppl > 1
    out = run_cli("perplexity", "-m", TINY, "-f", str(path), "--ctx", "128", "--baseline-kv", "bf16")
    body = out.split("\n", 1)[1]  # the CLI's first line names the file and the formats
    assert body.strip() == r.report.strip()
    plain = tiny.perplexity(text, ctx=128)
    assert plain.kl is None and plain.ppl == r.ppl
    with pytest.raises(cider.ArgumentError, match="ctx"):
        tiny.perplexity(text, ctx=1)


def test_outlier_key_channels_equal_the_cli(tmp_path):
    # kv_outliers: per-channel keys with 2 refined channels per block; the same numbers as the CLI's options.
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()[:6000]
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    m = cider.load(TINY, kv="k4v4", kv_layout="channel", kv_outliers=2)
    assert m.info["kv"] == "k4v4/hadamard/g64/kchan/o2"
    r = m.perplexity(text, ctx=128, baseline={"kv": "bf16"})
    assert r.kl is not None and 0 < r.kl < 0.05
    out = run_cli("perplexity", "-m", TINY, "-f", str(path), "--ctx", "128", "--kv", "k4v4", "--kv-layout", "channel",
                  "--kv-outliers", "2", "--baseline-kv", "bf16")
    assert out.split("\n", 1)[1].strip() == r.report.strip()
    # "auto": head_dim/32; the default cache has them, an explicit kv none unless asked
    assert cider.load(TINY, kv="k4v4", kv_layout="channel", kv_outliers="auto").info["kv"] == "k4v4/hadamard/g64/kchan/o2"
    assert cider.load(TINY).info["kv"] == "k4v4/hadamard/g64/kchan/o2/vsym/rx"
    assert cider.load(TINY, kv="k5v4", kv_layout="channel").info["kv"] == "k5v4/hadamard/g64/kchan"
    assert cider.load(TINY, kv="k4v4", kv_values="symmetric").info["kv"] == "k4v4/hadamard/g64/vsym"
    assert cider.load(TINY, kv="k4v4", kv_layout="channel", kv_recent="exact").info["kv"] == "k4v4/hadamard/g64/kchan/rx"
    with pytest.raises(cider.ArgumentError, match="kv recent"):
        cider.load(TINY, kv="k4v4", kv_layout="channel", kv_recent="sometimes")
    with pytest.raises(cider.ArgumentError, match="kv_outliers"):
        cider.load(TINY, kv_outliers="many")


def test_load_errors():
    with pytest.raises(cider.Error, match="weights"):
        cider.load(TINY, weights="w3a3")
    with pytest.raises(cider.Error):
        cider.load(os.path.join(ROOT, "no-such-model"))
    with pytest.raises(cider.Error, match="device"):
        cider.load(TINY, device="tpu")


def test_imatrix_weights_the_block_fits(tmp_path):
    # An importance file from `cider imatrix` reaches the loader: a requantizing format takes it (and computes
    # finite logits), bf16 refuses it by name.
    imx = str(tmp_path / "imx.safetensors")
    subprocess.run([cli(), "imatrix", "-m", TINY, "-f", os.path.join(ROOT, "docs", "kv_cache.md"), "-o", imx,
                    "--ctx", "64", "--chunks", "2"], capture_output=True, text=True, check=True)
    fitted = cider.load(TINY, weights="q4_k", imatrix=imx).logits([1, 2, 3])
    plain = cider.load(TINY, weights="q4_k").logits([1, 2, 3])
    assert np.isfinite(fitted).all() and fitted.shape == plain.shape
    assert not np.array_equal(fitted, plain)  # other blocks
    with pytest.raises(cider.Error, match="--imatrix weights the fits of a requantizing block format"):
        cider.load(TINY, weights="bf16", imatrix=imx)
    # head_weights: the LM head's block type (Q5_0 here: other logits than the Q8_0 head's); refused for bf16.
    q5 = cider.load(TINY, weights="q4_k", imatrix=imx, head_weights="q5_0").logits([1, 2, 3])
    assert np.isfinite(q5).all() and not np.array_equal(q5, fitted)
    with pytest.raises(cider.Error, match="--head-weights sets the LM head's block type"):
        cider.load(TINY, weights="bf16", head_weights="q5_0")


def test_the_readme_examples_run():
    # examples/python: the two examples of the README's Python section, run as a user would (from the repository).
    import sys
    for name, expect in (("model_level.py", r"\(3, 4096\) ppl [0-9.]+ \(baseline [0-9.]+\), KL 0\.[0-9]+, top-1"),
                         ("seeds_level.py", r"\(1, 8, 300, 16\) \(1, 8, 300, 12\) \(1, 32, 1, 128\) 256 "
                                            r"\('64', '4', '3'\) 524288 Int8Linear")):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python", name)], cwd=ROOT,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        import re
        assert re.search(expect, r.stdout), r.stdout


def test_hostile_inputs_raise_and_never_crash(tiny):
    # Wrong ranks, shapes, dtypes, sizes and values to every entry point: each raises (cider.Error, TypeError or
    # ValueError) and the process goes on.
    f = np.ones((4, 64), np.float32)
    q, s, b = cider.quantize(f)
    cache = cider.KVCache()
    cache.update_and_fetch(np.ones((1, 2, 3, 64), np.float32), np.ones((1, 2, 3, 64), np.float32))
    layer = cider.Int8Linear.from_float(f)
    calls = [
        lambda: cider.quantize(np.float32(1.0)),
        lambda: cider.quantize(np.ones((0, 64), np.float32), 64, 0),
        lambda: cider.quantize(f, 0, 4),
        lambda: cider.quantize(f, -64, 4),
        lambda: cider.quantize(np.array(["a"])),
        lambda: cider.quantize([[1.0] * 64]),  # float64 from a list
        lambda: cider.dequantize(q, s, b, 64, 0),
        lambda: cider.dequantize(q, s[:, :0], b[:, :0]),
        lambda: cider.dequantize(q, s.astype(np.float16), b),
        lambda: cider.quantized_matmul(f, q, s, b, bits=3),
        lambda: cider.quantized_matmul(f[0], q[0], s, b),
        lambda: cider.quantized_matmul(np.ones((2, 3, 64), np.float32), np.stack([q] * 4), np.stack([s] * 4),
                                       np.stack([b] * 4)),
        lambda: cache.update_and_fetch(np.ones((3, 64), np.float32), np.ones((3, 64), np.float32)),
        lambda: cache.update_and_fetch(np.ones((2, 2, 3, 64), np.float32), np.ones((2, 2, 3, 64), np.float32)),
        lambda: cache.update_and_fetch(np.ones((1, 2, 3, 64), np.float32), np.ones((1, 2, 4, 64), np.float32)),
        lambda: cider.attention(np.ones((1, 2, 4, 64), np.float32), cache, 1.0),  # L > offset
        lambda: cider.attention(np.ones((1, 2, 1, 32), np.float32), cache, 1.0),
        lambda: cider.attention(np.ones((1, 2, 1, 64), np.float32), cache, float("nan")),
        lambda: cider.attention(np.ones((1, 2, 1, 64), np.float32), cache, 1.0, np.ones((5, 7), bool)),
        lambda: cider.attention(np.ones((1, 2, 1, 64), np.float32), cache, 1.0, np.full((1, 1, 1, 3), np.nan,
                                                                                         np.float32)),
        lambda: cider.attention(np.ones((1, 2, 1, 64), np.float32), cache, 1.0, "causal", -3),
        lambda: cider.KVCache.from_state(((q,), (q,)), cache.meta_state),
        lambda: cider.KVCache.from_state(cache.state, ("64", "4")),
        lambda: cider.KVCache.from_state(cache.state, ("x", "4", "3")),
        lambda: setattr(cider.KVCache(), "meta_state", ("64", "9", "3")),
        lambda: cache.trim(-1),
        lambda: layer(np.ones((2, 63), np.float32)),
        lambda: layer(np.float32(3.0)),
        lambda: cider.Int8Linear.from_float(np.ones(64, np.float32)),
        lambda: cider.Int8Linear.from_float(f, bias=np.ones(3, np.float32)),
        lambda: cider.W4A8Linear.from_mlx(q, s, b, bits=4, group_size=32),
        lambda: cider.W4A8Linear.from_mlx(q.astype(np.int32), s, b),
        lambda: cider.set_threads(0),
        lambda: cider.set_threads(10 ** 6),
        lambda: tiny.logits([]),
        lambda: tiny.logits([-1]),
        lambda: tiny.logits(list(range(2000))),  # past the context
        lambda: tiny.session().decode([5000]),
        lambda: tiny.session().trim(-2),
        lambda: tiny.generate("x", max_tokens=-1),
        lambda: tiny.generate("x", max_tokens=3, top_p=0),
        lambda: tiny.generate("x", max_tokens=3, stop=[""]),
        lambda: tiny.generate([{"role": "user"}]),
        lambda: tiny.tokenizer.decode([4096]),
        lambda: tiny.perplexity("short", ctx=512),
        lambda: cider.load(TINY, ctx=-5),
        lambda: cider.load(TINY, kv="k9v9"),
        lambda: cider.load(TINY, kv="bf16", kv_layout="channel"),
        lambda: cider.load(TINY, kv="k4v4", kv_outliers=2),  # outlier channels refine per-channel keys only
        lambda: cider.load(TINY, kv="k4v4", kv_layout="channel", kv_outliers=40),
    ]
    for i, call in enumerate(calls):
        with pytest.raises((cider.Error, TypeError, ValueError, KeyError)):
            call()
    assert cache.offset == 3 and tiny.generate("x", max_tokens=2, temperature=0).generation_tokens == 2
