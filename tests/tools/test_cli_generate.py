#!/usr/bin/env python3
"""
tests/tools/test_cli_generate.py - end-to-end tests of `lmstore run`,
`chat`, `perplexity` and `logits` as real processes on a tiny model (the
engine's random-weight Llama fixture plus a tokenizer trained here, see
tinymodel.py). References: transformers' logits, greedy ids and perplexity
for that model (tests/fixtures/engine/llama/reference.json) and HF
`tokenizers` for every tokenization.
"""

import json
import os
import sys
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import tinymodel as tm  # noqa: E402

# f32 activations for BF16 weights (the exact products): these checks hold the
# CLI's logits and perplexity to transformers' within 1e-3; the bf16-activation
# kernels are checked against the same references in tests/engine/test_forward.c
os.environ["LMSTORE_BF16_ACT"] = "0"

REF = tm.reference()
PROMPT = ",".join(map(str, REF["prompt_ids"]))
STORE, TOK = tm.setup_store("generate")
V = len(REF["last_logits"])


def run_json(*args, stdin=None):
    p = tm.lms(*args, "--json", stdin=stdin, store=STORE)
    return json.loads(p.stdout)


def chatml(system, turns):
    out = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    for role, text in turns:
        out += f"<|im_start|>{role}\n{text}<|im_end|>\n"
    return out


def test_run_greedy_ids_match_transformers():
    r = run_json("run", "tiny", "--prompt-ids", PROMPT, "--temp", "0", "--ignore-eos",
                 "--max-tokens", str(len(REF["greedy_ids"])))
    assert r["prompt_ids"] == REF["prompt_ids"]
    assert r["ids"] == REF["greedy_ids"], (r["ids"], REF["greedy_ids"])
    m = r["metrics"]
    assert m["prompt_tokens"] == len(REF["prompt_ids"]) and m["gen_tokens"] == len(REF["greedy_ids"])
    assert m["stop"] == "max_tokens"
    # text is what the tokenizer decodes from the ids (HF decode as reference)
    assert r["text"] == TOK.decode(r["ids"]), (r["text"], TOK.decode(r["ids"]))


def test_run_text_prompt_is_tokenized_like_hf():
    text = "hello there, 12 foxes jump\tover   the dog!"
    r = run_json("run", "tiny", "-p", text, "--temp", "0", "--max-tokens", "3", "--ignore-eos")
    assert r["prompt_ids"] == TOK.encode(text).ids, (r["prompt_ids"], TOK.encode(text).ids)
    assert len(r["ids"]) == 3
    path = os.path.join(tm.TMP, "generate", "prompt.txt")
    with open(path, "w") as f:
        f.write(text + "\n")
    r = run_json("run", "tiny", "--prompt-file", path, "--temp", "0", "--max-tokens", "1")
    assert r["prompt_ids"] == TOK.encode(text + "\n").ids


def test_run_streams_text_and_prints_metrics_line():
    p = tm.lms("run", "tiny", "--prompt-ids", PROMPT, "--temp", "0", "--ignore-eos", "--max-tokens", "24",
               store=STORE)
    assert p.stdout.rstrip("\n") == TOK.decode(REF["greedy_ids"]).rstrip("\n")
    line = p.stderr.strip().splitlines()[-1]
    for word in ("load", "prompt 10 tok (0 reused)", "generated 24 tok", "tok/s", "peak RSS", "stop: max_tokens"):
        assert word in line, line


def test_run_sampling_is_seeded_and_respects_top_k():
    a = run_json("run", "tiny", "--prompt-ids", PROMPT, "--temp", "1.5", "--seed", "7", "--max-tokens", "16",
                 "--ignore-eos")
    b = run_json("run", "tiny", "--prompt-ids", PROMPT, "--temp", "1.5", "--seed", "7", "--max-tokens", "16",
                 "--ignore-eos")
    c = run_json("run", "tiny", "--prompt-ids", PROMPT, "--temp", "1.5", "--seed", "8", "--max-tokens", "16",
                 "--ignore-eos")
    assert a["ids"] == b["ids"]
    assert a["ids"] != c["ids"]
    # top-k 1 at any temperature is greedy
    k1 = run_json("run", "tiny", "--prompt-ids", PROMPT, "--temp", "5", "--top-k", "1", "--max-tokens", "24",
                  "--ignore-eos")
    assert k1["ids"] == REF["greedy_ids"]


