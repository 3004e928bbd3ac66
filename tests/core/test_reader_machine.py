"""The stream reader machine keeps L5 and L7: it reads ahead within its bounds, follows rolls even
when its consumer is slow (no notification is lost), never hands out records below a truncation
point (error or skip), and treats a vanished ledger as data loss unless truncation explains it."""

from __future__ import annotations

from dataclasses import replace

from dlog.core.effects import (
    CancelWait,
    OpenSegment,
    ReadEntries,
    ReaderOpened,
    ReadSegments,
    SetTimer,
    WaitForEntry,
    WakeReaders,
)
from dlog.core.errors import OffsetOutOfRangeError, TruncatedError
from dlog.core.reader import END, ReaderMachine, ReaderSettings, Start
from dlog.offsets import Offset
from dlog.segments.metadata import Segment, SegmentList, SegmentState

NOW = 5_000


def decode(ledger_id, entry_id, first_slot, payload, segment_first_position=None):
    """Payloads are records joined by b"|"; an item is (ledger, entry, first slot, records)."""
    records = payload.split(b"|")[first_slot:]
    return (ledger_id, entry_id, first_slot, records), 100 * len(records), len(records)


def reader(listing: SegmentList, start=Start.EARLIEST, **settings) -> tuple[ReaderMachine, list]:
    machine = ReaderMachine(ReaderSettings("orders", **settings), decode)
    assert machine.start(start, NOW) == [ReadSegments()]
    return machine, machine.on_segments(listing, NOW)


def completed(sequence, ledger_id, last_entry, **fields) -> Segment:
    return Segment(sequence, ledger_id, SegmentState.COMPLETED, last_entry=last_entry, **fields)


def taken(machine: ReaderMachine) -> list:
    items = []
    while True:
        item, _ = machine.take()
        if item is None:
            return items
        items.append(item)
        if item == END or isinstance(item, Exception):
            return items


def test_a_catch_up_read_walks_completed_segments_in_ranges_and_ends():
    listing = SegmentList((completed(1, 10, 1), completed(2, 20, 0)), 3, 2)
    machine, effects = reader(listing, follow=False)
    assert effects[0] == ReaderOpened() and effects[1] == OpenSegment(listing.segments[0])
    assert machine.on_segment_opened(10, -1, NOW) == [ReadEntries(listing.segments[0], 0, 1)]
    effects = machine.on_entries(10, [(0, b"a|b"), (1, b"c")], NOW)
    assert effects[0] == WakeReaders() and effects[1] == OpenSegment(listing.segments[1])
    machine.on_segment_opened(20, -1, NOW)
    machine.on_entries(20, [(0, b"d")], NOW)
    assert [item[3] for item in taken(machine)[:-1]] == [[b"a", b"b"], [b"c"], [b"d"]]
    assert machine.take()[0] == END


def test_read_ahead_holds_a_decoded_entry_that_would_pass_the_byte_bound():
    listing = SegmentList((completed(1, 10, 9),), 1, 1)
    machine, _ = reader(listing, follow=False, read_ahead_bytes=450)
    machine.on_segment_opened(10, -1, NOW)
    machine.on_entries(10, [(i, b"a|b") for i in range(10)], NOW)  # 200 bytes each
    assert machine.queued_entries == 2 and machine.held is not None and machine.queued_bytes == 400
    item, effects = machine.take()
    assert machine.queued_entries == 2 and effects == []  # the held one moved up; no read while full


def tailing(**settings) -> tuple[ReaderMachine, SegmentList]:
    listing = SegmentList((Segment(1, 10),), 1, 1)
    machine, _ = reader(listing, **settings)
    assert machine.on_segment_opened(10, 0, NOW) == [ReadEntries(listing.segments[0], 0, 0)]
    effects = machine.on_entries(10, [(0, b"a")], NOW)
    assert effects[-1] == WaitForEntry(listing.segments[0], 1, 1000)
    return machine, listing


def test_a_roll_notified_during_a_long_poll_cancels_it_and_is_followed():
    machine, listing = tailing()
    assert machine.on_segments_changed(NOW) == [CancelWait()]
    assert machine.on_waited(10, None, 0, False, NOW) == [ReadSegments()]
    rolled = SegmentList((completed(1, 10, 0), Segment(2, 20)), 2, 2)
    assert machine.on_segments(rolled, NOW) == [OpenSegment(rolled.segments[1])]


def test_a_slow_consumer_does_not_miss_a_roll_notified_while_its_queue_was_full():
    machine, listing = tailing(read_ahead_entries=2)
    assert machine.on_waited(10, (1, b"b"), 1, False, NOW) == []  # queue full: nothing started
    assert machine.on_segments_changed(NOW) == [ReadSegments()]  # the roll's notification: read at once
    rolled = SegmentList((completed(1, 10, 1), Segment(2, 20)), 2, 2)
    assert machine.on_segments(rolled, NOW) == []  # still no room: nothing more yet
    item, effects = machine.take()
    assert effects == [OpenSegment(rolled.segments[1])]  # room again: on to the next segment


