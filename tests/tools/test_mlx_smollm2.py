#!/usr/bin/env python3
"""
tests/tools/test_mlx_smollm2.py - lmstore's engine against mlx-lm on the
README's default model quantized to MLX 4 bits (skipped, 77, when
tools/quickstart.sh has not fetched it). References from
tests/reference/make_mlx_fixtures.py (mlx 0.32 / mlx-lm 0.32 on the CPU):
  1. `lmstore quantize --type mlx4` (groups of 64) + `lmstore export` gives
     the tensors mlx_lm.convert saves, byte for byte (packed U32 codes,
     scales, biases, norms): the engines run the same model;
  2. the last position's logits for two prompts are mlx-lm's (computed in
     float32, as lmstore computes) within 1e-2 relative (max |a - b| over
     max |b|), with the same arg max.
"""

import hashlib
import json
import os
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import tinymodel as tm  # noqa: E402
from test_smollm2 import MODEL_DIR  # noqa: E402

FIX = os.path.join(tm.SRC, "tests", "fixtures", "mlx")


def st_digests(folder):
    """SHA-256 of every tensor's raw bytes in a folder's safetensors files."""
    out = {}
    for f in sorted(x for x in os.listdir(folder) if x.endswith(".safetensors")):
        with open(os.path.join(folder, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
            data = fh.read()
        for name, t in hdr.items():
            if name == "__metadata__":
                continue
            a, b = t["data_offsets"]
            out[name] = hashlib.sha256(data[a:b]).hexdigest()
    return out


def main():
    if not os.path.exists(os.path.join(MODEL_DIR, "model.safetensors")):
        print(f"skipped: {MODEL_DIR} not found (tools/quickstart.sh fetches it)")
        return 77
    with open(os.path.join(FIX, "smollm2-mlx4.json")) as f:
        ref = json.load(f)
    want = np.fromfile(os.path.join(FIX, "smollm2-mlx4-logits.f16"), dtype="<f2").astype(np.float32)
    want = want.reshape(len(ref["prompts"]), ref["n_vocab"])
    base = os.path.join(tm.TMP, "mlx-smollm2")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    store = os.path.join(base, "store")
    failures = 0

    def check(cond, what):
        nonlocal failures
        print(("ok   " if cond else "FAIL ") + what)
        failures += 0 if cond else 1

    tm.lms("import", MODEL_DIR, "--name", "smollm2", store=store)
    tm.lms("quantize", "smollm2", "smollm2-mlx4", "--type", "mlx4", store=store)
    out = os.path.join(base, "export")
    tm.lms("export", "smollm2-mlx4", out, store=store)
    got = st_digests(out)
    exp = {n: t["sha256"] for n, t in ref["tensors"].items()}
    diff = sorted(n for n in exp if got.get(n) != exp[n]) + sorted(n for n in got if n not in exp)
    check(not diff, f"lmstore quantize mlx4 gives mlx_lm.convert's {len(exp)} tensors byte for byte"
          + "".join("\n  differs: " + n for n in diff[:8]))

    for i, p in enumerate(ref["prompts"]):
        lg = os.path.join(base, "logits.f32")
        tm.lms("logits", "smollm2-mlx4", "--prompt-ids", ",".join(map(str, p)), "--out", lg, store=store)
        x = np.fromfile(lg, dtype="<f4")
        rel = float(np.max(np.abs(x - want[i])) / np.max(np.abs(want[i])))
        same = int(np.argmax(x)) == int(np.argmax(want[i]))
        check(rel <= 1e-2 and same, f"prompt {i}: last logits within {rel:.2e} of mlx-lm's (float32), arg max "
              f"{int(np.argmax(x))} vs {int(np.argmax(want[i]))}; mlx-lm's own bf16 compute is "
              f"{ref['bf16_vs_f32'][i]:.3f} away")
    # 3. the CUDA engine on the same codes
    probe = tm.lms("logits", "smollm2-mlx4", "--prompt-ids", ",".join(map(str, ref["prompts"][0])), "--out",
                   os.path.join(base, "probe.f32"), "--device", "cuda", store=store, check=False)
    if probe.returncode != 0 and ("cuda" in probe.stderr.lower()):  # no device, or a build without CUDA
        print("skipped: the CUDA part (" + probe.stderr.strip().splitlines()[-1] + ")")
    else:
        for i, p in enumerate(ref["prompts"]):
            lg = os.path.join(base, "logits-cuda.f32")
            tm.lms("logits", "smollm2-mlx4", "--prompt-ids", ",".join(map(str, p)), "--out", lg, "--device", "cuda",
                   store=store)
            x = np.fromfile(lg, dtype="<f4")
            rel = float(np.max(np.abs(x - want[i])) / np.max(np.abs(want[i])))
            same = int(np.argmax(x)) == int(np.argmax(want[i]))
            check(rel <= 1e-2 and same, f"cuda, prompt {i}: last logits within {rel:.2e} of mlx-lm's, arg max "
                  f"{int(np.argmax(x))} vs {int(np.argmax(want[i]))}")
        tm.lms("quantize", "smollm2", "smollm2-q8", "--type", "q8_0", store=store)
        r = tm.lms("logits", "smollm2-q8", "--prompt-ids", "1,2,3", "--out", os.path.join(base, "q8.f32"),
                   "--device", "cuda", store=store, check=False)
        check(r.returncode != 0 and "model.embed_tokens.weight" in r.stderr and "Q8_0" in r.stderr,
              "cuda: a Q8_0 model is refused naming its tensor: " + r.stderr.strip()[:200])
    shutil.rmtree(base, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
