"""The chat page (GET /) in a real browser: Debian's headless Chromium, driven over the DevTools protocol on a pipe
(--remote-debugging-pipe: NUL-terminated JSON on fds 3 and 4, no websocket client needed), against a `cider serve`
with the embedded cider-tiny.

The page is opened at /?q=PROMPT&temperature=0&max_tokens=N, which sends PROMPT as the first message with greedy
settings. The test polls the DOM until the reply is marked done (or an error shows), then checks that
  * the user bubble shows the prompt as text (markup and non-ASCII characters escaped, not interpreted);
  * the assistant bubble's text equals the reply the API gives to the same request (non-streaming, greedy), and it
    grew while the reply streamed (a MutationObserver, installed before the page's script runs, records the texts);
  * a screenshot shows it: the reply bubble's rectangle, blank on the page before the message was sent (same layout,
    no ?q), holds text-coloured pixels afterwards (the PNG is decoded here with zlib + struct).
The screenshots are written to $CIDER_CHAT_PAGE_SHOTS (default build/chat-page) for a look.

Chromium is `chromium` on PATH or $CIDER_CHROMIUM (scripts/setup.sh installs Debian's). Without it the test fails,
unless CIDER_SKIP_BROWSER=1, which skips it with a message. Run: bash scripts/test_serve.sh -k chat_page.
"""
import base64
import fcntl
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from pathlib import Path
from urllib.parse import urlencode

import pytest

from test_serve import ROOT, Server, chat, post, stop_cleanly, wait_until

PROMPT = 'Say <b>hi</b> & "bye" — é ✓'
MAX_TOKENS = 24
WIDTH, HEIGHT = 1000, 900
REPLY_TIMEOUT = 40.0  # seconds from navigation to a finished reply
SHOTS = Path(os.environ.get("CIDER_CHAT_PAGE_SHOTS", ROOT / "build" / "chat-page"))


def chromium_path():
    p = os.environ.get("CIDER_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if p:
        return p
    if os.environ.get("CIDER_SKIP_BROWSER") == "1":
        pytest.skip("CIDER_SKIP_BROWSER=1 and no chromium: the chat page's browser test did not run")
    pytest.fail("no chromium on PATH (nor $CIDER_CHROMIUM): apt-get install chromium (scripts/setup.sh does), "
                "or set CIDER_SKIP_BROWSER=1 to skip the chat page's browser test")


# ---- the DevTools protocol over a pipe -----------------------------------------------------------------------------
class Browser:
    """One headless Chromium; call() sends a DevTools command and returns its result (events are dropped)."""

    def __init__(self, exe):
        self.profile = tempfile.TemporaryDirectory(prefix="cider-chromium-")
        to_child_r, self._w = os.pipe()  # the browser reads commands on its fd 3
        self._r, from_child_w = os.pipe()  # and writes replies on its fd 4
        # The child's ends, moved above 4 (close-on-exec) so that the dup2s below cannot overwrite one with the other;
        # dup2 clears close-on-exec on fds 3 and 4, and every other descriptor of ours is close-on-exec (PEP 446).
        hi_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
        hi_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def fds():
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        self.stderr = tempfile.TemporaryFile()
        args = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars",
                "--remote-debugging-pipe", f"--user-data-dir={self.profile.name}", f"--window-size={WIDTH},{HEIGHT}",
                "about:blank"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.stderr, stderr=self.stderr,
                                     preexec_fn=fds, close_fds=False)
        os.close(hi_r)
        os.close(hi_w)
        self._buf = b""
        self._id = 0

    def log(self):
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-4000:]

    def call(self, method, params=None, session=None, timeout=30.0):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                m = json.loads(raw)
                if m.get("id") == self._id:
                    if "error" in m:
                        raise AssertionError(f"DevTools {method}: {m['error']}")
                    return m["result"]
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise AssertionError(f"DevTools {method}: no answer (chromium exit {self.proc.poll()}):\n{self.log()}")
            if select.select([self._r], [], [], min(left, 0.5))[0]:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise AssertionError(f"chromium closed the DevTools pipe:\n{self.log()}")
                self._buf += chunk

    def close(self):
        try:
            self.call("Browser.close", timeout=5)
        except AssertionError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)
        self.profile.cleanup()


