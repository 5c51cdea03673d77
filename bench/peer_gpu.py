#!/usr/bin/env python3
"""
bench/peer_gpu.py - the helpers of bench/bench_engine_gpu.sh's llama.cpp
phases (peerserve8b, cpu8b); standard library only.

  peer_gpu.py prompt                 the text of the greedy check
  peer_gpu.py ready URL              until URL/health answers, then one
                                     8-token request (a warm server)
  peer_gpu.py greedy URL LMS.json [LOGITS]
                                     llama-server at URL against `lmstore run
                                     --json` (LMS.json) on the same prompt:
                                     /tokenize of the text against lmstore's
                                     prompt ids; /completion from lmstore's
                                     prompt ids, greedy, as many tokens as
                                     lmstore made, with llama.cpp's top-2
                                     log-probabilities at each step (a small
                                     gap where the ids part is a near tie);
                                     with LOGITS (`lmstore logits --out` of
                                     the prompt), the first token's top 10
                                     log-probabilities of both; one JSON line
  peer_gpu.py servetable RES         the peerserve8b table (markdown) from
                                     results.jsonl: per client count the
                                     median over rounds of each server, each
                                     against its own 1-client rate, and
                                     lmstore / llama-server
  peer_gpu.py cputable RES           the cpu8b table: per measurement the
                                     median of each engine and of the ratio
                                     over pairs (min-max)
"""

import array
import json
import math
import statistics as st
import sys
import time
import urllib.request

PROMPT = "Once upon a time, in a small town by the sea, there lived an old clockmaker who"


def post(url, body, timeout=120):
    r = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(r, timeout=timeout).read())


def ready(url):
    for _ in range(480):
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            break
        except Exception:
            time.sleep(0.5)
    post(url + "/v1/completions", {"prompt": "Hello", "max_tokens": 8})


def top_logprobs(logits_f32, k):
    """The k largest log-softmax values of a float32 logits row: [(id, logprob)]."""
    x = array.array("f")
    with open(logits_f32, "rb") as f:
        x.frombytes(f.read())
    if sys.byteorder != "little":
        x.byteswap()
    m = max(x)
    lse = m + math.log(math.fsum(math.exp(v - m) for v in x))
    top = sorted(range(len(x)), key=lambda i: -x[i])[:k]
    return [(i, x[i] - lse) for i in top]


def greedy(url, lms_json, logits_f32=None):
    a = json.load(open(lms_json))
    tok = post(url + "/tokenize", {"content": PROMPT, "add_special": True})["tokens"]
    c = post(url + "/completion", {"prompt": a["prompt_ids"], "n_predict": len(a["ids"]), "temperature": 0,
                                   "ignore_eos": True, "return_tokens": True, "cache_prompt": False, "n_probs": 2})
    b = c["tokens"]
    same = next((i for i, (x, y) in enumerate(zip(a["ids"], b)) if x != y), min(len(a["ids"]), len(b)))
    gaps = []
    for p in c.get("completion_probabilities", []):
        lp = [x.get("logprob") for x in p.get("top_logprobs", [])]
        gaps.append(round(lp[0] - lp[1], 3) if len(lp) > 1 and None not in lp[:2] else None)
    out = {"what": "greedy_llama_server", "prompt_ids_equal": tok == a["prompt_ids"], "prompt_ids": a["prompt_ids"],
           "llama_tokenize": tok, "same_prefix": same, "of": len(a["ids"]), "lmstore": a["ids"], "llama_server": b,
           "llama_top2_logprob_gap": gaps}
    if same < len(b):
        p = c["completion_probabilities"][same].get("top_logprobs", [])
        out["lmstore_id_in_llama_top2_at_divergence"] = a["ids"][same] in [x.get("id") for x in p]
    if logits_f32:
        # the first token's distribution: lmstore's top 10 (its logits of the
        # prompt's last position) against llama-server's top 10
        k = 10
        mine = top_logprobs(logits_f32, k)
        c1 = post(url + "/completion", {"prompt": a["prompt_ids"], "n_predict": 1, "temperature": 0, "n_probs": k,
                                        "cache_prompt": False})
        theirs = {x["id"]: x["logprob"] for x in c1["completion_probabilities"][0]["top_logprobs"]}
        common = [(i, lp) for i, lp in mine if i in theirs]
        out["first_token_top10"] = {"lmstore": [[i, round(lp, 4)] for i, lp in mine],
                                    "llama_server": [[i, round(lp, 4)] for i, lp in theirs.items()],
                                    "common_ids": len(common),
                                    "max_abs_logprob_diff": round(max((abs(lp - theirs[i]) for i, lp in common),
                                                                      default=float("nan")), 4)}
    print(json.dumps(out))


def rows(res, what):
    with open(res) as f:
        return [json.loads(line) for line in f if '"what": "%s"' % what in line]


def servetable(res):
    R = rows(res, "serve_peer")

    def med(e, c):
        v = [x["tok_s"] for x in R if x["engine"] == e and x["clients"] == c]
        return st.median(v) if v else float("nan")

    print("| clients | lmstore serve | of its 1-client rate | llama-server | of its 1-client rate "
          "| lmstore / llama-server |")
    print("|---:|---:|---:|---:|---:|---:|")
    for c in sorted({x["clients"] for x in R}):
        a, b = med("lmstore", c), med("llama", c)
        print(f"| {c} | {a:.1f} tok/s | {a / med('lmstore', 1):.2f}x | {b:.1f} tok/s | {b / med('llama', 1):.2f}x "
              f"| {a / b:.2f} |")


def cputable(res):
    L, C = rows(res, "cpu_lmstore"), rows(res, "cpu_llama")
    rounds = sorted({x["round"] for x in L} & {x["round"] for x in C})

    def lms(r, k):
        for x in L:
            if x["round"] == r and (x["gen"] == 64 if k == "decode" else x["prompt"] == k):
                return x["decode_tps"] if k == "decode" else x["prefill_tps"]
        return None

    def lcp(r, k):
        for x in C:
            if x["round"] == r and (x["n_gen"] == 64 if k == "decode" else x["n_gen"] == 0 and x["n_prompt"] == k):
                return x["avg_ts"]
        return None

    print("| measurement | lmstore | llama.cpp | lmstore / llama.cpp, median (min-max) |")
    print("|---|---:|---:|---:|")
    for k, name in (("decode", "decode 64 after 128"), (128, "prefill 128"), (512, "prefill 512")):
        p = [(lms(r, k), lcp(r, k)) for r in rounds]
        p = [(a, b) for a, b in p if a and b]
        if not p:
            continue
        q = [a / b for a, b in p]
        print(f"| {name} ({len(p)} pairs) | {st.median(a for a, _ in p):.2f} tok/s | "
              f"{st.median(b for _, b in p):.2f} tok/s | {st.median(q):.2f}x ({min(q):.2f}-{max(q):.2f}) |")


def main():
    cmd = sys.argv[1:2]
    if cmd == ["prompt"]:
        print(PROMPT)
    elif cmd == ["ready"] and len(sys.argv) == 3:
        ready(sys.argv[2])
    elif cmd == ["greedy"] and len(sys.argv) in (4, 5):
        greedy(*sys.argv[2:])
    elif cmd == ["servetable"] and len(sys.argv) == 3:
        servetable(sys.argv[2])
    elif cmd == ["cputable"] and len(sys.argv) == 3:
        cputable(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
