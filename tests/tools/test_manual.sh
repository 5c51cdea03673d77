#!/usr/bin/env bash
# tests/tools/test_manual.sh - the man page lmstore(1) and the bash completion
# keep up with the CLI: the man page names every command `lmstore help`
# lists and renders without warnings; the completion offers the commands,
# each command's options (from its --help), the models of the store named
# with --store, the KV session names after --resume and `kv info`, and the
# kv subcommands.
set -euo pipefail
: "${LMS_SRC_DIR:?}" "${LMS_BIN:?}" "${LMS_TMP:?}"
rm -rf "$LMS_TMP" && mkdir -p "$LMS_TMP"
T=$LMS_TMP
MAN=$LMS_SRC_DIR/docs/lmstore.1
fail() { echo "FAIL: $*" >&2; exit 1; }

commands=$("$LMS_BIN" help | awk '/^commands:/ { on = 1; next } on { print $1 }')
[ "$(echo "$commands" | wc -l)" -ge 15 ] || fail "lmstore help lists too few commands: $commands"
for c in $commands; do
  grep -qE "^\.B ($c|kv ls|bench load)\b" "$MAN" || [ "$c" = cp ] || [ "$c" = mv ] ||
    fail "the man page does not document '$c'"
done
grep -q '^\.B cp \\fIMODEL NEWNAME\\fR, \\fBmv' "$MAN" || fail "the man page does not document cp and mv"
if command -v groff >/dev/null; then
  warn=$(groff -man -Tutf8 -ww -z "$MAN" 2>&1) || fail "groff: $warn"
  [ -z "$warn" ] || fail "groff warns: $warn"
fi

# ---- completion, as bash calls it
python3 "$LMS_SRC_DIR/tests/gen_model.py" "$T/src" --arch qwen3 --hidden 32 --layers 1 --vocab 16384 \
    --tokenizer "$LMS_SRC_DIR/tests/fixtures/tokenizers/qwen3" > /dev/null
"$LMS_BIN" import "$T/src" --store "$T/store" --name tinymodel -q > /dev/null
"$LMS_BIN" run tinymodel hello --store "$T/store" --max-tokens 1 --save-session greeting > /dev/null 2>&1
# shellcheck source=/dev/null
source "$LMS_SRC_DIR/tools/lmstore.bash-completion"
complete_line() { # WORDS...: COMPREPLY for the last word, sorted, one line
  COMP_WORDS=("$LMS_BIN" "$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  _lmstore
  printf '%s\n' "${COMPREPLY[@]}" | sort | tr '\n' ' '
}
expect() { # WANT WORDS...: every word of WANT is offered
  local want=$1 got
  shift
  got=" $(complete_line "$@")"
  for w in $want; do
    [[ $got == *" $w "* ]] || fail "completing '$*': '$w' not offered (got:$got)"
  done
}
expect_only() { # WANT WORDS...: exactly WANT
  local want=$1 got
  shift
  got=$(complete_line "$@")
  [ "$got" = "$want " ] || fail "completing '$*': got '$got', want '$want'"
}
expect "$commands" ""
expect_only "run" ru
expect_only "--save-session" run tinymodel --save
expect "--max-tokens --temp --chat --resume --json" run tinymodel --
expect_only "tinymodel" --store "$T/store" run ""
expect_only "tinymodel" run --store "$T/store" t
expect_only "tinymodel" info --store "$T/store" ""
expect_only "greeting" run tinymodel --store "$T/store" --resume ""
expect_only "info ls rm" kv ""
expect_only "greeting" --store "$T/store" kv info ""
expect "--json" kv ls --
expect_only "chatml gemma llama3" chat x --chat-format ""
# after MODEL and an option's value, run completes nothing more from the store
expect_only "" --store "$T/store" run tinymodel --max-tokens 5 ""
echo "PASS: the man page and the completion cover $(echo "$commands" | wc -l) commands"
