"""End-to-end tests of `cider serve` (the OpenAI-compatible HTTP server) over real sockets, with the official `openai`
client and with raw HTTP.

The binary is $CIDER_BIN (default build/cider, relative to the repository root); every server runs the embedded
cider-tiny on an ephemeral port (--port 0, the port parsed from the "listening on" line of its stderr). Servers:
  * `server`: the session's server with the default options (prefix cache on): the protocol, errors, logprobs,
    metrics, disconnects and the load test;
  * `nocache_server`: --prefix-cache 0, for the checks that compare two generations (greedy text against
    `cider generate`, seeded sampling on repeat, a request alone against the same request inside a batch, stop
    strings): they test the engine and the protocol without the prefix cache in the way;
  * `cache_server`: a fresh default server whose prefix cache is exercised by one deterministic sequence of requests;
  * short-lived servers for --api-key, --max-batch 1 --max-waiting 0 (429), --max-body (413) and SIGTERM.
Every server must exit 0 on SIGTERM.

Run: bash scripts/test_serve.sh (a venv with openai and pytest), or pytest -q tests/serve with those installed.
$CIDER_SERVE_LOAD_SECONDS sets the load test's duration (default 20).
"""
import concurrent.futures as cf
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
CIDER_BIN = Path(os.environ.get("CIDER_BIN", "build/cider"))
if not CIDER_BIN.is_absolute():
    CIDER_BIN = ROOT / CIDER_BIN
TIMEOUT = 60.0  # seconds: any single HTTP exchange, server start or exit
LOAD_SECONDS = float(os.environ.get("CIDER_SERVE_LOAD_SECONDS", "20"))
MODEL = "cider-tiny"
CONTEXT = 1024

LISTENING = re.compile(r"listening on (http://[^\s:]+:(\d+))\s*$")


# ---- servers -------------------------------------------------------------------------------------------------------
class Server:
    """One `cider serve --port 0 ARGS` process; stderr is collected by a thread (self.log())."""

    def __init__(self, *args, env=None):
        if not os.access(CIDER_BIN, os.X_OK):
            pytest.fail(f"no cider binary at {CIDER_BIN} (build it, or set CIDER_BIN)")
        e = {k: v for k, v in os.environ.items() if k != "CIDER_API_KEY"}
        e.update(env or {})
        self.args = ["serve", "--port", "0", *args]
        self.proc = subprocess.Popen([str(CIDER_BIN), *self.args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=e)
        self.pid = self.proc.pid
        self._lines = []
        self._ready = threading.Event()
        self.url = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + TIMEOUT
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                self._reader.join(5)
                pytest.fail(f"cider {' '.join(self.args)} did not start (exit {self.proc.returncode}):\n{self.log()}")
        u = urlsplit(self.url)
        self.host, self.port = u.hostname, u.port
        while True:  # listening is printed once bound; /health answers once the listener thread runs
            try:
                if get(self.url, "/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop(signal.SIGKILL)
                pytest.fail(f"cider {' '.join(self.args)}: /health never answered:\n{self.log()}")
            time.sleep(0.02)

    def _read(self):
        for line in self.proc.stderr:
            self._lines.append(line)
            m = LISTENING.search(line)
            if m and self.url is None:
                self.url = m.group(1)
                self._ready.set()

    def log(self):
        return "".join(self._lines)

    def wait_log(self, text, timeout=TIMEOUT):
        wait_until(lambda: text in self.log(), f"{text!r} on the server's stderr", timeout)

    def stop(self, sig=signal.SIGTERM, timeout=TIMEOUT):
        """Signals the server and returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"cider serve did not exit within {timeout} s of signal {sig}:\n{self.log()}")
        self._reader.join(5)
        return rc

    def rss_bytes(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc/<pid>/status")


def stop_cleanly(s: Server):
    rc = s.stop()
    assert rc == 0, f"cider {' '.join(s.args)} exited {rc} on SIGTERM:\n{s.log()}"
    assert "cider serve: stopped" in s.log(), s.log()


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    stop_cleanly(s)


@pytest.fixture(scope="session")
def nocache_server():
    s = Server("--prefix-cache", "0")
    yield s
    stop_cleanly(s)


@pytest.fixture(scope="session")
def cache_server():
    s = Server()
    yield s
    stop_cleanly(s)


@pytest.fixture
def client(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=TIMEOUT)
    yield c
    c.close()


@pytest.fixture(scope="session")
def eos_ids():
    out = subprocess.run([str(CIDER_BIN), "inspect"], capture_output=True, text=True, timeout=TIMEOUT, check=True).stdout
    m = re.search(r"\beos \[([\d, ]+)\]", out)
    assert m, f"no eos ids in `cider inspect`:\n{out}"
    return [int(x) for x in m.group(1).split(",")]


def no_eos(eos_ids):
    """logit_bias that keeps a sampled continuation going to max_tokens."""
    return {str(i): -100 for i in eos_ids}


# ---- HTTP helpers --------------------------------------------------------------------------------------------------
class Response:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    @property
    def text(self):
        return self.body.decode("utf-8")

    def json(self):
        return json.loads(self.body)


def send(url, method, path, body=None, headers=None, timeout=TIMEOUT):
    """One request on a fresh connection. body: bytes/str sent as is, anything else as JSON."""
    u = urlsplit(url)
    h = dict(headers or {})
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
        h.setdefault("Content-Type", "application/json")
    if isinstance(body, str):
        body = body.encode("utf-8")
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def get(url, path, **kw):
    return send(url, "GET", path, **kw)


def post(url, path, body, **kw):
    return send(url, "POST", path, body, **kw)


def complete(url, **fields):
    """POST /v1/completions, asserting 200; returns the parsed body."""
    r = post(url, "/v1/completions", {"model": MODEL, **fields})
    assert r.status == 200, (r.status, r.text)
    return r.json()


def chat(url, **fields):
    r = post(url, "/v1/chat/completions", {"model": MODEL, **fields})
    assert r.status == 200, (r.status, r.text)
    return r.json()


def sse_payloads(raw: str):
    """The data payloads of a whole SSE body, checking the framing: events separated by a blank line, each one line
    "data: ...", the last "[DONE]"."""
    assert raw.endswith("\n\n"), repr(raw[-200:])
    events = raw[:-2].split("\n\n")
    payloads = []
    for ev in events:
        assert ev.startswith("data: ") and "\n" not in ev, f"not one 'data: ' line: {ev!r}"
        payloads.append(ev[len("data: "):])
    assert payloads[-1] == "[DONE]", payloads[-1]
    assert "[DONE]" not in payloads[:-1]
    return [json.loads(p) for p in payloads[:-1]]


def stream_text(chunks, chat_endpoint):
    if chat_endpoint:
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


class Stream:
    """A streaming request read event by event over its own connection."""

    def __init__(self, url, path, body, timeout=TIMEOUT):
        u = urlsplit(url)
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        self.conn.request("POST", path, body=json.dumps({"model": MODEL, "stream": True, **body}),
                          headers={"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, (self.resp.status, self.resp.read())
        assert self.resp.getheader("Content-Type", "").startswith("text/event-stream")

    def event(self):
        """The next event's payload (str), or None at the end of the body."""
        line = self.resp.readline().decode("utf-8")
        if not line:
            return None
        assert line.startswith("data: ") and line.endswith("\n"), repr(line)
        assert self.resp.readline() == b"\n"
        return line[len("data: "):-1]

    def rest(self):
        """All remaining payloads up to and including [DONE] (asserting it is last)."""
        out = []
        while (p := self.event()) is not None:
            out.append(p)
        assert out and out[-1] == "[DONE]", out[-3:]
        return [json.loads(p) for p in out[:-1]]

    def close(self):
        self.conn.close()


def metrics(url):
    """GET /metrics as {'name{labels}': value} (HELP/TYPE comments dropped)."""
    r = get(url, "/metrics")
    assert r.status == 200, r.status
    assert r.headers["content-type"].startswith("text/plain"), r.headers
    out = {}
    for line in r.text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def wait_until(predicate, what, timeout=15.0):
    deadline = time.monotonic() + timeout
    while True:
        v = predicate()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def idle(url):
    h = get(url, "/health").json()
    return h["running"] == 0 and h["waiting"] == 0


def generate(prompt, max_tokens):
    """The greedy continuation printed by `cider generate` (it ends its output with one newline)."""
    r = subprocess.run([str(CIDER_BIN), "generate", "-p", prompt, "--max-tokens", str(max_tokens), "--temperature", "0"],
                       capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    out = r.stdout.decode("utf-8")
    assert out.endswith("\n"), repr(out[-50:])
    return out[:-1]


def check_usage(u, completion_tokens=None, cached=None):
    u = u if isinstance(u, dict) else u.model_dump()
    assert u["prompt_tokens"] >= 1
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
    assert 0 <= u["prompt_tokens_details"]["cached_tokens"] < u["prompt_tokens"], u
    if completion_tokens is not None:
        assert u["completion_tokens"] == completion_tokens, u
    if cached is not None:
        assert u["prompt_tokens_details"]["cached_tokens"] == cached, u
    return u


def assert_api_error(r: Response, status, *words, param=None, type_="invalid_request_error"):
    """An OpenAI error body: {"error": {"message", "type", "param", "code"}}, the message naming `words`."""
    assert r.status == status, (r.status, r.text)
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert err["type"] == type_, err
    assert isinstance(err["message"], str) and err["message"], err
    for w in words:
        assert w in err["message"], f"{w!r} not in the message {err['message']!r}"
    if param is not None:
        assert err["param"] == param, err
    return err


PROMPTS = ["def fibonacci(n):", "#include <stdio.h>\nint main(void) {"]
CODE = ("import numpy as np\n\ndef moving_average(values, window):\n"
        "    \"\"\"Return the moving average of values over a window.\"\"\"\n") * 3


# ---- the openai client ---------------------------------------------------------------------------------------------
def test_models(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    raw = get(server.url, "/v1/models").json()
    assert raw["object"] == "list" and raw["data"][0]["max_model_len"] == CONTEXT


def test_completion(client, eos_ids):
    r = client.completions.create(model=MODEL, prompt="def add(a, b):", max_tokens=12, temperature=0,
                                  logit_bias=no_eos(eos_ids))
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == MODEL
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.finish_reason == "length" and c.text and c.logprobs is None
    check_usage(r.usage, completion_tokens=12)


def test_completion_prompt_forms(nocache_server):
    """A string, a list of one string and the token ids of the same text give the same greedy text."""
    ids = subprocess.run([str(CIDER_BIN), "tokenize", "--text", "class Stack:"], capture_output=True, text=True,
                         timeout=TIMEOUT, check=True).stdout
    ids = [int(x) for x in re.findall(r"\d+", ids)]
    outs = []
    for prompt in ("class Stack:", ["class Stack:"], ids):
        r = complete(nocache_server.url, prompt=prompt, max_tokens=6, temperature=0)
        check_usage(r["usage"], completion_tokens=6)
        assert r["usage"]["prompt_tokens"] == len(ids)
        outs.append(r["choices"][0]["text"])
    assert len(set(outs)) == 1, outs
    echo = complete(nocache_server.url, prompt="class Stack:", max_tokens=6, temperature=0, echo=True)
    assert echo["choices"][0]["text"] == "class Stack:" + outs[0]


def test_completion_stream_with_logprobs(client, eos_ids):
    chunks = list(client.completions.create(model=MODEL, prompt="for i in range(10):", max_tokens=20, temperature=0.7,
                                            seed=3, logprobs=1, stream=True, stream_options={"include_usage": True},
                                            logit_bias=no_eos(eos_ids)))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    body = [c for c in chunks if c.choices]
    assert all(c.usage is None for c in chunks[:-1])
    assert [c.choices[0].finish_reason for c in body].count("length") == 1 and body[-1].choices[0].finish_reason == "length"
    tokens = [t for c in body if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    u = check_usage(chunks[-1].usage, completion_tokens=20)
    assert len(tokens) == u["completion_tokens"]
    assert "".join(tokens) == "".join(c.choices[0].text for c in body)


def test_chat(client, eos_ids):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "You write Python."},
                                                              {"role": "user", "content": "Sort a list."}],
                                       max_tokens=10, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    c = r.choices[0]
    assert c.message.role == "assistant" and isinstance(c.message.content, str)
    u = check_usage(r.usage)
    assert c.finish_reason in ("length", "stop") and 1 <= u["completion_tokens"] <= 10
    if c.finish_reason == "length":
        assert u["completion_tokens"] == 10
    # max_completion_tokens, the newer name, wins over max_tokens.
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello"}],
                                       max_completion_tokens=3, max_tokens=50, temperature=0, logit_bias=no_eos(eos_ids))
    assert r.choices[0].finish_reason == "length"
    check_usage(r.usage, completion_tokens=3)


def test_chat_stream_with_logprobs(client, eos_ids):
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a haiku about compilers."}], max_tokens=16,
        temperature=0.9, seed=11, logprobs=True, top_logprobs=2, stream=True, stream_options={"include_usage": True},
        logit_bias=no_eos(eos_ids)))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    body = [c for c in chunks if c.choices]
    assert body[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in body[:-1])
    entries = [e for c in body if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    u = check_usage(chunks[-1].usage, completion_tokens=16)
    assert len(entries) == u["completion_tokens"]
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)
    assert len({c.id for c in chunks}) == 1


