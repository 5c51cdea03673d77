#!/usr/bin/env python3
"""tests/tokenizer/test_hf_random.py - `lmstore tokenize` / `detokenize`
against HuggingFace `tokenizers` (PyPI) directly, on a seeded random corpus of
10,000 strings per tokenizer: random Unicode (all planes, weighted towards the
scripts and symbols tokenizers treat specially), whitespace and digit runs,
slices and splices of the fixture corpus, and special-token text.

For the real Qwen3, Llama 3 and Gemma 3 tokenizers ($LMS_SRC_DIR/tests/
fixtures/tokenizers) every string is encoded three ways (CLI default, --special,
--no-add-special) and the ids must equal HF's; HF's ids and random id
sequences (invalid UTF-8 included) must decode to HF's text, in one call and
through the streaming detokenizer.

Then small synthetic tokenizers, trained here with HF's BpeTrainer and
assembled from the components real models rarely combine (Metaspace in every
prepend scheme, every Split behavior and invert, Replace/Prepend/NFKC
normalizers, TemplateProcessing with a suffix, ByteLevel with its own regex,
Strip/Replace/ByteFallback/Fuse/Metaspace decoders, unk with fuse_unk, added
tokens with lstrip/rstrip/single_word/normalized, Strip/Lowercase normalizers,
WhitespaceSplit/Punctuation/Digits pre-tokenizers, ByteLevel followed by
other pre-tokenizers, no decoder), each on
1,000 strings.

Each batch of strings costs one lmstore process (--jsonl). The corpus size
is LMS_TOK_RANDOM_N (default 10000). In a sanitizer build (LMS_SANITIZE set in
the build's CMakeCache.txt) loading Gemma's 33 MB tokenizer.json alone takes
seconds per process, so there the test runs 2,000 strings, one encode mode
(the CLI default) and the streamed decode only: the full comparison runs in
the normal build, the sanitizer run is there to catch memory errors.
"""
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile

try:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers, AddedToken, Regex
except ImportError:
    print("HF tokenizers is not installed (pip install tokenizers)", file=sys.stderr)
    sys.exit(1)

SRC = os.environ.get("LMS_SRC_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("LMS_BIN", "lmstore")
TMP = os.environ.get("LMS_TMP") or tempfile.mkdtemp()
os.makedirs(TMP, exist_ok=True)


def sanitized():
    try:
        with open(os.path.join(os.environ.get("LMS_BUILD_DIR", ""), "CMakeCache.txt")) as f:
            return any(l.startswith("LMS_SANITIZE:") and l.strip().split("=", 1)[1] for l in f)
    except OSError:
        return False


LIGHT = sanitized()
N = int(os.environ.get("LMS_TOK_RANDOM_N", "2000" if LIGHT else "10000"))

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg, file=sys.stderr)


# ---- corpus ------------------------------------------------------------------------

BLOCKS = [  # (lo, hi, weight)
    (0x20, 0x7E, 30), (0x00, 0x1F, 3), (0x7F, 0xFF, 6), (0x100, 0x24F, 4), (0x300, 0x36F, 4),
    (0x370, 0x3FF, 2), (0x400, 0x4FF, 3), (0x590, 0x5FF, 3), (0x600, 0x6FF, 4), (0x900, 0x97F, 4),
    (0xE00, 0xE7F, 4), (0x1100, 0x11FF, 2), (0x1E00, 0x1EFF, 2), (0x2000, 0x206F, 4), (0x20A0, 0x214F, 2),
    (0x2190, 0x2BFF, 2), (0x3000, 0x30FF, 4), (0x4E00, 0x9FFF, 6), (0xAC00, 0xD7A3, 3), (0xE000, 0xE0FF, 1),
    (0xFE00, 0xFE0F, 2), (0xFF00, 0xFFEF, 2), (0xFFF0, 0xFFFF, 1), (0x1F000, 0x1FAFF, 6), (0x1F1E6, 0x1F1FF, 2),
    (0xE0020, 0xE007F, 1), (0x10000, 0x1007F, 1), (0x10300, 0x1034F, 1), (0x10400, 0x1044F, 1),
    (0x1D400, 0x1D7FF, 1), (0x20000, 0x2A6DF, 1), (0x2F800, 0x2FA1F, 1), (0x40000, 0xDFFFF, 1),
    (0xE0100, 0xE01EF, 1), (0xF0000, 0xF00FF, 1),
]
# Code points come from blocks complete before Unicode 14 or from planes that
# are still unassigned: PCRE2 10.42 classifies by Unicode 14 and HF's
# Oniguruma by Unicode 15, so a letter or digit added in 15 (e.g. Kawi
# U+11F50..) is \p{L}/\p{N} for one and unassigned for the other.
WS = [" ", " ", " ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "\u00a0", "\u3000", "\u2028", "\u0085", "\u2003", "\u180e"]
DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "๐๑๒๓๔๕๖๗๘๙", "²³¹¼½"]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<bos>", "<eos>",
           "<start_of_turn>", "<end_of_turn>", "<think>", "</think>", "<unused12>", "<pad>", "<|im_start",
           "<|reserved_special_token_3|>", "<tool_call>", "<image_soft_token>", "<mask>"]


