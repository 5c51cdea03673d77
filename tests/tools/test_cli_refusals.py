#!/usr/bin/env python3
"""
tests/tools/test_cli_refusals.py - clear refusals: a malformed GGUF file or a text
file given to `import` is named for what it is; a folder without
config.json is imported with a warning and `run` names the missing file;
bad session names are refused before anything is generated; `detokenize`
names an id outside the vocabulary; --ctx above the model's max positions
warns; messages do not repeat their subject. Each case checks the exit
status, the message and, where something was refused, that the store's
files are byte for byte as before (and that no store is left behind where
there was none).
"""
import json
import os
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clitest as ct  # noqa: E402

D = ct.scratch("refusals")
STORE = os.path.join(D, "store")
SRC = ct.gen_model(os.path.join(D, "tiny"))
ct.ok("import", SRC, "--store", STORE, "--name", "tiny", "-q")
ct.ok("run", "tiny", "hello", "--store", STORE, "--max-tokens", "2", "--save-session", "kept")


def refused(args, status, *fragments, store=STORE):
    """Run; expect `status`, each fragment in stderr, and the store unchanged."""
    before = ct.tree_digest(store) if os.path.exists(store) else None
    p = ct.run(*args)
    assert p.returncode == status, f"{args}: exit {p.returncode}, want {status}; stderr: {p.stderr}"
    for f in fragments:
        assert f in p.stderr, f"{args}: message lacks {f!r}: {p.stderr.strip()}"
    if before is None:
        assert not os.path.exists(store), f"{args}: left a store behind: {os.listdir(store)}"
    else:
        assert ct.tree_digest(store) == before, f"{args}: the store changed"
    return p


def gguf_file(path):
    # a GGUF v3 header: magic, version, tensor count, metadata count
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    return path


def test_gguf_file_is_named_as_gguf():
    # GGUF imports (tests/store/test_import_gguf.py); a malformed one is refused as GGUF,
    # not as a safetensors header-length overflow
    g = gguf_file(os.path.join(D, "model.gguf"))
    p = refused(["import", g, "--store", STORE], 1, "model.gguf", "GGUF")
    assert "header length" not in p.stderr, p.stderr
    # a folder of (malformed) GGUF files only, and a store that did not exist: none is created
    folder = os.path.join(D, "ggufdir")
    os.makedirs(folder, exist_ok=True)
    gguf_file(os.path.join(folder, "m-Q4_K_M.gguf"))
    refused(["import", folder, "--store", os.path.join(D, "newstore")], 1, "GGUF", store=os.path.join(D, "newstore"))


def test_text_file_is_named_as_not_safetensors():
    t = os.path.join(D, "notes.safetensors")
    with open(t, "w") as f:
        f.write("these are my notes, not tensors\n")
    p = refused(["import", t, "--store", STORE], 1, "notes.safetensors", "not a safetensors file")
    assert "header length" not in p.stderr, p.stderr
    # into an empty folder meant as the store: it stays empty
    empty = os.path.join(D, "emptystore")
    os.makedirs(empty, exist_ok=True)
    ct.run("import", t, "--store", empty)
    assert os.listdir(empty) == [], os.listdir(empty)


def test_folder_without_config_json_warns_and_run_names_the_file():
    src = os.path.join(D, "nocfg")
    shutil.copytree(SRC, src, dirs_exist_ok=True)
    os.remove(os.path.join(src, "config.json"))
    p = ct.ok("import", src, "--store", STORE, "--name", "nocfg")
    assert "warning" in p.stderr and "no config.json" in p.stderr and "cannot run" in p.stderr, p.stderr
    p = refused(["run", "nocfg", "hello", "--store", STORE], 1, "nocfg", "config.json")
    assert "nocfg: nocfg" not in p.stderr


def test_bad_session_names_are_refused_before_generating():
    cases = {"": "must not be empty", "-x": "begins with '-'", "a\nb": "control character", "x" * 401: "more than 400",
             "\udcff": "not valid UTF-8"}  # (the byte 0xff)
    for name, why in cases.items():
        p = refused(["run", "tiny", "hello", "--store", STORE, "--max-tokens", "50", "--save-session", name], 2,
                    why, "nothing was generated")
        assert p.stdout == "", f"generated before refusing: {p.stdout!r}"
    p = ct.ok("kv", "ls", "--store", STORE, "--json")
    assert [s["name"] for s in json.loads(p.stdout)] == ["kept"], p.stdout


def test_detokenize_names_an_id_outside_the_vocabulary():
    p = refused(["detokenize", "tiny", "--ids", "14990,99999999", "--store", STORE], 1, "id 99999999", "at 1",
                "outside the vocabulary")
    assert p.stdout == ""
    p = ct.run("detokenize", "tiny", "--jsonl", "--store", STORE, stdin="[14990]\n[1, -5]\n")
    assert p.returncode in (1, 2) and ("line 2" in p.stderr), p.stderr
    assert json.loads(ct.ok("detokenize", "tiny", "--ids", "14990,1879", "--store", STORE, "--json").stdout) == \
        {"text": "hello world"}


def test_ctx_above_max_positions_warns():
    p = ct.ok("run", "tiny", "hello", "--store", STORE, "--max-tokens", "1", "--ctx", "4096")
    assert "warning" in p.stderr and "--ctx 4096" in p.stderr and "max_position_embeddings 2048" in p.stderr, \
        p.stderr
    p = ct.ok("run", "tiny", "hello", "--store", STORE, "--max-tokens", "1", "--ctx", "2048")
    assert "warning" not in p.stderr, p.stderr


def test_messages_do_not_repeat_their_subject():
    missing = os.path.join(D, "x")
    for args in (["run", "tiny", "hi", "--store", missing], ["info", "tiny", "--store", missing],
                 ["ls", "--store", missing], ["kv", "info", "s", "--store", missing]):
        p = ct.run(*args)
        assert p.returncode == 1, (args, p.stderr)
        assert p.stderr.count(missing) == 1, f"{args}: {p.stderr}"
    p = ct.run("run", "nosuchmodel", "hi", "--store", STORE)
    assert p.returncode == 1 and p.stderr.count("nosuchmodel") == 1, p.stderr


ct.run_tests(globals())
