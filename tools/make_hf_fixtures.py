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
  logits.npy                               float32 [P + 16, vocab]: logits at every position of prompt + greedy, computed
                                           by transformers in float64 from exactly the saved weights (eager attention)
The greedy tokens come from argmax over those float64 logits, one full forward per step.

Fixtures (hidden 64, vocab 512, tiny so the whole set stays well under 8 MB; heads of 32 dims or more except the
first three, so that the CUDA backend runs them):
  llama    Llama, GQA 4:2, llama3 rope scaling (original context 32 < sequence), 2 shards + index, OLD-style config
           (rope_theta + rope_scaling + torch_dtype), untied head
  mistral  Mistral, GQA 4:1, sliding_window 16 on every layer, float16 checkpoint
  qwen2    Qwen2, q/k/v biases, tied embeddings
  qwen3    Qwen3, q/k RMSNorm, head_dim 32 != hidden/heads 16
  gemma3   Gemma 3 text, layers [sliding, sliding, full], sliding_window 8, query_pre_attn_scalar 24,
           final_logit_softcapping 8, (1 + w) norms, sandwich norms, GeGLU, √hidden embedding scale
  mixtral  Mixtral, 4 experts, top 2 (renormalised), GQA 4:2, head_dim 32, 300-token prompt, bfloat16 checkpoint
  qwen3_moe Qwen3-MoE, 3 layers with experts on layer 1 only (decoder_sparse_step 2: layers 0 and 2 dense), 8
           experts, top 3, norm_topk_prob true (as released), q/k norms, head_dim 32, 300-token prompt, bfloat16
           checkpoint
  phi3     Phi-3: fused qkv_proj / gate_up_proj, LongRoPE (original context 64, max 512: the long factors; random
           short/long factors in [1, 4]), sliding_window 200 on every layer, 300-token prompt, GQA 2:1 (head_dim
           32), bfloat16 checkpoint
  yarn     Qwen3 with YaRN rope scaling (factor 8 over an original context of 64, beta_fast 16, beta_slow 0.5,
           truncate false; attention factor 0.1·ln 8 + 1), 300-token prompt, bfloat16 checkpoint
  gemma2   Gemma 2, layers [sliding, full, sliding] (sliding_window 8), attn_logit_softcapping 5 and
           final_logit_softcapping 8 (both bite: scores and logits of these weights reach well past them),
           query_pre_attn_scalar 24, head_dim 32 != hidden/heads, GQA 4:2, (1 + w) and sandwich norms, GeGLU,
           √hidden embedding scale, 300-token prompt, bfloat16 checkpoint
  qwen3_next Qwen3-Next hybrid: layers [linear, full, linear, full] — gated DeltaNet (2 key heads of 16, 4 value
           heads of 16: each key head serves two value heads; conv kernel 4; fused in_proj_qkvz / in_proj_ba in the
           per-key-head order) beside gated full attention (q_proj = query | gate per head, head_dim 32, partial
           rotary 0.25, q/k norms); (1 + w) norms, the DeltaNet output norm plain w; MoE on every layer (8
           experts, top 2, renormalised, a shared expert of 64 behind a sigmoid gate: llama.cpp's converter takes
           no dense layer in this architecture, so its GGUF twin exists); 300-token prompt, bfloat16 checkpoint
  qwen3_5  Qwen3.5 text (Qwen3_5ForCausalLM): the same hybrid with separate in_proj_qkv / in_proj_z / in_proj_b /
           in_proj_a, dense MLPs, layers [linear, linear, full], 2 key heads serving 4 value heads (as the released
           models: llama.cpp's converter reorders value heads only then), 300-token prompt, bfloat16 checkpoint
  olmoe    OLMoE: q/k norms over the whole projections, clip_qkv 3 (it bites: these q/k/v reach past it), 8 experts
           top 3 not renormalised (norm_topk_prob false, as released), head_dim 32, 300-token prompt, bfloat16
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
                          MistralForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)
from transformers import Phi3Config, Phi3ForCausalLM
from transformers import Gemma2Config, Gemma2ForCausalLM

VOCAB = 512
PROMPT_LEN = 40
GREEDY = 16
# Fixtures added later use prompts of 300 tokens (sequences of 316): long enough for windows, scaled RoPE and routing
# to matter. The first five keep 40 (their files must not change).
PROMPT_LEN_OF = {"olmoe": 300, "qwen3_next": 300, "qwen3_5": 300, "gemma2": 300, "phi3": 300, "yarn": 300, "mixtral": 300, "qwen3_moe": 300, "phi4_mini": 300}
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
                attn_implementation="eager", experts_implementation="eager")
    base.update(kw)
    return base


