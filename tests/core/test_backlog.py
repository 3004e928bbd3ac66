"""Backlog rules (dlog.core.backlog): a subscription's unconsumed bytes and oldest record's age
from the segment list alone, the verdict against the stream's limits, the hold refusal, who
retention keeps records for and whom it evicts, and expiry after inactivity."""

from __future__ import annotations

import pytest

from bookkeeper.errors import ConfigError
from dlog.core import backlog, changes
from dlog.segments.metadata import Segment, SegmentList, SegmentState, StreamConfig

# five completed segments of 1000 bytes and 10 entries each, written 1000 ms apart, then one in progress
SEGMENTS = tuple(Segment(n, 10 * n, SegmentState.COMPLETED, last_entry=9, records=10, bytes=1000,
                         first_timestamp_ms=1000 * n, last_timestamp_ms=1000 * n + 900) for n in range(1, 6))
LISTING = SegmentList((*SEGMENTS, Segment(6, 60, created_ms=6000)), 6, 6)


def at(ledger: int, entry: int = 0, **extra: int) -> dict[str, int]:
    return {"ledger": ledger, "entry": entry, "slot": 0, **extra}


def test_backlog_is_the_rest_of_its_segment_and_every_later_completed_one():
    assert backlog.unconsumed(LISTING, at(30)) == (3000, 3000)  # segments 3, 4, 5 whole
    assert backlog.unconsumed(LISTING, at(30, 5)) == (2500, 3450)  # half of 3: its timestamp half way
    assert backlog.unconsumed(LISTING, at(50, 10)) == (0, None)  # read all of the last completed one
    assert backlog.unconsumed(LISTING, at(60)) == (0, None)  # in the in-progress one: counted once completed
    assert backlog.unconsumed(LISTING, at(99)) == (5000, 1000)  # its segment truncated away: everything


def test_fraction_is_against_the_nearest_limit_and_warns_at_80_percent():
    config = StreamConfig("s", backlog_bytes=2500, backlog_age_ms=10_000)
    found = backlog.backlog_of(LISTING, config, "a", at(40), now_ms=5_000)
    assert (found.bytes, found.age_ms) == (2000, 1000)
    assert found.fraction == pytest.approx(0.8) and found.level == "warning" and not found.over
    aged = backlog.backlog_of(LISTING, config, "a", at(40), now_ms=17_000)
    assert aged.fraction == pytest.approx(1.3) and aged.level == "over"  # by age: 13 s over 10 s
    assert backlog.backlog_of(LISTING, StreamConfig("s"), "a", at(10), 99_000).fraction == 0.0  # no limits


def test_hold_refuses_while_a_subscription_is_over_and_clears_once_it_commits_past():
    config = StreamConfig("s", backlog_bytes=2500, backlog_policy="hold")
    behind = backlog.backlogs(LISTING, config, {"slow": at(20), "fast": at(50)}, 6000)
    message = backlog.hold_refusal("s", config, behind)
    assert message is not None and "'slow'" in message and "4000 bytes unconsumed (limit 2500)" in message
    caught_up = backlog.backlogs(LISTING, config, {"slow": at(40), "fast": at(50)}, 6000)
    assert backlog.hold_refusal("s", config, caught_up) is None
    for policy in ("evict", "none"):  # only hold refuses writers
        other = StreamConfig("s", backlog_bytes=2500, backlog_policy=policy)
        assert backlog.hold_refusal("s", other, backlog.backlogs(LISTING, other, {"slow": at(20)}, 6000)) is None
    evicted = backlog.backlogs(LISTING, config, {"slow": backlog.evicted(at(20), 1)}, 6000)
    assert backlog.hold_refusal("s", config, evicted) is None  # an evicted one holds nothing


def test_evict_marks_the_one_over_and_retention_then_removes_what_it_had_not_read():
    config = StreamConfig("s", retention_bytes=1, backlog_bytes=2500, backlog_policy="evict")
    subscriptions = {"slow": at(10, committed_ms=5), "fast": at(40, committed_ms=5)}
    found = backlog.backlogs(LISTING, config, subscriptions, 6000)
    assert backlog.to_evict(config, found) == ["slow"]
    holders = backlog.retention_holders(config, subscriptions, backlog.to_evict(config, found))
    assert holders == {"fast": at(40)}  # offsets only
    assert [s.sequence for s in changes.retention_plan(LISTING, config, holders, 6000)] == [1, 2, 3]
    marked = {**subscriptions, "slow": backlog.evicted(subscriptions["slow"], 6000)}
    assert backlog.to_evict(config, backlog.backlogs(LISTING, config, marked, 7000)) == []  # marked once
    assert "slow" not in backlog.retention_holders(config, marked)
    assert not backlog.is_evicted(backlog.committed(marked["slow"], 8000))  # a commit clears the mark


def test_hold_keeps_unconsumed_records_even_when_retention_would_not():
    config = StreamConfig("s", retention_bytes=1, retention_keeps_unconsumed=False, backlog_bytes=10_000)
    holders = backlog.retention_holders(config, {"slow": at(20)})
    assert [s.sequence for s in changes.retention_plan(LISTING, config, holders, 6000)] == [1]
    loose = StreamConfig("s", retention_bytes=1, retention_keeps_unconsumed=False, backlog_policy="none",
                         backlog_bytes=10_000)
    assert backlog.retention_holders(loose, {"slow": at(20)}) == {}


def test_expiry_removes_only_subscriptions_inactive_longer_than_the_setting():
    config = StreamConfig("s", subscription_expiry_ms=1000)
    subscriptions = {"idle": at(10, committed_ms=100), "active": at(10, committed_ms=900), "old-client": at(10)}
    assert backlog.expired(config, subscriptions, now_ms=1500) == ["idle"]
    assert backlog.expired(StreamConfig("s"), subscriptions, now_ms=10**9) == []  # no expiry set
    assert backlog.leaving(LISTING, config, subscriptions, now_ms=1500) == ["idle"]  # retention keeps nothing for it
    assert "idle" not in backlog.retention_holders(config, subscriptions, ["idle"])


@pytest.mark.parametrize("fields", [{"backlog_policy": "drop"}, {"backlog_bytes": -1},
                                    {"subscription_expiry_ms": 1.5}])
def test_bad_settings_are_refused(fields):
    with pytest.raises(ConfigError):
        StreamConfig("s", **fields)


def test_settings_survive_the_stored_form_and_old_configs_read_with_defaults():
    config = StreamConfig("s", backlog_bytes=5, backlog_age_ms=6, backlog_policy="evict", subscription_expiry_ms=7)
    assert StreamConfig.from_bytes(config.to_bytes()) == config
    old = StreamConfig("s").to_bytes().replace(b',"backlog_policy":"hold"', b"")
    assert StreamConfig.from_bytes(old).backlog_policy == "hold"
