#!/usr/bin/env python3
"""Generates the GGUF test fixtures for cider's reader and dequantizers (tests/data/gguf/).

Uses the `gguf` package from PyPI (llama.cpp's own Python library, an implementation independent of cider's):
    python3 -m venv /tmp/ggufenv && /tmp/ggufenv/bin/pip install gguf numpy
    /tmp/ggufenv/bin/python tools/gen_gguf_fixtures.py tests/data/gguf
CI does not need Python packages: the generated files are committed and read by tests/test_gguf.cpp.

Writes:
  tensors.gguf    metadata of every GGUF value type (scalars and arrays) and tensors of every type cider
                  dequantizes (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), plus two
                  of types cider keeps but does not dequantize (IQ4_NL, I32).
                  Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/BF16 data comes from gguf-py's own quantizers applied to random values;
                  gguf-py has no quantizer for the K-quants, so those (and one extra tensor per 32-block type) are
                  random valid blocks: uniformly random bytes with the f16 scale fields replaced by sane random f16
                  values, so every bit pattern of the codes and packed sub-block scales is exercised.
  align64.gguf    general.alignment = 64, tensors whose sizes are not multiples of 64 (padding between them).
  reference.bin   float32 little-endian: gguf-py's dequantization (gguf.quants.dequantize) of each tensor,
                  back to back in manifest order.
  manifest.json   the metadata written (key, value type, values), and per tensor: name, ggml type, ne (as
                  gguf-py's GGUFReader reads it back), absolute data offset and byte size (from GGUFReader), and the
                  element offset / count of its reference values.
"""
import json
import os
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

SEED = 20260611


def f16_bytes(values):
    return np.asarray(values, dtype=np.float16).view(np.uint8)


