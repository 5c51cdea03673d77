#!/usr/bin/env bash
# tests/tools/test_lms_api.sh - every function declared in a public header is
# marked LMS_API (exported from liblmstore.so, which hides everything else).
# After a merge that adds one without it: python3 tools/lms_api.py include/lmstore/*.h
set -euo pipefail
: "${LMS_SRC_DIR:?}"
python3 "$LMS_SRC_DIR/tools/lms_api.py" --check "$LMS_SRC_DIR"/include/lmstore/*.h
n=$(python3 "$LMS_SRC_DIR/tools/lms_api.py" --list "$LMS_SRC_DIR"/include/lmstore/*.h | wc -l)
[ "$n" -gt 100 ] || { echo "FAIL: only $n public functions found: the scanner misreads the headers" >&2; exit 1; }
# the scanner itself: a declaration without the mark is reported
t=$(mktemp -d)
printf '#include "lmstore/types.h"\n/* lms_in_comment(void); */\ntypedef int (*lms_cb)(void);\nLMS_API int lms_a(void);\nint lms_b(int x,\n          int y);\nstatic inline int lms_c(void) { return 0; }\n' > "$t/h.h"
if python3 "$LMS_SRC_DIR/tools/lms_api.py" --check "$t/h.h" 2> "$t/err"; then
  echo "FAIL: --check passed a header with an unmarked declaration" >&2; exit 1
fi
grep -qE ': lms_b$' "$t/err" && ! grep -qE ': (lms_a|lms_c|lms_cb|lms_in_comment)$' "$t/err" || { cat "$t/err" >&2; exit 1; }
python3 "$LMS_SRC_DIR/tools/lms_api.py" "$t/h.h"
grep -q '^LMS_API int lms_b(int x,' "$t/h.h" && python3 "$LMS_SRC_DIR/tools/lms_api.py" --check "$t/h.h"
rm -rf "$t"
echo "PASS: $n public functions, all marked LMS_API"
