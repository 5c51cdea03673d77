#!/usr/bin/env python3
"""
tests/store/test_quantize.py - `lmstore quantize`:
  - Q8_0, Q4_0 (and Q4_1, Q5_0, Q5_1) output equals gguf-py's quantize
    bytes for every matrix of a model of F32, F16 and BF16 tensors with odd
    row counts, row lengths of odd block counts, zero rows and extremes;
  - Q4_K: rows of whole super-blocks become Q4_K (dequantized within its
    step), the others Q5_0 equal to gguf-py's, as llama-quantize falls back;
  - MLX: each matrix becomes MLX_AFFINE with X.scales / X.biases (source
    dtype) and config.json "quantization"; dequantized within a step (the
    bytes equal mlx.core.quantize's: tests/quant/test_quant.c);
  - what is not quantized (norms, --keep-embeddings) shares the source's
    blobs; quantizing twice writes nothing; the model survives removing the
    source; verify finds no problem;
  - refusals (unknown source, taken name, bad type) leave the store unchanged.
"""
import json
import os
import sys

import numpy as np
import gguf
from gguf.quants import dequantize, quantize

sys.path.insert(0, os.path.dirname(__file__))
import storeutil as su  # noqa: E402

T = gguf.GGMLQuantizationType


def bf16_bits(a):
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def make_model(d):
    """An HF folder: matrices of several dtypes and shapes, plus norms; returns {name: float32 values}."""
    rng = np.random.default_rng(3)
    os.makedirs(d, exist_ok=True)
    spec = [("model.embed_tokens.weight", (41, 256), "BF16"),
            ("model.layers.0.input_layernorm.weight", (256,), "F32"),
            ("model.layers.0.self_attn.q_proj.weight", (7, 256), "F32"),
            ("model.layers.0.self_attn.k_proj.weight", (5, 96), "F16"),
            ("model.layers.0.mlp.up_proj.weight", (9, 224), "BF16"),
            ("model.layers.0.mlp.down_proj.weight", (3, 512), "F32"),
            ("model.layers.0.mlp.gate_proj.weight", (4, 40), "F32"),  # 40: no whole block
            ("model.norm.weight", (256,), "F32"),
            ("lm_head.weight", (41, 256), "F16")]
    header, data, vals = {}, b"", {}
    for name, shape, dt in spec:
        a = (rng.standard_normal(shape) * rng.choice([0.01, 1.0, 30.0])).astype(np.float32)
        if len(shape) == 2 and shape[0] > 3:
            a[1] = 0.0              # a zero row
            a[2, :32] = 3.0e4 * np.sign(a[2, :32])  # extremes
        if dt == "BF16":
            raw = bf16_bits(a).tobytes()
            a = (bf16_bits(a).astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            a = a.astype(np.float16)
            raw = a.tobytes()
            a = a.astype(np.float32)
        else:
            raw = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
        vals[name] = a
    su.write(os.path.join(d, "model.safetensors"), su.st_bytes(header, data))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256}, f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "</s>"}, f)
    return vals


def info(store, name):
    _, out, _ = su.lms("info", name, "--json", "--store", store, check=0)
    return {t["name"]: t for t in json.loads(out)["tensors"]}, json.loads(out)


def blob(store, t):
    return su.segment_bytes(store, t["segment"], t["offset"], t["nbytes"])


BASE = su.scratch("quantize")
STORE = os.path.join(BASE, "store")
VALS = make_model(os.path.join(BASE, "src"))
su.lms("import", os.path.join(BASE, "src"), "--name", "src", "--store", STORE, check=0)
SRC, _ = info(STORE, "src")


def test_gguf_types_equal_gguf_py_bytes_and_the_rest_is_shared():
    for typ in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1"):
        qt = T[typ.upper()]
        _, out, _ = su.lms("quantize", "src", f"m-{typ}", "--type", typ, "--store", STORE, check=0)
        got, _ = info(STORE, f"m-{typ}")
        assert set(got) == set(SRC)
        for name, v in VALS.items():
            t = got[name]
            if v.ndim == 2 and v.shape[1] % 32 == 0:
                assert t["dtype"] == qt.name, (name, t["dtype"])
                want = np.asarray(quantize(v, qt), np.uint8).tobytes()
                assert blob(STORE, t) == want, f"{typ} {name}: bytes differ from gguf-py"
            else:  # vectors and rows of partial blocks stay shared
                assert t["hash"] == SRC[name]["hash"] and t["dtype"] == SRC[name]["dtype"], name
    _, out, _ = su.lms("quantize", "src", "again", "--type", "q8_0", "--store", STORE, check=0)
    assert "(0.00 MB written" in out, out
    assert info(STORE, "again")[1]["id"] == info(STORE, "m-q8_0")[1]["id"]


