#!/usr/bin/env python3
"""tests/store/test_durability.py - verify, rm, gc, export, cp and mv through
the lmstore CLI, checked against the source safetensors files read by the
`safetensors` package (an implementation we did not write) and against the
segment files' bytes on disk.
"""
import fcntl
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from storeutil import gen_model, lms, run_tests, scratch, segments_size  # noqa: E402

from safetensors.numpy import load_file  # noqa: E402

ROOT = scratch("durability")


def source_tensors(folder):
    """{name: raw bytes} of every tensor in a model folder, via safetensors."""
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            for k, v in load_file(os.path.join(folder, f)).items():
                out[k] = v.tobytes()
    return out


def info(store, model):
    return json.loads(lms("info", model, "--store", store, "--json", check=0)[1])


def new_store(tag, *models):
    """A fresh store with the given (name, gen_model args) models imported."""
    d = os.path.join(ROOT, tag)
    store = os.path.join(d, "store")
    os.makedirs(d, exist_ok=True)
    for name, args in models:
        src = gen_model(os.path.join(d, "src-" + name), *args)
        lms("import", src, "--store", store, "--name", name, "--quiet", check=0)
    return store, d


TINY_A = ("--arch", "qwen3", "--hidden", "64", "--layers", "2", "--vocab", "256", "--seed", "1")
TINY_B = ("--arch", "llama", "--hidden", "64", "--layers", "3", "--vocab", "512", "--seed", "2")


def flip_bit(store, seg, off):
    path = os.path.join(store, "segments", f"{seg:08d}.seg")
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ (1 << random.randrange(8))]))
        return b


def test_verify_detects_every_single_flipped_bit_and_names_the_tensor():
    store, _ = new_store("flip", ("a", TINY_A), ("b", TINY_B))
    lms("verify", "--store", store, check=0)
    rng = random.Random(1234)
    random.seed(99)
    tensors = [(m, t) for m in ("a", "b") for t in info(store, m)["tensors"] if t["nbytes"]]
    for _ in range(24):
        model, t = rng.choice(tensors)
        off = t["offset"] + rng.randrange(t["nbytes"])
        old = flip_bit(store, t["segment"], off)
        rc, out, _ = lms("verify", "--store", store, "--json")
        rep = json.loads(out)
        # restore before asserting so one failure does not cascade
        with open(os.path.join(store, "segments", f"{t['segment']:08d}.seg"), "r+b") as f:
            f.seek(off)
            f.write(old)
        assert rc == 1 and not rep["ok"], f"flip at {off} in {t['name']} not detected"
        named = {(p.get("model"), p.get("item")) for p in rep["problems"] if p["kind"] == "corrupt"}
        assert (model, t["name"]) in named, f"{model}/{t['name']} not named: {rep['problems']}"
    lms("verify", "--store", store, check=0)


def test_verify_model_checks_only_that_model():
    store, _ = new_store("onemodel", ("a", TINY_A), ("b", TINY_B))
    t = info(store, "b")["tensors"][0]
    old = flip_bit(store, t["segment"], t["offset"])
    lms("verify", "a", "--store", store, check=0)
    rc, out, _ = lms("verify", "b", "--store", store)
    assert rc == 1 and t["name"] in out, out
    with open(os.path.join(store, "segments", f"{t['segment']:08d}.seg"), "r+b") as f:
        f.seek(t["offset"])
        f.write(old)
    rc, _, err = lms("verify", "nosuch", "--store", store)
    assert rc == 1 and "nosuch" in err, err


