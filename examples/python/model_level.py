# Model level: load, generate (streamed), logits, perplexity against a bf16 cache. Run from the repository root.
import cider

model = cider.load("models/cider-tiny", weights="w8a8", kv="k4v4", kv_layout="channel")
print(model)
for piece in model.generate("The Python interpreter", max_tokens=24, temperature=0, stream=True):
    print(piece, end="", flush=True)
print()
logits = model.logits(model.tokenizer.encode("import sys"))
r = model.perplexity(open("README.md").read()[:8000], ctx=128, baseline={"weights": "bf16", "kv": "bf16"})
print(logits.shape, f"ppl {r.ppl:.3f} (baseline {r.base_ppl:.3f}), KL {r.kl:.4f}, top-1 {r.top1:.1%}")
