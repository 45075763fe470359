"""PyTorch peers for cuda_bench (bench/cuda/*.cpp): what a user gets from PyTorch (cuBLAS / cuBLASLt, SDPA) at the
shapes cider's CUDA kernels target. Every row is named as the `peer` string of the cuda_bench cases it is compared
with (tools/gpu/compare.py joins on that name).

usage: python3 tools/gpu/peers.py [--only copy,gemm,gemv,decode,prefill] [--json FILE]
  (default: every section; FILE defaults to $OUT/peers.json when $OUT is set)

Method (tools/gpu/peer_timing.py, the same as cuda_bench's bench_graph): warm-up calls, then a CUDA graph of `reps`
back-to-back calls replayed and timed with CUDA events, the median of the samples, in seconds per call. Operands that
a call streams once (GEMV weights, decode KV caches) are rotated over copies that together exceed the 60 MB L2, as
cider's benchmarks rotate theirs, so that no call is served from the cache the previous one filled.

Sections and rows:
  copy     "copy 2 GiB d2d": device-to-device copy bandwidth (the ceiling for streaming kernels)
  gemm     "bf16 matmul", "int8 _int_mm", "fp8 _scaled_mm" at M8192 K8192 N8192, M2048 K4096 N14336, M512 K4096 N4096
  gemv     "bf16 GEMV K.. N..": x[1, K] @ W[N, K]^T at the Llama-3-8B decode shapes; "int8 _int_mm M32 K.. N.."
           (torch._int_mm needs M > 16: the nearest int8 peer of a decode GEMV)
  decode   "sdpa decode bf16 B.. Hq.. Hkv.. D.. L..": one query token over a bf16 KV cache (GQA through enable_gqa)
  prefill  "sdpa prefill bf16 causal B1 Hq32 Hkv8 D128 L..": causal SDPA, kL = L
"""
import argparse
import json
import os
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError as ex:  # the job checks this first; a direct call says it too
    sys.exit(f"peers.py: PyTorch is not installed ({ex}); the peers cannot run")

from peer_timing import bench  # tools/gpu/peer_timing.py: this script's folder is on sys.path

DEV = "cuda"
SECTIONS = ("copy", "gemm", "gemv", "decode", "prefill")
res = {}


def row(name, secs, flops=None, nbytes=None, note=""):
    r = {"s": secs}
    txt = f"{name:58s} {secs * 1e6:10.2f} us"
    if flops:
        r["TFLOPs"] = flops / secs / 1e12
        txt += f"  {r['TFLOPs']:8.1f} T(FL)OP/s"
    if nbytes:
        r["TBps"] = nbytes / secs / 1e12
        txt += f"  {r['TBps']:6.2f} TB/s"
    res[name] = r
    print(txt + (f"  ({note})" if note else ""), flush=True)


def guarded(name, fn):
    """Runs one row; a torch without the operation (old _int_mm / _scaled_mm) prints why instead of stopping."""
    try:
        fn()
    except Exception as ex:  # noqa: BLE001 - reported, and the row is missing from the JSON
        print(f"{name}: not timed: {type(ex).__name__}: {ex}", flush=True)


