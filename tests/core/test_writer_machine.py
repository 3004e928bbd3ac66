"""The stream writer machine keeps L1-L4 and L7: it seals before writing, sends at once when idle and
batches while busy, rolls by one compare-and-set, merges concurrent list changes instead of dying,
ends every chunk (acknowledged or failed) and every waiter it was handed, fails loudly when a ledger
of its is deleted under it, and aborts without waiting."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bookkeeper.errors import InvariantError, LedgerFencedError, NoSuchLedgerError, NotEnoughBookiesError
from dlog.core.effects import (
    AppendEntry,
    ApplyRetention,
    CloseLedger,
    CommitSegments,
    CompleteChunks,
    CompleteFlushes,
    ConfirmLedgerDeleted,
    CreateLedger,
    DeleteLedger,
    FailChunks,
    LockStream,
    ReadSegments,
    ReleaseLock,
    RequestRound,
    SealSegment,
    SetTimer,
    WakeWriters,
    WriterClosed,
    WriterOpened,
)
from dlog.core.errors import LedgerDeletedError, WriterAbortedError, WriterFencedError, WriterLockedError
from dlog.core.settings import WriterSettings, entry_budget_bytes
from dlog.core.writer import WriterMachine, WriterState
from dlog.segments.metadata import Segment, SegmentList, SegmentState

STREAM = "orders"


def encode(items, first_record_index):
    """A stand-in for the record-set codec: items are (value, timestamp)."""
    payload = b"|".join(value for value, _ in items)
    return payload, min(ts for _, ts in items), max(ts for _, ts in items)


def of(effects, kind):
    return [effect for effect in effects if isinstance(effect, kind)]


def one(effects, kind):
    found = of(effects, kind)
    assert len(found) == 1, effects
    return found[0]


class Story:
    """A writer machine and the segment list it talks to, answered by hand."""

    def __init__(self, listing: SegmentList | None = None, **settings) -> None:
        self.machine = WriterMachine(WriterSettings(STREAM, **settings), encode)
        self.listing = listing or SegmentList((), 0, 0)
        self.now_ms = 1_000
        self.next_ledger = 10

    def commit(self, effects):
        """Apply the one CommitSegments among `effects` to the list and answer the machine."""
        change = one(effects, CommitSegments)
        assert change.based_on.version == self.listing.version
        self.listing = change.change.applied_to(self.listing)
        return self.machine.on_committed(self.listing, self.now_ms)

    def open(self, **answers):
        effects = self.machine.open(self.now_ms)
        assert effects == [LockStream(30.0)]
        effects = self.machine.on_locked(answers.get("locked", True), self.now_ms)
        assert effects == [ReadSegments()]
        return self.machine.on_segments(self.listing, self.now_ms)

    def opened(self, **settings) -> list:
        effects = self.open()
        assert effects == [CreateLedger()]
        effects = self.machine.on_ledger_created(self.new_ledger(), self.now_ms)
        return self.commit(effects)

    def new_ledger(self) -> int:
        self.next_ledger += 1
        return self.next_ledger

    def write(self, value: bytes):
        """Write a record whose waiter is its value."""
        return self.machine.write((value, self.now_ms), len(value) + 17, value, self.now_ms)


# ---------------------------------------------------------------------------------- opening (L1, L4)


def test_open_creates_a_ledger_and_commits_it_as_the_one_in_progress_segment():
    story = Story()
    effects = story.opened()
    opened = one(effects, WriterOpened)
    assert opened.error is None and opened.segment == Segment(1, 11, created_ms=1_000, first_position=0)
    assert story.listing.in_progress == opened.segment and story.machine.state is WriterState.OPEN


def test_open_seals_the_previous_writers_segment_before_anything_else():
    previous = Segment(3, 7, min_active_entry=2)
    story = Story(SegmentList((Segment(2, 6, SegmentState.COMPLETED, last_entry=9), previous), 5, 3))
    effects = story.open()
    assert effects == [SealSegment(previous)]
    sealed = previous.completed(41, 300, 9000, 1, 2, story.now_ms)
    effects = story.machine.on_sealed(previous, sealed, True, story.now_ms)
    effects = story.commit(effects)
    assert effects == [CreateLedger()]  # only after the seal is committed
    assert story.listing.by_sequence(3) == sealed  # its truncation point kept
    story.commit(story.machine.on_ledger_created(story.new_ledger(), story.now_ms))
    assert [s.sequence for s in story.listing.segments] == [2, 3, 4]


def test_an_empty_previous_segment_is_dropped_and_its_ledger_deleted_after_the_commit():
    previous = Segment(1, 7)
    story = Story(SegmentList((previous,), 1, 1))
    story.open()
    effects = story.machine.on_sealed(previous, None, True, story.now_ms)
    assert not of(effects, DeleteLedger)  # not before the list says so
    effects = story.commit(effects)
    assert effects[0] == DeleteLedger(7) and effects[1] == CreateLedger()
    story.commit(story.machine.on_ledger_created(story.new_ledger(), story.now_ms))
    assert [s.sequence for s in story.listing.segments] == [2]  # L4: sequences still increase


def test_a_live_writer_lock_refuses_an_open_without_takeover():
    story = Story()
    story.machine.open(story.now_ms)
    effects = story.machine.on_locked(False, story.now_ms)
    assert isinstance(one(effects, WriterOpened).error, WriterLockedError)
    assert not of(effects, ReleaseLock)  # nothing was taken


def test_a_takeover_goes_on_without_the_lock_and_a_lost_race_plans_again():
    story = Story(takeover=True)
    story.machine.open(story.now_ms)
    assert story.machine.on_locked(False, story.now_ms) == [ReadSegments()]
    story.machine.on_segments(story.listing, story.now_ms)
    effects = story.machine.on_ledger_created(story.new_ledger(), story.now_ms)
    rival = Segment(1, 99)  # another writer committed first
    story.listing = SegmentList((rival,), 1, 1)
    effects = story.machine.on_commit_conflict(story.listing, story.now_ms)
    # its own ledger is dropped (an attempt may have landed and been sealed since): fence the rival
    assert effects == [DeleteLedger(11), SealSegment(rival)]
    effects = story.commit(story.machine.on_sealed(rival, rival.completed(0, 1, 10, 1, 1, 1), True, story.now_ms))
    assert effects == [CreateLedger()]
    effects = story.commit(story.machine.on_ledger_created(story.new_ledger(), story.now_ms))
    assert one(effects, WriterOpened).segment.ledger_id == 12


# ---------------------------------------------------------------------------------- batching


def test_an_idle_writer_sends_at_once_and_a_busy_one_batches_until_an_ack():
    story = Story()
    story.opened()
    first = story.write(b"a")
    assert one(first, AppendEntry).payload == b"a"  # nothing in flight: out at once
    assert story.write(b"b") == () and story.write(b"c") == ()  # one entry in flight: they wait
    effects = story.machine.on_entry_acked(11, 0, story.now_ms)
    assert effects[0] == CompleteChunks(11, 0, (b"a",), (1,), first_position=0)
    assert one(effects, AppendEntry) == AppendEntry(11, 1, b"b|c")  # the two batched
    assert one(story.machine.on_entry_acked(11, 1, story.now_ms), CompleteChunks).waiters == (b"b", b"c")


def test_a_flush_ends_once_everything_written_before_it_ended():
    story = Story()
    story.opened()
    assert story.machine.flush(story.now_ms, "idle") == [CompleteFlushes(("idle",))]  # nothing pending
    story.write(b"a")
    story.write(b"b")
    assert not of(story.machine.flush(story.now_ms, "flush"), CompleteFlushes)
    assert not of(story.machine.on_entry_acked(11, 0, story.now_ms), CompleteFlushes)  # b is still out
    effects = story.machine.on_entry_acked(11, 1, story.now_ms)
    assert one(effects, CompleteFlushes).waiters == ("flush",)


def test_a_full_entry_goes_out_even_while_one_is_in_flight():
    story = Story(flush_records=3)
    story.opened()
    story.write(b"a")
    story.write(b"b")
    story.write(b"c")
    effects = story.write(b"d")
    assert one(effects, AppendEntry).payload == b"b|c|d"


def test_linger_holds_a_partial_entry_until_its_timer():
    story = Story(linger_ms=5)
    story.opened()
    effects = story.write(b"a")
    assert of(effects, AppendEntry) == [] and one(effects, SetTimer).at_ms == story.now_ms + 5
    story.now_ms += 5
    assert one(story.machine.on_time(story.now_ms), AppendEntry).payload == b"a"


# ---------------------------------------------------------------------------------- flush rounds


def test_with_flush_rounds_the_records_of_one_turn_wait_for_the_round_and_go_out_together():
    story = Story(flush_rounds=True)
    story.opened()
    assert story.write(b"a") == (RequestRound(),)  # a slot is free: the round, not an entry now
    assert story.write(b"b") == () and story.write(b"c") == ()  # asked once until the round runs
    assert one(story.machine.on_round(story.now_ms), AppendEntry) == AppendEntry(11, 0, b"a|b|c")
    assert story.write(b"d") == ()  # one entry in flight: Nagle's rule as without rounds
    effects = story.machine.on_entry_acked(11, 0, story.now_ms)
    assert one(effects, CompleteChunks).waiters == (b"a", b"b", b"c")
    assert of(effects, AppendEntry) == [] and one(effects, RequestRound) == RequestRound()  # "d" waits for it
    story.write(b"e")  # arrives in the same turn: rides along
    assert one(story.machine.on_round(story.now_ms), AppendEntry) == AppendEntry(11, 1, b"d|e")
    assert not story.machine.on_round(story.now_ms)  # a round with nothing to send sends nothing


def test_many_writers_buffered_records_go_out_in_one_shared_round():
    """What a driver does with 1,000 writers: every write only buffers (each writer asks for the
    round once), and the one round then sends each writer's records of that turn as one entry."""
    stories = [Story(flush_rounds=True) for _ in range(50)]
    for story in stories:
        story.opened()
    asked = []
    for turn_record in (b"x", b"y", b"z"):
        for story in stories:
            effects = story.write(turn_record)
            assert not of(effects, AppendEntry)
            asked += of(effects, RequestRound)
    assert len(asked) == len(stories)  # one request per writer, whatever its records
    entries = [one(story.machine.on_round(story.now_ms), AppendEntry) for story in stories]
    assert {entry.payload for entry in entries} == {b"x|y|z"}


