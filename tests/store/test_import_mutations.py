#!/usr/bin/env python3
"""tests/store/test_import_mutations.py - `lmstore import` of randomly damaged
safetensors files (seeded): bytes of the length field and the JSON header
flipped, replaced or deleted, files cut short. Every run must end with exit
status 0 (the damage happened to be harmless) or 1 with a message naming the
file, never a crash or a sanitizer report, and a rejected file must leave
the store byte-for-byte unchanged."""
import os
import random
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from storeutil import BIN, gen_model, lms, run_tests, scratch, tree_digest, write  # noqa: E402

D = scratch("mutations")
SRC = gen_model(os.path.join(D, "m"), "--arch", "qwen2", "--hidden", "32", "--layers", "1", "--vocab", "32",
                "--single-file", "--metadata")
with open(os.path.join(SRC, "model.safetensors"), "rb") as f:
    GOOD = f.read()
(HLEN,) = struct.unpack("<Q", GOOD[:8])
STORE = os.path.join(D, "store")
lms("import", os.path.join(SRC, "model.safetensors"), "--store", STORE, "--name", "base", "-q", check=0)


def mutate(rng, blob):
    b = bytearray(blob)
    kind = rng.randrange(5)
    if kind == 0:  # flip bits in the header
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(8 + HLEN)] ^= 1 << rng.randrange(8)
    elif kind == 1:  # replace a header byte with JSON punctuation or a digit
        b[rng.randrange(8, 8 + HLEN)] = ord(rng.choice('{}[],:"-0123456789e.\\ '))
    elif kind == 2:  # delete a header byte (the length field now lies)
        del b[rng.randrange(8, 8 + HLEN)]
    elif kind == 3:  # cut the file short
        del b[rng.randrange(len(b)):]
    else:  # a new length field
        b[:8] = struct.pack("<Q", rng.choice([0, 1, HLEN - 1, HLEN + 1, len(b), 2**63, 2**64 - 1]))
    return bytes(b)


def test_damaged_files_are_rejected_cleanly():
    rng = random.Random(1234)
    p = os.path.join(D, "bad.safetensors")
    outcomes = {0: 0, 1: 0}
    for i in range(120):
        write(p, mutate(rng, GOOD))
        before = tree_digest(STORE)
        r = subprocess.run([BIN, "import", p, "--store", STORE, "--name", f"x{i}", "-q"], capture_output=True,
                           text=True, errors="replace")
        assert r.returncode in (0, 1), f"case {i}: exit {r.returncode}\n{r.stderr[-2000:]}"
        assert "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr[-2000:]
        if r.returncode == 1:
            assert "bad.safetensors" in r.stderr, f"case {i}: message does not name the file: {r.stderr}"
            assert tree_digest(STORE) == before, f"case {i}: rejected but the store changed"
        outcomes[r.returncode] += 1
    print(f"accepted {outcomes[0]}, rejected {outcomes[1]}")
    assert outcomes[1] > 60, outcomes  # most damage must be caught


if __name__ == "__main__":
    run_tests(globals())