def test_repeat_penalty_window_covers_prompt_and_reply():
    # a huge penalty makes every id of the last --repeat-window ids (prompt
    # included) lose to the unseen ones; with window 4 ids may come back later
    r = run_json("run", "tiny", "--prompt-ids", PROMPT, "--temp", "0", "--repeat-penalty", "1000000",
                 "--max-tokens", "40", "--ignore-eos")
    seq = list(REF["prompt_ids"])
    for t in r["ids"]:
        assert t not in seq[-64:], (t, r["ids"])
        seq.append(t)
    assert r["ids"] != REF["greedy_ids"][:40]
    r = run_json("run", "tiny", "--prompt-ids", PROMPT, "--temp", "0", "--repeat-penalty", "1000000",
                 "--repeat-window", "4", "--max-tokens", "40", "--ignore-eos")
    seq = list(REF["prompt_ids"])
    for t in r["ids"]:
        assert t not in seq[-4:], (t, r["ids"])
        seq.append(t)
    assert len(set(r["ids"])) < len(r["ids"])  # short window: repeats beyond it happen


def test_run_stop_string_ends_output_before_it():
    full = run_json("run", "tiny", "--prompt-ids", PROMPT, "--temp", "0", "--ignore-eos", "--max-tokens", "24")
    text = full["text"]
    stop = "upon"
    assert stop in text
    r = run_json("run", "tiny", "--prompt-ids", PROMPT, "--temp", "0", "--ignore-eos", "--max-tokens", "24",
                 "--stop", stop)
    assert r["metrics"]["stop"] == "stop_string"
    assert r["text"] == text[:text.index(stop)], (r["text"], text)


def test_run_chat_prompt_is_the_chatml_rendering():
    r = run_json("run", "tiny", "--chat", "--system", "be brief", "-p", "hello there", "--temp", "0",
                 "--max-tokens", "4")
    want = chatml("be brief", [("user", "hello there")]) + "<|im_start|>assistant\n"
    assert r["prompt_ids"] == TOK.encode(want).ids


def test_session_resume_continues_like_an_uninterrupted_run():
    first = run_json("run", "tiny", "--prompt-ids", PROMPT, "--temp", "0", "--ignore-eos", "--max-tokens", "10",
                     "--save-session", "half")
    assert first["ids"] == REF["greedy_ids"][:10]
    rest = run_json("run", "tiny", "--resume", "half", "--temp", "0", "--ignore-eos", "--max-tokens", "14")
    assert rest["ids"] == REF["greedy_ids"][10:24], (rest["ids"], REF["greedy_ids"][10:24])
    # the saved prompt + reply came from the store, not from a new prefill
    n_saved = len(REF["prompt_ids"]) + 10
    assert rest["metrics"]["reused_tokens"] >= n_saved - 1, rest["metrics"]
    # resuming a session that does not exist fails, naming it
    p = tm.lms("run", "tiny", "--resume", "nosuch", "-p", "x", check=False, store=STORE)
    assert p.returncode == 1 and "nosuch" in p.stderr, p.stderr


def test_chat_piped_second_turn_prefills_only_the_new_turn():
    out = tm.lms("chat", "tiny", "--json", "--temp", "0", "--max-tokens", "6",
                 stdin="hello there\nhow are you today?\n/save talk\n", store=STORE).stdout
    turns = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert len(turns) == 2
    t1, t2 = turns
    assert t1["prompt_ids"] == TOK.encode(chatml(None, [("user", "hello there")]) + "<|im_start|>assistant\n").ids
    assert t1["metrics"]["reused_tokens"] == 0
    # turn 2: only the closing of reply 1, the new user turn and the header are new
    want2 = TOK.encode("<|im_end|>\n" + "<|im_start|>user\nhow are you today?<|im_end|>\n"
                       "<|im_start|>assistant\n").ids
    assert t2["prompt_ids"] == want2, (t2["prompt_ids"], want2)
    m2 = t2["metrics"]
    before = len(t1["prompt_ids"]) + len(t1["ids"])
    assert m2["reused_tokens"] == before, (m2, before)
    assert m2["prompt_tokens"] - m2["reused_tokens"] == len(want2), m2
    # /load in a new process continues the saved conversation with no recomputation
    out = tm.lms("chat", "tiny", "--json", "--temp", "0", "--max-tokens", "4",
                 stdin="/load talk\nand then?\n", store=STORE).stdout
    t3 = json.loads(out.strip().splitlines()[-1])
    saved = before + len(want2) + len(t2["ids"])
    assert t3["metrics"]["reused_tokens"] == saved, (t3["metrics"], saved)


