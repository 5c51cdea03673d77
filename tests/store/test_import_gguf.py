#!/usr/bin/env python3
"""
tests/store/test_import_gguf.py - `lmstore import` of GGUF files written by
gguf-py's GGUFWriter (the writer of llama.cpp's converter):
  - every tensor type lmstore stores keeps its bytes, under the HF name,
    with the HF shape, in forward-pass order, aligned; llama Q/K rows come
    back in HF order (the inverse of llama.cpp's permutation, written here
    from its definition), Qwen2/Qwen3 rows are untouched;
  - config.json carries the hyperparameters; the rebuilt tokenizer.json
    tokenizes a corpus exactly like the HF tokenizer the GGUF was made from
    (also through `lmstore tokenize`), for the smollm, gpt2, llama-bpe and
    qwen2 pre-tokenizers;
  - a split set imports from its folder or its first file as the same model
    (same id; the second import writes nothing: deduplicated);
  - Llama 3 rope_freqs become config.json's rope_scaling;
  - the real default model (models/.cache, fetched by tools/quickstart.sh)
    gives the tokenizer.json and config of tools/gguf_to_hf.py, the prompt
    ids of tests/fixtures/smollm2/reference.json, and weights whose
    dequantized values equal the converter's (un-permutation included);
  - the real Llama 3 and Qwen3 tokenizers (tests/fixtures/tokenizers/, when
    present) survive GGUF metadata and back: same ids on the tokenizer corpus.
"""
import glob
import gzip
import json
import os
import sys

import numpy as np
import gguf
from gguf.quants import dequantize
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(__file__))
import ggufutil as gu  # noqa: E402
import storeutil as su  # noqa: E402

T = gu.T
failures = 0


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what)
    failures += 0 if cond else 1


def info(store, name):
    _, out, _ = su.lms("info", name, "--json", "--store", store, check=0)
    return json.loads(out)


def cat(store, name, f):
    _, out, _ = su.lms("cat", name, f, "--store", store, check=0)
    return out


TEXTS = gu.CORPUS + ["Hello World 123 and 4567890!", "  spaces\tand\nnewlines\n\n", "naïve café 日本語",
                     "<|im_start|>user\nhi<|im_end|>", "it's we're I'LL", "x=1+2; y=[3,4]"]


def check_model(store, name, path_written, tensors, arch, heads, kv, hf_tok, what):
    inf = info(store, name)
    by = {t["name"]: t for t in inf["tensors"]}
    check(inf["architecture"] == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                  "qwen3": "Qwen3ForCausalLM"}[arch], f"{what}: architecture")
    ok = True
    for gname, (qt, data) in tensors.items():
        hn = gu.hf_name(gname)
        t = by.get(hn)
        if t is None:
            print("   missing", hn)
            ok = False
            continue
        want = np.ascontiguousarray(data).view(np.uint8).reshape(data.shape[0], -1) if data.ndim > 1 else \
            np.ascontiguousarray(data).view(np.uint8)
        if arch == "llama" and gname.split(".")[-2] in ("attn_q", "attn_k"):
            want = gu.unpermute_rows(want, heads if ".attn_q." in gname else kv)
        got = gu.stored_bytes(store, t)
        rows = data.shape[0]
        shape_ok = t["shape"][0] == rows and t["dtype"] == T(qt).name
        if got != want.tobytes() or not shape_ok or t["offset"] % 4096:
            print("   differs:", hn, t["dtype"], t["shape"], T(qt).name)
            ok = False
    check(ok and len(by) == len(tensors), f"{what}: {len(tensors)} tensors keep their bytes (HF names, "
          f"{'un-permuted Q/K, ' if arch == 'llama' else ''}HF shapes, aligned)")
    layers = [t["layer"] for t in inf["tensors"]]
    check(inf["tensors"][0]["name"] == "model.embed_tokens.weight" and layers == sorted(layers),
          f"{what}: forward-pass order")
    cfg = json.loads(cat(store, name, "config.json"))
    check(cfg["num_attention_heads"] == heads and cfg["num_key_value_heads"] == kv and
          cfg["hidden_size"] == 256 and cfg["num_hidden_layers"] == 2 and cfg["intermediate_size"] == 512 and
          cfg["vocab_size"] == hf_tok.get_vocab_size() and cfg["tie_word_embeddings"] is False,
          f"{what}: config.json hyperparameters")
    tj = cat(store, name, "tokenizer.json")
    mine = Tokenizer.from_str(tj)
    same = all(mine.encode(s).ids == hf_tok.encode(s).ids for s in TEXTS)
    check(same, f"{what}: rebuilt tokenizer.json gives the HF tokenizer's ids")
    tc = json.loads(cat(store, name, "tokenizer_config.json"))
    check(tc.get("chat_template") == gu.CHATML and tc["eos_token"] == "<|im_end|>",
          f"{what}: tokenizer_config.json has the chat template and special tokens")


