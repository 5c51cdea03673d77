#!/usr/bin/env python3
"""tests/reference/make_kv_fixture.py - real K/V data for the KV codec and
save/resume benchmark (`lmstore bench kv --data FILE`).

Runs a model with transformers over English text and writes the K/V cache
(past_key_values: keys after RoPE, as an engine caches them) of a subset of
layers as one safetensors file:

    k, v     bf16 [layers, kv_heads, tokens, head_dim]
    tokens   int32 [tokens]
    __metadata__: model, source of the weights, layers kept, text source

The best source is a model with trained weights (--model DIR, a HuggingFace
folder with config.json, model.safetensors and tokenizer.json). With
--random-init instead, a randomly initialized Llama-3-8B-shaped model (8 KV
heads, head dim 128, a few layers) is used; its K/V is NOT real KV and the
file says so ("random-init model KV").

The text is the concatenated docstrings of a fixed list of Python standard
library modules (English prose and code, freely licensed, present wherever
Python is).

Usage:
  python3 tests/reference/make_kv_fixture.py --model models/smollm2-135m-instruct \
      --tokens 768 --layers 0,4,8,12,16,20,24,28 --out tests/fixtures/kv/smollm2-135m.kv.safetensors
"""
import argparse
import importlib
import inspect
import json
import sys

import torch
from safetensors.torch import save_file

MODULES = ["argparse", "collections", "json", "logging", "pathlib", "subprocess", "threading",
           "unittest", "functools", "itertools", "re", "csv", "email", "http", "zipfile"]


def text_corpus():
    parts = []
    for name in MODULES:
        mod = importlib.import_module(name)
        doc = inspect.getdoc(mod) or ""
        parts.append(doc)
        for _, obj in sorted(vars(mod).items()):
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", "") == name:
                d = inspect.getdoc(obj)
                if d:
                    parts.append(d)
    return "\n\n".join(parts)


def kv_of(cache, layer):
    """(keys, values) of one layer, [batch, kv_heads, tokens, head_dim], across transformers versions."""
    if hasattr(cache, "layers"):
        lay = cache.layers[layer]
        return lay.keys, lay.values
    if hasattr(cache, "key_cache"):
        return cache.key_cache[layer], cache.value_cache[layer]
    return cache[layer][0], cache[layer][1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="HuggingFace model folder with trained weights")
    ap.add_argument("--random-init", action="store_true",
                    help="use a randomly initialized Llama-3-8B-shaped model (labelled: not real KV)")
    ap.add_argument("--tokens", type=int, default=768)
    ap.add_argument("--layers", default="0,4,8,12,16,20,24,28", help="layers to keep (comma list)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if bool(args.model) == bool(args.random_init):
        ap.error("give exactly one of --model DIR and --random-init")

    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    text = text_corpus()
    if args.model:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(f"{args.model}/tokenizer.json")
        ids = tok.encode(text).ids[: args.tokens]
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
        with open(f"{args.model}/config.json") as f:
            cfg = json.load(f)
        label = "real KV"
        source = f"{cfg.get('architectures', ['?'])[0]} from {args.model.rstrip('/').split('/')[-1]}"
    else:
        cfg = LlamaConfig(hidden_size=4096, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=32,
                          num_key_value_heads=8, head_dim=128, vocab_size=32000, rope_theta=500000.0)
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
        ids = [(i * 7919) % 32000 for i in range(args.tokens)]
        label = "random-init model KV"
        source = "randomly initialized Llama-3-8B-shaped model (4 layers)"
    if len(ids) < args.tokens:
        sys.exit(f"only {len(ids)} tokens of text")
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
    cache = out.past_key_values
    n_layers = model.config.num_hidden_layers
    layers = [int(x) for x in args.layers.split(",") if int(x) < n_layers]
    ks, vs = [], []
    for l in layers:
        k, v = kv_of(cache, l)
        ks.append(k[0].to(torch.bfloat16).contiguous())
        vs.append(v[0].to(torch.bfloat16).contiguous())
    k = torch.stack(ks).contiguous()
    v = torch.stack(vs).contiguous()
    meta = {
        "kind": label,
        "source": source,
        "layers": ",".join(map(str, layers)),
        "model_layers": str(n_layers),
        "text": "docstrings of Python stdlib modules " + ",".join(MODULES),
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
    }
    save_file({"k": k, "v": v, "tokens": torch.tensor(ids, dtype=torch.int32)}, args.out, metadata=meta)
    print(f"{args.out}: {label}; k/v {list(k.shape)} bf16 from {source}; layers {meta['layers']}")


if __name__ == "__main__":
    main()