def test_chat_turns_append_in_llama3_and_gemma_formats():
    # --chat-format overrides the model's template; turn 2 must be exactly the
    # format's closing of the reply plus the new turn (tokenized by HF)
    cases = {
        "llama3": ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n",
                   "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nmore<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n"),
        "gemma": ("<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
                  "<end_of_turn>\n<start_of_turn>user\nmore<end_of_turn>\n<start_of_turn>model\n"),
    }
    for fmt, (first, second) in cases.items():
        out = tm.lms("chat", "tiny", "--chat-format", fmt, "--json", "--temp", "0", "--max-tokens", "3",
                     stdin="hi\nmore\n", store=STORE).stdout
        t1, t2 = [json.loads(line) for line in out.splitlines() if line.strip()]
        assert t1["prompt_ids"] == TOK.encode(first).ids, (fmt, t1["prompt_ids"])
        assert t2["prompt_ids"] == TOK.encode(second).ids, (fmt, t2["prompt_ids"])
        m = t2["metrics"]
        assert m["reused_tokens"] == len(t1["prompt_ids"]) + len(t1["ids"]), (fmt, m)
    p = tm.lms("chat", "tiny", "--chat-format", "nosuch", stdin="hi\n", check=False, store=STORE)
    assert p.returncode == 2 and "nosuch" in p.stderr, p.stderr


def test_chat_default_system_message_comes_from_the_template():
    import gzip
    import shutil
    smol = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
            "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
            "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
            "{% endif %}")
    qwen3_cfg = os.path.join(tm.SRC, "tests", "fixtures", "tokenizers", "qwen3.tokenizer_config.json.gz")
    templates = {"smol": (smol, "You are a helpful AI assistant named SmolLM, trained by Hugging Face")}
    with gzip.open(qwen3_cfg) as f:  # Qwen3 opens a system turn only for tools: no default
        templates["qwen3"] = (json.load(f)["chat_template"], None)
    src = os.path.join(tm.TMP, "generate", "tiny-hf")
    for name, (template, default) in templates.items():
        d = os.path.join(tm.TMP, "generate", f"tiny-{name}")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        with open(os.path.join(d, "tokenizer_config.json")) as f:
            cfg = json.load(f)
        cfg["chat_template"] = template
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f)
        tm.lms("import", d, "--name", f"tiny-{name}", store=STORE)
        r = run_json("run", f"tiny-{name}", "--chat", "-p", "hi", "--max-tokens", "1")
        assert r["prompt_ids"] == TOK.encode(chatml(default, [("user", "hi")]) + "<|im_start|>assistant\n").ids, name
        # an explicit --system replaces it; --system "" drops it
        r = run_json("run", f"tiny-{name}", "--chat", "--system", "S", "-p", "hi", "--max-tokens", "1")
        assert r["prompt_ids"] == TOK.encode(chatml("S", [("user", "hi")]) + "<|im_start|>assistant\n").ids, name
        r = run_json("run", f"tiny-{name}", "--chat", "--system", "", "-p", "hi", "--max-tokens", "1")
        assert r["prompt_ids"] == TOK.encode(chatml(None, [("user", "hi")]) + "<|im_start|>assistant\n").ids, name


def test_chat_reset_starts_a_new_conversation():
    out = tm.lms("chat", "tiny", "--json", "--temp", "0", "--max-tokens", "3",
                 stdin="hello there\n/reset\nhello there\n", store=STORE).stdout
    a, b = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert a["prompt_ids"] == b["prompt_ids"] and a["ids"] == b["ids"]


def test_logits_last_position_matches_transformers():
    out = os.path.join(tm.TMP, "generate", "last.f32")
    r = run_json("logits", "tiny", "--prompt-ids", PROMPT, "--out", out)
    assert r["rows"] == 1 and r["n_vocab"] == V
    assert os.path.getsize(out) == V * 4
    got = np.fromfile(out, dtype="<f4")
    d = tm.rel_diff(got, REF["last_logits"])
    assert d <= 1e-3, d


