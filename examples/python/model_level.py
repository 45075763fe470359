# Model level: load, generate (streamed), logits, perplexity against a bf16 cache. Run from the repository root.
import contextlib, io

import cider

with contextlib.redirect_stdout(io.StringIO()):
    import this  # prints the Zen of Python on import

model = cider.load("models/cider-tiny", weights="w8a8", kv="k4v4", kv_layout="channel")
print(model)
for piece in model.generate("The Python interpreter", max_tokens=24, temperature=0, stream=True):
    print(piece, end="", flush=True)
print()
logits = model.logits(model.tokenizer.encode("import sys"))
zen = "".join(this.d.get(c, c) for c in this.s)  # the Zen of Python: a text that does not change
r = model.perplexity(zen, ctx=64, baseline={"weights": "bf16", "kv": "bf16"})
print(logits.shape, f"ppl {r.ppl:.3f} (baseline {r.base_ppl:.3f}), KL {r.kl:.4f}, top-1 {r.top1:.1%}")
