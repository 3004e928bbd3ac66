"""The rules behind a bookie's S4 limits, on their own: refusals are logged once per interval and
reason."""

from __future__ import annotations

import logging

from bookkeeper.bookie.refusals import RateLimitedLog
from bookkeeper.clock import ManualClock


def test_refusals_are_logged_once_per_interval_and_reason_with_the_count_left_out(caplog):
    clock = ManualClock()
    refusals = RateLimitedLog(logging.getLogger("test.refusals"), interval_s=10, clock=clock)
    with caplog.at_level(logging.WARNING, "test.refusals"):
        for second in range(25):
            refusals.warning("auth", "AUTH from %s refused", f"peer{second}")
            refusals.warning("frame", "closing connection from %s", f"peer{second}")
            clock.advance(1)
    lines = [record.getMessage() for record in caplog.records]
    assert [line for line in lines if line.startswith("AUTH")] == [
        "AUTH from peer0 refused", "AUTH from peer10 refused (9 more like it in the last 10 s not logged)",
        "AUTH from peer20 refused (9 more like it in the last 10 s not logged)"]
    assert len(lines) == 6
