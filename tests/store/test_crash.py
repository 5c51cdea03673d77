#!/usr/bin/env python3
"""tests/store/test_crash.py - crash safety: `lmstore import`, `rm`, `gc` and a
KV save (`run --save-session`) killed with SIGKILL at 50 seeded points each
(this file runs gc's campaign and holds the campaign code;
test_crash_import.py, test_crash_rm.py and test_crash_kvsave.py run the
others), then the store is checked:

  - `lmstore verify` passes (index consistent, every record's checksum,
    every blob's bytes match);
  - every model present is byte for byte its source: exported, each tensor's
    dtype, shape and bytes equal the source safetensors files'; a model is
    either complete or absent, and untouched models are intact;
  - a KV session is either absent or resumes to a clean run's continuation;
  - a following `gc` brings the segments to exactly the size a clean store
    has after gc, with or without the killed operation's effect.

Kill points: every named crash point the command passes (LMS_CRASH_AT=N,
common/crashpoint.h: before/after fsyncs, commits, unlinks, truncations),
then seeded random times within the command's measured run time.
LMS_CRASH_TRIALS overrides the 50 trials per command and LMS_CRASH_SEED the
seed; bench/crash_campaign.sh runs the long campaign. A trial whose checks
fail is counted as an inconsistency and the campaign goes on; it fails at
the end when there was any.
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
from storeutil import BIN, SRC, gen_model, lms, read_safetensors_raw, scratch, segments_size  # noqa: E402

TRIALS = int(os.environ.get("LMS_CRASH_TRIALS", "50"))
ROOT = scratch("crash")
RNG = random.Random(int(os.environ.get("LMS_CRASH_SEED", "20261122")))
SOURCES = {}  # model name -> its source folder: what a model present must equal byte for byte

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


def source_tensors(src):
    """{name: (dtype, shape, bytes)} of every shard of a source folder."""
    out = {}
    for f in sorted(os.listdir(src)):
        if f.endswith(".safetensors"):
            out.update(read_safetensors_raw(os.path.join(src, f)))
    return out


_source_cache = {}


def same_as_source(store, model):
    """Export `model` and compare every tensor with its source, byte for byte."""
    src = SOURCES[model]
    if src not in _source_cache:
        _source_cache[src] = source_tensors(src)
    out = os.path.join(ROOT, "export-check")
    shutil.rmtree(out, ignore_errors=True)
    lms("export", model, out, "--store", store, "--quiet", check=0)
    got = source_tensors(out)
    shutil.rmtree(out, ignore_errors=True)
    assert got == _source_cache[src], f"model '{model}' differs from its source {src}"


def check_store(store, ref, present_expected=None):
    """verify passes; every model present is its source byte for byte; 'base'
    intact; 'new' absent or complete. Returns whether 'new' is present."""
    rc, out, err = lms("verify", "--store", store, "--json", "--quiet")
    assert rc == 0, f"verify after crash: {out} {err}"
    rep = json.loads(out)
    _, ls, _ = lms("ls", "--store", store, "--json", check=0)
    names = sorted(m["name"] for m in json.loads(ls))
    has_new = "new" in names
    assert names == sorted(["base"] + (["new"] if has_new else [])), names
    # every tensor of each model present is there (verify checked the bytes of each)
    assert rep["tensors"] == len(ref["base"]) + (len(ref["new"]) if has_new else 0), rep
    if has_new:
        assert hashes(store, "new") == ref["new"], "model 'new' is present but not the reference"
    assert hashes(store, "base") == ref["base"], "untouched model changed"
    for m in names:
        same_as_source(store, m)
    if present_expected is not None:
        assert has_new == present_expected
    return has_new


def campaign(name, template, args_for, check):
    """Kill `lmstore <args_for(store)>` at every crash point (a seeded sample
    of them when there are more than TRIALS) then at seeded random times, in
    a fresh copy of `template` each; check(store, tag) checks what is left
    and returns whether the operation's effect is there. A trial whose check
    fails is an inconsistency: counted, named, and the campaign goes on.
    Returns (kills, inconsistencies)."""
    probe = clone(template, name + "-probe")
    k = crash_points(args_for(probe))
    t0 = time.monotonic()
    run(args_for(clone(template, name + "-probe")))
    dur = time.monotonic() - t0
    ats = list(range(1, k + 1))
    if k > TRIALS:
        ats = sorted({1, k, *RNG.sample(range(2, k), TRIALS - 2)})
    points = [("at", n) for n in ats]
    while len(points) < TRIALS:
        points.append(("time", RNG.uniform(0.0, dur * 1.1)))
    killed = present = 0
    bad = []
    for i, (how, val) in enumerate(points):
        store = clone(template, f"{name}-{i % 2}")
        a = args_for(store)
        tag = f"{name} trial {i} ({'crash point' if how == 'at' else 'kill after'} {val if how == 'at' else round(val, 4)})"
        try:
            if how == "at":
                died = run(a, {"LMS_CRASH_AT": str(val)})
                assert died, f"crash point {val} of {k} not reached"
            else:
                died = run(a, kill_after=val)
            killed += died
            present += check(store, tag)
        except AssertionError as e:
            bad.append(f"{tag}: {e}")
            print(f"INCONSISTENCY {tag}: {e}")
    print(f"{name}: {len(points)} kills ({len(ats)} at crash points of {k}, {len(points) - len(ats)} timed; "
          f"{killed} died mid-run), effect present after {present}; {len(bad)} inconsistencies")
    return len(points), bad


def tiny_runnable(out):
    """The engine's tiny Llama fixture with a tokenizer (tests/fixtures): a
    model `lmstore run` can run, for the KV save campaign."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(os.path.join(SRC, "tests", "fixtures", "engine", "llama", f), out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(SRC, "tests", "fixtures", "store-v1", "src", f), out)
    return out


