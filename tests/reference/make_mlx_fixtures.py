#!/usr/bin/env python3
"""
tests/reference/make_mlx_fixtures.py - reference data from mlx-lm (PyPI mlx
and mlx-lm, the CPU backend on Linux; we did not write them) for lmstore's
MLX-quantized models.

  python3 tests/reference/make_mlx_fixtures.py [--model-dir models/smollm2-135m-instruct]
          [--out tests/fixtures/mlx] [--work DIR]

1. mlx_lm.convert quantizes the README's default model (MODEL_DIR, as
   tools/quickstart.sh converts it) to 4 bits in groups of 64, mlx-lm's
   defaults; OUT/smollm2-mlx4.json records the SHA-256 of every tensor it
   saved (packed U32 weights, scales, biases, norms), so the test can prove
   that `lmstore quantize --type mlx4` + export made the same model.
2. For PROMPTS (token ids), the last position's logits of mlx_lm's model
   are written to OUT/smollm2-mlx4-logits.f16 (n_vocab float16 values per
   prompt), computed in float32 (model.set_dtype(mx.float32): the bf16
   scales and biases widen exactly, the codes are unchanged), as lmstore
   computes. The JSON also records how far mlx-lm's default bf16 compute is
   from its own float32 result (bf16_vs_f32): bf16 activations move the
   logits of this model by more than the tolerance the test uses.
"""

import argparse
import hashlib
import json
import os
import shutil

import numpy as np
import mlx.core as mx
from mlx_lm import convert, load

PROMPTS = [
    # ChatML "What is the capital of France?" with SmolLM2's default system message
    [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2,
     198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198],
    # "The Moon is Earth's only natural satellite. It orbits at an average distance of"
    None,
]


def main():
    src = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", default=os.path.join(src, "models", "smollm2-135m-instruct"))
    ap.add_argument("--out", default=os.path.join(src, "tests", "fixtures", "mlx"))
    ap.add_argument("--work", default="/tmp/lms-mlx-fixtures")
    a = ap.parse_args()
    mx.set_default_device(mx.cpu)
    path = os.path.join(a.work, "smollm2-mlx4")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(a.work, exist_ok=True)
    convert(a.model_dir, mlx_path=path, quantize=True, q_group_size=64, q_bits=4)
    tensors = {}
    for f in sorted(x for x in os.listdir(path) if x.endswith(".safetensors")):
        for name, arr in mx.load(os.path.join(path, f)).items():
            raw = np.array(arr.view(mx.uint16) if arr.dtype == mx.bfloat16 else arr)
            tensors[name] = {"dtype": str(arr.dtype).split(".")[-1], "shape": list(arr.shape),
                             "sha256": hashlib.sha256(np.ascontiguousarray(raw).tobytes()).hexdigest()}
    model, tok = load(path)
    prompts = [p if p is not None else
               tok.encode("The Moon is Earth's only natural satellite. It orbits at an average distance of",
                          add_special_tokens=False) for p in PROMPTS]
    bf16 = [np.array(model(mx.array([p]))[0, -1].astype(mx.float32)) for p in prompts]
    model.set_dtype(mx.float32)
    f32 = [np.array(model(mx.array([p]))[0, -1].astype(mx.float32)) for p in prompts]
    os.makedirs(a.out, exist_ok=True)
    np.concatenate(f32).astype("<f2").tofile(os.path.join(a.out, "smollm2-mlx4-logits.f16"))
    import mlx_lm
    info = {
        "mlx": f"mlx {mx.__version__}, mlx-lm {mlx_lm.__version__} (CPU)",
        "convert": {"q_bits": 4, "q_group_size": 64},
        "prompts": prompts,
        "n_vocab": int(f32[0].shape[0]),
        "top5_f32": [np.argsort(-x)[:5].tolist() for x in f32],
        "bf16_vs_f32": [float(np.max(np.abs(b - f)) / np.max(np.abs(f))) for b, f in zip(bf16, f32)],
        "tensors": tensors,
    }
    with open(os.path.join(a.out, "smollm2-mlx4.json"), "w") as f:
        tens = info.pop("tensors")
        txt = json.dumps(info, indent=1)[:-2]  # one line per tensor below
        f.write(txt + ',\n "tensors": {\n' + ",\n".join(f"  {json.dumps(n)}: {json.dumps(v)}"
                                                          for n, v in sorted(tens.items())) + "\n }\n}\n")
    print(f"{len(tensors)} tensors; mlx-lm bf16 vs float32 logits: "
          + ", ".join(f"{x:.3f}" for x in info["bf16_vs_f32"]))


if __name__ == "__main__":
    main()
