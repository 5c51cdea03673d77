#!/usr/bin/env python3
"""tests/reference/make_tokenizer_fixtures.py - reference token ids, decodes and
chat renderings from HuggingFace `tokenizers` and `transformers`, for the
exact-match tests of lmstore's tokenizer (tests/tokenizer/test_tokenizer_fixtures.c
and test_chat_fixtures.py).

Reference implementations: HF `tokenizers` (encode/decode) and `transformers`
(apply_chat_template). They run on the CPU, so this script may be run on any
machine that has both (the committed fixtures were made with tokenizers 0.23
and transformers 5.2x on a development machine). The real tokenizer files are
read from tests/fixtures/tokenizers/.

Writes tests/fixtures/tokenizer/:
  corpus.json         {"texts_hex": [...]}: >= 200 strings (UTF-8, hex so NULs survive JSON parsers)
  NAME.json           per tokenizer (qwen3, llama3, gemma3):
                      ids_add      add_special_tokens=True,  special tokens not parsed (encode_special_tokens=True)
                      ids_special  add_special_tokens=True,  special tokens parsed (HF default)
                      ids_plain    add_special_tokens=False, special tokens not parsed
                      decode_hex       decode(ids_special, skip_special_tokens=False)
                      decode_skip_hex  decode(ids_special, skip_special_tokens=True)
  chat.json           per tokenizer: conversations, apply_chat_template text and ids

Usage: python3 tests/reference/make_tokenizer_fixtures.py [--tokenizers DIR] [--out DIR]
"""
import argparse
import gzip
import json
import os
import random
import sys
import tempfile

NAMES = ["qwen3", "llama3", "gemma3"]


