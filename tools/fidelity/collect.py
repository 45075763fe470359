#!/usr/bin/env python3
"""Collects the outputs of cider_sweep.sh and llama_sweep.sh into markdown tables and the KL-vs-bits plot.

Usage: collect.py [--cider DIR]... [--llama DIR]... [--plot PNG] [--title TEXT]
  Each --cider DIR holds <weights>_<kv>_<rotation>_g<group>.txt files; each --llama DIR holds base_f16.txt and
  kld_<k>_<v>_<rot|norot>.txt files. Prints markdown tables; with --plot writes the PNG (needs matplotlib).
"""
import argparse
import glob
import math
import os
import re

LLAMA_BITS = {"f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q4_0": 4.5, "q4_1": 5.0, "iq4_nl": 4.5, "q5_0": 5.5,
              "q5_1": 6.0}
FLOAT = r"(-?nan|[-+0-9.eE]+|inf)"
PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ", re.M)  # llama.cpp's log timestamps


def num(pattern, text, group=1):
    m = re.search(pattern, text, re.M)
    return float(m.group(group).lstrip("-")) if m and "nan" in m.group(group) else (float(m.group(group)) if m else None)


def cider_bits(kv, group):
    if kv in ("bf16", "f16"):
        return 16.0
    if kv == "f32":
        return 32.0
    k, v = int(kv[1]), int(kv[3])
    return (k + v) / 2 + 32.0 / group  # f16 scale + f16 bias per group, keys and values alike


def outlier_bits(rot, group, head_dim):
    """Bits per value that +oN outlier key channels add (KVSpec::bits_per_value): N·(4 + 16/group)/Dk per key value,
    halved over keys and values; Dk from --head-dim (0: not counted)."""
    m = re.search(r"\+o(\d+)$", rot)
    if not m or not head_dim:
        return 0.0
    return int(m.group(1)) * (4.0 + 16.0 / group) / head_dim / 2.0


HEAD_DIM = 0  # --head-dim


def read_cider(d):
    """One row per configuration, aggregated over its pieces (one window each, equal token counts): mean KL and
    top-1 are averages over pieces (SE combined as sqrt(Σ se²)/n), perplexities are exp of the mean NLL."""
    per = {}
    for f in sorted(glob.glob(os.path.join(d, "*.txt"))):
        m = re.match(r"(.+?)_(bf16|f16|f32|k\dv\d)_(none|so4-fast|so4-full|hadamard(?:\+kchan(?:\+o\d+)?)?|none\+kchan(?:\+o\d+)?)_g(\d+)(?:\.w(\d+))?\.txt$", os.path.basename(f))
        if not m:
            continue
        t = open(f).read()
        if num(rf"^perplexity: {FLOAT}", t) is None:
            continue
        per.setdefault(m.groups()[:4], []).append(dict(
            piece=int(m.group(5) or 0), nll=num(rf"mean NLL {FLOAT} nats", t),
            base_ppl=num(rf"^baseline perplexity: {FLOAT}", t),
            kl=num(rf"^mean KL\(baseline \|\| tested\): {FLOAT} ± {FLOAT}", t),
            kl_se=num(rf"^mean KL\(baseline \|\| tested\): {FLOAT} ± {FLOAT}", t, 2),
            top1=num(rf"^top-1 agreement: {FLOAT}% ± {FLOAT}%", t),
            top1_se=num(rf"^top-1 agreement: {FLOAT}% ± {FLOAT}%", t, 2),
            tokens=num(r"\((\d+) tokens scored in", t),
            cmd=(re.search(r"^# command: (.*)$", t, re.M) or [None, ""])[1],
            date=(re.search(r"^# date: (\S+)", t, re.M) or [None, ""])[1], wall=num(r"^# wall_s: (\d+)", t)))
    rows = []
    for (w, kv, rot, g), ps in per.items():
        g = int(g)
        n = len(ps)
        mean = lambda k: sum(p[k] for p in ps) / n if all(p[k] is not None for p in ps) else None
        comb = lambda k: math.sqrt(sum(p[k] ** 2 for p in ps)) / n if all(p[k] is not None for p in ps) else None
        nll = mean("nll")
        base_nll = (sum(math.log(p["base_ppl"]) for p in ps) / n) if all(p["base_ppl"] for p in ps) else None
        quant = kv.startswith("k")
        rows.append(dict(weights=w, kv=kv, rot=rot if quant else "-", group=g if quant else None,
                         bits=cider_bits(kv, g) + (outlier_bits(rot, g, HEAD_DIM) if quant else 0.0), pieces=sorted(p["piece"] for p in ps), windows=n,
                         tokens=sum(p["tokens"] for p in ps), ppl=math.exp(nll),
                         base_ppl=math.exp(base_nll) if base_nll is not None else None,
                         kl=mean("kl"), kl_se=comb("kl_se"), top1=mean("top1"), top1_se=comb("top1_se"),
                         per_piece_kl=[p["kl"] for p in sorted(ps, key=lambda p: p["piece"])],
                         cmd=ps[0]["cmd"], date=min(p["date"] for p in ps)))
    return rows


