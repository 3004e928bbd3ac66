"""The tier's pure rules (dlog.core.tiering): what is offloaded when, the three-step commit's
changes, when bookie copies go, and which retention truncates a tiered stream."""

from __future__ import annotations

from dataclasses import replace

from dlog.core import tiering
from dlog.segments.metadata import (
    TIER_DEFAULTS,
    Segment,
    SegmentList,
    SegmentState,
    StreamConfig,
    TierCopy,
    TierPolicy,
)

COMPLETED = SegmentState.COMPLETED
POLICY = TierPolicy(uri="file:///tier", offload_after_ms=1000).over(TIER_DEFAULTS)


def segment(sequence: int, *, state: SegmentState = COMPLETED, completed_ms: int = 0, size: int = 100,
            tier: TierCopy | None = None, attempt: str = "", last_ts: int = 0) -> Segment:
    return Segment(sequence, 100 + sequence, state, last_entry=9, records=10, bytes=size,
                   completed_ms=completed_ms, last_timestamp_ms=last_ts, tier=tier, offload_attempt=attempt)


def listing(*segments: Segment) -> SegmentList:
    return SegmentList(tuple(segments), 7, max(s.sequence for s in segments))


def copy(offloaded_ms: int = 0, deleted_ms: int = 0) -> TierCopy:
    return TierCopy("file:///tier/f.parquet", 10, 1, 10, offloaded_ms, deleted_ms)


def test_the_effective_policy_is_the_stream_over_the_namespace_over_the_defaults():
    config = StreamConfig("s", tier=TierPolicy(offload_after_ms=5))
    assert tiering.effective_policy(config, None) == replace(TIER_DEFAULTS, offload_after_ms=5)
    namespace = TierPolicy(uri="s3://b/p", offload_after_ms=60_000, delete_lag_ms=-1)
    effective = tiering.effective_policy(config, namespace)
    assert (effective.uri, effective.offload_after_ms, effective.delete_lag_ms) == ("s3://b/p", 5, -1)
    assert effective.keep_bytes == TIER_DEFAULTS.keep_bytes
    assert not tiering.effective_policy(StreamConfig("s"), None).enabled


def test_only_completed_segments_past_the_age_and_beyond_the_kept_bytes_are_offloaded():
    segments = listing(segment(1, completed_ms=0), segment(2, completed_ms=0, tier=copy()),
                       segment(3, completed_ms=500), segment(4, state=SegmentState.TRUNCATED),
                       segment(5, completed_ms=0), segment(6, state=SegmentState.IN_PROGRESS))
    assert [s.sequence for s in tiering.offload_plan(segments, POLICY, now_ms=1200)] == [1, 5]
    assert [s.sequence for s in tiering.offload_plan(segments, POLICY, now_ms=1500)] == [1, 3, 5]
    keep = replace(POLICY, keep_bytes=150)  # the newest completed segment (100 bytes) stays on bookies only
    assert [s.sequence for s in tiering.offload_plan(segments, keep, now_ms=1500)] == [1, 3]
    manual = replace(POLICY, offload_after_ms=-1)
    assert tiering.offload_plan(segments, manual, now_ms=10**9) == []
    assert [s.sequence for s in tiering.offload_plan(segments, manual, 0, now=True)] == [1, 3, 5]
    assert tiering.offload_plan(segments, replace(POLICY, uri=""), 10**9, now=True) == []


def test_an_offload_commits_only_while_its_attempt_is_the_current_one():
    ours, theirs = "file:///tier/a.parquet", "file:///tier/b.parquet"
    base = listing(segment(1, attempt=ours))
    change = tiering.offloaded_change(base, 1, ours, copy(5))
    assert change is not None and change.update[0].tier == copy(5) and change.update[0].offload_attempt == ""
    assert tiering.offloaded_change(listing(segment(1, attempt=theirs)), 1, ours, copy(5)) is None
    assert tiering.offloaded_change(listing(segment(1, attempt=ours, state=SegmentState.TRUNCATED)), 1, ours,
                                    copy(5)) is None
    assert tiering.offloaded_change(listing(segment(2)), 1, ours, copy(5)) is None
    assert tiering.attempt_change(segment(1), ours).update[0].offload_attempt == ours


def test_bookie_copies_go_after_the_lag_or_the_bookie_retention_never_while_held():
    config = StreamConfig("s")
    segments = listing(segment(1, tier=copy(1000)), segment(2, tier=copy(1000, deleted_ms=1500)),
                       segment(3), segment(4, tier=copy(5000)), segment(5, state=SegmentState.IN_PROGRESS))
    lag = replace(POLICY, delete_lag_ms=2000)
    assert [s.sequence for s in tiering.bookie_copy_plan(segments, config, lag, 3000, {})] == [1]
    assert tiering.bookie_copy_plan(segments, config, lag, 3000, {}, held={101}) == []
    assert tiering.bookie_copy_plan(segments, config, replace(POLICY, delete_lag_ms=-1), 10**9, {}) == []
    # bookie retention by size: the bookies hold 1, 3, 4 (300 bytes), 100 allowed: offloaded ones go
    retained = replace(config, retention_bytes=100)
    plan = tiering.bookie_copy_plan(segments, retained, replace(POLICY, delete_lag_ms=-1), 0, {})
    assert [s.sequence for s in plan] == [1]  # 3 is not offloaded; 4 is the last completed (kept)
    marked = tiering.bookie_deleted_change(plan, 777).update
    assert [s.tier.bookie_deleted_ms for s in marked] == [777] and not marked[0].on_bookies


def test_a_tiered_stream_is_truncated_by_its_tier_retention_only():
    config = StreamConfig("s", retention_age_ms=10)
    segments = listing(segment(1, last_ts=0, tier=copy()), segment(2, last_ts=0), segment(3, last_ts=0),
                       segment(4, state=SegmentState.IN_PROGRESS))
    assert [s.sequence for s in tiering.tiered_retention_plan(segments, config, TIER_DEFAULTS, {}, 1000)] == [1, 2]
    assert tiering.tiered_retention_plan(segments, config, POLICY, {}, 1000) == []  # the tier keeps all
    aged = replace(POLICY, retention_age_ms=500)
    assert [s.sequence for s in tiering.tiered_retention_plan(segments, config, aged, {}, 1000)] == [1, 2]


def test_a_removed_segment_takes_its_file_and_a_leftover_attempt_with_it():
    assert tiering.tier_files(segment(1, tier=copy(), attempt="file:///tier/x.parquet")) == [
        "file:///tier/f.parquet", "file:///tier/x.parquet"]
    assert tiering.tier_files(segment(1)) == []