def rand_cp(r):
    lo, hi, _ = r.choices(BLOCKS, weights=[b[2] for b in BLOCKS])[0]
    while True:
        c = r.randint(lo, hi)
        if not 0xD800 <= c <= 0xDFFF:
            return chr(c)


def random_corpus(n, fixture, seed):
    r = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 6
        if kind == 0:
            s = "".join(rand_cp(r) for _ in range(r.randint(1, 60)))
        elif kind == 1:
            parts = []
            for _ in range(r.randint(1, 8)):
                parts.append("".join(r.choice(WS) for _ in range(r.randint(1, 12))))
                parts.append(r.choice(["word", "x", "Hello", "日本", "٣", "'s", "", "é", "\u0301"]))
            s = "".join(parts)
        elif kind == 2:
            parts = []
            for _ in range(r.randint(1, 6)):
                ds = r.choice(DIGITS)
                parts.append("".join(r.choice(ds) for _ in range(r.randint(1, 40))))
                parts.append(r.choice([" ", ".", ",", "-", "a", "", "e", "$", "%", "\n"]))
            s = "".join(parts)
        elif kind == 3:
            t = r.choice(fixture)
            a = r.randint(0, len(t))
            b = r.randint(a, min(len(t), a + 200))
            s = t[a:b]
        elif kind == 4:
            s = "".join(r.choice(fixture)[:r.randint(0, 80)] for _ in range(r.randint(2, 4)))
        else:
            parts = []
            for _ in range(r.randint(1, 6)):
                parts.append(r.choice(SPECIAL) if r.random() < 0.5 else r.choice([" ", "\n", "hi", " x ", "é", "  "]))
            s = "".join(parts)
        out.append(s)
    return out


# ---- running lmstore ------------------------------------------------------------------

def run_lines(args, lines, what):
    p = subprocess.run([BIN] + args, input="".join(l + "\n" for l in lines).encode(), capture_output=True)
    if p.returncode != 0:
        failures.append(f"{what}: lmstore {' '.join(args[:3])} exited {p.returncode}: {p.stderr.decode(errors='replace')[:500]}")
        print("FAIL:", failures[-1], file=sys.stderr)
        return None
    out = p.stdout.decode("utf-8").split("\n")[:-1]
    check(len(out) == len(lines), f"{what}: {len(out)} output lines for {len(lines)} inputs")
    return [json.loads(l) for l in out]


def compare_encode(name, tok_path, hf, texts, modes):
    lines = [json.dumps(s) for s in texts]
    for label, args, add, parse in modes:
        hf.encode_special_tokens = not parse
        ref = [e.ids for e in hf.encode_batch(texts, add_special_tokens=add)]
        got = run_lines(["tokenize", "--tokenizer", tok_path, "--jsonl"] + args, lines, f"{name} encode {label}")
        if got is None:
            continue
        bad = [i for i in range(len(texts)) if got[i] != ref[i]]
        check(not bad, f"{name} encode {label}: {len(bad)} of {len(texts)} differ from HF, e.g. "
              + "; ".join(f"{texts[i]!r}: ours {got[i][:12]} HF {ref[i][:12]}" for i in bad[:3]))
    hf.encode_special_tokens = False