def test_chat_stream_without_usage(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=4, temperature=0, stream=True))
    assert all(c.usage is None and len(c.choices) == 1 for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


# ---- determinism (no prefix cache) ---------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_completion_equals_cider_generate(nocache_server, prompt):
    r = complete(nocache_server.url, prompt=prompt, max_tokens=48, temperature=0)
    assert r["choices"][0]["text"] == generate(prompt, 48)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_same_seed_same_sample(nocache_server, endpoint):
    def once(seed):
        if endpoint == "chat":
            r = chat(nocache_server.url, messages=[{"role": "user", "content": "Tell me about lists."}], max_tokens=40,
                     temperature=0.8, seed=seed)
            return r["choices"][0]["message"]["content"]
        r = complete(nocache_server.url, prompt="def parse(line):", max_tokens=40, temperature=0.8, seed=seed)
        return r["choices"][0]["text"]

    first = once(1234)
    assert once(1234) == first
    assert once(1234) == first
    # The seed is used: four seeds do not all give one text.
    assert len({first, once(1), once(2), once(3)}) > 1


# A batched forward step (rows of several sequences together) is not bit-for-bit the one-row step: logprobs move by
# up to ~0.006 (measured), so two tokens whose logprobs are closer than that may swap. A greedy text is compared up to
# its first such near tie (in practice: whole), and its logprobs within NEAR_TIE.
NEAR_TIE = 0.05


def greedy_agreement(ref, other):
    """ref, other: completion choices of one greedy request with logprobs >= 2. Asserts `other` continues as `ref`
    up to ref's first near tie and returns how many tokens were compared."""
    lp = ref["logprobs"]
    n = len(lp["tokens"])
    for j, top in enumerate(lp["top_logprobs"]):
        v = sorted(top.values(), reverse=True)  # two ids that decode alike share a key: count it as a tie
        if len(v) < 2 or v[0] - v[1] < NEAR_TIE:
            n = j
            break
    prefix = "".join(lp["tokens"][:n])
    assert other["text"].startswith(prefix), (n, prefix, other["text"])
    got = other["logprobs"]["token_logprobs"][:n]
    worst = max((abs(a - b) for a, b in zip(got, lp["token_logprobs"][:n])), default=0.0)
    assert worst < NEAR_TIE, f"logprobs differ by {worst} over the first {n} tokens"
    if n == len(lp["tokens"]):
        assert other["text"] == ref["text"]
    return n


def first_near_tie(choice):
    """Tokens before the first near tie (top-2 gap < NEAR_TIE) of a greedy choice with logprobs."""
    for j, d in enumerate(choice["logprobs"]["top_logprobs"]):
        v = sorted(d.values(), reverse=True)
        if len(v) < 2 or v[0] - v[1] < NEAR_TIE:
            return j
    return len(choice["logprobs"]["tokens"])


def test_alone_equals_batched(nocache_server):
    """The same greedy requests alone and inside 8 concurrent requests of other lengths and settings."""
    url = nocache_server.url
    # Of each kind, the prompt whose greedy reply alone has its first near tie latest: where near ties fall moves with
    # the cache format and the ISA level (under the 4.94-bit default "class Stack: def __init__(self):" had one at
    # token 3), and the comparison stops at the first one.
    shorts = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):", "class Stack:\n    def __init__(self):",
              "for i in range(10):\n    print(", "def fibonacci(n):\n    if n < 2:"]
    longs = ["".join(f"x{i} = {i} * {i}\n" for i in range(40)),
             "".join(f"def h{i}(z):\n    return z * {i} + 1\n\n" for i in range(12)),
             "".join(f"print('line {i}')\n" for i in range(40))]
    alone = {}
    for kind, prompts in (("short", shorts), ("long", longs)):
        best = None
        for p in prompts:
            r = dict(prompt=p, max_tokens=40, temperature=0, logprobs=2)
            c = complete(url, **r)["choices"][0]
            if best is None or first_near_tie(c) > first_near_tie(best[1]):
                best = (r, c)
        alone[kind] = best
    assert min(first_near_tie(c) for _, c in alone.values()) >= 10, "every candidate prompt has an early near tie"
    short, long_ = alone["short"][0], alone["long"][0]
    alone = {k: c for k, (_, c) in alone.items()}
    others = [dict(prompt=f"# module {i}\n" * (5 + 17 * i), max_tokens=30 + i, temperature=0.5, seed=i) for i in range(4)]
    jobs = [("long", long_), ("short", short), (None, others[0]), ("long", long_), (None, others[1]),
            ("short", short), (None, others[2]), (None, others[3])]
    compared = []
    for _ in range(2):
        with cf.ThreadPoolExecutor(8) as ex:
            results = list(ex.map(lambda j: complete(url, **j[1]), jobs))
        assert max(r["usage"]["prompt_tokens"] for r in results) > 256  # a prompt prefilled over several steps
        for (k, _), r in zip(jobs, results):
            if k:
                compared.append(greedy_agreement(alone[k], r["choices"][0]))
    assert min(compared) >= 10, compared  # the prompts are chosen for few near ties


