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

import contextlib
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import tinymodel as tm  # noqa: E402

MODEL_DIR = os.path.join(tm.SRC, "models", "smollm2-135m-instruct")
REF_PATH = os.path.join(tm.SRC, "tests", "fixtures", "smollm2", "reference.json")


# (exact, logits tolerance, perplexity tolerance), relative: f32 activations
# (LMSTORE_BF16_ACT=0) hold transformers' logits and perplexity to 1e-3; the
# default on CPUs with AVX-512 BF16 rounds the inputs of BF16 weight products
# to bf16 (as llama.cpp does for BF16 weights), which moves this model's
# logits by up to ~1e-2 and its perplexity by ~0.15% (greedy ids unchanged,
# checked on the default path).
EXACT_TOL = [(True, 1e-3, 1e-3), (False, 2e-2, 5e-3)]


def same_top3(top, c, dev):
    """The 3 highest logits' ids equal transformers' in order, except that two
    ids may trade places where transformers' logits for them are within
    2 * dev (dev: the largest absolute difference measured at transformers'
    top-10 ids), the most a difference of dev on each side can reorder: with
    bf16 activations chat3's 3rd to 5th ids, 0.02 apart on 31, may swap. An
    id outside transformers' top 10 never passes."""
    ref = dict(zip(c["top10_ids"], c["top10_logits"]))
    return all(t == w or (t in ref and abs(ref[t] - ref[w]) <= 2 * dev) for t, w in zip(top[:3], c["top10_ids"][:3]))


@contextlib.contextmanager
def bf16_act(on):
    old = os.environ.get("LMSTORE_BF16_ACT")
    os.environ["LMSTORE_BF16_ACT"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["LMSTORE_BF16_ACT"]
        else:
            os.environ["LMSTORE_BF16_ACT"] = old


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
        for exact, tol, _ in EXACT_TOL:
            with bf16_act(not exact):
                tm.lms("logits", "smollm2", "--prompt-ids", ids, "--out", out, store=store)
            x = np.fromfile(out, dtype="<f4")
            top = np.argsort(-x, kind="stable")[:10].tolist()
            dev = float(np.max(np.abs(x[c["top10_ids"]] - np.array(c["top10_logits"]))))
            d = dev / float(np.max(np.abs(c["top10_logits"])))
            top3 = same_top3(top, c, 0 if exact else dev)
            check(top3 and d <= tol,
                  f"{c['name']}: top logits match{'' if exact else ' (bf16 activations)'} (relative difference {d:.2e})"
                  + ("" if top3 else f"\n  top 3 {top[:3]}, want {c['top10_ids'][:3]}"))

    if quick:
        shutil.rmtree(base, ignore_errors=True)
        return 1 if failures else 0
    p = ref["perplexity"]
    textfile = os.path.join(base, "text.txt")
    with open(textfile, "w") as f:
        f.write(p["text"])
    for exact, _, tol in EXACT_TOL:
        how = "" if exact else " (bf16 activations)"
        with bf16_act(not exact):
            r = json.loads(tm.lms("perplexity", "smollm2", "--prompt-ids", ",".join(map(str, p["ids"])), "--json",
                                  store=store).stdout)
            rel = abs(r["ppl"] - p["ppl"]) / p["ppl"]
            check(rel <= tol, f"perplexity{how} {r['ppl']:.4f} vs transformers {p['ppl']:.4f} (relative {rel:.2e})")
            r = json.loads(tm.lms("perplexity", "smollm2", "--file", textfile, "--json", store=store).stdout)
            check(r["n_tokens"] == p["n_tokens"] and abs(r["ppl"] - p["ppl"]) / p["ppl"] <= tol,
                  f"perplexity of the text file{how}: {r['ppl']:.4f} over {r['n_tokens']} tokens")
    shutil.rmtree(base, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