def test_with_flush_rounds_a_full_entry_a_flush_and_a_close_do_not_wait_for_the_round():
    story = Story(flush_rounds=True, flush_records=3)
    story.opened()
    story.write(b"a")
    story.write(b"b")
    assert one(story.write(b"c"), AppendEntry).payload == b"a|b|c"  # full: out at once
    story.write(b"d")
    flushed = story.machine.flush(story.now_ms, "flush")
    assert one(flushed, AppendEntry).payload == b"d"
    story.write(b"e")
    assert one(story.machine.close(story.now_ms), AppendEntry).payload == b"e"
    assert not of(story.machine.on_round(story.now_ms), AppendEntry)  # the round asked before finds it all sent


def test_a_round_after_the_writer_failed_or_while_it_rolls_sends_nothing():
    story = Story(flush_rounds=True, roll_records=1)
    story.opened()
    story.write(b"a")
    effects = story.machine.on_round(story.now_ms)
    assert one(effects, AppendEntry).payload == b"a" and one(effects, CreateLedger)  # the roll is due
    story.write(b"b")
    assert not of(story.machine.on_round(story.now_ms), AppendEntry)  # rolling: "b" waits for the commit
    story.machine.on_entry_failed(11, 0, NotEnoughBookiesError("gone"), story.now_ms)
    assert not story.machine.on_round(story.now_ms)


