#!/usr/bin/env python3
"""
tests/tools/test_cli_numbers.py - the numbers users read: `gc` reports the
disk space it gave back with the holes it punched (checked against the
blocks the segment files hold before and after), `ls` splits each model's
bytes on disk into its own and those it shares with other models (checked
against the tensors that differ), and the import progress bar counts the
model's bytes once (read from a real terminal).
"""
import ctypes
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clitest as ct  # noqa: E402

D = ct.scratch("numbers")


def blocks(store):
    d = os.path.join(store, "segments")
    return sum(os.stat(os.path.join(d, f)).st_blocks * 512 for f in os.listdir(d))


def can_punch_holes(folder):
    """Whether the file system under folder supports FALLOC_FL_PUNCH_HOLE."""
    p = os.path.join(folder, "probe")
    with open(p, "wb") as f:
        f.write(b"\1" * (1 << 20))
        f.flush()
        os.fsync(f.fileno())
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        ok = libc.fallocate(f.fileno(), 0x01 | 0x02, 0, 1 << 20) == 0  # KEEP_SIZE | PUNCH_HOLE
    os.remove(p)
    return ok


def test_gc_counts_the_holes_it_punches():
    if not can_punch_holes(D):
        print("skipped: this file system cannot punch holes")
        return
    store = os.path.join(D, "gcstore")
    sizes = {}
    for i, m in enumerate(("a", "b", "c")):  # three models one after the other in one segment
        src = ct.gen_model(os.path.join(D, "gc_" + m), "--hidden", "256", "--seed", str(i + 1), "--single-file")
        ct.ok("import", src, "--store", store, "--name", m, "-q")
        sizes[m] = json.loads(ct.ok("ls", "--store", store, "--json").stdout)[-1]["disk_bytes"]
    ct.ok("rm", "b", "--store", store)
    dry = json.loads(ct.ok("gc", "--store", store, "--json", "--dry-run").stdout)
    before = blocks(store)
    r = json.loads(ct.ok("gc", "--store", store, "--json").stdout)
    after = blocks(store)
    # b's blobs lay between a's and c's: the segment keeps its size, the blocks go
    assert r["bytes_after"] == r["bytes_before"] and r["segments_truncated"] == 0, r
    assert r["bytes_punched"] >= sizes["b"] * 0.9, (r, sizes)
    assert r["bytes_freed"] == r["bytes_punched"], r
    assert abs((before - after) - r["bytes_freed"]) <= 64 * 1024, (before, after, r)
    assert dry["bytes_freed"] == r["bytes_freed"] and dry["bytes_punched"] == r["bytes_punched"], (dry, r)
    p = ct.ok("gc", "--store", store)
    assert p.stdout.startswith("freed 0.00 MB"), p.stdout  # nothing left to give back
    ct.ok("verify", "--store", store)


def test_ls_separates_own_and_shared_bytes():
    import numpy as np
    from safetensors.numpy import load_file, save_file
    store = os.path.join(D, "lsstore")
    a = ct.gen_model(os.path.join(D, "ls_a"), "--single-file", "--seed", "7", "--dtype", "F32")
    b = os.path.join(D, "ls_b")
    shutil.copytree(a, b, dirs_exist_ok=True)
    t = load_file(os.path.join(a, "model.safetensors"))
    emb = "model.embed_tokens.weight"
    t[emb] = np.ascontiguousarray(t[emb][::-1])  # b differs from a in this one tensor
    save_file(t, os.path.join(b, "model.safetensors"))
    emb_bytes = t[emb].nbytes
    ct.ok("import", a, "--store", store, "--name", "a", "-q")
    m = {x["name"]: x for x in json.loads(ct.ok("ls", "--store", store, "--json").stdout)}
    assert m["a"]["own_bytes"] == m["a"]["disk_bytes"] and m["a"]["shared_bytes"] == 0, m
    ct.ok("import", b, "--store", store, "--name", "b", "-q")
    ct.ok("cp", "a", "a-copy", "--store", store)
    m = {x["name"]: x for x in json.loads(ct.ok("ls", "--store", store, "--json").stdout)}
    total = m["a"]["disk_bytes"]
    assert m["b"]["disk_bytes"] == total, m
    # a and its copy share everything; b shares all but its embedding
    assert (m["a"]["own_bytes"], m["a"]["shared_bytes"]) == (0, total), m["a"]
    assert (m["a-copy"]["own_bytes"], m["a-copy"]["shared_bytes"]) == (0, total), m["a-copy"]
    assert (m["b"]["own_bytes"], m["b"]["shared_bytes"]) == (emb_bytes, total - emb_bytes), m["b"]
    # the text table shows the same split
    rows = {ln.split()[0]: ln for ln in ct.ok("ls", "--store", store).stdout.splitlines()[1:]}
    assert re.search(r"\s0 B\s+", rows["a"]), rows["a"]


def progress_frames(args):
    """Run the CLI with stderr on a terminal; the progress bar's 'done/total UNIT' frames."""
    master, slave = pty.openpty()
    p = subprocess.Popen([ct.BIN, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    buf = b""
    while True:
        r, _, _ = select.select([master], [], [], 60)
        if not r:
            break
        try:
            d = os.read(master, 4096)
        except OSError:
            break
        if not d:
            break
        buf += d
    p.wait(timeout=60)
    os.close(master)
    assert p.returncode == 0, buf
    return [(float(a), float(b), u) for a, b, u in
            re.findall(rb"import \[[#.]+\] +[\d.]+% ([\d.]+)/([\d.]+) (\w+)", buf)]


def test_import_progress_counts_the_bytes_once():
    src = ct.gen_model(os.path.join(D, "progress"), "--hidden", "256", "--layers", "4")
    frames = progress_frames(["import", src, "--store", os.path.join(D, "progress_store"), "--name", "p"])
    m = json.loads(ct.ok("ls", "--store", os.path.join(D, "progress_store"), "--json").stdout)[0]
    assert frames, "no progress drawn on a terminal"
    want = m["bytes"] / 1e6
    for done, total, unit in frames:
        assert unit == b"MB" and abs(total - want) < 0.006, (frames, want)
        assert done <= total + 1e-9, frames
    assert abs(frames[-1][0] - want) < 0.006, frames  # ends at the model's size, not half or twice of it


ct.run_tests(globals())
