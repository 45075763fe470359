"""Peer for cider's prefill attention benchmark rows (bench/cuda/bench_attention.cpp, "attention prefill ..."):
PyTorch SDPA, bf16, causal (is_causal=True), B1 Hq32 Hkv8 D128 (GQA through enable_gqa, falling back to repeated K/V
when the installed torch lacks it), L = 512 and 4096 (kL = L). Timing: CUDA events around a CUDA graph of `reps`
back-to-back calls, median of >= 20 samples after warm-up (as ../shared/tools/gpu_anchors.py). Prints one row per
shape, named exactly as the bench's `peer` strings; writes attn_prefill_peer.json into $OUT if set.
Also prints which SDPA backend ran (flash / efficient / math) where torch tells."""
import json, os

import torch
import torch.nn.functional as F

from peer_timing import bench  # tools/gpu/peer_timing.py: the script's folder is on sys.path

dev = "cuda"
torch.manual_seed(0)
res = {}


def row(name, secs, flops):
    r = {"s": secs, "TFLOPs": flops / secs / 1e12}
    res[name] = r
    print(f"{name:58s} {secs*1e6:10.1f} us  {r['TFLOPs']:8.1f} TFLOP/s", flush=True)


print(torch.__version__, torch.cuda.get_device_name(), flush=True)
B, Hq, Hkv, D = 1, 32, 8, 128
for L in (512, 4096):
    q = torch.randn(B, Hq, L, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, L, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    flops = 4.0 * Hq * D * (L * (L + 1) / 2)  # causal: L(L+1)/2 visible pairs per head, q·k and p·v
    name = f"sdpa prefill bf16 causal B{B} Hq{Hq} Hkv{Hkv} D{D} L{L}"
    try:
        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        fn()
        how = "enable_gqa"
    except (TypeError, RuntimeError) as ex:
        kr = k.repeat_interleave(Hq // Hkv, dim=1).contiguous()
        vr = v.repeat_interleave(Hq // Hkv, dim=1).contiguous()
        fn = lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True)
        how = f"repeated kv ({type(ex).__name__})"
    row(name, bench(fn), flops)
    # The flash backend alone, when available (what a user gets by default is the row above).
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            tf = bench(fn)
        print(f"  ({how}; flash backend only: {tf*1e6:.1f} us, {flops/tf/1e12:.1f} TFLOP/s)", flush=True)
    except Exception as ex:  # noqa: BLE001 - informational only
        print(f"  ({how}; flash-only timing unavailable: {type(ex).__name__}: {ex})", flush=True)
    del q, k, v
    torch.cuda.empty_cache()
out = os.environ.get("OUT")
if out:
    json.dump(res, open(os.path.join(out, "attn_prefill_peer.json"), "w"), indent=1)