def test_no_entry_is_larger_than_the_roll_size_and_an_oversized_record_is_refused():
    story = Story(roll_bytes=4096)
    story.opened()
    budget = entry_budget_bytes(4096)
    batcher = story.machine.batcher
    assert batcher.budget_bytes == budget and batcher.check_record(budget + 1) is not None
    value = b"x" * 500
    appended = []
    for _ in range(30):
        appended += of(story.write(value), AppendEntry)
        while batcher.in_flight and not story.machine.rolling:
            entry = batcher.in_flight[0]
            appended += of(story.machine.on_entry_acked(entry.ledger_id, entry.entry_id, story.now_ms), AppendEntry)
    assert appended and all(len(effect.payload) <= 4096 for effect in appended)
    assert story.machine.rolling  # the segment reached its roll size


# ---------------------------------------------------------------------------------- rolling (L2)


def roll_story(**settings) -> Story:
    story = Story(roll_records=2, **settings)
    story.opened()
    story.write(b"a")
    story.machine.on_entry_acked(11, 0, story.now_ms)
    effects = story.write(b"b")  # the second record: the roll is due after this entry
    assert one(effects, AppendEntry).entry_id == 1 and one(effects, CreateLedger)
    assert story.write(b"c") == ()  # rolling: buffered
    return story


