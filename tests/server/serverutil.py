"""
tests/server/serverutil.py - helpers for the tests of `lmstore serve`:
scratch stores with the tiny Qwen3-shaped models of tests/tools/clitest.py,
starting a server on a free loopback port (the server prints the port it
got), raw HTTP requests for what the openai client cannot send (malformed
bodies), the server's /metrics as numbers, and its RSS.
"""

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import clitest  # noqa: E402
from clitest import BIN, SRC, TMP, ok, run_tests, scratch  # noqa: E402,F401

SKIP = 77


def skip_without_server():
    """Exit 77 when this build has no HTTP server (no libmicrohttpd at build time)."""
    p = subprocess.run([BIN, "serve", "--store", os.path.join(TMP, "no-store"), "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    if "built without libmicrohttpd" in p.stderr:
        print("skipped: this lmstore was built without libmicrohttpd (Debian: libmicrohttpd-dev)")
        sys.exit(SKIP)


def sanitized_build():
    cache = os.path.join(os.environ.get("LMS_BUILD_DIR", ""), "CMakeCache.txt")
    try:
        with open(cache) as f:
            return any(line.startswith("LMS_SANITIZE:") and line.split("=", 1)[1].strip() for line in f)
    except OSError:
        return False


def make_store(tag, sizes=("tiny", "chat")):
    """A scratch store with the named clitest models imported under their size names."""
    base = scratch(tag)
    store = os.path.join(base, "store")
    for size in sizes:
        src = clitest.gen_model(os.path.join(base, size + "-hf"), size=size)
        ok("import", src, "--name", size, "--store", store)
    return base, store


class Server:
    """`lmstore serve` on a free loopback port; stop() sends SIGTERM and waits."""

    def __init__(self, store, *models, args=(), env=None):
        self.log = os.path.join(TMP, f"serve-{os.getpid()}-{time.monotonic_ns()}.log")
        e = dict(os.environ)
        e.update(env or {})
        self.logf = open(self.log, "w+")
        self.proc = subprocess.Popen([BIN, "serve", *models, "--store", store, "--port", "0", *map(str, args)],
                                     stdout=subprocess.DEVNULL, stderr=self.logf, env=e)
        deadline = time.time() + 120
        self.port = None
        while time.time() < deadline and self.port is None:
            if self.proc.poll() is not None:
                raise AssertionError(f"lmstore serve exited {self.proc.returncode}: {self.stderr()}")
            m = re.search(r"listening on http://[^ ]*:(\d+)", self.stderr())
            if m:
                self.port = int(m.group(1))
            else:
                time.sleep(0.05)
        if self.port is None:
            self.kill()
            raise AssertionError("lmstore serve did not start: " + self.stderr())
        self.base = f"http://127.0.0.1:{self.port}"

    def stderr(self):
        with open(self.log) as f:
            return f.read()

    def client(self, api_key="none", **kw):
        import openai
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0, **kw)

    def request(self, method, path, body=None, headers=None, timeout=60, chunked=False):
        """Raw HTTP: returns (status, parsed JSON or text). chunked: send the
        body with chunked transfer encoding (no Content-Length)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if chunked:
            data = body.encode() if isinstance(body, str) else body
            body = (data[i:i + 65536] for i in range(0, len(data), 65536))
        c.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"},
                  encode_chunked=chunked)
        r = c.getresponse()
        data = r.read().decode()
        c.close()
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data

    def metrics(self):
        """/metrics as {name{labels}: value}."""
        st, text = self.request("GET", "/metrics")
        assert st == 200, text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def rss(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self, timeout=120):
        """SIGTERM, wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self.logf.close()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.logf.close()


def raw_post(port, path, body, headers=b"", length=None, timeout=60):
    """Send a POST on a raw socket (body: bytes, str or a JSON value; length:
    the Content-Length to announce, default the body's) and return the
    socket: the caller reads what it wants, or hangs up."""
    if not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    data = body.encode() if isinstance(body, str) else body
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + headers +
              b"Content-Length: " + str(len(data) if length is None else length).encode() + b"\r\n\r\n" + data)
    return s


def read_until(s, marker=None):
    """Read from s until marker has come (None: until the peer closes); returns what came."""
    data = b""
    while marker is None or marker not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def run_json(store, model, *args):
    """`lmstore run ... --json` as a dict."""
    return json.loads(ok("run", model, "--store", store, *args, "--json").stdout)
