#!/usr/bin/env python3
"""Generates MLX-produced test vectors for cider's affine quantization (tests/data/mlx_affine/).

Runs MLX itself (the `mlx[cpu]` package from PyPI works on Linux):
    python3 -m venv /tmp/mlxenv && /tmp/mlxenv/bin/pip install "mlx[cpu]" numpy
    /tmp/mlxenv/bin/python tools/gen_mlx_affine_vectors.py tests/data/mlx_affine
CI does not need MLX: the generated files are committed and read by tests/test_mlx_vectors.cpp.

Each case is one file <case>.bin holding its arrays' raw little-endian bytes back to back; manifest.json gives each
array's dtype, shape and byte offset in that file. For every bits x group size x dtype: w [R, K] -> MLX's packed codes, scales, biases and dequantized values;
quantized_matmul in both transpose modes for a subset.
"""
import json
import os
import sys

import mlx.core as mx
import numpy as np

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def raw_bytes(a: mx.array) -> bytes:
    """Exact storage bytes of an MLX array (bfloat16 viewed as uint16, since NumPy has no bfloat16)."""
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16)).tobytes()
    return np.array(a).tobytes()


def make_weights(rng, rows, cols):
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w *= rng.uniform(0.01, 3.0, size=(rows, 1)).astype(np.float32)
    # Groups that exercise the special cases of MLX's formula.
    w[0, :32] = 0.75                       # constant group: scale ~ -1e-7, bias 0 / q0 path
    w[0, 32:64] = np.abs(w[0, 32:64])      # all positive: |hi| > |lo|
    w[0, 64:96] = -np.abs(w[0, 64:96])     # all negative: |lo| > |hi|
    w[1, :32] = 0.0                        # zero group
    return w


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(20261129)
    manifest = {"mlx_version": mx.__version__, "cases": []}

    blobs = {}

    def save(case, name, arr):
        data = raw_bytes(arr)
        blob = blobs.setdefault(case, bytearray())
        entry = {"dtype": str(arr.dtype).replace("mlx.core.", ""), "shape": list(arr.shape), "offset": len(blob),
                 "nbytes": len(data)}
        blob.extend(data)
        return entry

    for dname, dt in DTYPES.items():
        for bits in (2, 3, 4, 5, 6, 8):
            for gs in (32, 64, 128):
                case = f"{dname}_b{bits}_g{gs}"
                rows, K = 3, 256
                w = mx.array(make_weights(rng, rows, K)).astype(dt)
                wq, scales, biases = mx.quantize(w, group_size=gs, bits=bits)
                deq = mx.dequantize(wq, scales, biases, group_size=gs, bits=bits)
                entry = {"name": case, "bits": bits, "group_size": gs, "files": {}}
                entry["files"]["w"] = save(case, "w", w)
                entry["files"]["packed"] = save(case, "packed", wq)
                entry["files"]["scales"] = save(case, "scales", scales)
                entry["files"]["biases"] = save(case, "biases", biases)
                entry["files"]["dequantized"] = save(case, "dequantized", deq)
                # quantized_matmul, transpose=True: x [5, K] @ deq(w)^T -> [5, rows]
                x = mx.array(rng.standard_normal((5, K)).astype(np.float32)).astype(dt)
                y = mx.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=gs, bits=bits)
                entry["files"]["x_t"] = save(case, "x_t", x)
                entry["files"]["y_t"] = save(case, "y_t", y)
                # transpose=False: x2 [4, rows] @ deq(w) [rows, K] -> [4, K]
                x2 = mx.array(rng.standard_normal((4, rows)).astype(np.float32)).astype(dt)
                y2 = mx.quantized_matmul(x2, wq, scales, biases, transpose=False, group_size=gs, bits=bits)
                entry["files"]["x_n"] = save(case, "x_n", x2)
                entry["files"]["y_n"] = save(case, "y_n", y2)
                mx.eval(y, y2)
                manifest["cases"].append(entry)
                with open(os.path.join(out_dir, f"{case}.bin"), "wb") as f:
                    f.write(blobs.pop(case))
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"wrote {len(manifest['cases'])} cases to {out_dir}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/mlx_affine")