def test_a_roll_creates_the_next_ledger_then_commits_both_changes_at_once_then_closes_the_old():
    story = roll_story()
    assert not story.machine.on_ledger_created(story.new_ledger(), story.now_ms)  # entry 1 in flight
    effects = story.machine.on_entry_acked(11, 1, story.now_ms)
    commit = one(effects, CommitSegments)
    assert [s.state for s in commit.change.update] == [SegmentState.COMPLETED] and commit.change.create
    assert commit.change.update[0].last_entry == 1 and commit.change.update[0].records == 2
    effects = story.commit(effects)
    assert effects[0] == CloseLedger(11)  # only after the list names the new segment
    assert one(effects, AppendEntry) == AppendEntry(12, 0, b"c")
    assert [s.state for s in story.listing.segments] == [SegmentState.COMPLETED, SegmentState.IN_PROGRESS]


def test_a_truncation_during_a_roll_is_merged_and_its_point_survives():
    story = roll_story()
    story.machine.on_ledger_created(story.new_ledger(), story.now_ms)
    effects = story.machine.on_entry_acked(11, 1, story.now_ms)
    truncated = replace(story.listing.segments[0], min_active_entry=1, min_active_slot=0)
    story.listing = SegmentList((truncated,), story.listing.version + 1, 1)  # truncation won the race
    effects = story.machine.on_commit_conflict(story.listing, story.now_ms)
    assert not of(effects, FailChunks)
    story.commit(effects)
    completed = story.listing.segments[0]
    assert completed.state is SegmentState.COMPLETED and completed.min_active_entry == 1  # kept (bug 1)


def test_retention_on_roll_runs_after_the_roll_without_ending_the_writer():
    story = roll_story(retention_on_roll=True)
    story.machine.on_ledger_created(story.new_ledger(), story.now_ms)
    effects = story.commit(story.machine.on_entry_acked(11, 1, story.now_ms))
    assert one(effects, ApplyRetention) and story.machine.state is WriterState.OPEN


def test_a_change_whose_answer_was_lost_and_that_landed_counts_as_committed():
    story = roll_story()
    story.machine.on_ledger_created(story.new_ledger(), story.now_ms)
    commit = one(story.machine.on_entry_acked(11, 1, story.now_ms), CommitSegments)
    story.listing = commit.change.applied_to(story.listing)  # it landed; the answer was lost
    effects = story.machine.on_commit_conflict(story.listing, story.now_ms)
    assert one(effects, CloseLedger) == CloseLedger(11) and not of(effects, FailChunks)


def test_a_segment_sealed_by_someone_else_is_a_takeover_and_the_new_ledger_is_not_leaked():
    story = roll_story()
    story.machine.on_ledger_created(story.new_ledger(), story.now_ms)
    story.machine.on_entry_acked(11, 1, story.now_ms)
    sealed = story.listing.segments[0].completed(1, 2, 10, 1, 1, 1)
    story.listing = SegmentList((sealed, Segment(2, 50)), story.listing.version + 2, 2)
    effects = story.machine.on_commit_conflict(story.listing, story.now_ms)
    failed = one(effects, FailChunks)
    assert isinstance(failed.error, WriterFencedError) and failed.waiters == (b"c",)
    assert DeleteLedger(12) in effects and WakeWriters() in effects