def test_types_names_and_tokenizer(base):
    tok = gu.train_tokenizer()
    store = os.path.join(base, "store")
    all_types = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.F32]
    kinds = list(gu.LAYER)
    types = {}
    i = 0
    for l in range(2):
        for k in kinds:
            if k.endswith("norm"):
                continue
            types[f"blk.{l}.{k}.weight"] = all_types[i % len(all_types)]
            i += 1
    for arch, heads, kv in (("llama", 4, 2), ("qwen2", 4, 2), ("qwen3", 4, 4)):
        path = os.path.join(base, f"{arch}.gguf")
        tensors = gu.tiny_model(path, arch=arch, types=types, tok=tok, heads=heads, kv=kv, seed=len(arch))
        su.lms("import", path, "--store", store, check=0)
        check_model(store, arch, path, tensors, arch, heads, kv, tok, f"{arch} GGUF")
    # the CLI tokenizer reads the stored files
    s = "hello there, 2024 robots"
    _, out, _ = su.lms("tokenize", "llama", "--text", s, "--json", "--store", store, check=0)
    ids = json.loads(out)
    ids = ids["ids"] if isinstance(ids, dict) else ids
    check(ids == tok.encode(s).ids, "lmstore tokenize on the imported GGUF model gives the HF ids")


def test_pre_tokenizers(base):
    """gpt2 and llama-bpe / qwen2 pre-tokenizers: the rebuilt tokenizer.json
    equals an HF tokenizer built with that pre-tokenization (the shapes of
    the real Llama 3 and Qwen tokenizer.json files)."""
    from tokenizers import Regex, models, normalizers, pre_tokenizers
    tok = gu.train_tokenizer()
    tokens, _, merges = gu.tokenizer_metadata(tok)
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ")) for m in merges]
    llama3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    qwen2 = llama3.replace(r"\p{N}{1,3}", r"\p{N}")
    store = os.path.join(base, "store-pre")
    for pre, regex, ignore, nfc in (("gpt2", gu.GPT2, False, False), ("llama-bpe", llama3, True, False),
                                    ("qwen2", qwen2, False, True)):
        ref = Tokenizer(models.BPE(vocab, pairs, ignore_merges=ignore))
        ref.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        if nfc:
            ref.normalizer = normalizers.NFC()
        ref.add_special_tokens(gu.SPECIALS)
        path = os.path.join(base, f"pre-{pre}.gguf")
        gu.tiny_model(path, tok=tok, pre=pre, layers=2)
        su.lms("import", path, "--name", pre, "--store", store, check=0)
        mine = Tokenizer.from_str(cat(store, pre, "tokenizer.json"))
        texts = TEXTS + ["1234567 89", "ABC'S don't\r\n\r\nx", "Cafe\u0301 e\u0301"]
        check(all(mine.encode(s).ids == ref.encode(s).ids for s in texts), f"pre-tokenizer '{pre}': same ids")
    # add_bos_token: HF's TemplateProcessing puts BOS first
    path = os.path.join(base, "bos.gguf")
    gu.tiny_model(path, tok=tok, pre="llama-bpe", add_bos=True)
    su.lms("import", path, "--name", "bos", "--store", store, check=0)
    mine = Tokenizer.from_str(cat(store, "bos", "tokenizer.json"))
    check(mine.encode("hello").ids[0] == 1, "add_bos_token: the rebuilt tokenizer adds BOS (id 1)")


