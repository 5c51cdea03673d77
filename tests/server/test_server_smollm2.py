#!/usr/bin/env python3
"""
tests/server/test_server_smollm2.py - `lmstore serve` on the real default
model, SmolLM2-135M-Instruct (models/smollm2-135m-instruct, as
tools/quickstart.sh fetches it): a greedy chat completion and a greedy text
completion through the openai client equal `lmstore run` with the same
settings, also when four requests run at once. Skipped (77) when the model
has not been fetched or the build has no libmicrohttpd. In a sanitizer
build, fewer tokens.
"""

import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serverutil as su  # noqa: E402

MODEL_DIR = os.path.join(su.SRC, "models", "smollm2-135m-instruct")


def main():
    if not os.path.exists(os.path.join(MODEL_DIR, "model.safetensors")):
        print(f"skipped: {MODEL_DIR} not found (tools/quickstart.sh fetches it)")
        return su.SKIP
    su.skip_without_server()
    n = 6 if su.sanitized_build() else 24
    base = su.scratch("server-smollm2")
    store = os.path.join(base, "store")
    su.ok("import", MODEL_DIR, "--name", "smollm2", "--store", store)
    q = "What is the capital of France?"
    chat_want = su.run_json(store, "smollm2", "--chat", "-p", q, "--temp", "0", "--max-tokens", str(n),
                            "--ctx", "1024", "--threads", "2")
    text_want = su.run_json(store, "smollm2", "-p", "The three primary colors are", "--temp", "0",
                            "--max-tokens", str(n), "--ctx", "1024", "--threads", "2")
    srv = su.Server(store, "smollm2", args=["--parallel", "4", "--ctx", "1024", "--threads", "2"])
    failures = []
    try:
        cl = srv.client(timeout=600)

        def chat():
            r = cl.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": q}],
                                           max_tokens=n, temperature=0)
            return r.choices[0].message.content, r.usage

        def text():
            r = cl.completions.create(model="smollm2", prompt="The three primary colors are", max_tokens=n,
                                      temperature=0)
            return r.choices[0].text, r.usage

        got, usage = chat()
        if got != chat_want["text"] or usage.prompt_tokens != len(chat_want["prompt_ids"]):
            failures.append(f"chat: got {got!r} ({usage.prompt_tokens} prompt tokens), "
                            f"lmstore run: {chat_want['text']!r} ({len(chat_want['prompt_ids'])})")
        got, usage = text()
        if got != text_want["text"] or usage.completion_tokens != len(text_want["ids"]):
            failures.append(f"completion: got {got!r}, lmstore run: {text_want['text']!r}")
        # four at once: each slot computes what one request alone computes
        res = [None] * 4
        ts = [threading.Thread(target=lambda i=i: res.__setitem__(i, (chat if i % 2 else text)()[0]))
              for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for i, r in enumerate(res):
            want = (chat_want if i % 2 else text_want)["text"]
            if r != want:
                failures.append(f"concurrent request {i}: got {r!r}, want {want!r}")
    finally:
        code = srv.stop()
    if code != 0:
        failures.append(f"lmstore serve exited {code}")
    for f in failures:
        print("FAIL " + f)
    print("ok: greedy answers equal lmstore run's" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
