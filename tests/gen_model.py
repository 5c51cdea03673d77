#!/usr/bin/env python3
"""tests/gen_model.py - writes HuggingFace-style model folders with random
weights, for tests and benchmarks.

The folder holds config.json, generation_config.json, optional tokenizer
files and a chat template, and the weights in one or more safetensors shards
with model.safetensors.index.json, named as transformers names the real
architectures (llama, qwen2 with q/k/v biases, qwen3 with per-head q/k norms,
gemma3 with four norms per layer stored as w for (1 + w), q/k norms, local
and global layers: every --swa-pattern-th layer global, the others with a
sliding window of --window).
Weights are random (seeded: the same arguments give the same bytes) and
written one tensor at a time, so multi-GB models need little memory.

Examples:
  gen_model.py OUT --arch qwen3 --hidden 64 --layers 2          # tiny test model
  gen_model.py OUT --arch llama --target-size 4.2G --shard-size 1G   # benchmark model
  gen_model.py OUT --arch qwen2 --dtype F32 --single-file       # one model.safetensors
  gen_model.py OUT --arch gemma3 --hidden 1152 --intermediate 6912 --layers 26 --heads 4 --kv-heads 1 \
      --head-dim 256 --vocab 262144 --tied --window 512             # gemma-3-1b's shape
"""
import argparse
import gzip
import json
import os
import shutil
import struct
import sys

import numpy as np

DTYPE_SIZE = {"BF16": 2, "F16": 2, "F32": 4}

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def parse_size(s):
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = 1
    for suf, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40)):
        if s.endswith(suf):
            mult, s = m, s[:-1]
            break
    return int(float(s) * mult)


def tensor_specs(a):
    """(name, shape, kind) in the order transformers' state_dict lists them."""
    h, inter, v = a.hidden, a.intermediate, a.vocab
    hd = a.head_dim
    q, kv = a.heads * hd, a.kv_heads * hd
    specs = [("model.embed_tokens.weight", (v, h), "w")]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        specs.append((p + "self_attn.q_proj.weight", (q, h), "w"))
        specs.append((p + "self_attn.k_proj.weight", (kv, h), "w"))
        specs.append((p + "self_attn.v_proj.weight", (kv, h), "w"))
        if a.arch == "qwen2":
            specs.append((p + "self_attn.q_proj.bias", (q,), "b"))
            specs.append((p + "self_attn.k_proj.bias", (kv,), "b"))
            specs.append((p + "self_attn.v_proj.bias", (kv,), "b"))
        specs.append((p + "self_attn.o_proj.weight", (h, q), "w"))
        norm = "z" if a.arch == "gemma3" else "n"  # Gemma stores w for (1 + w)
        if a.arch in ("qwen3", "gemma3"):
            specs.append((p + "self_attn.q_norm.weight", (hd,), norm))
            specs.append((p + "self_attn.k_norm.weight", (hd,), norm))
        specs.append((p + "mlp.gate_proj.weight", (inter, h), "w"))
        specs.append((p + "mlp.up_proj.weight", (inter, h), "w"))
        specs.append((p + "mlp.down_proj.weight", (h, inter), "w"))
        specs.append((p + "input_layernorm.weight", (h,), norm))
        specs.append((p + "post_attention_layernorm.weight", (h,), norm))
        if a.arch == "gemma3":
            specs.append((p + "pre_feedforward_layernorm.weight", (h,), norm))
            specs.append((p + "post_feedforward_layernorm.weight", (h,), norm))
    specs.append(("model.norm.weight", (h,), "z" if a.arch == "gemma3" else "n"))
    if not a.tied:
        specs.append(("lm_head.weight", (v, h), "w"))
    return specs


