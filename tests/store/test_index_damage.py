#!/usr/bin/env python3
"""tests/store/test_index_damage.py - bits flipped in index/data.mdb itself,
the way a disk or a stray write damages it, as a user meets them through
the CLI (the records' checksums, docs/FORMAT.md section 3):

  - a blob record's reference count 1 -> 0: `gc` refuses, naming the blob
    and a tensor that uses it, and frees nothing; `verify` reports it; once
    the bit is back, gc and verify are content and every tensor is intact;
  - a tensor record's dtype BF16 -> I16: `export` and `info` refuse it
    naming the tensor record instead of writing the damaged metadata, and
    `verify` reports it;
  - a bit of a tensor's name (its key): verify reports the record.

LMDB keeps old copies of pages, so every copy of the bytes is flipped.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from storeutil import gen_model, lms, read_safetensors_raw, run_tests, scratch, segments_size  # noqa: E402

ROOT = scratch("index-damage")
SRC = gen_model(os.path.join(ROOT, "src"), "--arch", "llama", "--hidden", "64", "--layers", "2", "--vocab", "256",
                "--seed", "21", "--single-file")


def fresh(tag):
    store = os.path.join(ROOT, tag)
    lms("import", SRC, "--store", store, "--name", "m", "--quiet", check=0)
    return store


def flip(store, needle, at, bit):
    """Flip `bit` of the byte `at` bytes after each copy of `needle` in
    data.mdb; returns how many copies were flipped."""
    path = os.path.join(store, "index", "data.mdb")
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        n, i = 0, data.find(needle)
        while i >= 0:
            data[i + at] ^= bit
            n += 1
            i = data.find(needle, i + 1)
        f.seek(0)
        f.write(data)
    assert n > 0, f"{needle!r} not found in {path}"
    return n


def tensor_hash(store, name):
    _, out, _ = lms("info", "m", "--store", store, "--json", check=0)
    return bytes.fromhex({t["name"]: t["hash"] for t in json.loads(out)["tensors"]}[name])


def test_gc_refuses_a_count_flipped_to_zero():
    store = fresh("count")
    key = tensor_hash(store, "model.embed_tokens.weight")
    size = segments_size(store)
    flip(store, key, 16 + 24, 1)  # the value follows the 16-byte key; refs at 24: 1 -> 0
    rc, out, err = lms("gc", "--store", store, "--grace", "0.1")
    assert rc == 1, (rc, out, err)
    assert "gc refuses to delete anything" in err and key.hex() in err, err
    assert segments_size(store) == size, "gc gave back bytes"
    rc, out, _ = lms("verify", "--store", store)
    assert rc == 1 and "blobs record " + key.hex() + " fails its checksum" in out, out
    flip(store, key, 16 + 24, 1)
    lms("gc", "--store", store, "--grace", "0.1", check=0)
    lms("verify", "--store", store, check=0)
    exp = os.path.join(ROOT, "count-export")
    lms("export", "m", exp, "--store", store, check=0)
    assert read_safetensors_raw(os.path.join(exp, "model.safetensors")) == \
        read_safetensors_raw(os.path.join(SRC, "model.safetensors"))


def test_a_flipped_dtype_is_refused_not_exported():
    store = fresh("dtype")
    key = b"m\0model.norm.weight"
    flip(store, key, len(key) + 2, 6 ^ 4)  # dtype code BF16 (6) -> I16 (4)
    exp = os.path.join(ROOT, "dtype-export")
    rc, _, err = lms("export", "m", exp, "--store", store)
    assert rc == 1 and "tensors record 'm'/'model.norm.weight' fails its checksum" in err, err
    assert not os.path.exists(os.path.join(exp, "model.safetensors"))
    rc, _, err = lms("info", "m", "--store", store)
    assert rc == 1 and "fails its checksum" in err, err
    rc, out, _ = lms("verify", "--store", store, "--index-only")
    assert rc == 1 and "tensors record 'm'/'model.norm.weight' fails its checksum" in out, out


def test_a_renamed_tensor_is_reported():
    store = fresh("name")
    key = b"m\0model.norm.weight"
    flip(store, key, len(key) - 1, 1)  # ...weight -> ...weighu
    rc, out, _ = lms("verify", "--store", store, "--index-only")
    assert rc == 1 and "tensors record 'm'/'model.norm.weighu' fails its checksum" in out, out


if __name__ == "__main__":
    run_tests(globals())