def test_a_batch_lands_in_one_segment_even_when_the_roll_falls_due_inside_it():
    story = Story(roll_records=2)
    story.opened()
    effects = story.machine.write_group([((b"p%d" % i, 1), 1, 10) for i in range(4)], "batch", story.now_ms)
    assert [e.entry_id for e in of(effects, AppendEntry)] == [0, 1, 2, 3]  # all four, then the roll
    assert one(effects, CreateLedger)
    assert one(story.machine.on_entry_acked(11, 0, story.now_ms), CompleteChunks).waiters == ("batch",)


# ---------------------------------------------------------------------------------- ending (L7)


def test_a_fenced_append_fails_every_pending_chunk_and_wakes_parked_writers():
    story = Story(buffer_bytes_max=100)
    story.opened()
    story.write(b"a" * 60)
    story.write(b"b" * 60)  # buffered, and now the buffer is full
    assert not story.machine.writable
    effects = story.machine.on_entry_failed(11, 0, LedgerFencedError("fenced"), story.now_ms)
    failed = one(effects, FailChunks)
    assert failed.waiters == (b"a" * 60, b"b" * 60)  # in flight and buffered
    assert isinstance(failed.error, WriterFencedError)
    assert WakeWriters() in effects and story.machine.state is WriterState.FAILED  # bug 3
    assert story.machine.close(story.now_ms) == [ReleaseLock(), WriterClosed()]


def test_a_ledger_created_after_the_writer_failed_and_closed_is_deleted_not_committed():
    """Found by the stream simulator once its writers lingered: fenced mid-roll, then closed by
    the application, the writer still committed the roll when the new ledger arrived, completing
    its segment at entries the fenced ledger never stored (readers then failed on them)."""
    story = roll_story()  # entry 1 of ledger 11 in flight, ledger 12 being created
    story.machine.on_entry_failed(11, 1, LedgerFencedError("fenced"), story.now_ms)
    assert story.machine.close(story.now_ms) == [ReleaseLock(), WriterClosed()]
    assert story.machine.on_ledger_created(story.new_ledger(), story.now_ms) == [DeleteLedger(12)]


def test_a_failed_roll_fails_the_records_buffered_behind_it():
    story = roll_story()
    effects = story.machine.on_operation_failed(NotEnoughBookiesError("no bookies"), story.now_ms)
    failed = one(effects, FailChunks)
    assert failed.waiters == (b"b", b"c") and isinstance(failed.error, NotEnoughBookiesError)  # bug 4


def test_close_sends_what_is_buffered_completes_the_segment_closes_and_unlocks():
    story = Story()
    story.opened()
    story.write(b"a")
    story.write(b"b")
    effects = story.machine.close(story.now_ms)
    assert one(effects, AppendEntry).payload == b"b"  # forced out, partial
    story.machine.on_entry_acked(11, 0, story.now_ms)
    effects = story.machine.on_entry_acked(11, 1, story.now_ms)
    effects = story.commit(effects)
    assert effects == [CloseLedger(11)]
    assert story.listing.segments[0].state is SegmentState.COMPLETED and story.listing.segments[0].records == 2
    effects = story.machine.on_ledger_closed(11, None, story.now_ms)
    assert effects[0] == ReleaseLock() and WriterClosed() in effects


def test_closing_a_writer_that_wrote_nothing_drops_its_segment_and_deletes_its_ledger():
    story = Story()
    story.opened()
    story.commit(story.machine.close(story.now_ms))
    assert story.listing.segments == ()
    effects = story.machine.on_ledger_closed(11, None, story.now_ms)
    assert effects[0] == DeleteLedger(11) and WriterClosed() in effects


def test_answers_out_of_order_are_a_bug_that_raises():
    story = Story()
    story.opened()
    story.write(b"a")
    with pytest.raises(InvariantError):
        story.machine.on_entry_acked(11, 5, story.now_ms)


def test_a_linger_that_passes_during_a_roll_sets_no_timer_in_the_past():
    """Found by the stream simulator: the timer fired again at once, forever, until the roll ended."""
    story = Story(roll_records=1, linger_ms=5)
    story.opened()
    story.write(b"a")
    story.now_ms += 5
    effects = story.machine.on_time(story.now_ms)
    assert one(effects, AppendEntry) and one(effects, CreateLedger)  # sent, and the roll is due
    story.write(b"b")  # buffered behind the roll
    story.now_ms += 50  # its linger passed; the roll still waits for its ledger
    effects = story.machine.on_time(story.now_ms)
    assert not [e for e in of(effects, SetTimer) if e.at_ms is not None and e.at_ms <= story.now_ms]
    assert not of(effects, AppendEntry)  # and nothing went out to the old ledger


