"""A Namespace sets up the cycle collector for many records in flight, once per process, unless
told not to (issue 26: a producer keeping its write_nowait futures ran at half the rate with
Python's default collector, and the README's loops must need no tuning by hand)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import asyncio, gc, json
from dlog import Namespace
from bookkeeper.runtime import GC_THRESHOLDS
before = gc.get_threshold()
asyncio.run(Namespace("127.0.0.1:1", store=object(), client=object(), tune_gc=False).start())
untouched = (gc.get_threshold(), gc.get_freeze_count())
asyncio.run(Namespace("127.0.0.1:1", store=object(), client=object()).start())
tuned = (gc.get_threshold(), gc.get_freeze_count())
print(json.dumps({"before": before, "untouched": untouched, "tuned": tuned, "expected": GC_THRESHOLDS}))
"""


def test_a_namespace_tunes_the_cycle_collector_once_unless_told_not_to():
    import json

    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["before"] == [700, 10, 10] and found["untouched"] == [[700, 10, 10], 0]
    threshold, frozen = found["tuned"]
    assert threshold == found["expected"] and frozen > 0
