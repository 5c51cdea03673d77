#!/usr/bin/env python3
"""tests/store/test_crash_import.py - crash safety of `lmstore import`.

The import of a model into a store that already holds another is killed
with SIGKILL

  - at every named crash point the import passes (LMS_CRASH_AT=N for each N,
    store/import.c lists them: data written, data synced, before and after
    the LMDB commit, after the append lock is released), each one checked
    against what it must leave: before the commit the model is absent, after
    it the model is complete;
  - then at 50 seeded random times within the measured run time
    (LMS_CRASH_TRIALS overrides the 50).

After each kill: `lmstore verify` passes, the model is either fully present
with the reference tensor hashes (those of a clean import) or absent, the
other model is intact, and a following `gc` brings the segments to exactly
the size a clean store has after gc, with or without the import.
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_crash as tc  # noqa: E402
from storeutil import BIN, gen_model, lms  # noqa: E402

# crash points the import must pass, in order (a clean import into a store
# that has room in its last segment and needs new ones)
REQUIRED = ["import:data-written", "import:data-synced", "import:before-commit", "import:after-commit",
            "import:done"]
AFTER_COMMIT = ("import:after-commit", "import:done")


def kill_at(args, n):
    """Run with LMS_CRASH_AT=n; returns the name of the point it died at."""
    env = dict(os.environ, LMS_CRASH_AT=str(n), LMS_CRASH_VERBOSE="1")
    p = subprocess.run([BIN, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert p.returncode == -9, f"crash point {n} not reached (exit {p.returncode}): {p.stderr}"
    for line in p.stderr.splitlines():
        if line.startswith("lms-crashpoint: killed at"):
            return line.split("(", 1)[1].rstrip(")")
    raise AssertionError(f"crash point {n}: no name reported: {p.stderr}")


def main():
    root = tc.ROOT
    src_base = gen_model(os.path.join(root, "src-base"), *tc.BASE)
    src_new = gen_model(os.path.join(root, "src-new"), *tc.NEW)
    tc.SOURCES.update(base=src_base, new=src_new)
    # 600 KB segments: the import fills the last one and creates several
    template = os.path.join(root, "t-import")
    lms("import", src_base, "--store", template, "--name", "base", "--segment-max", "600K", "--quiet", check=0)
    ref_store = tc.clone(template, "ref-import")
    lms("import", src_new, "--store", ref_store, "--name", "new", "--quiet", check=0)
    ref = {"base": tc.hashes(template, "base"), "new": tc.hashes(ref_store, "new")}
    size_with = tc.gc_size(ref_store)
    size_without = tc.gc_size(tc.clone(template, "ref-import-gc"))

    def args_for(store):
        return ["import", src_new, "--store", store, "--name", "new", "--quiet"]

    def check(store, tag, present_expected=None):
        has_new = tc.check_store(store, ref, present_expected)
        size = tc.gc_size(store)
        want = size_with if has_new else size_without
        assert size == want, (f"import {tag}: segments {size} bytes after gc, want {want} "
                              f"({'with' if has_new else 'without'} the model)")
        return has_new

    # 1. every crash point; batches of ~500 KB (LMSTORE_IMPORT_BATCH_BYTES) so
    # that data is written in several steps and some kills land between them
    os.environ["LMSTORE_IMPORT_BATCH_BYTES"] = "500000"
    k = tc.crash_points(args_for(tc.clone(template, "probe")))
    names = []
    for n in range(1, k + 1):
        store = tc.clone(template, f"at-{n % 2}")
        name = kill_at(args_for(store), n)
        names.append(name)
        check(store, f"crash point {n} ({name})", present_expected=name in AFTER_COMMIT)
    seen = [x for i, x in enumerate(names) if x not in names[:i]]
    assert [x for x in seen if x in REQUIRED] == REQUIRED, f"crash points passed: {names}"
    assert names.count("import:data-written") > 1, f"crash points passed: {names}"
    del os.environ["LMSTORE_IMPORT_BATCH_BYTES"]

    # 2. seeded random times
    t0 = time.monotonic()
    tc.run(args_for(tc.clone(template, "probe")))
    dur = time.monotonic() - t0
    killed = present = 0
    bad = []
    for i in range(tc.TRIALS):
        store = tc.clone(template, f"time-{i % 2}")
        at = tc.RNG.uniform(0.0, dur * 1.1)
        tag = f"trial {i} (kill after {at:.3f} s)"
        try:
            killed += tc.run(args_for(store), kill_after=at)
            present += check(store, tag)
        except AssertionError as e:
            bad.append(f"{tag}: {e}")
            print(f"INCONSISTENCY import {tag}: {e}")
    print(f"import: {k} crash points ({', '.join(seen)}); {tc.TRIALS} timed kills ({killed} died mid-run, "
          f"model present after {present}); {len(bad)} inconsistencies")
    assert not bad, "\n".join(bad)
    print(f"crash test (import) passed: {k + tc.TRIALS} kills, 0 inconsistencies")


if __name__ == "__main__":
    main()