def test_stop_strings(nocache_server, eos_ids):
    url = nocache_server.url
    prompt = PROMPTS[1]
    bias = no_eos(eos_ids)
    full = complete(url, prompt=prompt, max_tokens=40, temperature=0, logit_bias=bias)["choices"][0]["text"]
    assert len(full) >= 12, repr(full)
    k = len(full) // 2
    stop = full[k:k + 3]
    cut = full.find(stop)
    expected = full[:cut]
    for stops in (stop, ["\x00never\x00", stop]):
        r = complete(url, prompt=prompt, max_tokens=40, temperature=0, stop=stops, logit_bias=bias)
        c = r["choices"][0]
        assert c["text"] == expected, (stop, full)
        assert c["finish_reason"] == "stop"
        assert r["usage"]["completion_tokens"] < 40
        s = Stream(url, "/v1/completions", dict(prompt=prompt, max_tokens=40, temperature=0, stop=stops, logit_bias=bias))
        chunks = s.rest()
        s.close()
        assert stream_text(chunks, False) == expected
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # Chat: the same through the other endpoint.
    msgs = [{"role": "user", "content": "Explain pointers."}]
    full = chat(url, messages=msgs, max_tokens=40, temperature=0, logit_bias=bias)["choices"][0]["message"]["content"]
    assert len(full) >= 4, repr(full)
    k = len(full) // 2
    stop = full[k:k + 3]
    expected = full[:full.find(stop)]
    r = chat(url, messages=msgs, max_tokens=40, temperature=0, stop=[stop], logit_bias=bias)
    assert r["choices"][0]["message"]["content"] == expected and r["choices"][0]["finish_reason"] == "stop"
    s = Stream(url, "/v1/chat/completions", dict(messages=msgs, max_tokens=40, temperature=0, stop=[stop],
                                                                logit_bias=bias))
    chunks = s.rest()
    s.close()
    assert stream_text(chunks, True) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


# ---- prefix cache --------------------------------------------------------------------------------------------------
LONGER = CODE + "    result = []\n"
# The default CPU cache keeps keys per channel in blocks of 64 positions (cider-tiny: k4v4/hadamard/g64/kchan/o2/vsym/rx): a prefix
# is reused down to a block boundary (trimming into a quantized block would round its keys again).
BLOCK = 64


@pytest.fixture(scope="session")
def cache_run(cache_server, nocache_server, eos_ids):
    """One deterministic sequence on a fresh server: a long-ish prompt (a miss), the same prompt again, the prompt
    plus more text, then a seeded sample twice; and the longer prompt on the server without a prefix cache."""
    url = cache_server.url
    before = metrics(url)
    greedy = dict(max_tokens=48, temperature=0, logprobs=2)
    out = {"miss": complete(url, prompt=CODE, **greedy),
           "again": complete(url, prompt=CODE, **greedy),
           "longer": complete(url, prompt=LONGER, **greedy)}
    seeded = dict(prompt=CODE + "def tokenize(text):", max_tokens=64, temperature=0.8, seed=5, logit_bias=no_eos(eos_ids))
    out["seeded1"] = complete(url, **seeded)
    out["seeded2"] = complete(url, **seeded)
    wait_until(lambda: idle(url), "an idle server")  # the counters are updated when a request is released
    # (a finished session joins the prefix pool at the end of the engine's step, just after its request is released)
    wait_until(lambda: metrics(url)["cider_prefix_cache_entries"] >= 1, "a pooled prefix")
    out["metrics"] = (before, metrics(url))
    out["longer_fresh"] = complete(nocache_server.url, prompt=LONGER, **greedy)
    return out


def divergence(ref, hit):
    """Where two greedy choices (with logprobs) part, for the assertion message."""
    a, b = ref["logprobs"], hit["logprobs"]
    k = 0
    while k < min(len(a["tokens"]), len(b["tokens"])) and a["tokens"][k] == b["tokens"][k]:
        k += 1
    worst = max(abs(x - y) for x, y in zip(a["token_logprobs"][:k + 1], b["token_logprobs"][:k + 1]))
    return (f"the texts part at token {k} of {len(a['tokens'])} ({''.join(a['tokens'][:k])!r} + "
            f"{a['tokens'][k:k + 1]} vs {b['tokens'][k:k + 1]}); the largest logprob difference up to there is "
            f"{worst:.4f} (batching alone moves them by < 0.01)")


def test_prefix_cache_hits(cache_run):
    check_usage(cache_run["miss"]["usage"], cached=0)
    n = cache_run["miss"]["usage"]["prompt_tokens"]
    assert n > 100
    again = check_usage(cache_run["again"]["usage"])
    # all but the last prompt token, down to a key block boundary
    assert again["prompt_tokens_details"]["cached_tokens"] == (n - 1) // BLOCK * BLOCK
    longer = check_usage(cache_run["longer"]["usage"])["prompt_tokens_details"]["cached_tokens"]
    assert longer >= (n - 1) // BLOCK * BLOCK and longer % BLOCK == 0
    before, after = cache_run["metrics"]
    cached = sum(cache_run[k]["usage"]["prompt_tokens_details"]["cached_tokens"]
                 for k in ("miss", "again", "longer", "seeded1", "seeded2"))
    assert after["cider_prompt_tokens_cached_total"] - before["cider_prompt_tokens_cached_total"] == cached
    assert after["cider_prefix_cache_entries"] >= 1


def test_prefix_cache_miss_equals_cider_generate(cache_run):
    assert cache_run["miss"]["choices"][0]["text"] == generate(CODE, 48)
    assert cache_run["longer_fresh"]["choices"][0]["text"] == generate(LONGER, 48)


def test_prefix_cache_hit_same_text_as_miss(cache_run):
    miss, hit = cache_run["miss"]["choices"][0], cache_run["again"]["choices"][0]
    assert hit["text"] == miss["text"], divergence(miss, hit)


def test_prefix_cache_hit_on_longer_prompt_same_text_as_miss(cache_run):
    """The prompt + more text, served mostly from the cache, continues as a fresh run of that prompt does."""
    fresh, hit = cache_run["longer_fresh"]["choices"][0], cache_run["longer"]["choices"][0]
    assert cache_run["longer"]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert hit["text"] == fresh["text"], divergence(fresh, hit)


def test_prefix_cache_same_seed_same_sample(cache_run):
    assert cache_run["seeded2"]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert cache_run["seeded2"]["choices"][0]["text"] == cache_run["seeded1"]["choices"][0]["text"]


def test_prefix_cache_survives_unrelated_request(cache_run, cache_server):
    """The cache keeps up to --prefix-cache (16) finished sequences: one request whose prompt shares nothing but the
    first (BOS) token must not take away the cached prefix of another."""
    url = cache_server.url
    a = dict(prompt=CODE + "def merge_sort(items):\n    if len(items) <= 1:\n        return items\n", max_tokens=8,
             temperature=0)
    n = complete(url, **a)["usage"]["prompt_tokens"]
    complete(url, prompt="SELECT name FROM users WHERE id = 7;", max_tokens=8, temperature=0)
    again = complete(url, **a)["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] == (n - 1) // BLOCK * BLOCK, (
        again, metrics(url)["cider_prefix_cache_entries"])


SYSTEM = ("You review Python code. Answer with the corrected code only, no prose. Keep the names the user chose, "
          "keep the behaviour, prefer the standard library, and explain nothing unless asked. ") * 4