def test_export_is_byte_identical_to_the_source_and_reimports_to_the_same_id():
    # F32: the safetensors package reads it with plain numpy
    store, d = new_store("export", ("a", TINY_A + ("--shard-size", "60K", "--dtype", "F32", "--metadata")))
    src = source_tensors(os.path.join(d, "src-a"))
    for shard in ("40K", "10G"):
        out = os.path.join(d, "out-" + shard)
        lms("export", "a", out, "--store", store, "--max-shard-size", shard, "--quiet", check=0)
        assert not os.path.exists(os.path.join(out, "model.safetensors.index.json")) or shard != "10G"
        got = source_tensors(out)
        assert got.keys() == src.keys()
        for k in src:
            assert got[k] == src[k], f"tensor {k} differs after export"
        shards = [f for f in os.listdir(out) if f.endswith(".safetensors")]
        if shard == "10G":
            assert shards == ["model.safetensors"], shards
        else:
            assert len(shards) > 1 and os.path.exists(os.path.join(out, "model.safetensors.index.json"))
            idx = json.load(open(os.path.join(out, "model.safetensors.index.json")))
            assert set(idx["weight_map"]) == set(src)
            for f in shards:  # the size limit holds for every shard with more than one tensor
                t = load_file(os.path.join(out, f))
                assert len(t) == 1 or sum(v.nbytes for v in t.values()) <= 40 * 1024
        with open(os.path.join(d, "src-a", "config.json"), "rb") as a, open(os.path.join(out, "config.json"), "rb") as b:
            assert a.read() == b.read()
        for f in shards:  # the safetensors __metadata__ the import kept goes back into every shard
            with open(os.path.join(out, f), "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                assert json.loads(fh.read(n))["__metadata__"] == {"format": "pt"}
        lms("import", out, "--store", store, "--name", "re-" + shard, "--quiet", check=0)
        assert info(store, "re-" + shard)["id"] == info(store, "a")["id"]
    # a non-empty folder is refused and left alone
    rc, _, err = lms("export", "a", os.path.join(d, "src-a"), "--store", store)
    assert rc == 1 and "empty" in err, err


def test_export_of_a_corrupt_blob_fails_naming_the_tensor_and_leaves_nothing():
    store, d = new_store("export-bad", ("a", TINY_A))
    t = info(store, "a")["tensors"][3]
    flip_bit(store, t["segment"], t["offset"] + t["nbytes"] // 2)
    out = os.path.join(d, "out")
    rc, _, err = lms("export", "a", out, "--store", store, "--quiet")
    assert rc == 1 and t["name"] in err and "XXH3" in err, err
    assert not os.path.exists(out), os.listdir(out)


def test_cp_writes_no_tensor_bytes_and_rm_of_one_copy_keeps_the_other():
    store, _ = new_store("cp", ("a", TINY_A))
    size = segments_size(store)
    lms("cp", "a", "a2", "--store", store, check=0)
    assert segments_size(store) == size
    assert info(store, "a2")["id"] == info(store, "a")["id"]
    rc, _, err = lms("cp", "a", "a2", "--store", store)
    assert rc == 1 and "exists" in err
    lms("rm", "a", "--store", store, check=0)
    lms("gc", "--store", store, check=0)
    assert segments_size(store) == size
    lms("verify", "--store", store, check=0)
    lms("mv", "a2", "a3", "--store", store, check=0)
    rc, _, _ = lms("info", "a2", "--store", store)
    assert rc != 0
    lms("verify", "a3", "--store", store, check=0)


def test_gc_after_rm_of_every_model_returns_segments_to_zero():
    store, _ = new_store("rmall", ("a", TINY_A), ("b", TINY_B))
    before = segments_size(store)
    rc, out, _ = lms("gc", "--dry-run", "--store", store, check=0)
    assert segments_size(store) == before and "would free 0.00 MB" in out, out
    lms("rm", "a", "b", "--store", store, check=0)
    rc, out, _ = lms("gc", "--dry-run", "--store", store, check=0)
    assert segments_size(store) == before, "dry run changed the store"
    freed = float(out.split("would free ")[1].split(" MB")[0])
    assert abs(freed * 1e6 - before) < 1e4, out
    lms("gc", "--store", store, check=0)
    assert segments_size(store) == 0
    lms("verify", "--store", store, check=0)


def test_gc_compacts_a_sparse_segment_and_keeps_bytes_intact():
    d = os.path.join(ROOT, "compact")
    store = os.path.join(d, "store")
    # segments of 600 KB: x (361 KB) fills most of segment 1, a starts there and goes on in segment 2
    for name, args in (("x", TINY_B), ("a", TINY_A)):
        src = gen_model(os.path.join(d, "src-" + name), *args)
        lms("import", src, "--store", store, "--name", name, "--segment-max", "600K", "--quiet", check=0)
    a_before = {t["name"]: t["hash"] for t in info(store, "a")["tensors"]}
    assert {t["segment"] for t in info(store, "a")["tensors"]} == {1, 2}
    lms("rm", "x", "--store", store, check=0)
    before = segments_size(store)
    rc, out, _ = lms("gc", "--store", store, "--compact-below", "0.9", check=0)
    after = segments_size(store)
    assert "0 blobs" not in out.split("moved")[0].split("deleted,")[1], out
    assert not os.path.exists(os.path.join(store, "segments", "00000001.seg")), out
    assert after < before - 300_000, (before, after, out)
    lms("verify", "--store", store, check=0)
    after_info = info(store, "a")["tensors"]
    assert {t["name"]: t["hash"] for t in after_info} == a_before
    assert 1 not in {t["segment"] for t in after_info}


def punch_supported(folder):
    """Whether the file system under folder frees blocks of a punched hole."""
    probe = os.path.join(folder, "punch-probe")
    with open(probe, "wb") as f:
        f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
    before = os.stat(probe).st_blocks
    ok = subprocess.run(["fallocate", "--punch-hole", "--offset", "0", "--length", str(1 << 20), probe],
                        capture_output=True).returncode == 0 and os.stat(probe).st_blocks < before
    os.unlink(probe)
    return ok


def test_gc_gives_back_the_blocks_of_garbage_later_imports_appended_after():
    d = os.path.join(ROOT, "holes")
    store = os.path.join(d, "store")
    lms("import", gen_model(os.path.join(d, "src-a"), *TINY_A), "--store", store, "--name", "a", "--quiet", check=0)
    seg = os.path.join(store, "segments", "00000001.seg")
    with open(seg, "ab") as f:  # what an import killed after writing leaves
        f.write(os.urandom(600_000))
    lms("import", gen_model(os.path.join(d, "src-b"), *TINY_B), "--store", store, "--name", "b", "--quiet", check=0)
    size, blocks = os.path.getsize(seg), os.stat(seg).st_blocks
    rc, out, _ = lms("gc", "--store", store, check=0)
    lms("verify", "--store", store, check=0)
    assert os.path.getsize(seg) == size  # offsets stay: nothing moved
    if punch_supported(d):
        assert "0.59 MB of holes punched" in out or "0.60 MB of holes punched" in out, out
        assert os.stat(seg).st_blocks * 512 <= blocks * 512 - 500_000, (blocks, os.stat(seg).st_blocks)
        rc, out, _ = lms("gc", "--store", store, check=0)
        assert "0.00 MB of holes punched" in out, out  # once is enough
    else:
        print("     (hole punching not supported here: blocks not checked)")


def test_gc_skips_a_segment_another_process_has_mapped():
    store, _ = new_store("busy", ("a", TINY_A))
    seg = os.path.join(store, "segments", "00000001.seg")
    lms("rm", "a", "--store", store, check=0)
    with open(seg, "rb") as f:
        fcntl.flock(f, fcntl.LOCK_SH)  # what a reader holds while it maps a segment
        rc, out, _ = lms("gc", "--store", store, check=0)
        assert "busy" in out and os.path.exists(seg), out
    lms("gc", "--store", store, check=0)
    assert not os.path.exists(seg)


def test_verify_reports_index_damage():
    store, _ = new_store("idx", ("a", TINY_A))
    # a segment header with a bad magic
    seg = os.path.join(store, "segments", "00000001.seg")
    with open(seg, "r+b") as f:
        f.write(b"X")
    rc, out, _ = lms("verify", "--store", store)
    assert rc == 1 and "segment" in out, out
    with open(seg, "r+b") as f:
        f.write(b"\x89")
    lms("verify", "--store", store, check=0)
    # a truncated segment: blobs past its end
    size = os.path.getsize(seg)
    os.truncate(seg, size - 4096)
    rc, out, _ = lms("verify", "--store", store)
    assert rc == 1 and "blob-range" in out, out


run_tests(globals())
