#!/usr/bin/env python3
"""
bench/bench_smollm2_cpu.py - prefill and decode speed of the README's
default model (SmolLM2-135M-Instruct, bf16) on the CPU: `lmstore run`
against transformers (PyTorch) with the same number of threads, in
alternating rounds of one run, greedy, a fixed prompt and a fixed number of
generated tokens (EOS ignored).

  python3 bench/bench_smollm2_cpu.py [--lmstore build/lmstore] [--store DIR]
      [--model-dir models/smollm2-135m-instruct] [--threads N] [--rounds 3]
      [--gen 128]

Both sides report prompt tokens/s (prefill) and decode tokens/s after the
first generated token; the script prints the median of each over the rounds
and the ratio lmstore / transformers. transformers runs once with bf16
weights (the same bytes lmstore reads) and once in float32.
"""

import argparse
import json
import os
import statistics
import subprocess
import time

PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes "
          "Gutenberg combined movable metal type, oil-based ink and a wooden press adapted from "
          "those used for wine. Within a few decades presses operated in more than two hundred "
          "cities across Europe, and the number of books grew from thousands to millions. Explain "
          "in detail how this changed science, religion and politics in the following century.")


def lmstore_round(a):
    p = subprocess.run([a.lmstore, "run", "smollm2-bench", "-p", PROMPT, "--temp", "0", "--ignore-eos",
                        "--max-tokens", str(a.gen), "--threads", str(a.threads), "--json", "--store", a.store],
                       capture_output=True, text=True, check=True)
    m = json.loads(p.stdout)["metrics"]
    return m["prompt_tps"], m["gen_tps"], m["prompt_tokens"]


def hf_round(model, tok, torch, gen):
    from transformers import LogitsProcessor, LogitsProcessorList

    class Clock(LogitsProcessor):
        def __init__(self):
            self.t = []

        def __call__(self, input_ids, scores):
            self.t.append(time.perf_counter())
            return scores

    ids = tok(PROMPT, return_tensors="pt").input_ids
    clock = Clock()
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=gen, min_new_tokens=gen, do_sample=False,
                       logits_processor=LogitsProcessorList([clock]), pad_token_id=2)
    prefill = ids.shape[1] / (clock.t[0] - t0)
    decode = (len(clock.t) - 1) / (clock.t[-1] - clock.t[0])
    return prefill, decode, ids.shape[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lmstore", default="build/lmstore")
    ap.add_argument("--store", default="/tmp/lmstore-bench-smollm2")
    ap.add_argument("--model-dir", default="models/smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen", type=int, default=128)
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(a.threads)
    subprocess.run([a.lmstore, "import", a.model_dir, "--name", "smollm2-bench", "--replace", "--store", a.store],
                   check=True, capture_output=True)
    tok = AutoTokenizer.from_pretrained(a.model_dir)
    models = {"transformers bf16": AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.bfloat16).eval(),
              "transformers f32": AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32).eval()}
    res = {"lmstore": [], **{k: [] for k in models}}
    for r in range(a.rounds):
        res["lmstore"].append(lmstore_round(a))
        for k, m in models.items():
            res[k].append(hf_round(m, tok, torch, a.gen))
    print(f"threads {a.threads}, prompt {res['lmstore'][0][2]} tokens, {a.gen} generated, "
          f"median of {a.rounds} alternating rounds; torch {torch.__version__}")
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in res.items()}
    print(f"{'':20s} {'prefill tok/s':>14s} {'decode tok/s':>13s}")
    for k, (pf, dc) in med.items():
        print(f"{k:20s} {pf:14.1f} {dc:13.1f}")
    for k in models:
        print(f"lmstore / {k}: prefill {med['lmstore'][0] / med[k][0]:.2f}x, decode {med['lmstore'][1] / med[k][1]:.2f}x")


if __name__ == "__main__":
    main()
