#!/usr/bin/env python3
"""
tests/tools/test_llamacpp_quantize.py - `lmstore quantize` writes the bytes
llama-quantize writes. For the tiny random models of
tests/fixtures/llamacpp/quantize.json (made again here by tests/gen_model.py
with the recorded arguments: a tied Llama with rows of 320, not whole K
super-blocks, and a Qwen3), each tensor of `lmstore quantize` + `lmstore
export` must have the SHA-256 that llama-quantize's file has
(tests/reference/make_llamacpp_fixtures.py recorded them):
  - q8_0: every tensor;
  - q4_k_m: every tensor (Q4_K, Q6_K and their Q5_0 / Q8_0 fallbacks, F32 norms);
  - q4_0: every tensor llama-quantize made Q4_0 (it gives the LM head Q6_K).
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(__file__))
import tinymodel as tm  # noqa: E402

FIXTURE = os.path.join(tm.SRC, "tests", "fixtures", "llamacpp", "quantize.json")


def digests(path):
    r = gguf.GGUFReader(path)
    return {t.name: (t.tensor_type.name, hashlib.sha256(np.ascontiguousarray(t.data).tobytes()).hexdigest())
            for t in r.tensors}


def main():
    with open(FIXTURE) as f:
        ref = json.load(f)
    base = os.path.join(tm.TMP, "llamacpp-quantize")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    store = os.path.join(base, "store")
    failures = 0
    for m in ref["models"]:
        d = os.path.join(base, m["name"])
        subprocess.run([sys.executable, os.path.join(tm.SRC, "tests", "gen_model.py"), d, *m["gen_model_args"]],
                       check=True, capture_output=True)
        tm.lms("import", d, "--name", m["name"], store=store)
        for t, want in m["files"].items():
            q = f"{m['name']}-{t.lower()}"
            tm.lms("quantize", m["name"], q, "--type", t.lower(), store=store)
            out = os.path.join(base, q + ".gguf")
            tm.lms("export", q, out, store=store)
            got = digests(out)
            checked, bad = 0, []
            for name, w in want.items():
                if t == "Q4_0" and w["type"] != "Q4_0":
                    continue  # llama-quantize's own choice for this tensor (the LM head: Q6_K)
                checked += 1
                if got.get(name) != (w["type"], w["sha256"]):
                    bad.append(f"{name}: {got.get(name, ('missing',))[0]} vs llama-quantize's {w['type']}")
            ok = not bad and checked >= (len(want) // 2)
            failures += 0 if ok else 1
            print(("ok   " if ok else "FAIL ") + f"{m['name']} {t}: {checked - len(bad)} of {checked} tensors have "
                  f"llama-quantize's bytes" + "".join("\n  " + b for b in bad[:8]))
    shutil.rmtree(base, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
