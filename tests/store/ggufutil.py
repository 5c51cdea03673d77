"""tests/store/ggufutil.py - GGUF files for the store's tests.

tiny_model() writes a small model with gguf-py's GGUFWriter (PyPI `gguf`,
the writer llama.cpp's converter uses), in any mix of tensor types, as one
file or as a split set, with a byte-level BPE tokenizer trained here with HF
`tokenizers`. raw() serializes a GGUF byte by byte from a description, so
tests can make every kind of malformed file.
"""
import os
import struct

import numpy as np
import gguf
from gguf.quants import quantize
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

T = gguf.GGMLQuantizationType
GPT2 = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
        r"|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "the quick brown fox jumps over the lazy dog 12345. " * 3,
    "hello there, how are you today? i am fine, thank you. ",
    "a model store keeps weights in memory-mapped segments; sessions keep the cache. ",
    "once upon a time there was a little robot who liked to read and write 2024. ",
    "print('hello world') for i in range(10): total += i ",
]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# HF shape [rows, cols] of each per-block tensor, as functions of the hyperparameters
LAYER = {
    "attn_norm": lambda h: (h["embd"],), "ffn_norm": lambda h: (h["embd"],),
    "attn_q": lambda h: (h["heads"] * h["hd"], h["embd"]), "attn_k": lambda h: (h["kv"] * h["hd"], h["embd"]),
    "attn_v": lambda h: (h["kv"] * h["hd"], h["embd"]), "attn_output": lambda h: (h["embd"], h["heads"] * h["hd"]),
    "ffn_gate": lambda h: (h["ff"], h["embd"]), "ffn_up": lambda h: (h["ff"], h["embd"]),
    "ffn_down": lambda h: (h["embd"], h["ff"]),
}
HF_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
            "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
            "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj"}


def hf_name(name):
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight", "rope_freqs.weight": "rope_freqs.weight"}
    if name in top:
        return top[name]
    _, layer, kind, suffix = name.split(".")
    return f"model.layers.{layer}.{HF_LAYER[kind]}.{suffix}"


