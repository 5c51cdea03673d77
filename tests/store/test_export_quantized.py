#!/usr/bin/env python3
"""
tests/store/test_export_quantized.py - `lmstore export` of quantized models:
  - GGUF import -> GGUF export: gguf-py reads the file; every tensor has its
    original name, type and bytes (llama Q/K rows back in rotary order), and
    the metadata lmstore writes (hyperparameters, vocabulary, token types,
    merges, special ids, chat template) equals the original's; also for the
    real default model when tools/quickstart.sh fetched it;
  - HF model -> quantize q8_0 -> GGUF: gguf-py reads the tensors lmstore
    quantized; Llama 3 RoPE scaling becomes rope_freqs.weight with HF's
    factors; importing the file again stores only rope_freqs anew (the
    quantized tensors are the same bytes) and gives back llama3 rope_scaling;
  - MLX: the mlx-community fixture exports byte for byte (U32 packed
    weights, scales, biases, config) and imports again as the same model;
  - refusals: GGUF block types to safetensors, MLX to GGUF, an existing path.
"""
import glob
import json
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import ggufutil as gu  # noqa: E402
import storeutil as su  # noqa: E402

BASE = su.scratch("export-quantized")
STORE = os.path.join(BASE, "store")
KEYS = ("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
        "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon")
TOK_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
            "tokenizer.chat_template", "tokenizer.ggml.add_bos_token")


def compare_gguf(orig, out, arch):
    a, b = gguf.GGUFReader(orig), gguf.GGUFReader(out)
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    assert set(ta) == set(tb), set(ta) ^ set(tb)
    for n in ta:
        assert ta[n].tensor_type == tb[n].tensor_type, n
        assert np.array_equal(np.asarray(ta[n].data), np.asarray(tb[n].data)), f"{n}: bytes differ"
    for k in [f"{arch}.{x}" for x in KEYS] + list(TOK_KEYS) + ["general.architecture"]:
        if k in a.fields:
            va, vb = a.fields[k].contents(), b.fields[k].contents()
            assert va == vb or (isinstance(va, float) and abs(va - vb) <= 1e-6 * abs(va)), (k, str(va)[:60], str(vb)[:60])


def test_gguf_round_trip():
    tok = gu.train_tokenizer()
    types = {"blk.0.attn_q.weight": gu.T.Q4_K, "blk.0.attn_k.weight": gu.T.Q6_K, "blk.1.attn_q.weight": gu.T.Q4_0,
             "blk.1.ffn_down.weight": gu.T.Q5_K, "blk.0.ffn_up.weight": gu.T.BF16}
    for arch, kv in (("llama", 2), ("qwen2", 2), ("qwen3", 4)):
        src = os.path.join(BASE, f"{arch}.gguf")
        gu.tiny_model(src, arch=arch, tok=tok, types=types, kv=kv, add_bos=arch == "llama")
        su.lms("import", src, "--name", arch, "--store", STORE, check=0)
        out = os.path.join(BASE, f"{arch}-out.gguf")
        su.lms("export", arch, out, "--store", STORE, check=0)
        compare_gguf(src, out, arch)
    cache = sorted(glob.glob(os.path.join(su.SRC, "models", ".cache", "SmolLM2-135M-Instruct*.gguf")))
    if cache:
        su.lms("import", cache[0], "--name", "smol", "--store", STORE, check=0)
        out = os.path.join(BASE, "smol.gguf")
        su.lms("export", "smol", out, "--store", STORE, check=0)
        compare_gguf(cache[0], out, "llama")
    else:
        print("     (default model not fetched: its round trip not run)")


