#!/usr/bin/env python3
"""Builds tiny random-weight Hugging Face checkpoints of every architecture cider supports and records reference
logits from `transformers`, for tests/test_model_hf.cpp.

Usage:  python3 tools/make_hf_fixtures.py [--out tests/data/hf_fixtures]
Needs:  torch, transformers (tested with 5.x), safetensors, numpy — from PyPI. Runs on CPU (a GPU is not used: the
        references are computed in float64 on the CPU so that TF32 or reduced-precision kernels cannot blur them).

For each fixture <name> it writes into <out>/<name>/:
  config.json (+ generation_config.json)   as saved by transformers (one rewritten to the older config style, see
                                           below), model.safetensors or shards + model.safetensors.index.json
  reference.json                           {"prompt": [40 ids], "greedy": [16 ids], "min_top2_margin": …, versions}
  logits.npy                               float32 [56, vocab]: logits at every position of prompt + greedy, computed
                                           by transformers in float64 from exactly the saved weights (eager attention)
The greedy tokens come from argmax over those float64 logits, one full forward per step.

Fixtures (hidden 64, vocab 512, tiny so the whole set stays well under 8 MB):
  llama    Llama, GQA 4:2, llama3 rope scaling (original context 32 < sequence), 2 shards + index, OLD-style config
           (rope_theta + rope_scaling + torch_dtype), untied head
  mistral  Mistral, GQA 4:1, sliding_window 16 on every layer, float16 checkpoint
  qwen2    Qwen2, q/k/v biases, tied embeddings
  qwen3    Qwen3, q/k RMSNorm, head_dim 32 != hidden/heads 16
  gemma3   Gemma 3 text, layers [sliding, sliding, full], sliding_window 8, query_pre_attn_scalar 24,
           final_logit_softcapping 8, (1 + w) norms, sandwich norms, GeGLU, √hidden embedding scale
No tokenizer is written: the tests feed token ids.
"""
import argparse
import json
import os
import shutil

import numpy as np
import torch
import transformers
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

VOCAB = 512
PROMPT_LEN = 40
GREEDY = 16
TV_MAJOR = int(transformers.__version__.split(".")[0])


def rope_kwargs(theta, scaling=None):
    """Rope settings in the style this transformers version takes (5.x: rope_parameters; 4.x: rope_theta/scaling)."""
    if TV_MAJOR >= 5:
        p = {"rope_type": "default", "rope_theta": theta}
        if scaling:
            p.update(scaling)
        return {"rope_parameters": p}
    kw = {"rope_theta": theta}
    if scaling:
        kw["rope_scaling"] = scaling
    return kw


def common(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                max_position_embeddings=128, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
                attn_implementation="eager")
    base.update(kw)
    return base


def randomize(model, gemma):
    """Weights large enough that attention is peaked and logits are spread (the default init is nearly uniform)."""
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                centre = 0.0 if gemma else 1.0   # Gemma's norms multiply by (1 + w)
                p.copy_(centre + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[1]
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / fan_in ** 0.5))


def make(name):
    if name == "llama":
        cfg = LlamaConfig(**common(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                   **rope_kwargs(10000.0, {"rope_type": "llama3", "factor": 8.0,
                                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                           "original_max_position_embeddings": 32})))
        return cfg, LlamaForCausalLM, torch.float32, False
    if name == "mistral":
        cfg = MistralConfig(**common(num_attention_heads=4, num_key_value_heads=1, sliding_window=16,
                                     tie_word_embeddings=False, **rope_kwargs(10000.0)))
        return cfg, MistralForCausalLM, torch.float16, False
    if name == "qwen2":
        cfg = Qwen2Config(**common(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                   use_sliding_window=False, **rope_kwargs(1000000.0)))
        return cfg, Qwen2ForCausalLM, torch.float32, False
    if name == "qwen3":
        cfg = Qwen3Config(**common(num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   tie_word_embeddings=False, use_sliding_window=False, **rope_kwargs(1000000.0)))
        return cfg, Qwen3ForCausalLM, torch.float32, False
    if name == "gemma3":
        kw = common(num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                    sliding_window=8, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                    query_pre_attn_scalar=24, final_logit_softcapping=8.0, attn_logit_softcapping=None,
                    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, bos_token_id=2,
                    eos_token_id=1, pad_token_id=0)
        if TV_MAJOR >= 5:
            kw["rope_parameters"] = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
        else:
            kw.update(rope_theta=1e6, rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear",
                                                                                 "factor": 2.0})
        return Gemma3TextConfig(**kw), Gemma3ForCausalLM, torch.float32, True
    raise ValueError(name)


def to_old_style(path):
    """Rewrites a saved config.json into the older style: rope_theta + rope_scaling, torch_dtype."""
    with open(path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters", None)
    if rp is not None:
        rp = dict(rp)
        c["rope_theta"] = rp.pop("rope_theta")
        c["rope_scaling"] = rp if rp.get("rope_type", "default") != "default" else None
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    with open(path, "w") as f:
        json.dump(c, f, indent=2)


def build(name, out_root):
    cfg, cls, save_dtype, gemma = make(name)
    torch.manual_seed(0)
    model = cls(cfg).eval()
    randomize(model, gemma)
    # The reference runs on exactly the saved values: round the parameters to the checkpoint dtype, then compute in
    # float64. Only parameters: rounding the model with .to(float16) would also round the rotary inv_freq buffer,
    # which is not part of the checkpoint.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(save_dtype).to(p.dtype))
    model = model.to(torch.float64)
    out = os.path.join(out_root, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    save_model = cls(cfg).eval().to(save_dtype)
    save_model.load_state_dict({k: v.to(save_dtype) for k, v in model.state_dict().items()})
    kwargs = {"safe_serialization": True}
    if name == "llama":
        kwargs["max_shard_size"] = "300KB"  # several shards + model.safetensors.index.json
    save_model.save_pretrained(out, **kwargs)
    if name == "llama":
        to_old_style(os.path.join(out, "config.json"))

    rng = np.random.default_rng({"llama": 1, "mistral": 2, "qwen2": 3, "qwen3": 4, "gemma3": 5}[name])
    prompt = [int(t) for t in rng.integers(3, VOCAB, PROMPT_LEN)]
    ids = list(prompt)
    margins = []
    with torch.no_grad():
        for _ in range(GREEDY):
            logits = model(torch.tensor([ids])).logits[0, -1]
            top2 = torch.topk(logits, 2).values
            margins.append(float(top2[0] - top2[1]))
            ids.append(int(torch.argmax(logits)))
        full = model(torch.tensor([ids])).logits[0].to(torch.float32).numpy()
    np.save(os.path.join(out, "logits.npy"), np.ascontiguousarray(full, dtype="<f4"))
    ref = {"prompt": prompt, "greedy": ids[PROMPT_LEN:], "min_top2_margin": min(margins),
           "max_abs_logit": float(np.abs(full).max()), "transformers": transformers.__version__,
           "torch": torch.__version__, "checkpoint_dtype": str(save_dtype).replace("torch.", "")}
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(name, "files:", sorted(os.listdir(out)), "min top-2 margin %.4f" % min(margins),
          "max|logit| %.2f" % ref["max_abs_logit"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "hf_fixtures"))
    ap.add_argument("--only", nargs="*", default=["llama", "mistral", "qwen2", "qwen3", "gemma3"])
    args = ap.parse_args()
    torch.set_num_threads(4)
    for name in args.only:
        build(name, args.out)


if __name__ == "__main__":
    main()
