"""Key compaction's pure rules (dlog.core.compaction): the horizon, what a compaction covers, the
latest value per key with deletion markers, and the one swap change."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from bookkeeper.errors import ConfigError
from dlog.core import compaction
from dlog.core.errors import OffsetOutOfRangeError
from dlog.offsets import Offset
from dlog.segments.metadata import CompactedCopy, Segment, SegmentList, SegmentState, StreamConfig, TierCopy

COMPLETED, IN_PROGRESS, TRUNCATED = SegmentState.COMPLETED, SegmentState.IN_PROGRESS, SegmentState.TRUNCATED
CONFIG = StreamConfig("s", delete_retention_ms=1000)
NOW = 100_000


def segment(sequence: int, state: SegmentState = COMPLETED, *, last_ts: int = 0,
            compacted: CompactedCopy | None = None, tier: TierCopy | None = None) -> Segment:
    return Segment(sequence, 100 + sequence, state, last_entry=9, records=10, last_timestamp_ms=last_ts,
                   compacted=compacted, tier=tier, first_position=10 * (sequence - 1))


def listing(*segments: Segment) -> SegmentList:
    return SegmentList(tuple(segments), 7, max(s.sequence for s in segments))


def copy(ledger: int = 900, compacted_ms: int = NOW, tombstones: int = 0) -> CompactedCopy:
    return CompactedCopy(ledger, 0, 0, 3, compacted_ms, tombstones)


def plan_of(stream: SegmentList, config: StreamConfig = CONFIG, until: Offset | None = None):
    return compaction.compaction_plan(stream, config, NOW, "s", until)


def test_the_horizon_is_the_last_completed_segment_never_the_in_progress_one():
    stream = listing(segment(1, TRUNCATED), segment(2), segment(3), segment(4, IN_PROGRESS))
    plan = plan_of(stream)
    assert [s.sequence for s in plan.segments] == [2, 3] and plan.horizon.sequence == 3
    assert plan_of(listing(segment(1, IN_PROGRESS))) is None


def test_the_min_compaction_lag_keeps_recent_segments_out():
    stream = listing(segment(1, last_ts=NOW - 5000), segment(2, last_ts=NOW - 500), segment(3, last_ts=0))
    lagged = replace(CONFIG, min_compaction_lag_ms=1000)
    assert [s.sequence for s in plan_of(stream, lagged).segments] == [1]  # 2 too young, and 3 after it
    assert [s.sequence for s in plan_of(stream).segments] == [1, 2, 3]


def test_until_lowers_the_horizon_to_the_segments_that_end_before_it():
    stream = listing(segment(1), segment(2), segment(3), segment(4, IN_PROGRESS))
    assert [s.sequence for s in plan_of(stream, until=Offset(103, 5)).segments] == [1, 2]
    assert [s.sequence for s in plan_of(stream, until=Offset(104, 0)).segments] == [1, 2, 3]
    assert plan_of(stream, until=Offset(101, 0)) is None  # nothing ends before the first record
    with pytest.raises(OffsetOutOfRangeError, match="beyond the compaction horizon"):
        plan_of(stream, until=Offset(104, 1))  # inside the in-progress segment
    with pytest.raises(OffsetOutOfRangeError, match="no live segment has ledger 7"):
        plan_of(stream, until=Offset(7, 0))
    lagged = replace(CONFIG, min_compaction_lag_ms=1000)
    young = listing(segment(1), segment(2, last_ts=NOW))
    with pytest.raises(OffsetOutOfRangeError, match="end of segment 1"):
        plan_of(young, lagged, until=Offset(102, 3))


def test_the_compacted_prefix_only_grows_and_nothing_to_do_is_none():
    done = listing(segment(1, compacted=copy()), segment(2, compacted=copy()), segment(3))
    plan = plan_of(done)
    assert [s.sequence for s in plan.segments] == [1, 2, 3]
    assert plan_of(done, until=Offset(101, 0)) is None  # below the compacted prefix: nothing new
    assert plan_of(listing(segment(1, compacted=copy()), segment(2, IN_PROGRESS))) is None
    assert compaction.replaced_ledgers(plan) == [103, 900]  # segment 3's original, the old compaction ledger


def test_a_segment_on_the_tier_is_never_compacted_and_a_tiered_stream_is_refused():
    assert plan_of(listing(segment(1, tier=TierCopy("file:///t", 1, 1, 1, 1)), segment(2))) is None
    with pytest.raises(ConfigError, match="tier"):
        compaction.check_compactable(CONFIG, tier_enabled=True, key_column=True)
    with pytest.raises(ConfigError, match="key"):
        compaction.check_compactable(CONFIG, tier_enabled=False, key_column=False)


def test_deletion_markers_go_once_their_segment_was_first_compacted_delete_retention_ago():
    fresh = segment(1, compacted=copy(compacted_ms=NOW - 10, tombstones=2))
    old = segment(2, compacted=copy(compacted_ms=NOW - 5000, tombstones=2))
    clean = segment(3, compacted=copy(compacted_ms=NOW - 5000, tombstones=0))
    plan = plan_of(listing(fresh, old, clean))
    assert plan.drops_tombstones == {2}
    assert plan_of(listing(fresh, clean)) is None  # nothing new, no marker due
    assert plan_of(listing(segment(1)), replace(CONFIG, delete_retention_ms=0)).drops_tombstones == {1}
    # a later compaction keeps the time of the first: delete retention counts from it
    assert compaction.compacted_copy(old, 901, 0, 1, 2, 2, NOW).compacted_ms == NOW - 5000
    assert compaction.compacted_copy(segment(4), 901, 0, 1, 2, 2, NOW).compacted_ms == NOW


def test_the_latest_record_per_key_stays_and_matches_a_replay():
    rng = random.Random(5)
    entries = []  # (sequence, entry, keys, tombstones)
    for sequence in (1, 2, 3):
        for entry in range(20):
            keys = [None if rng.random() < 0.05 else f"k{rng.randrange(12)}" for _ in range(rng.randrange(1, 6))]
            entries.append((sequence, entry, keys, [rng.random() < 0.15 for _ in keys]))
    latest = compaction.LatestPerKey()
    for sequence, entry, keys, _ in entries:
        latest.add(keys, sequence, entry, list(range(len(keys))))
    for drop in (False, True):
        kept = {}
        for sequence, entry, keys, dead in entries:
            for row in latest.kept(keys, dead, sequence, entry, list(range(len(keys))), drop):
                assert keys[row] not in kept  # one record per key
                kept[keys[row]] = dead[row]
        replay: dict[str, bool] = {}
        for _, _, keys, dead in entries:
            for key, tombstone in zip(keys, dead, strict=True):
                if key is not None:
                    replay[key] = tombstone
        expected = {key: tombstone for key, tombstone in replay.items() if not (drop and tombstone)}
        assert kept == expected and None not in kept


def test_the_swap_is_one_change_and_void_when_a_covered_segment_changed():
    stream = listing(segment(1, compacted=copy()), segment(2), segment(3, IN_PROGRESS))
    plan = plan_of(stream)
    copies = {1: copy(901), 2: copy(901)}
    change = compaction.swap_change(stream, plan, copies)
    assert [s.compacted for s in change.update] == [copies[1], copies[2]] and not change.create and not change.delete
    assert [(s.ledger_id, s.records, s.first_position) for s in change.update] == [(101, 10, 0), (102, 10, 10)]
    truncated = listing(segment(1, compacted=copy()), segment(2, TRUNCATED), segment(3, IN_PROGRESS))
    assert compaction.swap_change(truncated, plan, copies) is None
    raced = listing(segment(1, compacted=copy(950)), segment(2), segment(3, IN_PROGRESS))
    assert compaction.swap_change(raced, plan, copies) is None  # another run swapped first
    rolled = listing(segment(1, compacted=copy()), segment(2), segment(3), segment(4, IN_PROGRESS))
    assert compaction.swap_change(rolled, plan, copies) is not None  # a writer's roll meanwhile is no conflict


def test_a_compacted_copy_round_trips_in_segment_metadata():
    compacted = segment(1, compacted=copy(tombstones=1))
    assert Segment.from_bytes(compacted.to_bytes()) == compacted
    assert Segment.from_bytes(segment(2).to_bytes()).compacted is None
    with pytest.raises(ConfigError, match="delete retention"):
        StreamConfig("s", delete_retention_ms=-1)