def test_a_consumer_that_emptied_the_queue_during_a_list_read_is_woken_for_the_held_entry():
    """Found by a clean-clone run (test_2_a_slow_tailing_reader...): the consumer took the only
    queued entry while a list read was in flight and went to sleep; the list's answer moved the held
    entry into the queue without a wake, and the reader stalled for good."""
    listing = SegmentList((completed(1, 10, 2), Segment(2, 20)), 2, 2)
    machine, _ = reader(listing, read_ahead_entries=1)
    machine.on_segment_opened(10, -1, NOW)
    assert machine.on_entries(10, [(0, b"a"), (1, b"b"), (2, b"c")], NOW) == [WakeReaders()]
    assert machine.queued_entries == 1 and machine.held is not None  # full: the next one waits for room
    assert machine.on_segments_changed(NOW) == [ReadSegments()]  # a roll elsewhere: the list is stale
    item, effects = machine.take()
    assert item[3] == [b"a"] and effects == [] and machine.queued_entries == 0  # the consumer now sleeps
    effects = machine.on_segments(listing, NOW)
    assert WakeReaders() in effects and machine.queued_entries == 1
    assert [item[3] for item in taken(machine)] == [[b"b"], [b"c"]]


def test_a_long_poll_that_finds_the_ledger_closed_reads_the_list():
    machine, listing = tailing()
    assert machine.on_waited(10, None, 0, True, NOW) == [ReadSegments()]


def test_empty_polls_read_the_list_now_and_then_so_a_lost_notification_cannot_stall_a_reader():
    machine, listing = tailing()
    effects = []
    for _ in range(5):
        effects = machine.on_waited(10, None, 0, False, NOW)
    assert effects == [ReadSegments()]


def test_a_truncation_past_a_reader_inside_the_in_progress_segment_is_an_error_not_old_records():
    machine, listing = tailing()
    machine.on_waited(10, (1, b"b"), 1, False, NOW)
    machine.on_segments_changed(NOW)
    moved = SegmentList((replace(listing.segments[0], min_active_entry=3),), 2, 1)
    machine.on_waited(10, None, 1, False, NOW)
    machine.on_segments(moved, NOW)
    items = taken(machine)
    assert isinstance(items[-1], TruncatedError) and len(items) == 1  # entries 0 and 1 never handed out (bug 5)


def test_with_skip_truncated_the_reader_moves_to_the_truncation_point():
    machine, listing = tailing(skip_truncated=True)
    machine.on_segments_changed(NOW)
    machine.on_waited(10, None, 0, False, NOW)
    moved = SegmentList((replace(listing.segments[0], min_active_entry=3, min_active_slot=1),), 2, 1)
    effects = machine.on_segments(moved, NOW)
    assert taken(machine) == [] and machine.position.entry_id == 3 and machine.position.slot == 1
    assert effects == [WaitForEntry(moved.segments[0], 3, 1000)]


def test_a_deleted_ledger_that_truncation_does_not_explain_is_data_loss():
    listing = SegmentList((completed(1, 10, 3), completed(2, 20, 0)), 2, 2)
    machine, _ = reader(listing, follow=False)
    assert machine.on_ledger_missing(10, NOW) == [ReadSegments()]
    machine.on_segments(listing, NOW)
    assert isinstance(taken(machine)[-1], TruncatedError)
    machine, _ = reader(listing, follow=False, skip_truncated=True)
    machine.on_ledger_missing(10, NOW)
    assert machine.on_segments(listing, NOW) == [OpenSegment(listing.segments[1])]


def test_start_positions_refuse_unknown_truncated_and_future_offsets():
    listing = SegmentList((completed(1, 10, 3, min_active_entry=2), Segment(2, 20)), 2, 2)
    assert isinstance(reader(listing, Offset(99, 0))[1][0].error, OffsetOutOfRangeError)
    assert isinstance(reader(listing, Offset(10, 1))[1][0].error, TruncatedError)
    machine, effects = reader(listing, Offset(20, 7))
    assert effects == [OpenSegment(listing.segments[1])]
    assert isinstance(machine.on_segment_opened(20, 3, NOW)[0].error, OffsetOutOfRangeError)
    machine, effects = reader(listing, Start.LATEST)
    assert machine.on_segment_opened(20, 3, NOW)[0] == ReaderOpened() and machine.position.entry_id == 4


def test_an_idle_follower_looks_at_the_list_again_after_a_while():
    listing = SegmentList((), 0, 0)
    machine, effects = reader(listing)
    assert effects == [ReaderOpened(), SetTimer(NOW + 5000)]
    assert machine.on_time(NOW + 5000) == [ReadSegments()]