def random_blocks(rng, qtype, n_blocks):
    """Random valid blocks: random bytes, with every f16 scale field set to a finite random value of sane size."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    # Byte offsets of the f16 scale fields within one block (see docs/checkpoint_formats.md).
    f16_fields = {
        QT.Q8_0: [0], QT.Q4_0: [0], QT.Q4_1: [0, 2], QT.Q5_0: [0], QT.Q5_1: [0, 2],
        QT.Q2_K: [80, 82], QT.Q3_K: [108], QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208],
        QT.IQ4_NL: [0],
    }[qtype]
    for off in f16_fields:
        # Mostly N(0, 0.05) scales (negative ones too), with a few f16 subnormals and zeros mixed in.
        vals = rng.normal(0.0, 0.05, size=n_blocks)
        vals[rng.random(n_blocks) < 0.1] = 0.0
        sub = rng.random(n_blocks) < 0.1
        vals[sub] = rng.uniform(-6e-5, 6e-5, size=int(sub.sum()))
        b[:, off:off + 2] = f16_bytes(vals).reshape(n_blocks, 2)
    return b


def add_metadata(w, meta):
    """Writes each (key, value type, value, element type) and records it for the manifest."""
    entries = [
        ("test.u8", VT.UINT8, 200), ("test.i8", VT.INT8, -100),
        ("test.u16", VT.UINT16, 60000), ("test.i16", VT.INT16, -30000),
        ("test.u32", VT.UINT32, 4000000000), ("test.i32", VT.INT32, -2000000000),
        ("test.u64", VT.UINT64, 2**63 + 12345), ("test.u64_small", VT.UINT64, 7),
        ("test.i64", VT.INT64, -(2**62) - 3),
        ("test.f32", VT.FLOAT32, float(np.float32(0.1))), ("test.f64", VT.FLOAT64, 3.141592653589793),
        ("test.bool_true", VT.BOOL, True), ("test.bool_false", VT.BOOL, False),
        ("test.string", VT.STRING, "h\u00e9llo \u2713 \u4e16\u754c"),
    ]
    for key, vt, val in entries:
        w.add_key_value(key, val, vt)
        meta.append({"key": key, "type": int(vt), "is_array": False, "values": [val]})
    arrays = [
        ("test.arr_u8", VT.UINT8, [0, 1, 255]), ("test.arr_i8", VT.INT8, [-128, 0, 127]),
        ("test.arr_u16", VT.UINT16, [65535, 2]), ("test.arr_i16", VT.INT16, [-32768, 32767]),
        ("test.arr_u32", VT.UINT32, [4294967295, 0]), ("test.arr_i32", VT.INT32, [-5, 6, -7, 8]),
        ("test.arr_u64", VT.UINT64, [9, 10]), ("test.arr_i64", VT.INT64, [-(2**63), 2**63 - 1]),
        ("test.arr_f32", VT.FLOAT32, [float(np.float32(x)) for x in (0.5, -1.25, 3.3, 1e-30)]),
        ("test.arr_f64", VT.FLOAT64, [1e300, -2.5, 0.1]),
        ("test.arr_bool", VT.BOOL, [True, False, True]),
        ("test.arr_str", VT.STRING, ["alpha", "", "\u00fc\u00f1\u00ee", "a b\nc"]),
    ]
    for key, et, vals in arrays:
        w.add_key_value(key, vals, VT.ARRAY, sub_type=et)
        meta.append({"key": key, "type": int(et), "is_array": True, "values": vals})


def write_file(path, arch, tensors, meta_fn=None, alignment=None):
    """tensors: list of (name, array, raw_dtype or None). Returns the manifest entries of the metadata written."""
    w = gguf.GGUFWriter(path, arch)
    meta = [{"key": "general.architecture", "type": int(VT.STRING), "is_array": False, "values": [arch]}]
    if alignment is not None:
        w.add_custom_alignment(alignment)
        meta.append({"key": "general.alignment", "type": int(VT.UINT32), "is_array": False, "values": [alignment]})
    if meta_fn is not None:
        meta_fn(w, meta)
    for name, arr, raw in tensors:
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return meta


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)

    def randw(shape):
        # Rows of different magnitudes, as real weights have.
        w = rng.standard_normal(shape).astype(np.float32)
        return w * rng.uniform(0.01, 2.0, size=shape[:-1] + (1,)).astype(np.float32)

    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3e-39, 3.0e38, 65504.0, 6e-8],
                        dtype=np.float32)

    tensors = []  # (name, array to write, raw dtype, ggml type, quantizer note)
    f32 = randw((3, 7))
    f32.flat[:len(specials)] = specials
    tensors.append(("t.f32", f32, None))
    f16 = randw((2, 3, 5)).astype(np.float16)
    with np.errstate(over="ignore"):  # 3e38 -> inf in f16 is intended
        f16.flat[:len(specials)] = specials.astype(np.float16)
    tensors.append(("t.f16", f16, None))
    bf = randw((5, 9))
    bf.flat[:len(specials)] = specials
    tensors.append(("t.bf16", gguf.quants.quantize(bf, QT.BF16), QT.BF16))
    tensors.append(("t.f32_1d", randw((11,)), None))

    for qt in (QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1):
        name = qt.name.lower()
        w = randw((4, 96))
        w[0, :32] = 0.0                      # all-zero block
        w[1, :32] = np.abs(w[1, :32])        # one-signed blocks
        w[1, 32:64] = -np.abs(w[1, 32:64])
        tensors.append((f"t.{name}", gguf.quants.quantize(w, qt), qt))
        tensors.append((f"t.{name}.raw", random_blocks(rng, qt, 6).reshape(3, -1), qt))
    tensors.append(("t.q8_0.3d", gguf.quants.quantize(randw((2, 3, 64)), QT.Q8_0), QT.Q8_0))

    for qt in (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K):
        name = qt.name.lower()
        tensors.append((f"t.{name}", random_blocks(rng, qt, 6).reshape(3, -1), qt))
        tensors.append((f"t.{name}.3d", random_blocks(rng, qt, 4).reshape(2, 1, -1), qt))

    # Types cider keeps (sizes checked) but does not dequantize.
    tensors.append(("u.iq4_nl", random_blocks(rng, QT.IQ4_NL, 2).reshape(1, -1), QT.IQ4_NL))
    tensors.append(("u.i32", rng.integers(-1000, 1000, size=(2, 3), dtype=np.int32), None))

    path = os.path.join(out_dir, "tensors.gguf")
    meta = write_file(path, "cider-test", tensors, meta_fn=add_metadata)

    align_tensors = [
        ("a.f32", rng.standard_normal(3).astype(np.float32), None),
        ("a.q8_0", gguf.quants.quantize(randw((1, 32)), QT.Q8_0), QT.Q8_0),
        ("a.f16", rng.standard_normal((5,)).astype(np.float16), None),
    ]
    apath = os.path.join(out_dir, "align64.gguf")
    ameta = write_file(apath, "cider-align", align_tensors, alignment=64)

    # Read both back with gguf-py's reader: tensor geometry and offsets in the manifest are its view of the files.
    ref = bytearray()
    files = []
    for fname, fmeta in (("tensors.gguf", meta), ("align64.gguf", ameta)):
        reader = gguf.GGUFReader(os.path.join(out_dir, fname))
        entries = []
        for t in reader.tensors:
            entry = {
                "name": t.name, "type": int(t.tensor_type), "type_name": t.tensor_type.name,
                "ne": [int(x) for x in t.shape], "data_offset": int(t.data_offset), "n_bytes": int(t.n_bytes),
            }
            if not t.name.startswith("u."):
                values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32, copy=False)
                assert values.size == t.n_elements, (t.name, values.shape)
                entry["ref_offset"] = len(ref) // 4
                entry["ref_count"] = int(values.size)
                ref += values.astype("<f4").tobytes()
            entries.append(entry)
        files.append({"file": fname, "version": int(reader.fields["GGUF.version"].parts[-1][0]),
                      "metadata": fmeta, "tensors": entries})

    with open(os.path.join(out_dir, "reference.bin"), "wb") as f:
        f.write(ref)
    manifest = {"generator": "tools/gen_gguf_fixtures.py", "gguf_py_version": gguf_version(), "seed": SEED,
                "numpy_version": np.__version__, "files": files}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=True)
        f.write("\n")


def gguf_version():
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:  # pragma: no cover - informational only
        return "unknown"


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/gguf")
