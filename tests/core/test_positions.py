"""Stream positions (V4) as pure rules: every segment is positioned where the one before it ends
when it is created (a writer's open, a roll, a takeover's open after sealing, a sink's commit),
a stream from before positions gets them at its next open, truncation and retention never move
them, and a position resolves to (segment, entry, slot) by binary search, or is told removed, at
the end, in the future or unknown."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bookkeeper.errors import ConfigError, CorruptMetadataError
from dlog.core import changes
from dlog.core.effects import AppendEntry, CommitSegments, CompleteChunks, CreateLedger, SealSegment, WriterOpened
from dlog.core.settings import WriterSettings
from dlog.core.snapshot import (
    Cursor,
    PositionAt,
    RecordSearch,
    SegmentView,
    StreamView,
    located,
    lookup_position,
)
from dlog.core.writer import WriterMachine
from dlog.offsets import Offset
from dlog.segments.codec import Compression, RecordSetHeader
from dlog.segments.metadata import Segment, SegmentList, SegmentState

NOW = 1_000
COMPLETED, TRUNCATED, IN_PROGRESS = SegmentState.COMPLETED, SegmentState.TRUNCATED, SegmentState.IN_PROGRESS


def done(sequence: int, ledger: int, records: int, first_position: int | None = None,
         state: SegmentState = COMPLETED) -> Segment:
    return Segment(sequence, ledger, state, last_entry=max(0, records - 1), records=records,
                   first_position=first_position)


def listing(*segments: Segment) -> SegmentList:
    return SegmentList(segments, 7, max((s.sequence for s in segments), default=0))


# ---------------------------------------------------------------------------------- assignment


@pytest.mark.parametrize("segments, created, expected", [
    # a new stream's first segment starts at 0
    ((), [0], [0]),
    # a writer's open after completed segments: where the last one ends
    ((done(1, 10, 5, 0), done(2, 11, 7, 5)), [0], [12]),
    # a tombstone still counts: positions are never reused after truncation
    ((done(1, 10, 5, 0, TRUNCATED), done(2, 11, 7, 5)), [0], [12]),
    # a sink's commit: its completed task segments one after the other, in partition order
    ((done(1, 10, 5, 0),), [3, 4], [5, 8]),
])
def test_a_created_segment_starts_where_the_one_before_it_ends(segments, created, expected):
    # a writer creates one empty in-progress segment; a sink completed ones with their records
    new = [Segment(10 + index, 100 + index, COMPLETED if records else IN_PROGRESS, records=records)
           for index, records in enumerate(created)]
    change = changes.append_change(listing(*segments), new)
    assert [s.first_position for s in change.create] == expected
    assert change.update == ()  # nothing to migrate


@pytest.mark.parametrize("before, after", [
    # written before positions existed: 0 at the earliest listed segment, cumulative after it
    ([None, None, None], [0, 5, 12]),
    # an older client rewrote one segment without its position: restored from its neighbour
    ([0, None, 12], [0, 5, 12]),
    # the known one is later: the ones before it are derived backwards
    ([None, None, 112], [100, 105, 112]),
])
def test_positions_missing_from_listed_segments_are_assigned_in_the_same_change(before, after):
    records = [5, 7, 3]
    segments = [done(index + 1, 10 + index, count, position)
                for index, (count, position) in enumerate(zip(records, before))]
    change = changes.append_change(listing(*segments), [Segment(9, 99)])
    assigned = {s.sequence: s.first_position for s in change.update}
    assert assigned == {index + 1: position for index, (position, old) in enumerate(zip(after, before))
                        if old is None}
    assert change.create[0].first_position == after[-1] + records[-1]
    migrated = change.applied_to(listing(*segments))
    assert [s.first_position for s in migrated.segments] == [*after, after[-1] + records[-1]]


def test_positions_that_would_start_below_zero_are_corrupt_metadata_not_a_guess():
    with pytest.raises(CorruptMetadataError, match="start below 0"):
        changes.positioned([done(1, 10, 50), done(2, 11, 5, 20)])


def test_a_roll_positions_the_next_segment_after_the_records_of_the_completed_one():
    completed = done(3, 12, 40, 1000)
    change = changes.roll_change(completed, Segment(4, 13))
    assert change.update == (completed,) and change.create[0].first_position == 1040


def test_truncation_and_retention_keep_every_position():
    segments = listing(done(1, 10, 5, 0), done(2, 11, 7, 5), Segment(3, 12, first_position=12))
    change, marked = changes.truncation_change(segments, Offset(11, 3, 1), target_end_entry=6, stream="s")
    after = change.applied_to(segments)
    assert [s.first_position for s in after.segments] == [0, 5, 12] and marked[0].is_truncated
    retained = changes.retention_change([after.segments[1]]).applied_to(after)
    assert [s.first_position for s in retained.segments] == [0, 5, 12]
    assert changes.next_position(retained.segments[:2]) == 12  # a later segment still starts at 12


class Story:
    """A writer machine answered by hand against one segment list."""

    def __init__(self, segments: SegmentList, **settings: int) -> None:
        def encode(items, first_record_index):
            return b"|".join(items), NOW, NOW

        self.machine = WriterMachine(WriterSettings("s", **settings), encode)
        self.listing = segments
        self.next_ledger = 50

    def commit(self, effects):
        change = next(e for e in effects if isinstance(e, CommitSegments)).change
        self.listing = change.applied_to(self.listing)
        return self.machine.on_committed(self.listing, NOW)

    def open(self, sealed_records: int | None = None):
        self.machine.open(NOW)
        self.machine.on_locked(True, NOW)
        effects = self.machine.on_segments(self.listing, NOW)
        if effects == [SealSegment(self.listing.segments[-1])]:  # a takeover: recover the previous one
            previous = self.listing.segments[-1]
            sealed = previous.completed(4, sealed_records or 0, 100, NOW, NOW, NOW)
            effects = self.commit(self.machine.on_sealed(previous, sealed, True, NOW))
        assert effects == [CreateLedger()]
        self.next_ledger += 1
        return self.commit(self.machine.on_ledger_created(self.next_ledger, NOW))


def test_a_writer_positions_its_first_segment_its_rolls_and_its_acknowledgements():
    story = Story(listing(done(1, 10, 5, 0)), roll_records=2)
    opened = next(e for e in story.open() if isinstance(e, WriterOpened))
    assert opened.segment.first_position == 5
    story.machine.write(b"a", 20, "a", NOW)
    acked = story.machine.on_entry_acked(51, 0, NOW)
    assert next(e for e in acked if isinstance(e, CompleteChunks)).first_position == 5
    story.machine.write(b"b", 20, "b", NOW)  # the second record: the roll is due after it
    story.machine.write(b"c", 20, "c", NOW)
    story.machine.on_ledger_created(52, NOW)
    story.commit(story.machine.on_entry_acked(51, 1, NOW))
    assert [s.first_position for s in story.listing.segments] == [0, 5, 7]
    effects = story.machine.on_entry_acked(52, 0, NOW)
    assert next(e for e in effects if isinstance(e, CompleteChunks)) == CompleteChunks(52, 0, ("c",), (1,), 7)


def test_a_takeover_positions_its_segment_after_the_records_recovery_found():
    story = Story(listing(done(1, 10, 5, 0), Segment(2, 11, first_position=5)))
    opened = next(e for e in story.open(sealed_records=30) if isinstance(e, WriterOpened))
    assert story.listing.by_sequence(2).records == 30 and story.listing.by_sequence(2).first_position == 5
    assert opened.segment.first_position == 35


def test_the_first_writer_of_a_stream_from_before_positions_migrates_it_in_its_open():
    story = Story(listing(done(1, 10, 5), Segment(2, 11)))  # no positions, one in progress
    effects = story.open(sealed_records=8)
    assert [s.first_position for s in story.listing.segments] == [0, 5, 13]
    assert next(e for e in effects if isinstance(e, WriterOpened)).segment.first_position == 13
    assert not any(isinstance(e, AppendEntry) for e in effects)


# ---------------------------------------------------------------------------------- resolution


def view_of(*segments: SegmentView) -> StreamView:
    return StreamView("s", segments)


def seg(sequence: int, first_position: int | None, records: int | None, *, entries: int = 10, live: bool = True,
        completed: bool = True, min_active: tuple[int, int] = (0, 0)) -> SegmentView:
    return SegmentView(sequence, 100 + sequence, live, completed, 0, entries, *min_active, records=records,
                       first_position=first_position)


# positions: [0, 50) truncated, [50, 80), an empty segment at 80, [80, 120) in progress (3 at its LAC)
STREAM = view_of(seg(1, 0, 50, live=False), seg(2, 50, 30), seg(3, 80, 0, entries=0),
                 seg(4, 80, None, completed=False))


@pytest.mark.parametrize("position, tail, at, index, record_index", [
    (0, 40, PositionAt.REMOVED, 0, 0),  # in a truncated segment
    (49, 40, PositionAt.REMOVED, 0, 0),
    (50, 40, PositionAt.RECORD, 1, 0),
    (79, 40, PositionAt.RECORD, 1, 29),
    (80, 40, PositionAt.RECORD, 3, 0),  # the empty segment shares 80 with the next: passed over
    (119, 40, PositionAt.RECORD, 3, 39),
    (120, 40, PositionAt.END, -1, 0),  # the next record written gets 120
    (121, 40, PositionAt.FUTURE, -1, 0),
    (80, 0, PositionAt.END, -1, 0),  # nothing confirmed in progress yet
])
def test_a_position_finds_its_segment_by_the_list_alone(position, tail, at, index, record_index):
    lookup = lookup_position(STREAM, position, tail)
    assert (lookup.at, lookup.index, lookup.record_index) == (at, index, record_index)
    assert lookup.end_position == 80 + tail


def test_below_the_first_listed_segment_is_removed_and_an_empty_stream_ends_at_zero():
    trimmed = view_of(seg(5, 1000, 10))  # the tombstones before it were trimmed
    assert lookup_position(trimmed, 999, None).at is PositionAt.REMOVED
    assert lookup_position(view_of(), 0, None).at is PositionAt.END
    assert lookup_position(view_of(), 1, None).at is PositionAt.FUTURE


def test_a_stream_without_positions_is_told_unknown():
    assert lookup_position(view_of(seg(1, None, 5)), 0, None).at is PositionAt.UNKNOWN


def header(first_record_index: int, count: int) -> RecordSetHeader:
    return RecordSetHeader(1, Compression.NONE, count, first_record_index, 0, 0, 100)


@pytest.mark.parametrize("counts", [[1], [3, 1, 4, 1, 5, 9, 2, 6], [1000] * 7, list(range(1, 200))])
def test_every_record_is_found_by_binary_search_over_entry_headers(counts):
    firsts = [sum(counts[:index]) for index in range(len(counts))]
    bound = math.ceil(math.log2(len(counts))) if len(counts) > 1 else 0
    for record_index in range(sum(counts)):
        search = RecordSearch(0, len(counts), record_index)
        while (probe := search.probe) is not None:
            search.answer(firsts[probe])
        entry_id = search.entry_id
        assert firsts[entry_id] <= record_index < firsts[entry_id] + counts[entry_id]
        assert search.probes <= bound


def test_a_found_record_becomes_a_cursor_and_its_offset_unless_truncation_passed_it():
    view = view_of(seg(1, 500, 40, entries=4, min_active=(2, 3)))
    lookup = lookup_position(view, 527, None)  # record 27: entry 2 holds 20..29
    found = located(view, lookup, 2, header(20, 10))
    assert found.at is PositionAt.RECORD and found.cursor == Cursor(1, 2, 7)
    assert found.offset == Offset(101, 2, 7) and found.offset.position == 527
    below = located(view, lookup_position(view, 522, None), 2, header(20, 10))  # slot 2 < the point's 3
    assert below.at is PositionAt.REMOVED and below.cursor is None


# ---------------------------------------------------------------------------------- stored forms


def test_a_segment_node_from_before_positions_reads_as_unknown_and_a_bad_one_fails_closed():
    old = Segment(3, 12, COMPLETED, records=4).to_json()
    del old["first_position"]
    import json

    assert Segment.from_bytes(json.dumps(old).encode()).first_position is None
    assert Segment.from_bytes(Segment(3, 12, first_position=77).to_bytes()).first_position == 77
    for bad in (-1, "7", 2**63, 1.5):
        with pytest.raises(CorruptMetadataError, match="first position"):
            Segment.from_bytes(json.dumps({**old, "first_position": bad}).encode())


def test_an_offset_is_the_same_record_whatever_position_it_carries_and_refuses_a_bad_one():
    assert Offset(1, 2, 3, 40) == Offset(1, 2, 3) and hash(Offset(1, 2, 3, 40)) == hash(Offset(1, 2, 3))
    assert str(Offset(1, 2, 3, 40)) == "1:2:3" and Offset(1, 2, 3, 40).to_json() == {"ledger": 1, "entry": 2, "slot": 3}
    with pytest.raises(ConfigError, match="bad offset position -1"):
        Offset(1, 2, 3, -1)
    assert replace(Offset(1, 2, 3), position=9).position == 9
