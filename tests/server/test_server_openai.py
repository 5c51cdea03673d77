#!/usr/bin/env python3
"""
tests/server/test_server_openai.py - `lmstore serve` as OpenAI's own Python
client (PyPI openai) sees it, on tiny Qwen3-shaped models with the real Qwen3
tokenizer: chat and text completions streamed and not, stop strings, usage
and cached tokens, logprobs, /tokenize and /detokenize, every error class
with its status and OpenAI-style body, bearer auth, and /metrics agreeing
with what the client did. Greedy answers must equal `lmstore run` with the
same settings. Skipped (77) only when the build has no libmicrohttpd.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serverutil as su  # noqa: E402

su.skip_without_server()
import openai  # noqa: E402

BASE, STORE = su.make_store("server-openai", sizes=("tiny", "chat"))
SRV = su.Server(STORE, "tiny", "chat", args=["--parallel", "2", "--threads", "1", "--ctx", "512"])
CL = SRV.client()
PROMPT = "the quick brown fox jumps over"

# what the tests did, for the /metrics check at the end: (endpoint, status) -> count
DONE = {}
GEN_TOKENS = [0]


def did(endpoint, status, n=1):
    DONE[(endpoint, status)] = DONE.get((endpoint, status), 0) + n


def complete(**kw):
    r = CL.completions.create(model="chat", **kw)
    did("/v1/completions", 200)
    GEN_TOKENS[0] += r.usage.completion_tokens
    return r


def chat(**kw):
    r = CL.chat.completions.create(model="chat", **kw)
    did("/v1/chat/completions", 200)
    GEN_TOKENS[0] += r.usage.completion_tokens
    return r


def error_of(fn, cls, status):
    try:
        fn()
    except cls as e:
        assert e.status_code == status, (e.status_code, e)
        body = e.body if isinstance(e.body, dict) else {}
        assert {"message", "type", "param", "code"} <= set(body), body  # OpenAI's error object
        return body
    raise AssertionError(f"no {cls.__name__}")


def test_models_lists_the_served_models():
    ms = CL.models.list()
    did("/v1/models", 200)
    assert [m.id for m in ms.data] == ["tiny", "chat"], ms


def test_greedy_completion_equals_lmstore_run():
    want = su.run_json(STORE, "chat", "-p", PROMPT, "--temp", "0", "--max-tokens", "16", "--ctx", "512")
    r = complete(prompt=PROMPT, max_tokens=16, temperature=0, logprobs=0)
    assert r.choices[0].text == want["text"], (r.choices[0].text, want["text"])
    assert r.usage.prompt_tokens == len(want["prompt_ids"])
    assert r.usage.completion_tokens == len(want["ids"]) == 16
    assert r.choices[0].finish_reason == "length"
    # the ids themselves, through the token strings of logprobs
    st, tok = SRV.request("POST", "/detokenize", {"model": "chat", "tokens": want["ids"]})
    did("/detokenize", 200)
    assert "".join(r.choices[0].logprobs.tokens) == tok["content"] == want["text"]


def test_greedy_chat_equals_lmstore_run_chat():
    want = su.run_json(STORE, "chat", "--chat", "-p", "hello", "--temp", "0", "--max-tokens", "12", "--ctx", "512")
    r = chat(messages=[{"role": "user", "content": "hello"}], max_tokens=12, temperature=0)
    assert r.choices[0].message.content == want["text"], (r.choices[0].message.content, want["text"])
    assert r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(want["prompt_ids"])
    assert r.usage.completion_tokens == len(want["ids"])


def test_streamed_equals_not_streamed_with_usage_chunk():
    for is_chat in (False, True):
        kw = dict(max_tokens=10, temperature=0)
        if is_chat:
            whole = chat(messages=[{"role": "user", "content": "count"}], **kw)
            s = CL.chat.completions.create(model="chat", messages=[{"role": "user", "content": "count"}],
                                           stream=True, stream_options={"include_usage": True}, **kw)
            ep = "/v1/chat/completions"
        else:
            whole = complete(prompt=PROMPT, **kw)
            s = CL.completions.create(model="chat", prompt=PROMPT, stream=True,
                                      stream_options={"include_usage": True}, **kw)
            ep = "/v1/completions"
        text, finish, usage, n_chunks = "", None, None, 0
        for ch in s:
            n_chunks += 1
            if ch.usage:
                usage = ch.usage
            for c in ch.choices:
                text += (c.delta.content or "") if is_chat else c.text
                finish = c.finish_reason or finish
        did(ep, 200)
        GEN_TOKENS[0] += usage.completion_tokens
        want = whole.choices[0].message.content if is_chat else whole.choices[0].text
        assert text == want, (text, want)
        assert finish == whole.choices[0].finish_reason
        assert usage.completion_tokens == whole.usage.completion_tokens
        assert usage.prompt_tokens == whole.usage.prompt_tokens
        assert n_chunks >= 3


def test_stop_string_cuts_the_text_before_it():
    full = complete(prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    words = full.split()
    stop = words[len(words) // 2]
    cut = full[:full.index(stop)]
    r = complete(prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop, "never appears"])
    assert r.choices[0].text == cut, (r.choices[0].text, cut)
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 24
    # streamed: the same text, and the stop string never shows
    text = ""
    for ch in CL.completions.create(model="chat", prompt=PROMPT, max_tokens=24, temperature=0, stop=stop,
                                    stream=True):
        text += ch.choices[0].text
    did("/v1/completions", 200)
    assert text == cut and stop not in text
    GEN_TOKENS[0] += r.usage.completion_tokens  # the same count as the streamed one


def test_usage_counts_and_cached_tokens_on_a_repeated_prompt():
    long = " ".join(["lorem ipsum dolor sit amet"] * 20)
    st, tok = SRV.request("POST", "/tokenize", {"model": "chat", "content": long, "add_special": True})
    did("/tokenize", 200)
    a = complete(prompt=long, max_tokens=5, temperature=0)
    b = complete(prompt=long, max_tokens=5, temperature=0)
    assert a.usage.prompt_tokens == b.usage.prompt_tokens == len(tok["tokens"])
    assert a.usage.total_tokens == a.usage.prompt_tokens + a.usage.completion_tokens
    # the second request reuses the first one's K/V (whole pages at least)
    assert b.usage.prompt_tokens_details.cached_tokens >= 16, b.usage
    assert b.choices[0].text == a.choices[0].text


def test_logprobs_of_greedy_tokens_are_the_top_ones():
    r = chat(messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0, logprobs=True,
             top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    for t in lp:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 3
        tops = [x.logprob for x in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6  # greedy takes the most probable


def test_seed_makes_sampling_repeatable():
    a = complete(prompt=PROMPT, max_tokens=12, temperature=1.0, seed=7).choices[0].text
    b = complete(prompt=PROMPT, max_tokens=12, temperature=1.0, seed=7).choices[0].text
    assert a == b


def test_tokenize_detokenize_round_trip():
    text = "Hello, wörld! 123 <|im_start|>"
    st, t = SRV.request("POST", "/tokenize", {"model": "chat", "content": text, "with_pieces": True})
    did("/tokenize", 200)
    assert st == 200 and all("id" in p and "piece" in p for p in t["tokens"])
    ids = [p["id"] for p in t["tokens"]]
    st, d = SRV.request("POST", "/detokenize", {"model": "chat", "tokens": ids})
    did("/detokenize", 200)
    assert st == 200 and d["content"] == text, d


def test_errors_have_status_and_openai_body():
    e = error_of(lambda: CL.completions.create(model="nope", prompt="x"), openai.NotFoundError, 404)
    assert e["code"] == "model_not_found" and e["param"] == "model"
    did("/v1/completions", 404)
    error_of(lambda: CL.completions.create(model="chat", prompt="x", n=2), openai.BadRequestError, 400)
    did("/v1/completions", 400)
    e = error_of(lambda: CL.completions.create(model="chat", prompt="word " * 600, max_tokens=4),
                 openai.BadRequestError, 400)
    assert e["code"] == "context_length_exceeded", e
    did("/v1/completions", 400)
    e = error_of(lambda: CL.completions.create(model="chat", prompt="x", max_tokens=100000),
                 openai.BadRequestError, 400)
    assert e["code"] == "context_length_exceeded" and e["param"] == "max_tokens", e
    did("/v1/completions", 400)
    error_of(lambda: CL.chat.completions.create(model="chat", messages=[]), openai.BadRequestError, 400)
    did("/v1/chat/completions", 400)
    # what the client cannot send: malformed JSON, wrong types, a body over the limit
    for body, param in (("{not json", None), ("[1, 2]", None), ({"prompt": 5}, "prompt"),
                        ({"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
                        ({"prompt": "x", "temperature": 9}, "temperature"),
                        ({"prompt": "x", "stop": [1]}, "stop")):
        st, b = SRV.request("POST", "/v1/completions", body)
        did("/v1/completions", 400)
        assert st == 400 and b["error"]["type"] == "invalid_request_error" and b["error"]["param"] == param, b
    st, b = SRV.request("POST", "/v1/chat/completions", {"model": "chat", "messages": [{"role": 3}]})
    did("/v1/chat/completions", 400)
    assert st == 400 and b["error"]["param"] == "messages", b
    st, b = SRV.request("POST", "/v1/completions", "x" * (9 << 20), chunked=True)  # no length: read, then 413
    did("/v1/completions", 413)
    assert st == 413 and b["error"]["code"] == "request_too_large", b
    st, b = SRV.request("GET", "/v1/completions")
    did("/v1/completions", 405)
    assert st == 405, b
    st, b = SRV.request("GET", "/nowhere")
    did("other", 404)
    assert st == 404 and "error" in b
    # and the server goes on serving
    assert complete(prompt="still there", max_tokens=2).usage.completion_tokens == 2


def test_body_announced_too_large_is_refused():
    s = su.raw_post(SRV.port, "/v1/completions", b"x" * 65536, length=100000000, timeout=30)
    data = su.read_until(s, b"\r\n\r\n")
    s.close()
    did("/v1/completions", 413)
    assert data.startswith(b"HTTP/1.1 413"), data[:200]


def test_health_and_metrics_agree_with_the_client():
    st, h = SRV.request("GET", "/health")
    did("/health", 200)
    assert st == 200 and h["status"] == "ok"
    m = SRV.metrics()
    for (ep, status), n in DONE.items():
        got = m.get(f'lmstore_requests_total{{endpoint="{ep}",status="{status}"}}', 0)
        assert got == n, (ep, status, got, n)
    assert m["lmstore_generation_tokens_total"] >= GEN_TOKENS[0] > 0
    assert m["lmstore_time_to_first_token_seconds_count"] == m["lmstore_generations_total"]
    assert m['lmstore_slots{model="chat"}'] == 2
    assert m['lmstore_requests_running{model="chat"}'] == 0
    # idle: no request holds pages (their prompts' pages stay cached for reuse)
    assert 0 == m['lmstore_kv_pages_used{model="chat"}'] < m['lmstore_kv_pages_total{model="chat"}']
    assert m['lmstore_prefix_cache_hits_total{model="chat",source="ram"}'] >= 1


def test_api_key_is_required_when_set():
    srv = su.Server(STORE, "tiny", args=["--api-key", "sekrit", "--threads", "1", "--ctx", "256"])
    try:
        e = error_of(lambda: srv.client(api_key="wrong").models.list(), openai.AuthenticationError, 401)
        assert e["code"] == "invalid_api_key"
        st, b = srv.request("POST", "/v1/completions", {"prompt": "x"})
        assert st == 401 and b["error"]["type"] == "authentication_error", b
        assert srv.request("GET", "/health")[0] == 200  # open, for probes
        r = srv.client(api_key="sekrit").completions.create(model="tiny", prompt="x", max_tokens=2)
        assert r.usage.completion_tokens == 2
    finally:
        assert srv.stop() == 0


def test_sigterm_exits_0():
    assert SRV.stop() == 0, SRV.stderr()


if __name__ == "__main__":
    try:
        su.run_tests(globals())
    finally:
        SRV.kill()