def test_records_buffered_at_close_still_roll_at_the_roll_size():
    """Found by the regression test of `dlog write`: everything sent at close went into one segment."""
    story = Story(roll_bytes=4096)
    story.opened()
    for letter in b"abcdef":
        story.write(bytes([letter]) * 900)  # "a" in flight, the rest buffered (no entry is full yet)
    effects = story.machine.close(story.now_ms)
    assert [len(e.payload) for e in of(effects, AppendEntry)] == [1801, 1801]  # b|c, d|e: the budget
    assert one(effects, CreateLedger)  # past the roll size with "f" still to go: a roll, then the seal
    assert [chunk[1][0][:1] for chunk in story.machine.batcher.buffer] == [b"f"]


def test_a_ledger_created_while_the_old_one_still_has_entries_in_flight_may_move_the_timer():
    """Found by the fault suite (a slow link): the roll had nothing to commit yet, and the machine
    appended its new timer to the shared empty tuple of effects and crashed."""
    story = Story(roll_records=1, linger_ms=5)
    story.opened()
    story.write(b"a")
    story.now_ms += 5
    effects = story.machine.on_time(story.now_ms)
    assert one(effects, AppendEntry).entry_id == 0 and one(effects, CreateLedger)
    story.write(b"b")  # buffered behind the roll, its linger timer set
    story.now_ms += 50  # the linger passed while the old ledger's entry is still in flight
    effects = story.machine.on_ledger_created(story.new_ledger(), story.now_ms)
    assert not of(effects, CommitSegments) and not of(effects, AppendEntry)
    effects = story.machine.on_entry_acked(11, 0, story.now_ms)
    assert one(effects, CommitSegments)  # the roll goes on once the entry is acknowledged


def test_with_flush_rounds_a_linger_that_passes_while_the_roll_waits_for_its_ledger_does_not_crash():
    """The same window with flush rounds (the simulator reaches it far more rarely, since every
    round refreshes the timer): the roll's new ledger arrives after the buffered record's linger passed."""
    story = Story(roll_records=1, linger_ms=5, flush_rounds=True)
    story.opened()
    assert story.write(b"a") == (RequestRound(),)
    assert one(story.machine.on_round(story.now_ms), SetTimer).at_ms == story.now_ms + 5  # lingers
    story.now_ms += 5
    effects = story.machine.on_time(story.now_ms)
    assert one(effects, AppendEntry).entry_id == 0 and one(effects, CreateLedger)
    story.write(b"b")  # buffered behind the roll, its linger timer set
    story.now_ms += 50
    effects = story.machine.on_ledger_created(story.new_ledger(), story.now_ms)
    assert not of(effects, CommitSegments) and not of(effects, AppendEntry)
    assert one(story.machine.on_entry_acked(11, 0, story.now_ms), CommitSegments)


# ---------------------------------------------------------------------------------- deleted ledgers (issue 20)


def test_the_in_progress_ledger_deleted_under_the_writer_fails_it_naming_the_ledger():
    story = Story()
    story.opened()
    story.write(b"a")
    story.machine.on_entry_acked(11, 0, story.now_ms)  # acknowledged: now lost with its ledger
    story.write(b"b")  # in flight
    story.write(b"c")  # buffered
    effects = story.machine.on_ledger_gone(11, story.now_ms)  # its metadata watch fired
    assert effects == [ConfirmLedgerDeleted(11)]
    assert story.machine.on_entry_acked(11, 1, story.now_ms) == ()  # bookies still acknowledge: not durable
    assert story.machine.flush(story.now_ms, "flush") == [] and story.machine.batcher.buffer  # nothing more goes to it
    effects = story.machine.on_ledger_deleted(11, story.listing, story.now_ms)  # the list still names it
    failed = one(effects, FailChunks)
    assert failed.waiters == (b"b", b"c") and isinstance(failed.error, LedgerDeletedError)
    assert one(effects, CompleteFlushes).waiters == ("flush",)  # the flush ends too (and raises the error)
    assert failed.error.ledger_id == 11 and failed.error.pending_lost  # b and c are in no ledger that exists
    assert "ledger 11" in str(failed.error) and story.machine.state is WriterState.FAILED
    assert story.machine.close(story.now_ms) == [ReleaseLock(), WriterClosed()]  # never completes the segment


