#!/usr/bin/env python3
"""tests/store/test_concurrency.py - readers against a writer.

Reader processes repeatedly open models and hash every tensor (`lmstore
verify [MODEL] --json`: one snapshot, segments mapped under the readers'
shared lock, every blob's XXH3-128 recomputed; and `lmstore bench load
MODEL --verify`: the loader's open, views into flock'd mappings, every
tensor checked against its hash) while another process loops
import, rm and gc. Every read must see a whole model with correct bytes or
no model at all: no torn model, no crash, no bytes of a gc'd segment.
At the end, with the readers gone, gc must give back everything but the
model that stayed: no garbage left for verify to count.
"""
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from storeutil import BIN, gen_model, lms, scratch, segments_size  # noqa: E402

ROOT = scratch("concurrency")
SECONDS = float(os.environ.get("LMS_CONCURRENCY_SECONDS", "8"))


def main():
    store = os.path.join(ROOT, "store")
    stay = gen_model(os.path.join(ROOT, "src-stay"), "--arch", "llama", "--hidden", "64", "--layers", "2",
                     "--vocab", "256", "--seed", "21")
    churn = [gen_model(os.path.join(ROOT, f"src-w{i}"), "--arch", "qwen3", "--hidden", "64", "--layers", "3",
                       "--vocab", "1024", "--seed", str(30 + i)) for i in range(2)]
    # small segments so gc has whole segments to unlink and partial ones to compact
    lms("import", stay, "--store", store, "--name", "stay", "--segment-max", "256K", "--quiet", check=0)
    ref = {}
    for i, src in enumerate(churn):
        lms("import", src, "--store", store, "--name", f"w{i}", "--quiet", check=0)
        ref[f"w{i}"] = json.loads(lms("info", f"w{i}", "--store", store, "--json", check=0)[1])["id"]
        lms("rm", f"w{i}", "--store", store, check=0)
    lms("gc", "--store", store, check=0)
    base_size = segments_size(store)
    base_blobs = json.loads(lms("verify", "--store", store, "--json", "--quiet", check=0)[1])["blobs"]

    stop = threading.Event()
    errors = []
    stats = {"reads": 0, "loads": 0, "absent": 0, "writes": 0}
    lock = threading.Lock()

    def reader(which):
        while not stop.is_set():
            args = ["verify", "--store", store, "--json", "--quiet", "--threads", "1"]
            model = None if which == "all" else which
            if model:
                args.insert(1, model)
            p = subprocess.run([BIN, *args], capture_output=True, text=True)
            with lock:
                stats["reads"] += 1
            if p.returncode == 0:
                continue
            if p.returncode == 1 and model and "no model" in p.stderr:
                with lock:
                    stats["absent"] += 1
                continue
            errors.append(f"verify {which}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
            stop.set()

    def loader(which):
        """Opens the model through the loader (mapped views, flock'd
        segments) and checks every tensor's bytes against its hash."""
        while not stop.is_set():
            p = subprocess.run([BIN, "bench", "load", which, "--store", store, "--verify", "--threads", "1"],
                               capture_output=True, text=True)
            with lock:
                stats["loads"] += 1
            if p.returncode == 0:
                continue
            if p.returncode == 1 and "is not in the store" in p.stderr:
                with lock:
                    stats["absent"] += 1
                continue
            errors.append(f"bench load {which}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
            stop.set()

    def writer():
        i = 0
        t_end = time.monotonic() + SECONDS
        while not stop.is_set() and time.monotonic() < t_end:
            name = f"w{i % 2}"
            for args in (["import", churn[i % 2], "--store", store, "--name", name, "--quiet"],
                         ["gc", "--store", store, "--grace", "2"],
                         ["rm", name, "--store", store],
                         ["gc", "--store", store, "--grace", "2"]):
                p = subprocess.run([BIN, *args], capture_output=True, text=True)
                if p.returncode != 0:
                    errors.append(f"writer {' '.join(args[:2])}: exit {p.returncode}\n{p.stderr}")
                    stop.set()
                    return
            i += 1
            with lock:
                stats["writes"] += 1
        stop.set()

    threads = [threading.Thread(target=reader, args=(w,)) for w in ("stay", "w0", "w1", "all")]
    threads += [threading.Thread(target=loader, args=(w,)) for w in ("stay", "w0")]
    threads.append(threading.Thread(target=writer))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, "\n".join(errors)
    assert stats["writes"] >= 2 and stats["reads"] >= 8 and stats["loads"] >= 2, stats

    # the churned models still import to the same ids, the store is clean, and gc gives all back
    lms("verify", "--store", store, check=0)
    for name in ("w0", "w1"):
        rc, _, _ = lms("info", name, "--store", store)
        assert rc != 0, f"{name} should be gone"
    lms("gc", "--store", store, check=0)
    rep = json.loads(lms("verify", "--store", store, "--json", "--quiet", check=0)[1])
    assert rep["garbage_bytes"] == 0 and rep["blobs"] == base_blobs, rep
    # what stays may sit in other segments than before (compaction moved it),
    # never in more than twice the space (gc compacts segments under half live)
    assert segments_size(store) <= 2 * base_size, (segments_size(store), base_size)
    print(f"concurrency: {stats['writes']} import/gc/rm/gc rounds, {stats['reads']} verified reads and "
          f"{stats['loads']} verified loader opens ({stats['absent']} of a removed model)")


main()
