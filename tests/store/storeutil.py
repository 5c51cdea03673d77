"""tests/store/storeutil.py - helpers for the store's Python tests: running
the lmstore CLI, digests of a store tree, writing safetensors files byte by
byte (including malformed ones), and generating models with tests/gen_model.py.
"""
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

SRC = os.environ.get("LMS_SRC_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("LMS_BIN", "lmstore")
TMP = os.environ.get("LMS_TMP", "/tmp/lmstore-test")


def scratch(tag):
    d = os.path.join(TMP, tag)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def lms(*args, check=None):
    """Run the CLI; returns (exit status, stdout, stderr)."""
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True)
    if check is not None and p.returncode != check:
        raise AssertionError(f"lmstore {' '.join(map(str, args))}: exit {p.returncode}, want {check}\n"
                             f"stdout: {p.stdout}\nstderr: {p.stderr}")
    return p.returncode, p.stdout, p.stderr


def tree_digest(root):
    """SHA-256 over every regular file under root (names and bytes), except
    LMDB's reader table index/lock.mdb, which any reader rewrites and which
    holds no store content (docs/FORMAT.md section 1)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for f in sorted(filenames):
            p = os.path.join(dirpath, f)
            rel = os.path.relpath(p, root)
            if rel == os.path.join("index", "lock.mdb"):
                continue
            h.update(rel.encode() + b"\0")
            with open(p, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


def st_bytes(header, data=b"", raw_header=None, header_len=None):
    """A safetensors file: u64 header length, JSON header, data."""
    hj = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    n = len(hj) if header_len is None else header_len
    return struct.pack("<Q", n) + hj + data


def write(path, blob):
    with open(path, "wb") as f:
        f.write(blob)


def gen_model(out, *args):
    subprocess.run([sys.executable, os.path.join(SRC, "tests", "gen_model.py"), out, "--force", *map(str, args)],
                   check=True, capture_output=True)
    return out


def read_safetensors_raw(path):
    """{name: (dtype, shape, bytes)} parsed with the plain format rules."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    hdr = json.loads(blob[8:8 + n])
    base = 8 + n
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[k] = (v["dtype"], v["shape"], blob[base + b:base + e])
    return out


def segment_bytes(store, seg, off, n):
    with open(os.path.join(store, "segments", f"{seg:08d}.seg"), "rb") as f:
        f.seek(off)
        return f.read(n)


def segments_size(store):
    d = os.path.join(store, "segments")
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def run_tests(glb):
    """Run every function named test_* in glb, in file order; exit non-zero on failure."""
    names = [n for n in glb if n.startswith("test_") and callable(glb[n])]
    failed = 0
    for n in names:
        try:
            glb[n]()
            print(f"ok   {n}")
        except Exception as e:  # report and go on
            failed += 1
            print(f"FAIL {n}: {e}")
    print(f"{len(names) - failed}/{len(names)} passed")
    sys.exit(1 if failed else 0)
