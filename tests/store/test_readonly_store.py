#!/usr/bin/env python3
"""tests/store/test_readonly_store.py - a store a user may read but not write
(a shared store another account owns; a read-only mount):

  - a user without write permission reads a current-format store: ls, info,
    verify, export, run; LMDB cannot enter such a reader in its reader table
    (index/lock.mdb), so it reads under a shared lock on index/data.mdb that
    every writer's transaction takes exclusively: verify passes throughout
    while the owner imports, removes and collects garbage meanwhile;
  - writing says exactly which permission is missing;
  - a format-1 store (whose older writers do not take that lock) is refused
    for such a reader with a message naming index/lock.mdb and the upgrade;
  - on a read-only bind mount both formats read (nobody can write there).

The other user is `nobody` through setpriv(1); the mount needs root. Each
part is skipped (exit 77 when all are) with the reason when not possible.
"""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from storeutil import BIN, SRC, gen_model, lms, read_safetensors_raw, scratch  # noqa: E402

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
skipped = []
ROOT = scratch("readonly")
if subprocess.run([*NOBODY, "test", "-x", ROOT], capture_output=True).returncode != 0:
    # the scratch folder lies under folders the other user may not enter
    ROOT = tempfile.mkdtemp(prefix="lmstore-readonly-")
    atexit.register(shutil.rmtree, ROOT, True)


def as_nobody(*args, check=None):
    p = subprocess.run([*NOBODY, BIN, *map(str, args)], capture_output=True, text=True)
    if check is not None and p.returncode != check:
        raise AssertionError(f"(nobody) lmstore {' '.join(map(str, args))}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    return p.returncode, p.stdout, p.stderr


def can_use_nobody():
    if os.geteuid() != 0:
        return "not root: cannot switch to another user"
    if not shutil.which("setpriv"):
        return "setpriv(1) is not installed"
    p = subprocess.run([*NOBODY, "true"], capture_output=True)
    return None if p.returncode == 0 else "setpriv cannot switch to nobody here"


def readable_by_all(path):
    os.chmod(ROOT, 0o755)
    for dirpath, dirnames, filenames in os.walk(path):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)


def make_store(tag):
    src = gen_model(os.path.join(ROOT, tag + "-src"), "--arch", "llama", "--hidden", "64", "--layers", "2",
                    "--vocab", "256", "--seed", "31", "--single-file")
    store = os.path.join(ROOT, tag)
    lms("import", src, "--store", store, "--name", "m", "--quiet", check=0)
    readable_by_all(ROOT)
    return src, store


def test_another_user_reads_a_store_it_cannot_write():
    src, store = make_store("shared")
    as_nobody("ls", "--store", store, check=0)
    as_nobody("info", "m", "--store", store, check=0)
    rc, out, err = as_nobody("verify", "--store", store)
    assert rc == 0, out + err
    exp = os.path.join(ROOT, "shared-export")
    os.makedirs(exp)
    os.chmod(exp, 0o777)
    as_nobody("export", "m", exp + "/out", "--store", store, check=0)
    assert read_safetensors_raw(os.path.join(exp, "out", "model.safetensors")) == \
        read_safetensors_raw(os.path.join(src, "model.safetensors"))
    for args, what in ((("rm", "m"), "write access to"), (("gc",), "write access to")):
        rc, _, err = as_nobody(*args, "--store", store)
        assert rc == 1 and "permission denied" in err and what in err and store in err, err


def test_readers_without_a_reader_slot_never_see_a_writer():
    src, store = make_store("busy")
    src2 = gen_model(os.path.join(ROOT, "busy-src2"), "--arch", "llama", "--hidden", "64", "--layers", "3",
                     "--vocab", "256", "--seed", "32", "--shard-size", "64K")
    readable_by_all(ROOT)
    deadline = time.monotonic() + 6
    writer = subprocess.Popen(["bash", "-c", f"""
        while [ $(date +%s) -lt {int(time.time()) + 6} ]; do
          {BIN} import {src2} --store {store} --name w --quiet >/dev/null || exit 1
          {BIN} rm w --store {store} >/dev/null || exit 1
          {BIN} gc --store {store} --grace 0.2 >/dev/null || exit 1
        done"""])
    runs = 0
    while time.monotonic() < deadline:
        rc, out, err = as_nobody("verify", "--store", store, "--quiet")
        assert rc == 0, f"verify by a reader without a reader slot, while the owner writes: {out}{err}"
        runs += 1
    assert writer.wait() == 0, "the writer failed"
    assert runs >= 3, runs
    print(f"  {runs} verifies by another user while the owner imported, removed and collected")


def test_a_format_1_store_names_what_its_reader_needs():
    store = os.path.join(ROOT, "v1")
    shutil.copytree(os.path.join(SRC, "tests", "fixtures", "store-v1", "store"), store)
    readable_by_all(ROOT)
    os.remove(os.path.join(store, "index", "lock.mdb")) if os.path.exists(os.path.join(store, "index", "lock.mdb")) \
        else None
    lms("ls", "--store", store, check=0)  # the owner creates lock.mdb (0644: others may not write it)
    rc, _, err = as_nobody("ls", "--store", store)
    assert rc == 1 and "index/lock.mdb" in err and "permission denied" in err and "upgrade" in err, err


def test_a_read_only_mount_reads_both_formats():
    if os.geteuid() != 0:
        skipped.append("read-only mount: not root")
        return
    _, store = make_store("mnt-src")
    v1 = os.path.join(ROOT, "mnt-v1")
    shutil.copytree(os.path.join(SRC, "tests", "fixtures", "store-v1", "store"), v1)
    for tag, path in (("v2", store), ("v1", v1)):
        mnt = os.path.join(ROOT, "mnt-" + tag + "-ro")
        os.makedirs(mnt)
        if subprocess.run(["mount", "--bind", path, mnt]).returncode != 0:
            skipped.append("read-only mount: mount --bind is not permitted here")
            return
        try:
            if subprocess.run(["mount", "-o", "remount,bind,ro", mnt]).returncode != 0:
                skipped.append("read-only mount: remount ro is not permitted here")
                return
            rc, out, err = lms("verify", "--store", mnt)
            assert rc == 0, f"{tag} on a read-only mount: {out}{err}"
            rc, _, err = lms("rm", "m", "--store", mnt)
            assert rc == 1, err
        finally:
            subprocess.run(["umount", mnt])


if __name__ == "__main__":
    why = can_use_nobody()
    names = [n for n in list(globals()) if n.startswith("test_")]
    failed = ran = 0
    for n in names:
        if why and "mount" not in n:
            skipped.append(f"{n}: {why}")
            continue
        ran += 1
        try:
            globals()[n]()
            print(f"ok   {n}")
        except Exception as e:
            failed += 1
            print(f"FAIL {n}: {e}")
    for s in skipped:
        print(f"skipped: {s}")
    print(f"{ran - failed}/{ran} passed")
    sys.exit(1 if failed else (77 if ran == 0 or len(skipped) == len(names) else 0))