def config_for(a):
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "gemma3": "Gemma3ForCausalLM"}[a.arch]
    torch_dtype = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[a.dtype]
    c = {
        "architectures": [arch],
        "model_type": a.arch,
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "vocab_size": a.vocab,
        "max_position_embeddings": a.max_pos,
        "rms_norm_eps": 1e-6 if a.arch != "llama" else 1e-5,
        "rope_theta": 1000000.0 if a.arch != "llama" else 500000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": a.tied,
        "torch_dtype": torch_dtype,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "attention_bias": a.arch == "qwen2",
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
    }
    if a.arch == "llama":
        c["pretraining_tp"] = 1
        c["mlp_bias"] = False
    if a.arch in ("qwen2", "qwen3"):
        c["use_sliding_window"] = False
        c["sliding_window"] = None
        c["max_window_layers"] = a.layers
    if a.arch == "gemma3":  # as gemma-3-1b's config.json writes it
        c["model_type"] = "gemma3_text"
        del c["hidden_act"]
        c.update(hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=a.head_dim, sliding_window=a.window,
                 sliding_window_pattern=a.swa_pattern, rope_local_base_freq=10000.0, rope_scaling=None,
                 final_logit_softcapping=None, attn_logit_softcapping=None, bos_token_id=2, eos_token_id=[1, 106],
                 pad_token_id=0)
    return c


_POOL = {}


def pooled_bytes(rng, shape, kind, dtype, std):
    """Matrices cut from one pool of 64M random values at a random offset
    (--pooled: a benchmark's model of tens of GB written at disk speed; the
    values stay Gaussian, the matrices are not independent)."""
    n = int(np.prod(shape)) if shape else 1
    if kind != "w" or n < (1 << 20):
        return random_bytes(rng, shape, kind, dtype, std)
    key = (dtype, std)
    if key not in _POOL:
        _POOL[key] = np.frombuffer(random_bytes(rng, (1 << 26,), "w", dtype, std), dtype=np.uint8)
    pool = _POOL[key]
    es = DTYPE_SIZE[dtype]
    out = np.empty(n * es, dtype=np.uint8)
    pos, at = 0, int(rng.integers(0, 1 << 26)) * es
    while pos < len(out):
        take = min(len(out) - pos, len(pool) - at)
        out[pos:pos + take] = pool[at:at + take]
        pos += take
        at = 0
    return out.data


def random_bytes(rng, shape, kind, dtype, std):
    n = int(np.prod(shape)) if shape else 1
    if kind == "n":  # norm weights near 1
        x = (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)
    elif kind == "z":  # norm weights near 0, applied as 1 + w
        x = (0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)
    elif kind == "b":
        x = (0.02 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)
    else:
        x = rng.standard_normal(n, dtype=np.float32)
        x *= np.float32(std)
    if dtype == "F32":
        return x.tobytes()
    if dtype == "F16":
        return x.astype(np.float16).tobytes()
    # BF16: round to nearest even on the upper 16 bits of the float32
    u = x.view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return u.astype(np.uint16).tobytes()


def plan_shards(specs, dtype, shard_size, single):
    shards, cur, cur_bytes = [], [], 0
    for name, shape, kind in specs:
        nb = int(np.prod(shape)) * DTYPE_SIZE[dtype]
        if cur and not single and cur_bytes + nb > shard_size:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append((name, shape, kind, nb))
        cur_bytes += nb
    if cur:
        shards.append(cur)
    return shards


POOLED = False


def write_shard(path, tensors, dtype, rng, std, metadata):
    header, off = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, shape, _kind, nb in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + nb]}
        off += nb
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)  # the data region starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for name, shape, kind, nb in tensors:
            data = (pooled_bytes if POOLED else random_bytes)(rng, shape, kind, dtype, std)
            assert len(data) == nb, name
            f.write(data)
    return off


def choose_layers(a):
    """Number of layers that brings the model closest to --target-size."""
    per_layer = None
    a.layers = 1
    one = sum(int(np.prod(s)) for _, s, _ in tensor_specs(a))
    a.layers = 2
    two = sum(int(np.prod(s)) for _, s, _ in tensor_specs(a))
    per_layer, base = two - one, one - (two - one)
    target = a.target_size // DTYPE_SIZE[a.dtype]
    return max(1, round((target - base) / per_layer))


