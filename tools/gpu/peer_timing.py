"""Timing of cider's PyTorch peers (tools/gpu/peers.py), the method of cuda_bench's bench_graph
(bench/cuda/bench_cuda_main.cpp): a CUDA graph of `reps` back-to-back calls, timed with CUDA events, the median of
`samples` replays after `warm` eager calls, so that host launch overhead stays out of small kernels' figures.
Returns seconds per call."""
import statistics

import torch


def bench(fn, samples=25, warm=5, reps=10):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(samples):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e-3 / reps)
    del g
    return statistics.median(ts)
