#!/usr/bin/env python3
"""bench/mlx_cpu_peer.py - prefill and greedy decode of an MLX-quantized model
folder (mlx-community layout, e.g. `lmstore export MODEL DIR` of an mlx4/mlx8
model) with mlx-lm on MLX's CPU backend (PyPI mlx[cpu], mlx-lm): the peer of
`lmstore bench engine` for MLX weights. PROMPT fixed ids are prefilled in one
call, then GEN tokens decoded one at a time; one JSON line.

  mlx_cpu_peer.py DIR [--prompt 128] [--gen 32]
"""
import json
import sys
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache


def main():
    path = sys.argv[1]
    prompt = int(sys.argv[sys.argv.index("--prompt") + 1]) if "--prompt" in sys.argv else 128
    gen = int(sys.argv[sys.argv.index("--gen") + 1]) if "--gen" in sys.argv else 32
    mx.set_default_device(mx.cpu)
    model, _ = load(path)
    ids = mx.array([[10 + (i * 7919) % 1000 for i in range(prompt)]])
    cache = make_prompt_cache(model)
    t0 = time.perf_counter()
    logits = model(ids, cache=cache)
    tok = mx.argmax(logits[:, -1, :], axis=-1)
    mx.eval(tok)
    t1 = time.perf_counter()
    for _ in range(gen):
        logits = model(tok[:, None], cache=cache)
        tok = mx.argmax(logits[:, -1, :], axis=-1)
        mx.eval(tok)
    t2 = time.perf_counter()
    print(json.dumps({"engine": "mlx-lm " + mx.__version__, "device": str(mx.default_device()), "prompt": prompt,
                      "gen": gen, "prefill_tps": round(prompt / (t1 - t0), 2),
                      "decode_tps": round(gen / (t2 - t1), 2)}))


if __name__ == "__main__":
    main()
