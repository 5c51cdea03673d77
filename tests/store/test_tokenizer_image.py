#!/usr/bin/env python3
"""tests/store/test_tokenizer_image.py - compiled tokenizers in the store
(docs/FORMAT.md 3.8): the import writes one image per distinct tokenizer
and a `.tokenizer.lmstok` reference; `lmstore tokenize MODEL` (and every
engine) opens the image in place and gives HF tokenizers' ids; a missing,
damaged or stale image falls back to tokenizer.json and verify names it; gc
removes images no model names and keeps the others. (Models without a
reference, as older imports made them: tests/store/test_tokimg.c.)
"""
import gzip
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(__file__))
from storeutil import SRC, gen_model, lms, run_tests, scratch  # noqa: E402

TOKS = os.path.join(SRC, "tests", "fixtures", "tokenizers")
TEXTS = ["Hello world!", "  leading spaces and\ttabs\n\nnewlines ", "don't 123456 digits",
         "caf\u00e9 \u65e5\u672c\u8a9e \U0001F600", "<|im_start|>user\nhi<|im_end|>", ""]


def model(d, tok):
    """A tiny random model folder with the real `tok` tokenizer files."""
    return gen_model(d, "--arch", "qwen3", "--hidden", "32", "--layers", "1", "--tokenizer", os.path.join(TOKS, tok))


def images(store):
    d = os.path.join(store, "tokenizers")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def tokenize(store, name, env_log=None):
    """ids of TEXTS by `lmstore tokenize MODEL --jsonl` (one process), and its stderr."""
    import json
    import subprocess
    from storeutil import BIN
    env = dict(os.environ)
    if env_log:
        env["LMSTORE_LOG"] = env_log
    lines = "".join(json.dumps(t) + "\n" for t in TEXTS)
    p = subprocess.run([BIN, "tokenize", name, "--store", store, "--jsonl", "--special"], input=lines,
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    return [json.loads(x) for x in p.stdout.splitlines()], p.stderr


def hf_ids(tok):
    from tokenizers import Tokenizer
    with gzip.open(os.path.join(TOKS, tok + ".tokenizer.json.gz"), "rb") as f:
        t = Tokenizer.from_str(f.read().decode())
    return [t.encode(x, add_special_tokens=True).ids for x in TEXTS]


def test_import_compiles_the_tokenizer_and_readers_use_it_in_place():
    d = scratch("inplace")
    store = os.path.join(d, "store")
    lms("import", model(os.path.join(d, "m"), "qwen3"), "--store", store, "--name", "m", check=0)
    assert len(images(store)) == 1 and images(store)[0].endswith(".lmtok"), images(store)
    _, out, _ = lms("info", "m", "--store", store, check=0)
    assert ".tokenizer.lmstok" not in out and "tokenizer.json" in out  # lmstore's own files are not listed
    import subprocess
    from storeutil import BIN
    p = subprocess.run([BIN, "cat", "m", ".tokenizer.lmstok", "--store", store], capture_output=True)
    assert p.returncode == 0 and p.stdout.startswith(b"LMSTKREF") and len(p.stdout) == 64, p
    ids, err = tokenize(store, "m", "debug")
    assert "opened in place" in err, err
    assert ids == hf_ids("qwen3"), (ids, hf_ids("qwen3"))


def test_models_with_one_tokenizer_share_an_image_that_gc_keeps_while_named():
    d = scratch("share")
    store = os.path.join(d, "store")
    src = model(os.path.join(d, "m"), "llama3")
    lms("import", src, "--store", store, "--name", "a", check=0)
    lms("import", src, "--store", store, "--name", "b", check=0)
    lms("cp", "a", "c", "--store", store, check=0)
    assert len(images(store)) == 1
    lms("rm", "a", "--store", store, check=0)
    lms("rm", "b", "--store", store, check=0)
    lms("gc", "--store", store, check=0)
    assert len(images(store)) == 1, "gc removed an image model 'c' names"
    ids, err = tokenize(store, "c", "debug")
    assert "opened in place" in err and ids == hf_ids("llama3")
    lms("rm", "c", "--store", store, check=0)
    # a temporary file a crashed writer left behind goes too; a dry run only counts
    tmp = os.path.join(store, "tokenizers", images(store)[0] + ".tmp.12345")
    open(tmp, "wb").write(b"partial")
    lms("gc", "--store", store, "--dry-run", check=0)
    assert len(images(store)) == 2
    lms("gc", "--store", store, check=0)
    assert images(store) == [], images(store)


def test_missing_damaged_or_stale_images_fall_back_to_tokenizer_json_and_verify_names_them():
    d = scratch("fallback")
    store = os.path.join(d, "store")
    lms("import", model(os.path.join(d, "m"), "qwen3"), "--store", store, "--name", "m", check=0)
    img = os.path.join(store, "tokenizers", images(store)[0])
    want = hf_ids("qwen3")
    lms("verify", "--store", store, check=0)
    # damaged header: refused at open, tokenizer.json is parsed instead
    blob = bytearray(open(img, "rb").read())
    saved = bytes(blob)
    blob[0] ^= 0xFF
    os.chmod(img, 0o644)
    open(img, "wb").write(blob)
    ids, err = tokenize(store, "m")
    assert ids == want and "not usable" in err, err
    rc, out, err = lms("verify", "--store", store)
    assert rc != 0 and images(store)[0][:32] in out + err and "hash" in out + err, out + err
    # a table damaged (not seen at open): verify's hash check names the file
    blob = bytearray(saved)
    blob[len(blob) // 2] ^= 0x01
    open(img, "wb").write(blob)
    rc, out, err = lms("verify", "--store", store)
    assert rc != 0 and "does not hash" in out + err, out + err
    # missing: parsed from tokenizer.json; verify says it is missing
    os.unlink(img)
    ids, err = tokenize(store, "m")
    assert ids == want and "not usable" in err, err
    rc, out, err = lms("verify", "--store", store, "--index-only")
    assert rc != 0 and "missing" in out + err, out + err
    open(img, "wb").write(saved)
    lms("verify", "--store", store, check=0)
    # replaced by the import of another tokenizer under the same name: the new image
    src2 = model(os.path.join(d, "m2"), "llama3")
    lms("import", src2, "--store", store, "--name", "m", "--replace", check=0)
    ids, err = tokenize(store, "m", "debug")
    assert "opened in place" in err and ids == hf_ids("llama3")
    lms("gc", "--store", store, check=0)
    assert len(images(store)) == 1


def test_an_image_file_with_other_bytes_fails_the_import_and_changes_nothing():
    d = scratch("collide")
    store = os.path.join(d, "store")
    src = model(os.path.join(d, "m"), "qwen3")
    lms("import", src, "--store", store, "--name", "a", check=0)
    name = images(store)[0]
    img = os.path.join(store, "tokenizers", name)
    good = open(img, "rb").read()
    lms("rm", "a", "--store", store, check=0)
    open(img, "wb").write(good[:-1] + bytes([good[-1] ^ 1]))  # same name, other bytes
    rc, out, err = lms("import", src, "--store", store, "--name", "b")
    assert rc != 0 and name in err and "other bytes" in err, err
    rc, out, _ = lms("ls", "--store", store)
    assert "b" not in out.split()


def main():
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        print("HF tokenizers is not installed (pip install tokenizers)")
        sys.exit(1)
    run_tests(globals())


if __name__ == "__main__":
    main()
