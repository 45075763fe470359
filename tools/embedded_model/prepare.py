#!/usr/bin/env python3
"""Builds the training corpus and tokenizer of cider's embedded default model (models/cider-tiny).

Sources (Debian 12 packages, fetched with `apt-get download`, unpacked outside the repository):
  * python3.11-doc — the reStructuredText sources of the Python 3.11 documentation (_sources/**/*.rst.txt),
    light markup removed: English technical prose with code examples;
  * fortunes, fortunes-min — the classic fortune-cookie collections (quotes, jokes, short poems).
Every 20th document (by a hash of its path) is held out as validation text (valid.txt), used for perplexity.

Writes into OUT_DIR: train.txt, valid.txt, tokenizer.json (byte-level BPE, Llama-3 style split regex, 4096
tokens, <|begin_of_text|> / <|end_of_text|>), train.bin / valid.bin (uint16 token ids, documents joined by
<|end_of_text|>), sources.json (package versions and file counts).

Usage: python3 tools/embedded_model/prepare.py OUT_DIR   (needs `tokenizers` and `numpy` from PyPI)
"""
import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

PACKAGES = ["python3.11-doc", "fortunes", "fortunes-min"]
VOCAB_SIZE = 4096
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
# The split pattern Llama 3 uses (contractions, letters, 1-3 digit numbers, punctuation runs, whitespace).
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def fetch(work):
    debs = os.path.join(work, "debs")
    root = os.path.join(work, "root")
    os.makedirs(debs, exist_ok=True)
    subprocess.run(["apt-get", "download"] + PACKAGES, cwd=debs, check=True)
    versions = {}
    for f in sorted(os.listdir(debs)):
        if f.endswith(".deb"):
            subprocess.run(["dpkg", "-x", os.path.join(debs, f), root], check=True)
            versions[f.split("_")[0]] = f.split("_")[1]
    return root, versions


ROLE = re.compile(r":[\w:.-]+:`!?~?([^`<]*?)(?:\s*<[^`>]*>)?`")
LITERAL = re.compile(r"``([^`]+)``")
UNDERLINE = re.compile(r"^\s*([=\-*~^#\"'`+.]){3,}\s*$")


def clean_rst(text):
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(".. ") or stripped == ".." or re.match(r"^:[\w-]+:(\s|$)", stripped):
            continue
        if UNDERLINE.match(line):
            continue
        line = ROLE.sub(lambda m: m.group(1), line)
        line = LITERAL.sub(lambda m: m.group(1), line)
        line = line.replace("::", ":")
        out.append(line.rstrip())
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def documents(root):
    docs = []
    src = os.path.join(root, "usr/share/doc/python3.11/html/_sources")
    for dirpath, _, files in os.walk(src):
        for f in sorted(files):
            if f.endswith(".rst.txt"):
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    body = clean_rst(fh.read())
                if len(body) > 200:
                    docs.append((os.path.relpath(path, root), body))
    fort = os.path.join(root, "usr/share/games/fortunes")
    for f in sorted(os.listdir(fort)):
        path = os.path.join(fort, f)
        if "." in f or os.path.islink(path) or "art" in f:
            continue  # .dat indexes, .u8 links, ASCII art
        with open(path, encoding="utf-8", errors="replace") as fh:
            cookies = [c.strip() for c in fh.read().split("\n%\n") if c.strip()]
        for i in range(0, len(cookies), 50):  # 50 cookies per document
            docs.append((f"{os.path.relpath(path, root)}#{i}", "\n\n".join(cookies[i:i + 50])))
    return docs


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    root, versions = fetch(os.path.join(out_dir, "work"))
    docs = documents(root)
    held = lambda name: int(hashlib.sha1(name.encode()).hexdigest(), 16) % 20 == 0
    train = [d for n, d in docs if not held(n)]
    valid = [d for n, d in docs if held(n)]
    for name, part in (("train.txt", train), ("valid.txt", valid)):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as fh:
            fh.write("\n\n".join(part))

    tok = Tokenizer(models.BPE(byte_fallback=False, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([os.path.join(out_dir, "train.txt")], trainer)
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, bos)])
    tok.save(os.path.join(out_dir, "tokenizer.json"))

    for name, part in (("train.bin", train), ("valid.bin", valid)):
        ids = []
        for enc in tok.encode_batch(part, add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(eos)
        np.asarray(ids, dtype=np.uint16).tofile(os.path.join(out_dir, name))
        print(f"{name}: {len(ids)} tokens from {len(part)} documents")
    with open(os.path.join(out_dir, "sources.json"), "w") as fh:
        json.dump({"packages": versions, "documents": {"train": len(train), "valid": len(valid)},
                   "bos_id": bos, "eos_id": eos, "vocab_size": tok.get_vocab_size()}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