def read_llama(d):
    rows = []
    base = os.path.join(d, "base_f16.txt")
    if os.path.exists(base):
        t = PREFIX.sub("", open(base).read())
        rows.append(dict(file=base, k="f16", v="f16", rot="-", bits=16.0, kl=0.0, kl_se=0.0, top1=100.0, top1_se=0.0,
                         ppl=num(rf"^Final estimate: PPL = {FLOAT} \+/- {FLOAT}", t),
                         ppl_se=num(rf"^Final estimate: PPL = {FLOAT} \+/- {FLOAT}", t, 2), base_ppl=None,
                         cmd=(re.search(r"^# command: (.*)$", t, re.M) or [None, ""])[1],
                         date=(re.search(r"^# date: (\S+)", t, re.M) or [None, ""])[1], wall=num(r"^# wall_s: (\d+)", t),
                         kind="base"))
    for f in sorted(glob.glob(os.path.join(d, "kld_*.txt"))):
        T = r"(iq4_nl|q\d_\d|f16|bf16)"
        m = re.match(rf"kld_{T}_{T}_(rot|norot)\.txt$", os.path.basename(f))
        t = PREFIX.sub("", open(f).read())
        k, v, rot = m.group(1), m.group(2), m.group(3)
        rows.append(dict(file=f, k=k, v=v, rot=rot, bits=(LLAMA_BITS[k] + LLAMA_BITS[v]) / 2,
                         ppl=num(rf"^Mean PPL\(Q\)\s*:\s*{FLOAT}\s*±\s*{FLOAT}", t),
                         ppl_se=num(rf"^Mean PPL\(Q\)\s*:\s*{FLOAT}\s*±\s*{FLOAT}", t, 2),
                         base_ppl=num(rf"^Mean PPL\(base\)\s*:\s*{FLOAT}", t),
                         ppl_ratio=num(rf"^Mean PPL\(Q\)/PPL\(base\)\s*:\s*{FLOAT}\s*±\s*{FLOAT}", t),
                         ppl_ratio_se=num(rf"^Mean PPL\(Q\)/PPL\(base\)\s*:\s*{FLOAT}\s*±\s*{FLOAT}", t, 2),
                         kl=num(rf"^Mean    KLD:\s*{FLOAT}\s*±\s*{FLOAT}", t), kl_se=num(rf"^Mean    KLD:\s*{FLOAT}\s*±\s*{FLOAT}", t, 2),
                         kl_99=num(rf"^99\.0%   KLD:\s*{FLOAT}", t),
                         top1=num(rf"^Same top p:\s*{FLOAT}\s*±\s*{FLOAT}\s*%", t), top1_se=num(rf"^Same top p:\s*{FLOAT}\s*±\s*{FLOAT}\s*%", t, 2),
                         cmd=(re.search(r"^# command: (.*)$", t, re.M) or [None, ""])[1],
                         date=(re.search(r"^# date: (\S+)", t, re.M) or [None, ""])[1], wall=num(r"^# wall_s: (\d+)", t),
                         kind="kld"))
    return rows


def read_sim(path):
    """Lines of kv_sim.py: 'k4v3 g64 had  KL 0.14414 ± 0.00756  top-1 80.43%  PPL 22.1356 (+18.20%) ...'."""
    rows = []
    for line in open(path):
        m = re.match(r"k(\d)v(\d) g(\d+) (\S+)\s+KL ([0-9.]+) ± ([0-9.]+)\s+top-1 ([0-9.]+)%\s+PPL ([0-9.]+) \(([-+0-9.]+)%\)"
                     r"\s+rel\.err K ([0-9.]+) V ([0-9.]+)", line)
        if m:
            kb, vb, g = int(m.group(1)), int(m.group(2)), int(m.group(3))
            rows.append(dict(kv=f"k{kb}v{vb}", group=g, kind=m.group(4), bits=cider_bits(f"k{kb}v{vb}", g),
                             kl=float(m.group(5)), kl_se=float(m.group(6)), top1=float(m.group(7)),
                             ppl=float(m.group(8)), dppl=float(m.group(9)), kerr=float(m.group(10)),
                             verr=float(m.group(11))))
    return rows


