#!/usr/bin/env python3
"""
tests/tools/test_smollm2.py - lmstore against transformers on the real
default model, SmolLM2-135M-Instruct as tools/quickstart.sh fetches and
converts it (models/smollm2-135m-instruct in the source tree). References
from tests/reference/make_smollm2_reference.py (transformers, float32 over
the bf16 weights): prompt tokenization and chat rendering, greedy
continuations, the last position's top-10 logits, and the perplexity of a
paragraph. Skipped (77) when the model has not been fetched. In a
sanitizer build (slow kernels) only a subset runs: one chat case, 4 greedy
tokens.
"""

import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import tinymodel as tm  # noqa: E402

MODEL_DIR = os.path.join(tm.SRC, "models", "smollm2-135m-instruct")
REF_PATH = os.path.join(tm.SRC, "tests", "fixtures", "smollm2", "reference.json")


def main():
    if not os.path.exists(os.path.join(MODEL_DIR, "model.safetensors")):
        print(f"skipped: {MODEL_DIR} not found (tools/quickstart.sh fetches it)")
        return 77
    with open(REF_PATH) as f:
        ref = json.load(f)
    base = os.path.join(tm.TMP, "smollm2")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    store = os.path.join(base, "store")
    tm.lms("import", MODEL_DIR, "--name", "smollm2", store=store)
    eos = 2
    failures = 0

    def check(cond, what):
        nonlocal failures
        print(("ok   " if cond else "FAIL ") + what)
        failures += 0 if cond else 1

    quick = tm.sanitized_build()
    cases = [ref["cases"][3]] if quick else ref["cases"]
    for c in cases:
        want = c["greedy_ids"][:4] if quick else c["greedy_ids"]
        ended = bool(want) and want[-1] == eos
        want_ids = want[:-1] if ended else want
        ids = ",".join(map(str, c["prompt_ids"]))
        # the prompt as text: tokenization (and for chat cases the ChatML
        # rendering) must give transformers' prompt ids, then the greedy ids
        if c["chat"]:
            args = ["--chat", "-p", c["prompt"]]
            if c["system"] is not None:  # else the template's default system message
                args[1:1] = ["--system", c["system"]]
        else:
            args = ["-p", c["prompt"]]
        r = json.loads(tm.lms("run", "smollm2", *args, "--temp", "0", "--max-tokens", str(len(want)),
                              "--json", store=store).stdout)
        check(r["prompt_ids"] == c["prompt_ids"], f"{c['name']}: prompt ids equal transformers'"
              + ("" if r["prompt_ids"] == c["prompt_ids"] else f"\n  got  {r['prompt_ids']}\n  want {c['prompt_ids']}"))
        check(r["ids"] == want_ids, f"{c['name']}: greedy ids equal transformers' ({len(want_ids)} tokens)"
              + ("" if r["ids"] == want_ids else f"\n  got  {r['ids']}\n  want {want_ids}"))
        if ended:
            check(r["metrics"]["stop"] == "eos", f"{c['name']}: stops on EOS like transformers")
        if quick:
            continue
        out = os.path.join(base, "logits.f32")
        tm.lms("logits", "smollm2", "--prompt-ids", ids, "--out", out, store=store)
        x = np.fromfile(out, dtype="<f4")
        top = np.argsort(-x, kind="stable")[:10].tolist()
        d = float(np.max(np.abs(x[c["top10_ids"]] - np.array(c["top10_logits"]))) / np.max(np.abs(c["top10_logits"])))
        check(top[:3] == c["top10_ids"][:3] and d <= 1e-3,
              f"{c['name']}: top logits match (relative difference {d:.2e})")

    if quick:
        shutil.rmtree(base, ignore_errors=True)
        return 1 if failures else 0
    p = ref["perplexity"]
    r = json.loads(tm.lms("perplexity", "smollm2", "--prompt-ids", ",".join(map(str, p["ids"])), "--json",
                          store=store).stdout)
    rel = abs(r["ppl"] - p["ppl"]) / p["ppl"]
    check(rel <= 1e-3, f"perplexity {r['ppl']:.4f} vs transformers {p['ppl']:.4f} (relative {rel:.2e})")
    textfile = os.path.join(base, "text.txt")
    with open(textfile, "w") as f:
        f.write(p["text"])
    r = json.loads(tm.lms("perplexity", "smollm2", "--file", textfile, "--json", store=store).stdout)
    check(r["n_tokens"] == p["n_tokens"] and abs(r["ppl"] - p["ppl"]) / p["ppl"] <= 1e-3,
          f"perplexity of the text file: {r['ppl']:.4f} over {r['n_tokens']} tokens")
    shutil.rmtree(base, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
