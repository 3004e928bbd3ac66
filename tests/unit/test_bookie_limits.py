"""The rules behind a bookie's S4 limits, on their own: which connections holding unsent answers are
closed, how partial frames are counted before and after AUTH, how many connections the open-file
limit leaves, and that refusals are logged once per interval and reason."""

from __future__ import annotations

import logging

import pytest

from bookkeeper.bookie.limits import ServerLimits
from bookkeeper.bookie.partial import PartialFrames
from bookkeeper.bookie.refusals import RateLimitedLog
from bookkeeper.bookie.server import connections_cap
from bookkeeper.bookie.unsent import holders_to_close
from bookkeeper.clock import ManualClock
from bookkeeper.protocol.wire import Status

MiB = 1 << 20


def test_holders_are_closed_least_recently_moved_first_and_only_past_both_caps():
    holders = [("reader", 9.0, 3 * MiB), ("stuck", 1.0, 5 * MiB), ("slow", 5.0, 2 * MiB)]
    assert holders_to_close(holders, holders_max=2, total_bytes=10 * MiB, bytes_max=8 * MiB) == ["stuck"]
    assert holders_to_close(holders, holders_max=1, total_bytes=10 * MiB, bytes_max=4 * MiB) == ["stuck",
                                                                                               "slow"]
    # under the byte cap many may hold answers; at or under the connection cap none is closed
    assert holders_to_close(holders, holders_max=1, total_bytes=7 * MiB, bytes_max=8 * MiB) == []
    assert holders_to_close(holders, holders_max=3, total_bytes=10 * MiB, bytes_max=8 * MiB) == []
    # closing stops once what is left is under the byte cap
    assert holders_to_close(holders, holders_max=0, total_bytes=10 * MiB, bytes_max=6 * MiB) == ["stuck"]


def test_partial_frames_before_auth_have_their_own_small_allowance():
    frames = PartialFrames(bytes_max=8 * MiB, before_auth_bytes_max=16 * 1024,
                           refusals=RateLimitedLog(logging.getLogger("test")))
    assert frames.hold("a", 0, False, 7 * MiB, before_auth=False) is None  # an authenticated client
    assert frames.hold("b", 0, False, 16 * 1024, before_auth=True) is None  # an AUTH frame arriving
    assert (frames.bytes, frames.before_auth_bytes) == (7 * MiB, 16 * 1024)
    status, message = frames.hold("c", 0, False, 16 * 1024 + 1, before_auth=True)
    assert status == Status.UNAUTHENTICATED and "AUTH first" in message
    assert frames.before_auth_closed == 1
    # once authenticated, its bytes move to the budget of authenticated clients
    assert frames.hold("b", 16 * 1024, True, 64 * 1024, before_auth=False) is None
    assert (frames.bytes, frames.before_auth_bytes) == (7 * MiB + 64 * 1024, 0)
    status, _ = frames.hold("d", 0, False, MiB, before_auth=False)  # would pass 8 MiB: closed
    assert status == Status.TOO_MANY_REQUESTS and frames.bytes == 7 * MiB + 64 * 1024
    assert frames.hold("a", 7 * MiB, False, 0, before_auth=False) is None  # a frame completed
    assert frames.bytes == 64 * 1024


@pytest.mark.parametrize("open_files, expected", [(None, 4096), (1_048_576, 4096), (4200, 3944), (200, 1)])
def test_connections_leave_the_bookie_its_own_files(open_files, expected):
    assert connections_cap(ServerLimits(connections_max=4096, reserved_open_files=256), open_files) == expected


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
