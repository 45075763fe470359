// The chat page of `cider serve` (GET /): plain HTML and JavaScript, no framework, no external resources. It keeps the
// conversation in the page, sends it to /v1/chat/completions with stream: true and appends the streamed text.
// /?q=TEXT sends TEXT at once; &temperature=T and &max_tokens=N set the two fields first (e.g. temperature=0: greedy).
// A server started with --api-key: the key typed into the page's key field (kept for the browser tab in
// sessionStorage, never in the URL) goes with every request as "Authorization: Bearer KEY".
// Tested in headless Chromium by tests/serve/test_chat_page.py (the DOM and a screenshot show the API's reply).
#include "apps/serve.h"

namespace cider::apps {

const char* const kChatPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>cider</title>
<style>
  body { font: 15px/1.45 system-ui, sans-serif; max-width: 52rem; margin: 0 auto; padding: 1rem; color: #222; }
  h1 { font-size: 1.1rem; margin: 0 0 .6rem; }
  #log { border: 1px solid #ccc; border-radius: 6px; padding: .6rem; min-height: 18rem; overflow-y: auto; }
  .msg { white-space: pre-wrap; margin: .3rem 0; }
  .user { color: #0b4f9c; }
  .assistant { color: #222; }
  .error { color: #b00020; }
  form { display: flex; gap: .5rem; margin-top: .6rem; }
  textarea { flex: 1; font: inherit; min-height: 3rem; }
  small { color: #666; }
</style>
</head>
<body>
<h1>cider <small id="model"></small></h1>
<div id="log"></div>
<form id="form">
  <textarea id="input" placeholder="Message (Enter sends, Shift+Enter breaks the line)"></textarea>
  <div><button id="send" type="submit">Send</button><br><button id="reset" type="button">New chat</button></div>
</form>
<p><small>max tokens <input id="max" type="number" value="256" min="1" style="width:5rem">
temperature <input id="temp" type="number" value="0.7" min="0" max="2" step="0.1" style="width:4rem">
API key <input id="key" type="password" autocomplete="off" placeholder="if the server needs one" style="width:9rem">
<span id="stats"></span></small></p>
<script>
const log = document.getElementById('log'), input = document.getElementById('input');
let messages = [], busy = false;
const keyInput = document.getElementById('key');
keyInput.value = sessionStorage.getItem('cider-api-key') || '';
const authHeaders = () => keyInput.value ? {'Authorization': 'Bearer ' + keyInput.value} : {};
function loadModel() {
  fetch('/v1/models', {headers: authHeaders()}).then(r => r.json()).then(j => {
    document.getElementById('model').textContent = j.data[0].id + ' · context ' + j.data[0].max_model_len;
  }).catch(() => {});
}
keyInput.addEventListener('change', () => { sessionStorage.setItem('cider-api-key', keyInput.value); loadModel(); });
loadModel();
function add(role, text) {
  const d = document.createElement('div');
  d.className = 'msg ' + role;
  d.textContent = (role === 'user' ? '> ' : '') + text;
  log.appendChild(d);
  log.scrollTop = log.scrollHeight;
  return d;
}
async function send(text) {
  busy = true;
  document.getElementById('send').disabled = true;
  messages.push({role: 'user', content: text});
  add('user', text);
  const out = add('assistant', '');
  out.id = 'reply-' + messages.length;
  const body = {messages, stream: true, stream_options: {include_usage: true},
                max_tokens: +document.getElementById('max').value,
                temperature: +document.getElementById('temp').value};
  const t0 = performance.now();
  let reply = '', usage = null, ended = false;
  // One server-sent event: its "data:" lines joined (the field's one optional space dropped), or null.
  const eventData = ev => {
    const data = ev.split('\n').filter(l => l.startsWith('data:')).map(l => l.slice(l.startsWith('data: ') ? 6 : 5));
    return data.length ? data.join('\n') : null;
  };
  const handle = ev => {
    const data = eventData(ev);
    if (data === null) return;
    if (data === '[DONE]') { ended = true; return; }
    const j = JSON.parse(data);
    if (j.error) throw new Error(j.error.message);
    if (j.usage) usage = j.usage;
    for (const c of j.choices || [])
      if (c.delta && c.delta.content) { reply += c.delta.content; out.textContent = reply; }
  };
  try {
    const r = await fetch('/v1/chat/completions', {method: 'POST',
                                                   headers: {'Content-Type': 'application/json', ...authHeaders()},
                                                   body: JSON.stringify(body)});
    if (!r.ok) {
      let m = 'HTTP ' + r.status + ' ' + r.statusText;
      try { m = (await r.json()).error.message; } catch (_) {}
      throw new Error(m);
    }
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const {value, done} = await reader.read();
      buf += dec.decode(value || new Uint8Array(), {stream: !done});
      // SSE allows CRLF and CR line ends: a CR that ends a read waits for the next one (it may start with the LF).
      const cr = !done && buf.endsWith('\r') ? '\r' : '';
      buf = buf.slice(0, buf.length - cr.length).replace(/\r\n?/g, '\n');
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i); buf = buf.slice(i + 2);
        handle(ev);
      }
      buf += cr;
      if (done) break;
    }
    if (buf.trim()) handle(buf);
    if (!ended) throw new Error('the reply stream ended early (no [DONE])' + (reply ? ': ' + reply : ''));
    messages.push({role: 'assistant', content: reply});
    out.classList.add('done');
    if (usage) {
      const s = (performance.now() - t0) / 1000, cached = (usage.prompt_tokens_details || {}).cached_tokens;
      document.getElementById('stats').textContent = ' · ' + usage.completion_tokens + ' tokens in ' + s.toFixed(2) +
        ' s' + (cached !== undefined ? ' (' + cached + ' prompt tokens from the prefix cache)' : '');
    }
  } catch (e) {
    messages.pop();
    out.className = 'msg error';
    out.textContent = 'error: ' + e.message;
  } finally {
    busy = false;
    document.getElementById('send').disabled = false;
  }
}
document.getElementById('form').addEventListener('submit', e => {
  e.preventDefault();
  const t = input.value.trim();
  if (t && !busy) { input.value = ''; send(t); }
});
input.addEventListener('keydown', e => {
  if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); document.getElementById('form').requestSubmit(); }
});
document.getElementById('reset').addEventListener('click', () => {
  if (!busy) { messages = []; log.textContent = ''; }
});
const params = new URLSearchParams(location.search);
for (const [k, id] of [['temperature', 'temp'], ['max_tokens', 'max']])
  if (params.has(k)) document.getElementById(id).value = params.get(k);
if (params.get('q')) send(params.get('q'));
</script>
</body>
</html>
)HTML";

}  // namespace cider::apps
