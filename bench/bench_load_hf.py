#!/usr/bin/env python3
"""bench/bench_load_hf.py - the peers and the physical limits that
`lmstore bench load` is compared with on a GPU machine (driven by
bench/bench_load_gpu.sh), one measurement per process, one JSON line each:

  make DIR        write a Llama-3-8B-shaped bf16 model with random weights
                  (transformers LlamaForCausalLM, save_pretrained, 5 GB shards)
  h2d             pinned (and pageable) host-to-device bandwidth, torch
  st DIR          safetensors.torch.load_file(shard, device="cuda") over every shard
  tf DIR          transformers from_pretrained(DIR, device_map="cuda", dtype=bf16)

Times exclude interpreter start, imports and CUDA context creation (as
lmstore's bench opens its device before its clock starts); they include
everything until the weights are on the GPU (torch.cuda.synchronize()).
"""
import glob
import json
import os
import resource
import sys
import time


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_split():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
    return out


def emit(d):
    d.update(rss_split())
    d["peak_rss_bytes"] = peak_rss()
    print(json.dumps(d), flush=True)


def cuda_init():
    import torch

    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    return torch


def make(out):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
        bos_token_id=128000, eos_token_id=128001,
    )
    t0 = time.time()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
    torch.cuda.synchronize()
    t1 = time.time()
    model.save_pretrained(out, max_shard_size="5GB")
    t2 = time.time()
    files = sorted(glob.glob(os.path.join(out, "*.safetensors")))
    emit({"what": "make", "init_s": t1 - t0, "save_s": t2 - t1, "shards": len(files),
          "bytes": sum(os.path.getsize(f) for f in files)})


def h2d():
    torch = cuda_init()
    n = 2 << 30
    res = {}
    for kind in ("pinned", "pageable"):
        src = torch.empty(n, dtype=torch.uint8, pin_memory=(kind == "pinned"))
        src.fill_(7)
        dst = torch.empty(n, dtype=torch.uint8, device="cuda")
        times = []
        for _ in range(6):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src, non_blocking=True)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        times = sorted(times[1:])
        res[kind + "_gb_per_s"] = n / times[len(times) // 2] / 1e9
        del src, dst
    emit({"what": "h2d", "bytes": n, **res})


def st(d):
    torch = cuda_init()
    from safetensors.torch import load_file

    files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
    t0 = time.time()
    total = 0
    keep = []
    for f in files:
        sd = load_file(f, device="cuda")
        total += sum(t.numel() * t.element_size() for t in sd.values())
        keep.append(sd)
    torch.cuda.synchronize()
    dt = time.time() - t0
    emit({"what": "safetensors_load_file_cuda", "bytes": total, "all_s": dt, "gb_per_s": total / dt / 1e9})


def tf(d):
    torch = cuda_init()
    from transformers import AutoModelForCausalLM

    t0 = time.time()
    m = AutoModelForCausalLM.from_pretrained(d, device_map="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    dt = time.time() - t0
    total = sum(p.numel() * p.element_size() for p in m.parameters())
    emit({"what": "transformers_from_pretrained_cuda", "bytes": total, "all_s": dt, "gb_per_s": total / dt / 1e9})


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make":
        make(sys.argv[2])
    elif cmd == "h2d":
        h2d()
    elif cmd == "st":
        st(sys.argv[2])
    elif cmd == "tf":
        tf(sys.argv[2])
    else:
        sys.exit("usage: bench_load_hf.py make DIR | h2d | st DIR | tf DIR")
