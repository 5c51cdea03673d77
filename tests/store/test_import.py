#!/usr/bin/env python3
"""tests/store/test_import.py - what `lmstore import` stores, checked against
sources read by code we did not write (the safetensors package) and by the
plain format rules: stored bytes equal the source bytes, every offset is
aligned, tensors are in forward-pass order, identical tensors are stored
once, side files come back byte-identical, --replace swaps a model."""
import json
import os
import sys

import numpy as np
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(__file__))
from storeutil import (gen_model, lms, read_safetensors_raw, run_tests, scratch, segment_bytes,  # noqa: E402
                       segments_size)

D = scratch("import")
TOK = os.path.join(os.environ.get("LMS_SRC_DIR", "."), "tests", "fixtures", "tokenizers", "qwen3")


def info(store, model):
    rc, out, err = lms("info", model, "--store", store, "--json", check=0)
    return json.loads(out)


def source_tensors(folder):
    out = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            out.update(read_safetensors_raw(os.path.join(folder, f)))
    return out


def test_f32_bytes_equal_source_read_by_safetensors():
    src = gen_model(os.path.join(D, "f32"), "--arch", "qwen2", "--dtype", "F32", "--shard-size", "20K", "--seed", "3")
    store = os.path.join(D, "s_f32")
    lms("import", src, "--store", store, "-q", "--threads", "1", check=0)  # everything on the calling thread
    inf = info(store, "f32")
    stored = {t["name"]: t for t in inf["tensors"]}
    n = 0
    for f in sorted(os.listdir(src)):
        if not f.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(src, f), framework="numpy") as g:
            for name in g.keys():
                arr = g.get_tensor(name)
                t = stored[name]
                assert t["dtype"] == "F32" and t["shape"] == list(arr.shape), name
                got = segment_bytes(store, t["segment"], t["offset"], t["nbytes"])
                assert got == np.ascontiguousarray(arr).astype("<f4").tobytes(), f"bytes differ: {name}"
                n += 1
    assert n == len(stored) and n > 10, (n, len(stored))


def test_bf16_bytes_equal_source_and_offsets_aligned():
    src = gen_model(os.path.join(D, "bf16"), "--arch", "qwen3", "--shard-size", "16K", "--seed", "4")
    for align in (4096, 65536):
        store = os.path.join(D, f"s_bf16_{align}")
        lms("import", src, "--store", store, "--alignment", align, "-q", check=0)
        inf = info(store, "bf16")
        assert inf["alignment"] == align
        want = source_tensors(src)
        assert len(inf["tensors"]) == len(want)
        for t in inf["tensors"]:
            assert t["offset"] % align == 0, f"{t['name']} at {t['offset']} not aligned to {align}"
            assert t["offset"] >= 4096
            dt, shape, data = want[t["name"]]
            assert (t["dtype"], t["shape"]) == (dt, shape)
            assert segment_bytes(store, t["segment"], t["offset"], t["nbytes"]) == data, t["name"]


def test_forward_pass_order_and_layers():
    src = gen_model(os.path.join(D, "order"), "--arch", "llama", "--layers", "12", "--hidden", "32",
                    "--shard-size", "8K")
    store = os.path.join(D, "s_order")
    lms("import", src, "--store", store, "-q", check=0)
    ts = info(store, "order")["tensors"]
    names = [t["name"] for t in ts]
    assert names[0] == "model.embed_tokens.weight", names[:3]
    assert names[-2:] == ["model.norm.weight", "lm_head.weight"], names[-3:]
    layers = [t["layer"] for t in ts]
    assert layers[0] == -1 and layers[-1] == 2**31 - 1
    mid = layers[1:-2]
    assert mid == sorted(mid) and mid[0] == 0 and mid[-1] == 11, mid  # 10 after 9, numerically
    for t in ts:
        if t["layer"] not in (-1, 2**31 - 1):
            assert f".layers.{t['layer']}." in t["name"]
    # one layer is one contiguous run: offsets grow in storage order (one segment here)
    offs = [(t["segment"], t["offset"]) for t in ts]
    assert offs == sorted(offs)


def test_import_twice_under_two_names_adds_no_tensor_bytes():
    src = gen_model(os.path.join(D, "twice"), "--arch", "qwen3", "--shard-size", "16K", "--seed", "5")
    store = os.path.join(D, "s_twice")
    os.environ["LMSTORE_IMPORT_BATCH_BYTES"] = "1"  # one tensor per pipeline batch: exercise the boundaries
    try:
        _, out1, _ = lms("import", src, "--store", store, "-q", check=0)
    finally:
        del os.environ["LMSTORE_IMPORT_BATCH_BYTES"]
    size1 = segments_size(store)
    _, out2, _ = lms("import", src, "--store", store, "--name", "again", "-q", check=0)
    assert segments_size(store) == size1
    assert "0 B written" in out2, out2
    a, b = info(store, "twice"), info(store, "again")
    assert a["id"] == b["id"]
    assert [(t["segment"], t["offset"]) for t in a["tensors"]] == [(t["segment"], t["offset"]) for t in b["tensors"]]
    lms("verify", "--store", store, check=0)