def main(which):
    """Run the campaign for `which` (import, rm, gc or kvsave):
    tests/store/test_crash.py runs gc's, test_crash_import.py, test_crash_rm.py
    and test_crash_kvsave.py the others, so ctest runs them side by side."""
    src_new = gen_model(os.path.join(ROOT, "src-new"), *NEW)
    if which == "kvsave":
        src_base = tiny_runnable(os.path.join(ROOT, "src-base"))
    else:
        src_base = gen_model(os.path.join(ROOT, "src-base"), *BASE)
    SOURCES.update(base=src_base, new=src_new)

    # 600 KB segments: 'new' spans several, and removing it leaves the first
    # one sparse, so gc compacts, unlinks and trims
    t_import = os.path.join(ROOT, "t-import")
    lms("import", src_base, "--store", t_import, "--name", "base", "--segment-max", "600K", "--quiet", check=0)
    ref_store = clone(t_import, "ref-import")
    lms("import", src_new, "--store", ref_store, "--name", "new", "--quiet", check=0)
    ref = {"base": hashes(t_import, "base"), "new": hashes(ref_store, "new")}
    with_new = gc_size(ref_store)
    without_new = gc_size(clone(t_import, "ref-import-gc"))

    def model_check(size_with, size_without, present_after_gc=None):
        def check(store, tag):
            has_new = check_store(store, ref)
            size = gc_size(store)
            want = size_with if has_new else size_without
            assert size == want, (f"segments {size} bytes after gc, want {want} "
                                  f"({'with' if has_new else 'without'} the op)")
            if present_after_gc is not None:
                assert check_store(store, ref) == present_after_gc
            return has_new
        return check

    if which == "import":
        n, bad = campaign("import", t_import,
                          lambda st: ["import", src_new, "--store", st, "--name", "new", "--quiet"],
                          model_check(with_new, without_new))
    elif which == "rm":
        # the template holds both models
        n, bad = campaign("rm", clone(ref_store, "t-rm"), lambda st: ["rm", "new", "--store", st],
                          model_check(with_new, without_new))
    elif which == "gc":
        # 'new' removed, and garbage a crashed import would leave (bytes past the last blob)
        t_gc = clone(ref_store, "t-gc")
        lms("rm", "new", "--store", t_gc, check=0)
        segs = sorted(os.listdir(os.path.join(t_gc, "segments")))
        with open(os.path.join(t_gc, "segments", segs[-1]), "ab") as f:
            f.write(os.urandom(300_000))
        n, bad = campaign("gc", t_gc, lambda st: ["gc", "--store", st, "--grace", "1"],
                          model_check(None, without_new, present_after_gc=False))
    else:
        # a KV save of 'base' (7 pages) into a store holding both models
        prompt = ",".join(str(3 + (i * 7) % 300) for i in range(100))
        save = ["run", "base", "--prompt-ids", prompt, "-n", "6", "--save-session", "s"]
        resume = ["run", "base", "--resume", "s", "--prompt-ids", "7", "-n", "3", "--json"]
        ref_kv = clone(ref_store, "ref-kv")
        lms(*save, "--store", ref_kv, check=0)
        _, out, _ = lms(*resume, "--store", ref_kv, check=0)
        want_ids = json.loads(out)["ids"]
        kv_with = gc_size(clone(ref_kv, "ref-kv-gc"))

        def kv_check(store, tag):
            check_store(store, ref)
            _, out, _ = lms("kv", "ls", "--json", "--store", store, check=0)
            sessions = [x["name"] for x in json.loads(out)]
            has = "s" in sessions
            assert sessions == (["s"] if has else []), sessions
            if has:
                _, out, _ = lms(*resume, "--store", store, check=0)
                assert json.loads(out)["ids"] == want_ids, "the session resumes to another continuation"
            size = gc_size(store)
            want = kv_with if has else with_new
            assert size == want, f"segments {size} bytes after gc, want {want}"
            return has

        n, bad = campaign("kvsave", clone(ref_store, "t-kv"), lambda st: [*save, "--store", st], kv_check)
    assert not bad, f"{len(bad)} inconsistencies in {n} kills:\n" + "\n".join(bad)
    print(f"crash test ({which}) passed: {n} kills, 0 inconsistencies")


if __name__ == "__main__":
    main("gc")
