#!/usr/bin/env python3
"""Load generator for OpenAI-compatible servers (cider serve, llama-server): aggregate tokens/s, time to first token
and inter-token latency at several concurrencies, each stream a streaming /v1/completions request of a fixed length
(ignore_eos), prompts distinct from their first token (no shared prefix to reuse). Python's standard library only.

Usage: tools/serve_bench.py --url http://127.0.0.1:8080 --concurrency 1,4,16,64 --max-tokens 128 [--label cider]
Prints one Markdown table row per concurrency:
  | label | streams | completion tokens | wall s | aggregate tok/s | TTFT p50 ms | ITL p50 ms | ITL p99 ms |
Inter-token latency: the gaps between a stream's successive SSE events, each split evenly over the tokens the event
carries (counted from its logprobs: both servers send one entry per token), so a server that coalesces tokens is not
credited with short gaps. Sampling: temperature 0.7, top_k 40, logprobs 1 (for the token counts), the same for every
server.
"""
import argparse
import asyncio
import json
import statistics
import sys
import time
import urllib.parse

TEXT = ("The history of the city begins with a small settlement on the river, where traders met to exchange grain, "
        "salt and wool. Over the centuries the market grew into a town, the town built walls and a bridge, and the "
        "bridge brought travellers from the whole valley. Write the next chapter of this history, describing the "
        "people, the streets and the great fire that changed everything.")


async def one_stream(host, port, path, idx, max_tokens, headers):
    # top_k 40 sent explicitly: llama-server applies it by default, an OpenAI-style server (cider) samples from the
    # whole vocabulary unless told; so both do the same sampling work.
    body = json.dumps({"prompt": f"{idx} {TEXT}", "max_tokens": max_tokens, "temperature": 0.7, "top_k": 40, "seed": idx,
                       "stream": True, "ignore_eos": True, "logprobs": 1}).encode()
    reader, writer = await asyncio.open_connection(host, port)
    req = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\nConnection: close\r\n{headers}\r\n").encode() + body
    t0 = time.perf_counter()
    writer.write(req)
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        rest = await reader.read()
        raise RuntimeError(f"stream {idx}: {status!r} {rest[:300]!r}")
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    events = []  # (time, tokens in the event)
    buf = b""
    done = False
    while not done:
        chunk = await reader.read(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.split(b"\n"):
                line = line.strip()
                # chunked transfer encoding leaves size lines between events: keep only data lines
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    done = True
                    continue
                j = json.loads(data)
                ch = (j.get("choices") or [{}])[0]
                lp = ch.get("logprobs") or {}
                n = len(lp.get("tokens") or lp.get("content") or [])
                if n == 0 and ch.get("text"):
                    n = 1
                if n:
                    events.append((time.perf_counter(), n))
    writer.close()
    return t0, events


async def run_level(url, n, max_tokens, headers):
    u = urllib.parse.urlparse(url)
    path = u.path.rstrip("/") + "/v1/completions"
    t_start = time.perf_counter()
    res = await asyncio.gather(*[one_stream(u.hostname, u.port, path, i, max_tokens, headers) for i in range(n)])
    wall = time.perf_counter() - t_start
    tokens = sum(sum(k for _, k in ev) for _, ev in res)
    ttft = [ev[0][0] - t0 for t0, ev in res if ev]
    itl = []
    for _, ev in res:
        for (ta, _), (tb, k) in zip(ev, ev[1:]):
            itl.extend([(tb - ta) / k] * k)
    itl.sort()

    def pct(v, p):
        return v[min(len(v) - 1, int(p * len(v)))] * 1000 if v else float("nan")

    return tokens, wall, statistics.median(ttft) * 1000, pct(itl, 0.5), pct(itl, 0.99)


def step_metrics(url, headers):
    """cider's per-step sums from /metrics (steps, forward seconds, host seconds, batch rows), or None elsewhere."""
    u = urllib.parse.urlparse(url)
    try:
        import http.client
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
        c.request("GET", u.path.rstrip("/") + "/metrics",
                  headers=dict([headers.strip().split(": ", 1)]) if headers else {})
        text = c.getresponse().read().decode()
    except OSError:
        return None
    want = {"cider_step_forward_seconds_sum": 0, "cider_step_forward_seconds_count": 1,
            "cider_step_host_seconds_sum": 2, "cider_step_batch_size_sum": 3}
    v = [None] * 4
    for line in text.splitlines():
        name, _, val = line.partition(" ")
        if name in want:
            v[want[name]] = float(val)
    return None if None in v else v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--label", default="server")
    ap.add_argument("--api-key", default="")
    a = ap.parse_args()
    headers = f"Authorization: Bearer {a.api_key}\r\n" if a.api_key else ""
    asyncio.run(run_level(a.url, 1, 8, headers))  # warm-up
    for n in [int(x) for x in a.concurrency.split(",")]:
        before = step_metrics(a.url, headers)
        tokens, wall, ttft, p50, p99 = asyncio.run(run_level(a.url, n, a.max_tokens, headers))
        print(f"| {a.label} | {n} | {tokens} | {wall:.1f} | {tokens / wall:.1f} | {ttft:.0f} | {p50:.1f} | {p99:.1f} |",
              flush=True)
        after = step_metrics(a.url, headers)
        if before and after and after[1] > before[1]:
            d = [x - y for x, y in zip(after, before)]
            print(f"  {a.label} {n} streams: {d[1]:.0f} steps, forward {1000 * d[0] / d[1]:.2f} ms and host "
                  f"{1000 * d[2] / d[1]:.2f} ms per step, {d[3] / d[1]:.1f} sequences per step", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
