#!/usr/bin/env python3
"""
tests/tools/test_llamacpp_smollm2.py - lmstore's engine against llama.cpp on
quantized SmolLM2-135M-Instruct (the README's default model as
tools/quickstart.sh converts it; skipped, 77, when it has not been
fetched). References: tests/fixtures/llamacpp/smollm2.json, made by
tests/reference/make_llamacpp_fixtures.py with llama.cpp (llama-quantize
and libllama through llama-cpp-python's bindings).

For Q8_0 and Q4_K_M:
  1. `lmstore quantize --type q8_0 / q4_k_m` + export gives the tensor
     bytes of llama-quantize's file: the engines below run the same weights;
  2. greedy decoding, 32 tokens, of the fixture's three greedy prompts is
     llama.cpp's, id for id;
  3. along llama.cpp's greedy path of every candidate prompt (teacher
     forcing), lmstore's arg max equals llama.cpp's at every step where
     llama.cpp's top-1 margin is at least MARGIN logits. Smaller margins are
     within the few percent by which any two summation orders differ after
     8-bit activation rounding (llama.cpp's own batch and single-token paths
     differ that much: the fixture's self_noise), so they decide nothing;
  4. perplexity of the fixture's text (803 tokens) within 0.5% of
     llama.cpp's, with its text fed in batches of 512 (as llama-perplexity
     does) or a token at a time (the fixture's ppl_one_by_one): llama.cpp's
     own two figures differ by 0.1% for Q8_0 and 0.6% for Q4_K_M, so
     either is llama.cpp's perplexity.
In a sanitizer build (slow kernels) only Q8_0, step 1 and one greedy prompt
of 8 tokens run.
"""

import hashlib
import json
import os
import shutil
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(__file__))
import tinymodel as tm  # noqa: E402
from test_smollm2 import MODEL_DIR  # noqa: E402

FIXTURE = os.path.join(tm.SRC, "tests", "fixtures", "llamacpp", "smollm2.json")
MARGIN = 2.0
TYPES = {"Q8_0": "q8_0", "Q4_K_M": "q4_k_m"}


def main():
    if not os.path.exists(os.path.join(MODEL_DIR, "model.safetensors")):
        print(f"skipped: {MODEL_DIR} not found (tools/quickstart.sh fetches it)")
        return 77
    with open(FIXTURE) as f:
        ref = json.load(f)
    base = os.path.join(tm.TMP, "llamacpp-smollm2")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    store = os.path.join(base, "store")
    tm.lms("import", MODEL_DIR, "--name", "smollm2", store=store)
    quick = tm.sanitized_build()
    failures = 0

    def check(cond, what):
        nonlocal failures
        print(("ok   " if cond else "FAIL ") + what)
        failures += 0 if cond else 1

    for t, arg in TYPES.items():
        if quick and t != "Q8_0":
            continue
        fx = ref["files"][t]
        model = f"smollm2-{arg}"
        tm.lms("quantize", "smollm2", model, "--type", arg, store=store)
        out = os.path.join(base, model + ".gguf")
        tm.lms("export", model, out, store=store)
        r = gguf.GGUFReader(out)
        got = {x.name: (x.tensor_type.name, hashlib.sha256(np.ascontiguousarray(x.data).tobytes()).hexdigest())
               for x in r.tensors}
        want = {n: (v["type"], v["sha256"]) for n, v in fx["tensors"].items()}
        check(got == want, f"{t}: lmstore quantize gives llama-quantize's {len(want)} tensors byte for byte")
        os.remove(out)

        cands = fx["candidates"]
        for i in ref["greedy_prompts"][:1 if quick else 3]:
            c = cands[i]
            n = 8 if quick else len(c["ids"])
            res = json.loads(tm.lms("run", model, "--prompt-ids", ",".join(map(str, c["prompt_ids"])), "--temp", "0",
                                    "--max-tokens", str(n), "--ignore-eos", "--json", store=store).stdout)
            check(res["ids"] == c["ids"][:n], f"{t}: greedy {n} tokens of {c['prompt']!r} equal llama.cpp's"
                  + ("" if res["ids"] == c["ids"][:n] else f"\n  got  {res['ids']}\n  want {c['ids'][:n]}"))
        if quick:
            continue

        steps = agree = 0
        worst = []
        for c in cands:
            seq = c["prompt_ids"] + c["ids"][:-1]
            lg = os.path.join(base, "logits.f32")
            tm.lms("logits", model, "--prompt-ids", ",".join(map(str, seq)), "--all", "--out", lg, store=store)
            x = np.fromfile(lg, dtype="<f4").reshape(len(seq), -1)[len(c["prompt_ids"]) - 1:]
            for k, (want_id, m) in enumerate(zip(c["ids"], c["margins"])):
                if m < MARGIN:
                    continue
                steps += 1
                top = int(np.argmax(x[k]))
                agree += top == want_id
                if top != want_id:
                    worst.append(f"{c['prompt'][-24:]!r} step {k}: {top} vs {want_id} (llama.cpp margin {m})")
        check(agree == steps and steps >= 200,
              f"{t}: teacher-forced arg max equals llama.cpp's at {agree} of {steps} steps with margin >= {MARGIN}"
              + "".join("\n  " + w for w in worst[:8]))

        res = json.loads(tm.lms("perplexity", model, "--prompt-ids", ",".join(map(str, ref["ppl_ids"])), "--json",
                                store=store).stdout)
        rel = abs(res["ppl"] - fx["ppl"]) / fx["ppl"]
        rel1 = abs(res["ppl"] - fx["ppl_one_by_one"]) / fx["ppl_one_by_one"]
        check(min(rel, rel1) <= 0.005,
              f"{t}: perplexity {res['ppl']:.4f} vs llama.cpp {fx['ppl']:.4f} in batches of 512 (relative {rel:.2e}) "
              f"and {fx['ppl_one_by_one']:.4f} a token at a time (relative {rel1:.2e}) over {res['n_tokens']} tokens")

    shutil.rmtree(base, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