def randomize(model, gemma):
    """Weights large enough that attention is peaked and logits are spread (the default init is nearly uniform)."""
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):  # the DeltaNet output norm multiplies by w (not 1 + w)
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):  # decay rates A = exp(A_log) in [0.5, 4]
                p.copy_(torch.log(0.5 + 3.5 * torch.rand(p.shape, generator=g)))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif name.endswith("conv1d.weight"):  # (channels, 1, kernel)
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 / p.shape[-1] ** 0.5))
            elif name.endswith("norm.weight"):
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
    if name == "gemma2":
        kw = common(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    max_position_embeddings=512, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    query_pre_attn_scalar=24, attn_logit_softcapping=5.0, final_logit_softcapping=8.0,
                    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, bos_token_id=2,
                    eos_token_id=1, pad_token_id=0, **rope_kwargs(10000.0))
        return Gemma2Config(**kw), Gemma2ForCausalLM, torch.bfloat16, True
    if name == "mixtral":
        cfg = MixtralConfig(**common(num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=512, sliding_window=None, tie_word_embeddings=False,
                                     **rope_kwargs(1000000.0)))
        return cfg, MixtralForCausalLM, torch.bfloat16, False
    if name == "qwen3_moe":
        cfg = Qwen3MoeConfig(**common(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                      num_experts=8, num_experts_per_tok=3, moe_intermediate_size=64,
                                      decoder_sparse_step=2, mlp_only_layers=[], norm_topk_prob=True,
                                      max_position_embeddings=512,
                                      tie_word_embeddings=False, use_sliding_window=False, **rope_kwargs(1000000.0)))
        return cfg, Qwen3MoeForCausalLM, torch.bfloat16, False
    if name == "phi3":
        # LongRoPE over a 64-token pre-training context stretched to 512: the 316-token sequences use the long
        # factors (HF switches on the sequence length, cider on its context, 512 here: both pick long).
        g = np.random.default_rng(90)
        half = 64 // 2 // 2
        rope = {"rope_type": "longrope", "short_factor": [float(x) for x in g.uniform(1.0, 4.0, half)],
                "long_factor": [float(x) for x in g.uniform(1.0, 4.0, half)]}
        cfg = Phi3Config(**common(num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                                  original_max_position_embeddings=64, sliding_window=200, pad_token_id=0,
                                  tie_word_embeddings=False, **rope_kwargs(10000.0, rope)))
        return cfg, Phi3ForCausalLM, torch.bfloat16, False
    if name == "phi4_mini":
        # Phi-4-mini's layout: Phi-3 with partial_rotary_factor (0.75 there; 0.5 here: 16 of 32 head dims rotate,
        # pairs (i, i + 8)), LongRoPE lists of one entry per rotary pair, q/k/v fused, head_dim 32.
        g = np.random.default_rng(91)
        half = 32 // 2 // 2
        rope = {"rope_type": "longrope", "short_factor": [float(x) for x in g.uniform(1.0, 4.0, half)],
                "long_factor": [float(x) for x in g.uniform(1.0, 4.0, half)]}
        cfg = Phi3Config(**common(num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                                  original_max_position_embeddings=64, partial_rotary_factor=0.5, pad_token_id=0,
                                  tie_word_embeddings=True, **rope_kwargs(10000.0, rope)))
        return cfg, Phi3ForCausalLM, torch.bfloat16, False
    if name == "yarn":
        cfg = Qwen3Config(**common(num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                                   tie_word_embeddings=False, use_sliding_window=False,
                                   **rope_kwargs(10000.0, {"rope_type": "yarn", "factor": 8.0,
                                                           "original_max_position_embeddings": 64, "beta_fast": 16.0,
                                                           "beta_slow": 0.5, "truncate": False})))
        return cfg, Qwen3ForCausalLM, torch.bfloat16, False
    if name == "qwen3_next":
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
        cfg = Qwen3NextConfig(**common(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                       layer_types=["linear_attention", "full_attention", "linear_attention",
                                                    "full_attention"],
                                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                       linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=8,
                                       num_experts_per_tok=2, moe_intermediate_size=64,
                                       shared_expert_intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[],
                                       norm_topk_prob=True, max_position_embeddings=512, tie_word_embeddings=False,
                                       partial_rotary_factor=0.25, **rope_kwargs(10000.0)))
        return cfg, Qwen3NextForCausalLM, torch.bfloat16, True
    if name == "qwen3_5":
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
        cfg = Qwen3_5TextConfig(**common(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                         head_dim=32, layer_types=["linear_attention", "linear_attention",
                                                                   "full_attention"],
                                         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                         linear_value_head_dim=32, linear_conv_kernel_dim=4,
                                         max_position_embeddings=512, tie_word_embeddings=True,
                                         partial_rotary_factor=0.25, **rope_kwargs(10000.0)))
        return cfg, Qwen3_5ForCausalLM, torch.bfloat16, True
    if name == "olmoe":
        from transformers import OlmoeConfig, OlmoeForCausalLM
        cfg = OlmoeConfig(**common(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, num_experts=8,
                                   num_experts_per_tok=3, intermediate_size=64, norm_topk_prob=False,
                                   clip_qkv=3.0, max_position_embeddings=512, rms_norm_eps=1e-5,
                                   tie_word_embeddings=False, **rope_kwargs(10000.0)))
        return cfg, OlmoeForCausalLM, torch.bfloat16, False
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

    rng = np.random.default_rng({"llama": 1, "mistral": 2, "qwen2": 3, "qwen3": 4, "gemma3": 5, "mixtral": 6,
                                 "phi3": 9, "yarn": 10, "gemma2": 12, "phi4_mini": 13, "qwen3_next": 14, "qwen3_5": 15, "olmoe": 16,
                                 "qwen3_moe": 8}[name])
    prompt = [int(t) for t in rng.integers(3, VOCAB, PROMPT_LEN_OF.get(name, PROMPT_LEN))]
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
    ref = {"prompt": prompt, "greedy": ids[len(prompt):], "min_top2_margin": min(margins),
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
