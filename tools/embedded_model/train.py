#!/usr/bin/env python3
"""Trains cider's embedded default model (models/cider-tiny) on the corpus built by prepare.py.

A Llama-architecture model (Hugging Face LlamaForCausalLM, so any HF-compatible engine loads it): 8 layers,
hidden 256, 4 query heads and 2 KV heads of dimension 64 (GQA), SwiGLU 768, vocabulary 4096, tied embeddings,
context 1024, about 7.3 M parameters (14.6 MB in bf16). Trained from scratch with AdamW on the training split;
the checkpoint with the lowest validation loss is kept.

Usage (on a GPU machine with torch + transformers):
    python3 tools/embedded_model/train.py DATA_DIR OUT_DIR [--minutes 3]
DATA_DIR holds train.bin, valid.bin (uint16 ids), tokenizer.json, sources.json from prepare.py. OUT_DIR receives
model.safetensors, config.json, generation_config.json, tokenizer.json, train_log.json and samples.txt, plus
reference.json: float32 logits and a greedy continuation computed by transformers, for cider's tests.
"""
import argparse
import json
import math
import os
import shutil
import time

import numpy as np
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--max-epochs", type=float, default=20.0)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    src = json.load(open(os.path.join(args.data, "sources.json")))
    train = torch.from_numpy(np.fromfile(os.path.join(args.data, "train.bin"), dtype=np.uint16).astype(np.int64))
    valid = torch.from_numpy(np.fromfile(os.path.join(args.data, "valid.bin"), dtype=np.uint16).astype(np.int64))
    train, valid = train.to(dev), valid.to(dev)

    config = LlamaConfig(vocab_size=src["vocab_size"], hidden_size=256, intermediate_size=768, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                         rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                         bos_token_id=src["bos_id"], eos_token_id=src["eos_id"], attention_dropout=0.0)
    model = LlamaForCausalLM(config).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params / 1e6:.2f} M, train tokens {train.numel()}, valid tokens {valid.numel()}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=(dev == "cuda"))
    tokens_per_step = args.seq * args.batch
    max_steps = int(args.max_epochs * train.numel() / tokens_per_step)
    warmup = 100

    def lr_at(step, total):
        if step < warmup:
            return args.lr * (step + 1) / warmup
        t = min(1.0, (step - warmup) / max(1, total - warmup))
        return 1e-4 + 0.5 * (args.lr - 1e-4) * (1 + math.cos(math.pi * t))

    def batch(data):
        ix = torch.randint(0, data.numel() - args.seq - 1, (args.batch,), device=dev)
        x = torch.stack([data[i:i + args.seq + 1] for i in ix.tolist()])
        return x[:, :-1], x[:, 1:]

    @torch.no_grad()
    def evaluate():
        model.eval()
        losses = []
        for start in range(0, valid.numel() - args.seq - 1, args.seq):
            x = valid[start:start + args.seq + 1]
            with torch.autocast(dev, dtype=torch.bfloat16):
                logits = model(x[None, :-1]).logits.float()
            losses.append(torch.nn.functional.cross_entropy(logits[0], x[1:]).item())
        model.train()
        return sum(losses) / len(losses)

    # Estimate the step budget from the time limit after a few timed steps.
    log, best, best_state = [], float("inf"), None
    t0 = time.time()
    step, total = 0, max_steps
    model.train()
    while step < total:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total)
        x, y = batch(train)
        with torch.autocast(dev, dtype=torch.bfloat16):
            logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step == 20:
            per_step = (time.time() - t0) / 20
            total = min(max_steps, int(args.minutes * 60 / per_step))
            print(f"{per_step * 1000:.1f} ms/step -> {total} steps ({total * tokens_per_step / train.numel():.1f} epochs)")
        if step % 100 == 0 or step == total:
            v = evaluate()
            log.append({"step": step, "train_loss": loss.item(), "valid_loss": v, "seconds": time.time() - t0})
            print(log[-1], flush=True)
            if v < best:
                best = v
                best_state = {k: t.detach().clone() for k, t in model.state_dict().items()}
    model.load_state_dict(best_state)
    model.eval()

    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    GenerationConfig(bos_token_id=src["bos_id"], eos_token_id=src["eos_id"], do_sample=True, temperature=0.8,
                     top_p=0.95).save_pretrained(args.out)
    shutil.copy(os.path.join(args.data, "tokenizer.json"), os.path.join(args.out, "tokenizer.json"))
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(args.out, "tokenizer.json"),
                                  bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    tok.save_pretrained(args.out)
    json.dump({"log": log, "best_valid_loss": best, "best_valid_ppl": math.exp(best), "parameters": n_params,
               "sources": src, "steps": step, "tokens_per_step": tokens_per_step},
              open(os.path.join(args.out, "train_log.json"), "w"), indent=1)

    # Reference outputs of the saved (bf16) weights, computed in float32 by transformers, for cider's tests.
    ref_model = LlamaForCausalLM.from_pretrained(args.out, torch_dtype=torch.float32).to(dev).eval()
    prompts = ["The Python interpreter", "A fortune: "]
    reference, samples = [], []
    for p in prompts:
        ids = tok(p, return_tensors="pt").input_ids.to(dev)
        with torch.no_grad():
            logits = ref_model(ids).logits[0].float().cpu().numpy()
            greedy = ref_model.generate(ids, max_new_tokens=24, do_sample=False)[0].tolist()
            sampled = ref_model.generate(ids, max_new_tokens=60, do_sample=True, temperature=0.8, top_p=0.95)[0]
        reference.append({"prompt": p, "ids": ids[0].tolist(), "logits": logits.tolist(), "greedy": greedy})
        samples.append(f"--- {p!r} (greedy)\n{tok.decode(greedy)}\n--- {p!r} (sampled, T=0.8, top-p 0.95)\n"
                       f"{tok.decode(sampled.tolist())}\n")
    json.dump(reference, open(os.path.join(args.out, "reference.json"), "w"))
    open(os.path.join(args.out, "samples.txt"), "w").write("\n".join(samples))
    print("\n".join(samples))
    print(f"best valid loss {best:.3f} (perplexity {math.exp(best):.1f})")


if __name__ == "__main__":
    main()