def test_quantized_hf_model_to_gguf():
    import tinymodel as tm
    src = os.path.join(BASE, "hf-llama")
    tm.make_model_dir(src)
    su.lms("import", src, "--name", "hf", "--store", STORE, check=0)
    su.lms("quantize", "hf", "hf-q8", "--type", "q8_0", "--store", STORE, check=0)
    out = os.path.join(BASE, "hf-q8.gguf")
    su.lms("export", "hf-q8", out, "--store", STORE, check=0)
    r = gguf.GGUFReader(out)
    _, inf, _ = su.lms("info", "hf-q8", "--json", "--store", STORE, check=0)
    stored = {t["name"]: t for t in json.loads(inf)["tensors"]}
    cfg = json.load(open(os.path.join(src, "config.json")))
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    by = {t.name: t for t in r.tensors}
    q = by["blk.0.attn_q.weight"]
    assert q.tensor_type == gu.T.Q8_0
    raw = np.frombuffer(su.segment_bytes(STORE, stored["model.layers.0.self_attn.q_proj.weight"]["segment"],
                                         stored["model.layers.0.self_attn.q_proj.weight"]["offset"],
                                         stored["model.layers.0.self_attn.q_proj.weight"]["nbytes"]), np.uint8)
    rows = cfg["hidden_size"]
    gg = np.asarray(q.data).reshape(rows, -1)
    assert np.array_equal(gu.unpermute_rows(gg, heads), raw.reshape(rows, -1)), "Q rows not in rotary order"
    k = by["blk.1.attn_k.weight"]
    assert k.tensor_type == gu.T.Q8_0 and np.asarray(k.data).shape[0] == kv * cfg["head_dim"]
    assert r.fields["llama.block_count"].contents() == cfg["num_hidden_layers"]
    # Llama 3 rope scaling -> rope_freqs, HF's factors
    rp = cfg["rope_parameters"]
    hd, theta = cfg["head_dim"], rp["rope_theta"]
    want = []
    for i in range(hd // 2):
        wl = 2 * np.pi * theta ** (2 * i / hd)
        lo, hi, f, o = rp["low_freq_factor"], rp["high_freq_factor"], rp["factor"], rp["original_max_position_embeddings"]
        if wl < o / hi:
            want.append(1.0)
        elif wl > o / lo:
            want.append(f)
        else:
            s = (o / wl - lo) / (hi - lo)
            want.append(1 / ((1 - s) / f + s))
    assert np.allclose(np.asarray(by["rope_freqs.weight"].data), want, rtol=1e-6), "rope_freqs"
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    hf_vocab = json.load(open(os.path.join(src, "tokenizer.json")))["model"]["vocab"]
    assert all(tokens[i] == t for t, i in hf_vocab.items())
    # vectors go out as F32 (what llama.cpp's CPU backend multiplies by), same values
    for t in r.tensors:
        n = gu.hf_name(t.name)
        if len(t.shape) == 1 and n in stored:
            assert t.tensor_type == gu.T.F32, f"{t.name}: vector exported as {t.tensor_type.name}"
            st = stored[n]
            v = np.frombuffer(su.segment_bytes(STORE, st["segment"], st["offset"], st["nbytes"]), "<u2")
            want = (v.astype(np.uint32) << 16).view(np.float32) if st["dtype"] == "BF16" else \
                v.view(np.float16).astype(np.float32)
            assert np.array_equal(np.asarray(t.data), want), f"{t.name}: values changed"
    # the file imports back onto the same matrix bytes; rope_freqs (which the HF
    # model did not have) and the widened vectors are new
    su.lms("import", out, "--name", "back", "--store", STORE, check=0)
    _, infb, _ = su.lms("info", "back", "--json", "--store", STORE, check=0)
    back = {t["name"]: t for t in json.loads(infb)["tensors"]}
    for n, t in stored.items():
        if len(t["shape"]) == 2:
            assert back[n]["hash"] == t["hash"], f"{n}: matrix bytes changed on the way back"
        else:
            assert back[n]["dtype"] == "F32", n
    _, cfgb, _ = su.lms("cat", "back", "config.json", "--store", STORE, check=0)
    rs = json.loads(cfgb)["rope_scaling"]
    assert rs["rope_type"] == "llama3" and rs["factor"] == rp["factor"], rs


def test_mlx_export_is_the_mlx_layout():
    fix = os.path.join(su.SRC, "tests", "fixtures", "quant", "mlx-llama")
    su.lms("import", fix, "--name", "mlx", "--store", STORE, check=0)
    out = os.path.join(BASE, "mlx-out")
    su.lms("export", "mlx", out, "--store", STORE, check=0)
    a = su.read_safetensors_raw(os.path.join(fix, "model.safetensors"))
    b = su.read_safetensors_raw(os.path.join(out, "model.safetensors"))
    assert a == b, "MLX tensors differ after export"
    assert json.load(open(os.path.join(fix, "config.json"))) == json.load(open(os.path.join(out, "config.json")))
    su.lms("import", out, "--name", "mlx-back", "--store", STORE, check=0)
    ids = [json.loads(su.lms("info", n, "--json", "--store", STORE, check=0)[1])["id"] for n in ("mlx", "mlx-back")]
    assert ids[0] == ids[1], ids
    # an lmstore-quantized MLX model exports as U32 packed weights
    su.lms("quantize", "hf", "hf-mlx8", "--type", "mlx8", "--group-size", "32", "--store", STORE, check=0)
    out = os.path.join(BASE, "hf-mlx8")
    su.lms("export", "hf-mlx8", out, "--store", STORE, check=0)
    t = su.read_safetensors_raw(os.path.join(out, "model.safetensors"))
    dt, shape, _ = t["model.layers.0.self_attn.q_proj.weight"]
    assert dt == "U32" and shape == [64, 64 * 8 // 32], (dt, shape)
    assert json.load(open(os.path.join(out, "config.json")))["quantization"] == {"group_size": 32, "bits": 8}


def test_refusals():
    rc, _, err = su.lms("export", "llama", os.path.join(BASE, "no-dir"), "--store", STORE)
    assert rc == 1 and "GGUF" in err and not os.path.exists(os.path.join(BASE, "no-dir")), err
    rc, _, err = su.lms("export", "mlx", os.path.join(BASE, "no.gguf"), "--store", STORE)
    assert rc == 1 and "MLX" in err and not os.path.exists(os.path.join(BASE, "no.gguf")), err
    rc, _, err = su.lms("export", "llama", os.path.join(BASE, "llama.gguf"), "--store", STORE)
    assert rc == 1 and "exists" in err, err


if __name__ == "__main__":
    su.run_tests(globals())
