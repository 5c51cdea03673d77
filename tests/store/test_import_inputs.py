#!/usr/bin/env python3
"""tests/store/test_import_inputs.py - import stores exactly the bytes it
hashed, and input that is not what it claims is refused:

  - a shard rewritten in place between the hashing pass and the copy (the
    import stopped at its `import:hashed` crash point, LMS_CRASH_STOP, while
    the test rewrites it and puts its modification time back): the import
    fails naming the file, the store is byte-identical to before, and the
    untouched source imports afterwards with no false "collision";
  - a shard rewritten after its bytes were copied: with a new modification
    time the import fails naming the file; with the old one put back the
    import keeps the bytes it hashed (export gives the source as it was);
  - a stored blob whose bytes are damaged (as an older build that stored
    other bytes than it hashed left them): the next import of the tensor
    writes it anew and repoints the blob, so every model using it is whole;
  - a FIFO or a device named *.safetensors is refused at once, naming it;
  - side .json files with trailing data, two values, a NUL byte or a UTF-8
    BOM, and a safetensors header beginning with a BOM are refused, as the
    reference implementations (Python's json, the safetensors package) do.
"""
import json
import os
import signal
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from storeutil import (BIN, gen_model, lms, read_safetensors_raw, run_tests, scratch, st_bytes,  # noqa: E402
                       tree_digest, write)

ROOT = scratch("import-inputs")
SRC = gen_model(os.path.join(ROOT, "src"), "--arch", "llama", "--hidden", "64", "--layers", "2", "--vocab", "256",
                "--seed", "41", "--single-file")
SHARD = os.path.join(SRC, "model.safetensors")
PRISTINE = open(SHARD, "rb").read()


def restore_source():
    with open(SHARD, "wb") as f:
        f.write(PRISTINE)


def tensor_span(name):
    (n,) = struct.unpack("<Q", PRISTINE[:8])
    hdr = json.loads(PRISTINE[8:8 + n])
    b, e = hdr[name]["data_offsets"]
    return 8 + n + b, 8 + n + e


def rewrite(name, keep_mtime):
    """Flip every byte of tensor `name` in place (same size)."""
    st = os.stat(SHARD)
    b, e = tensor_span(name)
    with open(SHARD, "r+b") as f:
        f.seek(b)
        data = bytearray(f.read(e - b))
        f.seek(b)
        f.write(bytes(x ^ 0x5A for x in data))
    if keep_mtime:
        os.utime(SHARD, ns=(st.st_atime_ns, st.st_mtime_ns))