def test_an_append_that_finds_no_metadata_is_the_same_deletion():
    story = Story()
    story.opened()
    story.write(b"a")
    effects = story.machine.on_entry_failed(11, 0, NoSuchLedgerError("ledger 11 does not exist"), story.now_ms)
    assert effects == [ConfirmLedgerDeleted(11)]
    effects = story.machine.on_ledger_deleted(11, story.listing, story.now_ms)
    assert isinstance(one(effects, FailChunks).error, LedgerDeletedError)


def test_an_empty_segment_dropped_by_a_new_writer_is_a_takeover_not_a_loss():
    story = Story()
    story.opened()
    story.write(b"a")
    effects = story.machine.on_ledger_gone(11, story.now_ms)  # the new writer found it empty, dropped it
    rival = SegmentList((Segment(2, 50),), story.listing.version + 2, 2)
    effects = story.machine.on_ledger_deleted(11, rival, story.now_ms)
    assert isinstance(one(effects, FailChunks).error, WriterFencedError)


def closing_story() -> Story:
    story = Story()
    story.opened()
    story.write(b"a")
    effects = story.machine.close(story.now_ms)
    effects = story.commit(story.machine.on_entry_acked(11, 0, story.now_ms))
    assert effects == [CloseLedger(11)]  # the segment is committed as completed; its ledger closes
    return story


def test_a_close_that_finds_the_ledger_deleted_fails_instead_of_reporting_success():
    """Issue 20 item 2: the ledger close's compare-and-set found no metadata, and the writer counted
    the ledger as closed: `dlog write` exited 0 with every record lost."""
    story = closing_story()
    effects = story.machine.on_ledger_closed(11, NoSuchLedgerError("ledger 11 does not exist"), story.now_ms)
    assert effects == [ConfirmLedgerDeleted(11)] and story.machine.state is WriterState.CLOSING
    effects = story.machine.on_ledger_deleted(11, story.listing, story.now_ms)  # the list still names it
    closed = one(effects, WriterClosed)
    assert isinstance(closed.error, LedgerDeletedError) and closed.error.ledger_id == 11
    assert "1 records are lost" in str(closed.error) and ReleaseLock() in effects


def test_a_closing_ledger_removed_by_truncation_is_no_loss():
    story = closing_story()
    story.listing = SegmentList((replace(story.listing.segments[0], state=SegmentState.TRUNCATED),),
                                story.listing.version + 1, 1)
    assert story.machine.on_ledger_gone(11, story.now_ms) == [ConfirmLedgerDeleted(11)]  # its watch
    assert story.machine.on_ledger_gone(11, story.now_ms) == ()  # asked once
    effects = story.machine.on_ledger_deleted(11, story.listing, story.now_ms)
    assert WriterClosed() in effects and story.machine.state is WriterState.CLOSED


def test_abort_fails_what_is_not_acknowledged_and_leaves_the_segment_in_progress():
    story = Story()
    story.opened()
    story.write(b"a")
    story.machine.on_entry_acked(11, 0, story.now_ms)
    story.write(b"b")
    story.write(b"c")
    story.machine.close(story.now_ms)  # the first Ctrl-C: closing, "b" and "c" in flight
    effects = story.machine.abort(WriterAbortedError("stopped"), story.now_ms)  # the second
    failed = one(effects, FailChunks)
    assert failed.waiters == (b"b", b"c") and isinstance(failed.error, WriterAbortedError)
    assert ReleaseLock() in effects and isinstance(one(effects, WriterClosed).error, WriterAbortedError)
    assert not of(effects, CommitSegments) and story.listing.segments[0].is_in_progress  # for a recovery
    assert story.machine.on_entry_acked(11, 1, story.now_ms) == ()  # a late answer changes nothing
