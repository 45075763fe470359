"""Peer for cider's decode GEMV rows at the Llama-3-8B decode shapes that ../shared/tools/gpu_anchors.py does not
time (bench/cuda/bench_gemv.cpp): PyTorch bf16 GEMV x[1, K] @ W[N, K]^T for the down projection (K14336 N4096),
the fused q/k/v projection (K4096 N6144) and the fused gate/up projection (K4096 N28672). Same method as
gpu_anchors.py: weights rotated over copies (>= 150 MB in all, beyond the 60 MB L2), a CUDA graph of `reps` calls
timed with CUDA events, median of >= 20 samples. Prints one row per shape named as the bench's `peer` strings;
writes gemv_shapes_peer.json into $OUT if set."""
import json, os

import torch

from peer_timing import bench  # tools/gpu/peer_timing.py: the script's folder is on sys.path

dev = "cuda"
torch.manual_seed(0)
res = {}

print(torch.__version__, torch.cuda.get_device_name(), flush=True)
for (K, N) in [(14336, 4096), (4096, 6144), (4096, 28672)]:
    copies = max(4, (150 << 20) // (2 * K * N) + 1)
    ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(1, K, device=dev, dtype=torch.bfloat16)
    i = [0]

    def f():
        i[0] = (i[0] + 1) % copies
        return x @ ws[i[0]].t()

    secs = bench(f, reps=20)
    name = f"bf16 GEMV K{K} N{N}"
    res[name] = {"s": secs, "TBs": 2 * K * N / secs / 1e12}
    print(f"{name:40s} {secs*1e6:9.2f} us  {res[name]['TBs']:.2f} TB/s ({copies} copies)", flush=True)
    del ws
    torch.cuda.empty_cache()
out = os.environ.get("OUT")
if out:
    json.dump(res, open(os.path.join(out, "gemv_shapes_peer.json"), "w"), indent=1)
