#!/usr/bin/env bash
# tests/tokenizer/test_cli_tokenize.sh - `lmstore tokenize` / `detokenize` as a
# user runs them: with --tokenizer FILE and with a MODEL whose tokenizer files
# were imported into a store (both must give HF's ids for the same text), the
# output formats (plain, --json, --jsonl), --special / --no-add-special, the
# streaming detokenizer, and the errors (unknown model, missing tokenizer,
# invalid UTF-8, bad usage) with their exit statuses.
set -euo pipefail
: "${LMS_SRC_DIR:?}" "${LMS_BIN:?}" "${LMS_TMP:?}"
rm -rf "$LMS_TMP" && mkdir -p "$LMS_TMP"
T=$LMS_TMP
toks="$LMS_SRC_DIR/tests/fixtures/tokenizers"
fail() { echo "FAIL: $*" >&2; exit 1; }

gzip -dc "$toks/gemma3.tokenizer.json.gz" > "$T/gemma.json"
gzip -dc "$toks/gemma3.tokenizer_config.json.gz" > "$T/gemma_config.json"

# a tiny model with Qwen3's tokenizer files, imported into a store
python3 "$LMS_SRC_DIR/tests/gen_model.py" "$T/src" --arch qwen3 --hidden 32 --layers 1 \
    --tokenizer "$toks/qwen3" > /dev/null
"$LMS_BIN" import "$T/src" --store "$T/store" --name tiny > /dev/null
gzip -dc "$toks/qwen3.tokenizer.json.gz" > "$T/qwen.json"

text=$'Hello world! It\'s 12345 <|im_start|>user\n日本語 🏳️‍🌈'
# everything HF says, computed in one process: want.NAME files
python3 - "$T" "$text" <<'EOF'
import json, sys
from tokenizers import Tokenizer
d, text = sys.argv[1], sys.argv[2]
def ids(path, add, parse):
    t = Tokenizer.from_file(path)
    t.encode_special_tokens = not parse
    return t.encode(text, add_special_tokens=add).ids
def put(name, s):
    with open(f"{d}/want.{name}", "w") as f:
        f.write(s)
q, g = f"{d}/qwen.json", f"{d}/gemma.json"
put("qwen", " ".join(map(str, ids(q, True, False))))
sp = ids(q, True, True)
put("qwen_sp", " ".join(map(str, sp)))
put("qwen_decode", json.dumps({"text": Tokenizer.from_file(q).decode(sp, skip_special_tokens=False)}, ensure_ascii=False))
put("gemma_json", json.dumps({"ids": ids(g, True, False)}))
put("gemma", " ".join(map(str, ids(g, True, False))))
put("gemma_noadd", " ".join(map(str, ids(g, False, False))))
t = Tokenizer.from_file(q); t.encode_special_tokens = True
put("jsonl", "\n".join(str(t.encode(s).ids) for s in ["a\x00b", "\U0001F600 x", ""]))
EOF
want_of() { cat "$T/want.$1"; }

# MODEL from the store == --tokenizer FILE == HF
want=$(want_of qwen)
got_file=$("$LMS_BIN" tokenize --tokenizer "$T/qwen.json" --text "$text")
got_model=$("$LMS_BIN" tokenize tiny --store "$T/store" --text "$text")
[ "$got_file" = "$want" ] || fail "tokenize --tokenizer: '$got_file' != HF '$want'"
[ "$got_model" = "$want" ] || fail "tokenize MODEL: '$got_model' != HF '$want'"
want_sp=$(want_of qwen_sp)
got=$("$LMS_BIN" tokenize tiny --store "$T/store" --text "$text" --special)
[ "$got" = "$want_sp" ] || fail "--special: '$got' != HF '$want_sp'"
case " $got " in *" 151644 "*) ;; *) fail "--special did not produce <|im_start|> (151644)";; esac
case " $got_model " in *" 151644 "*) fail "without --special the text turned into <|im_start|>";; esac

# Gemma adds <bos> unless --no-add-special; --json and --file
printf '%s' "$text" > "$T/in.txt"
got=$("$LMS_BIN" tokenize --tokenizer "$T/gemma.json" --file "$T/in.txt" --json)
want=$(want_of gemma_json)
[ "$got" = "$want" ] || fail "gemma --json: '$got' != '$want'"
got=$("$LMS_BIN" tokenize --tokenizer "$T/gemma.json" --text "$text" --no-add-special)
[ "$got" = "$(want_of gemma_noadd)" ] || fail "gemma --no-add-special"
got=$(printf '%s' "$text" | "$LMS_BIN" tokenize --tokenizer "$T/gemma.json")
[ "$got" = "$(want_of gemma)" ] || fail "gemma from stdin"

# --jsonl: one array per line, NULs and all
printf '"a\\u0000b"\n"\\ud83d\\ude00 x"\n""\n' > "$T/in.jsonl"
got=$("$LMS_BIN" tokenize --tokenizer "$T/qwen.json" --jsonl --file "$T/in.jsonl")
want=$(want_of jsonl)
[ "$got" = "$want" ] || fail "--jsonl: '$got' != '$want'"

# detokenize: HF's decode, one call and streamed, MODEL and FILE
ids=$("$LMS_BIN" tokenize tiny --store "$T/store" --text "$text" --special | tr ' ' ',')
want=$(want_of qwen_decode)
for extra in "" "--stream"; do
    got=$("$LMS_BIN" detokenize tiny --store "$T/store" --ids "$ids" --json $extra)
    [ "$got" = "$want" ] || fail "detokenize $extra: '$got' != '$want'"
done
got=$("$LMS_BIN" detokenize --tokenizer "$T/qwen.json" --ids "$ids" --skip-special)
[ "$got" = "Hello world! It's 12345 user
日本語 🏳️‍🌈" ] || fail "detokenize --skip-special: '$got'"

# errors: exit 1 with the cause, exit 2 for usage
set +e
out=$("$LMS_BIN" tokenize nosuchmodel --store "$T/store" --text x 2>&1); st=$?
[ $st -eq 1 ] && [[ "$out" == *nosuchmodel* ]] || fail "unknown model: status $st, '$out'"
out=$("$LMS_BIN" tokenize --tokenizer "$T/missing.json" --text x 2>&1); st=$?
[ $st -eq 1 ] && [[ "$out" == *missing.json* ]] || fail "missing tokenizer file: status $st, '$out'"
out=$("$LMS_BIN" tokenize --tokenizer "$T/qwen.json" --text $'\xff' 2>&1); st=$?
[ $st -eq 1 ] && [[ "$out" == *UTF-8* ]] || fail "invalid UTF-8: status $st, '$out'"
echo '{"model": {"type": "Unigram", "vocab": []}}' > "$T/unigram.json"
out=$("$LMS_BIN" tokenize --tokenizer "$T/unigram.json" --text x 2>&1); st=$?
[ $st -eq 1 ] && [[ "$out" == *Unigram* ]] || fail "unsupported model: status $st, '$out'"
"$LMS_BIN" tokenize --text x > /dev/null 2>&1; st=$?
[ $st -eq 2 ] || fail "no MODEL/--tokenizer: status $st"
"$LMS_BIN" detokenize --tokenizer "$T/qwen.json" --ids 1,x > /dev/null 2>&1; st=$?
[ $st -eq 2 ] || fail "bad --ids: status $st"
set -e
echo "ok"
