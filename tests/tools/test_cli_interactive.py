#!/usr/bin/env python3
"""
tests/tools/test_cli_interactive.py - the CLI with a person at the keys:
Ctrl-C (a real SIGINT to a real process) during `run` stops the generation
cleanly, prints the metrics line, still saves --save-session and exits 130,
while a second Ctrl-C exits at once; `lmstore chat` on a terminal (a
pseudo-terminal here) edits the line with the arrow keys, recalls earlier
lines (also from an earlier run: the history file) and answers /help.
"""
import json
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import clitest as ct  # noqa: E402

D = ct.scratch("interactive")
STORE = os.path.join(D, "store")
ct.ok("import", ct.gen_model(os.path.join(D, "slow"), size="slow"), "--store", STORE, "--name", "slow", "-q")
ct.ok("import", ct.gen_model(os.path.join(D, "chat"), size="chat"), "--store", STORE, "--name", "chat", "-q")


def sessions():
    return {s["name"]: s for s in json.loads(ct.ok("kv", "ls", "--store", STORE, "--json").stdout)}


def test_ctrl_c_stops_run_prints_metrics_and_saves_the_session():
    p = subprocess.Popen([ct.BIN, "run", "slow", "hello", "--store", STORE, "--max-tokens", "0", "--ignore-eos",
                          "--ctx", "4096", "--save-session", "cut"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = p.stdout.read(1)  # generation has begun
    assert first, p.stderr.read()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    out, err = first + out, err.decode()
    assert p.returncode == 130, (p.returncode, err)
    assert "stop: interrupted" in err and "tok/s" in err, err
    m = [ln for ln in err.splitlines() if ln.startswith("load ")]
    gen = int(m[0].split("generated ")[1].split(" tok")[0])
    assert 1 <= gen < 4000, m  # stopped well before the context was full
    assert "saved session 'cut'" in err, err
    s = sessions()["cut"]
    assert s["tokens"] >= 1 + gen - 1, (s, gen)  # the prompt and what was generated
    # the saved conversation resumes
    r = json.loads(ct.ok("run", "slow", "--resume", "cut", "--store", STORE, "--max-tokens", "1", "--json").stdout)
    assert r["metrics"]["reused_tokens"] >= s["tokens"] - 1, r


def test_second_ctrl_c_exits_at_once():
    # a 4000-token prompt: its computation takes seconds, and the first
    # Ctrl-C can stop the generation only when the first token comes. The
    # model is open when the --ctx warning (above its 8192 positions) is
    # printed; the prompt's computation starts right after it.
    prompt = os.path.join(D, "long.txt")
    with open(prompt, "w") as f:
        f.write(" ".join(f"word{i % 50}" for i in range(1900)))
    p = subprocess.Popen([ct.BIN, "run", "slow", "-f", prompt, "--store", STORE, "--ctx", "8200",
                          "--max-tokens", "5", "--save-session", "never"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    warning = p.stderr.readline()
    assert b"warning: --ctx 8200" in warning, warning
    time.sleep(0.5)
    assert p.poll() is None, "finished before the first Ctrl-C: the prompt was computed too fast for this test"
    p.send_signal(signal.SIGINT)
    time.sleep(0.3)
    assert p.poll() is None, "the first Ctrl-C ended the program"
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    took = time.monotonic() - t0
    assert p.returncode == 130, (p.returncode, err)
    assert took < 1.0, f"the second Ctrl-C took {took:.2f} s to end it"
    assert b"stop:" not in err, warning + err  # no metrics: it left at once
    assert "never" not in sessions()


class Terminal:
    """`lmstore chat` on a pseudo-terminal, read and written like a person would."""

    def __init__(self, *args, home):
        self.master, slave = pty.openpty()
        env = dict(os.environ, TERM="xterm", HOME=home, XDG_STATE_HOME="", LMSTORE_HOME="")
        self.p = subprocess.Popen([ct.BIN, *args], stdin=slave, stdout=slave, stderr=slave, env=env,
                                  start_new_session=True)
        os.close(slave)
        self.out = b""
        self.seen = 0  # read_until looks past what it matched before

    def read_until(self, what, timeout=60):
        """Read until `what` appears after the previous match."""
        end = time.monotonic() + timeout
        while what not in self.out[self.seen:]:
            r, _, _ = select.select([self.master], [], [], max(0, end - time.monotonic()))
            if not r:
                raise AssertionError(f"timed out waiting for {what!r}; got {self.out[-2000:]!r}")
            try:
                self.out += os.read(self.master, 65536)
            except OSError:
                raise AssertionError(f"the program ended before {what!r}; got {self.out[-2000:]!r}")
        self.seen = self.out.index(what, self.seen) + len(what)

    def prompt(self, timeout=60):
        """Wait for the next prompt and for the line editor to read it: the
        terminal leaves canonical mode (keys typed before that go through
        the kernel's line discipline, where Ctrl-D would be an end of file
        the editor never sees)."""
        self.read_until(b"> ", timeout)
        end = time.monotonic() + timeout
        while termios.tcgetattr(self.master)[3] & termios.ICANON:
            if time.monotonic() > end:
                raise AssertionError(f"the terminal stayed in canonical mode; got {self.out[-2000:]!r}")
            time.sleep(0.01)

    def type(self, keys):
        os.write(self.master, keys)

    def close(self):
        rc = self.p.wait(timeout=60)
        os.close(self.master)
        return rc


HELP_LINE = b"/load NAME   continue session NAME"
LEFT, UP = b"\x1b[D", b"\x1b[A"


def test_chat_edits_lines_recalls_history_and_answers_help():
    home = os.path.join(D, "home")
    os.makedirs(home, exist_ok=True)
    t = Terminal("chat", "chat", "--store", STORE, "--max-tokens", "2", home=home)
    t.read_until(b"/help for commands")
    t.prompt()
    # "/hlp", two steps left, "e": the line becomes "/help"
    t.type(b"/hlp" + LEFT + LEFT + b"e\r")
    t.read_until(HELP_LINE)
    assert b"unknown command" not in t.out, t.out
    # up arrow recalls "/help"
    t.prompt()
    t.type(UP + b"\r")
    t.read_until(HELP_LINE)
    assert t.out.count(HELP_LINE) == 2, t.out
    # a message gets a reply and a metrics line; Ctrl-D at the next prompt leaves
    t.prompt()
    t.type(b"hello\r")
    t.read_until(b"stop: ")
    t.prompt()
    t.type(b"\x04")
    assert t.close() == 0, t.out
    hist = os.path.join(home, ".local", "state", "lmstore", "history")
    with open(hist, "rb") as f:
        h = f.read()
    assert b"/help" in h and b"hello" in h, h
    # a new run recalls the last line of the previous one
    t = Terminal("chat", "chat", "--store", STORE, "--max-tokens", "2", home=home)
    t.prompt()
    t.type(UP + b"\r")
    t.read_until(b"stop: ")  # "hello" again: a reply
    t.prompt()
    t.type(b"/quit\r")
    assert t.close() == 0, t.out


ct.run_tests(globals())