class Tab:
    def __init__(self, browser):
        self.b = browser
        target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})

    def call(self, method, params=None, timeout=30.0):
        return self.b.call(method, params, session=self.session, timeout=timeout)

    def eval(self, expression):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in r:
            raise AssertionError(f"page script failed: {r['exceptionDetails']}")
        return r["result"].get("value")

    def open(self, url):
        r = self.call("Page.navigate", {"url": url})
        assert not r.get("errorText"), (url, r)
        self.wait(lambda: self.eval("document.readyState") == "complete", "the page to load", 15)

    def wait(self, predicate, what, timeout):
        return wait_until(predicate, what, timeout)

    def on_new_document(self, source):
        self.call("Page.enable")
        self.call("Page.addScriptToEvaluateOnNewDocument", {"source": source})

    def screenshot(self):
        return base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"])


# ---- PNG -----------------------------------------------------------------------------------------------------------
def decode_png(data):
    """(width, height, rows of RGB tuples) of an 8-bit, non-interlaced PNG (grey, RGB, grey+alpha or RGBA)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    w, h, depth, ctype, _, _, interlace = hdr
    assert depth == 8 and interlace == 0 and ctype in (0, 2, 4, 6), hdr
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(h):
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            else:
                assert f == 0, f"PNG filter {f}"
        prev = line
        if ctype in (0, 4):
            rows.append([(line[x], line[x], line[x]) for x in range(0, stride, bpp)])
        else:
            rows.append([tuple(line[x:x + 3]) for x in range(0, stride, bpp)])
    return w, h, rows


def ink(rows, rect):
    """How many pixels of rect (x, y, w, h in CSS pixels = device pixels here) are far from white."""
    x0, y0, w, h = (int(round(v)) for v in rect)
    n = 0
    for row in rows[max(y0, 0):y0 + h]:
        for r, g, b in row[max(x0, 0):x0 + w]:
            n += (765 - r - g - b) > 150
    return n


# ---- the test ------------------------------------------------------------------------------------------------------
# Runs before the page's own script: records every text the assistant bubble shows before it is marked done.
OBSERVER = """window.__replyTexts = [];
new MutationObserver(() => {
  const r = document.querySelector('#log .msg.assistant');
  if (r && !r.classList.contains('done') && r.textContent !== window.__replyTexts.at(-1))
    window.__replyTexts.push(r.textContent);
}).observe(document, {subtree: true, childList: true, characterData: true, attributes: true});"""

STATE = """(() => {
  const log = document.getElementById('log'), msgs = [...log.querySelectorAll('.msg')];
  const rect = e => { const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; };
  return {msgs: msgs.map(e => ({cls: e.className, text: e.textContent, rect: rect(e)})),
          stats: document.getElementById('stats').textContent, log: rect(log), texts: window.__replyTexts};
})()"""


@pytest.fixture(scope="module")
def page_server():
    s = Server()
    yield s
    stop_cleanly(s)


def test_chat_page_shows_streamed_reply(page_server):
    exe = chromium_path()
    url = page_server.url
    expected = chat(url, messages=[{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS, temperature=0)
    expected = expected["choices"][0]["message"]["content"]
    assert expected.strip(), f"the API's greedy reply is blank ({expected!r}): pick another prompt"
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser = Browser(exe)
    try:
        tab = Tab(browser)
        tab.on_new_document(OBSERVER)
        # Before: the page as it is before a message is sent (the model line filled in by /v1/models).
        tab.open(url + "/")
        tab.wait(lambda: tab.eval("document.getElementById('model').textContent"), "the model line", 10)
        before = tab.screenshot()
        (SHOTS / "before.png").write_bytes(before)
        # After: ?q= sends the prompt at once; wait for the reply to finish streaming (or an error).
        tab.open(url + "/?" + urlencode({"q": PROMPT, "temperature": 0, "max_tokens": MAX_TOKENS}))
        done = "document.querySelector('#log .msg.assistant.done, #log .msg.error') !== null"
        try:
            tab.wait(lambda: tab.eval(done), "the reply to finish", REPLY_TIMEOUT)
        finally:
            state = tab.eval(STATE)
            after = tab.screenshot()
            (SHOTS / "after.png").write_bytes(after)
        msgs = state["msgs"]
        assert [m["cls"] for m in msgs] == ["msg user", "msg assistant done"], msgs
        user, reply = msgs
        assert user["text"] == "> " + PROMPT, user
        assert reply["text"] == expected, (reply["text"], expected)
        assert "tokens in" in state["stats"], state["stats"]
        # Streamed: the bubble showed growing prefixes of the reply on the way (not one text set at the end).
        texts = [t for t in state["texts"] if t]
        assert all(expected.startswith(t) for t in texts), texts
        assert len(texts) >= 2, f"the reply was not shown as it streamed: {texts}"

        # The screenshot shows the reply: its rectangle has text in it, and had none before it was sent.
        x, y, w, h = reply["rect"]
        assert w > 0 and h > 0 and y + h <= HEIGHT, f"the reply bubble is not in the viewport: {reply['rect']}"
        bw, bh, brows = decode_png(before)
        aw, ah, arows = decode_png(after)
        assert (bw, bh) == (aw, ah) == (WIDTH, HEIGHT), ((bw, bh), (aw, ah))
        before_ink, after_ink = ink(brows, reply["rect"]), ink(arows, reply["rect"])
        visible = sum(not c.isspace() for c in expected)
        assert before_ink == 0, f"the reply's area was not blank before the message: {before_ink} dark pixels"
        assert after_ink >= 5 * min(visible, 20), \
            f"the screenshot does not show the reply ({after_ink} dark pixels for {visible} characters)"
        assert ink(arows, user["rect"]) > 0, "the screenshot does not show the user's message"
    finally:
        browser.close()


def test_chat_page_sends_the_api_key():
    """A server with --api-key: the page's request without a key shows the 401's message; with the key typed into the
    page's field it gets the API's reply (the key goes in the Authorization header, not the URL)."""
    exe = chromium_path()
    s = Server("--api-key", "page-secret")
    browser = None
    try:
        r = post(s.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                                 "max_tokens": MAX_TOKENS, "temperature": 0},
                 headers={"Authorization": "Bearer page-secret"})
        assert r.status == 200, (r.status, r.text)
        expected = r.json()["choices"][0]["message"]["content"]
        browser = Browser(exe)
        tab = Tab(browser)
        finished = "document.querySelector('#log .msg.assistant.done, #log .msg.error') !== null"
        tab.open(s.url + "/?" + urlencode({"q": PROMPT, "temperature": 0, "max_tokens": MAX_TOKENS}))
        tab.wait(lambda: tab.eval(finished), "the refused request's error", REPLY_TIMEOUT)
        err = tab.eval("document.querySelector('#log .msg.error').textContent")
        assert err.startswith("error: ") and "key" in err.lower(), err
        # The key typed in (a change event, as a user's typing ends in one), then the same message sent again.
        tab.eval("(() => { const k = document.getElementById('key'); k.value = 'page-secret';"
                 " k.dispatchEvent(new Event('change')); document.getElementById('reset').click();"
                 " document.getElementById('input').value = " + json.dumps(PROMPT) + ";"
                 " document.getElementById('form').requestSubmit(); })()")
        tab.wait(lambda: tab.eval(finished), "the reply", REPLY_TIMEOUT)
        got = tab.eval("[...document.querySelectorAll('#log .msg')].map(e => e.className + '|' + e.textContent)")
        assert got == ["msg user|> " + PROMPT, "msg assistant done|" + expected], got
        assert tab.eval("sessionStorage.getItem('cider-api-key')") == "page-secret"
        assert "page-secret" not in tab.eval("location.href")
    finally:
        if browser is not None:
            browser.close()
        stop_cleanly(s)
