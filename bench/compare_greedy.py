#!/usr/bin/env python3
"""bench/compare_greedy.py - greedy ids of `lmstore run` against a peer's
(bench/bench_engine_hf.py greedy output), prompt by prompt: identical, or
the first step where they diverge with the peer's top-2 logit margin there
(a small margin means the two engines' rounding picked different ids) and
lmstore's own top-2 margin at the same step (`lmstore logits` on the prompt
and the ids both engines agreed on).

  compare_greedy.py PEER.json LMSTORE STORE MODEL DEVICE
"""
import json
import os
import struct
import subprocess
import sys
import tempfile


def top2_margin(lms, store, model, device, ids):
    """lmstore's largest logit minus its second at the last of ids, or None."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.f32")
        p = subprocess.run([lms, "logits", model, "--store", store, "--device", device, "--prompt-ids",
                            ",".join(map(str, ids)), "--out", out], capture_output=True, text=True)
        if p.returncode:
            return None
        with open(out, "rb") as f:
            raw = f.read()
    v = sorted(struct.unpack(f"<{len(raw) // 4}f", raw), reverse=True)
    return v[0] - v[1]


def main():
    peer_path, lms, store, model, device = sys.argv[1:6]
    with open(peer_path) as f:
        peer = json.load(f)
    all_same = True
    for i, case in enumerate(peer):
        n = len(case["ids"])
        cmd = [lms, "run", model, "--store", store, "--device", device, "--prompt-ids",
               ",".join(map(str, case["prompt_ids"])), "--max-tokens", str(n), "--ignore-eos", "--temp", "0",
               "--json"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode:
            print(json.dumps({"what": "greedy_compare", "prompt": i, "error": p.stderr.strip()[-400:]}))
            all_same = False
            continue
        ours = json.loads(p.stdout)["ids"]
        div = next((k for k in range(min(n, len(ours))) if ours[k] != case["ids"][k]), None)
        same = div is None and len(ours) == n
        all_same &= same
        rec = {"what": "greedy_compare", "model": model, "device": device, "prompt": i, "tokens": n,
               "identical": same}
        if div is not None:
            rec.update({"first_divergence": div, "peer_id": case["ids"][div], "lmstore_id": ours[div],
                        "peer_top2_margin": case["margins"][div],
                        "min_peer_margin_before": min(case["margins"][:div]) if div else None,
                        "lmstore_top2_margin": top2_margin(lms, store, model, device,
                                                           case["prompt_ids"] + ours[:div])})
        print(json.dumps(rec), flush=True)
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
