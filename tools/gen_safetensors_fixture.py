#!/usr/bin/env python3
"""Writes a safetensors file with Hugging Face's own `safetensors` package (tests/data/safetensors/), so cider's
reader is checked against the reference writer, not only against cider's writer.

    python3 -m venv /tmp/ggufenv && /tmp/ggufenv/bin/pip install safetensors numpy
    /tmp/ggufenv/bin/python tools/gen_safetensors_fixture.py tests/data/safetensors
CI does not need Python packages: the files are committed and read by tests/test_safetensors.cpp.

Writes reference.safetensors (every dtype cider reads that numpy has: F64, F32, F16, I32, U32, I8, U8, BOOL; a
scalar, an empty tensor, odd shapes; __metadata__) and expected.json (per tensor: dtype, shape, values flattened in
row-major order, exact in JSON; plus the metadata).
"""
import json
import os
import sys

import numpy as np
import safetensors
from safetensors.numpy import save_file

SEED = 20260612


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(SEED)
    tensors = {
        "f64.odd": rng.standard_normal((3, 5)),
        "f32.w": rng.standard_normal((2, 3, 7)).astype(np.float32),
        "f32.scalar": np.array(1.5, dtype=np.float32),
        "f32.empty": np.zeros((0, 4), dtype=np.float32),
        "f16.v": rng.standard_normal((9,)).astype(np.float16),
        "i32.ids": rng.integers(-2**31, 2**31 - 1, size=(4, 3), dtype=np.int32),
        "u32.codes": rng.integers(0, 2**32 - 1, size=(5,), dtype=np.uint32),
        "i8.q": rng.integers(-128, 127, size=(3, 3), dtype=np.int8),
        "u8.bytes": rng.integers(0, 255, size=(1, 1, 11), dtype=np.uint8),
        "bool.mask": rng.random((2, 5)) < 0.5,
    }
    metadata = {"format": "np", "note": "caf\u00e9 \u2713"}
    save_file(tensors, os.path.join(out_dir, "reference.safetensors"), metadata=metadata)

    names = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
             np.dtype(np.int32): "I32", np.dtype(np.uint32): "U32", np.dtype(np.int8): "I8",
             np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL"}
    expected = {"generator": "tools/gen_safetensors_fixture.py", "safetensors_version": safetensors.__version__,
                "metadata": metadata, "tensors": {}}
    for name, a in tensors.items():
        values = a.reshape(-1)
        values = [bool(v) for v in values] if a.dtype == np.bool_ else \
            [float(v) for v in values] if a.dtype.kind == "f" else [int(v) for v in values]
        expected["tensors"][name] = {"dtype": names[a.dtype], "shape": list(a.shape), "values": values}
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, ensure_ascii=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/safetensors")
