#!/usr/bin/env python3
"""bench/bench_tokenizer.py - encode throughput (MB/s) of lmstore's tokenizer
against HuggingFace `tokenizers`, both on one thread, on the same ~10 MB of
mixed-language documents, alternating in one run.

Text: half English prose and code (the Python standard library's .py files),
half translated UI messages in ~190 languages (the msgstr strings of the
system's gettext catalogs, /usr/share/locale/*/LC_MESSAGES/*.mo: Latin,
Cyrillic, Greek, Arabic, Hebrew, Devanagari, Thai, CJK, ...), cut into
documents of about 2 KB, each encoded with one call (no special tokens).

lmstore: the bench_tokenizer program (bench/bench_tokenizer.c, built with the
project) times its encode loop after loading. HF: Tokenizer.encode per
document and Tokenizer.encode_batch, in this process with RAYON_NUM_THREADS=1
(the faster of the two counts). Both report wall time and
process CPU time; best of --repeat passes each, the two sides alternating
--rounds times. The ids of every document must be equal (count and a
checksum), else the benchmark fails.

Usage: python3 bench/bench_tokenizer.py --build BUILD_DIR [--tokenizers DIR]
           [--names qwen3,llama3,gemma3] [--mb 10] [--rounds 3] [--repeat 2]
"""
import argparse
import glob
import gzip
import json
import os
import platform
import random
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402


def mo_strings(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 28:
        return []
    magic = struct.unpack("<I", data[:4])[0]
    end = "<" if magic == 0x950412DE else ">" if magic == 0xDE120495 else None
    if end is None:
        return []
    n, _, toff = struct.unpack(end + "III", data[8:20])
    out = []
    for i in range(1, n):
        ln, off = struct.unpack(end + "II", data[toff + 8 * i: toff + 8 * i + 8])
        try:
            out.extend(s for s in data[off:off + ln].decode("utf-8").split("\x00") if s)
        except UnicodeDecodeError:
            pass
    return out


def make_docs(mb):
    half = mb * 1024 * 1024 // 2
    docs = []

    def cut(text, size=2048):
        lines, cur, n = [], [], 0
        for line in text.splitlines(keepends=True):
            cur.append(line)
            n += len(line.encode())
            if n >= size:
                lines.append("".join(cur))
                cur, n = [], 0
        if cur:
            lines.append("".join(cur))
        return lines

    total = 0
    stdlib = sysconfig.get_paths()["stdlib"]
    for path in sorted(glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True)):
        if "/test" in path or "site-packages" in path:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        for d in cut(text):
            docs.append(d)
            total += len(d.encode())
        if total >= half:
            break
    by_lang = {}
    for path in sorted(glob.glob("/usr/share/locale/*/LC_MESSAGES/*.mo")):
        lang = path.split("/")[4]
        by_lang.setdefault(lang, []).extend(mo_strings(path))
    langs = sorted(by_lang)
    r = random.Random(1)
    total2, i = 0, 0
    while total2 < half and langs:
        lang = langs[i % len(langs)]
        msgs = by_lang[lang]
        if msgs:
            k = r.randrange(len(msgs))
            chunk = "\n".join(msgs[k:k + 40])
            for d in cut(chunk):
                docs.append(d)
                total2 += len(d.encode())
        i += 1
        if i > 100000:
            break
    r.shuffle(docs)
    return docs


def hf_run(tok, docs, repeat):
    """Best of encode() per document and encode_batch() on one rayon thread."""
    best_w, best_c, sums = 1e30, 1e30, None
    for k in range(2 * repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        if k % 2:
            out = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
        else:
            out = [tok.encode(d, add_special_tokens=False).ids for d in docs]
        w, c = time.perf_counter() - w0, time.process_time() - c0
        best_w, best_c = min(best_w, w), min(best_c, c)
        if sums is None:
            sums = [(len(ids), sum((i + 1) * x for i, x in enumerate(ids)) % (1 << 64)) for ids in out]
    return best_w, best_c, sums


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="build folder holding bench_tokenizer")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--tokenizers", default=os.path.join(here, "..", "tests", "fixtures", "tokenizers"))
    ap.add_argument("--names", default="qwen3,llama3,gemma3")
    ap.add_argument("--mb", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="lmstore-bench-tok-")
    try:
        run(a, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(a, tmp):
    docs = make_docs(a.mb)
    nbytes = sum(len(d.encode()) for d in docs)
    docs_path = os.path.join(tmp, "docs.jsonl")
    with open(docs_path, "w") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
    print(f"# {len(docs)} documents, {nbytes / 1e6:.2f} MB; {platform.processor() or platform.machine()}; "
          f"tokenizers {__import__('tokenizers').__version__}", file=sys.stderr)
    exe = os.path.join(a.build, "bench_tokenizer")
    rows = []
    for name in a.names.split(","):
        path = os.path.join(tmp, name + ".json")
        with gzip.open(os.path.join(a.tokenizers, name + ".tokenizer.json.gz"), "rb") as f, open(path, "wb") as g:
            g.write(f.read())
        tok = Tokenizer.from_file(path)
        tok.encode_special_tokens = True  # lmstore side: special tokens not parsed
        lms_w = lms_c = hf_w = hf_c = 1e30
        for rnd in range(a.rounds):
            w, c, sums = hf_run(tok, docs, a.repeat)
            hf_w, hf_c = min(hf_w, w), min(hf_c, c)
            ids_path = os.path.join(tmp, name + ".ids")
            p = subprocess.run([exe, path, docs_path, "--repeat", str(a.repeat), "--ids", ids_path],
                               capture_output=True, text=True, check=True)
            res = json.loads(p.stdout)
            lms_w, lms_c = min(lms_w, res["wall_s"]), min(lms_c, res["cpu_s"])
            if rnd == 0:
                with open(ids_path) as f:
                    ours = [tuple(int(x) for x in l.split()) for l in f]
                bad = [i for i in range(len(docs)) if ours[i] != sums[i]]
                if bad:
                    sys.exit(f"{name}: ids differ from HF on {len(bad)} documents (first: {bad[0]})")
        mb = nbytes / 1e6
        rows.append((name, res["tokens"], res["load_s"], mb / hf_w, mb / lms_w, mb / hf_c, mb / lms_c))
        print(f"{name}: HF {mb / hf_w:.2f} MB/s ({mb / hf_c:.2f} MB/CPU-s), lmstore {mb / lms_w:.2f} MB/s "
              f"({mb / lms_c:.2f} MB/CPU-s), ratio {hf_w / lms_w:.2f}x wall, {hf_c / lms_c:.2f}x CPU; "
              f"{res['tokens']} tokens, same ids", file=sys.stderr)
    print("| tokenizer | tokens | HF MB/s | lmstore MB/s | HF MB/CPU-s | lmstore MB/CPU-s | lmstore / HF (CPU) |")
    print("|---|---|---|---|---|---|---|")
    for name, ntok, load_s, hw, lw, hc, lc in rows:
        print(f"| {name} | {ntok} | {hw:.2f} | {lw:.2f} | {hc:.2f} | {lc:.2f} | {lc / hc:.2f}x |")


if __name__ == "__main__":
    main()
