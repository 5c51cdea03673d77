#!/usr/bin/env python3
"""tests/store/test_upgrade.py - a store written in format 1 (before index
records carried checksums: tests/fixtures/store-v1) keeps working:

  - opened read-only (ls, info, verify, cat, kv ls, run) it reads as it was,
    and not one byte of it changes;
  - the first command that writes upgrades it to the current format in one
    transaction: afterwards every model exports byte for byte as its source
    (the engine's tiny Llama fixture), side files are the same bytes, the
    KV session resumes to the same greedy continuation, verify passes;
  - an upgraded store is refused by nothing: a second writable open leaves
    it alone.
"""
import hashlib
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from storeutil import SRC, lms, read_safetensors_raw, run_tests, scratch  # noqa: E402

FIX = os.path.join(SRC, "tests", "fixtures", "store-v1")
ENGINE = os.path.join(SRC, "tests", "fixtures", "engine", "llama")
ROOT = scratch("upgrade")
with open(os.path.join(FIX, "expected.json")) as f:
    EXPECTED = json.load(f)


def copy(tag):
    d = os.path.join(ROOT, tag)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(os.path.join(FIX, "store"), d)
    return d


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def format_of(store):
    """The store's format version, as `verify --json` reports it (read-only)."""
    rc, out, err = lms("verify", "--store", store, "--json", "--index-only")
    assert rc == 0, out + err
    return json.loads(out)["format"]


def resume_ids(store):
    _, out, _ = lms("run", "tiny", "--store", store, "--resume", EXPECTED["session"], "--prompt-ids",
                    ",".join(map(str, EXPECTED["resume_prompt_ids"])), "-n", str(len(EXPECTED["resume_ids"])),
                    "--json", check=0)
    return json.loads(out)["ids"]


def check_content(store, resume=True):
    _, out, _ = lms("ls", "--store", store, "--json", check=0)
    models = json.loads(out)
    assert [m["name"] for m in models] == EXPECTED["models"], models
    assert all(m["id"] == EXPECTED["model_id"] for m in models), models
    for name in EXPECTED["models"]:
        for f, src in (("config.json", ENGINE), ("tokenizer.json", os.path.join(FIX, "src"))):
            _, out, _ = lms("cat", name, f, "--store", store, check=0)
            with open(os.path.join(src, f)) as fh:
                assert out == fh.read(), f"{name} {f} differs"
    _, out, _ = lms("kv", "ls", "--store", store, "--json", check=0)
    sessions = json.loads(out)
    assert [s["name"] for s in sessions] == [EXPECTED["session"]], sessions
    if resume:
        assert resume_ids(store) == EXPECTED["resume_ids"]


def test_read_only_commands_read_it_as_it_was():
    store = copy("ro")
    before = digest(os.path.join(store, "index", "data.mdb"))
    seg_before = digest(os.path.join(store, "segments", "00000001.seg"))
    assert format_of(store) == 1
    lms("info", "tiny", "--store", store, check=0)
    check_content(store, resume=False)
    assert digest(os.path.join(store, "index", "data.mdb")) == before, "a read-only command changed the index"
    assert digest(os.path.join(store, "segments", "00000001.seg")) == seg_before
    assert format_of(store) == 1
    # run --resume records the session's last use (the KV LRU): a write, which
    # upgrades the store first; the session resumes to the same ids
    assert resume_ids(store) == EXPECTED["resume_ids"]
    assert format_of(store) == 2


def test_the_first_write_upgrades_it_and_keeps_everything():
    store = copy("rw")
    lms("gc", "--store", store, "--grace", "0.1", check=0)
    assert format_of(store) == 2
    rc, out, err = lms("verify", "--store", store)
    assert rc == 0, out + err
    check_content(store)
    exp = os.path.join(ROOT, "rw-export")
    lms("export", "tiny", exp, "--store", store, check=0)
    assert read_safetensors_raw(os.path.join(exp, "model.safetensors")) == \
        read_safetensors_raw(os.path.join(ENGINE, "model.safetensors"))
    # a second writable open finds nothing to upgrade: a command that opens
    # the store for writing and then fails leaves every byte as it was
    before = digest(os.path.join(store, "index", "data.mdb"))
    rc, _, _ = lms("rm", "no-such-model", "--store", store)
    assert rc == 1
    assert digest(os.path.join(store, "index", "data.mdb")) == before
    lms("cp", "tiny", "tiny-2", "--store", store, check=0)
    lms("rm", "tiny-2", "--store", store, check=0)
    assert format_of(store) == 2
    check_content(store)


def test_an_import_into_it_upgrades_it_too():
    store = copy("import")
    lms("import", ENGINE, "--store", store, "--name", "again", "--quiet", check=0)
    assert format_of(store) == 2
    _, out, _ = lms("info", "again", "--store", store, "--json", check=0)
    info = json.loads(out)
    _, out, _ = lms("info", "tiny", "--store", store, "--json", check=0)
    # the same tensors: every blob deduplicated against the upgraded records
    assert [t["hash"] for t in info["tensors"]] == [t["hash"] for t in json.loads(out)["tensors"]]
    lms("verify", "--store", store, check=0)


if __name__ == "__main__":
    run_tests(globals())
