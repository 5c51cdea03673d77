#!/usr/bin/env python3
"""
bench/serve_load.py - aggregate decode throughput of an OpenAI-compatible
server (lmstore serve, llama.cpp's llama-server) under C concurrent
streaming clients, for bench/bench_serve.sh.

Each client sends /v1/completions requests back to back (greedy, stream,
ignore_eos, max_tokens N) and counts the token events it receives. After a
warm-up of W seconds, the events received in a window of S seconds are
counted: aggregate decode tok/s = events in the window / S (every server
here sends one event per generated token). Prints one JSON line:
{"clients", "seconds", "tokens", "tok_s", "requests"}.

usage: serve_load.py URL --clients C [--seconds S] [--warmup W] [--max-tokens N] [--model NAME]
"""

import argparse
import http.client
import json
import threading
import time
import urllib.parse

PROMPT = "Once upon a time, in a small town by the sea, there lived an old clockmaker who"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--warmup", type=float, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default="model")
    a = ap.parse_args()
    u = urllib.parse.urlparse(a.url)
    body = json.dumps({"model": a.model, "prompt": PROMPT, "max_tokens": a.max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True}).encode()
    t0 = time.time()
    w0, w1 = t0 + a.warmup, t0 + a.warmup + a.seconds
    counts = [0] * a.clients
    reqs = [0] * a.clients
    errors = []

    def client(i):
        while time.time() < w1:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
            try:
                c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
                r = c.getresponse()
                if r.status != 200:
                    errors.append(f"status {r.status}: {r.read()[:200]!r}")
                    return
                for line in r:
                    if time.time() >= w1:
                        break
                    if not line.startswith(b"data: {"):
                        continue
                    ev = json.loads(line[6:])
                    ch = ev.get("choices") or []
                    if ch and ch[0].get("finish_reason") is None and w0 <= time.time() < w1:
                        counts[i] += 1
                reqs[i] += 1
            finally:
                c.close()

    ts = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise SystemExit("errors: " + "; ".join(errors[:5]))
    n = sum(counts)
    print(json.dumps({"clients": a.clients, "seconds": a.seconds, "tokens": n, "tok_s": round(n / a.seconds, 2),
                      "requests": sum(reqs)}))


if __name__ == "__main__":
    main()
