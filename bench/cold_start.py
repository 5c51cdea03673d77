#!/usr/bin/env python3
"""bench/cold_start.py - whole-process start to first output: runs a command
REPS times and times exec -> the first byte it writes to stdout (the first
token printed), then waits for it to exit. One JSON line: median, min, max.

  cold_start.py [--reps N] [--label L] [--drop] -- CMD ARGS...

--drop drops the page cache before each run (root; echo 3 >
/proc/sys/vm/drop_caches): the cold figure.
"""
import json
import os
import statistics
import subprocess
import sys
import time


def main():
    argv = sys.argv[1:]
    reps, label, drop = 5, "", False
    while argv and argv[0] != "--":
        a = argv.pop(0)
        if a == "--reps":
            reps = int(argv.pop(0))
        elif a == "--label":
            label = argv.pop(0)
        elif a == "--drop":
            drop = True
        else:
            sys.exit(__doc__)
    cmd = argv[1:]
    times, ends = [], []
    for _ in range(reps):
        if drop:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        first = p.stdout.read(1)
        t1 = time.perf_counter()
        p.stdout.read()
        rc = p.wait()
        t2 = time.perf_counter()
        if rc or not first:
            print(json.dumps({"what": "cold_start", "label": label, "error": rc, "cmd": " ".join(cmd)}))
            return 1
        times.append(t1 - t0)
        ends.append(t2 - t0)
    print(json.dumps({"what": "cold_start", "label": label, "drop": drop, "reps": reps,
                      "first_output_s_median": statistics.median(times), "min": min(times), "max": max(times),
                      "exit_s_median": statistics.median(ends), "all": times}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