def main(argv=None):
    ap = argparse.ArgumentParser(description="Write a random-weight HuggingFace model folder.")
    ap.add_argument("out", help="output folder (created; must not exist unless --force)")
    ap.add_argument("--arch", choices=["llama", "qwen2", "qwen3", "gemma3"], default="llama")
    ap.add_argument("--window", type=int, default=512, help="gemma3: sliding window of the local layers")
    ap.add_argument("--swa-pattern", type=int, default=6, help="gemma3: every N-th layer is global")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=0, help="default: about 2.7 x hidden, multiple of 32")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=0, help="default: hidden / heads")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--max-pos", type=int, default=2048)
    ap.add_argument("--dtype", choices=sorted(DTYPE_SIZE), default="BF16")
    ap.add_argument("--tied", action="store_true", help="tie lm_head to the embedding (no lm_head.weight)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pooled", action="store_true",
                    help="cut large matrices from one pool of random values (fast; for benchmark-sized models)")
    ap.add_argument("--std", type=float, default=0.02, help="std of the random weight matrices")
    ap.add_argument("--shard-size", default="2M", help="max bytes per shard (e.g. 64K, 1G)")
    ap.add_argument("--single-file", action="store_true", help="one model.safetensors, no index")
    ap.add_argument("--target-size", default=None, help="pick --layers so the weights are about this size")
    ap.add_argument("--tokenizer", default=None,
                    help="prefix of tokenizer files to copy, e.g. tests/fixtures/tokenizers/qwen3 "
                         "(PREFIX.tokenizer.json[.gz], PREFIX.tokenizer_config.json[.gz])")
    ap.add_argument("--chat-template", action="store_true", help="write a ChatML chat_template.jinja")
    ap.add_argument("--metadata", action="store_true", help='write {"format": "pt"} as __metadata__')
    ap.add_argument("--force", action="store_true", help="replace OUT if it exists")
    a = ap.parse_args(argv)

    if a.head_dim == 0:
        a.head_dim = a.hidden // a.heads
    if a.intermediate == 0:
        a.intermediate = max(32, (a.hidden * 8 // 3 + 31) // 32 * 32)
    if a.heads % a.kv_heads:
        ap.error("--heads must be a multiple of --kv-heads")
    if a.target_size:
        a.target_size = parse_size(a.target_size)
        a.layers = choose_layers(a)
    shard_size = parse_size(a.shard_size)

    if os.path.exists(a.out):
        if not a.force:
            ap.error(f"{a.out} exists (use --force)")
        shutil.rmtree(a.out)
    os.makedirs(a.out)

    global POOLED
    POOLED = a.pooled
    rng = np.random.default_rng(a.seed)
    specs = tensor_specs(a)
    shards = plan_shards(specs, a.dtype, shard_size, a.single_file)
    meta = {"format": "pt"} if a.metadata else None
    weight_map, total = {}, 0
    for i, tensors in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(os.path.join(a.out, fname), tensors, a.dtype, rng, a.std, meta)
        for t in tensors:
            weight_map[t[0]] = fname
    if len(shards) > 1:
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)

    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config_for(a), f, indent=2)
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        cfg = config_for(a)
        json.dump({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False}, f,
                  indent=2)
    if a.tokenizer:
        for part in ("tokenizer.json", "tokenizer_config.json"):
            src = f"{a.tokenizer}.{part}"
            if os.path.exists(src + ".gz"):
                with gzip.open(src + ".gz", "rb") as fi, open(os.path.join(a.out, part), "wb") as fo:
                    shutil.copyfileobj(fi, fo)
            elif os.path.exists(src):
                shutil.copyfile(src, os.path.join(a.out, part))
            else:
                ap.error(f"no {src}[.gz]")
    if a.chat_template:
        with open(os.path.join(a.out, "chat_template.jinja"), "w") as f:
            f.write(CHATML)
    print(f"{a.out}: {a.arch}, {a.layers} layers, {len(specs)} tensors, {len(shards)} shard(s), "
          f"{total} bytes of {a.dtype}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