def corpus():
    c = []
    # whitespace runs and mixes
    for k in range(1, 9):
        c.append(" " * k)
    c += ["\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r", "\r\n", "\r\n\r\n", "a\r\nb", " \t \n \r\n ",
          "   \n   \n", "x" + " " * 50 + "y", "hello   ", "   hello", " \t\tx\t \ty ", "a\n\n\nb",
          "line1\nline2\r\nline3\rline4", "\u00a0nbsp\u00a0", "ideographic\u3000space", "em\u2003space",
          "\x0bvt\x0cff", "tab\tsep\tvalues\n1\t2\t3", "  leading and trailing  ", " \n ", "\n \n\t\n",
          "word \n word", "end with newline\n", "   \t\t\t   \n\n\n   "]
    # digits of every length and number formats
    for k in range(1, 26):
        c.append("".join(str((i * 7 + k) % 10) for i in range(k)))
    c += ["3.14159", "1,000,000", "2024-11-22", "0x1F", "v1.2.3", "+1 (555) 123-4567", "１２３ fullwidth",
          "٠١٢٣٤٥ arabic-indic", "१२३४ devanagari digits", "price: $42.99", "1e-10", "12345678901234567890123"]
    # contractions in any case
    c += ["don't", "DON'T", "Don'T", "it's", "IT'S", "we're", "WE'RE", "I've", "I'M", "you'll", "YOU'LL",
          "he'd", "HE'D", "'s", "''", "rock 'n' roll", "don’t curly", "O'Neil's", "'ll've'd", "they'RE", "can'T"]
    # accents and combining marks
    c += ["café", "cafe\u0301", "naïve", "Ångström", "A\u030angstrom", "Zoë", "ñandú", "e\u0301\u0302\u0323",
          "Tiếng Việt có dấu", "\u1100\u1161\u11a8 jamo", "ﬁne ligature", "\u212b sign", "Ǆemal",
          "Straße", "İstanbul ıi", "z\u0335\u0321a\u0336\u0322l\u0337\u0328g\u0338o zalgo"]
    # scripts
    c += ["日本語のテキストです。", "中文分词测试，包括标点符号！", "한국어 텍스트입니다", "カタカナとひらがな",
          "مرحبا بالعالم", "العربية: الحروف المتصلة ١٢٣", "שלום עולם", "עִבְרִית עם ניקוד",
          "नमस्ते दुनिया", "हिन्दी में लिखा गया वाक्य।", "สวัสดีชาวโลก", "ภาษาไทยไม่มีการเว้นวรรค",
          "Ελληνικά γράμματα", "Русский текст, ёлки-палки", "Українська мова", "ქართული", "Հայերեն",
          "ᠮᠣᠩᠭᠣᠯ mongolian", "བོད་ཡིག", "ᏣᎳᎩ cherokee", "𐌰𐌱𐌲 gothic", "𝕄𝕒𝕥𝕙 𝒻𝓇𝒶𝓀𝓉𝓊𝓇"]
    # emoji, ZWJ sequences, flags, modifiers
    c += ["👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇺🇸🇯🇵🇩🇪", "❤️", "1️⃣ keycap", "🧑🏿‍🚀", "👩‍❤️‍💋‍👨",
          "🏴󠁧󠁢󠁳󠁣󠁴󠁿 scotland", "emoji in text 😀 and 🎉!", "☃︎ vs ☃️"]
    # control characters and NUL
    c += ["\x00", "a\x00b", "\x00\x00\x00", "\x01\x02\x1f", "\x7f", "\x1b[31mred\x1b[0m", "bell\x07",
          "\u0085next line", "\x1c\x1d\x1e\x1f separators", "nul at end\x00"]
    # zero-width and bidi
    c += ["\u200b", "a\u200bb", "zw\u200cnj\u200dj", "\ufeffbom", "\u202ereversed\u202c", "\u2066isolate\u2069",
          "\u200eLRM\u200fRLM", "soft\u00adhyphen", "mongolian\u180evs", "line\u2028sep\u2029para",
          "\u2060word joiner", "abc\u061cdef"]
    # code, JSON, HTML, URLs
    c += ["def f(x):\n    return x * 2\n", "int main(void) { return 0; }", "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}",
          "const x = () => { console.log(`hi ${name}`); };", '{"key": "value", "n": [1, 2, 3], "ok": true}',
          '{\n  "nested": {"a": null}\n}', "<html><body><p class=\"x\">Hello &amp; bye</p></body></html>",
          "<!-- comment --><br/>", "https://example.com/path?q=1&r=two#frag", "http://user:pw@host:8080/",
          "mailto:someone@example.org", "SELECT * FROM t WHERE a = 'b';", "$ ls -la | grep '^d' && echo ok",
          "\\frac{a}{b} + \\sum_{i=0}^{n} x_i", "# Title\n\n- item 1\n- item 2\n\n```py\nprint(1)\n```",
          "if x != y:\n\t\tpass  # comment", "a_b_c snake_case camelCase PascalCase kebab-case",
          "C:\\Windows\\System32", "../../etc/passwd", "0b1010 | 0o777 ^ ~x", "std::vector<int> v{1,2,3};"]
    # special-token text (parsed only with --special)
    c += ["<|im_start|>user\nhi<|im_end|>", "<|begin_of_text|>hello", "<bos>hi<eos>", "<start_of_turn>user",
          "<think>reason</think>", "<unused0>", "<|im_start", "<<|im_end|>>", "<|endoftext|><|endoftext|>",
          "<|eot_id|>", "x<end_of_turn>y", "<pad><mask>", "<tool_call>{}</tool_call>", "<|reserved_special_token_5|>"]
    # long words and runs
    c += ["a" * 3000, "ab" * 1500, " " * 3000, "\n" * 500, "1" * 1000, "🙂" * 300, "日本" * 500,
          "Donaudampfschifffahrtsgesellschaftskapitänswitwe", "x" * 10000, "-" * 2000, "=" * 500,
          "supercalifragilisticexpialidocious" * 20, "\t" * 300, " a" * 1000, ". " * 500, "a b\n" * 300]
    # mixed sentences
    c += ["The quick brown fox jumps over the lazy dog.", "Hello, world! How are you?",
          "Mixed 中文 and English with numbers 123 and emoji 🚀.", "¿Qué tal? ¡Muy bien!",
          "Größenmaßstäbe für Äpfel und Öl", "« guillemets » et “quotes” and ‘single’",
          "It's 5 o'clock; we're late—again…", "Ünïcödé ṫëẍẗ", "tab\tand  double  spaces",
          "A sentence.  Two spaces after period.", "UPPER lower MiXeD", "e-mail: a.b@c.de, tel. 030/123456"]
    rnd = random.Random(20261122)
    pools = ["abcdefghij ", " \t\n\r", "0123456789", "日本語中文한국어", "مرحبا", "שלום", "नमस्ते", "สวัสดี",
             "😀👍🏽\u200d🏳️", "\u0301\u0308\u0323", "'sStT", "<|>_", "\x00\x01\u200b\u202e"]
    while len(c) < 260:
        n = rnd.randint(1, 40)
        c.append("".join(rnd.choice(rnd.choice(pools)) for _ in range(n)))
    return c


def load_hf(tokdir, name):
    from tokenizers import Tokenizer
    with gzip.open(os.path.join(tokdir, name + ".tokenizer.json.gz"), "rt", encoding="utf-8") as f:
        text = f.read()
    return Tokenizer.from_str(text), text


