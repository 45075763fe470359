// The chat page of `cider serve` (GET /): plain HTML and JavaScript, no framework, no external resources. It keeps the
// conversation in the page, sends it to /v1/chat/completions with stream: true and appends the streamed text.
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
<span id="stats"></span></small></p>
<script>
const log = document.getElementById('log'), input = document.getElementById('input');
let messages = [];
fetch('/v1/models').then(r => r.json()).then(j => {
  document.getElementById('model').textContent = j.data[0].id + ' · context ' + j.data[0].max_model_len;
}).catch(() => {});
function add(role, text) {
  const d = document.createElement('div');
  d.className = 'msg ' + role;
  d.textContent = (role === 'user' ? '> ' : '') + text;
  log.appendChild(d);
  log.scrollTop = log.scrollHeight;
  return d;
}
async function send(text) {
  messages.push({role: 'user', content: text});
  add('user', text);
  const out = add('assistant', '');
  out.id = 'reply-' + messages.length;
  const body = {messages, stream: true, stream_options: {include_usage: true},
                max_tokens: +document.getElementById('max').value,
                temperature: +document.getElementById('temp').value};
  const t0 = performance.now();
  let reply = '', usage = null;
  try {
    const r = await fetch('/v1/chat/completions', {method: 'POST', headers: {'Content-Type': 'application/json'},
                                                   body: JSON.stringify(body)});
    if (!r.ok) throw new Error((await r.json()).error.message);
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const line = buf.slice(0, i); buf = buf.slice(i + 2);
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        if (j.usage) usage = j.usage;
        for (const c of j.choices || []) if (c.delta && c.delta.content) { reply += c.delta.content; out.textContent = reply; }
      }
    }
    messages.push({role: 'assistant', content: reply});
    out.classList.add('done');
    if (usage) {
      const s = (performance.now() - t0) / 1000;
      document.getElementById('stats').textContent = ' · ' + usage.completion_tokens + ' tokens in ' + s.toFixed(2) +
        ' s (' + usage.prompt_tokens_details.cached_tokens + ' prompt tokens from the prefix cache)';
    }
  } catch (e) {
    messages.pop();
    out.className = 'msg error';
    out.textContent = 'error: ' + e.message;
  }
}
document.getElementById('form').addEventListener('submit', e => {
  e.preventDefault();
  const t = input.value.trim();
  if (t) { input.value = ''; send(t); }
});
input.addEventListener('keydown', e => {
  if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); document.getElementById('form').requestSubmit(); }
});
document.getElementById('reset').addEventListener('click', () => { messages = []; log.textContent = ''; });
const q = new URLSearchParams(location.search).get('q');
if (q) send(q);
</script>
</body>
</html>
)HTML";

}  // namespace cider::apps