def compare_decode(name, tok_path, hf, id_lists):
    lines = [json.dumps(ids) for ids in id_lists]
    for skip in ((False,) if LIGHT else (False, True)):
        ref = hf.decode_batch(id_lists, skip_special_tokens=skip)
        for stream in ((True,) if LIGHT else (False, True)):
            args = ["detokenize", "--tokenizer", tok_path, "--jsonl"] + (["--skip-special"] if skip else []) \
                + (["--stream"] if stream else [])
            got = run_lines(args, lines, f"{name} decode")
            if got is None:
                continue
            bad = [i for i in range(len(id_lists)) if got[i] != ref[i]]
            # streaming promises equality only where HF's text is complete UTF-8 (no U+FFFD)
            if stream:
                bad = [i for i in bad if "\ufffd" not in ref[i]]
            check(not bad, f"{name} decode skip={skip} stream={stream}: {len(bad)} differ, e.g. "
                  + "; ".join(f"{id_lists[i][:10]}: ours {got[i][:40]!r} HF {ref[i][:40]!r}" for i in bad[:3]))


MODES = [("default", [], True, False), ("--special", ["--special"], True, True),
         ("--no-add-special", ["--no-add-special"], False, False)]
if LIGHT:
    MODES = MODES[:1]


def real_tokenizers(texts):
    toks = os.path.join(SRC, "tests", "fixtures", "tokenizers")
    r = random.Random(7)
    for name in ["qwen3", "llama3", "gemma3"]:
        path = os.path.join(TMP, name + ".tokenizer.json")
        with gzip.open(os.path.join(toks, name + ".tokenizer.json.gz"), "rb") as f, open(path, "wb") as g:
            g.write(f.read())
        hf = Tokenizer.from_file(path)
        compare_encode(name, path, hf, texts, MODES)
        hf.encode_special_tokens = False
        ids = [e.ids for e in hf.encode_batch(texts[: len(texts) // 4], add_special_tokens=True)]
        vs = hf.get_vocab_size(with_added_tokens=True)
        specials = sorted({hf.token_to_id(t) for t in SPECIAL if hf.token_to_id(t) is not None})
        for _ in range(len(texts) // 10):  # random id sequences: split characters, specials, anything
            ids.append([r.choice(specials) if specials and r.random() < 0.1 else r.randrange(vs)
                        for _ in range(r.randint(0, 12))])
        compare_decode(name, path, hf, ids)
        print(f"{name}: {len(texts)} strings x 3 modes, {len(ids)} decodes", file=sys.stderr)


# ---- synthetic tokenizers --------------------------------------------------------------------

def synthetic(train_texts):
    def trained(model, tok_setup, vocab=600, specials=("<s>", "</s>", "<unk>")):
        tok = Tokenizer(model)
        bl = tok_setup(tok)
        tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(specials), show_progress=False,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if bl else [])
        tok.train_from_iterator(train_texts, tr)
        return tok

    cfgs = {}

    def metaspace(scheme, split):
        def s(t):
            t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace("``", '"')])
            t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=split)
            t.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme, split=split)
        return s

    for scheme in ("always", "first", "never"):
        for split in (True, False):
            cfgs[f"metaspace-{scheme}-{split}"] = (models.BPE(unk_token="<unk>", fuse_unk=(split)), metaspace(scheme, split))

    for beh in ("removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"):
        for inv in ((False, True) if beh in ("removed", "merged_with_next") else (False,)):
            def s(t, beh=beh, inv=inv):
                t.normalizer = normalizers.NFD()
                t.pre_tokenizer = pre_tokenizers.Sequence([
                    pre_tokenizers.Split(Regex(r"\s+|\p{P}"), behavior=beh, invert=inv),
                    pre_tokenizers.Split(" ", behavior="isolated")])
                t.decoder = decoders.Sequence([decoders.Strip(" ", 1, 0), decoders.Fuse()])
            cfgs[f"split-{beh}-{inv}"] = (models.BPE(unk_token="<unk>"), s)

    def bytelevel(t):
        t.normalizer = normalizers.Sequence([normalizers.Prepend("_"), normalizers.NFC()])
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
        t.decoder = decoders.ByteLevel()
        t.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1",
                                                         special_tokens=[("<s>", 0), ("</s>", 1)])
        return True
    cfgs["bytelevel-template"] = (models.BPE(), bytelevel)

    def chars_split(t):  # WordPiece-style splitting on a BPE model, no decoder (tokens joined by spaces)
        t.normalizer = normalizers.Sequence([normalizers.Strip(left=True, right=True), normalizers.NFC(),
                                             normalizers.Lowercase()])
        t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                   pre_tokenizers.Punctuation(behavior="contiguous"),
                                                   pre_tokenizers.Digits(individual_digits=True)])
    cfgs["whitespace-punct-digits"] = (models.BPE(unk_token="<unk>", fuse_unk=True), chars_split)

    def digits_bytelevel(t):  # StarCoder-style: digit runs, then byte-level
        t.normalizer = normalizers.Strip(left=False, right=True)
        t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Punctuation(),
                                                   pre_tokenizers.Digits(individual_digits=False),
                                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        t.decoder = decoders.ByteLevel()
        return True
    cfgs["punct-digits-bytelevel"] = (models.BPE(), digits_bytelevel)

    def bytelevel_middle(t):  # Falcon-style: steps after ByteLevel see the byte alphabet
        t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Punctuation(behavior="contiguous"),
                                                   pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
                                                   pre_tokenizers.Digits(individual_digits=False),
                                                   pre_tokenizers.Split(Regex("[0-9][0-9][0-9]|Ġ"), behavior="isolated")])
        t.decoder = decoders.ByteLevel()
        return True
    cfgs["bytelevel-in-the-middle"] = (models.BPE(ignore_merges=True), bytelevel_middle)

    def fallback(t):
        t.normalizer = normalizers.Replace(" ", "▁")
        t.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
        t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                       decoders.Strip(" ", 1, 0)])
    cfgs["bytefallback"] = (models.BPE(unk_token="<unk>", byte_fallback=True), fallback)

    r = random.Random(11)
    texts = random_corpus(300 if LIGHT else 1000, train_texts, 99)
    # HF's NFKC/NFD tables are older than Unicode 14: leave out the strings
    # where HF's normalization disagrees with Python's unicodedata (counted).
    import unicodedata
    nfkc, nfd = normalizers.NFKC(), normalizers.NFD()
    agree = [t for t in texts if nfkc.normalize_str(t) == unicodedata.normalize("NFKC", t)
             and nfd.normalize_str(t) == unicodedata.normalize("NFD", t)]
    print(f"synthetic: {len(texts) - len(agree)} of {len(texts)} strings left out where HF's NFKC/NFD "
          f"tables disagree with unicodedata {unicodedata.unidata_version}", file=sys.stderr)
    texts = agree
    for name, (model, setup) in cfgs.items():
        tok = trained(model, setup)
        if name == "bytefallback":  # byte tokens the trainer does not make: add them to the model vocab
            data = json.loads(tok.to_str())
            v = data["model"]["vocab"]
            for b in range(256):
                v.setdefault(f"<0x{b:02X}>", len(v))
            tok = Tokenizer.from_str(json.dumps(data))
        tok.add_tokens([AddedToken("[lst]", lstrip=True), AddedToken("[rst]", rstrip=True),
                        AddedToken("word", single_word=True), AddedToken("ÉTÉ", normalized=True),
                        AddedToken("<sp>", special=True, normalized=False)])
        tok.add_special_tokens([AddedToken("[SPECIAL]", lstrip=True, rstrip=True)])
        path = os.path.join(TMP, f"syn-{name}.json")
        tok.save(path)
        extra = ["a [lst] b", "a  [rst]  b", "word words sword word_x (word)", "été ÉTÉ Été",
                 "x<sp>y [SPECIAL] z", "  [SPECIAL]", "[lst][lst]  [rst][rst]"]
        sample = texts + extra
        compare_encode(f"syn-{name}", path, tok, sample, MODES)
        ids = [e.ids for e in tok.encode_batch(sample[:300])]
        vs = tok.get_vocab_size(with_added_tokens=True)
        ids += [[r.randrange(vs) for _ in range(r.randint(0, 10))] for _ in range(200)]
        compare_decode(f"syn-{name}", path, tok, ids)
    print(f"synthetic: {len(cfgs)} tokenizers x {len(texts) + 7} strings", file=sys.stderr)


def main():
    with open(os.path.join(SRC, "tests", "fixtures", "tokenizer", "corpus.json")) as f:
        fixture = [bytes.fromhex(h).decode("utf-8") for h in json.load(f)["texts_hex"]]
    import tokenizers
    print(f"HF tokenizers {tokenizers.__version__}; {N} strings per tokenizer{' (sanitizer build)' if LIGHT else ''}",
          file=sys.stderr)
    texts = random_corpus(N, fixture, 20261122)
    real_tokenizers(texts)
    synthetic(fixture)
    if failures:
        print(f"{len(failures)} comparison(s) failed", file=sys.stderr)
        sys.exit(1)
    print("all equal to HF tokenizers")


if __name__ == "__main__":
    main()