def test_prefix_cache_shared_by_concurrent_chats(nocache_server):
    """Copy on take: after one chat pools its session, four chats sharing its system prompt, sent at once, each copy
    the pooled prefix (cached_tokens > 0, whole key blocks) and reply as a server without a prefix cache does; the
    warm-up's entry stays pooled beside their four (five entries: a take would leave four)."""
    s = Server()
    try:
        url = s.url
        greedy = dict(max_tokens=24, temperature=0)

        def messages(user):
            return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]

        warm = chat(url, messages=messages("x = [1, 2, 3]\nprint(len(x))"), **greedy)
        check_usage(warm["usage"], cached=0)
        assert warm["usage"]["prompt_tokens"] > 2 * BLOCK
        wait_until(lambda: metrics(url)["cider_prefix_cache_entries"] == 1, "the warm-up's pooled session")
        before = metrics(url)
        users = ["def add(a, b):\n    return a - b", "for i in range(10) print(i)", "import os\nos.getcwd",
                 "class A:\n    def f(self): return self.x"]
        with cf.ThreadPoolExecutor(len(users)) as ex:
            replies = list(ex.map(lambda u: chat(url, messages=messages(u), **greedy), users))
        for u, r in zip(users, replies):
            f = chat(nocache_server.url, messages=messages(u), **greedy)
            cached = check_usage(r["usage"])["prompt_tokens_details"]["cached_tokens"]
            assert cached > 0 and cached % BLOCK == 0, (u, r["usage"])
            assert r["choices"][0]["message"]["content"] == f["choices"][0]["message"]["content"], u
        wait_until(lambda: idle(url), "an idle server")
        wait_until(lambda: metrics(url)["cider_prefix_cache_entries"] == 1 + len(users),
                   "the warm-up's entry beside the four new ones")
        after = metrics(url)
        assert after["cider_prefix_cache_hits_total"] - before["cider_prefix_cache_hits_total"] == len(users)
        assert after["cider_prefix_cache_bytes"] > before["cider_prefix_cache_bytes"] > 0
        assert after["cider_kv_bytes_reserved"] == after["cider_prefix_cache_bytes"]  # nothing running reserves
    finally:
        stop_cleanly(s)


# ---- logprobs ------------------------------------------------------------------------------------------------------
def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Print hello world in C."}],
                                       max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    u = check_usage(r.usage)
    assert len(content) == u["completion_tokens"] >= 1
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        tops = [t.logprob for t in e.top_logprobs]
        assert all(t <= 0 for t in tops) and tops == sorted(tops, reverse=True)
        assert e.logprob == pytest.approx(tops[0], abs=1e-9)  # greedy: the sampled token is the most probable
        assert e.token == e.top_logprobs[0].token
        assert e.bytes == list(e.token.encode("utf-8"))
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "length" and text.isascii():
        assert "".join(e.token for e in content) == text
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                       temperature=0)
    assert r.choices[0].logprobs is None


def test_completion_logprobs(client, eos_ids):
    r = client.completions.create(model=MODEL, prompt="def quicksort(xs):", max_tokens=12, temperature=0, logprobs=2,
                                  logit_bias=no_eos(eos_ids))
    lp = r.choices[0].logprobs
    n = check_usage(r.usage, completion_tokens=12)["completion_tokens"]
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    ascii_text = r.choices[0].text.isascii()  # a token that splits a UTF-8 character decodes to U+FFFD alone
    if ascii_text:
        assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for tok, l, top, off in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset):
        assert l <= 0
        assert 1 <= len(top) <= 2 and all(v <= 0 for v in top.values())
        assert max(top.values()) == pytest.approx(l, abs=1e-9)  # greedy
        assert top.get(tok) == pytest.approx(l, abs=1e-9)
        if ascii_text:
            assert r.choices[0].text[off:off + len(tok)] == tok
    # Sampled at a temperature: the sampled token is never more probable than the most probable one.
    r = client.completions.create(model=MODEL, prompt="x =", max_tokens=16, temperature=1.2, seed=7, logprobs=1)
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == r.usage.completion_tokens
    for l, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert l <= 0 and len(top) == 1 and l <= max(top.values()) + 1e-9
    r = client.completions.create(model=MODEL, prompt="x =", max_tokens=4, logprobs=0)
    assert len(r.choices[0].logprobs.token_logprobs) == r.usage.completion_tokens
    assert all(t == {} for t in r.choices[0].logprobs.top_logprobs)


# ---- malformed requests --------------------------------------------------------------------------------------------
C, CH = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
BAD = [
    ("non-JSON", C, "this is not json", ["JSON"], None),
    ("truncated JSON", C, '{"prompt": "a", ', ["JSON"], None),
    ("JSON array", C, "[1, 2, 3]", ["JSON object"], None),
    ("JSON string", CH, '"hello"', ["JSON object"], None),
    ("temperature string", C, {"prompt": "a", "temperature": "hot"}, ["temperature"], "temperature"),
    ("temperature range", CH, {"messages": MSG, "temperature": 3}, ["temperature"], "temperature"),
    ("max_tokens -1", C, {"prompt": "a", "max_tokens": -1}, ["max_tokens"], "max_tokens"),
    ("max_tokens float", CH, {"messages": MSG, "max_tokens": 2.5}, ["max_tokens"], "max_tokens"),
    ("top_p 0", C, {"prompt": "a", "top_p": 0}, ["top_p"], "top_p"),
    ("stop number", C, {"prompt": "a", "stop": 5}, ["stop"], "stop"),
    ("stop list of numbers", CH, {"messages": MSG, "stop": ["a", 1]}, ["stop"], "stop"),
    ("stop empty string", C, {"prompt": "a", "stop": [""]}, ["stop"], "stop"),
    ("stream string", C, {"prompt": "a", "stream": "yes"}, ["stream"], "stream"),
    ("seed string", C, {"prompt": "a", "seed": "x"}, ["seed"], "seed"),
    ("logit_bias key", C, {"prompt": "a", "logit_bias": {"abc": 1}}, ["logit_bias"], "logit_bias"),
    ("completion logprobs bool", C, {"prompt": "a", "logprobs": True}, ["logprobs"], "logprobs"),
    ("top_logprobs alone", CH, {"messages": MSG, "top_logprobs": 3}, ["top_logprobs"], "top_logprobs"),
    ("top_logprobs 21", CH, {"messages": MSG, "logprobs": True, "top_logprobs": 21}, ["top_logprobs"], "top_logprobs"),
    ("prompt missing", C, {"max_tokens": 3}, ["prompt"], "prompt"),
    ("prompt object", C, {"prompt": {"text": "a"}}, ["prompt"], "prompt"),
    ("prompt token out of range", C, {"prompt": [1, 999999]}, ["prompt"], "prompt"),
    ("messages missing", CH, {"max_tokens": 3}, ["messages"], "messages"),
    ("messages empty", CH, {"messages": []}, ["messages"], "messages"),
    ("messages string", CH, {"messages": "hi"}, ["messages"], "messages"),
    ("bad role", CH, {"messages": [{"role": "wizard", "content": "x"}]}, ["role", "wizard"], "messages[0].role"),
    ("role missing", CH, {"messages": [{"content": "x"}]}, ["role"], "messages[0]"),
    ("image content", CH, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     ["content"], "messages[0].content"),
    ("n 2", C, {"prompt": "a", "n": 2}, ["'n'"], "n"),
    ("n 2 chat", CH, {"messages": MSG, "n": 2}, ["'n'"], "n"),
    ("tools", CH, {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     ["tools"], "tools"),
    ("response_format json_schema pattern", CH, {"messages": MSG, "response_format": {"type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "string",
                                                                                     "pattern": "x+"}}}}}},
     ["response_format", "pattern"], "response_format"),
    ("response_format json_schema without schema", CH, {"messages": MSG, "response_format": {"type": "json_schema",
                                                                                             "json_schema": {}}},
     ["response_format", "schema"], "response_format"),
    ("response_format type", CH, {"messages": MSG, "response_format": {"type": "yaml"}}, ["response_format", "yaml"],
     "response_format"),
    ("response_format string", CH, {"messages": MSG, "response_format": "json_object"}, ["response_format"],
     "response_format"),
]


