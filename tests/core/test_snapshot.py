"""The one set of rules for where a stream's readable data starts and ends (dlog.core.snapshot):
a snapshot ends at a completed segment's last entry and an in-progress one's LAC, offsets resolve
through segment order, truncation hides what is below a truncation point, data loss is told apart
from reading past a removed but fully read segment (L5), timestamps find their first entry, and an
in-progress segment's records are counted from the header of its LAC entry."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlog.core import snapshot
from dlog.core.snapshot import Cursor, Resolved, SegmentView, StreamView
from dlog.offsets import Offset
from dlog.segments.codec import Compression, RecordSetHeader
from dlog.segments.metadata import Segment, SegmentList, SegmentState


def segment(sequence: int, ledger: int, entries: int, *, live: bool = True, completed: bool = True,
            min_active: tuple[int, int] = (0, 0), per_entry: int = 10) -> SegmentView:
    return SegmentView(sequence, ledger, live, completed, 0, entries, min_active[0], min_active[1],
                       entries * per_entry if completed else None)


# Ledger ids deliberately out of order: stream order is segment order.
STREAM = StreamView("s", (segment(1, 40, 5), segment(2, 7, 5), segment(3, 90, 3, completed=False)))


# ------------------------------------------------------------------------------ a snapshot


def listed(sequence: int, ledger: int, state: SegmentState, last_entry: int = -1, **fields: int) -> Segment:
    return Segment(sequence, ledger, state, last_entry=last_entry, **fields)


@pytest.mark.parametrize("state, last_entry, lac, end", [
    (SegmentState.COMPLETED, 9, None, 10),  # a completed segment ends at its last entry
    (SegmentState.COMPLETED, 9, 3, 10),  # ... whatever LAC anyone saw
    (SegmentState.IN_PROGRESS, -1, 4, 5),  # an in-progress one at its LAC
    (SegmentState.IN_PROGRESS, -1, -1, 0),  # nothing confirmed yet
    (SegmentState.IN_PROGRESS, -1, None, 0),  # LAC not read: nothing known readable
    (SegmentState.TRUNCATED, 9, None, 10),
])
def test_a_segment_ends_at_its_last_entry_or_its_lac(state, last_entry, lac, end):
    assert snapshot.end_entry(listed(1, 10, state, last_entry), lac) == end


def test_a_view_of_a_list_takes_the_lac_for_its_in_progress_segment_only():
    listing = SegmentList((listed(1, 10, SegmentState.TRUNCATED, 4, records=50),
                           listed(2, 20, SegmentState.COMPLETED, 9, records=100, last_timestamp_ms=7),
                           listed(3, 30, SegmentState.IN_PROGRESS, min_active_entry=2, min_active_slot=1)), 3, 3)
    view = StreamView.of("s", listing, 6)
    assert view.segments == (
        SegmentView(1, 10, False, True, 0, 5, records=50, last_timestamp_ms=0),
        SegmentView(2, 20, True, True, 0, 10, records=100, last_timestamp_ms=7),
        SegmentView(3, 30, True, False, 0, 7, 2, 1))
    assert view.end == Cursor(4, 0) and StreamView("s", ()).end == Cursor(1, 0)


@pytest.mark.parametrize("min_active, truncated, position, below", [
    ((0, 0), False, (0, 0), False),
    ((3, 2), False, (3, 1), True),  # inside the entry of the truncation point, before it
    ((3, 2), False, (3, 2), False),
    ((3, 2), False, (2, 9), True),
    ((3, 2), False, (4, 0), False),
    ((0, 0), True, (5, 0), True),  # a truncated segment has nothing readable
])
def test_below_truncation(min_active, truncated, position, below):
    state = SegmentState.TRUNCATED if truncated else SegmentState.COMPLETED
    item = listed(1, 10, state, 9, min_active_entry=min_active[0], min_active_slot=min_active[1])
    assert snapshot.below_truncation(item, *position) is below
    assert snapshot.below_truncation(SegmentView.of(item, None), *position) is below  # one rule for both


@pytest.mark.parametrize("entry_id, slot, readable", [
    (2, 0, None),  # the whole entry is below the truncation point
    (3, 0, 2),  # the point is inside this entry: from its slot
    (3, 4, 4),
    (4, 0, 0),
])
def test_readable_slot(entry_id, slot, readable):
    item = listed(1, 10, SegmentState.COMPLETED, 9, min_active_entry=3, min_active_slot=2)
    assert snapshot.readable_slot(item, entry_id, slot) == readable
    assert snapshot.readable_slot(None, entry_id, slot) is None  # no longer listed
    assert snapshot.readable_slot(replace(item, state=SegmentState.TRUNCATED), entry_id, slot) is None


@pytest.mark.parametrize("listing_segment, position, removed", [
    (None, (0, 0), True),  # dropped from the list
    (listed(1, 10, SegmentState.TRUNCATED, 9), (5, 0), True),
    (listed(1, 10, SegmentState.COMPLETED, 9, min_active_entry=6), (5, 0), True),  # below the point
    (listed(1, 10, SegmentState.COMPLETED, 9, min_active_entry=6), (6, 0), False),  # data loss
    (listed(1, 10, SegmentState.IN_PROGRESS), (0, 0), False),
])
def test_a_gone_ledger_is_truncation_only_when_the_list_says_so(listing_segment, position, removed):
    assert snapshot.removed_by_truncation(listing_segment, *position) is removed


# ------------------------------------------------------------------------------ positions


def test_earliest_and_latest_follow_segment_order_not_ledger_ids():
    assert snapshot.earliest(STREAM).cursor == Cursor(1, 0)
    assert snapshot.latest(STREAM) == Cursor(3, 3)
    assert snapshot.offset_of(STREAM, snapshot.latest(STREAM)) == Offset(90, 3, 0)
    assert snapshot.offset_of(STREAM, STREAM.end) is None


def test_the_end_of_a_completed_segment_continues_in_the_next_without_loss():
    assert snapshot.resolve(STREAM, Offset(40, 5, 0)) == Resolved(Cursor(2, 0))


def test_a_position_past_a_lagging_lac_waits_instead_of_reporting_loss():
    # the in-progress segment's snapshot ends at entry 3
    assert snapshot.resolve(STREAM, Offset(90, 5, 0)) == Resolved(Cursor(3, 5))


def test_a_removed_segment_that_was_fully_read_is_not_data_loss():
    view = StreamView("s", (segment(1, 40, 5, live=False), segment(2, 7, 5)))
    assert snapshot.resolve(view, Offset(40, 5, 0)) == Resolved(Cursor(2, 0))


@pytest.mark.parametrize("position, lost", [
    (Offset(40, 2, 0), "segment of ledger 40 was removed"),  # inside a removed segment
    (Offset(99, 0, 0), "ledger 99 is no longer in the stream"),  # unknown ledger
    (Offset(40, 9, 0), "past the end"),  # beyond a segment's end
])
def test_positions_in_removed_data_report_the_loss_and_move_to_the_earliest(position, lost):
    view = StreamView("s", (segment(1, 40, 5, live=False), segment(2, 7, 5)))
    resolved = snapshot.resolve(view, position)
    assert resolved.cursor == Cursor(2, 0) and lost in resolved.losses[0]


def test_skipping_over_a_removed_unread_segment_and_a_partial_truncation_is_loss():
    view = StreamView("s", (segment(1, 40, 5), segment(2, 7, 5, live=False), segment(3, 8, 5, min_active=(2, 3))))
    resolved = snapshot.resolve(view, Offset(40, 5, 0))
    assert resolved.cursor == Cursor(3, 2, 3)
    assert len(resolved.losses) == 2 and "segment 2 (ledger 7)" in resolved.losses[0]


def test_a_position_inside_an_entry_keeps_its_slot_and_the_next_entry_follows():
    assert snapshot.resolve(STREAM, Offset(40, 1, 4)) == Resolved(Cursor(1, 1, 4))
    assert snapshot.after_entry(STREAM, Cursor(1, 4, 2)) == Cursor(2, 0)  # off a completed segment's end


# ------------------------------------------------------------------------------ timestamps

# Three segments of 5 entries; entry e of segment i holds records stamped 1000*i + 100*e .. +90.
TIMED = StreamView("t", tuple(SegmentView(i + 1, 10 + i, True, i < 2, 0, 5, records=50 if i < 2 else None,
                                          last_timestamp_ms=1000 * i + 490 if i < 2 else None)
                              for i in range(3)))


def timed_max_ms(reads: list[tuple[int, int]]):
    def entry_max_ms(index: int, entry: int) -> int:
        reads.append((index, entry))
        return 1000 * index + 100 * entry + 90
    return entry_max_ms


@pytest.mark.parametrize("timestamp_ms, cursor", [
    (1195, Cursor(2, 2)),  # between entries 1 (..1190) and 2 (1200..) of the second segment
    (1150, Cursor(2, 1)),  # inside entry 1: that entry (the caller finds the slot)
    (0, Cursor(1, 0)),  # before the earliest record: the first entry
    (2490, Cursor(3, 4)),  # the last record of the in-progress segment
    (2491, None),  # after the latest record
])
def test_a_timestamp_resolves_to_the_first_entry_holding_a_record_at_or_after_it(timestamp_ms, cursor):
    reads: list[tuple[int, int]] = []
    assert snapshot.first_entry_at_or_after(TIMED, timestamp_ms, timed_max_ms(reads)) == cursor
    assert len(reads) <= 2 * 3  # segment metadata skips the early segments; log2(5) headers in one
    assert all(index + 1 >= (cursor.sequence if cursor else 3) for index, _ in reads)


def test_a_timestamp_search_starts_at_the_truncation_point():
    view = StreamView("t", (segment(1, 40, 5, min_active=(2, 3)),))
    found = snapshot.first_entry_at_or_after(view, 0, lambda index, entry: 100 * entry)
    assert found == Cursor(1, 2, 3)


@pytest.mark.parametrize("state, last_timestamp_ms, may_hold", [
    (SegmentState.COMPLETED, 999, False),
    (SegmentState.COMPLETED, 1000, True),
    (SegmentState.IN_PROGRESS, 0, True),  # its latest timestamp is not known yet
])
def test_a_segment_may_hold_a_timestamp_unless_its_metadata_says_every_record_is_earlier(
        state, last_timestamp_ms, may_hold):
    item = listed(1, 10, state, 9, last_timestamp_ms=last_timestamp_ms)
    assert snapshot.may_hold_at_or_after(item, 1000) is may_hold
    assert snapshot.may_hold_at_or_after(SegmentView.of(item, 9), 1000) is may_hold


# ------------------------------------------------------------------------------ in-progress counts


def header(first_record_index: int, record_count: int, max_timestamp_ms: int = 77) -> RecordSetHeader:
    return RecordSetHeader(1, Compression.NONE, record_count, first_record_index, 0, max_timestamp_ms, 0)


@pytest.mark.parametrize("lac, entry_header, entry_bytes, count", [
    (-1, None, 0, snapshot.TailCount(-1, 0, 0, None)),  # nothing confirmed
    (4, header(40, 10), 1000, snapshot.TailCount(4, 50, 5000, 77)),  # 100 bytes a record, 50 records
    (4, header(40, 0), 0, snapshot.TailCount(4, 40, 0, 77)),  # an entry without records: no estimate
])
def test_an_in_progress_segment_is_counted_from_its_lac_entry(lac, entry_header, entry_bytes, count):
    assert snapshot.tail_count(0, lac, entry_header, entry_bytes) == count


def test_records_before_an_offset_come_from_its_entry_header():
    assert snapshot.records_before_slot(header(40, 10), 3) == 43
