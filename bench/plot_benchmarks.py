#!/usr/bin/env python3
"""Plots of a tools/bench_peers.sh result file (JSON lines) for docs/benchmarks.md.

Usage: plot_benchmarks.py RESULTS.jsonl OUTDIR
Writes OUTDIR/gemv_bandwidth.png (weight bytes read per second by cider's GEMV kernels against the matrix shape,
with the read bandwidth of the same run) and OUTDIR/peers.png (best times of cider and its peers per case).
Needs matplotlib (e.g. from a virtual environment outside the repository).
"""
import collections
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    outdir = sys.argv[2]
    best = collections.defaultdict(lambda: float("inf"))
    info = {}
    for r in rows:
        key = (r["case"], r["engine"])
        if r["best_ms"] < best[key]:
            best[key] = r["best_ms"]
            info[key] = r

    # GEMV bandwidth against shape.
    shapes = []
    for (case, eng), r in info.items():
        if eng == "cider" and "_gemv_" in case and case.endswith("_pc") and case.startswith(("w8a8", "w4a8")):
            shapes.append((r["K"], r["N"]))
    shapes = sorted(set(shapes), key=lambda s: s[0] * s[1])
    labels = [f"K{k}\nN{n}" for k, n in shapes]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for fmt, marker in (("w8a8", "o"), ("w4a8", "s")):
        ys = []
        for k, n in shapes:
            r = info.get((f"{fmt}_gemv_k{k}_n{n}_pc", "cider"))
            ys.append(r["gbps"] if r else float("nan"))
        ax.plot(range(len(shapes)), ys, marker=marker, label=f"cider {fmt.upper()} GEMV (per channel)")
    for name, style in (("stream_read_16", "--"), ("stream_read", ":")):
        r = info.get((name, "cider"))
        if r:
            ax.axhline(r["gbps"], linestyle=style, color="gray", label=f"{name} ({r['gbps']:.1f} GB/s)")
    ax.set_xticks(range(len(shapes)), labels)
    ax.set_ylabel("weight GB/s (best call)")
    ax.set_title("GEMV: weight bytes streamed per second, 2 threads, weights from DRAM")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(f"{outdir}/gemv_bandwidth.png", dpi=110)

    # cider vs peers.
    cases = []
    for (case, eng) in info:
        base = case.partition(":")[0]
        if eng != "cider" and (base, "cider") in info and base not in cases:
            cases.append(base)
    engines = sorted({e for (c, e) in info if e != "cider" and c.partition(":")[0] in cases})
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / (1 + len(engines))
    for i, eng in enumerate(["cider"] + engines):
        ys = []
        for c in cases:
            t = best.get((c, eng), float("nan"))
            ys.append(best[(c, "cider")] / t if t == t and t != float("inf") else 0)
        ax.bar([j + i * width for j in range(len(cases))], ys, width, label=eng)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], [c.replace("_", "\n", 2) for c in cases],
                  fontsize=7)
    ax.set_ylabel("speed relative to cider (cider = 1, higher = faster)")
    ax.set_title("Best time per case, same run, 2 threads")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(f"{outdir}/peers.png", dpi=110)


if __name__ == "__main__":
    main()
