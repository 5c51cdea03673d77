#!/usr/bin/env python3
"""tests/store/test_import_rejects.py - every malformed input `lmstore import`
must reject: each case checks the exit status (1), that the message names the
file and the tensor at fault, and that the store is byte-for-byte unchanged
(a model is already in it, so the index and a segment exist)."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(__file__))
from storeutil import gen_model, lms, run_tests, scratch, st_bytes, tree_digest, write  # noqa: E402

D = scratch("rejects")
STORE = os.path.join(D, "store")
gen_model(os.path.join(D, "base"), "--arch", "llama", "--hidden", "32", "--layers", "1", "--vocab", "64",
          "--shard-size", "8K")
lms("import", os.path.join(D, "base"), "--store", STORE, "--quiet", check=0)

F32 = lambda n: struct.pack(f"<{n}f", *[float(i) for i in range(n)])  # noqa: E731


def good_header():
    return {"a.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "b.weight": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}}


def reject(src, *fragments, name="bad"):
    """Import src; expect failure naming each fragment and no change to the store."""
    before = tree_digest(STORE)
    rc, out, err = lms("import", src, "--store", STORE, "--name", name, "--quiet")
    assert rc == 1, f"exit {rc}, want 1; stderr: {err}"
    for f in fragments:
        assert f in err, f"message lacks {f!r}: {err.strip()}"
    assert tree_digest(STORE) == before, "store changed"
    rc, out, _ = lms("ls", "--store", STORE, "--json")
    assert [m["name"] for m in json.loads(out)] == ["base"], out


def one_file(tag, blob):
    p = os.path.join(D, tag + ".safetensors")
    write(p, blob)
    return p


def folder(tag, files):
    p = os.path.join(D, tag)
    os.makedirs(p, exist_ok=True)
    for name, blob in files.items():
        write(os.path.join(p, name), blob if isinstance(blob, bytes) else blob.encode())
    return p


def test_header_length_larger_than_file():
    reject(one_file("hl_file", st_bytes(None, raw_header=b"{}", header_len=1000)), "hl_file.safetensors",
           "header length 1000 is larger than the file")


def test_header_length_over_100_mib_cap():
    reject(one_file("hl_cap", st_bytes(None, raw_header=b"{}", header_len=100 * 2**20 + 1)), "hl_cap.safetensors",
           "100 MiB")


def test_file_shorter_than_length_field():
    reject(one_file("tiny", b"\x01\x02\x03"), "tiny.safetensors", "truncated")


def test_invalid_json():
    reject(one_file("badjson", st_bytes(None, raw_header=b'{"a.weight": {"dtype": ')), "badjson.safetensors",
           "not valid JSON")


def test_json_not_an_object():
    reject(one_file("array", st_bytes(None, raw_header=b"[1, 2, 3]")), "array.safetensors", "not a JSON object")


def test_non_object_entry():
    reject(one_file("nonobj", st_bytes({"a.weight": 5})), "nonobj.safetensors", "tensor 'a.weight'",
           "not a JSON object")


def test_unknown_dtype():
    h = good_header()
    h["a.weight"]["dtype"] = "Q4_K"
    reject(one_file("dtype", st_bytes(h, F32(6))), "dtype.safetensors", "tensor 'a.weight'", "unknown dtype 'Q4_K'")


def test_negative_shape():
    h = good_header()
    h["a.weight"]["shape"] = [-2, -2]
    reject(one_file("neg", st_bytes(h, F32(6))), "neg.safetensors", "tensor 'a.weight'", "negative")


def test_non_integer_shape():
    h = good_header()
    h["b.weight"]["shape"] = [1.5]
    reject(one_file("frac", st_bytes(h, F32(6))), "frac.safetensors", "tensor 'b.weight'", "not an integer")


def test_string_shape_entry():
    h = good_header()
    h["b.weight"]["shape"] = ["2"]
    reject(one_file("strshape", st_bytes(h, F32(6))), "strshape.safetensors", "tensor 'b.weight'", "not a number")


def test_shape_product_overflow():
    h = good_header()
    h["a.weight"]["shape"] = [2**32, 2**32, 2**32]
    reject(one_file("ovf", st_bytes(h, F32(6))), "ovf.safetensors", "tensor 'a.weight'", "overflows")


def test_byte_size_mismatch():
    h = good_header()
    h["a.weight"]["shape"] = [3, 2]  # 24 bytes, offsets span 16
    reject(one_file("size", st_bytes(h, F32(6))), "size.safetensors", "tensor 'a.weight'", "span 16 bytes",
           "give 24")


def test_offsets_out_of_data_region():
    h = good_header()
    h["b.weight"]["data_offsets"] = [16, 24]
    reject(one_file("oor", st_bytes(h, F32(5))), "oor.safetensors", "tensor 'b.weight'",
           "past the end of the data region")


def test_offsets_reversed():
    h = good_header()
    h["b.weight"]["data_offsets"] = [24, 16]
    reject(one_file("rev", st_bytes(h, F32(6))), "rev.safetensors", "tensor 'b.weight'", "reversed")


def test_offsets_overlapping():
    h = good_header()
    h["b.weight"]["data_offsets"] = [8, 16]
    reject(one_file("overlap", st_bytes(h, F32(6))), "overlap.safetensors", "tensor 'b.weight'", "overlaps",
           "a.weight")


def test_hole_between_tensors():
    h = good_header()
    h["b.weight"]["data_offsets"] = [20, 28]
    reject(one_file("hole", st_bytes(h, F32(7))), "hole.safetensors", "hole of 4 bytes before tensor 'b.weight'")


def test_bytes_after_last_tensor():
    reject(one_file("trail", st_bytes(good_header(), F32(8))), "trail.safetensors", "8 bytes after the last tensor",
           "b.weight")


def test_truncated_file():
    blob = st_bytes(good_header(), F32(6))
    reject(one_file("trunc", blob[:-3]), "trunc.safetensors", "tensor 'b.weight'", "truncated")


def test_duplicate_name_within_shard():
    raw = (b'{"a.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
           b'"a.weight":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}')
    reject(one_file("dup", st_bytes(None, F32(4), raw_header=raw)), "dup.safetensors",
           "duplicate tensor name 'a.weight'")


def test_duplicate_name_across_shards():
    h1 = {"a.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    p = folder("dupx", {"model-1.safetensors": st_bytes(h1, F32(2)), "model-2.safetensors": st_bytes(h1, F32(2))})
    reject(p, "model-2.safetensors", "model-1.safetensors", "duplicate tensor name 'a.weight'")


def test_name_not_utf8():
    raw = b'{"a.\xff\xfe":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    reject(one_file("utf8", st_bytes(None, F32(2), raw_header=raw)), "utf8.safetensors", "not valid UTF-8",
           "a.\\xff\\xfe")


def _index(weight_map):
    return json.dumps({"metadata": {}, "weight_map": weight_map})


def test_index_names_missing_shard():
    h1 = {"a.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    p = folder("idx_missing", {"model-1.safetensors": st_bytes(h1, F32(2)),
                               "model.safetensors.index.json": _index({"a.weight": "model-1.safetensors",
                                                                       "b.weight": "model-2.safetensors"})})
    reject(p, "model.safetensors.index.json", "model-2.safetensors", "missing")


def test_index_lists_tensor_missing_from_shard():
    h1 = {"a.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    p = folder("idx_tensor", {"model-1.safetensors": st_bytes(h1, F32(2)),
                              "model.safetensors.index.json": _index({"a.weight": "model-1.safetensors",
                                                                      "z.weight": "model-1.safetensors"})})
    reject(p, "model.safetensors.index.json", "tensor 'z.weight'", "does not contain it")


def test_shard_holds_tensor_index_does_not_list():
    p = folder("idx_extra", {"model-1.safetensors": st_bytes(good_header(), F32(6)),
                             "model.safetensors.index.json": _index({"a.weight": "model-1.safetensors"})})
    reject(p, "model-1.safetensors", "tensor 'b.weight'", "does not list")


def test_index_with_path_in_shard_name():
    p = folder("idx_path", {"model-1.safetensors": st_bytes(good_header(), F32(6)),
                            "model.safetensors.index.json": _index({"a.weight": "../x.safetensors",
                                                                    "b.weight": "model-1.safetensors"})})
    reject(p, "model.safetensors.index.json", "tensor 'a.weight'", "not a file name")


def test_invalid_config_json():
    p = folder("badcfg", {"model.safetensors": st_bytes(good_header(), F32(6)), "config.json": "{\"a\": "})
    reject(p, "config.json", "not valid JSON")


def test_existing_name_without_replace():
    reject(os.path.join(D, "base"), "model 'base' already exists", "--replace", name="base")


def test_missing_source():
    reject(os.path.join(D, "nope"), "nope", "no such file")


if __name__ == "__main__":
    run_tests(globals())