def stopped(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def import_stopped_at(point, store, name, action):
    """Run an import that stops itself at its first `point` crash point, call
    action() while it waits there, continue it; returns (status, stderr)."""
    env = dict(os.environ, LMS_CRASH_MATCH=point, LMS_CRASH_STOP="1")
    p = subprocess.Popen([BIN, "import", SRC, "--store", store, "--name", name, "--quiet"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not stopped(p.pid):
        assert p.poll() is None, f"the import ended before {point}: {p.communicate()}"
        assert time.monotonic() - t0 < 60, f"the import never reached {point}"
        time.sleep(0.01)
    action()
    p.send_signal(signal.SIGCONT)
    _, err = p.communicate()
    return p.returncode, err


def base_store(tag):
    store = os.path.join(ROOT, tag)
    other = gen_model(os.path.join(ROOT, tag + "-other"), "--arch", "llama", "--hidden", "64", "--layers", "1",
                      "--vocab", "128", "--seed", "42")
    lms("import", other, "--store", store, "--name", "other", "--quiet", check=0)
    return store


def exported(store, model):
    out = os.path.join(ROOT, f"export-{os.path.basename(store)}-{model}")
    lms("export", model, out, "--store", store, check=0)
    return read_safetensors_raw(os.path.join(out, "model.safetensors"))


def test_a_shard_rewritten_between_hash_and_copy_fails_the_import():
    store = base_store("rewrite-hash")
    before = tree_digest(store)
    try:
        rc, err = import_stopped_at("import:hashed", store, "m",
                                    lambda: rewrite("model.embed_tokens.weight", keep_mtime=True))
    finally:
        restore_source()
    assert rc == 1, err
    assert SHARD in err and "changed during the import" in err, err
    assert tree_digest(store) == before, "a failed import changed the store"
    # the source as it is imports cleanly: nothing false was left behind
    lms("import", SRC, "--store", store, "--name", "m", "--quiet", check=0)
    lms("verify", "--store", store, check=0)
    assert exported(store, "m") == read_safetensors_raw(SHARD)


def test_a_shard_rewritten_after_the_copy_is_refused_or_kept_as_hashed():
    store = base_store("rewrite-copy")
    before = tree_digest(store)
    try:
        rc, err = import_stopped_at("import:data-written", store, "m",
                                    lambda: rewrite("model.norm.weight", keep_mtime=False))
    finally:
        restore_source()
    assert rc == 1 and SHARD in err and "changed during the import" in err, err
    assert tree_digest(store) == before
    # the old modification time put back: what was copied is what was hashed
    want = read_safetensors_raw(SHARD)
    try:
        rc, err = import_stopped_at("import:data-written", store, "m",
                                    lambda: rewrite("model.norm.weight", keep_mtime=True))
    finally:
        restore_source()
    assert rc == 0, err
    lms("verify", "--store", store, check=0)
    assert exported(store, "m") == want


def test_a_damaged_stored_blob_is_written_anew():
    store = os.path.join(ROOT, "damaged")
    lms("import", SRC, "--store", store, "--name", "a", "--quiet", check=0)
    _, out, _ = lms("info", "a", "--store", store, "--json", check=0)
    t = {x["name"]: x for x in json.loads(out)["tensors"]}["model.layers.0.mlp.up_proj.weight"]
    seg = os.path.join(store, "segments", "%08d.seg" % t["segment"])
    with open(seg, "r+b") as f:  # bytes other than the hash says
        f.seek(t["offset"] + 100)
        b = f.read(1)
        f.seek(t["offset"] + 100)
        f.write(bytes([b[0] ^ 1]))
    rc, out, _ = lms("verify", "--store", store)
    assert rc == 1 and "model 'a' tensor 'model.layers.0.mlp.up_proj.weight'" in out, out
    rc, _, err = lms("import", SRC, "--store", store, "--name", "b", "--quiet")
    assert rc == 0, err
    assert "damaged" in err and "writes it anew" in err, err
    rc, out, err = lms("verify", "--store", store)
    assert rc == 0, out + err
    want = read_safetensors_raw(SHARD)
    assert exported(store, "a") == want and exported(store, "b") == want


def test_a_fifo_or_device_named_safetensors_is_refused_at_once():
    d = os.path.join(ROOT, "fifo")
    os.makedirs(d)
    write(os.path.join(d, "config.json"), open(os.path.join(SRC, "config.json"), "rb").read())
    os.mkfifo(os.path.join(d, "model.safetensors"))
    for src in (d, os.path.join(d, "model.safetensors")):
        p = subprocess.run([BIN, "import", src, "--store", os.path.join(ROOT, "fifo-store")], capture_output=True,
                           text=True, timeout=30)
        assert p.returncode == 1 and "a FIFO, not a regular file" in p.stderr, p.stderr
    dev = os.path.join(ROOT, "zero.safetensors")
    os.symlink("/dev/zero", dev)
    p = subprocess.run([BIN, "import", dev, "--store", os.path.join(ROOT, "fifo-store")], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 1 and "a character device, not a regular file" in p.stderr, p.stderr


def test_side_json_files_must_be_one_json_value():
    cases = {"trailing": b'{"a": 1} xx', "two values": b'{"a": 1}{"b": 2}', "a NUL byte": b'{"a": 1}\0',
             "a NUL inside": b'{"a": "x\0y"}', "a BOM": b'\xef\xbb\xbf{"a": 1}'}
    for why, data in cases.items():
        try:  # the reference: Python's json refuses each
            json.loads(data.decode("utf-8"))
            raise AssertionError(f"json.loads accepted {why}")
        except (ValueError, UnicodeDecodeError):
            pass
        d = os.path.join(ROOT, "side-" + why.replace(" ", "-"))
        os.makedirs(d)
        for f in ("config.json", "model.safetensors"):
            write(os.path.join(d, f), open(os.path.join(SRC, f), "rb").read())
        write(os.path.join(d, "tokenizer_config.json"), data)
        store = os.path.join(ROOT, "side-store")
        rc, _, err = lms("import", d, "--store", store, "--quiet")
        assert rc == 1 and "tokenizer_config.json" in err, f"{why}: {rc} {err}"
    assert not os.path.exists(store), "a refused import left the store it would have created"


def test_a_safetensors_header_with_a_bom_is_refused_as_the_reference_does():
    from safetensors import safe_open
    hdr = b'\xef\xbb\xbf' + json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path = os.path.join(ROOT, "bom.safetensors")
    write(path, st_bytes(None, b"\0" * 8, raw_header=hdr))
    try:
        with safe_open(path, "np"):
            pass
        raise AssertionError("the safetensors package accepted a header with a BOM")
    except Exception as e:  # noqa: BLE001 (the reference's own error type)
        assert "accepted" not in str(e)
    rc, _, err = lms("import", path, "--store", os.path.join(ROOT, "bom-store"))
    assert rc == 1 and "byte-order mark" in err and path in err, err


if __name__ == "__main__":
    run_tests(globals())
