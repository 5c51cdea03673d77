#!/usr/bin/env python3
"""
tests/tools/test_cli_habits.py - the CLI habits ollama, llama.cpp and mlx-lm
users bring: ls / kv ls on a store that does not exist yet list nothing,
global options before the command, --version and -h/--help anywhere, the
prompt as words after MODEL and on stdin, sampling defaults from the model's
generation_config.json (greedy without one, each option overriding its own
setting), gc --json, and info opening with a summary of the model (and
ls and info saying that a multimodal model's vision tower is stored but not
run).
Each case checks the exit status and what is printed.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clitest as ct  # noqa: E402

D = ct.scratch("habits")
STORE = os.path.join(D, "store")
SRC = ct.gen_model(os.path.join(D, "tiny"))
ct.ok("import", SRC, "--store", STORE, "--name", "tiny", "-q")
HELLO_IDS = [14990, 1879]  # "hello world" in Qwen3's tokenizer (HF tokenizers)


def home_env(tag):
    """An environment whose default store is a folder that does not exist yet."""
    h = os.path.join(D, tag)
    os.makedirs(h, exist_ok=True)
    env = {"HOME": h, "XDG_DATA_HOME": "", "LMSTORE_HOME": ""}
    return env, os.path.join(h, ".local", "share", "lmstore")


def test_ls_on_a_default_store_that_does_not_exist_lists_nothing():
    env, default = home_env("newhome")
    p = ct.run("ls", env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() [:3] == ["NAME", "ARCHITECTURE", "PARAMS"] and len(p.stdout.splitlines()) == 1, p.stdout
    assert ct.run("ls", "--json", env=env).stdout.strip() == "[]"
    p = ct.run("kv", "ls", env=env)
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 1, (p.stdout, p.stderr)
    assert ct.run("kv", "ls", "--json", env=env).stdout.strip() == "[]"
    assert not os.path.exists(default), "listing created the store"


def test_ls_on_an_empty_default_folder_lists_nothing():
    env, default = home_env("emptyhome")
    os.makedirs(default)
    p = ct.run("ls", env=env)
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 1, (p.stdout, p.stderr)
    assert os.listdir(default) == []


def test_explicit_store_that_is_not_one_is_an_error_naming_it_once():
    missing = os.path.join(D, "nostore")
    for args in (["ls", "--store", missing], ["--store", missing, "ls"], ["kv", "ls", "--store", missing]):
        p = ct.run(*args)
        assert p.returncode == 1, (args, p.returncode, p.stderr)
        assert p.stderr.count(missing) == 1 and "no store here" in p.stderr, p.stderr
    os.makedirs(os.path.join(D, "emptydir"), exist_ok=True)
    p = ct.run("ls", "--store", os.path.join(D, "emptydir"))
    assert p.returncode == 1 and "no store here" in p.stderr, p.stderr


def test_global_store_option_before_the_command():
    p = ct.ok("--store", STORE, "ls")
    assert "tiny" in p.stdout, p.stdout
    p = ct.ok("--store=" + STORE, "ls", "--json")
    assert [m["name"] for m in json.loads(p.stdout)] == ["tiny"]
    # the command's own --store wins over the global one
    p = ct.ok("--store", os.path.join(D, "elsewhere"), "ls", "--store", STORE)
    assert "tiny" in p.stdout


def test_version_and_help_anywhere():
    for args in (["--version"], ["-V"], ["version"]):
        p = ct.ok(*args)
        assert p.stdout.startswith("lmstore 0."), p.stdout
    p = ct.ok("--help")
    assert "commands:" in p.stdout and "run" in p.stdout
    for args in (["run", "tiny", "--max-tokens", "3", "--help"], ["run", "-h"], ["help", "run"],
                 ["run", "tiny", "--temp", "junk", "-h"]):
        p = ct.ok(*args)
        assert p.stdout.startswith("usage: lmstore run"), (args, p.stdout)
    for args in (["ls", "-h"], ["gc", "--dry-run", "--help"], ["import", "a", "b", "--help"]):
        p = ct.ok(*args)
        assert p.stdout.startswith(f"usage: lmstore {args[0]}"), (args, p.stdout)
    p = ct.ok("kv", "ls", "--help")
    assert p.stdout.startswith("usage: lmstore kv"), p.stdout
    p = ct.ok("bench", "load", "-h")
    assert "bench load" in p.stdout, p.stdout
    # after --, -h is part of the prompt, not a request for help
    want = json.loads(ct.ok("tokenize", "tiny", "--store", STORE, "--text", "-h", "--json").stdout)["ids"]
    p = ct.run("run", "tiny", "--store", STORE, "--max-tokens", "1", "--json", "--", "-h")
    assert p.returncode == 0 and json.loads(p.stdout)["prompt_ids"] == want, (p.stdout, p.stderr)


def test_prompt_as_words_after_the_model():
    p = ct.ok("run", "tiny", "hello", "world", "--store", STORE, "--max-tokens", "2", "--json")
    assert json.loads(p.stdout)["prompt_ids"] == HELLO_IDS, p.stdout
    p = ct.ok("run", "tiny", "hello world", "--max-tokens", "2", "--json", "--store", STORE)
    assert json.loads(p.stdout)["prompt_ids"] == HELLO_IDS, p.stdout
    p = ct.run("run", "tiny", "hello", "-p", "world", "--store", STORE)
    assert p.returncode == 2 and "one prompt" in p.stderr, p.stderr


def test_prompt_from_stdin_when_it_is_not_a_terminal():
    p = ct.run("run", "tiny", "--store", STORE, "--max-tokens", "2", "--json", stdin="hello world")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["prompt_ids"] == HELLO_IDS, p.stdout
    # an empty stdin is no prompt
    p = ct.run("run", "tiny", "--store", STORE, stdin="")
    assert p.returncode == 2 and "no prompt" in p.stderr, p.stderr


def sampling(model, *opts):
    p = ct.ok("run", model, "hello", "--store", STORE, "--max-tokens", "1", "--json", *opts)
    return json.loads(p.stdout)["sampling"]


def test_sampling_defaults_come_from_generation_config():
    src = ct.gen_model(os.path.join(D, "sampled"))
    ct.write_json(os.path.join(src, "generation_config.json"),
                  {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": 2})
    ct.ok("import", src, "--store", STORE, "--name", "sampled", "-q")
    s = sampling("sampled")
    assert s["from_model"] and abs(s["temperature"] - 0.6) < 1e-6 and s["top_k"] == 20, s
    assert abs(s["top_p"] - 0.95) < 1e-6 and s["min_p"] == 0, s
    # an option overrides its own setting only
    s = sampling("sampled", "--temp", "0")
    assert s["temperature"] == 0 and s["top_k"] == 20, s
    s = sampling("sampled", "--top-k", "5")
    assert abs(s["temperature"] - 0.6) < 1e-6 and s["top_k"] == 5, s


def test_sampling_is_greedy_without_generation_config_sampling():
    s = sampling("tiny")  # gen_model writes a generation_config.json without do_sample
    assert not s["from_model"] and s["temperature"] == 0 and s["top_k"] == 0 and s["top_p"] == 1, s
    # greedy: two runs give the same ids
    a = json.loads(ct.ok("run", "tiny", "hello", "--store", STORE, "--max-tokens", "8", "--json").stdout)["ids"]
    b = json.loads(ct.ok("run", "tiny", "hello", "--store", STORE, "--max-tokens", "8", "--json").stdout)["ids"]
    assert a == b


def test_malformed_generation_config_is_a_warning_and_greedy():
    src = ct.gen_model(os.path.join(D, "badgen"))
    ct.write_json(os.path.join(src, "generation_config.json"), {"do_sample": True, "temperature": "hot"})
    ct.ok("import", src, "--store", STORE, "--name", "badgen", "-q")
    p = ct.ok("run", "badgen", "hello", "--store", STORE, "--max-tokens", "1", "--json")
    assert "warning" in p.stderr and "generation_config.json" in p.stderr and "temperature" in p.stderr, p.stderr
    assert json.loads(p.stdout)["sampling"]["temperature"] == 0


def test_gc_json_reports_numbers():
    p = ct.ok("gc", "--store", STORE, "--json")
    r = json.loads(p.stdout)
    for k in ("bytes_freed", "bytes_punched", "bytes_before", "bytes_after", "blobs_deleted", "segments_busy"):
        assert isinstance(r[k], int), (k, r)
    assert r["dry_run"] is False
    assert json.loads(ct.ok("gc", "--store", STORE, "--json", "--dry-run").stdout)["dry_run"] is True


def test_info_starts_with_a_summary():
    p = ct.ok("info", "tiny", "--store", STORE)
    head = p.stdout.split("tensors (storage order):")[0]
    for line in ("model:         tiny", "architecture:  Qwen3ForCausalLM (qwen3)", "layers:        2",
                 "heads:         4 attention, 2 key/value, head dim 16", "context:       2048 tokens",
                 "dtype:         BF16", "parameters:    "):
        assert line in head, (line, head)
    assert "bytes:" in head and "tensors (" in head
    j = json.loads(ct.ok("info", "tiny", "--store", STORE, "--json").stdout)
    s = j["summary"]
    assert (s["layers"], s["heads"], s["kv_heads"], s["context"], s["dtype"]) == (2, 4, 2, 2048, "BF16"), s
    assert s["bytes"] == sum(t["nbytes"] for t in j["tensors"]) and s["params"] == j["params"], s


def test_ls_and_info_say_a_vision_tower_is_stored_but_not_run():
    fixtures = os.path.join(ct.SRC, "tests", "fixtures", "engine")
    ct.ok("import", os.path.join(fixtures, "gemma3-mm"), "--store", STORE, "--name", "g3mm", "-q")
    ct.ok("import", os.path.join(fixtures, "gemma3"), "--store", STORE, "--name", "g3", "-q")
    rows = {ln.split()[0]: ln for ln in ct.ok("ls", "--store", STORE).stdout.splitlines()[1:]}
    assert "vision tower stored, not run" in rows["g3mm"], rows["g3mm"]
    assert "vision" not in rows["g3"] and "vision" not in rows["tiny"], rows
    js = {m["name"]: m for m in json.loads(ct.ok("ls", "--store", STORE, "--json").stdout)}
    assert js["g3mm"]["vision_tower"] == {"tensors": 34, "bytes": js["g3mm"]["vision_tower"]["bytes"], "run": False}
    assert 0 < js["g3mm"]["vision_tower"]["bytes"] < js["g3mm"]["bytes"] and "vision_tower" not in js["g3"]
    head = ct.ok("info", "g3mm", "--store", STORE).stdout.split("tensors (storage order):")[0]
    assert "architecture:  Gemma3ForConditionalGeneration (gemma3)" in head, head
    assert "vision tower:  stored, not run (34 tensors" in head and "lmstore runs the text model" in head, head
    assert "layers:        4" in head, head  # the text model's, from text_config
    s = json.loads(ct.ok("info", "g3mm", "--store", STORE, "--json").stdout)["summary"]
    assert s["vision_tower"]["run"] is False and s["vision_tower"]["tensors"] == 34, s
    assert "vision" not in ct.ok("info", "g3", "--store", STORE).stdout.split("tensors (storage order):")[0]
    ct.ok("rm", "g3mm", "--store", STORE)
    ct.ok("rm", "g3", "--store", STORE)


ct.run_tests(globals())
