#!/usr/bin/env python3
"""tests/store/test_resources.py - resources reported as what they are:

  - a small file system made full in the test (a tmpfs mounted with size=):
    an import whose LMDB commit meets the full disk says the disk is full
    (not "Input/output error"), changes nothing, and index/data.mdb keeps
    the size it had (LMDB wrote the failed transaction's pages past its end:
    they are given back); an import whose segment writes meet it names the
    segment file and leaves the store byte for byte as before; once there is
    room the same imports go through;
  - verify under an address-space limit (RLIMIT_AS) that a segment's mapping
    does not fit reports memory, not a damaged segment.

The mount needs root (CAP_SYS_ADMIN); the limit, a build whose lmstore
starts under it (not the AddressSanitizer one). Each part that cannot run
here says why; the test exits 77 (skipped) when none could.
"""
import os
import resource
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from storeutil import BIN, gen_model, lms, scratch, tree_digest  # noqa: E402

ROOT = scratch("resources")
skipped = []


class Skip(Exception):
    pass


def digest_without_index(store):
    """Every file of the store but index/ (whose data.mdb a failed commit
    may have touched past its end)."""
    saved = {}
    for f in ("data.mdb", "lock.mdb"):
        p = os.path.join(store, "index", f)
        saved[f] = open(p, "rb").read() if os.path.exists(p) else None
    import hashlib
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(store)):
        dirnames.sort()
        if os.path.basename(dirpath) == "index":
            continue
        for f in sorted(filenames):
            p = os.path.join(dirpath, f)
            h.update(os.path.relpath(p, store).encode() + b"\0" + open(p, "rb").read())
    return h.hexdigest()


def fill(mnt, leave):
    """Fill the file system at mnt up to `leave` free bytes."""
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    with open(os.path.join(mnt, "filler"), "wb") as f:
        left = free - leave
        chunk = b"\1" * (1 << 20)
        while left > 0:
            f.write(chunk[:min(left, len(chunk))])
            left -= len(chunk)


def test_a_full_disk_is_named_and_costs_nothing():
    if os.geteuid() != 0:
        raise Skip("not root: cannot mount a small file system")
    mnt = os.path.join(ROOT, "mnt")
    os.makedirs(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", mnt], capture_output=True).returncode:
        raise Skip("mount -t tmpfs is not permitted here")
    try:
        # many small tensors: many index records for few segment bytes
        src = gen_model(os.path.join(ROOT, "many"), "--arch", "llama", "--hidden", "64", "--layers", "60",
                        "--vocab", "256", "--seed", "51")
        other = gen_model(os.path.join(ROOT, "other"), "--arch", "llama", "--hidden", "64", "--layers", "4",
                          "--vocab", "256", "--seed", "52")
        store = os.path.join(mnt, "store")
        lms("import", src, "--store", store, "--name", "a", "--quiet", check=0)
        data = os.path.join(store, "index", "data.mdb")

        # 1. the LMDB commit meets the full disk (the same tensors again: no segment bytes)
        size0, before = os.path.getsize(data), digest_without_index(store)
        fill(mnt, 40 << 10)
        rc, out, err = lms("import", src, "--store", store, "--name", "b", "--quiet")
        assert rc == 1, (out, err)
        assert "no space left on the file system" in err and "Input/output error" not in err, err
        assert os.path.getsize(data) == size0, f"data.mdb grew from {size0} to {os.path.getsize(data)} bytes"
        assert digest_without_index(store) == before
        rc, out, err = lms("verify", "--store", store, "--json")
        assert rc == 0, out + err

        # 2. the segment writes meet it: the segment file is named, the store unchanged
        os.remove(os.path.join(mnt, "filler"))
        fill(mnt, 64 << 10)
        before = tree_digest(store)
        rc, out, err = lms("import", other, "--store", store, "--name", "o", "--quiet")
        assert rc == 1 and "No space left on device" in err and "segments/" in err, err
        assert tree_digest(store) == before, "a failed import changed the store"

        # room again: both go through
        os.remove(os.path.join(mnt, "filler"))
        lms("import", src, "--store", store, "--name", "b", "--quiet", check=0)
        lms("import", other, "--store", store, "--name", "o", "--quiet", check=0)
        lms("verify", "--store", store, check=0)
    finally:
        subprocess.run(["umount", mnt])


def limited(limit):
    def f():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return f


def test_out_of_address_space_is_memory_not_damage():
    store = os.path.join(ROOT, "as")
    src = gen_model(os.path.join(ROOT, "as-src"), "--arch", "llama", "--hidden", "64", "--layers", "2",
                    "--vocab", "256", "--seed", "53")
    lms("import", src, "--store", store, "--name", "m", "--quiet", check=0)
    seg = os.path.join(store, "segments", sorted(os.listdir(os.path.join(store, "segments")))[-1])
    limit = 3 << 30
    with open(seg, "r+b") as f:  # a sparse tail (what a crashed import leaves, gc's to trim): 8 GB to map
        f.truncate(os.path.getsize(seg) + (8 << 30))
    p = subprocess.run([BIN, "ls", "--store", store], capture_output=True, text=True, preexec_fn=limited(limit))
    if p.returncode != 0:
        raise Skip(f"this build's lmstore does not start under a {limit >> 30} GiB address-space limit "
                   f"(a sanitizer build reserves more): {p.stderr.strip()[:200]}")
    p = subprocess.run([BIN, "verify", "--store", store], capture_output=True, text=True,
                       preexec_fn=limited(limit))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "segment-header" not in p.stdout and "damaged" not in p.stdout, p.stdout
    assert "out of memory (address space)" in p.stderr and seg in p.stderr, p.stderr
    rc, out, err = lms("verify", "--store", store)  # without the limit: nothing is wrong
    assert rc == 0, out + err


if __name__ == "__main__":
    names = [n for n in list(globals()) if n.startswith("test_")]
    failed = ran = 0
    for n in names:
        try:
            globals()[n]()
            ran += 1
            print(f"ok   {n}")
        except Skip as e:
            skipped.append(f"{n}: {e}")
        except Exception as e:
            ran += 1
            failed += 1
            print(f"FAIL {n}: {e}")
    for s in skipped:
        print(f"skipped: {s}")
    print(f"{ran - failed}/{ran} passed")
    sys.exit(1 if failed else (77 if ran == 0 else 0))