def encode(tok, s, add, parse):
    tok.encode_special_tokens = not parse
    return tok.encode(s, add_special_tokens=add).ids


def hexs(s):
    return s.encode("utf-8").hex()


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "2+2 = 4."},
     {"role": "user", "content": "  And 3+3?\n"}],
    [{"role": "user", "content": "Translate: 日本語 → English"},
     {"role": "assistant", "content": " It means \"Japanese language\". "},
     {"role": "user", "content": "Thanks 👍"}],
    [{"role": "system", "content": "Be brief.\n"},
     {"role": "user", "content": "Write code:\n```py\nprint('hi')\n```"},
     {"role": "assistant", "content": "<think>\nthe user wants code\n</think>\n\nprint('hi')"},
     {"role": "user", "content": "again"}],
    [{"role": "user", "content": "Why is the sky blue?"},
     {"role": "assistant", "content": "<think>\nRayleigh scattering.\n</think>\n\nBecause of Rayleigh scattering."}],
]


TOOL_CONVERSATION = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": "Checking both."},
    {"role": "tool", "content": "{\"paris\": \"18C\"}"},
    {"role": "tool", "content": "{\"rome\": \"24C\"}"},
    {"role": "user", "content": "<tool_response>\nnot a real one\n</tool_response>"},
]


def chat_fixtures(tokdir, name):
    from transformers import AutoTokenizer
    out = []
    with tempfile.TemporaryDirectory() as d:
        for src, dst in [(".tokenizer.json.gz", "tokenizer.json"), (".tokenizer_config.json.gz", "tokenizer_config.json")]:
            with gzip.open(os.path.join(tokdir, name + src), "rb") as f, open(os.path.join(d, dst), "wb") as g:
                g.write(f.read())
        tok = AutoTokenizer.from_pretrained(d)
        for conv in CONVERSATIONS:
            for gen in (True, False):
                # The stored Llama 3 template always appends the assistant header: only gen=True is defined there.
                if name == "llama3" and not gen:
                    continue
                text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
                ids = tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=gen)
                if not isinstance(ids, list):
                    ids = ids["input_ids"]
                out.append({"messages": conv, "add_generation_prompt": gen, "text": text, "ids": ids})
        if name != "gemma3":  # tool results (Gemma's template accepts only alternating user/assistant)
            conv = TOOL_CONVERSATION
            text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
            ids = tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=True)
            if not isinstance(ids, list):
                ids = ids["input_ids"]
            out.append({"messages": conv, "add_generation_prompt": True, "text": text, "ids": ids})
        if name == "qwen3":  # Qwen3's switch: enable_thinking=False pre-fills an empty think block
            conv = CONVERSATIONS[0]
            text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True, enable_thinking=False)
            ids = tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=True, enable_thinking=False)
            if not isinstance(ids, list):
                ids = ids["input_ids"]
            out.append({"messages": conv, "add_generation_prompt": True, "enable_thinking": False, "text": text,
                        "ids": ids})
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizers", default=os.path.join(src, "tests", "fixtures", "tokenizers"))
    ap.add_argument("--out", default=os.path.join(src, "tests", "fixtures", "tokenizer"))
    ap.add_argument("--no-chat", action="store_true", help="skip the transformers chat fixtures")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    texts = corpus()
    with open(os.path.join(a.out, "corpus.json"), "w") as f:
        json.dump({"texts_hex": [hexs(s) for s in texts]}, f, separators=(",", ":"))
    for name in NAMES:
        tok, _ = load_hf(a.tokenizers, name)
        rec = {"ids_add": [], "ids_special": [], "ids_plain": [], "decode_hex": [], "decode_skip_hex": []}
        for s in texts:
            rec["ids_add"].append(encode(tok, s, True, False))
            sp = encode(tok, s, True, True)
            rec["ids_special"].append(sp)
            rec["ids_plain"].append(encode(tok, s, False, False))
            rec["decode_hex"].append(hexs(tok.decode(sp, skip_special_tokens=False)))
            rec["decode_skip_hex"].append(hexs(tok.decode(sp, skip_special_tokens=True)))
        with open(os.path.join(a.out, name + ".json"), "w") as f:
            json.dump(rec, f, separators=(",", ":"))
        print(name, "ok", file=sys.stderr)
    if not a.no_chat:
        chat = {name: chat_fixtures(a.tokenizers, name) for name in NAMES}
        with open(os.path.join(a.out, "chat.json"), "w") as f:
            json.dump(chat, f, ensure_ascii=False, indent=0)


if __name__ == "__main__":
    main()