def test_identical_tensors_within_a_model_stored_once():
    # norms are random here; make two identical tensors by writing a file by hand
    from storeutil import st_bytes, write
    data = bytes(range(256)) * 16
    h = {"x.weight": {"dtype": "U8", "shape": [4096], "data_offsets": [0, 4096]},
         "y.weight": {"dtype": "U8", "shape": [4096], "data_offsets": [4096, 8192]},
         "z.weight": {"dtype": "U8", "shape": [4096], "data_offsets": [8192, 12288]}}
    p = os.path.join(D, "same.safetensors")
    write(p, st_bytes(h, data + data + data[::-1]))
    store = os.path.join(D, "s_same")
    os.environ["LMSTORE_IMPORT_BATCH_BYTES"] = "1"  # the duplicate is decided in a later batch
    try:
        _, out, _ = lms("import", p, "--store", store, "-q", check=0)
    finally:
        del os.environ["LMSTORE_IMPORT_BATCH_BYTES"]
    ts = {t["name"]: t for t in info(store, "same")["tensors"]}
    assert (ts["x.weight"]["segment"], ts["x.weight"]["offset"]) == (ts["y.weight"]["segment"], ts["y.weight"]["offset"])
    assert ts["z.weight"]["offset"] != ts["x.weight"]["offset"]
    assert "4.10 KB deduplicated" in out, out
    assert segment_bytes(store, ts["z.weight"]["segment"], ts["z.weight"]["offset"], 4096) == data[::-1]
    _, out, _ = lms("ls", "--store", store, "--json", check=0)
    m = json.loads(out)[0]
    assert (m["bytes"], m["disk_bytes"]) == (3 * 4096, 2 * 4096), m


def test_side_files_round_trip_and_metadata_kept():
    args = ["--arch", "qwen3", "--chat-template", "--metadata", "--shard-size", "16K", "--tokenizer", TOK]
    src = gen_model(os.path.join(D, "side"), *args)
    store = os.path.join(D, "s_side")
    lms("import", src, "--store", store, "-q", check=0)
    inf = info(store, "side")
    files = {f["name"]: f["size"] for f in inf["files"]}
    want = [f for f in os.listdir(src) if not f.endswith(".safetensors") and f != "model.safetensors.index.json"]
    assert sorted(files) == sorted(want), (files, want)
    for f in want:
        with open(os.path.join(src, f), "rb") as fh:
            raw = fh.read()
        assert files[f] == len(raw)
        import subprocess
        p = subprocess.run([os.environ.get("LMS_BIN", "lmstore"), "cat", "side", f, "--store", store],
                           capture_output=True)
        assert p.returncode == 0 and p.stdout == raw, f
    assert inf["architecture"] == "Qwen3ForCausalLM"
    assert inf["safetensors_metadata"] == {"format": "pt"}
    rc, _, err = lms("cat", "side", "nope.json", "--store", store)
    assert rc == 1 and "has no file 'nope.json'" in err, err


def test_single_file_tied_embeddings_and_ls():
    src = gen_model(os.path.join(D, "single"), "--arch", "llama", "--tied", "--single-file", "--dtype", "F16")
    store = os.path.join(D, "s_single")
    lms("import", os.path.join(src, "model.safetensors"), "--store", store, "-q", check=0)
    _, out, _ = lms("ls", "--store", store, "--json", check=0)
    ms = json.loads(out)
    assert [m["name"] for m in ms] == ["model"]  # the file's base name
    m = ms[0]
    want = source_tensors(src)
    assert "lm_head.weight" not in want
    assert m["tensors"] == len(want)
    assert m["params"] == sum(int(np.prod(s)) for _, s, _ in want.values())
    assert m["bytes"] == sum(len(d) for _, _, d in want.values())
    assert m["dtypes"] == ["F16"]
    assert m["architecture"] == ""  # a lone file has no config.json


