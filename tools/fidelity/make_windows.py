#!/usr/bin/env python3
"""Cuts held-out text into consecutive pieces of at least CTX tokens each (whole lines, BOS included), so that
`cider perplexity --ctx CTX -f piece_i.txt` evaluates exactly one window that starts with BOS, as llama.cpp's
perplexity does for every chunk. (cider perplexity on one long file puts BOS only at the start of the first window.)
Tokens are counted with `cider tokenize` of the model under test. Also writes slice.txt: the pieces concatenated
(the same bytes as the start of the source), for llama-perplexity.

Usage: make_windows.py CIDER MODEL SOURCE.txt CTX N OUTDIR
"""
import os
import subprocess
import sys


def count(cider, model, text):
    out = subprocess.run([cider, "tokenize", "-m", model, "--text", text], check=True, capture_output=True,
                         text=True).stdout.strip()
    return len(out.split(",")) if out else 0


def main(cider, model, source, ctx, n, outdir):
    ctx, n = int(ctx), int(n)
    os.makedirs(outdir, exist_ok=True)
    lines = open(source, encoding="utf-8").read().splitlines(keepends=True)
    pos, pieces = 0, []
    while len(pieces) < n:
        while pos < len(lines) and not lines[pos].strip():
            pos += 1
        end, nbytes = pos, 0
        while end < len(lines) and nbytes < 4 * ctx:  # a first guess below ctx tokens (~4.5 bytes/token)
            nbytes += len(lines[end].encode())
            end += 1
        while True:
            text = "".join(lines[pos:end])
            # cider tokenize gets the text as an argument: the shell-free call keeps trailing newlines
            if count(cider, model, text) >= ctx + 2 or end >= len(lines):
                break
            end += 1
        if count(cider, model, text) < ctx:
            sys.exit(f"source ran out after {len(pieces)} pieces")
        pieces.append(text)
        pos = end
    for i, t in enumerate(pieces):
        with open(os.path.join(outdir, f"piece_{i:03d}.txt"), "w", encoding="utf-8") as fh:
            fh.write(t)
    with open(os.path.join(outdir, "slice.txt"), "w", encoding="utf-8") as fh:
        fh.write("".join(pieces))
    print(f"{len(pieces)} pieces, {sum(len(p.encode()) for p in pieces)} bytes, into {outdir}")


if __name__ == "__main__":
    main(*sys.argv[1:])
