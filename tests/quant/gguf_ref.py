#!/usr/bin/env python3
"""
tests/quant/gguf_ref.py - reference data for tests/quant/test_quant.c from
gguf-py (PyPI `gguf`), the numpy (de)quantizers we did not write.

  python3 tests/quant/gguf_ref.py OUTDIR

For each GGUF type gguf-py dequantizes, OUTDIR/TYPE.deq.in holds random
blocks (every byte random except the f16 scales, which are random finite
halves, subnormals, zeros and negative zeros included) and TYPE.deq.out the
float32 values gguf.quants.dequantize gives for them. For each type it
quantizes, TYPE.q.in holds float32 rows (random values of many magnitudes,
blocks of +0 and of -0, constant blocks, values whose scale overflows f16,
subnormals) and TYPE.q.out the bytes gguf.quants.quantize writes. (Not a
block mixing -0 and +0 as its minimum: numpy's min picks either sign
depending on its SIMD lanes, where ggml and quant/ take the first zero; the
value stored, m = -0 or +0, dequantizes the same.)
Exit status 3 when the gguf package is missing.
"""
import os
import sys

import numpy as np

try:
    import gguf
    from gguf.quants import dequantize, quantize
except ImportError:
    sys.exit(3)

T = gguf.GGMLQuantizationType
DEQ = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
QUANT = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
# byte offsets of the f16 scale fields inside one block
HALVES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
          "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_halves(rng, n):
    h = rng.standard_normal(n).astype(np.float16)
    kind = rng.integers(0, 10, n)
    h[kind == 0] = np.float16(0.0)
    h[kind == 1] = np.float16(-0.0)
    h[kind == 2] = (rng.integers(1, 1024, (kind == 2).sum()).astype(np.uint16)).view(np.float16)  # subnormal
    h[kind == 3] = np.float16(65504.0) * np.sign(rng.standard_normal((kind == 3).sum())).astype(np.float16)
    return h


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(16)
    for name in DEQ:
        qt = T[name]
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        nb = 203
        blocks = rng.integers(0, 256, (nb, ts), dtype=np.uint8)
        for off in HALVES[name]:
            blocks[:, off:off + 2] = random_halves(rng, nb).view(np.uint8).reshape(nb, 2)
        vals = dequantize(blocks.reshape(1, -1), qt).astype(np.float32)
        assert vals.size == nb * bs
        blocks.tofile(os.path.join(out, name + ".deq.in"))
        vals.tofile(os.path.join(out, name + ".deq.out"))
    for name in QUANT:
        qt = T[name]
        rows = []
        for n_blocks in (1, 3, 7, 9, 128):
            for scale in (1e-3, 1.0, 40.0):
                rows.append((rng.standard_normal(32 * n_blocks) * scale).astype(np.float32))
        edge = np.concatenate([
            np.zeros(32, np.float32),                        # +0 block
            -np.zeros(32, np.float32),                       # -0 block
            np.full(32, 3.25, np.float32),                   # constant
            np.full(32, -7.0, np.float32),
            np.linspace(-1e6, 1e6, 32).astype(np.float32),    # scale overflows f16
            (rng.standard_normal(32) * 1e-39).astype(np.float32),  # subnormal inputs
            np.array([3e38, -3e38] + [1.0] * 30, np.float32),  # float32 extremes
            np.array([0.5, -0.5] * 16, np.float32),            # exact halves
        ])
        rows.append(edge)
        x = np.concatenate(rows)
        with np.errstate(all="ignore"):
            q = quantize(x.reshape(1, -1), qt)
        x.tofile(os.path.join(out, name + ".q.in"))
        np.asarray(q, dtype=np.uint8).tofile(os.path.join(out, name + ".q.out"))


if __name__ == "__main__":
    main()