def test_split_files_are_one_model(base):
    tok = gu.train_tokenizer()
    one = os.path.join(base, "one")
    os.makedirs(one)
    gu.tiny_model(os.path.join(one, "m.gguf"), tok=tok, seed=7)
    split = os.path.join(base, "split")
    os.makedirs(split)
    gu.tiny_model(os.path.join(split, "m.gguf"), tok=tok, seed=7, split_max_tensors=5)
    files = sorted(glob.glob(os.path.join(split, "*.gguf")))
    check(len(files) > 2 and files[0].endswith("-00001-of-%05d.gguf" % len(files)),
          f"GGUFWriter wrote {len(files)} split files")
    store = os.path.join(base, "store-split")
    _, _, err1 = su.lms("import", os.path.join(one, "m.gguf"), "--name", "single", "--store", store, check=0)
    _, out, err2 = su.lms("import", split, "--name", "folder", "--store", store, check=0)
    check(" 0 B written" in out, "the split set's tensors are all deduplicated against the single file")
    check("config.json" not in err1 + err2, "a GGUF file or folder (its metadata is the config) is not said to "
          "lack config.json" + ("" if "config.json" not in err1 + err2 else "\n  " + err1 + err2))
    su.lms("import", files[0], "--store", store, check=0)  # default name from the first file: "m"
    ids = {n: info(store, n)["id"] for n in ("single", "folder", "m")}
    check(len(set(ids.values())) == 1, "single file, split folder and first split file: one model id")
    rc, _, err = su.lms("import", files[1], "--name", "x", "--store", store)
    check(rc == 1 and "first file" in err, "importing a later split file asks for the first")


def test_llama3_rope_freqs(base):
    """The rope_freqs of Llama 3.2 (factor 32, low 1, high 4, original context 8192)."""
    hd, theta = 64, 500000.0
    factors = []
    for i in range(hd // 2):
        freq = 1.0 / theta ** (2 * i / hd)
        wavelen = 2 * np.pi / freq
        if wavelen < 8192 / 4:
            factors.append(1.0)
        elif wavelen > 8192 / 1:
            factors.append(32.0)
        else:
            smooth = (8192 / wavelen - 1) / (4 - 1)
            factors.append(1 / ((1 - smooth) / 32 + smooth))
    store = os.path.join(base, "store-rope")
    path = os.path.join(base, "rope.gguf")
    tensors = gu.tiny_model(path, rope_freqs=factors, layers=2)
    su.lms("import", path, "--store", store, check=0)
    cfg = json.loads(cat(store, "rope", "config.json"))
    rs = cfg.get("rope_scaling") or {}
    check(rs.get("rope_type") == "llama3" and rs.get("factor") == 32 and rs.get("low_freq_factor") == 1 and
          rs.get("high_freq_factor") == 4 and rs.get("original_max_position_embeddings") == 8192,
          f"rope_freqs -> rope_scaling {rs}")
    by = {t["name"]: t for t in info(store, "rope")["tensors"]}
    check(gu.stored_bytes(store, by["rope_freqs.weight"]) == tensors["rope_freqs.weight"][1].tobytes(),
          "rope_freqs.weight is kept under its GGUF name")
    path = os.path.join(base, "rope-bad.gguf")
    gu.tiny_model(path, rope_freqs=np.linspace(1, 3, 32), layers=2)
    rc, _, err = su.lms("import", path, "--store", store)
    check(rc == 1 and "rope_freqs" in err, "rope_freqs matching no Llama 3 scaling is refused by name")


def test_default_model(base):
    cache = sorted(glob.glob(os.path.join(su.SRC, "models", ".cache", "SmolLM2-135M-Instruct*.gguf")))
    conv = os.path.join(su.SRC, "models", "smollm2-135m-instruct")
    if not cache or not os.path.exists(os.path.join(conv, "model.safetensors")):
        print("not run: the default model (tools/quickstart.sh fetches it into models/)")
        return
    store = os.path.join(base, "store-smol")
    su.lms("import", cache[0], "--name", "smol", "--store", store, check=0)
    with open(os.path.join(conv, "tokenizer.json")) as f:
        ref_tok = json.load(f)
    tj = cat(store, "smol", "tokenizer.json")
    check(json.loads(tj) == ref_tok, "default model: tokenizer.json equals tools/gguf_to_hf.py's")
    with open(os.path.join(conv, "config.json")) as f:
        ref_cfg = json.load(f)
    cfg = json.loads(cat(store, "smol", "config.json"))
    diff = {k for k in set(ref_cfg) | set(cfg) if ref_cfg.get(k) != cfg.get(k)}
    check(diff <= {"torch_dtype", "initializer_range", "pretraining_tp"}, f"default model: config.json equals "
          f"tools/gguf_to_hf.py's but for {sorted(diff)}")
    with open(os.path.join(su.SRC, "tests", "fixtures", "smollm2", "reference.json")) as f:
        ref = json.load(f)
    mine = Tokenizer.from_str(tj)
    raw_cases = [c for c in ref["cases"] if not c["chat"]]
    check(all(mine.encode(c["prompt"]).ids == c["prompt_ids"] for c in raw_cases),
          f"default model: {len(raw_cases)} prompts tokenize to the transformers reference ids")
    # weights: the stored bytes, dequantized by gguf-py, equal the converter's bf16 weights
    with open(os.path.join(conv, "model.safetensors"), "rb") as f:
        blob = f.read()
    hlen = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + hlen])

    def conv_bf16(name):  # raw bf16 bits (numpy has no bfloat16)
        b, e = header[name]["data_offsets"]
        return np.frombuffer(blob[8 + hlen + b:8 + hlen + e], np.uint16).reshape(header[name]["shape"])
    by = {t["name"]: t for t in info(store, "smol")["tensors"]}
    bad = []
    for name in ("model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.k_proj.weight",
                 "model.layers.3.mlp.down_proj.weight", "model.embed_tokens.weight"):
        t = by[name]
        raw = np.frombuffer(gu.stored_bytes(store, t), np.uint8).reshape(t["shape"][0], -1)
        vals = dequantize(raw, T[t["dtype"]]).astype(np.float32)
        u = vals.view(np.uint32).astype(np.uint64)
        bf = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        if not np.array_equal(bf, conv_bf16(name)):
            bad.append(name)
    check(not bad, f"default model: dequantized stored weights equal the converter's bf16 (bad: {bad})")


