#!/usr/bin/env python3
"""bench/ncu_summary.py - per-kernel totals of an Nsight Compute CSV (ncu
--csv --page raw with gpu__time_duration.sum, dram__bytes_read.sum and
dram__bytes_write.sum): launches, total and mean time, DRAM bytes and GB/s,
sorted by total time. The kernels of one decode step or one prefill, as
bench/bench_engine_gpu.sh records them; --step N keeps the Nth step's only
(a step starts at its embedding kernel).

  ncu_summary.py FILE.csv [--top N] [--step N]
"""
import collections
import csv
import re
import sys


def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.reader(lines))
    head, units, data = rows[0], rows[1], rows[2:]
    col = {n: i for i, n in enumerate(head)}
    if "--step" in sys.argv:
        want, step, kept = int(sys.argv[sys.argv.index("--step") + 1]), 0, []
        for r in data:
            step += r[col["Kernel Name"]].split("::")[-1].startswith("embed")
            if step == want:
                kept.append(r)
        data = kept
    scale = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0,
             "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for r in data:
        name = re.sub(r"\(.*", "", r[col["Kernel Name"]])[:70]
        t = num(r[col["gpu__time_duration.sum"]]) * scale.get(units[col["gpu__time_duration.sum"]], 1e-9)
        by = sum(num(r[col[m]]) * scale.get(units[col[m]], 1) for m in ("dram__bytes_read.sum", "dram__bytes_write.sum"))
        a = agg[name]
        a[0] += 1
        a[1] += t
        a[2] += by
    total = sum(a[1] for a in agg.values())
    print(f"{'kernel':70} {'n':>5} {'total ms':>9} {'mean us':>9} {'GB/s':>7} {'share':>6}")
    for name, (n, t, by) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{name:70} {n:5d} {t*1e3:9.3f} {t/n*1e6:9.2f} {by/t/1e9 if t else 0:7.0f} {t/total*100:5.1f}%")
    print(f"{'all':70} {sum(a[0] for a in agg.values()):5d} {total*1e3:9.3f}")


if __name__ == "__main__":
    main()