def test_logits_all_positions_size_and_last_row():
    out = os.path.join(tm.TMP, "generate", "all.f32")
    n = len(REF["prompt_ids"])
    run_json("logits", "tiny", "--prompt-ids", PROMPT, "--all", "--out", out)
    assert os.path.getsize(out) == n * V * 4
    rows = np.fromfile(out, dtype="<f4").reshape(n, V)
    assert tm.rel_diff(rows[-1], REF["last_logits"]) <= 1e-3
    # greedy continuation of every prefix: row i's argmax is what run picks after i+1 tokens
    assert int(np.argmax(rows[-1])) == REF["greedy_ids"][0]


def test_perplexity_matches_transformers():
    ids = ",".join(map(str, REF["ppl_ids"]))
    r = run_json("perplexity", "tiny", "--prompt-ids", ids)
    assert r["n_tokens"] == len(REF["ppl_ids"])
    assert abs(r["ppl"] - REF["ppl"]) / REF["ppl"] <= 1e-3, (r["ppl"], REF["ppl"])


def test_perplexity_of_a_file_agrees_with_its_logits():
    text = "the quick brown fox jumps over the lazy dog. hello there, how are you today? " * 3
    path = os.path.join(tm.TMP, "generate", "text.txt")
    with open(path, "w") as f:
        f.write(text)
    ids = TOK.encode(text).ids
    r = run_json("perplexity", "tiny", "--file", path, "--ctx", "40")
    assert r["n_tokens"] == 40 <= len(ids)
    out = os.path.join(tm.TMP, "generate", "ppl.f32")
    run_json("logits", "tiny", "--prompt-ids", ",".join(map(str, ids[:40])), "--all", "--out", out)
    x = np.fromfile(out, dtype="<f4").reshape(40, V).astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    logp = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    nll = -np.mean([logp[i - 1, ids[i]] for i in range(1, 40)])
    assert abs(r["ppl"] - np.exp(nll)) / np.exp(nll) <= 1e-6, (r["ppl"], np.exp(nll))


def test_model_without_tokenizer_runs_on_ids_and_refuses_text():
    tm.lms("import", tm.FIXTURE, "--name", "notok", store=STORE)
    r = run_json("run", "notok", "--prompt-ids", PROMPT, "--temp", "0", "--ignore-eos", "--max-tokens", "24")
    assert r["ids"] == REF["greedy_ids"] and r["text"] == ""
    for args in (["run", "notok", "-p", "hello"], ["chat", "notok"], ["logits", "notok", "-p", "x", "--out", "/dev/null"]):
        p = tm.lms(*args, stdin="hi\n", check=False, store=STORE)
        assert p.returncode == 1 and "tokenizer" in p.stderr, (args, p.returncode, p.stderr)


def test_bad_arguments_are_usage_errors():
    for args in (["run", "tiny"],  # no prompt
                 ["run", "tiny", "-p", "x", "--top-p", "1.5"],
                 ["run", "tiny", "-p", "x", "--temp", "abc"],
                 ["run", "tiny", "--prompt-ids", "1,x,3"],
                 ["logits", "tiny", "-p", "x"],  # no --out
                 ["perplexity", "tiny"],
                 ["run", "tiny", "-p", "x", "--bogus"]):
        p = tm.lms(*args, check=False, store=STORE)
        assert p.returncode == 2, (args, p.returncode, p.stderr)


def test_unknown_model_and_out_of_vocabulary_ids_fail_clearly():
    p = tm.lms("run", "nosuchmodel", "-p", "x", check=False, store=STORE)
    assert p.returncode == 1 and "nosuchmodel" in p.stderr, p.stderr
    p = tm.lms("run", "tiny", "--prompt-ids", f"1,{V + 5}", check=False, store=STORE)
    assert p.returncode == 1 and str(V + 5) in p.stderr, p.stderr


def main():
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    failed = 0
    for name, fn in tests:
        try:
            fn()
            print(f"ok   {name}")
        except Exception:
            failed += 1
            print(f"FAIL {name}")
            traceback.print_exc()
    print(f"{len(tests) - failed}/{len(tests)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
