#!/usr/bin/env python3
"""
tests/tools/test_cli_output.py - output and what commands report about it:

  - every command that prints exits 1 naming the failure when its standard
    output cannot be written (stdout on /dev/full): ls, info, cat, verify,
    kv ls, run (streamed and --json), tokenize, detokenize, gc --json, help;
    a generation stops at the first token it cannot write and saves nothing;
  - `run --resume` records the session's last-used time (docs/FORMAT.md
    3.7), as a save does;
  - `run -f DIR` and `perplexity -f DIR` say the path is a folder.
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clitest as ct  # noqa: E402

D = ct.scratch("output")
STORE = os.path.join(D, "store")
SRC = ct.gen_model(os.path.join(D, "tiny"))
ct.ok("import", SRC, "--store", STORE, "--name", "tiny", "-q")
ct.ok("run", "tiny", "hello", "--store", STORE, "-n", "2", "--save-session", "s")


def to_full(*args, stdin=None):
    """Run with stdout on /dev/full."""
    with open("/dev/full", "w") as full:
        io = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
        return subprocess.run([ct.BIN, *map(str, args)], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=300, **io)


def test_a_full_stdout_fails_every_printing_command():
    cases = [["ls", "--store", STORE], ["ls", "--json", "--store", STORE], ["info", "tiny", "--store", STORE],
             ["info", "tiny", "--json", "--store", STORE], ["cat", "tiny", "config.json", "--store", STORE],
             ["verify", "--store", STORE], ["verify", "--json", "--store", STORE], ["kv", "ls", "--store", STORE],
             ["kv", "ls", "--json", "--store", STORE], ["kv", "info", "s", "--store", STORE],
             ["run", "tiny", "hello", "-n", "3", "--store", STORE],
             ["run", "tiny", "hello", "-n", "3", "--json", "--store", STORE],
             ["tokenize", "tiny", "--text", "hello world", "--store", STORE],
             ["detokenize", "tiny", "--ids", "14990,1879", "--store", STORE],
             ["gc", "--json", "--store", STORE, "--grace", "0.1"], ["help"], ["--version"]]
    for args in cases:
        p = to_full(*args)
        assert p.returncode == 1, f"{args}: exit {p.returncode} with stdout on /dev/full; stderr: {p.stderr}"
        assert "writing to standard output: No space left on device" in p.stderr, f"{args}: {p.stderr}"
        assert p.stderr.count("writing to standard output") == 1, f"{args}: said twice: {p.stderr}"


def test_a_generation_into_a_full_stdout_stops_and_saves_nothing():
    p = to_full("run", "tiny", "hello", "-n", "200", "--ignore-eos", "--save-session", "never", "--store", STORE)
    assert p.returncode == 1 and "writing to standard output" in p.stderr, p.stderr
    sessions = json.loads(ct.ok("kv", "ls", "--json", "--store", STORE).stdout)
    assert "never" not in [s["name"] for s in sessions], sessions


def last_used(name):
    for s in json.loads(ct.ok("kv", "ls", "--json", "--store", STORE).stdout):
        if s["name"] == name:
            return s["last_used"]
    raise AssertionError(f"no session {name}")


def test_resume_records_the_last_used_time():
    before = last_used("s")
    time.sleep(1.1)
    ct.ok("run", "tiny", "--resume", "s", "--prompt-ids", "5", "-n", "1", "--store", STORE)
    after = last_used("s")
    assert after > before, (before, after)


def test_a_prompt_file_that_is_a_folder_is_named_so():
    for cmd in (["run", "tiny", "-f", D, "-n", "1"], ["perplexity", "tiny", "-f", D]):
        p = ct.run(*cmd, "--store", STORE)
        assert p.returncode == 1 and f"{D}: Is a directory" in p.stderr, f"{cmd}: {p.stderr}"
        assert "Input/output error" not in p.stderr


ct.run_tests(globals())
