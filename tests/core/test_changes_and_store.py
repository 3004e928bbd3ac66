"""The planners (truncation, retention, merge) and the segment store port: retention keeps the last
completed segment, truncation never lowers a point, a writer's rebased change keeps truncation's
fields, and the retrying store counts a lost answer as done only when the change is really there."""

from __future__ import annotations

import asyncio

import pytest

from bookkeeper.errors import MetadataError, MetadataVersionError
from bookkeeper.retry import Backoff
from dlog.core import changes
from dlog.core.errors import OffsetOutOfRangeError
from dlog.offsets import Offset
from dlog.segments.memory import MemoryMetadata
from dlog.segments.metadata import Segment, SegmentChange, SegmentList, SegmentState, StreamConfig
from dlog.segments.port import RetryingSegmentStore

FAST = Backoff(attempts_max=5, delay_s_first=0.0, delay_s_max=0.0)


def completed(sequence, ledger_id, size_bytes=100, last_timestamp_ms=0) -> Segment:
    return Segment(sequence, ledger_id, SegmentState.COMPLETED, last_entry=9, records=10, bytes=size_bytes,
                   last_timestamp_ms=last_timestamp_ms)


def test_retention_never_removes_the_in_progress_segment_nor_the_last_completed_one():
    listing = SegmentList((completed(1, 10), completed(2, 20), Segment(3, 30)), 3, 3)
    config = StreamConfig("s", retention_bytes=1, retention_keeps_unconsumed=False)
    plan = changes.retention_plan(listing, config, {}, now_ms=0)
    assert [s.sequence for s in plan] == [1]  # 2 is the last completed one: kept though a segment is in progress
    aged = StreamConfig("s", retention_age_ms=10, retention_keeps_unconsumed=False)
    assert [s.sequence for s in changes.retention_plan(listing, aged, {}, now_ms=1_000)] == [1]


def test_retention_keeps_what_a_subscriber_has_not_read():
    listing = SegmentList(tuple(completed(n, 10 * n) for n in range(1, 6)), 5, 5)
    config = StreamConfig("s", retention_bytes=1)
    plan = changes.retention_plan(listing, config, {"slow": {"ledger": 30, "entry": 0, "slot": 0}}, now_ms=0)
    assert [s.sequence for s in plan] == [1, 2]


def test_truncation_marks_segments_below_and_never_lowers_a_point_or_passes_the_end():
    listing = SegmentList((completed(1, 10), Segment(2, 20, min_active_entry=5)), 2, 2)
    change, marked = changes.truncation_change(listing, Offset(20, 3), target_end_entry=8, stream="s")
    assert [s.sequence for s in marked] == [1] and [s.state for s in change.update] == [SegmentState.TRUNCATED]
    change, _ = changes.truncation_change(listing, Offset(20, 7, 2), target_end_entry=8, stream="s")
    assert change.update[-1].min_active_entry == 7 and change.update[-1].min_active_slot == 2
    with pytest.raises(OffsetOutOfRangeError, match="past its end"):
        changes.truncation_change(listing, Offset(20, 10), target_end_entry=8, stream="s")
    with pytest.raises(OffsetOutOfRangeError, match="no live segment"):
        changes.truncation_change(listing, Offset(99, 0), target_end_entry=8, stream="s")


def test_a_rebased_writer_change_keeps_the_stored_truncation_point_and_owns_the_rest():
    stored = Segment(4, 40, min_active_entry=6, min_active_slot=1)
    ours = Segment(4, 40).completed(9, 100, 2000, 1, 2, 3)
    rebased = changes.rebase_progress(ours, stored)
    assert (rebased.min_active_entry, rebased.min_active_slot) == (6, 1)
    assert rebased.state is SegmentState.COMPLETED and rebased.last_entry == 9
    listing = SegmentList((stored,), 1, 4)
    assert changes.still_owned(Segment(4, 40), listing) is stored
    assert changes.still_owned(Segment(4, 40), SegmentList((stored, Segment(5, 50)), 2, 5)) is None


