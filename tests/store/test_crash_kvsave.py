#!/usr/bin/env python3
"""tests/store/test_crash_kvsave.py - crash safety of a KV save (`lmstore run
--save-session`): killed with SIGKILL at every crash point the save passes
and at seeded random times within the run; see test_crash.py for the checks
(the session absent, or resuming to a clean run's continuation)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_crash import main  # noqa: E402

main("kvsave")
