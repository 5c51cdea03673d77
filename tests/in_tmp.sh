#!/bin/sh
# tests/in_tmp.sh CMD... - runs one test command in a fresh scratch folder
# ($LMS_TMP) and removes the folder when the test passes or is skipped (exit 0
# or 77), so a full run holds on disk only what its running tests hold; a
# whole run otherwise leaves gigabytes of stores, models and exports behind.
# A failed test keeps its folder to be read; LMS_KEEP_TMP=1 keeps every one.
: "${LMS_TMP:?tests/in_tmp.sh needs LMS_TMP}"
rm -rf "$LMS_TMP"
mkdir -p "$LMS_TMP" || exit 1
"$@"
rc=$?
if [ "$rc" = 0 ] || [ "$rc" = 77 ]; then
  [ "${LMS_KEEP_TMP:-0}" = 1 ] || rm -rf "$LMS_TMP"
elif [ "$rc" -gt 128 ] && [ "$rc" -lt 160 ]; then
  kill -s "$(kill -l "$rc")" "$$" # died of a signal: so does this, for ctest to name it
fi
exit "$rc"
