#!/usr/bin/env python3
"""tools/lms_api.py - mark the public functions of lmstore's headers with
LMS_API, the macro (lmstore/types.h) that exports a function from the shared
library, which is otherwise built with hidden visibility.

    python3 tools/lms_api.py include/lmstore/*.h           add LMS_API where it is missing (in place)
    python3 tools/lms_api.py --check include/lmstore/*.h   exit 1 naming every declaration without it
    python3 tools/lms_api.py --list include/lmstore/*.h    print the declared function names, one a line

A public function is a declaration at file scope (outside comments,
preprocessor lines, typedefs, struct/enum bodies and inline definitions)
whose name starts with lms_. Running it again changes nothing; run it after a
merge that adds functions to a public header (the ctest test
tools.test_lms_api runs --check).
"""
import re
import sys

IDENT_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
NOT_NAMES = {"__attribute__", "__declspec", "LMS_API"}


def blank_comments_and_cpp(text):
    """The text with comments, string contents and preprocessor lines
    replaced by spaces (newlines kept), so offsets stay those of `text`."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            i += 1
            continue
        if line_start and c == "#":  # preprocessor line, with continuations
            while i < n and not (text[i] == "\n" and text[i - 1] != "\\"):
                out[i] = " "
                i += 1
            continue
        line_start = c == "\n"
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                out[i] = " "
                i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                out[k] = "x"
            i = j + 1
        else:
            i += 1
    return "".join(out)


def declarations(text):
    """(offset of the statement's first character, function name, has LMS_API)
    for each file-scope function declaration."""
    code = blank_comments_and_cpp(text)
    found = []
    depth = 0        # braces other than extern "C" { }
    stack = []       # kinds of the open braces: 'extern' or 'block'
    start = 0        # where the current file-scope statement began
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == "{":
            head = code[start:i]
            if depth == 0 and re.fullmatch(r'\s*extern\s+"x"\s*', head):
                stack.append("extern")
                start = i + 1
            else:
                if depth == 0 and head.rstrip().endswith(")") and "=" not in head:
                    # an inline definition: skip its body, it is not exported
                    stack.append("body")
                else:
                    stack.append("block")
                depth += 1
        elif c == "}":
            kind = stack.pop() if stack else "block"
            if kind == "extern":
                start = i + 1
            else:
                depth -= 1
                if kind == "body" and depth == 0:
                    start = i + 1
        elif c == ";" and depth == 0:
            stmt = code[start:i]
            lead = len(stmt) - len(stmt.lstrip())
            body = stmt.strip()
            if body and "{" not in body and not re.match(r"(typedef|static|extern\s+\w+\s*\(\*)\b", body):
                m = next((m for m in IDENT_CALL.finditer(body) if m.group(1) not in NOT_NAMES), None)
                if m and m.group(1).startswith("lms_") and not body[: m.start()].rstrip().endswith("(*"):
                    found.append((start + lead, m.group(1), body.startswith("LMS_API")))
            start = i + 1
        i += 1
    return found


def main(argv):
    mode = "fix"
    if argv and argv[0] in ("--check", "--list"):
        mode = argv.pop(0)[2:]
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    missing = []
    for path in argv:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        decls = declarations(text)
        if mode == "list":
            for _, name, _ in decls:
                print(name)
        elif mode == "check":
            missing += [f"{path}: {name}" for _, name, marked in decls if not marked]
        else:
            for off, _, marked in sorted(decls, reverse=True):
                if not marked:
                    text = text[:off] + "LMS_API " + text[off:]
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    if missing:
        print("public functions without LMS_API (run tools/lms_api.py include/lmstore/*.h):", file=sys.stderr)
        for m in missing:
            print("  " + m, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
