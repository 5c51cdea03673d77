#!/usr/bin/env python3
"""
tests/tools/test_gguf_to_hf.py - the pieces of tools/gguf_to_hf.py that
decide whether a converted model is right, without the `gguf` package:
  - un-permuting Q/K rows inverts llama.cpp's rotary permutation (written
    here from its definition: reshape (heads, 2, D/2), swap the two middle
    axes), and puts GGUF's interleaved pair (2i, 2i+1) back at HF rows
    (i, i + D/2);
  - float32 -> bf16 rounds to nearest, ties to even, checked against a
    rounding computed independently from the two bf16 neighbours;
  - the rebuilt tokenizer.json (two Split steps + ByteLevel without regex)
    tokenizes exactly like HF's own Digits(individual_digits) +
    ByteLevel(use_regex) pipeline, on a seeded random corpus, with a
    vocabulary and merges given as GGUF metadata; control tokens become
    special added tokens; bad merges are rejected.
(The whole conversion of the real model is checked against transformers'
GGUF reader by tests/reference/make_smollm2_reference.py.)
"""

import importlib.util
import os
import random
import sys
import traceback

import numpy as np
from tokenizers import Tokenizer, pre_tokenizers

sys.path.insert(0, os.path.dirname(__file__))
import tinymodel as tm  # noqa: E402

spec = importlib.util.spec_from_file_location("gguf_to_hf", os.path.join(tm.SRC, "tools", "gguf_to_hf.py"))
g2h = importlib.util.module_from_spec(spec)
spec.loader.exec_module(g2h)


def llamacpp_permute(w, n_head):
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_inverts_the_rotary_permutation():
    rng = np.random.default_rng(1)
    for heads, dim, cols in ((9, 64, 576), (3, 64, 576), (4, 16, 8), (1, 2, 3)):
        hf = rng.standard_normal((heads * dim, cols)).astype(np.float32)
        gg = llamacpp_permute(hf, heads)
        assert not np.array_equal(gg, hf) or dim == 2
        assert np.array_equal(g2h.unpermute_rotary(gg, heads), hf)
        # meaning: GGUF rows 2i, 2i+1 of head h are HF rows i, i + D/2
        h, i = heads - 1, dim // 2 - 1
        assert np.array_equal(gg[h * dim + 2 * i], hf[h * dim + i])
        assert np.array_equal(gg[h * dim + 2 * i + 1], hf[h * dim + dim // 2 + i])
    try:
        g2h.unpermute_rotary(np.zeros((10, 4), np.float32), 3)
        raise AssertionError("uneven heads accepted")
    except g2h.ConvertError:
        pass


def bf16_reference(x):
    """Nearest bf16 (ties to even) by comparing the two neighbours."""
    out = []
    for v in np.asarray(x, dtype=np.float32):
        u = int(np.array(v, dtype=np.float32).view(np.uint32))
        lo = u & 0xFFFF0000
        hi = (lo + 0x10000) & 0xFFFFFFFF
        flo = float(np.array(lo, dtype=np.uint32).view(np.float32))
        fhi = float(np.array(hi, dtype=np.uint32).view(np.float32))
        dlo, dhi = abs(float(v) - flo), abs(fhi - float(v))
        if dlo < dhi or (dlo == dhi and ((lo >> 16) & 1) == 0):
            out.append(lo >> 16)
        else:
            out.append(hi >> 16)
    return np.array(out, dtype=np.uint16)


def test_bf16_rounds_to_nearest_even():
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.standard_normal(4000).astype(np.float32) * 10,
                        np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, 3.0e38, -1e-40], np.float32)])
    # exact ties: bit 15 set, lower bits zero
    ties = ((rng.standard_normal(200).astype(np.float32).view(np.uint32) & 0xFFFF0000) | 0x8000).view(np.float32)
    x = np.concatenate([x, ties])
    assert np.array_equal(g2h.f32_to_bf16_bits(x), bf16_reference(x))
    try:
        g2h.f32_to_bf16_bits(np.array([1.0, np.nan], np.float32))
        raise AssertionError("NaN accepted")
    except g2h.ConvertError:
        pass


class Field:
    def __init__(self, v):
        self.v = v

    def contents(self):
        return self.v


class FakeReader:
    def __init__(self, fields):
        self.fields = {k: Field(v) for k, v in fields.items()}


def gguf_fields_from(tok):
    """GGUF tokenizer metadata (tokens by id, merges "a b", types) of an HF tokenizer."""
    import json
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    special = {a["id"] for a in j["added_tokens"]}
    types = [3 if i in special else 1 for i in range(len(tokens))]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges}


def random_corpus(n, seed):
    rng = random.Random(seed)
    pieces = ["the", " quick", "fox", "12", "3456", "½", "٣٤", "Ⅻ", " ", "  ", "\t", "\n", "\r\n", "'s", "'LL",
              "don't", "é", "日本", "😀", "👩‍👩‍👧", ",", ".", "!?", "(x)", "<|im_end|>", "hello", " world",
              "\u200b", "a1b2", "0.5", "   7"]
    out = []
    for _ in range(n):
        s = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        if rng.random() < 0.3:
            s += "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0x80, 0x2FFF), rng.randint(0x1F300, 0x1F6FF)]))
                         for _ in range(rng.randint(1, 8)))
        out.append(s)
    return out


def test_rebuilt_tokenizer_matches_hf_digits_bytelevel_pipeline():
    src = tm.build_tokenizer(384)
    reader = FakeReader(gguf_fields_from(src))
    tok_json, tokens, added = g2h.build_tokenizer(reader)
    import json
    mine = Tokenizer.from_str(json.dumps(tok_json))
    ref = Tokenizer.from_str(src.to_str())
    ref.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    assert [a["content"] for a in added] == tm.SPECIALS and all(a["special"] for a in added)
    corpus = random_corpus(3000, 7)
    for s in corpus:
        a = ref.encode(s, add_special_tokens=False).ids
        b = mine.encode(s, add_special_tokens=False).ids
        assert a == b, (s, a, b)
        assert mine.decode(b, skip_special_tokens=False) == s, s


def test_bad_tokenizer_metadata_is_rejected():
    src = tm.build_tokenizer(384)
    f = gguf_fields_from(src)
    for key, value, words in (("tokenizer.ggml.merges", f["tokenizer.ggml.merges"] + ["zzqq xx"], "merge"),
                              ("tokenizer.ggml.model", "llama", "tokenizer model"),
                              ("tokenizer.ggml.pre", "qwen2", "pre-tokenizer")):
        bad = dict(f)
        bad[key] = value
        try:
            g2h.build_tokenizer(FakeReader(bad))
            raise AssertionError(f"{key} accepted")
        except g2h.ConvertError as e:
            assert words in str(e), str(e)


def test_tensor_names_follow_hf_llama():
    assert g2h.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert g2h.hf_name("blk.12.attn_k.weight") == "model.layers.12.self_attn.k_proj.weight"
    assert g2h.hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert g2h.hf_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert g2h.hf_name("output.weight") == "lm_head.weight"
    try:
        g2h.hf_name("blk.0.attn_qkv.weight")
        raise AssertionError("unknown tensor accepted")
    except g2h.ConvertError as e:
        assert "attn_qkv" in str(e)


def main():
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    failed = 0
    for name, fn in tests:
        try:
            fn()
            print(f"ok   {name}")
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
    print(f"{len(tests) - failed}/{len(tests)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