def rotating(make, per_copy_bytes, min_total_bytes, min_copies=1, max_copies=16):
    """Copies of an operand whose total is at least min_total_bytes, and a function that returns the next one."""
    copies = max(min_copies, min(max_copies, min_total_bytes // per_copy_bytes + 1))
    items = [make() for _ in range(copies)]
    i = [0]

    def nxt():
        i[0] = (i[0] + 1) % copies
        return items[i[0]]

    return items, nxt


def section_copy():
    a = torch.empty(2 * 1024**3, dtype=torch.uint8, device=DEV).random_(0, 255)
    b = torch.empty_like(a)
    row("copy 2 GiB d2d", bench(lambda: b.copy_(a), samples=5, reps=4), nbytes=2 * a.numel())
    del a, b
    torch.cuda.empty_cache()


def section_gemm():
    for (M, K, N) in [(8192, 8192, 8192), (2048, 4096, 14336), (512, 4096, 4096)]:
        flops = 2 * M * K * N
        x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
        w = torch.randn(N, K, device=DEV, dtype=torch.bfloat16)
        xi = torch.randint(-127, 127, (M, K), device=DEV, dtype=torch.int8)
        wi = torch.randint(-127, 127, (N, K), device=DEV, dtype=torch.int8)
        guarded("bf16 matmul", lambda: row(f"bf16 matmul M{M} K{K} N{N}", bench(lambda: x @ w.t(), reps=20), flops))
        guarded("int8 _int_mm", lambda: row(f"int8 _int_mm M{M} K{K} N{N}",
                                            bench(lambda: torch._int_mm(xi, wi.t()), reps=20), flops))

        def fp8():
            xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
            one = torch.tensor(1.0, device=DEV)
            mm = lambda: torch._scaled_mm(xf, wf.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            row(f"fp8 _scaled_mm M{M} K{K} N{N}", bench(mm, reps=20), flops)

        guarded("fp8 _scaled_mm", fp8)
        del x, w, xi, wi
        torch.cuda.empty_cache()


def section_gemv():
    # (4096, 4096) q/o projections, (4096, 14336) gate or up, (14336, 4096) down, (4096, 6144) fused q/k/v,
    # (4096, 28672) fused gate/up, (8192, 28672) a 70B-class gate/up.
    for (K, N) in [(4096, 4096), (4096, 14336), (14336, 4096), (4096, 6144), (4096, 28672), (8192, 28672)]:
        ws, w_next = rotating(lambda: torch.randn(N, K, device=DEV, dtype=torch.bfloat16), 2 * K * N, 150 << 20, 4)
        x = torch.randn(1, K, device=DEV, dtype=torch.bfloat16)
        row(f"bf16 GEMV K{K} N{N}", bench(lambda: x @ w_next().t(), reps=20), nbytes=2 * K * N,
            note=f"{len(ws)} weight copies")
        del ws
        if (K, N) in [(4096, 4096), (4096, 14336), (8192, 28672)]:
            wis, wi_next = rotating(lambda: torch.randint(-127, 127, (N, K), device=DEV, dtype=torch.int8), K * N,
                                    150 << 20, 4)
            xi = torch.randint(-127, 127, (32, K), device=DEV, dtype=torch.int8)
            guarded("int8 _int_mm M32", lambda: row(f"int8 _int_mm M32 K{K} N{N}",
                                                    bench(lambda: torch._int_mm(xi, wi_next().t()), reps=20),
                                                    nbytes=K * N, note=f"{len(wis)} weight copies"))
            del wis
        torch.cuda.empty_cache()


def section_decode():
    shapes = [(B, 32, 8, 128, L) for B in (1, 8) for L in (32768, 131072)]
    shapes += [(1, 32, 8, 128, L) for L in (1024, 4096, 8192, 16384, 65536)]  # the length sweep of bench_attention
    shapes += [(B, 16, 2, 256, 65536) for B in (1, 8)] + [(B, 64, 8, 128, 8192) for B in (1, 8)]
    for (B, Hq, Hkv, D, L) in shapes:
        per_copy = 2 * B * Hkv * L * D * 2  # K and V, bf16
        q = torch.randn(B, Hq, 1, D, device=DEV, dtype=torch.bfloat16)
        kvs, kv_next = rotating(lambda: (torch.randn(B, Hkv, L, D, device=DEV, dtype=torch.bfloat16),
                                         torch.randn(B, Hkv, L, D, device=DEV, dtype=torch.bfloat16)),
                                per_copy, 240 << 20)

        def call():
            k, v = kv_next()
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        guarded("sdpa decode", lambda: row(f"sdpa decode bf16 B{B} Hq{Hq} Hkv{Hkv} D{D} L{L}",
                                           bench(call, samples=15, reps=20), nbytes=per_copy,
                                           note=f"{len(kvs)} cache copies"))
        del q, kvs
        torch.cuda.empty_cache()


def section_prefill():
    B, Hq, Hkv, D = 1, 32, 8, 128
    for L in (512, 4096):
        q = torch.randn(B, Hq, L, D, device=DEV, dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, L, D, device=DEV, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        flops = 4.0 * Hq * D * (L * (L + 1) / 2)  # causal: L(L+1)/2 visible pairs per head, q·k and p·v
        try:
            fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            fn()
            how = "enable_gqa"
        except (TypeError, RuntimeError) as ex:  # a torch without enable_gqa: K/V repeated per query head
            kr = k.repeat_interleave(Hq // Hkv, dim=1).contiguous()
            vr = v.repeat_interleave(Hq // Hkv, dim=1).contiguous()
            fn = lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True)
            how = f"repeated K/V ({type(ex).__name__})"
        row(f"sdpa prefill bf16 causal B{B} Hq{Hq} Hkv{Hkv} D{D} L{L}", bench(fn), flops, note=how)
        try:  # the flash backend alone, for information (the row above is what a user gets by default)
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                tf = bench(fn)
            print(f"  flash backend only: {tf * 1e6:.1f} us, {flops / tf / 1e12:.1f} TFLOP/s", flush=True)
        except Exception as ex:  # noqa: BLE001 - informational only
            print(f"  flash-only timing unavailable: {type(ex).__name__}: {ex}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections: " + ", ".join(SECTIONS))
    ap.add_argument("--json", default=None, help="output file (default: $OUT/peers.json when $OUT is set)")
    args = ap.parse_args()
    chosen = [s for s in args.only.split(",") if s]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {unknown}; known: {', '.join(SECTIONS)}")
    if not torch.cuda.is_available():
        sys.exit(f"peers.py: PyTorch {torch.__version__} sees no CUDA device; the peers cannot run")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}", flush=True)
    for s in chosen:
        print(f"-- {s}", flush=True)
        globals()[f"section_{s}"]()
    path = args.json or (os.path.join(os.environ["OUT"], "peers.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {len(res)} rows to {path}", flush=True)


if __name__ == "__main__":
    main()
