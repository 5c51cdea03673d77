#!/usr/bin/env python3
"""
tests/store/test_import_gguf_rejects.py - a corpus of malformed GGUF files
(truncated at every part, huge counts and lengths, bad offsets, unknown and
unsupported types, misaligned data, lying metadata): `lmstore import` must
refuse every one with exit status 1 and a message naming the file and what
is wrong, and leave the store (which already holds a model) byte-for-byte
unchanged.
"""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(__file__))
import ggufutil as gu  # noqa: E402
import storeutil as su  # noqa: E402


def replace_kv(kvs, key, typ, val):
    return [(k, typ, val) if k == key else (k, t, v) for k, t, v in kvs]


def drop_kv(kvs, key):
    return [kv for kv in kvs if kv[0] != key]


def cases():
    """(name, file bytes, fragment of the expected message)."""
    kvs, ts = gu.model_description()
    good = gu.raw(kvs, ts)
    out = []

    def add(name, data, frag):
        out.append((name, data, frag))

    # container: magic, version, truncation
    add("empty", b"", "truncated")
    add("magic-only", b"GGUF", "version")
    add("not-gguf", b"GGUX" + good[4:], "not a GGUF file")
    add("version-1", good[:4] + struct.pack("<I", 1) + good[8:], "version 1")
    add("version-4", good[:4] + struct.pack("<I", 4) + good[8:], "version 4")
    add("big-endian", good[:4] + struct.pack(">I", 3) + good[8:], "big-endian")
    hdr_end = len(gu.raw(kvs, [])) - 8  # roughly where the tensor infos start
    for cut in (10, 24, 40, 100, hdr_end // 2, hdr_end, hdr_end + 30, len(good) - 100, len(good) - 1):
        add(f"truncated-{cut}", good[:cut], "truncated")
    # counts and lengths
    add("tensors-2^40", gu.raw(kvs, ts, n_tensors=1 << 40), "tensors")
    add("kv-2^40", gu.raw(kvs, ts, n_kv=1 << 40), "metadata")
    add("kv-count-lies", gu.raw(kvs, ts, n_kv=len(kvs) + 3), "")
    add("tensor-count-lies", gu.raw(kvs, ts, n_tensors=len(ts) + 2), "")
    bad_len = bytearray(good)
    bad_len[24:32] = struct.pack("<Q", 1 << 62)  # first key's length
    add("key-length-2^62", bytes(bad_len), "truncated")
    def header(n_t, n_kv):
        return b"GGUF" + struct.pack("<IQQ", 3, n_t, n_kv)
    add("string-array-2^61", header(0, 1) + gu.gstr("x") + struct.pack("<IIQ", 9, 8, 1 << 61), "strings")
    add("array-of-arrays", gu.raw(kvs + [("x.nested", "arr", ("arr", []))], ts), "arrays of arrays")
    add("unknown-value-type", header(0, 1) + gu.gstr("x.t") + struct.pack("<I", 13) + b"\0" * 64,
        "unknown value type")
    add("unknown-array-type", header(0, 1) + gu.gstr("x.a") + struct.pack("<IIQ", 9, 77, 1) + b"\0" * 64,
        "unknown element type")
    add("bool-2", gu.raw(kvs + [("x.b", "bool", 2)], ts), "boolean")
    add("duplicate-key", gu.raw(kvs + [kvs[1]], ts), "appears twice")
    add("empty-key", gu.raw(kvs + [("", "u32", 1)], ts), "empty or non-UTF-8 key")
    add("non-utf8-key", gu.raw(kvs + [(b"\xff\xfe", "u32", 1)], ts), "empty or non-UTF-8 key")
    # tensors
    t0 = ts[0]

    def with_tensor(i, **kw):
        t = list(ts[i])
        for k, v in kw.items():
            t[["name", "nd", "ne", "qt", "off", "data"].index(k)] = v
        return ts[:i] + [tuple(t)] + ts[i + 1:]
    add("duplicate-tensor", gu.raw(kvs, ts + [ts[1]]), "appears twice")
    add("dims-0", gu.raw(kvs, with_tensor(1, nd=0, ne=[])), "dimensions")
    add("dims-5", gu.raw(kvs, with_tensor(1, nd=5, ne=[32, 1, 1, 1, 1])), "dimensions")
    add("dims-overflow", gu.raw(kvs, with_tensor(0, ne=[1 << 40, 1 << 40])), "overflows")
    add("type-99", gu.raw(kvs, with_tensor(0, qt=99)), "unknown type 99")
    add("type-iq2_xxs", gu.raw(kvs, with_tensor(0, qt=16)), "IQ2_XXS")
    add("partial-block", gu.raw(kvs, with_tensor(0, ne=[33, len(t0[5]) // 34])), "whole number")
    add("offset-misaligned", gu.raw(kvs, with_tensor(1, off=1)), "not a multiple of the alignment")
    add("offset-past-eof", gu.raw(kvs, with_tensor(len(ts) - 1, off=1 << 30)), "past the end")
    add("offset-overflow", gu.raw(kvs, with_tensor(len(ts) - 1, off=(1 << 64) - 32)), "past the end")
    add("overlap", gu.raw(kvs, with_tensor(2, off=0)), "overlap")
    add("data-truncated", good[:-64], "truncated")
    add("empty-tensor-name", gu.raw(kvs, with_tensor(1, name="")), "name")
    add("alignment-0", gu.raw(kvs + [("general.alignment", "u32", 0)], ts), "general.alignment")
    add("alignment-3", gu.raw(kvs + [("general.alignment", "u32", 3)], ts), "general.alignment")
    add("alignment-string", gu.raw(kvs + [("general.alignment", "str", "32")], ts), "general.alignment")
    add("alignment-64-data-at-32", gu.raw(kvs + [("general.alignment", "u32", 64)], ts, alignment=32),
        "alignment")
    # lying or missing metadata
    add("block-count-lies", gu.raw(replace_kv(kvs, "llama.block_count", "u32", 3), ts), "block 1 lacks")
    add("block-count-0", gu.raw(replace_kv(kvs, "llama.block_count", "u32", 0), ts), "must not be 0")
    add("block-count-string", gu.raw(replace_kv(kvs, "llama.block_count", "str", "1"), ts), "expected an integer")
    add("head-count-lies", gu.raw(replace_kv(kvs, "llama.attention.head_count", "u32", 4), ts), "metadata gives")
    add("kv-heads-0", gu.raw(replace_kv(kvs, "llama.attention.head_count_kv", "u32", 0), ts), "head_count")
    add("embd-lies", gu.raw(replace_kv(kvs, "llama.embedding_length", "u32", 64), ts), "token_embd")
    add("ff-lies", gu.raw(replace_kv(kvs, "llama.feed_forward_length", "u32", 96), ts), "metadata gives")
    add("vocab-size-lies", gu.raw(kvs + [("llama.vocab_size", "u32", 31)], ts), "vocab_size")
    add("no-architecture", gu.raw(drop_kv(kvs, "general.architecture"), ts), "general.architecture")
    add("architecture-unknown", gu.raw(replace_kv(kvs, "general.architecture", "str", "gptneox"), ts),
        "architecture 'gptneox'")
    add("block-count-missing", gu.raw(drop_kv(kvs, "llama.block_count"), ts), "llama.block_count")
    add("tensor-unknown-name", gu.raw(kvs, ts + [("blk.0.foo.weight", 1, [32], 0, None, b"\0" * 128)]),
        "blk.0.foo.weight")
    add("tensor-block-out-of-range", gu.raw(kvs, ts + [("blk.7.ffn_norm.weight", 1, [32], 0, None, b"\0" * 128)]),
        "names block 7")
    toks = [kv for kv in kvs if kv[0] == "tokenizer.ggml.tokens"][0][2][1]
    add("tokens-too-many", gu.raw(replace_kv(kvs, "tokenizer.ggml.tokens", "arr", ("str", toks + ["zz"])), ts),
        "rows")
    add("token-types-short", gu.raw(replace_kv(kvs, "tokenizer.ggml.token_type", "arr", ("i32", [1, 1])), ts),
        "token_type")
    add("merge-bad", gu.raw(replace_kv(kvs, "tokenizer.ggml.merges", "arr", ("str", ["a b", "q zz"])), ts),
        "merge 1")
    add("token-duplicate", gu.raw(replace_kv(kvs, "tokenizer.ggml.tokens", "arr", ("str", toks[:-1] + ["a"])), ts),
        "repeats")
    add("token-not-utf8", gu.raw(replace_kv(kvs, "tokenizer.ggml.tokens", "arr", ("str", toks[:-1] + [b"\xc3"])), ts),
        "UTF-8")
    add("bos-out-of-range", gu.raw(replace_kv(kvs, "tokenizer.ggml.bos_token_id", "u32", 5000), ts), "bos_token_id")
    add("tokenizer-spm", gu.raw(replace_kv(kvs, "tokenizer.ggml.model", "str", "llama"), ts), "tokenizer.ggml.model")
    add("pre-unknown", gu.raw(replace_kv(kvs, "tokenizer.ggml.pre", "str", "mystery"), ts), "mystery")
    add("eps-negative", gu.raw(replace_kv(kvs, "llama.attention.layer_norm_rms_epsilon", "f32", -1.0), ts),
        "out of range")
    return out


def main():
    base = su.scratch("import-gguf-rejects")
    store = os.path.join(base, "store")
    kvs, ts = gu.model_description()
    good = os.path.join(base, "good.gguf")
    with open(good, "wb") as f:
        f.write(gu.raw(kvs, ts))
    import gguf
    r = gguf.GGUFReader(good)  # the baseline is a valid GGUF for gguf-py too
    assert len(r.tensors) == len(ts), len(r.tensors)
    su.lms("import", good, "--name", "base", "--store", store, check=0)
    before = su.tree_digest(store)
    failures = 0
    all_cases = cases()
    for name, data, frag in all_cases:
        path = os.path.join(base, f"{name}.gguf")
        with open(path, "wb") as f:
            f.write(data)
        rc, out, err = su.lms("import", path, "--name", "x", "--store", store)
        after = su.tree_digest(store)
        ok = rc == 1 and f"{name}.gguf" in err and frag in err and after == before
        if not ok:
            failures += 1
            print(f"FAIL {name}: exit {rc}, store {'unchanged' if after == before else 'CHANGED'}, "
                  f"want '{frag}' in: {err.strip()}")
        else:
            print(f"ok   {name}: {err.strip()[:160]}")
    print(f"{len(all_cases) - failures} of {len(all_cases)} malformed files refused with a clear error, store unchanged")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
