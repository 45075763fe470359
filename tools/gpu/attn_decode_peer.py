"""Peer for cider's decode-attention length sweep (bench/cuda/bench_attention.cpp, "attention decode K4V3 B1 Hq32
Hkv8 D128 L…"): PyTorch bf16 SDPA with one query token over a bf16 KV cache, B1 Hq32 Hkv8 D128, L 1024 … 131072.
Same method as ../shared/tools/gpu_anchors.py (a CUDA graph of back-to-back calls timed with CUDA events, median),
except that the cache is rotated over copies (>= 240 MB in all, as cider's bench does) so that short caches are not
served from the 60 MB L2 by the previous call. Row names are gpu_anchors.py's; writes attn_decode_peer.json into
$OUT if set. The sweep separates a fixed cost per call from the streaming rate: time = fixed + bytes / rate."""
import json, os

import torch
import torch.nn.functional as F

from peer_timing import bench  # tools/gpu/peer_timing.py: the script's folder is on sys.path

dev = "cuda"
torch.manual_seed(0)
res = {}
print(torch.__version__, torch.cuda.get_device_name(), flush=True)
B, Hq, Hkv, D = 1, 32, 8, 128
for L in [1024, 4096, 8192, 16384, 32768, 65536, 131072]:
    per_copy = 2 * B * Hkv * L * D * 2
    copies = max(1, min(16, (240 << 20) // per_copy + 1))
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    ks = [torch.randn(B, Hkv, L, D, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
    vs = [torch.randn_like(k) for k in ks]
    i = [0]

    def f():
        i[0] = (i[0] + 1) % copies
        return F.scaled_dot_product_attention(q, ks[i[0]], vs[i[0]], enable_gqa=True)

    secs = bench(f, samples=15, reps=20)
    name = f"sdpa decode bf16 B{B} Hq{Hq} Hkv{Hkv} D{D} L{L}"
    res[name] = {"s": secs, "TBps": per_copy / secs / 1e12}
    print(f"{name:48s} {secs*1e6:9.2f} us  {res[name]['TBps']:.2f} TB/s ({copies} copies)", flush=True)
    del ks, vs, q
    torch.cuda.empty_cache()
out = os.environ.get("OUT")
if out:
    json.dump(res, open(os.path.join(out, "attn_decode_peer.json"), "w"), indent=1)
