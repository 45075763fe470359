"""Peer for cider's prefill GEMM rows (bench/cuda/bench_gemm.cpp) without the rest of ../shared/tools/gpu_anchors.py:
torch._int_mm (cuBLASLt int8 → int32) and fp8 torch._scaled_mm (the stretch goal) at the two GEMM shapes, rows named
as gpu_anchors.py names them (so tools/gpu/compare.py matches the bench's `peer` strings). Same method: a CUDA graph
of `reps` calls timed with CUDA events, median of the samples. Writes gemm_peer.json into $OUT if set."""
import json, os

import torch

from peer_timing import bench  # tools/gpu/peer_timing.py: the script's folder is on sys.path

dev = "cuda"
torch.manual_seed(0)
res = {}

print(torch.__version__, torch.cuda.get_device_name(), flush=True)
for (M, K, N) in [(2048, 4096, 14336), (512, 4096, 4096)]:
    flops = 2 * M * K * N
    xi = torch.randint(-127, 127, (M, K), device=dev, dtype=torch.int8)
    wi = torch.randint(-127, 127, (N, K), device=dev, dtype=torch.int8)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
    xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    one = torch.tensor(1.0, device=dev)
    for name, fn in [(f"int8 _int_mm M{M} K{K} N{N}", lambda: torch._int_mm(xi, wi.t())),
                     (f"fp8 _scaled_mm M{M} K{K} N{N}",
                      lambda: torch._scaled_mm(xf, wf.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))]:
        secs = bench(fn, samples=25, reps=20)
        res[name] = {"s": secs, "TFLOPs": flops / secs / 1e12}
        print(f"{name:40s} {secs*1e6:9.2f} us  {res[name]['TFLOPs']:7.1f} TOP/s", flush=True)
    del xi, wi, x, w, xf, wf
out = os.environ.get("OUT")
if out:
    json.dump(res, open(os.path.join(out, "gemm_peer.json"), "w"), indent=1)
