#!/usr/bin/env python3
"""
tests/reference/make_sampler_fixtures.py - reference data for the sampler
(engine/sampler.c), computed independently with numpy by the definitions in
engine/sampler.h: full sort of the vocabulary, HF-style repetition penalty,
temperature, top-k, top-p, min-p, and the xoshiro256** / splitmix64 generator
written from the published algorithm.

  python3 tests/reference/make_sampler_fixtures.py > tests/fixtures/sampler/cases.txt

Format (one record per line, whitespace separated; floats as C99 hex):
  rng SEED N X1 ... XN          first N generator outputs (hex u64) for SEED
  case NAME                     starts a case
  params V TEMP TOPK TOPP MINP PENALTY WINDOW
  hist N ID...                  ids given to accept(), oldest first
  logits V X...                 float32 logits
  probs N ID P ...              kept ids (ascending) and their probabilities
  pick N U ID ...               uniform draws and the ids they select
  end
"""

import numpy as np

M64 = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


class Xoshiro256ss:
    def __init__(self, seed):
        self.s = []
        st = seed & M64
        for _ in range(4):
            st, v = splitmix64(st)
            self.s.append(v)

    def next(self):
        s = self.s
        out = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return out


def reference(logits, temp, top_k, top_p, min_p, penalty, window, hist):
    """Final distribution: dict id -> probability (greedy: {argmax: 1})."""
    x32 = np.array(logits, dtype=np.float32)
    x32 = np.where(np.isnan(x32), np.float32(-np.inf), x32)
    x = x32.astype(np.float64)
    if penalty not in (0.0, 1.0) and hist:
        pen = np.float32(penalty)
        for i in set(hist[-window:]):
            v = x32[i]
            x[i] = float(v * pen if v < 0 else v / pen)
    V = len(x)
    if temp <= 0 or top_k == 1:
        return {int(np.argmax(x)): 1.0}  # argmax returns the first maximum
    x = x * (1.0 / temp)
    m = x.max()
    p = np.exp(x - m)
    order = sorted(range(V), key=lambda i: (-p[i], i))
    order = [i for i in order if p[i] > 0]
    keep = len(order)
    if 0 < top_k < V:
        keep = min(keep, top_k)
    if 0 < top_p < 1:
        zk = sum(p[i] for i in order[:keep]) if top_k and top_k < V else p.sum()
        acc, L = 0.0, keep
        for j in range(keep):
            acc += p[order[j]]
            if acc >= top_p * zk:
                L = j + 1
                break
        keep = L
    if min_p > 0:
        thr = min_p * 1.0
        keep = min(keep, sum(1 for i in order if p[i] >= thr))
    keep = max(keep, 1)
    kept = sorted(order[:keep])
    mass = sum(p[i] for i in kept)
    return {i: p[i] / mass for i in kept}


def pick(dist, u):
    ids = sorted(dist)
    acc = 0.0
    for i in ids:
        acc += dist[i]
        if acc > u:
            return i
    return ids[-1]


def emit_case(name, logits, temp=1.0, top_k=0, top_p=1.0, min_p=0.0, penalty=1.0, window=64,
              hist=(), us=(0.0, 0.1, 0.37, 0.5, 0.77, 0.999)):
    logits = [float(np.float32(v)) for v in logits]
    # The C sampler holds its settings as float32.
    temp, top_p, min_p, penalty = (float(np.float32(v)) for v in (temp, top_p, min_p, penalty))
    dist = reference(logits, temp, top_k, top_p, min_p, penalty, window, list(hist))
    print(f"case {name}")
    print(f"params {len(logits)} {float(np.float32(temp)).hex()} {top_k} {float(np.float32(top_p)).hex()} "
          f"{float(np.float32(min_p)).hex()} {float(np.float32(penalty)).hex()} {window}")
    print("hist", len(hist), *hist)
    print("logits", len(logits), *(v.hex() for v in logits))
    print("probs", len(dist), *(f"{i} {float(dist[i])!r}" for i in sorted(dist)))
    # Picks: u scaled by the total as the C code does (u * mass over
    # unnormalized p) equals u over normalized probabilities up to rounding;
    # draws are kept away from boundaries so rounding cannot flip them.
    ids = sorted(dist)
    cum = np.cumsum([dist[i] for i in ids])
    picks = []
    for u in us:
        if np.min(np.abs(cum - u)) < 1e-9:
            continue
        picks.append((u, pick(dist, u)))
    print("pick", len(picks), *(f"{float(u).hex()} {i}" for u, i in picks))
    print("end")


def main():
    for seed in (0, 1, 42, 0xDEADBEEFCAFEBABE):
        r = Xoshiro256ss(seed)
        outs = [r.next() for _ in range(8)]
        print("rng", hex(seed), len(outs), *(hex(v) for v in outs))

    rs = np.random.default_rng(1234)
    V = 50
    base = rs.normal(0, 1, V).astype(np.float32)
    peaked = base.copy()
    peaked[7] += 8
    ties = np.zeros(V, dtype=np.float32)
    ties[[3, 9, 20, 21]] = 2.0
    big = rs.normal(0, 3, 2000).astype(np.float32)
    neg = base.copy()
    neg[[1, 2]] = -np.inf
    neg[5] = np.nan

    emit_case("greedy", base, temp=0.0)
    emit_case("greedy_ties_lowest_id", ties, temp=0.0)
    emit_case("greedy_penalty", peaked, temp=0.0, penalty=1e6, hist=(7,))
    emit_case("temp1_full", base)
    emit_case("temp0.5_full", base, temp=0.5)
    emit_case("temp2_full", base, temp=2.0)
    emit_case("topk5", base, top_k=5)
    emit_case("topk1_is_greedy", base, top_k=1, temp=0.8)
    emit_case("topk_ties_exactly_k", ties, top_k=2)
    emit_case("topp0.9", base, top_p=0.9)
    emit_case("topp0.5_peaked", peaked, top_p=0.5)
    emit_case("topp_small_keeps_one", base, top_p=1e-6)
    emit_case("minp0.1", base, min_p=0.1)
    emit_case("minp0.5_temp0.7", base, min_p=0.5, temp=0.7)
    emit_case("topk10_topp0.8", base, top_k=10, top_p=0.8)
    emit_case("topk10_topp0.8_minp0.05_temp1.3", base, top_k=10, top_p=0.8, min_p=0.05, temp=1.3)
    emit_case("penalty1.3_window", base, penalty=1.3, window=4, hist=(0, 1, 2, 3, 4, 5, 4, 4))
    emit_case("penalty0.7_boost", base, penalty=0.7, hist=(10, 11, 12))
    emit_case("penalty_topk_topp", peaked, penalty=1.5, top_k=20, top_p=0.95, hist=(7, 7, 3))
    emit_case("neg_inf_and_nan", neg, top_p=0.95)
    emit_case("large_vocab_topp0.95", big, top_p=0.95, temp=0.9)
    emit_case("large_vocab_topk40_topp0.9", big, top_k=40, top_p=0.9)
    emit_case("large_vocab_minp0.02", big, min_p=0.02)
    emit_case("large_vocab_flat_topp0.95", big, top_p=0.95, temp=10.0)
    emit_case("large_vocab_topk1500_topp0.99", big, top_k=1500, top_p=0.99)


if __name__ == "__main__":
    main()
