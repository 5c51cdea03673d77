#!/usr/bin/env python3
"""tests/store/test_crash_import.py - crash safety of `lmstore import`: killed with
SIGKILL at 50 seeded points; see test_crash.py for the checks."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_crash import main  # noqa: E402

main("import")