def train_tokenizer(vocab_size=400):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.Split(Regex(GPT2), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    return tok


def tokenizer_metadata(tok):
    """(tokens, token types, merges) of an HF byte-level BPE Tokenizer, as llama.cpp's converter writes them."""
    import json
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    specials = {a["id"] for a in d["added_tokens"] if a["special"]}
    types = [3 if i in specials else 1 for i in range(len(tokens))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
    return tokens, types, merges


def block_data(rng, qtype, rows, cols):
    """Random tensor bytes of a quantized type (valid f16 scales), or a float array."""
    if qtype == T.F32:
        return rng.standard_normal((rows, cols) if cols else (rows,)).astype(np.float32)
    if qtype == T.F16:
        return rng.standard_normal((rows, cols)).astype(np.float16)
    if qtype == T.BF16:
        a = rng.standard_normal((rows, cols)).astype(np.float32)
        return quantize(a, T.BF16)
    if qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        return quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    return rng.integers(0, 256, (rows, cols // bs * ts), dtype=np.uint8)


def tiny_model(path, arch="llama", types=None, tok=None, split_max_tensors=0, seed=0, layers=2,
               embd=256, ff=512, heads=4, kv=2, pre="smollm", rope_freqs=None, add_bos=False,
               extra=None):
    """Write a tiny model with GGUFWriter. types: GGUF tensor name -> type
    (default Q8_0 for matrices, F32 for vectors). Returns {gguf name: (type, data)}."""
    rng = np.random.default_rng(seed)
    tok = tok or train_tokenizer()
    tokens, ttypes, merges = tokenizer_metadata(tok)
    h = {"embd": embd, "ff": ff, "heads": heads, "kv": kv, "hd": embd // heads}
    vocab = len(tokens)
    w = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    w.add_block_count(layers)
    w.add_context_length(2048)
    w.add_embedding_length(embd)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0 if rope_freqs is not None else 10000.0)
    w.add_rope_dimension_count(h["hd"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(ttypes)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_add_bos_token(add_bos)
    w.add_chat_template(CHATML)
    for k, v in (extra or {}).items():
        v(w) if callable(v) else w.add_uint32(k, v)
    types = types or {}
    out = {}

    def put(name, rows, cols, default):
        qt = types.get(name, default)
        data = block_data(rng, qt, rows, cols)
        if qt in (T.F32, T.F16):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=qt)
        out[name] = (qt, data)

    put("token_embd.weight", vocab, embd, T.Q8_0)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, np.float32))
        out["rope_freqs.weight"] = (T.F32, np.asarray(rope_freqs, np.float32))
    for l in range(layers):
        for kind, shape in LAYER.items():
            s = shape(h)
            put(f"blk.{l}.{kind}.weight", s[0], s[1] if len(s) > 1 else 0,
                T.Q8_0 if len(s) > 1 else T.F32)
        if arch == "qwen2":
            for kind in ("attn_q", "attn_k", "attn_v"):
                put(f"blk.{l}.{kind}.bias", LAYER[kind](h)[0], 0, T.F32)
        if arch == "qwen3":
            for kind in ("attn_q_norm", "attn_k_norm"):
                put(f"blk.{l}.{kind}.weight", h["hd"], 0, T.F32)
    put("output_norm.weight", embd, 0, T.F32)
    put("output.weight", vocab, embd, T.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


# ---- raw serialization (for malformed files) ---------------------------------------------

VT = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8, "arr": 9,
      "u64": 10, "i64": 11, "f64": 12}
FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(t, v):
    t = VT[t] if isinstance(t, str) else t
    if t == 8:
        return gstr(v)
    if t == 9:
        et, items = v
        et = VT[et] if isinstance(et, str) else et
        return struct.pack("<IQ", et, len(items)) + b"".join(value(et, x) for x in items)
    return struct.pack(FMT[t], v)


def raw(kvs, tensors, alignment=32, version=3, magic=b"GGUF", n_tensors=None, n_kv=None):
    """kvs: [(key, type, value)]; tensors: [(name, n_dims, ne list, ggml type, offset or None, data bytes)].
    Offsets None are assigned in order with padding. Returns the file bytes."""
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = b"".join(gstr(k) + struct.pack("<I", VT[t] if isinstance(t, str) else t) + value(t, v)
                    for k, t, v in kvs)
    infos, off, blobs = b"", 0, []
    for name, nd, ne, qt, o, data in tensors:
        if o is None:
            o = off
        infos += gstr(name) + struct.pack("<I", nd) + b"".join(struct.pack("<Q", x) for x in ne)
        infos += struct.pack("<IQ", qt, o)
        blobs.append((o, data))
        off = max(off, o + len(data))
        off += (-off) % alignment
    hdr = head + body + infos
    hdr += b"\0" * ((-len(hdr)) % alignment)
    near = [(o, d) for o, d in blobs if o + len(d) < (1 << 24)]  # far offsets stay unwritten
    size = max([o + len(d) for o, d in near] + [0])
    region = bytearray(size)
    for o, d in near:
        region[o:o + len(d)] = d
    return bytes(hdr) + bytes(region)


def model_description(vocab_tokens=None, layers=1, embd=32, ff=64, heads=2, kv=1, qtype=8, arch="llama"):
    """(kvs, tensors) of a small valid model for raw(): Q8_0 matrices (or qtype), F32 vectors."""
    vocab_tokens = vocab_tokens or ([chr(ord('a') + i) for i in range(26)] + ["ab", "abc", "<s>", "</s>"])
    merges = ["a b", "ab c"]
    n = len(vocab_tokens)
    kvs = [("general.architecture", "str", arch), (f"{arch}.block_count", "u32", layers),
           (f"{arch}.context_length", "u32", 256), (f"{arch}.embedding_length", "u32", embd),
           (f"{arch}.feed_forward_length", "u32", ff), (f"{arch}.attention.head_count", "u32", heads),
           (f"{arch}.attention.head_count_kv", "u32", kv),
           (f"{arch}.attention.layer_norm_rms_epsilon", "f32", 1e-5),
           ("tokenizer.ggml.model", "str", "gpt2"), ("tokenizer.ggml.pre", "str", "default"),
           ("tokenizer.ggml.tokens", "arr", ("str", vocab_tokens)),
           ("tokenizer.ggml.token_type", "arr", ("i32", [1] * (n - 2) + [3, 3])),
           ("tokenizer.ggml.merges", "arr", ("str", merges)),
           ("tokenizer.ggml.bos_token_id", "u32", n - 2), ("tokenizer.ggml.eos_token_id", "u32", n - 1)]
    bs, ts = gguf.GGML_QUANT_SIZES[T(qtype)]
    rng = np.random.default_rng(1)

    def mat(name, rows, cols):
        data = quantize(rng.standard_normal((rows, cols)).astype(np.float32), T(qtype)).tobytes() \
            if qtype != 0 else rng.standard_normal((rows, cols)).astype(np.float32).tobytes()
        return (name, 2, [cols, rows], qtype, None, data)

    def vec(name, rows):
        return (name, 1, [rows], 0, None, np.ones(rows, np.float32).tobytes())

    hd = embd // heads
    ts_ = [mat("token_embd.weight", n, embd)]
    for l in range(layers):
        ts_ += [vec(f"blk.{l}.attn_norm.weight", embd), vec(f"blk.{l}.ffn_norm.weight", embd),
                mat(f"blk.{l}.attn_q.weight", heads * hd, embd), mat(f"blk.{l}.attn_k.weight", kv * hd, embd),
                mat(f"blk.{l}.attn_v.weight", kv * hd, embd), mat(f"blk.{l}.attn_output.weight", embd, heads * hd),
                mat(f"blk.{l}.ffn_gate.weight", ff, embd), mat(f"blk.{l}.ffn_up.weight", ff, embd),
                mat(f"blk.{l}.ffn_down.weight", embd, ff)]
    ts_ += [vec("output_norm.weight", embd)]
    return kvs, ts_


def unpermute_rows(a, heads):
    """HF row order of a [rows, ...] array stored in llama.cpp's rotary order."""
    rows = a.shape[0]
    return a.reshape(heads, rows // heads // 2, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)


def stored_bytes(store, info_tensor):
    seg = os.path.join(store, "segments", "%08d.seg" % info_tensor["segment"])
    with open(seg, "rb") as f:
        f.seek(info_tensor["offset"])
        return f.read(info_tensor["nbytes"])
