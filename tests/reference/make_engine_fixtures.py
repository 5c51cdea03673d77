#!/usr/bin/env python3
"""tests/reference/make_engine_fixtures.py - reference data for the engine tests.

Builds tiny random-weight models of each supported family with transformers
(bf16 weights written by save_pretrained), then computes with transformers in
float32 (weights upcast from the stored bf16, eager attention):
  - the logits of the last position of a fixed prompt,
  - 24 greedy tokens after that prompt,
  - the perplexity over a fixed token sequence (tokens 2..N scored),
and writes each model folder plus reference.json under OUT
(default tests/fixtures/engine/).

Each model exercises the features the engine must get right:
  llama : Llama 3 RoPE scaling (type llama3) with a small
          original_max_position_embeddings, tied embeddings, GQA
  qwen2 : q/k/v biases, untied LM head, GQA
  qwen3 : per-head q/k RMSNorm, head_dim != hidden_size / num_heads
  gemma3    : Gemma3ForCausalLM: local (sliding window 16) and global layers
              from layer_types, their own RoPE bases, (1 + w) norms, four
              norms per layer, q/k norms, query_pre_attn_scalar != head_dim,
              GELU-tanh, scaled embeddings, the logit soft-cap (and an
              attention soft-cap, which transformers' Gemma 3 does not apply),
              tied embeddings; its prompt (40 tokens) is longer than the window
  gemma3-mm : Gemma3ForConditionalGeneration with a tiny SigLIP vision tower
              (stored, not run by lmstore), the text model's global RoPE
              linearly scaled (factor 8, as gemma-3-4b), no soft-caps; the
              reference is the full model on text input
All norm weights are random (not ones), so a missing or misplaced norm shows.

Usage: python3 make_engine_fixtures.py [OUT] [FAMILY ...]   (default: every family)
"""
import json
import os
import sys

import torch
import transformers

N_GREEDY = 24
PROMPT = [1, 17, 42, 99, 3, 250, 7, 311, 64, 5]
VOCAB = 384


def ppl_tokens(vocab):
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, vocab, (48,), generator=g).tolist()


def long_prompt(vocab):
    """40 ids starting with BOS (2 for Gemma): longer than a sliding window of 16."""
    g = torch.Generator().manual_seed(4321)
    return [2] + torch.randint(3, vocab, (39,), generator=g).tolist()


def gemma_text(**kw):
    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
               rms_norm_eps=1e-6, bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0,
               hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24, sliding_window=16,
               layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
               rope_theta=1000000.0, rope_local_base_freq=10000.0, tie_word_embeddings=True)
    cfg.update(kw)
    return cfg


def common(cfg):
    cfg.update(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
               rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, hidden_act="silu")
    return cfg


def configs():
    out = {}
    out["llama"] = (transformers.LlamaConfig, transformers.LlamaForCausalLM, common(dict(
        tie_word_embeddings=True,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
        attention_bias=False, mlp_bias=False, head_dim=16)))
    out["qwen2"] = (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, common(dict(
        tie_word_embeddings=False, rope_theta=1000000.0, use_sliding_window=False)))
    out["qwen3"] = (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, common(dict(
        tie_word_embeddings=False, rope_theta=1000000.0, head_dim=24, attention_bias=False,
        use_sliding_window=False)))
    out["gemma3"] = (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM, gemma_text(
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0))
    out["gemma3-mm"] = (transformers.Gemma3Config, transformers.Gemma3ForConditionalGeneration, dict(
        text_config=gemma_text(rope_scaling={"rope_type": "linear", "factor": 8.0}),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14),
        mm_tokens_per_image=4, eos_token_id=[1, 106], tie_word_embeddings=True))
    return out


def randomize(model, seed, plus_one):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and plus_one:  # Gemma applies (1 + w)
                p.copy_(-0.4 + 0.8 * torch.rand(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(0.6 + 0.8 * torch.rand(p.shape, generator=g))
            elif "bias" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "embed" in name and plus_one:  # Gemma scales embeddings by sqrt(hidden): 0.4 after it
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            elif "embed" in name:
                p.copy_(0.4 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / fan_in ** 0.5))


def make(name, cfg_cls, model_cls, kw, out_dir, seed):
    torch.manual_seed(seed)
    cfg = cfg_cls(**kw)
    cfg._attn_implementation = "eager"
    model = model_cls(cfg)
    randomize(model, seed, name.startswith("gemma"))
    model = model.to(torch.bfloat16)
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    # reload what was written, compute in float32
    ref = model_cls.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    prompt = long_prompt(VOCAB) if name.startswith("gemma") else PROMPT
    with torch.no_grad():
        ids = torch.tensor([prompt])
        logits = ref(ids).logits[0, -1].float()
        # greedy, recomputing the full sequence each step (no cache involved)
        seq = list(prompt)
        gaps = []
        for _ in range(N_GREEDY):
            lg = ref(torch.tensor([seq])).logits[0, -1].float()
            top = torch.topk(lg, 2)
            gaps.append(float((top.values[0] - top.values[1]) / lg.abs().max()))
            seq.append(int(top.indices[0]))
        toks = ppl_tokens(VOCAB)
        lg = ref(torch.tensor([toks])).logits[0].float()
        lp = torch.log_softmax(lg[:-1], dim=-1)
        nll = -lp[torch.arange(len(toks) - 1), torch.tensor(toks[1:])]
        ppl = float(torch.exp(nll.mean()))
    return {
        "family": name,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "prompt_ids": prompt,
        "last_logits": [float(x) for x in logits],
        "greedy_ids": seq[len(prompt):],
        "min_greedy_gap_rel": min(gaps),
        "ppl_ids": toks,
        "ppl": ppl,
    }


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "engine")
    os.makedirs(out_dir, exist_ok=True)
    only = sys.argv[2:]
    for i, (name, (cc, mc, kw)) in enumerate(configs().items()):
        if only and name not in only:
            continue
        # choose a seed whose greedy run has no near-tie (a near-tie would make
        # the token test depend on rounding, not on correctness)
        for seed in range(100 + 10 * i, 110 + 10 * i):
            r = make(name, cc, mc, kw, out_dir, seed)
            if r["min_greedy_gap_rel"] > 2e-3:
                break
        r["seed"] = seed
        with open(os.path.join(out_dir, name, "reference.json"), "w") as f:
            json.dump(r, f)
        print(name, "seed", seed, "gap", r["min_greedy_gap_rel"], "ppl", r["ppl"],
              "greedy", r["greedy_ids"])


if __name__ == "__main__":
    main()