async def test_the_memory_store_is_a_compare_and_set_store_with_sessions():
    metadata = MemoryMetadata()
    first, second = metadata.session(), metadata.session()
    await first.create_stream(StreamConfig("s"))
    empty = await first.segments("s")
    created = await first.commit("s", empty, SegmentChange(create=(Segment(1, 10),)))
    with pytest.raises(MetadataVersionError):
        await second.commit("s", empty, SegmentChange(create=(Segment(1, 11),)))
    assert (await second.segments("s")) == created
    token = await first.lock("s", 1.0)
    assert token is not None and await second.lock("s", 0.05) is None
    metadata.expire(first.session)  # the session ends: its lock vanishes
    assert await second.lock("s", 0.05) is not None


async def test_a_commit_whose_answer_was_lost_counts_only_if_it_landed():
    answers = iter(["lost_reply"])
    metadata = MemoryMetadata(faults=lambda operation, stream: next(answers, None) if operation == "commit" else None)
    store = RetryingSegmentStore(metadata.session(), FAST)
    await store.create_stream(StreamConfig("s"))
    empty = await store.segments("s")
    listing = await store.commit("s", empty, SegmentChange(create=(Segment(1, 10),)))
    assert [s.ledger_id for s in listing.segments] == [10]  # landed: read back, not applied twice

    answers = iter(["unavailable", "unavailable"])
    listing = await store.commit("s", listing, SegmentChange(update=(Segment(1, 10).completed(0, 1, 1, 1, 1, 1),)))
    assert listing.segments[0].state is SegmentState.COMPLETED  # not applied: tried again

    other = metadata.session()
    stale = listing
    await other.commit("s", listing, SegmentChange(create=(Segment(2, 20),)))  # someone else's change
    answers = iter(["unavailable"])
    with pytest.raises(MetadataVersionError):  # ours did not land: a lost compare-and-set
        await store.commit("s", stale, SegmentChange(create=(Segment(2, 21),)))


async def test_the_retrying_store_gives_up_with_the_last_error_after_its_attempts():
    metadata = MemoryMetadata(faults=lambda operation, stream: "unavailable" if operation == "segments" else None)
    store = RetryingSegmentStore(metadata.session(), FAST)
    await store.create_stream(StreamConfig("s"))
    with pytest.raises(MetadataError, match="ConnectionLoss"):
        await asyncio.wait_for(store.segments("s"), 5)


async def test_a_commit_over_several_streams_lands_in_all_or_none_and_survives_a_lost_answer():
    answers = iter([])
    metadata = MemoryMetadata(faults=lambda operation, stream: next(answers, None) if operation == "commit" else None)
    store = RetryingSegmentStore(metadata.session(), FAST)
    for name in ("a", "b"):
        await store.create_stream(StreamConfig(name))
    a, b = await store.segments("a"), await store.segments("b")
    moved = await metadata.session().commit("b", b, SegmentChange(create=(done(1, 5),)))
    with pytest.raises(MetadataVersionError):
        await store.commit_many([("a", a, SegmentChange(create=(done(1, 10),))),
                                 ("b", b, SegmentChange(create=(done(2, 20),)))])
    assert (await store.segments("a")).segments == ()  # nothing landed in "a" either

    answers = iter(["lost_reply"])
    landed = await store.commit_many([("a", a, SegmentChange(create=(done(1, 10),))),
                                      ("b", moved, SegmentChange(create=(done(2, 20),)))])
    assert [[s.ledger_id for s in listing.segments] for listing in landed] == [[10], [5, 20]]
    assert metadata.commits == 3  # read back after the lost answer, not applied twice


def done(sequence: int, ledger_id: int) -> Segment:
    return Segment(sequence, ledger_id).completed(0, 1, 1, 1, 1, 1)
