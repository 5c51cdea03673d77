"""
tests/tools/tinymodel.py - builds the tiny model the CLI tests run: the
engine's random-weight Llama fixture (tests/fixtures/engine/llama, with
transformers' reference logits, greedy ids and perplexity) plus a byte-level
BPE tokenizer of the same vocabulary size trained here with HF `tokenizers`
(ChatML special tokens at ids 0-2, so the fixture's eos_token_id 2 is
<|im_end|>), and a ChatML chat template. Helpers to run the lmstore CLI.
"""

import json
import os
import shutil
import subprocess

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

SRC = os.environ.get("LMS_SRC_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("LMS_BIN", "lmstore")
TMP = os.environ.get("LMS_TMP", "/tmp/lms-tools-test")
FIXTURE = os.path.join(SRC, "tests", "fixtures", "engine", "llama")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
GPT2 = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
        r"|\s+(?!\S)|\s+")

CORPUS = [
    "the quick brown fox jumps over the lazy dog. " * 3,
    "hello there, how are you today? i am fine, thank you. ",
    "a model store keeps weights in memory-mapped segments; sessions keep the cache. ",
    "once upon a time there was a little robot who liked to read and write. ",
    "print('hello world') for i in range(10): total += i ",
]


def reference():
    with open(os.path.join(FIXTURE, "reference.json")) as f:
        return json.load(f)


def sanitized_build():
    """True when the build under test has sanitizers (LMS_SANITIZE set): ~20x slower."""
    cache = os.path.join(os.environ.get("LMS_BUILD_DIR", ""), "CMakeCache.txt")
    try:
        with open(cache) as f:
            return any(line.startswith("LMS_SANITIZE:") and line.split("=", 1)[1].strip()
                       for line in f)
    except OSError:
        return False


def build_tokenizer(vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.Split(Regex(GPT2), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    assert tok.get_vocab_size() <= vocab_size, tok.get_vocab_size()
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i
    return tok


def make_model_dir(dst):
    """Copy the fixture model and add tokenizer files; returns the HF Tokenizer."""
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.makedirs(dst)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(os.path.join(FIXTURE, name), dst)
    with open(os.path.join(FIXTURE, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    tok = build_tokenizer(vocab)
    tok.save(os.path.join(dst, "tokenizer.json"))
    with open(os.path.join(dst, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "add_bos_token": False, "chat_template": CHATML,
                   "added_tokens_decoder": {str(i): {"content": s, "special": True, "normalized": False,
                                                     "lstrip": False, "rstrip": False, "single_word": False}
                                            for i, s in enumerate(SPECIALS)}}, f)
    return tok


def lms(*args, stdin=None, check=True, store=None):
    """Run the CLI; returns CompletedProcess (text mode)."""
    cmd = [BIN, *args]
    if store:
        cmd += ["--store", store]
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}")
    return p


def setup_store(tag):
    """Fresh store with the tiny model imported as 'tiny'. Returns (store, tokenizer)."""
    base = os.path.join(TMP, tag)
    if os.path.exists(base):
        shutil.rmtree(base)
    os.makedirs(base)
    mdir = os.path.join(base, "tiny-hf")
    tok = make_model_dir(mdir)
    store = os.path.join(base, "store")
    lms("import", mdir, "--name", "tiny", store=store)
    return store, tok


def rel_diff(a, b):
    import numpy as np
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))