def test_replace_swaps_model_and_keeps_shared_blobs():
    a = gen_model(os.path.join(D, "ra"), "--arch", "llama", "--seed", "1", "--shard-size", "16K")
    b = gen_model(os.path.join(D, "rb"), "--arch", "llama", "--seed", "2", "--shard-size", "16K", "--layers", "1",
                  "--tied")  # fewer tensors: none of the old model's may survive the replace
    store = os.path.join(D, "s_replace")
    lms("import", a, "--store", store, "--name", "m", "-q", check=0)
    lms("import", a, "--store", store, "--name", "keep", "-q", check=0)
    rc, _, err = lms("import", b, "--store", store, "--name", "m", "-q")
    assert rc == 1 and "already exists" in err
    lms("import", b, "--store", store, "--name", "m", "--replace", "-q", check=0)
    im, ik = info(store, "m"), info(store, "keep")
    assert im["id"] != ik["id"]
    want_b, want_a = source_tensors(b), source_tensors(a)
    assert sorted(t["name"] for t in im["tensors"]) == sorted(want_b)
    assert len(want_b) < len(want_a)
    for t in im["tensors"]:
        assert segment_bytes(store, t["segment"], t["offset"], t["nbytes"]) == want_b[t["name"]][2]
    for t in ik["tensors"]:
        assert segment_bytes(store, t["segment"], t["offset"], t["nbytes"]) == want_a[t["name"]][2]
    lms("verify", "--store", store, check=0)  # blob hashes and reference counts agree with the records


def test_model_id_depends_on_content_not_name_or_sharding():
    a = gen_model(os.path.join(D, "ida"), "--arch", "qwen2", "--seed", "9", "--shard-size", "8K")
    b = gen_model(os.path.join(D, "idb"), "--arch", "qwen2", "--seed", "9", "--single-file")
    c = gen_model(os.path.join(D, "idc"), "--arch", "qwen2", "--seed", "10", "--single-file")
    store = os.path.join(D, "s_id")
    for src in (a, b, c):
        lms("import", src, "--store", store, "-q", check=0)
    ids = [info(store, n)["id"] for n in ("ida", "idb", "idc")]
    assert ids[0] == ids[1] and ids[0] != ids[2], ids


def test_zero_size_and_scalar_tensors():
    from storeutil import st_bytes, write
    h = {"a": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]},
         "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
         "c": {"dtype": "BF16", "shape": [0], "data_offsets": [8, 8]},
         "d": {"dtype": "U8", "shape": [], "data_offsets": [8, 9]}}
    p = os.path.join(D, "zero.safetensors")
    write(p, st_bytes(h, b"\x01" * 8 + b"\x07"))
    store = os.path.join(D, "s_zero")
    lms("import", p, "--store", store, "-q", check=0)
    inf = info(store, "zero")
    ts = {t["name"]: t for t in inf["tensors"]}
    assert inf["params"] == 3
    assert ts["a"]["nbytes"] == 0 and ts["a"]["shape"] == [0, 4]
    assert ts["d"]["shape"] == [] and segment_bytes(store, ts["d"]["segment"], ts["d"]["offset"], 1) == b"\x07"
    for t in ts.values():
        assert t["offset"] % 4096 == 0


def test_parallel_imports_write_each_blob_once():
    import subprocess
    a = gen_model(os.path.join(D, "pa"), "--arch", "llama", "--seed", "11", "--shard-size", "16K")
    b = gen_model(os.path.join(D, "pb"), "--arch", "qwen3", "--seed", "12", "--shard-size", "16K")
    store = os.path.join(D, "s_parallel")
    lms("import", a, "--store", store, "--name", "first", "-q", check=0)  # the store exists before the race
    binp = os.environ.get("LMS_BIN", "lmstore")
    procs = [subprocess.Popen([binp, "import", src, "--store", store, "--name", f"{tag}{i}", "-q"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(3) for tag, src in (("a", a), ("b", b))]
    outs = [p.communicate() for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    written = [o[0].decode() for o in outs if "0 B written" not in o[0].decode()]
    assert len(written) == 1, outs  # only the first b import writes; every other one finds its blobs
    sa = sum(len(d) for _, _, d in source_tensors(a).values())
    sb = sum(len(d) for _, _, d in source_tensors(b).values())
    assert segments_size(store) < 4096 + 2 * (sa + sb), segments_size(store)
    lms("verify", "--store", store, check=0)


def test_store_location_from_lmstore_home():
    src = gen_model(os.path.join(D, "home"), "--arch", "llama", "--single-file")
    home = os.path.join(D, "home_store")
    os.environ["LMSTORE_HOME"] = home
    try:
        lms("import", src, "--name", "h", "-q", check=0)
        _, out, _ = lms("ls", "--json", check=0)
    finally:
        del os.environ["LMSTORE_HOME"]
    assert [m["name"] for m in json.loads(out)] == ["h"]
    assert os.path.isdir(os.path.join(home, "index")) and os.path.isdir(os.path.join(home, "segments"))


def test_usage_errors_exit_2():
    assert lms("import")[0] == 2
    assert lms("import", "a", "b")[0] == 2
    assert lms("import", "a", "--bogus")[0] == 2
    assert lms("info")[0] == 2
    assert lms("cat", "x")[0] == 2


if __name__ == "__main__":
    run_tests(globals())