def test_json_object_replies(client):
    """response_format json_object / json_schema through the openai client: each reply that stops is one JSON object
    (parsed by Python's json; with a schema, its keys and types), streamed or not; one that runs out of tokens says
    "length"."""
    stopped = 0
    for seed in range(1, 7):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "A JSON object, please."}],
                                           response_format={"type": "json_object"}, max_tokens=60, seed=seed,
                                           temperature=0.9)
        choice = r.choices[0]
        if choice.finish_reason == "stop":
            stopped += 1
            assert isinstance(json.loads(choice.message.content), dict), choice.message.content
        else:
            assert choice.finish_reason == "length" and r.usage.completion_tokens == 60
    assert stopped >= 1  # the embedded model closes its objects within 60 tokens at these seeds
    text, reason = "", None
    for chunk in client.completions.create(model=MODEL, prompt="{", max_tokens=60, seed=3, stream=True,
                                           extra_body={"response_format": {"type": "json_object"}}):
        text += chunk.choices[0].text or ""
        reason = chunk.choices[0].finish_reason or reason
    if reason == "stop":
        assert isinstance(json.loads(text), dict), text
    # A schema: the replies that close hold its keys with their types.
    schema = {"type": "object", "properties": {"indoor": {"type": "boolean"},
                                               "color": {"enum": ["black", "white", "orange"]}},
              "required": ["indoor", "color"], "additionalProperties": False}
    closed = 0
    for seed in range(1, 7):
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Describe a cat."}],
                                           response_format={"type": "json_schema",
                                                            "json_schema": {"name": "cat", "schema": schema}},
                                           max_tokens=80, seed=seed, temperature=0.9)
        choice = r.choices[0]
        if choice.finish_reason != "stop":
            continue
        closed += 1
        v = json.loads(choice.message.content)
        assert set(v) == {"indoor", "color"}, v
        assert isinstance(v["indoor"], bool) and v["color"] in schema["properties"]["color"]["enum"], v
    assert closed >= 1


@pytest.mark.parametrize("name,path,body,words,param", BAD, ids=[b[0] for b in BAD])
def test_malformed_request_400(server, name, path, body, words, param):
    assert_api_error(post(server.url, path, body, headers={"Content-Type": "application/json"}), 400, *words,
                     param=param)


@pytest.mark.parametrize("path", [C, CH])
def test_over_long_prompt_400(server, path):
    words = " ".join(f"word{i}" for i in range(3000))
    body = {"prompt": words} if path == C else {"messages": [{"role": "user", "content": words}]}
    err = assert_api_error(post(server.url, path, body), 400, str(CONTEXT), str(CONTEXT - 1))
    n = int(re.search(r"has (\d+) tokens", err["message"]).group(1))
    assert n > CONTEXT, err
    assert err["param"] == ("prompt" if path == C else "messages")
    # At the limit: a prompt of context - 1 token ids is served (one token of room).
    r = complete(server.url, prompt=[5] * (CONTEXT - 1), max_tokens=50, temperature=0)
    assert r["usage"]["completion_tokens"] == 1 and r["choices"][0]["finish_reason"] in ("length", "stop")
    assert_api_error(post(server.url, C, {"prompt": [5] * CONTEXT}), 400, str(CONTEXT))


def test_malformed_through_openai_client(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", n=2)
    assert e.value.status_code == 400 and e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], temperature=-1)
    assert "temperature" in e.value.body["message"]


def test_unknown_fields_ignored(server, client):
    r = post(server.url, C, {"prompt": "a", "max_tokens": 2, "frobnicate": {"x": [1, 2]}, "user": "me",
                             "logit_bias": {}, "tools": [], "response_format": {"type": "text"}})
    assert r.status == 200, r.text
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "developer", "content": "Be brief."},
                                                              {"role": "user", "content": "hi"}],
                                       max_tokens=2, extra_body={"frobnicate": True, "metadata": {"a": "b"}})
    assert r.choices[0].message.role == "assistant"


def test_unknown_route_404(server):
    for method, path in (("GET", "/nope"), ("POST", "/v1/nope"), ("GET", "/v1/completions"), ("DELETE", "/v1/models")):
        assert_api_error(send(server.url, method, path), 404, path)


# ---- raw HTTP ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [C, CH])
def test_sse_framing(server, path, eos_ids):
    body = {"model": MODEL, "max_tokens": 8, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            "logit_bias": no_eos(eos_ids)}
    body.update({"prompt": "while True:"} if path == C else {"messages": MSG})
    r = post(server.url, path, body)
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers.get("transfer-encoding") == "chunked"
    chunks = sse_payloads(r.text)
    kind = "chat.completion.chunk" if path == CH else "text_completion"
    assert all(c["object"] == kind and c["model"] == MODEL for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]][-1] == "length"
    assert chunks[-1]["usage"]["total_tokens"] == chunks[-1]["usage"]["prompt_tokens"] + 8


def test_get_pages(server):
    r = get(server.url, "/")
    assert r.status == 200 and r.headers["content-type"].startswith("text/html")
    assert "<html" in r.text.lower() and "cider" in r.text.lower()
    h = get(server.url, "/health")
    assert h.status == 200 and h.json()["status"] == "ok"


def test_disconnect_cancels(server, eos_ids):
    url = server.url
    wait_until(lambda: idle(url), "an idle server")
    before = metrics(url)
    body = json.dumps({"model": MODEL, "prompt": "def main():", "max_tokens": 1000, "stream": True, "temperature": 0.8,
                       "logit_bias": no_eos(eos_ids)}).encode()
    s = socket.create_connection((server.host, server.port), timeout=TIMEOUT)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    got = b""
    while b"data: " not in got:  # the headers and the first event
        piece = s.recv(65536)
        assert piece, got
        got += piece
    assert got.startswith(b"HTTP/1.1 200")
    s.close()

    def cancelled():
        m = metrics(url)
        return m if (m['cider_requests_total{outcome="cancelled"}'] > before['cider_requests_total{outcome="cancelled"}']
                     and m["cider_requests_running"] == 0) else None

    after = wait_until(cancelled, "the dropped stream to be cancelled")
    assert after['cider_requests_total{outcome="cancelled"}'] == before['cider_requests_total{outcome="cancelled"}'] + 1
    assert after['cider_requests_total{outcome="finished"}'] == before['cider_requests_total{outcome="finished"}']
    assert after["cider_generation_tokens_total"] - before["cider_generation_tokens_total"] < 1000
    assert complete(url, prompt="ok", max_tokens=2)["usage"]["completion_tokens"] >= 1


def test_nonstreaming_disconnect_cancels(server, eos_ids):
    """A non-streaming client that goes away before its reply is noticed while the sequence runs (the server polls
    the connection): the sequence is cancelled and its KV released long before max_tokens."""
    url = server.url
    wait_until(lambda: idle(url), "an idle server")
    before = metrics(url)
    body = json.dumps({"model": MODEL, "prompt": "def main():", "max_tokens": 1000, "temperature": 0.8,
                       "logit_bias": no_eos(eos_ids)}).encode()
    s = socket.create_connection((server.host, server.port), timeout=TIMEOUT)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    wait_until(lambda: metrics(url)["cider_requests_running"] == 1, "the request to run")
    s.close()

    def cancelled():
        m = metrics(url)
        return m if (m['cider_requests_total{outcome="cancelled"}'] > before['cider_requests_total{outcome="cancelled"}']
                     and m["cider_requests_running"] == 0) else None

    after = wait_until(cancelled, "the abandoned request to be cancelled")
    assert after['cider_requests_total{outcome="cancelled"}'] == before['cider_requests_total{outcome="cancelled"}'] + 1
    assert after['cider_requests_total{outcome="finished"}'] == before['cider_requests_total{outcome="finished"}']
    assert after["cider_generation_tokens_total"] - before["cider_generation_tokens_total"] < 1000
    # A client that stays gets its answer as before.
    assert complete(url, prompt="ok", max_tokens=2)["usage"]["completion_tokens"] >= 1


def test_metrics(server, eos_ids):
    url = server.url
    wait_until(lambda: idle(url), "an idle server")
    before = metrics(url)
    r1 = complete(url, prompt="import os", max_tokens=5, temperature=0, logit_bias=no_eos(eos_ids))
    s = Stream(url, C, dict(prompt="import sys", max_tokens=7, temperature=0, logit_bias=no_eos(eos_ids),
                            stream_options={"include_usage": True}))
    u2 = s.rest()[-1]["usage"]
    s.close()
    wait_until(lambda: idle(url), "an idle server")  # the counters are updated when a request is released
    after = metrics(url)
    d = {k: after[k] - before.get(k, 0) for k in after}
    assert d['cider_requests_total{outcome="finished"}'] == 2
    assert d["cider_generation_tokens_total"] == 12
    assert d["cider_prompt_tokens_total"] == r1["usage"]["prompt_tokens"] + u2["prompt_tokens"]
    assert d["cider_prompt_tokens_cached_total"] == (r1["usage"]["prompt_tokens_details"]["cached_tokens"]
                                                     + u2["prompt_tokens_details"]["cached_tokens"])
    assert d["cider_time_to_first_token_seconds_count"] == 2
    assert d["cider_inter_token_latency_seconds_count"] == 10
    assert d["cider_steps_total"] > 0
    # Every step that ran a forward is timed: its forward and its host part (the 12 draws took at least 7 steps).
    for h in ("cider_step_forward_seconds", "cider_step_host_seconds"):
        assert 7 <= d[h + "_count"] <= d["cider_steps_total"], (h, d[h + "_count"], d["cider_steps_total"])
        assert d[h + "_sum"] > 0
    for k in ("cider_requests_running", "cider_requests_waiting", "cider_kv_bytes_in_use", "cider_kv_memory_bytes",
              "cider_prompt_tokens_cached_total", 'cider_requests_total{outcome="refused"}'):
        assert k in after, k
    assert after["cider_requests_running"] == 0 and after["cider_kv_memory_bytes"] > 0
    for h in ("cider_time_to_first_token_seconds", "cider_inter_token_latency_seconds", "cider_step_forward_seconds",
              "cider_step_host_seconds"):
        buckets = [(k, v) for k, v in after.items() if k.startswith(h + "_bucket{")]
        assert len(buckets) >= 2 and buckets[-1][0] == h + '_bucket{le="+Inf"}', buckets
        counts = [v for _, v in buckets]
        assert counts == sorted(counts), buckets  # cumulative
        assert buckets[-1][1] == after[h + "_count"] and after[h + "_sum"] > 0
    text = get(url, "/metrics").text
    assert "# TYPE cider_requests_total counter" in text
    assert "# TYPE cider_time_to_first_token_seconds histogram" in text