def sim_table(rows, title):
    out = [f"#### {title}", "",
           "| KV | group | transform | bits/value | mean KL ± SE | top-1 | PPL | ΔPPL | rel. RMS error K / V |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {r['kv']} | {r['group']} | {r['kind']} | {r['bits']:.2f} | {r['kl']:.4f} ± {r['kl_se']:.4f} | "
                   f"{r['top1']:.1f}% | {r['ppl']:.3f} | {r['dppl']:+.2f}% | {r['kerr']:.3f} / {r['verr']:.3f} |")
    return "\n".join(out)


def fmt(x, p=4):
    return "—" if x is None else f"{x:.{p}f}"


def cider_table(rows, title):
    out = [f"#### {title}", "",
           "| weights | KV | rotation | group | bits/value | windows | mean KL (nats/token) ± SE | PPL (baseline) | ΔPPL | top-1 agreement |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        bp = r["base_ppl"]
        d = f"{100 * (r['ppl'] / bp - 1):+.2f}%" if bp else "—"
        kl = "— (baseline)" if r["kl"] is None else f"{r['kl']:.4f} ± {r['kl_se']:.4f}"
        t1 = "—" if r["top1"] is None else f"{r['top1']:.1f}% ± {r['top1_se']:.1f}%"
        w = ",".join(f"w{p}" for p in r["pieces"])
        out.append(f"| {r['weights']} | {r['kv']} | {r['rot']} | {r['group'] or '—'} | {r['bits']:.2f} | {w} | {kl} | "
                   f"{r['ppl']:.3f} ({bp:.3f}) | {d} | {t1} |" if bp else
                   f"| {r['weights']} | {r['kv']} | {r['rot']} | {r['group'] or '—'} | {r['bits']:.2f} | {w} | {kl} | "
                   f"{r['ppl']:.3f} | — | {t1} |")
    return "\n".join(out)


def rotation_table(rows, title):
    """Per window, KL of so4-fast, so4-full and hadamard relative to no rotation (same tokens: a paired comparison)."""
    out = [f"#### {title}", "",
           "| KV | group | window | KL none | KL so4-fast | KL so4-full | KL hadamard | so4-fast / none | so4-full / none "
           "| hadamard / none |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    by = {(r["weights"], r["kv"], r["group"], r["rot"]): r for r in rows}
    for (w, kv, g, rot), r in sorted(by.items(), key=lambda x: (x[0][1], x[0][2] or 0)):
        if w != "bf16" or rot != "none" or not kv.startswith("k"):
            continue
        f, u, h = by.get((w, kv, g, "so4-fast")), by.get((w, kv, g, "so4-full")), by.get((w, kv, g, "hadamard"))
        if not f and not u and not h:
            continue
        for i, p in enumerate(r["pieces"]):
            kn = r["per_piece_kl"][i]
            kf = f["per_piece_kl"][f["pieces"].index(p)] if f and p in f["pieces"] else None
            ku = u["per_piece_kl"][u["pieces"].index(p)] if u and p in u["pieces"] else None
            kh = h["per_piece_kl"][h["pieces"].index(p)] if h and p in h["pieces"] else None
            out.append(f"| {kv} | {g} | w{p} | {kn:.4f} | {fmt(kf)} | {fmt(ku)} | {fmt(kh)} | "
                       f"{fmt(kf / kn if kf else None, 2)} | {fmt(ku / kn if ku else None, 2)} | "
                       f"{fmt(kh / kn if kh else None, 2)} |")
    return "\n".join(out)


def llama_table(rows, title):
    out = [f"#### {title}", "",
           "| K / V | Hadamard rotation | bits/value | mean KLD ± SE | 99% KLD | PPL(Q) ± SE | PPL(Q)/PPL(base) | same top p |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["kind"] == "base":
            out.append(f"| f16 / f16 (base run) | — | 16.00 | 0 (base) | — | {fmt(r['ppl'])} ± {fmt(r['ppl_se'])} | 1 | 100% |")
            continue
        rot = {"rot": "on (default)", "norot": "off (LLAMA_ATTN_ROT_DISABLE=1)"}[r["rot"]]
        if r["k"] == "f16" and r["v"] == "f16":
            rot = "n/a (f16 cache)"
        out.append(f"| {r['k']} / {r['v']} | {rot} | {r['bits']:.2f} | {fmt(r['kl'], 5)} ± {fmt(r['kl_se'], 5)} | "
                   f"{fmt(r['kl_99'], 4)} | {fmt(r['ppl'])} ± {fmt(r['ppl_se'])} | {fmt(r['ppl_ratio'], 4)} ± "
                   f"{fmt(r['ppl_ratio_se'], 4)} | {fmt(r['top1'], 2)}% ± {fmt(r['top1_se'], 2)}% |")
    return "\n".join(out)


MIXED_KV = ("k8v5", "k6v4")
MAIN_KV = ("k8v8", "k8v4", "k5v5", "k5v4", "k4v4", "k4v3", "k3v3", "k3v2", "k2v2")  # the K/V pairs drawn as lines (diagnostics only in tables)


def plot(cider_sets, llama_sets, path, title, sim_sets=()):
    """One panel per model label; in each: cider's rotations (g64 lines, g32/g128 hollow markers), llama.cpp's
    types with its Hadamard rotation on and off, and simulated transforms (kv_sim.py)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = []
    for label, _ in list(cider_sets) + list(llama_sets) + list(sim_sets):
        if label not in labels:
            labels.append(label)
    fig, axes = plt.subplots(1, len(labels), figsize=(7.5 * len(labels), 6.8), squeeze=False)
    markers = {"none": "o", "so4-fast": "s", "so4-full": "^", "hadamard": "h", "hadamard+kchan": "*"}
    colors = {"none": "tab:gray", "so4-fast": "tab:blue", "so4-full": "tab:red", "hadamard": "tab:orange",
              "hadamard+kchan": "tab:purple"}
    names = {"hadamard+kchan": "per-channel keys, Hadamard values"}
    sim_style = {"kchan": ("*", "tab:purple", "keys per channel (KIVI-style)"),
                 "kchan+had": ("P", "tab:purple", "keys per channel + Hadamard-256 values"),
                 "had": ("X", "tab:brown", "Hadamard-256 on K and V")}
    for ax, panel in zip(axes[0], labels):
        for label, rows in cider_sets:
            if label != panel:
                continue
            q = [r for r in rows if r["weights"] == "bf16" and r["kv"] in MAIN_KV and r["kl"] is not None]
            for rot in ("none", "so4-fast", "so4-full", "hadamard", "hadamard+kchan"):
                pts = sorted((r["bits"], max(r["kl"], 1e-6), r["kv"]) for r in q if r["rot"] == rot and r["group"] == 64)
                if pts:
                    # The line breaks (NaN) at K/V pairs measured for some rotation but not this one.
                    xs = sorted({r["bits"] for r in q if r["group"] == 64})
                    ys = {p[0]: p[1] for p in pts}
                    xs = [x for x in xs if x in ys] if rot == "hadamard+kchan" else xs
                    ax.plot(xs, [ys.get(x, float("nan")) for x in xs], marker=markers[rot], color=colors[rot],
                            markersize=10 if rot == "hadamard+kchan" else 6,
                            label=f"cider, {names.get(rot, 'rotation ' + rot)}, group 64")
                    if rot in ("none", "hadamard+kchan"):
                        for b, k, kv in pts:
                            ax.annotate(kv, (b, k), textcoords="offset points", xytext=(5, 5), fontsize=7)
                pts = sorted((r["bits"], max(r["kl"], 1e-6)) for r in q if r["rot"] == rot and r["group"] != 64)
                if pts:
                    ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=markers[rot], facecolors="none",
                               edgecolors=colors[rot], s=50, label=f"cider, rotation {rot}, group 32 / 128")
            mixed = sorted((r["bits"], max(r["kl"], 1e-6), r["kv"]) for r in rows
                           if label == panel and r["weights"] == "bf16" and r["kv"] in MIXED_KV and r["rot"] == "none"
                           and r["group"] == 64 and r["kl"] is not None)
            if mixed:
                ax.scatter([p[0] for p in mixed], [p[1] for p in mixed], marker="v", color="black", s=45,
                           label="cider, 8/6-bit keys with 4/5-bit values, rotation none, group 64")
                for b, k, kv in mixed:
                    ax.annotate(kv, (b, k), textcoords="offset points", xytext=(5, 3), fontsize=7)
        for label, rows in llama_sets:
            if label != panel:
                continue
            for rot, col in (("rot", "tab:green"), ("norot", "tab:olive")):
                pts = sorted((r["bits"], max(r["kl"], 1e-6), r["k"] if r["k"] == r["v"] else f"{r['k']}/{r['v']}")
                             for r in rows if r["kind"] == "kld" and r["rot"] == rot and r["kl"] is not None
                             and r["k"] != "f16")
                if pts:
                    ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker="D" if rot == "rot" else "d",
                               color=col, s=40,
                               label=f"llama.cpp (baseline: its f16 KV), Hadamard {'on (default)' if rot == 'rot' else 'off'}")
                    if rot == "rot":
                        for b, k, name in pts:
                            ax.annotate(name, (b, k), textcoords="offset points", xytext=(5, -10), fontsize=7, color=col)
        for label, rows in sim_sets:
            if label != panel:
                continue
            for kind, (mk, col, desc) in sim_style.items():
                pts = [(r["bits"], r["kl"], r["kv"]) for r in rows if r["kind"] == kind]
                if pts:
                    ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=mk, s=70, color=col, alpha=0.75,
                               label=f"SIMULATED (kv_sim.py, window 0): {desc}")
                    for b, k, kv in pts:
                        ax.annotate(kv, (b, k), textcoords="offset points", xytext=(-24, -3), fontsize=6, color=col)
        ax.axhline(0.02, color="black", linestyle=":", linewidth=1)
        ax.text(2.4, 0.0214, "issue 21 target: KL 0.02 nats/token", fontsize=7)
        ax.set_yscale("log")
        ax.set_xlim(2.2, 9.0)
        ax.set_xlabel("bits per cached value (K and V averaged, f16 scales/biases included)")
        ax.set_ylabel("mean KL(unquantized KV ‖ quantized KV), nats/token")
        ax.set_title(f"{panel} — {title}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cider", action="append", default=[], help="LABEL=DIR")
    ap.add_argument("--llama", action="append", default=[], help="LABEL=DIR")
    ap.add_argument("--sim", action="append", default=[], help="LABEL=FILE (kv_sim.py output)")
    ap.add_argument("--plot")
    ap.add_argument("--title", default="KV-cache fidelity")
    ap.add_argument("--head-dim", type=int, default=0, help="Dk, for the bits of +oN outlier channels")
    a = ap.parse_args()
    global HEAD_DIM
    HEAD_DIM = a.head_dim
    cs = [(s.split("=", 1)[0], read_cider(s.split("=", 1)[1])) for s in a.cider]
    ls = [(s.split("=", 1)[0], read_llama(s.split("=", 1)[1])) for s in a.llama]
    order = {"bf16": 0, "k8v8": 1, "k8v4": 1.5, "k4v4": 2, "k4v3": 3, "k3v3": 4, "k3v2": 5, "k2v2": 6}
    rk = {"-": 0, "none": 1, "so4-fast": 2, "so4-full": 3, "hadamard": 4, "none+kchan": 5, "hadamard+kchan": 6}
    rank = lambda rot: (rk.get(rot.split("+o")[0], 9), rot)
    for label, rows in cs:
        rows.sort(key=lambda r: (r["weights"] != "bf16", r["weights"], order.get(r["kv"], 9), r["group"] or 0, rank(r["rot"])))
        print(cider_table(rows, f"cider — {label}"), "\n")
        if any(r["rot"] not in ("-", "none") for r in rows):
            print(rotation_table(rows, f"rotation, window by window — {label}"), "\n")
    for label, rows in ls:
        rows.sort(key=lambda r: (r["kind"] != "base", -r["bits"], r["k"], r["rot"]))
        print(llama_table(rows, f"llama.cpp — {label}"), "\n")
    ss = []
    for spec in a.sim:
        label, files = spec.split("=", 1)
        rows = [r for f in files.split(",") for r in read_sim(f)]
        ss.append((label, rows))
        print(sim_table(rows, f"simulation — {label}"), "\n")
    if a.plot:
        kv_sets = [(label, rows) for label, rows in cs if any(r["kv"].startswith("k") for r in rows)]
        plot(kv_sets, ls, a.plot, a.title, ss)


if __name__ == "__main__":
    main()
