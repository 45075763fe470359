#!/usr/bin/env python3
"""Simulated KV-cache quantization on Gemma 3 (a float32 NumPy forward of a cider-format bf16 model): which cache
transforms would bring 4-bit keys within the fidelity target. Not the engine: a fake-quantization model of it
(quantize → dequantize in float32, scales and biases rounded to f16 as cider stores them), used to test ideas
cider does not implement yet. Checked against `cider perplexity` on the same window (see docs/quality.md).

Per configuration it prints the mean KL(P_float ‖ P_quant) per token, top-1 agreement and perplexity over one
window (BOS + 511 tokens), plus the relative RMS error of the dequantized keys and values.

Usage: kv_sim.py CIDER MODEL_DIR PIECE.txt CTX CONFIG...
  CONFIG = KBITS,VBITS,GROUP,TRANSFORM with TRANSFORM one of
    none       affine per token, groups of GROUP along the head dimension (cider's cache, no rotation)
    so4        a random SO(4) block rotation (qL·v·conj(qR) per 4 channels; same distribution as cider's so4-full)
    had64      randomized Hadamard (random signs, then a normalized Walsh-Hadamard matrix) on each group of 64
    had        randomized Hadamard over the whole head (D = 256 for Gemma 3 270M: llama.cpp's kind of rotation)
    smooth     keys divided per channel by s_c (the k_norm gain |w_c|, max over each RoPE pair), queries
               multiplied by it (exact before quantization, foldable into q_norm/k_norm weights); values as none
    smooth+had smooth, then the whole-head Hadamard on keys and values
    kchan      keys quantized per channel over blocks of GROUP tokens (KIVI-style layout; the last, partial block
               too, from its own tokens), values per token as none
    kchan+had  kchan keys; values per token after the whole-head Hadamard
  kchan and kchan+had take options after the transform, comma-separated (issue 21's study, docs/quality.md):
    kblock=N   key blocks of N tokens (default GROUP)          vgroup=N   value groups of N along the head (default GROUP)
    out=N      per (KV head, block) the N channels with the largest score kept at ob bits (ob=16: exact float16),
               with their own scale/bias; ob=B       sel=range (score = the block's range of the channel, default)
               or sel=qk (range × the RMS of the channel in the queries of that KV head's group)
    pre        keys quantized before RoPE (KVQuant), rotated after dequantization
    bpre       keys turned back by RoPE of their position within the block (t = pos mod kblock), so every key of a
               block carries the RoPE of the block's first position; quantized so, turned forward by t after
               dequantization (block-relative pre-RoPE: the same fixed rotation per block, a table of kblock positions)
    res        keys of the query's own key block (the engine's bfloat16 residual window) exact in the scores
    vres       values of that window exact too (a value residual window)
    vwin=N     with vres: only the values of the query's own block of N positions exact (N < the key block)
    sink=N     the first N positions' keys and values exact (bfloat16), out of the quantized blocks' ranges
    vsym       values quantized symmetrically (Q4_0-style: one float16 step per group, no bias)
  e.g. 4,4,64,kchan+had,out=8,ob=8,sel=qk
"""
import json
import struct
import subprocess
import sys

import numpy as np


def load_st(path):
    f = open(path, "rb")
    n = struct.unpack("<Q", f.read(8))[0]
    hdr = json.loads(f.read(n))
    base = 8 + n
    buf = np.memmap(path, dtype=np.uint8, mode="r")

    def get(name):
        t = hdr[name]
        a, b = t["data_offsets"]
        raw = buf[base + a:base + b]
        if t["dtype"] == "F32":
            return np.frombuffer(raw, np.float32).reshape(t["shape"])
        if t["dtype"] == "BF16":
            return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(t["shape"])
        raise ValueError(t["dtype"])
    return get, json.loads(hdr["__metadata__"]["config"])


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps).astype(np.float32) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x ** 3)))


def rope_tables(n, d, theta):
    inv = (1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float32) / d))).astype(np.float32)
    ang = np.arange(n, dtype=np.float32)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def rope(x, cos, sin):  # x [..., n, d], HF rotate_half
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def affine_qdq(x, bits, gs):
    """MLX affine quantization per group along the last axis, then dequantized (scale/bias rounded to f16)."""
    shp = x.shape
    g = x.reshape(-1, gs).astype(np.float32)
    nlev = np.float32(2 ** bits - 1)
    lo, hi = g.min(1), g.max(1)
    neg = np.abs(lo) > np.abs(hi)
    scale = np.maximum((hi - lo) / nlev, np.float32(1e-7))
    scale = np.where(neg, scale, -scale)
    edge = np.where(neg, lo, hi)
    q0 = np.rint(edge / scale)
    scale = np.where(q0 != 0, edge / np.where(q0 != 0, q0, 1), scale).astype(np.float32)
    bias = np.where(q0 != 0, edge, 0).astype(np.float32)
    q = np.clip(np.rint((g - bias[:, None]) / scale[:, None]), 0, nlev)
    s16, b16 = scale.astype(np.float16).astype(np.float32), bias.astype(np.float16).astype(np.float32)
    return (q * s16[:, None] + b16[:, None]).reshape(shp).astype(np.float32)