# ---- short-lived servers -------------------------------------------------------------------------------------------
def test_api_key():
    s = Server("--api-key", "sekret", "--model-name", "my-model")
    try:
        url = s.url
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
            assert_api_error(get(url, "/v1/models", headers=headers), 401, "API key")
            assert_api_error(post(url, C, {"prompt": "a", "max_tokens": 1}, headers=headers), 401)
        good = {"Authorization": "Bearer sekret"}
        r = get(url, "/v1/models", headers=good)
        assert r.status == 200 and r.json()["data"][0]["id"] == "my-model"
        assert post(url, C, {"prompt": "a", "max_tokens": 1}, headers=good).status == 200
        for path in ("/health", "/metrics", "/"):
            assert get(url, path).status == 200, path
        with openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0, timeout=TIMEOUT) as c:
            with pytest.raises(openai.AuthenticationError):
                c.models.list()
        with openai.OpenAI(base_url=url + "/v1", api_key="sekret", max_retries=0, timeout=TIMEOUT) as c:
            r = c.chat.completions.create(model="my-model", messages=MSG, max_tokens=2)
            assert r.model == "my-model" and r.choices[0].message.role == "assistant"
    finally:
        stop_cleanly(s)


def test_api_key_from_environment():
    s = Server(env={"CIDER_API_KEY": "from-env"})
    try:
        assert_api_error(get(s.url, "/v1/models"), 401)
        assert get(s.url, "/v1/models", headers={"Authorization": "Bearer from-env"}).status == 200
    finally:
        stop_cleanly(s)


def hold_then(url, eos_ids, probe, attempts=5):
    """Runs probe() while a long streaming request runs (its first event read), until probe returns something other
    than None (the long request can finish first on a fast machine: then it is tried again). Returns (probe's result,
    the long stream's events after the first)."""
    for _ in range(attempts):
        s = Stream(url, C, dict(prompt="def hold():", max_tokens=1000, temperature=0.8, seed=1,
                                logit_bias=no_eos(eos_ids)))
        try:
            assert s.event() is not None
            result = probe()
            rest = s.rest()
        finally:
            s.close()
        if result is not None:
            return result, rest
    pytest.fail(f"the probe never ran while the long request did ({attempts} attempts)")


def test_queue_full_429(eos_ids):
    s = Server("--max-batch", "1", "--max-waiting", "0")
    try:
        url = s.url

        def probe():
            r = post(url, C, {"prompt": "x", "max_tokens": 2})
            if r.status == 200:
                return None  # the long request had already finished
            return r

        r, rest = hold_then(url, eos_ids, probe)
        err = assert_api_error(r, 429, type_="rate_limit_error")
        assert "capacity" in err["message"]
        assert int(r.headers["retry-after"]) >= 1
        assert rest[-1]["choices"][0]["finish_reason"] == "length"  # the running request was not disturbed

        def probe_client():
            with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=TIMEOUT) as c:
                try:
                    c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2)
                    return None
                except openai.RateLimitError as e:
                    return e

        e, _ = hold_then(url, eos_ids, probe_client)
        assert e.status_code == 429 and e.response.headers.get("retry-after")
        # Capacity comes back once the long request is done.
        wait_until(lambda: idle(url), "an idle server")
        assert post(url, C, {"prompt": "x", "max_tokens": 2}).status == 200
        assert metrics(url)['cider_requests_total{outcome="refused"}'] >= 2
    finally:
        stop_cleanly(s)


def test_body_limit_413():
    s = Server("--max-body", "2048")
    try:
        big = json.dumps({"model": MODEL, "prompt": "x" * 10000, "max_tokens": 1})
        assert len(big) > 10000
        assert_api_error(post(s.url, C, big, headers={"Content-Type": "application/json"}), 413, "max-body")
        small = '{"prompt": "hi", "max_tokens": 1' + " " * 1900 + "}"  # JSON allows the whitespace
        assert 1900 < len(small) < 2048
        assert post(s.url, C, small, headers={"Content-Type": "application/json"}).status == 200
        with openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=TIMEOUT) as c:
            with pytest.raises(openai.APIStatusError) as e:
                c.completions.create(model=MODEL, prompt="z" * 10000, max_tokens=1)
            assert e.value.status_code == 413
        assert get(s.url, "/health").status == 200
    finally:
        stop_cleanly(s)