def test_real_tokenizers(base):
    """llama.cpp's converter writes the vocabulary, merges and token types of
    an HF tokenizer into GGUF; lmstore's rebuilt tokenizer.json must tokenize
    like the original."""
    fx = os.path.join(su.SRC, "tests", "fixtures", "tokenizers")
    with open(os.path.join(su.SRC, "tests", "fixtures", "tokenizer", "corpus.json")) as f:
        corpus = json.load(f)
    texts = []
    for h in corpus["texts_hex"]:
        try:
            texts.append(bytes.fromhex(h).decode("utf-8"))
        except UnicodeDecodeError:
            pass
    corpus = texts
    assert len(corpus) > 100
    ran = 0
    for name, pre in (("llama3", "llama-bpe"), ("qwen3", "qwen2")):
        p = os.path.join(fx, f"{name}.tokenizer.json.gz")
        if not os.path.exists(p):
            continue
        ran += 1
        with gzip.open(p, "rt", encoding="utf-8") as f:
            d = json.load(f)
        hf = Tokenizer.from_str(json.dumps(d))
        vocab = dict(d["model"]["vocab"])
        for a in d["added_tokens"]:
            vocab[a["content"]] = a["id"]
        n = max(vocab.values()) + 1
        tokens = [f"[PAD{i}]" for i in range(n)]
        for t, i in vocab.items():
            tokens[i] = t
        added = {a["id"]: a for a in d["added_tokens"]}
        types = [(3 if added[i]["special"] else 4) if i in added else 1 for i in range(n)]
        merges = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
        kvs, tens = gu.model_description(vocab_tokens=tokens)
        kvs = [kv for kv in kvs if not kv[0].startswith("tokenizer.")] + [
            ("tokenizer.ggml.model", "str", "gpt2"), ("tokenizer.ggml.pre", "str", pre),
            ("tokenizer.ggml.tokens", "arr", ("str", tokens)), ("tokenizer.ggml.token_type", "arr", ("i32", types)),
            ("tokenizer.ggml.merges", "arr", ("str", merges)), ("tokenizer.ggml.eos_token_id", "u32", n - 1)]
        path = os.path.join(base, f"real-{name}.gguf")
        with open(path, "wb") as f:
            f.write(gu.raw(kvs, tens))
        store = os.path.join(base, "store-real")
        su.lms("import", path, "--name", name, "--store", store, check=0)
        mine = Tokenizer.from_str(cat(store, name, "tokenizer.json"))
        bad = [s for s in corpus if mine.encode(s, add_special_tokens=False).ids != hf.encode(s, add_special_tokens=False).ids]
        check(not bad, f"real {name} tokenizer through GGUF metadata: {len(corpus)} texts, same ids "
              f"({len(bad)} differ)")
    if not ran:
        print("not run: real tokenizers (tests/fixtures/tokenizers/*.tokenizer.json.gz absent)")


def main():
    base = su.scratch("import-gguf")
    test_types_names_and_tokenizer(base)
    test_pre_tokenizers(base)
    test_split_files_are_one_model(base)
    test_llama3_rope_freqs(base)
    test_default_model(base)
    test_real_tokenizers(base)
    print("FAILED" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
