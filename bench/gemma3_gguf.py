#!/usr/bin/env python3
"""bench/gemma3_gguf.py - a Gemma3ForCausalLM folder (safetensors, BF16) as a
GGUF file of the same weights, for llama.cpp as the peer of a decode benchmark
(bench/bench_gemma3.sh).

Matrices are copied bit for bit (BF16 stays BF16); norm weights become F32
with the 1 of Gemma's (1 + w) added, as llama.cpp's converter writes them.
The vocabulary is a placeholder of vocab_size pieces (benchmark models have
random weights and no tokenizer; llama-bench feeds token ids). Reads with
numpy, safetensors and gguf-py (PyPI `gguf`).

usage: gemma3_gguf.py HF_DIR OUT.gguf
"""
import json
import os
import sys

import gguf
import numpy as np
from safetensors import safe_open


def main():
    src, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(src, "config.json")))
    if cfg.get("architectures", [""])[0] != "Gemma3ForCausalLM":
        sys.exit(f"{src}: not a Gemma3ForCausalLM folder")
    n_layers = cfg["num_hidden_layers"]
    w = gguf.GGUFWriter(out, "gemma3")
    w.add_context_length(cfg.get("max_position_embeddings", 32768))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_rope_freq_base(cfg.get("rope_theta", 1e6))
    w.add_rope_freq_base_swa(cfg.get("rope_local_base_freq", 1e4))
    w.add_sliding_window(cfg["sliding_window"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    vocab = cfg["vocab_size"]
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>".encode() for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([gguf.TokenType.NORMAL] * vocab)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, n_layers)
    files = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    for fn in files:
        with safe_open(os.path.join(src, fn), "np") as f:
            for name in f.keys():
                base = name[: -len(".weight")]
                gname = names.get_name(base)
                if gname is None:
                    sys.exit(f"{name}: no GGUF name")
                sl = f.get_slice(name)
                shape = sl.get_shape()
                if sl.get_dtype() != "BF16":
                    sys.exit(f"{name}: {sl.get_dtype()} (BF16 expected)")
                # raw bf16 bits, read past numpy (which has no bf16)
                raw = np.frombuffer(read_raw(os.path.join(src, fn), name), dtype=np.uint16).reshape(shape)
                if name.endswith("norm.weight"):
                    v = (raw.astype(np.uint32) << 16).view(np.float32) + np.float32(1.0)
                    w.add_tensor(gname + ".weight", v.astype(np.float32))
                else:
                    w.add_tensor(gname + ".weight", raw, raw_shape=list(shape), raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


_headers = {}


def read_raw(path, name):
    """The bytes of tensor `name` in a safetensors file."""
    if path not in _headers:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            _headers[path] = (8 + n, json.loads(f.read(n)))
    start, hdr = _headers[path]
    a, b = hdr[name]["data_offsets"]
    with open(path, "rb") as f:
        f.seek(start + a)
        return f.read(b - a)


if __name__ == "__main__":
    main()
