#!/usr/bin/env python3
"""
tests/reference/make_quant_fixtures.py - MLX affine reference data for
tests/quant/test_quant.c, made by mlx.core.quantize / mlx.core.dequantize
(PyPI `mlx`, whose CPU backend runs on Linux), which we did not write.

  pip install 'mlx[cpu]' numpy
  python3 tests/reference/make_quant_fixtures.py [OUT]   (default tests/fixtures/quant/mlx_affine.bin)

It also writes tests/fixtures/quant/mlx-llama/: the engine's tiny random
Llama (tests/fixtures/engine/llama) quantized the way mlx-lm saves
mlx-community models: every projection and the embedding 4-bit in groups of
32 (mx.quantize), layer 0's down_proj 8-bit (a per-layer override in
config.json's "quantization"), norms kept, safetensors written by
mx.save_safetensors with {"format": "mlx"}.

The file is a list of cases, all little-endian:
  "MLXQ", u32 bits, u32 group, u32 dtype (lms_dtype code: 5 F16, 6 BF16,
  9 F32), u32 rows, u32 cols,
  f32 w[rows*cols]                 the input (values exact in dtype)
  u8  codes[rows*cols*bits/8]      mx.quantize's packed weight (uint32 words)
  scales[rows*cols/group], biases[rows*cols/group]   in dtype
  deq[rows*cols]                   mx.dequantize's output, in dtype
for bits 2, 3, 4, 5, 6, 8, group sizes 32, 64, 128 and dtypes f32, bf16,
f16. Each case's rows: random normals of two magnitudes, a row with a zero
group and a constant group, a row of extremes, and mixed signs.
"""
import os
import struct
import sys

import numpy as np
import mlx.core as mx

DTYPES = [(9, mx.float32), (6, mx.bfloat16), (5, mx.float16)]


def rows_for(rng, cols):
    r = [rng.standard_normal(cols) * 0.02, rng.standard_normal(cols) * 3.0]
    z = rng.standard_normal(cols)
    z[:32] = 0.0
    z[32:64] = 1.5
    r.append(z)
    e = rng.standard_normal(cols) * 1e-3
    e[::7] = 6e4
    e[3::11] = -6e4
    r.append(e)
    m = np.abs(rng.standard_normal(cols)) + 0.25
    m[1::2] *= -1
    r.append(m)
    return np.stack(r).astype(np.float32)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "fixtures", "quant", "mlx_affine.bin")
    rng = np.random.default_rng(16)
    cols = 128
    with mx.stream(mx.cpu), open(out, "wb") as f:
        for bits in (2, 3, 4, 5, 6, 8):
            for group in (32, 64, 128):
                for code, dt in DTYPES:
                    w = mx.array(rows_for(rng, cols)).astype(dt)
                    wq, s, b = mx.quantize(w, group, bits)
                    d = mx.dequantize(wq, s, b, group, bits)
                    wf = np.array(w.astype(mx.float32))
                    rows = wf.shape[0]
                    f.write(b"MLXQ" + struct.pack("<5I", bits, group, code, rows, cols))
                    f.write(wf.astype("<f4").tobytes())
                    f.write(np.array(wq).astype("<u4").tobytes())
                    for a in (s, b, d):
                        if code == 9:
                            f.write(np.array(a).astype("<f4").tobytes())
                        elif code == 5:
                            f.write(np.array(a).astype("<f2").tobytes())
                        else:  # bf16: the high half of the float32
                            u = np.array(a.astype(mx.float32)).view(np.uint32) >> 16
                            f.write(u.astype("<u2").tobytes())
    print(out, os.path.getsize(out), "bytes")
    write_mlx_llama(os.path.join(os.path.dirname(out), "mlx-llama"))


def write_mlx_llama(out):
    import json
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "engine", "llama")
    w = mx.load(os.path.join(src, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    q = {"group_size": 32, "bits": 4, "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8}}
    outw = {}
    for name, a in w.items():
        prefix = name[:-len(".weight")] if name.endswith(".weight") else None
        if prefix and a.ndim == 2:
            o = q.get(prefix, q)
            wq, s, b = mx.quantize(a, o["group_size"], o["bits"])
            outw[prefix + ".weight"], outw[prefix + ".scales"], outw[prefix + ".biases"] = wq, s, b
        else:
            outw[name] = a
    os.makedirs(out, exist_ok=True)
    mx.save_safetensors(os.path.join(out, "model.safetensors"), outw, metadata={"format": "mlx"})
    cfg["quantization"] = q
    cfg["quantization_config"] = q
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(out, sorted(os.listdir(out)))


if __name__ == "__main__":
    main()
