#!/usr/bin/env python3
"""
tests/tools/test_batch_smollm2.py - the batched engine on the real
SmolLM2-135M-Instruct (models/smollm2-135m-instruct in the source tree):
16 concurrent greedy requests, F32 K/V, each return exactly the ids
lms_generate returns for the same prompt alone (`lmstore bench batch
--check`, which fails on any difference). Skipped when the model is absent.
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(__file__))
import tinymodel as tm  # noqa: E402

MODEL_DIR = os.path.join(tm.SRC, "models", "smollm2-135m-instruct")


def main():
    if not os.path.exists(os.path.join(MODEL_DIR, "model.safetensors")):
        print(f"skipped: {MODEL_DIR} not found (tools/quickstart.sh fetches it)")
        return 77
    base = os.path.join(tm.TMP, "batch-smollm2")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    store = os.path.join(base, "store")
    # ids exact against lms_generate with f32 products (see tests/engine/test_batch.c)
    os.environ["LMSTORE_BF16_ACT"] = "0"
    tm.lms("import", MODEL_DIR, "--name", "smollm2", store=store)
    # the sanitized build is ~20x slower: fewer tokens, same check
    par, gen = ("4", "6") if tm.sanitized_build() else ("16", "24")
    r = tm.lms("bench", "batch", "smollm2", "--parallel", par, "--prompt", "21", "--gen", gen, "--threads", "2",
               "--reps", "1", "--kv-dtype", "f32", "--check", "--json", store=store, check=False)
    print(r.stdout, r.stderr)
    failures = 0
    if r.returncode != 0:
        print("FAIL bench batch --check exited", r.returncode)
        failures += 1
    else:
        res = json.loads(r.stdout)[0]
        ok = res["checked"] and res["mismatches"] == 0 and res["parallel"] == int(par)
        print(("ok   " if ok else "FAIL ") + f"{par} concurrent greedy requests equal lms_generate alone")
        failures += 0 if ok else 1
    shutil.rmtree(base, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