def test_body_limit_ignores_content_type(server):
    """`curl -d` sends Content-Type: application/x-www-form-urlencoded; a 9 kB JSON body is far below the default
    --max-body (1 MiB) whatever its content type."""
    body = '{"prompt": "hello", "max_tokens": 2' + " " * 9000 + "}"
    assert post(server.url, C, body, headers={"Content-Type": "application/json"}).status == 200
    r = post(server.url, C, body, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status == 200, (r.status, r.text)


def test_port_in_use(server):
    """A second server on a port that is already listening must fail to start, not share the port (SO_REUSEPORT would
    let the kernel split the connections between the two)."""
    other = subprocess.Popen([str(CIDER_BIN), "serve", "--port", str(server.port)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        err = ""
        for line in other.stderr:  # until it exits (EOF) or says it listens
            err += line
            if LISTENING.search(line):
                break
        started = LISTENING.search(err) is not None  # EOF without the line: it exited (its status is checked below)
    finally:
        if other.poll() is None:
            other.send_signal(signal.SIGTERM)
        other.wait(TIMEOUT)
        other.stderr.close()
    assert not started, f"a second cider serve listens on port {server.port} too:\n{err}"
    assert other.returncode != 0 and "could not bind" in err, err


def kill_if_running(s: Server):
    if s.proc.poll() is None:
        s.stop(signal.SIGKILL)


def test_graceful_shutdown(eos_ids):
    # A drain long enough for the 1000 tokens on a loaded machine (the default 30 s expired once in CI on a loaded
    # 2-core VM, ending the stream with an error event); the expiry has its own test.
    s = Server("--drain-seconds", "600")
    try:
        graceful_shutdown(s, eos_ids)
    finally:
        kill_if_running(s)


def graceful_shutdown(s, eos_ids):
    st = Stream(s.url, C, dict(prompt="def serve():", max_tokens=1000, temperature=0.8, seed=2,
                               logit_bias=no_eos(eos_ids), stream_options={"include_usage": True}))
    try:
        assert st.event() is not None
        s.proc.send_signal(signal.SIGTERM)
        s.wait_log("signal 15: finishing running requests")
        # While draining, new requests are refused (503); once stopped, not accepted at all.
        try:
            r = post(s.url, C, {"prompt": "x", "max_tokens": 2}, timeout=10)
            assert_api_error(r, 503, "shutting down", type_="server_error")
            assert r.headers.get("retry-after")
        except (ConnectionError, http.client.HTTPException, socket.timeout):
            pass  # too late: the long request had already finished and the server stopped listening
        chunks = st.rest()  # ends with [DONE]
    finally:
        st.close()
    assert chunks[-1]["usage"]["completion_tokens"] == 1000
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all("error" not in c for c in chunks)
    rc = s.stop()
    assert rc == 0, s.log()
    assert "signal 15" in s.log() and "cider serve: stopped\n" in s.log(), s.log()


def test_drain_timeout_cancels(eos_ids):
    """--drain-seconds 0: SIGTERM does not wait for the running request; the process exits 0 at once, and the stream
    is ended properly (an error event, then [DONE]: the client can tell a shutdown from a crash), not cut off."""
    s = Server("--drain-seconds", "0")
    try:
        drain_timeout(s, eos_ids)
    finally:
        kill_if_running(s)


def drain_timeout(s, eos_ids):
    st = Stream(s.url, C, dict(prompt="def loop():", max_tokens=1000, temperature=0.8, seed=4,
                               logit_bias=no_eos(eos_ids), stream_options={"include_usage": True}))
    try:
        assert st.event() is not None
        t0 = time.monotonic()
        rc = s.stop()
        assert rc == 0, s.log()
        assert time.monotonic() - t0 < 10
        assert "requests still running were cancelled" in s.log(), s.log()
        events = []
        try:
            while (p := st.event()) is not None:
                events.append(p)
        except (http.client.HTTPException, ConnectionError) as e:
            events.append(f"<{type(e).__name__}>")
    finally:
        st.close()
    assert not any('"finish_reason":"length"' in e for e in events)  # it did not run to the end
    assert events[-2:] and events[-1] == "[DONE]", f"the stream was cut off after {len(events)} events: {events[-2:]}"
    assert json.loads(events[-2])["error"]["type"] == "server_error", events[-2]


# ---- the prefix cache on disk (--prompt-cache DIR) ----------------------------------------------------------------
def cache_files(d: Path):
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".cpc"))


def pooled_to_disk(s: Server, d: Path, entries):
    """Waits until the server is idle with `entries` sessions in its prefix cache and as many files in DIR (a session
    joins the pool at the end of the engine's step; its file is written by another thread)."""
    wait_until(lambda: idle(s.url), "an idle server")
    wait_until(lambda: metrics(s.url)["cider_prefix_cache_entries"] == entries, f"{entries} pooled sessions")
    wait_until(lambda: len(cache_files(d)) == entries, f"{entries} files in {d}")


def warnings_of(s: Server):
    return [line for line in s.log().splitlines() if "warning" in line]


GREEDY = dict(max_tokens=48, temperature=0, logprobs=2)


@pytest.fixture(scope="session")
def fresh_code(nocache_server):
    """The greedy reply to CODE from a server without a prefix cache."""
    r = complete(nocache_server.url, prompt=CODE, **GREEDY)
    check_usage(r["usage"], cached=0)
    return r


def test_prompt_cache_survives_restart(tmp_path, fresh_code):
    d = tmp_path / "prompts"
    a = Server("--prompt-cache", str(d))
    try:
        assert "prompt cache " + str(d) + ": 0 entries loaded" in a.log()
        miss = complete(a.url, prompt=CODE, **GREEDY)
        check_usage(miss["usage"], cached=0)
        pooled_to_disk(a, d, 1)
    finally:
        stop_cleanly(a)
    assert len(cache_files(d)) == 1
    b = Server("--prompt-cache", str(d))
    try:
        assert "1 entries loaded" in b.log(), b.log()
        assert metrics(b.url)["cider_prefix_cache_entries"] == 1
        hit = complete(b.url, prompt=CODE, **GREEDY)
        n = hit["usage"]["prompt_tokens"]
        check_usage(hit["usage"], cached=(n - 1) // BLOCK * BLOCK)
        assert hit["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert hit["choices"][0]["text"] == fresh_code["choices"][0]["text"], divergence(fresh_code, hit)
        assert hit["choices"][0]["text"] == miss["choices"][0]["text"]
        assert not warnings_of(b), b.log()
    finally:
        stop_cleanly(b)


def test_prompt_cache_files_bounded(tmp_path):
    """At most --prefix-cache files: a session's file goes when it leaves the pool; a restart with a smaller bound
    keeps the newest."""
    d = tmp_path / "prompts"
    s = Server("--prompt-cache", str(d), "--prefix-cache", "2")
    try:
        for i in range(5):
            complete(s.url, prompt=f"# variant {i}\n" + CODE, max_tokens=4, temperature=0)
            assert len(cache_files(d)) <= 2
        pooled_to_disk(s, d, 2)
    finally:
        stop_cleanly(s)
    assert len(cache_files(d)) == 2
    s = Server("--prompt-cache", str(d), "--prefix-cache", "1")
    try:
        assert "1 entries loaded" in s.log(), s.log()
        assert len(cache_files(d)) == 1
        r = complete(s.url, prompt="# variant 4\n" + CODE, max_tokens=4, temperature=0)  # the newest
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    finally:
        stop_cleanly(s)


def test_prompt_cache_corrupt_files_ignored(tmp_path, fresh_code):
    """A truncated file, one with a flipped byte and one with a wrong magic: one warning each naming the file and
    its reason; the server serves normally and takes nothing from them."""
    d = tmp_path / "prompts"
    s = Server("--prompt-cache", str(d))
    try:
        complete(s.url, prompt=CODE, **GREEDY)
        pooled_to_disk(s, d, 1)
    finally:
        stop_cleanly(s)
    (good,) = cache_files(d)
    data = (d / good).read_bytes()
    (d / good).unlink()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    magic = bytearray(data)
    magic[0] ^= 0x01
    bad = {"0000000000000001.cpc": (data[:len(data) // 2], "truncated"),
           "0000000000000002.cpc": (bytes(flipped), "checksum"),
           "0000000000000003.cpc": (bytes(magic), "magic")}
    for name, (content, _) in bad.items():
        (d / name).write_bytes(content)
    s = Server("--prompt-cache", str(d))
    try:
        assert "0 entries loaded" in s.log(), s.log()
        warned = warnings_of(s)
        assert len(warned) == 3, s.log()
        for name, (_, reason) in bad.items():
            assert any(name in w and reason in w for w in warned), (name, reason, warned)
        assert metrics(s.url)["cider_prefix_cache_entries"] == 0
        r = complete(s.url, prompt=CODE, **GREEDY)
        check_usage(r["usage"], cached=0)
        assert r["choices"][0]["text"] == fresh_code["choices"][0]["text"]
    finally:
        stop_cleanly(s)


def test_prompt_cache_other_kv_format_ignored(tmp_path):
    """A file written under another KV cache format (its identity differs) is not read: one warning, nothing cached
    from it, and it stays for the server it belongs to."""
    d = tmp_path / "prompts"
    s = Server("--prompt-cache", str(d), "--kv", "k8v4")
    try:
        complete(s.url, prompt=CODE, max_tokens=8, temperature=0)
        pooled_to_disk(s, d, 1)
    finally:
        stop_cleanly(s)
    (theirs,) = cache_files(d)
    s = Server("--prompt-cache", str(d))
    try:
        warned = warnings_of(s)
        assert len(warned) == 1 and theirs in warned[0] and "another model" in warned[0], s.log()
        r = complete(s.url, prompt=CODE, max_tokens=8, temperature=0)
        check_usage(r["usage"], cached=0)
        wait_until(lambda: len(cache_files(d)) == 2, "this server's own file beside the other's")
        assert theirs in cache_files(d)
    finally:
        stop_cleanly(s)


def test_prompt_cache_needs_a_prefix_cache_and_one_device(tmp_path):
    for args, words in ((["--prefix-cache", "0"], "--prefix-cache > 0"), (["--device", "cuda", "--tp", "2"], "--tp 2")):
        r = subprocess.run([str(CIDER_BIN), "serve", "--port", "0", "--prompt-cache", str(tmp_path / "p"), *args],
                           capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode != 0 and "--prompt-cache" in r.stderr and words in r.stderr, r.stderr
        assert not (tmp_path / "p").exists()


# ---- load (last: it leaves many sessions in the prefix cache) ------------------------------------------------------
def test_load_streaming_chat(server):
    url = server.url
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=TIMEOUT)

    def one(i):
        stream = c.chat.completions.create(
            model=MODEL, messages=[{"role": "system", "content": "You are a terse assistant."},
                                   {"role": "user", "content": f"Write function number {i} in Python."}],
            max_tokens=32, temperature=0.8, seed=i, stream=True, stream_options={"include_usage": True})
        role, text, finish, usage = None, "", None, None
        with stream:
            for ch in stream:
                if ch.usage is not None:
                    usage = ch.usage
                for choice in ch.choices:
                    role = role or choice.delta.role
                    text += choice.delta.content or ""
                    finish = choice.finish_reason or finish
        assert role == "assistant" and finish in ("length", "stop"), (role, finish)
        u = check_usage(usage)
        assert 1 <= u["completion_tokens"] <= 32 and (finish == "stop" or u["completion_tokens"] == 32), (u, finish)
        return u["completion_tokens"]

    try:
        with cf.ThreadPoolExecutor(32) as ex:  # warm-up round
            assert all(ex.map(one, range(32)))
        wait_until(lambda: idle(url), "an idle server after the warm-up", timeout=TIMEOUT)
        time.sleep(1.0)
        rss_warm = server.rss_bytes()
        before = metrics(url)

        deadline = time.monotonic() + LOAD_SECONDS
        errors, done = [], []

        def worker(w):
            i = 1000 * (w + 1)
            while time.monotonic() < deadline:
                try:
                    done.append(one(i))
                except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                    errors.append(f"{type(e).__name__}: {e}")
                i += 1

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(LOAD_SECONDS + 2 * TIMEOUT)
        assert not any(t.is_alive() for t in threads), "load workers hung"
        assert not errors, f"{len(errors)} errors of {len(errors) + len(done)} requests; first: {errors[:3]}"
        assert len(done) >= 64, len(done)

        wait_until(lambda: idle(url), "an idle server after the load", timeout=TIMEOUT)
        time.sleep(1.0)
        rss_after = server.rss_bytes()
        after = metrics(url)
        assert after['cider_requests_total{outcome="finished"}'] - before['cider_requests_total{outcome="finished"}'] == len(done)
        assert after["cider_generation_tokens_total"] - before["cider_generation_tokens_total"] == sum(done)
        for k in ('cider_requests_total{outcome="failed"}', 'cider_requests_total{outcome="refused"}',
                  'cider_requests_total{outcome="cancelled"}'):
            assert after[k] == before[k], k
        assert after["cider_requests_running"] == 0
        assert get(url, "/health").json()["status"] == "ok"
        assert complete(url, prompt="still alive?", max_tokens=3)["usage"]["completion_tokens"] >= 1
        mib = 1 << 20
        assert rss_after - rss_warm <= 64 * mib, (
            f"VmRSS after warm-up {rss_warm / mib:.1f} MiB, after {len(done)} requests in {LOAD_SECONDS:.0f} s "
            f"{rss_after / mib:.1f} MiB (+{(rss_after - rss_warm) / mib:.1f} MiB; at most 64 MiB allowed)")
        print(f"\nload: {len(done)} streaming chat requests in {LOAD_SECONDS:.0f} s; VmRSS after warm-up "
              f"{rss_warm / mib:.1f} MiB, after the load {rss_after / mib:.1f} MiB")
    finally:
        c.close()


# ---- tools ---------------------------------------------------------------------------------------------------------
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="session")
def tools_server():
    """cider-tiny with Qwen2.5's chat template (a Hermes <tool_call> template) in place of its built-in format."""
    s = Server("--chat-template", str(ROOT / "tests/data/chat_templates/templates/qwen2.5-instruct.jinja"))
    yield s
    stop_cleanly(s)


def test_tools_through_the_openai_client(tools_server):
    """The official client sends tools and a tool result; the template renders them (more prompt tokens), the reply
    comes back as a chat completion (cider-tiny writes no calls: the parsing of calls is tested in
    tests/test_tool_calls.cpp), streaming too."""
    c = openai.OpenAI(base_url=tools_server.url + "/v1", api_key="x", max_retries=0, timeout=TIMEOUT)
    try:
        msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
        plain = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0)
        with_tools = c.chat.completions.create(model=MODEL, messages=msgs, tools=[WEATHER_TOOL], max_tokens=4,
                                               temperature=0)
        assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 20
        assert with_tools.choices[0].finish_reason in ("stop", "length", "tool_calls")
        history = msgs + [
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
        after = c.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER_TOOL], max_tokens=4,
                                          temperature=0)
        assert after.usage.prompt_tokens > with_tools.usage.prompt_tokens
        chunks = list(c.chat.completions.create(model=MODEL, messages=msgs, tools=[WEATHER_TOOL], max_tokens=4,
                                                temperature=0, stream=True))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")
    finally:
        c.close()


TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {"tz": {"enum": ["CET", "UTC", "JST"]},
                                                    "precise": {"type": "boolean"}},
                   "required": ["tz"], "additionalProperties": False}}}


