"""
tests/tools/clitest.py - helpers for the tests of the CLI as users meet it
(test_cli_habits.py, test_cli_numbers.py, test_cli_refusals.py,
test_cli_interactive.py): tiny Qwen3-shaped models with the real Qwen3
tokenizer (tests/fixtures/tokenizers) made with tests/gen_model.py and
running the CLI; scratch folders, store digests and the test runner come
from tests/store/storeutil.py.
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "store"))
from storeutil import run_tests, scratch, tree_digest  # noqa: E402,F401  (re-exported for the tests)

SRC = os.environ.get("LMS_SRC_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("LMS_BIN", "lmstore")
TMP = os.environ.get("LMS_TMP", "/tmp/lms-cli-test")
QWEN3_TOK = os.path.join(SRC, "tests", "fixtures", "tokenizers", "qwen3")


def run(*args, stdin=None, env=None, timeout=300):
    """Run the CLI (stdin from /dev/null unless given); returns CompletedProcess (text)."""
    e = dict(os.environ)
    e.update(env or {})
    io = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=e, **io)


def ok(*args, **kw):
    p = run(*args, **kw)
    assert p.returncode == 0, f"lmstore {' '.join(map(str, args))}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def gen_model(out, *args, size="tiny"):
    """A Qwen3-shaped model with the real Qwen3 tokenizer and a ChatML template.
    size "tiny": 2 layers of width 64 and the first 16384 ids (fast; plain
    text only); "chat": 1 layer of width 32 and Qwen3's whole vocabulary (the
    chat format's special tokens too); "slow": 8 layers of width 512 (a
    4000-token prompt takes seconds to compute)."""
    shape = {"tiny": ["--hidden", "64", "--layers", "2", "--vocab", "16384"],
             "chat": ["--hidden", "32", "--layers", "1", "--vocab", "151936", "--tied"],
             "slow": ["--hidden", "512", "--intermediate", "1536", "--layers", "8", "--heads", "8",
                      "--kv-heads", "4", "--max-pos", "8192", "--vocab", "16384"]}[size]
    subprocess.run([sys.executable, os.path.join(SRC, "tests", "gen_model.py"), out, "--force", "--arch", "qwen3",
                    "--tokenizer", QWEN3_TOK, "--chat-template", *shape, *map(str, args)],
                   check=True, capture_output=True)
    return out


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