def sym_qdq(x, bits, gs):
    """Q4_0-style symmetric quantization per group (scale f16, no bias): d = edge / -2^(b-1), codes clipped."""
    shp = x.shape
    g = x.reshape(-1, gs).astype(np.float32)
    half = 2 ** (bits - 1)
    idx = np.abs(g).argmax(1)
    edge = g[np.arange(g.shape[0]), idx]
    d = (edge / -half).astype(np.float16).astype(np.float32)
    inv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0)
    q = np.clip(np.rint(g * inv[:, None]), -half, half - 1)
    return (q * d[:, None]).reshape(shp).astype(np.float32)


def hadamard(n):
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(np.float32)


def quat_left(q):  # matrix of v -> q·v (Hamilton), q = (w, x, y, z)
    w, x, y, z = q
    return np.array([[w, -x, -y, -z], [x, w, -z, y], [y, z, w, -x], [z, -y, x, w]], dtype=np.float64)


def quat_right(q):  # matrix of v -> v·q
    w, x, y, z = q
    return np.array([[w, -x, -y, -z], [x, w, z, -y], [y, -z, w, x], [z, y, -x, w]], dtype=np.float64)


def so4_matrix(d, rng):
    m = np.zeros((d, d))
    for b in range(d // 4):
        ql = rng.standard_normal(4); ql /= np.linalg.norm(ql)
        qr = rng.standard_normal(4); qr /= np.linalg.norm(qr)
        qrc = qr * np.array([1, -1, -1, -1])
        m[4 * b:4 * b + 4, 4 * b:4 * b + 4] = quat_left(ql) @ quat_right(qrc)
    return m.astype(np.float32)


def rotation(kind, d, rng):
    if kind == "so4":
        return so4_matrix(d, rng)
    if kind in ("had64", "had", "smooth+had", "kchan+had"):
        n = 64 if kind == "had64" else d
        signs = rng.choice([-1.0, 1.0], size=d).astype(np.float32)
        h = np.kron(np.eye(d // n, dtype=np.float32), hadamard(n))
        return (h * signs[None, :]).astype(np.float32)  # w = M·v with M = H·diag(signs)
    return None


def kchan_qdq(k, bits, block, out=0, out_bits=16, sel="range", qw=None):
    """Keys [Hkv, n, d] quantized per channel over blocks of `block` tokens; per (head, block) the `out` channels with
    the largest range (sel=range) or range x query weight (sel=qk, qw [Hkv, d]) kept at out_bits (16: exact f16)."""
    Hkv, n, d = k.shape
    res = np.empty_like(k)
    for b0 in range(0, n, block):
        blk = k[:, b0:b0 + block, :]  # [Hkv, nb, d]
        kt = np.swapaxes(blk, -1, -2)  # [Hkv, d, nb]
        deq = np.swapaxes(affine_qdq(np.ascontiguousarray(kt), bits, kt.shape[-1]), -1, -2)
        if out:
            rng_ = blk.max(1) - blk.min(1)  # [Hkv, d]
            score = rng_ * (qw if sel == "qk" and qw is not None else 1.0)
            idx = np.argsort(-score, axis=-1)[:, :out]
            for h in range(Hkv):
                cols = blk[h][:, idx[h]]
                if out_bits >= 16:
                    deq[h][:, idx[h]] = cols.astype(np.float16).astype(np.float32)
                else:
                    ct = np.ascontiguousarray(cols.T)
                    deq[h][:, idx[h]] = affine_qdq(ct, out_bits, ct.shape[-1]).T
        res[:, b0:b0 + block, :] = deq
    return res


class Quantizer:
    def __init__(self, kb, vb, gs, kind, d, n_layers, kscales, seed=1, opts=None):
        self.kb, self.vb, self.gs, self.kind = kb, vb, gs, kind
        self.o = opts or {}
        rng = np.random.default_rng(seed)
        self.rots = [rotation(kind, d, rng) for _ in range(n_layers)]
        self.kscales = kscales
        self.err = []

    def __call__(self, layer, q, k, v):  # q [H, n, d], k/v [Hkv, n, d] (k after norm+rope); returns q', k̂, v̂
        R = self.rots[layer]
        if self.kind.startswith("smooth"):
            s = self.kscales[layer]
            k, q = k / s, q * s
        sink = int(self.o.get("sink", 0))
        if sink:  # the first `sink` positions kept exact (bfloat16), out of the quantized blocks' ranges
            k_in, v_in = k, v
            k = np.concatenate([np.repeat(k[:, sink:sink + 1], sink, axis=1), k[:, sink:]], axis=1)
            v = np.concatenate([np.repeat(v[:, sink:sink + 1], sink, axis=1), v[:, sink:]], axis=1)
        if self.kind.startswith("kchan") and self.o:
            qw = None
            if self.o.get("sel") == "qk":
                rep = q.shape[0] // k.shape[0]
                qw = np.sqrt((q.reshape(k.shape[0], rep, q.shape[1], q.shape[2]) ** 2).mean(axis=(1, 2)))
            if "bpre" in self.o:
                blk = int(self.o.get("kblock", self.gs))
                t = np.arange(k.shape[1]) % blk
                cs, sn = self.tables[0][t], self.tables[1][t]
                kh = rope(kchan_qdq(rope(k, cs, -sn), self.kb, blk, int(self.o.get("out", 0)),
                                    int(self.o.get("ob", 16)), self.o.get("sel", "range"), qw), cs, sn)
            elif "pre" in self.o:
                kh = self.rope_fn(kchan_qdq(self.kpre, self.kb, int(self.o.get("kblock", self.gs)), int(self.o.get("out", 0)),
                                            int(self.o.get("ob", 16)), self.o.get("sel", "range"), qw))
            else:
                kh = kchan_qdq(k, self.kb, int(self.o.get("kblock", self.gs)), int(self.o.get("out", 0)),
                               int(self.o.get("ob", 16)), self.o.get("sel", "range"), qw)
        elif self.kind.startswith("kchan"):
            kt = np.swapaxes(k, -1, -2)  # [Hkv, d, n]: groups of gs tokens per channel
            n = kt.shape[-1]
            pad = (-n) % self.gs
            ktp = np.concatenate([kt, np.repeat(kt[..., -1:], pad, axis=-1)], axis=-1) if pad else kt
            kh = np.swapaxes(affine_qdq(ktp, self.kb, self.gs)[..., :n], -1, -2)
        elif R is not None:
            kh = affine_qdq(k @ R.T, self.kb, self.gs) @ R
        else:
            kh = affine_qdq(k, self.kb, self.gs)
        vg = int(self.o.get("vgroup", self.gs))
        if self.vb >= 16:
            vh = v
        elif R is not None and "vsym" in self.o:
            vh = sym_qdq(v @ R.T, self.vb, vg) @ R
        elif R is not None:
            vh = affine_qdq(v @ R.T, self.vb, vg) @ R
        else:
            vh = affine_qdq(v, self.vb, vg)
        if sink:
            bf = lambda t: ((t.astype(np.float32).view(np.uint32) + 0x8000) & 0xFFFF0000).view(np.float32)
            kh, vh, k, v = kh.copy(), vh.copy(), k_in, v_in
            kh[:, :sink], vh[:, :sink] = bf(k[:, :sink]), bf(v[:, :sink])
        self.err.append((np.linalg.norm(kh - k) / np.linalg.norm(k), np.linalg.norm(vh - v) / np.linalg.norm(v)))
        return q, kh, vh


def forward(get, c, tokens, quant=None):
    D, H, Hkv, L = c["head_dim"], c["num_heads"], c["num_kv_heads"], c["num_layers"]
    eps = float(c["rms_norm_eps"])
    n = len(tokens)
    emb = get("model.embed_tokens.weight")
    x = emb[tokens] * np.float32(float(c["embed_scale"]))
    cg, sg = rope_tables(n, D, float(c["rope"]["theta"]))
    cl, sl = rope_tables(n, D, float(c["rope_local"]["theta"]))
    mask = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
    scale = np.float32(float(c["attn_scale"]))
    for i in range(L):
        p = f"model.layers.{i}."
        W = lambda m: get(p + m + ".weight")
        h = rms_norm(x, W("input_layernorm"), eps)
        q = (h @ W("self_attn.q_proj").T).reshape(n, H, D).transpose(1, 0, 2)
        k = (h @ W("self_attn.k_proj").T).reshape(n, Hkv, D).transpose(1, 0, 2)
        v = (h @ W("self_attn.v_proj").T).reshape(n, Hkv, D).transpose(1, 0, 2)
        q = rms_norm(q, W("self_attn.q_norm"), eps)
        k = rms_norm(k, W("self_attn.k_norm"), eps)
        cs, sn = (cl, sl) if c["layer_sliding"][i] else (cg, sg)
        if quant is not None:
            quant.kpre = k
            quant.rope_fn = lambda t, cs=cs, sn=sn: rope(t, cs, sn)
            quant.tables = (cs, sn)
        q, k = rope(q, cs, sn), rope(k, cs, sn)
        k0, v0 = k, v
        if quant is not None:
            q, k, v = quant(i, q, k, v)
        rep = H // Hkv
        kk, vv = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
        s = (q @ kk.transpose(0, 2, 1)) * scale + mask
        win = None
        if quant is not None and ("res" in quant.o or "vres" in quant.o):
            # the engine's residual window: the positions of the query's own (unfilled) key block stay exact
            blk = int(quant.o.get("kblock", quant.gs))
            t = np.arange(n)
            win = (t[None, :] >= (t[:, None] // blk) * blk) & (t[None, :] <= t[:, None])
            if "res" in quant.o:
                s = np.where(win, (q @ np.repeat(k0, rep, axis=0).transpose(0, 2, 1)) * scale + mask, s)
        s = np.exp(s - s.max(-1, keepdims=True))
        pa = s / s.sum(-1, keepdims=True)
        a = pa @ vv
        if win is not None and "vres" in quant.o:  # values of the window exact too (or of the last vwin-block)
            vw = win
            if "vwin" in quant.o:
                vb = int(quant.o["vwin"])
                vw = (t[None, :] >= (t[:, None] // vb) * vb) & (t[None, :] <= t[:, None])
            a = a + (pa * vw) @ np.repeat(v0 - v, rep, axis=0)
        o = a.transpose(1, 0, 2).reshape(n, H * D) @ W("self_attn.o_proj").T
        x = x + rms_norm(o, W("post_attention_layernorm"), eps)
        h = rms_norm(x, W("pre_feedforward_layernorm"), eps)
        m = (gelu_tanh(h @ W("mlp.gate_proj").T) * (h @ W("mlp.up_proj").T)) @ W("mlp.down_proj").T
        x = x + rms_norm(m, W("post_feedforward_layernorm"), eps)
    x = rms_norm(x, get("model.norm.weight"), eps)
    return x  # final hidden states; logits = x @ emb.T, done in chunks by the caller


def log_probs(get, x, rows):
    emb = get("model.embed_tokens.weight")
    out = np.empty((len(rows), emb.shape[0]), dtype=np.float32)
    for a in range(0, len(rows), 64):
        lg = (x[rows[a:a + 64]] @ emb.T).astype(np.float64)
        lg -= lg.max(1, keepdims=True)
        lg -= np.log(np.exp(lg).sum(1, keepdims=True))
        out[a:a + 64] = lg
    return out


def main():
    cider, model, piece, ctx = sys.argv[1:5]
    configs = sys.argv[5:]
    ctx = int(ctx)
    text = open(piece, encoding="utf-8").read()
    ids = subprocess.run([cider, "tokenize", "-m", model, "--text", text], check=True, capture_output=True,
                         text=True).stdout.strip().split(",")
    tokens = np.array([int(t) for t in ids[:ctx]])
    get, c = load_st(model + "/model.safetensors")
    kscales = []
    for i in range(c["num_layers"]):
        w = np.abs(get(f"model.layers.{i}.self_attn.k_norm.weight")).astype(np.float32)
        h = w.shape[0] // 2
        pair = np.maximum(w[:h], w[h:])
        kscales.append(np.maximum(np.concatenate([pair, pair]), 1e-3))
    rows = np.arange(ctx - 1)
    base = log_probs(get, forward(get, c, tokens), rows)
    tgt = tokens[1:]
    nll_b = -base[rows, tgt]
    print(f"# {piece}: {ctx} tokens; float32 baseline perplexity {np.exp(nll_b.mean()):.4f}", flush=True)
    pb = np.exp(base)
    top_b = base.argmax(1)
    for cfg in configs:
        parts = cfg.split(",")
        kb, vb, gs, kind = parts[:4]
        opts = dict((p.split("=") + [""])[:2] for p in parts[4:])
        qz = Quantizer(int(kb), int(vb), int(gs), kind, c["head_dim"], c["num_layers"], kscales, opts=opts)
        lp = log_probs(get, forward(get, c, tokens, qz), rows)
        kl = (pb * (base - lp)).sum(1)
        nll = -lp[rows, tgt]
        top1 = (lp.argmax(1) == top_b).mean()
        ke, ve = np.mean([e[0] for e in qz.err]), np.mean([e[1] for e in qz.err])
        print(f"{cfg:40s}  KL {kl.mean():.5f} ± {kl.std(ddof=1) / np.sqrt(len(kl)):.5f}  "
              f"top-1 {100 * top1:.2f}%  PPL {np.exp(nll.mean()):.4f} ({100 * (np.exp(nll.mean() - nll_b.mean()) - 1):+.2f}%)  "
              f"rel.err K {ke:.4f} V {ve:.4f}", flush=True)


if __name__ == "__main__":
    main()
