#!/usr/bin/env python3
"""bench/hf_to_gguf.py - a HuggingFace folder (Llama or Qwen3, bf16
safetensors, a byte-level BPE tokenizer.json) as one GGUF file for
llama.cpp, written with gguf-py's GGUFWriter (PyPI `gguf`, the writer
llama.cpp's own converter uses), so that benchmarks run llama.cpp on the same
weights as lmstore without torch or transformers:

  hf_to_gguf.py HF_DIR OUT.gguf [--pre NAME]

As llama.cpp's convert_hf_to_gguf.py does: matrices keep their dtype
(bf16 stays bf16, bytes unchanged), 1-D tensors (norms) become f32, a llama
model's q_proj / k_proj rows are permuted into llama.cpp's rotary order, a
tied LM head is left out; the tokenizer goes in as tokens by id (padded to
the embedding's rows with unused [PADn] tokens), token types
(special added tokens: control), merges, bos/eos/pad ids from
tokenizer_config.json and the chat template. --pre names llama.cpp's
pre-tokenizer (default: smollm for a 49152-token llama vocabulary, qwen2 for
qwen3, else llama-bpe).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import gguf

HF_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
            "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
            "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
            "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}
ST_DTYPES = {"BF16": (np.uint16, gguf.GGMLQuantizationType.BF16), "F16": (np.float16, None),
             "F32": (np.float32, None)}


def gguf_name(name):
    if name in TOP:
        return TOP[name]
    parts = name.split(".")  # model.layers.N.<module>.<weight|bias>
    return f"blk.{parts[2]}.{HF_LAYER['.'.join(parts[3:-1])]}.{parts[-1]}"


def shards(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return ["model.safetensors"]


def tensors(d):
    """(name, dtype, shape, memmap of the bytes) for every tensor of the folder."""
    for s in shards(d):
        path = os.path.join(d, s)
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            hdr = json.loads(f.read(n))
        base = 8 + n
        for name, v in hdr.items():
            if name == "__metadata__":
                continue
            b, e = v["data_offsets"]
            np_t, _ = ST_DTYPES[v["dtype"]]
            a = np.memmap(path, dtype=np_t, mode="r", offset=base + b, shape=tuple(v["shape"]))
            assert a.nbytes == e - b
            yield name, v["dtype"], a


def permute(w, heads):
    """llama.cpp's rotary row order (convert_hf_to_gguf.py LlamaModel.permute)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def to_f32(a, dtype):
    if dtype == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def tokenizer_meta(d, vocab_size):
    """Tokens by id, padded to the model's vocab_size with [PADn] (unused), as llama.cpp's converter does."""
    with open(os.path.join(d, "tokenizer.json")) as f:
        tj = json.load(f)
    cfg = {}
    if os.path.exists(os.path.join(d, "tokenizer_config.json")):
        with open(os.path.join(d, "tokenizer_config.json")) as f:
            cfg = json.load(f)
    vocab = dict(tj["model"]["vocab"])
    for a in tj.get("added_tokens", []):
        vocab[a["content"]] = a["id"]
    n = max(max(vocab.values()) + 1, vocab_size)
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [gguf.TokenType.UNUSED] * n
    for t, i in vocab.items():
        tokens[i] = t
        types[i] = gguf.TokenType.NORMAL
    for a in tj.get("added_tokens", []):
        types[a["id"]] = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]

    def tok_id(key):
        v = cfg.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        return vocab.get(v) if v is not None else None

    return tokens, types, merges, tok_id("bos_token"), tok_id("eos_token"), tok_id("pad_token"), cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--pre", default=None, help="llama.cpp pre-tokenizer name")
    a = ap.parse_args()
    with open(os.path.join(a.hf_dir, "config.json")) as f:
        c = json.load(f)
    arch = {"llama": "llama", "qwen3": "qwen3"}.get(c["model_type"])
    if not arch:
        sys.exit(f"{a.hf_dir}: model_type {c['model_type']} is not supported here (llama, qwen3)")
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    hd = c.get("head_dim") or c["hidden_size"] // heads
    tokens, types, merges, bos, eos, pad, tcfg = tokenizer_meta(a.hf_dir, c["vocab_size"])
    pre = a.pre or ("qwen2" if arch == "qwen3" else "smollm" if c["vocab_size"] == 49152 else "llama-bpe")

    w = gguf.GGUFWriter(a.out, arch)
    w.add_name(os.path.basename(os.path.normpath(a.hf_dir)))
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(float(c.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(c["rms_norm_eps"]))
    w.add_vocab_size(c["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for v, fn in ((bos, w.add_bos_token_id), (eos, w.add_eos_token_id), (pad, w.add_pad_token_id)):
        if v is not None:
            fn(v)
    w.add_add_bos_token(bool(tcfg.get("add_bos_token", False)))
    if isinstance(tcfg.get("chat_template"), str):
        w.add_chat_template(tcfg["chat_template"])

    for name, dt, arr in tensors(a.hf_dir):
        g = gguf_name(name)
        if arr.ndim == 1:  # norms (and biases): f32, as llama.cpp's converter writes them
            w.add_tensor(g, np.ascontiguousarray(to_f32(arr, dt)))
            continue
        if arch == "llama" and g.endswith(("attn_q.weight", "attn_k.weight")):
            arr = permute(arr, heads if g.endswith("attn_q.weight") else kv)
        np_t, raw = ST_DTYPES[dt]
        arr = np.ascontiguousarray(arr)
        if raw is not None:
            w.add_tensor(g, arr, raw_shape=arr.shape, raw_dtype=raw)
        else:
            w.add_tensor(g, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{a.out}: {arch}, {c['num_hidden_layers']} layers, {len(tokens)} tokens, pre-tokenizer {pre}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