def test_keep_embeddings_shares_them():
    su.lms("quantize", "src", "m-keep", "--type", "q4_0", "--keep-embeddings", "--store", STORE, check=0)
    got, _ = info(STORE, "m-keep")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert got[name]["hash"] == SRC[name]["hash"], name
    assert got["model.layers.0.self_attn.q_proj.weight"]["dtype"] == "Q4_0"


def test_q4_k_and_its_q5_0_fallback():
    su.lms("quantize", "src", "m-q4k", "--type", "q4_k", "--store", STORE, check=0)
    got, _ = info(STORE, "m-q4k")
    for name, v in VALS.items():
        if v.ndim != 2 or v.shape[1] % 32:
            continue
        t = got[name]
        raw = np.frombuffer(blob(STORE, t), np.uint8).reshape(v.shape[0], -1)
        if v.shape[1] % 256 == 0:
            assert t["dtype"] == "Q4_K", name
            y = dequantize(raw, T.Q4_K)
            span = v.max(axis=1, keepdims=True) - np.minimum(v.min(axis=1, keepdims=True), 0)
            assert np.all(np.abs(y - v) <= span / 12 + 1e-6), name
        else:
            assert t["dtype"] == "Q5_0", name
            assert raw.tobytes() == np.asarray(quantize(v, T.Q5_0), np.uint8).tobytes(), name


def test_mlx_layout_config_and_values():
    su.lms("quantize", "src", "m-mlx4", "--type", "mlx4", "--group-size", "32", "--store", STORE, check=0)
    got, _ = info(STORE, "m-mlx4")
    _, cfg, _ = su.lms("cat", "m-mlx4", "config.json", "--store", STORE, check=0)
    cfg = json.loads(cfg)
    assert cfg["quantization"] == {"group_size": 32, "bits": 4} and cfg["hidden_size"] == 256, cfg
    n = 0
    for name, v in VALS.items():
        if v.ndim != 2 or v.shape[1] % 32:
            assert got[name]["hash"] == SRC[name]["hash"], name
            continue
        n += 1
        t = got[name]
        p = name[:-len("weight")]
        s, b = got[p + "scales"], got[p + "biases"]
        assert t["dtype"] == "MLX_AFFINE" and t["bits"] == 4 and t["group_size"] == 32 and t["shape"] == list(v.shape)
        # one scales dtype for the model (mlx-lm's): the first quantized matrix's, BF16 here
        assert s["shape"] == [v.shape[0], v.shape[1] // 32] and s["dtype"] == b["dtype"] == "BF16", (s, b)
        codes = np.unpackbits(np.frombuffer(blob(STORE, t), np.uint8), bitorder="little").reshape(-1, 4)
        q = (codes * (1 << np.arange(4))).sum(1).reshape(v.shape[0], -1, 32).astype(np.float32)

        def bf16(raw):
            return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        sc = bf16(blob(STORE, s)).reshape(v.shape[0], -1, 1)
        bi = bf16(blob(STORE, b)).reshape(v.shape[0], -1, 1)
        y = (sc * q + bi).reshape(v.shape)
        # a step (mlx's affine quantization moves the scale so that the end of larger
        # magnitude is exact, which can push the other end one step out, as here for
        # groups of +-3e4), plus the bf16 rounding of scale and bias
        tol = np.repeat((np.abs(sc) * (1 + 16 / 256) + np.abs(bi) / 256)[..., 0], 32, axis=1)
        assert np.all(np.abs(y - v) <= tol + 1e-6), name
    assert n == 6


def test_survives_removing_the_source_and_verifies():
    su.lms("quantize", "src", "m-alone", "--type", "q8_0", "--store", STORE, check=0)
    before = {k: blob(STORE, t) for k, t in info(STORE, "m-alone")[0].items()}
    su.lms("rm", "src", "--store", STORE, check=0)
    su.lms("gc", "--store", STORE, check=0)
    after = {k: blob(STORE, t) for k, t in info(STORE, "m-alone")[0].items()}
    assert before == after
    rc, out, err = su.lms("verify", "--store", STORE)
    assert rc == 0 and " 0 problems" in out, out + err
    su.lms("import", os.path.join(BASE, "src"), "--name", "src", "--store", STORE, check=0)


def test_refusals_leave_the_store_unchanged():
    before = su.tree_digest(STORE)
    for args, frag in ((("nosuch", "x", "--type", "q8_0"), "nosuch"),
                       (("src", "m-q8_0", "--type", "q8_0"), "already exists"),
                       (("src", "x", "--type", "q3_k"), "--type"),
                       (("src", "x", "--type", "mlx4", "--group-size", "48"), "--group-size")):
        rc, _, err = su.lms("quantize", *args, "--store", STORE)
        assert rc in (1, 2) and frag in err, (args, rc, err)
        assert su.tree_digest(STORE) == before, args


if __name__ == "__main__":
    su.run_tests(globals())