def schema_valid(v, s):
    """The JSON Schema keywords constrained decoding takes (type, properties, required, additionalProperties, items,
    enum, const), checked here independently of the server."""
    if "const" in s and v != s["const"]:
        return False
    if "enum" in s and v not in s["enum"]:
        return False
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not any((t in kinds and isinstance(v, kinds[t])) or (t == "number" and number) or
                   (t == "integer" and number and float(v).is_integer()) for t in types):
            return False
    if isinstance(v, dict):
        props = s.get("properties", {})
        if any(k not in props and s.get("additionalProperties", True) is False for k in v):
            return False
        if not all(schema_valid(x, props[k]) for k, x in v.items() if k in props):
            return False
        if not all(k in v for k in s.get("required", [])):
            return False
    if isinstance(v, list) and "items" in s:
        return all(schema_valid(x, s["items"]) for x in v)
    return True


def test_tool_choice_required_and_named_through_the_openai_client(tools_server):
    """tool_choice "required" and a named function (constrained decoding, Qwen2.5's Hermes template): the official
    client gets message.tool_calls with one call of the named tool (or one of the tools), its arguments a JSON object
    valid against that tool's parameters, finish_reason "tool_calls"; streamed, the same call in one tool_calls delta;
    cut by max_tokens, finish_reason "length" and no calls; an unknown name or a schema keyword the recognizer cannot
    enforce is a 400 naming it."""
    # cider-tiny pads JSON with whitespace runs that eat max_tokens: its whitespace-only tokens (byte-level BPE:
    # Ġ Ċ ĉ č) get a logit_bias of -100, so that replies reach the values; the constraint still decides every byte.
    vocab = json.loads((ROOT / "models/cider-tiny/tokenizer.json").read_text())["model"]["vocab"]
    bias = {str(i): -100 for t, i in vocab.items() if t and set(t) <= set("ĠĊĉč")}
    assert bias
    tools = [WEATHER_TOOL, TIME_TOOL]
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    c = openai.OpenAI(base_url=tools_server.url + "/v1", api_key="x", max_retries=0, timeout=TIMEOUT)
    try:
        calls = 0
        for choice in ({"type": "function", "function": {"name": "get_weather"}},
                       {"type": "function", "function": {"name": "get_time"}}, "required"):
            for seed in (1, 2, 3):
                kw = dict(model=MODEL, messages=msgs, tools=tools, tool_choice=choice, max_tokens=160,
                          temperature=0.8, seed=seed, logit_bias=bias)
                r = c.chat.completions.create(**kw)
                ch = r.choices[0]
                if ch.finish_reason == "length":  # cut before the object closed: text, no calls
                    assert not ch.message.tool_calls and ch.message.content.startswith("<tool_call>")
                    continue
                assert ch.finish_reason == "tool_calls", (choice, seed, ch)
                assert ch.message.content is None
                assert len(ch.message.tool_calls) == 1
                call = ch.message.tool_calls[0]
                assert call.type == "function" and call.id
                if isinstance(choice, dict):
                    assert call.function.name == choice["function"]["name"]
                assert call.function.name in params
                args = json.loads(call.function.arguments)
                assert isinstance(args, dict) and schema_valid(args, params[call.function.name]), (call, seed)
                calls += 1
                # Streamed (same seed, same tokens): no content, the same call in one delta, then the finish.
                chunks = list(c.chat.completions.create(**kw, stream=True))
                deltas = [k.choices[0].delta.tool_calls for k in chunks if k.choices and k.choices[0].delta.tool_calls]
                assert len(deltas) == 1 and len(deltas[0]) == 1
                assert deltas[0][0].function.name == call.function.name
                assert json.loads(deltas[0][0].function.arguments) == args
                assert "".join(k.choices[0].delta.content or "" for k in chunks if k.choices) == ""
                assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert calls >= 6, calls
        cut = c.chat.completions.create(model=MODEL, messages=msgs, tools=tools, tool_choice="required", max_tokens=2,
                                        seed=1)
        assert cut.choices[0].finish_reason == "length" and not cut.choices[0].message.tool_calls
        assert cut.choices[0].message.content.startswith("<tool_call>")
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=MODEL, messages=msgs, tools=tools, max_tokens=4,
                                      tool_choice={"type": "function", "function": {"name": "get_date"}})
        assert "get_date" in str(e.value) and "not among 'tools'" in str(e.value)
        pattern_tool = {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}}}}
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=MODEL, messages=msgs, tools=[pattern_tool], tool_choice="required",
                                      max_tokens=4)
        assert "pattern" in str(e.value) and "tools[0].function.parameters" in str(e.value)
    finally:
        c.close()


def test_tools_refused_without_a_template_that_takes_them(client):
    """cider-tiny's built-in chat format has no tools: refused, naming the rule (not answered as if there were none)."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       tools=[WEATHER_TOOL], max_tokens=4)
    assert "chat template" in str(e.value)
