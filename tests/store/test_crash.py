#!/usr/bin/env python3
"""tests/store/test_crash.py - crash safety: `lmstore import`, `rm` and `gc`
killed with SIGKILL at 50 seeded points each (this file runs gc's campaign,
test_crash_import.py and test_crash_rm.py the others), then the store is
checked:

  - `lmstore verify` passes (index consistent, every blob's bytes match);
  - every model is either fully present with its reference tensor hashes
    (those of a clean run) or absent, and untouched models are intact;
  - a following `gc` brings the segments to exactly the size a clean store
    has after gc, with or without the killed operation's effect.

Kill points: every named crash point the command passes (LMS_CRASH_AT=N,
common/crashpoint.h: before/after fsyncs, commits, unlinks, truncations),
then seeded random times within the command's measured run time.
LMS_CRASH_TRIALS overrides the 50 trials per command.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from storeutil import BIN, gen_model, lms, scratch, segments_size  # noqa: E402

TRIALS = int(os.environ.get("LMS_CRASH_TRIALS", "50"))
ROOT = scratch("crash")
RNG = random.Random(20261122)

BASE = ("--arch", "llama", "--hidden", "64", "--layers", "2", "--vocab", "256", "--seed", "11")
# big enough that an import spends a while writing (a few MB)
NEW = ("--arch", "qwen3", "--hidden", "128", "--layers", "6", "--vocab", "4096", "--seed", "12",
       "--shard-size", "1M")


def hashes(store, model):
    rc, out, _ = lms("info", model, "--store", store, "--json")
    if rc != 0:
        return None
    return {t["name"]: t["hash"] for t in json.loads(out)["tensors"]}


def run(args, env_extra=None, kill_after=None):
    """Run the CLI; SIGKILL it after kill_after seconds if given. Returns
    True if the process died by SIGKILL."""
    env = dict(os.environ)
    env.pop("LMS_CRASH_AT", None)
    env.update(env_extra or {})
    p = subprocess.Popen([BIN, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if kill_after is not None:
        try:
            p.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGKILL)
    _, err = p.communicate()
    if p.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"lmstore {' '.join(args)} failed ({p.returncode}): {err.decode()}")
    return p.returncode == -signal.SIGKILL


def crash_points(args):
    env = dict(os.environ, LMS_CRASH_COUNT="1")
    p = subprocess.run([BIN, *args], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    for line in p.stderr.splitlines():
        if line.startswith("lms-crashpoints:"):
            return int(line.split()[1])
    return 0


def gc_size(store):
    lms("gc", "--store", store, "--grace", "1", check=0)
    return segments_size(store)


def clone(template, tag):
    d = os.path.join(ROOT, tag)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(template, d)
    return d


def check_store(store, ref, present_expected=None):
    """verify passes; 'base' intact; 'new' absent or complete. Returns whether
    'new' is present."""
    rc, out, err = lms("verify", "--store", store, "--json", "--quiet")
    assert rc == 0, f"verify after crash: {out} {err}"
    rep = json.loads(out)
    has_new = rep["models"] == 2
    # every tensor of each model present is there (verify checked the bytes of each)
    assert rep["tensors"] == len(ref["base"]) + (len(ref["new"]) if has_new else 0), rep
    if has_new:
        assert hashes(store, "new") == ref["new"], "model 'new' is present but not the reference"
    elif RNG.random() < 0.2:  # 'base' by name now and then: the other model's records untouched
        assert hashes(store, "base") == ref["base"], "untouched model changed"
    if present_expected is not None:
        assert has_new == present_expected
    return has_new


def campaign(name, template, args_for, ref, size_with, size_without, present_after_gc=None):
    """Kill `lmstore <args>` at crash points then random times."""
    probe = clone(template, name + "-probe")
    k = crash_points(args_for(probe))
    t0 = time.monotonic()
    run(args_for(clone(template, name + "-probe")))
    dur = time.monotonic() - t0
    # every crash point, or a seeded sample of them (first and last included) when there are more
    ats = list(range(1, k + 1))
    if k > TRIALS:
        ats = sorted({1, k, *RNG.sample(range(2, k), TRIALS - 2)})
    points = [("at", n) for n in ats]
    while len(points) < TRIALS:
        points.append(("time", RNG.uniform(0.0, dur * 1.1)))
    killed = present = 0
    for i, (how, val) in enumerate(points):
        store = clone(template, f"{name}-{i % 2}")
        a = args_for(store)
        if how == "at":
            died = run(a, {"LMS_CRASH_AT": str(val)})
            assert died, f"{name}: crash point {val} of {k} not reached"
        else:
            died = run(a, kill_after=val)
        killed += died
        has_new = check_store(store, ref)
        present += has_new
        size = gc_size(store)
        want = size_with if has_new else size_without
        assert size == want, (f"{name} trial {i} ({how} {val}): segments {size} bytes after gc, "
                              f"want {want} ({'with' if has_new else 'without'} the op)")
        if present_after_gc is not None:
            assert check_store(store, ref) == present_after_gc
    print(f"{name}: {len(points)} kills ({k} crash points, {TRIALS - min(k, TRIALS)} timed; "
          f"{killed} died mid-run), model present after {present}")
    return killed


def main(which):
    """Run the campaign for `which` (import, rm or gc): tests/store/test_crash.py
    runs gc's, test_crash_import.py and test_crash_rm.py the others, so ctest
    runs them side by side."""
    src_base = gen_model(os.path.join(ROOT, "src-base"), *BASE)
    src_new = gen_model(os.path.join(ROOT, "src-new"), *NEW)

    # 600 KB segments: 'new' spans several, and removing it leaves the first
    # one sparse, so gc compacts, unlinks and trims
    t_import = os.path.join(ROOT, "t-import")
    lms("import", src_base, "--store", t_import, "--name", "base", "--segment-max", "600K", "--quiet", check=0)
    ref_store = clone(t_import, "ref-import")
    lms("import", src_new, "--store", ref_store, "--name", "new", "--quiet", check=0)
    ref = {"base": hashes(t_import, "base"), "new": hashes(ref_store, "new")}
    with_new = gc_size(ref_store)
    without_new = gc_size(clone(t_import, "ref-import-gc"))

    if which == "import":
        campaign("import", t_import, lambda st: ["import", src_new, "--store", st, "--name", "new", "--quiet"],
                 ref, with_new, without_new)
    elif which == "rm":
        # the template holds both models
        campaign("rm", clone(ref_store, "t-rm"), lambda st: ["rm", "new", "--store", st], ref, with_new,
                 without_new)
    else:
        # 'new' removed, and garbage a crashed import would leave (bytes past the last blob)
        t_gc = clone(ref_store, "t-gc")
        lms("rm", "new", "--store", t_gc, check=0)
        segs = sorted(os.listdir(os.path.join(t_gc, "segments")))
        with open(os.path.join(t_gc, "segments", segs[-1]), "ab") as f:
            f.write(os.urandom(300_000))
        campaign("gc", t_gc, lambda st: ["gc", "--store", st, "--grace", "1"], ref, None, without_new,
                 present_after_gc=False)
    print(f"crash test ({which}) passed")


if __name__ == "__main__":
    main("gc")
