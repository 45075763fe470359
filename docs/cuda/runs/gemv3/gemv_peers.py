# Trimmed copy of ../shared/tools/gpu_anchors.py: copy bandwidth + the decode GEMV rows only (same bench()).
"""Peer baselines on an NVIDIA GPU: what a user gets today from PyTorch (cuBLAS/cuBLASLt, FlashAttention SDPA) for the
shapes cider's kernels target. Needs PyTorch with CUDA. Prints a table; writes gpu_anchors.json into $OUT if set.
Run it in the same job as cider's own benchmarks so that the ratios come from one machine and one run."""
import json, os, statistics, torch, torch.nn.functional as F

dev = "cuda"
torch.manual_seed(0)
res = {}

def bench(fn, iters=50, warm=10, reps=20):
    """Median seconds per call; each sample times `reps` back-to-back calls captured in a CUDA graph,
    so host launch overhead stays out of small kernels' figures."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(max(3, iters // 5)):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); g.replay(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e-3 / reps)
    del g
    return statistics.median(ts)

def row(name, secs, flops=None, bytes_=None):
    r = {"s": secs}
    txt = f"{name:58s} {secs*1e6:10.1f} us"
    if flops: r["TFLOPs"] = flops / secs / 1e12; txt += f"  {r['TFLOPs']:8.1f} T(FL)OP/s"
    if bytes_: r["TBps"] = bytes_ / secs / 1e12; txt += f"  {r['TBps']:6.2f} TB/s"
    res[name] = r; print(txt, flush=True)

print(torch.__version__, torch.cuda.get_device_name(), flush=True)
# 1. copy bandwidth
a = torch.empty(2 * 1024**3, dtype=torch.uint8, device=dev).random_(0, 255); b = torch.empty_like(a)
row("copy 2 GiB d2d", bench(lambda: b.copy_(a), 20), bytes_=2 * a.numel())
del a, b
# 3. decode GEMV bf16 (weight bytes dominate); rotate 8 weight copies to defeat L2
for (K, N) in [(4096, 4096), (4096, 14336), (8192, 28672)]:
    ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(4)]
    x = torch.randn(1, K, device=dev, dtype=torch.bfloat16); i = [0]
    def f():
        i[0] = (i[0] + 1) % 4; return x @ ws[i[0]].t()
    row(f"bf16 GEMV K{K} N{N}", bench(f, 100), bytes_=2 * K * N)
    # int8 weight-only style: upcast cost not counted; _int_mm needs M>16, so M=17 int8 as a 'decode batch'
    wis = [torch.randint(-127, 127, (N, K), device=dev, dtype=torch.int8) for _ in range(4)]
    xi = torch.randint(-127, 127, (32, K), device=dev, dtype=torch.int8)
    def g():
        i[0] = (i[0] + 1) % 4; return torch._int_mm(xi, wis[i[0]].t())
    try:
        row(f"int8 _int_mm M32 K{K} N{N}", bench(g, 100), bytes_=K * N)
    except Exception as ex:
        print("int8 M32 failed", ex)
    del ws, wis

if os.environ.get("OUT"):
    json.dump(res, open(os.path.join(os.environ["OUT"], "gemv_peers.json"), "w"), indent=1)
