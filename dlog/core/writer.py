"""The stream writer's rules: lock, seal the previous writer's segment, open a segment, roll,
close; coexist with truncation, retention and sink commits; fail loudly when a ledger is deleted
under it. The batching of records into entries is `batching.EntryBatcher`'s, a part of this machine.

Theory of operation.

States. `state` is the writer's life (opening, open, closing, closed, failed); `step` is what it
waits for besides acknowledgements: at most one segment-store or ledger operation at a time
(locking, listing, sealing, creating a ledger, committing a change of the segment list: the step
says which change), or a roll waiting for the old ledger's entries in flight. Each answer names
the steps it may answer; any other is a bug (InvariantError).

Opening (L1, L4). Take the writer lock (it only avoids needless fights: without it, a writer
opened with `takeover` goes on). Read the list; while it has an in-progress segment, seal it:
recovering its ledger fences its writer, whatever the lock says; a segment with no entry is
dropped. Then create a ledger and commit it as the new in-progress segment. Each commit is a
compare-and-set on the list version; a lost one means: read again and plan again.

Rolling (L2). After an entry that takes the segment to its roll size, record count or age, no new
entry is sent; a new ledger is created meanwhile; once every entry in flight is acknowledged, ONE
compare-and-set completes the segment and creates the next, and only then is the old ledger
closed. The chunks of one `write_group` (one write_batch) always land in one segment.

Positions (V4). Each segment the writer creates is positioned right after the one before it
(`changes.append_change` at open, which also assigns positions to the segments of a stream
written before positions existed; `changes.roll_change` on a roll), so every record it
acknowledges has its position: the segment's first position plus the records sent into the
segment before it (`batching`).

Sharing the list. Truncation, retention, subscriptions and sink commits change the list beside a
live writer. A lost compare-and-set is answered with the list as it now is: if the writer's change
is already there (an earlier answer was lost), it is done; if its in-progress segment is still in
progress and last, the change is rebased on the new list (`changes.rebase_progress`: the writer's
progress fields, the stored truncation point) and committed again; otherwise another writer took
over (WriterFencedError), as when an append finds the ledger fenced.

Flush rounds (`flush_rounds`, the stream writer's driver sets it). A partial entry that a free
slot lets go (Nagle's rule in `batching`) is not sent by the write or acknowledgement that allows it:
the machine asks for the process's flush round (RequestRound, once until `on_round`), which its
driver runs once per event-loop turn for every writer that asked. A writer of 1,000 gets each of
its records in a separate call; the round sends what all of them buffered in that turn together
(and the driver builds their entries at once). Full entries, flushes, closes and rolls do not wait.

Ending. Every chunk ends: acknowledged (CompleteChunks), or failed with the writer's error
(FailChunks: every chunk not acknowledged, in flight or buffered) when an append, a roll or a
close fails. Closing sends what is buffered, waits for it, completes the segment (or drops it when
it holds no record), closes the ledger and releases the lock. Aborting waits for nothing: what is
not acknowledged fails (outcome unknown) and the segment stays in progress.

Ledgers deleted under the writer. Bookies go on acknowledging adds to a ledger whose metadata was
deleted (`dlog ledger delete --force`) until garbage collection drops it, so an acknowledgement
alone does not make a record durable. The driver watches the metadata of the ledgers it writes;
when one is gone (its watch, an append or a close that finds no metadata: `on_ledger_gone`),
nothing more is sent to or acknowledged from it, and the segment list decides: if it still names
the ledger live, records were lost and the writer fails with LedgerDeletedError naming it; if not,
the segment was removed on purpose (a takeover that sealed it, truncation, retention).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from bookkeeper.errors import DlogError, LedgerFencedError, NoSuchLedgerError, invariant
from dlog.core import changes
from dlog.core.batching import Encoder, EntryBatcher
from dlog.core.effects import (
    ROUND,
    ApplyRetention,
    CloseLedger,
    CommitSegments,
    ConfirmLedgerDeleted,
    CreateLedger,
    DeleteLedger,
    LockStream,
    ReadSegments,
    ReleaseLock,
    SealSegment,
    SetTimer,
    WakeWriters,
    WriterClosed,
    WriterEffect,
    WriterOpened,
)
from dlog.core.errors import (
    LedgerDeletedError,
    StreamBusyError,
    WriterClosedError,
    WriterFencedError,
    WriterLockedError,
)
from dlog.core.settings import WriterSettings
from dlog.segments.metadata import Segment, SegmentChange, SegmentList

NO_EFFECTS: tuple[WriterEffect, ...] = ()  # never appended to: a tuple


class WriterState(enum.Enum):
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


class Step(enum.Enum):
    """What the writer waits for besides acknowledgements (the answer that ends each step)."""

    IDLE = "idle"  # nothing
    LOCKING = "locking"  # LockStream -> on_locked
    LISTING = "listing"  # ReadSegments -> on_segments
    SEALING = "sealing"  # SealSegment of a previous writer's segment -> on_sealed
    COMMITTING_SEAL = "committing_seal"  # that segment completed, or dropped when empty -> on_committed
    CREATING = "creating"  # CreateLedger for the first segment -> on_ledger_created
    COMMITTING_OPEN = "committing_open"  # the first segment created -> on_committed
    ROLL_CREATING = "roll_creating"  # CreateLedger for the next segment -> on_ledger_created
    ROLL_DRAINING = "roll_draining"  # the old ledger's entries in flight -> on_entry_acked
    COMMITTING_ROLL = "committing_roll"  # the segment completed and the next one created, at once
    COMMITTING_CLOSE = "committing_close"  # the segment completed, or dropped when empty


COMMITTING = (Step.COMMITTING_SEAL, Step.COMMITTING_OPEN, Step.COMMITTING_ROLL, Step.COMMITTING_CLOSE)
ROLLING = (Step.ROLL_CREATING, Step.ROLL_DRAINING, Step.COMMITTING_ROLL)  # no entry goes out
ENDED = (WriterState.CLOSED, WriterState.FAILED)
# bound once: the per-record path compares with them (an enum member lookup costs more than a global)
_OPEN, _IDLE = WriterState.OPEN, Step.IDLE


class WriterMachine:
    def __init__(self, settings: WriterSettings, encode: Encoder) -> None:
        self.settings = settings
        self.batcher = EntryBatcher(settings, encode)
        self.state = WriterState.OPENING
        self.step = Step.IDLE
        self.error: DlogError | None = None
        self.listing: SegmentList | None = None
        self.segment: Segment | None = None  # our in-progress segment, as last committed
        self.new_ledger_id: int | None = None  # created for the next segment, not committed yet
        self.locked = False
        self._change: SegmentChange | None = None  # what a COMMITTING_* step commits
        self._sealing: Segment | None = None  # what the SEALING step seals
        self._delete_after_commit: int | None = None
        self._conflicts = 0
        self._timer_at_ms: int | None = None
        self._closing_ledgers: set[int] = set()
        self._confirming: set[int] = set()  # ledgers found gone, the list not yet read
        self._gone: int | None = None  # the ledger being written, found gone: nothing more to or from it
        self._rounds = settings.flush_rounds
        self._round_asked = False  # RequestRound asked, on_round not run yet

    # ------------------------------------------------------------------ queries

    @property
    def writable(self) -> bool:
        return self.batcher.writable

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def rolling(self) -> bool:
        return self.step in ROLLING

    @property
    def ledger_id(self) -> int | None:
        """The ledger of the segment being written (or last written)."""
        return self.batcher.progress.ledger_id

    def closed_error(self) -> DlogError:
        """What a write to this writer raises now."""
        if self.error is not None:
            return self.error
        return WriterClosedError(f"the writer of stream {self.settings.stream!r} is closed")

    # ------------------------------------------------------------------ opening

    def open(self, now_ms: int) -> list[WriterEffect]:
        invariant(self.state is WriterState.OPENING and self.step is Step.IDLE, "open() is called once")
        self.step = Step.LOCKING
        return [LockStream(self.settings.lock_timeout_s)]

    def on_locked(self, acquired: bool, now_ms: int) -> list[WriterEffect]:
        self._answered(Step.LOCKING)
        self.locked = acquired
        if not acquired and not self.settings.takeover:
            return self._fail(WriterLockedError(
                f"stream {self.settings.stream!r} has a live writer (lock not free within "
                f"{self.settings.lock_timeout_s} s); open with takeover=True to fence it and take over"), now_ms)
        self.step = Step.LISTING
        return [ReadSegments()]

    def on_segments(self, listing: SegmentList, now_ms: int) -> list[WriterEffect]:
        """The list, read while opening (the reader machine reads lists for other reasons)."""
        self._answered(Step.LISTING)
        return self._plan_open(listing, now_ms)

    def _plan_open(self, listing: SegmentList, now_ms: int) -> list[WriterEffect]:
        self.listing = listing
        in_progress = listing.in_progress
        if in_progress is not None:
            self.step, self._sealing = Step.SEALING, in_progress
            return [SealSegment(in_progress)]
        if self.new_ledger_id is None:
            self.step = Step.CREATING
            return [CreateLedger()]
        created = Segment(listing.max_sequence + 1, self.new_ledger_id, created_ms=now_ms,
                          schema_version=self.settings.schema_version)
        # positioned after the last segment; a stream from before positions gets them here (V4)
        return self._start_commit(Step.COMMITTING_OPEN, changes.append_change(listing, (created,)))

    def on_sealed(self, segment: Segment, sealed: Segment | None, ledger_exists: bool,
                  now_ms: int) -> list[WriterEffect]:
        self._answered(Step.SEALING)
        invariant(segment == self._sealing, f"sealed segment {segment.sequence} was not asked for")
        self._sealing = None
        self._delete_after_commit = segment.ledger_id if sealed is None and ledger_exists else None
        return self._start_commit(Step.COMMITTING_SEAL, changes.seal_change(segment, sealed))

    def on_ledger_created(self, ledger_id: int, now_ms: int) -> Sequence[WriterEffect]:
        step = self._answered(Step.CREATING, Step.ROLL_CREATING)
        if self.ended:  # the writer failed (and maybe was closed) while it was being created
            return [DeleteLedger(ledger_id)]
        self.new_ledger_id = ledger_id
        if step is Step.CREATING:
            return self._plan_open(self._listing(), now_ms)
        self.step = Step.ROLL_DRAINING
        return self._finish(self._maybe_commit_roll(now_ms), now_ms)

    # ------------------------------------------------------------------ commits

    def _start_commit(self, step: Step, change: SegmentChange) -> list[WriterEffect]:
        self.step, self._change = step, change
        return [CommitSegments(self._listing(), change)]

    def on_committed(self, listing: SegmentList, now_ms: int) -> Sequence[WriterEffect]:
        step = self._answered(*COMMITTING)
        if self.ended:  # failed meanwhile: whatever landed, a later writer seals
            return []
        change = self._change
        assert change is not None
        self._change, self.listing, self._conflicts = None, listing, 0
        if step is Step.COMMITTING_SEAL:
            return self._committed_seal(now_ms)
        if step is Step.COMMITTING_OPEN:
            return self._committed_open(change, now_ms)
        if step is Step.COMMITTING_ROLL:
            return self._committed_roll(change, now_ms)
        return self._committed_close(change, now_ms)

    def on_commit_conflict(self, current: SegmentList, now_ms: int) -> Sequence[WriterEffect]:
        """The compare-and-set lost; `current` is the list as it now is."""
        step = self._answered(*COMMITTING)
        if self.ended:
            return []
        change = self._change
        assert change is not None
        if change.landed_in(current):  # an earlier attempt whose answer was lost went through
            self.step = step
            return self.on_committed(current, now_ms)
        self._conflicts += 1
        if self._conflicts > self.settings.commit_conflicts_max:
            self._change = None
            return self._fail(StreamBusyError(
                f"stream {self.settings.stream!r}: the segment list changed under {self._conflicts} "
                "changes in a row; try again"), now_ms)
        self.listing = current
        if step is Step.COMMITTING_SEAL or step is Step.COMMITTING_OPEN:
            self._change = None
            effects: list[WriterEffect] = []
            if step is Step.COMMITTING_OPEN and self.new_ledger_id is not None:
                # never reuse it: an attempt whose answer was lost may have landed, and another
                # writer may have sealed and deleted it since; a fresh ledger is never ambiguous
                effects.append(DeleteLedger(self.new_ledger_id))
                self.new_ledger_id = None
            return effects + self._plan_open(current, now_ms)
        assert self.segment is not None
        stored = changes.still_owned(self.segment, current)
        if stored is None:
            self._change = None
            return self._fail(WriterFencedError(
                f"stream {self.settings.stream!r} was taken over by another writer (its segment "
                f"{self.segment.sequence} was sealed by someone else)"), now_ms)
        return self._start_commit(step, self._rebased(step, change, stored, current))

    def _rebased(self, step: Step, change: SegmentChange, stored: Segment, current: SegmentList) -> SegmentChange:
        if step is Step.COMMITTING_CLOSE and change.delete:
            return SegmentChange(delete=(stored,))
        update = changes.rebase_progress(change.update[0], stored)
        create = tuple(replace(s, sequence=current.max_sequence + 1) for s in change.create)
        return SegmentChange(update=(update,), create=create)

    def _committed_seal(self, now_ms: int) -> list[WriterEffect]:
        effects: list[WriterEffect] = []
        if self._delete_after_commit is not None:
            effects.append(DeleteLedger(self._delete_after_commit))
            self._delete_after_commit = None
        return effects + self._plan_open(self._listing(), now_ms)

    def _committed_open(self, change: SegmentChange, now_ms: int) -> Sequence[WriterEffect]:
        self._enter_segment(change.create[0], now_ms)
        self.state = WriterState.OPEN
        return self._finish([WriterOpened(self.segment), *self._pump(now_ms)], now_ms)

    def _committed_roll(self, change: SegmentChange, now_ms: int) -> Sequence[WriterEffect]:
        old_ledger = self.ledger_id
        assert old_ledger is not None
        self._enter_segment(change.create[0], now_ms)
        self._closing_ledgers.add(old_ledger)
        effects: list[WriterEffect] = [CloseLedger(old_ledger)]
        if self.settings.retention_on_roll:
            effects.append(ApplyRetention())
        effects += self._pump(now_ms)
        effects += self._maybe_seal(now_ms)
        return self._finish(effects, now_ms)

    def _committed_close(self, change: SegmentChange, now_ms: int) -> list[WriterEffect]:
        ledger_id = self.ledger_id
        assert ledger_id is not None
        self._closing_ledgers.add(ledger_id)
        effects: list[WriterEffect] = [CloseLedger(ledger_id)]
        if change.delete:
            self._delete_after_commit = ledger_id  # after its close
        self.segment = None
        effects += self._maybe_closed(now_ms)
        return effects

    def _enter_segment(self, segment: Segment, now_ms: int) -> None:
        self.segment, self.new_ledger_id = segment, None
        self.batcher.start_segment(segment.ledger_id, now_ms, segment.first_position)

    def _completed(self, now_ms: int) -> Segment:
        """Our in-progress segment, completed where this writer's entries end."""
        assert self.segment is not None
        progress = self.batcher.progress
        return changes.sealed_segment(
            self.segment, last_entry=progress.next_entry_id - 1, records=progress.records,
            size_bytes=progress.bytes, first_timestamp_ms=progress.first_timestamp_ms,
            last_timestamp_ms=progress.last_timestamp_ms, now_ms=now_ms)

    # ------------------------------------------------------------------ writes

    def write(self, item: Any, size_bytes: int, waiter: Any, now_ms: int, records: int = 1) -> Sequence[WriterEffect]:
        """Buffer one record, or a run of `records` records that lands whole in one entry (an
        idempotent producer's batch, or an `offer_records` run of at most an entry's budget);
        `waiter` (None: nobody waits) comes back with its outcome. The hot path of per-record
        writes: nothing it need not do. With `flush_rounds`, a partial entry that a free slot
        lets go waits for the flush round (a full one goes at once)."""
        batcher = self.batcher
        if batcher.add(item, size_bytes, waiter, now_ms, records) and self.state is _OPEN and self.step is _IDLE:
            if self._rounds and not batcher.entry_due:
                return self._ask_round()
            return self._finish(self._pump(now_ms), now_ms)
        if self.settings.linger_ms and len(self.batcher.buffer) == 1:
            return self._finish([], now_ms)
        return NO_EFFECTS

    def write_group(self, pieces: Sequence[tuple[Any, int, int]], waiter: Any, now_ms: int) -> Sequence[WriterEffect]:
        """Buffer pieces (item, records, size bytes) that must land in one segment, one entry
        each; `waiter` comes back with each piece's outcome."""
        self.batcher.add_group(pieces, waiter, now_ms)
        return self._finish(self._pump(now_ms), now_ms) if self.state is WriterState.OPEN else []

    def flush(self, now_ms: int, waiter: Any) -> list[WriterEffect]:
        """Send every buffered record now, as partial entries if need be; `waiter` comes back
        (CompleteFlushes) once every record written so far has ended."""
        self.batcher.force_through(self.batcher.next_chunk_id)
        effects = self.batcher.add_flush(waiter)
        if self.state is WriterState.OPEN:
            effects += self._finish(self._pump(now_ms), now_ms)
        return effects

    def _ask_round(self) -> Sequence[WriterEffect]:
        if self._round_asked:
            return NO_EFFECTS
        self._round_asked = True
        return (ROUND,)

    def on_round(self, now_ms: int) -> Sequence[WriterEffect]:
        """The process's flush round (RequestRound): send what may be sent now. A writer that
        ended, closes or rolls meanwhile sends what its own rules allow, maybe nothing."""
        self._round_asked = False
        if self.state is not _OPEN and self.state is not WriterState.CLOSING:
            return NO_EFFECTS
        return self._finish(self._pump(now_ms), now_ms)

    def _pump(self, now_ms: int) -> list[WriterEffect]:
        """Send what may be sent, and start a roll after the entry that fills the segment."""
        effects: list[WriterEffect] = []
        batcher = self.batcher
        while self.state in (WriterState.OPEN, WriterState.CLOSING) and self.step not in ROLLING and self._gone is None:
            append = batcher.next_entry(now_ms)
            if append is None:
                break
            effects.append(append)
            if not batcher.mid_group and self._roll_due(now_ms):
                effects += self._start_roll()
        return effects

    # ------------------------------------------------------------------ answers

    def on_entry_acked(self, ledger_id: int, entry_id: int, now_ms: int) -> Sequence[WriterEffect]:
        if self.ended or ledger_id == self._gone:  # acknowledged into a ledger that no longer exists
            return NO_EFFECTS
        effects = self.batcher.acked(ledger_id, entry_id)
        if self._rounds and self.state is _OPEN and self.batcher.buffer:
            effects += self._ask_round()  # what was buffered behind this entry goes in the round
        else:
            effects += self._pump(now_ms)
        effects += self._maybe_commit_roll(now_ms)
        effects += self._maybe_seal(now_ms)
        return self._finish(effects, now_ms)

    def on_entry_failed(self, ledger_id: int, entry_id: int, error: DlogError, now_ms: int) -> Sequence[WriterEffect]:
        if self.ended:
            return NO_EFFECTS
        if isinstance(error, NoSuchLedgerError) and ledger_id == self.ledger_id:
            return self.on_ledger_gone(ledger_id, now_ms)  # its metadata was deleted under the writer
        if isinstance(error, LedgerFencedError):
            error = WriterFencedError(f"stream {self.settings.stream!r} was taken over by another writer "
                                      f"(ledger {ledger_id} was fenced); the outcome of pending records is unknown")
        return self._fail(error, now_ms)

    def on_ledger_closed(self, ledger_id: int, error: DlogError | None, now_ms: int) -> Sequence[WriterEffect]:
        """The close of a ledger whose segment is already committed as completed (or dropped):
        an error leaves the ledger open in its own metadata, which no reader relies on, except
        that its metadata is gone: then the ledger stays closing until the list says whether that
        lost records (`on_ledger_deleted`)."""
        if isinstance(error, NoSuchLedgerError) and ledger_id in self._closing_ledgers and not self.ended:
            return self.on_ledger_gone(ledger_id, now_ms)
        self._closing_ledgers.discard(ledger_id)
        effects: list[WriterEffect] = []
        if self._delete_after_commit == ledger_id:
            self._delete_after_commit = None
            effects.append(DeleteLedger(ledger_id))
        effects += self._maybe_closed(now_ms)
        return effects

    def on_operation_failed(self, error: DlogError, now_ms: int) -> Sequence[WriterEffect]:
        """A segment-store or ledger operation failed for good (its driver retried what it could)."""
        self.step = Step.IDLE
        self._change = None
        return self._fail(error, now_ms)

    def on_time(self, now_ms: int) -> Sequence[WriterEffect]:
        self._timer_at_ms = None
        effects: list[WriterEffect] = []
        if (self.state is WriterState.OPEN and self.step is Step.IDLE and self._roll_due(now_ms)
                and not self.batcher.mid_group):
            effects += self._start_roll()
        effects += self._pump(now_ms)
        return self._finish(effects, now_ms)

    # ------------------------------------------------------------------ ledgers deleted under the writer

    def on_ledger_gone(self, ledger_id: int, now_ms: int) -> Sequence[WriterEffect]:
        """The metadata of a ledger of this writer is gone: its watch fired, or an append or a
        close found none. Bookies may go on acknowledging adds to it until garbage collection, but
        nothing in it is durable any more: from the ledger being written nothing more is sent or
        acknowledged. The ledger created for the next segment, which nobody else knows, was
        deleted by hand: the writer fails at once. Otherwise the segment list tells a deletion that
        lost records (it still names the ledger live) from a segment removed on purpose: by a new
        writer that sealed it (a takeover), by truncation or by retention (`on_ledger_deleted`)."""
        if self.ended or ledger_id in self._confirming:
            return NO_EFFECTS
        if ledger_id == self.new_ledger_id:
            return self._fail(LedgerDeletedError(
                f"ledger {ledger_id}, created for the next segment of stream {self.settings.stream!r}, was "
                "deleted under its writer; records not acknowledged have an unknown outcome", ledger_id), now_ms)
        current = ledger_id == self.ledger_id and self.segment is not None
        if not current and ledger_id not in self._closing_ledgers:
            return NO_EFFECTS
        if current:
            self._gone = ledger_id
        self._confirming.add(ledger_id)
        return [ConfirmLedgerDeleted(ledger_id)]

    def on_ledger_deleted(self, ledger_id: int, listing: SegmentList, now_ms: int) -> Sequence[WriterEffect]:
        """The list, read after a ledger's metadata was found gone (ConfirmLedgerDeleted)."""
        self._confirming.discard(ledger_id)
        if self.ended:
            return NO_EFFECTS
        stream, lost = self.settings.stream, changes.deletion_lost_records(listing, ledger_id)
        if ledger_id == self._gone and self.segment is not None:
            if not lost:
                return self._fail(WriterFencedError(
                    f"stream {stream!r} was taken over by another writer (it sealed segment "
                    f"{self.segment.sequence} and removed its ledger {ledger_id})"), now_ms)
            return self._fail(LedgerDeletedError(
                f"ledger {ledger_id} of the in-progress segment {self.segment.sequence} of stream {stream!r} "
                "was deleted under its writer: the records acknowledged into it are lost, and those not "
                "acknowledged were not written", ledger_id, pending_lost=True), now_ms)
        if ledger_id not in self._closing_ledgers:
            return NO_EFFECTS
        if lost:
            segment = listing.by_ledger(ledger_id)
            assert segment is not None
            return self._fail(LedgerDeletedError(
                f"ledger {ledger_id} of the completed segment {segment.sequence} of stream {stream!r} was "
                f"deleted while its writer closed it: its {segment.records} records are lost; records not "
                "acknowledged have an unknown outcome", ledger_id), now_ms)
        # removed on purpose (truncation, retention) while it was being closed: nothing left to close
        self._closing_ledgers.discard(ledger_id)
        if self._delete_after_commit == ledger_id:
            self._delete_after_commit = None
        return self._maybe_closed(now_ms)

    def abort(self, error: DlogError, now_ms: int) -> Sequence[WriterEffect]:
        """Stop now, waiting for nothing: every record not yet acknowledged ends with `error` (its
        outcome is unknown), the lock is released, and the in-progress segment stays in progress
        with its ledger open, for the next writer to recover (L1)."""
        if self.state is WriterState.CLOSED:
            return NO_EFFECTS
        effects = [*self._fail(error, now_ms)]
        if self.state is WriterState.FAILED:
            effects += self.close(now_ms)
        return effects

    # ------------------------------------------------------------------ rolling

    def _roll_due(self, now_ms: int) -> bool:
        """Whether the segment is full. While closing, only if records are still to go: what is
        buffered at close must not pile into one segment past the roll size, but a segment that is
        merely old is sealed by the close itself."""
        settings, progress = self.settings, self.batcher.progress
        if self.step in ROLLING or progress.records == 0:
            return False
        if self.state is WriterState.CLOSING and not self.batcher.buffer:
            return False
        if self.state is not WriterState.OPEN and self.state is not WriterState.CLOSING:
            return False
        full = bool((settings.roll_bytes and progress.bytes >= settings.roll_bytes)
                    or (settings.roll_records and progress.records >= settings.roll_records))
        old = bool(settings.roll_age_ms and now_ms - progress.started_ms >= settings.roll_age_ms)
        return full or (old and self.state is WriterState.OPEN)

    def _start_roll(self) -> list[WriterEffect]:
        self.step = Step.ROLL_CREATING
        return [CreateLedger()]

    def _maybe_commit_roll(self, now_ms: int) -> Sequence[WriterEffect]:
        if self.step is not Step.ROLL_DRAINING or self.batcher.in_flight or self._gone is not None:
            return NO_EFFECTS
        assert self.new_ledger_id is not None
        created = Segment(self._listing().max_sequence + 1, self.new_ledger_id, created_ms=now_ms,
                          schema_version=self.settings.schema_version)
        return self._start_commit(Step.COMMITTING_ROLL, changes.roll_change(self._completed(now_ms), created))

    # ------------------------------------------------------------------ closing

    def close(self, now_ms: int) -> Sequence[WriterEffect]:
        if self.state is WriterState.CLOSED or self.state is WriterState.CLOSING:
            return NO_EFFECTS
        if self.state is WriterState.FAILED:
            self.state = WriterState.CLOSED
            return self._release() + [WriterClosed()]
        invariant(self.state is WriterState.OPEN, f"close() while {self.state.value}")
        self.state = WriterState.CLOSING
        self.batcher.force_through(self.batcher.next_chunk_id + 2**62)
        effects = self._pump(now_ms)
        effects += self._maybe_seal(now_ms)
        return self._finish(effects, now_ms)

    def _maybe_seal(self, now_ms: int) -> Sequence[WriterEffect]:
        batcher = self.batcher
        if (self.state is not WriterState.CLOSING or self.step is not Step.IDLE or batcher.buffer
                or batcher.in_flight or self.segment is None or self._gone is not None):
            return NO_EFFECTS
        if batcher.progress.records == 0:
            return self._start_commit(Step.COMMITTING_CLOSE, SegmentChange(delete=(self.segment,)))
        return self._start_commit(Step.COMMITTING_CLOSE, SegmentChange(update=(self._completed(now_ms),)))

    def _maybe_closed(self, now_ms: int) -> Sequence[WriterEffect]:
        if (self.state is not WriterState.CLOSING or self.segment is not None or self._closing_ledgers
                or self._delete_after_commit is not None):
            return NO_EFFECTS
        self.state = WriterState.CLOSED
        return self._release() + [WakeWriters(), WriterClosed(), SetTimer(None)]

    def _release(self) -> list[WriterEffect]:
        if not self.locked:
            return []
        self.locked = False
        return [ReleaseLock()]

    # ------------------------------------------------------------------ failure

    def _fail(self, error: DlogError, now_ms: int) -> list[WriterEffect]:
        """The writer ends with `error`: every chunk not yet acknowledged fails with it."""
        if self.ended:
            return []
        previous = self.state
        self.state, self.error = WriterState.FAILED, error
        effects = self.batcher.fail(error)
        if self.new_ledger_id is not None and self.step not in COMMITTING:
            effects.append(DeleteLedger(self.new_ledger_id))  # created, never committed: not leaked
            self.new_ledger_id = None
        effects += [WakeWriters(), SetTimer(None)]
        self._timer_at_ms = None
        if previous is WriterState.OPENING:
            effects = self._release() + effects + [WriterOpened(None, error)]
        elif previous is WriterState.CLOSING:
            self.state = WriterState.CLOSED
            effects = self._release() + effects + [WriterClosed(error)]
        return effects

    # ------------------------------------------------------------------ helpers

    def _answered(self, *steps: Step) -> Step:
        """An answer came: it must end one of `steps`. Returns the step it ended."""
        step = self.step
        invariant(step in steps, f"answer to {' or '.join(s.value for s in steps)} while {step.value}")
        self.step = Step.IDLE
        return step

    def _listing(self) -> SegmentList:
        assert self.listing is not None
        return self.listing

    def _finish(self, effects: Sequence[WriterEffect], now_ms: int) -> Sequence[WriterEffect]:
        """The effects, and a SetTimer when the earliest deadline changed. `effects` may be the
        shared NO_EFFECTS tuple (a roll with nothing to commit): it is never appended to."""
        deadline = self._deadline_ms(now_ms)
        if deadline != self._timer_at_ms:
            self._timer_at_ms = deadline
            return [*effects, SetTimer(deadline)]
        return effects

    def _deadline_ms(self, now_ms: int) -> int | None:
        """The next time something may fall due. Only future times: a linger that passed while
        the records could not go (a roll, no free slot) or a roll age that passed mid-batch waits
        for the event that frees them (a commit, an ack, the next entry), never for a timer, which
        would fire again at once."""
        if self.state is not WriterState.OPEN and self.state is not WriterState.CLOSING:
            return None
        candidates = []
        linger_deadline_ms = self.batcher.linger_deadline_ms()
        if linger_deadline_ms is not None:
            candidates.append(linger_deadline_ms)
        roll_age_ms, progress = self.settings.roll_age_ms, self.batcher.progress
        if roll_age_ms and progress.records and self.step not in ROLLING and self.state is WriterState.OPEN:
            candidates.append(progress.started_ms + roll_age_ms)
        future = [at_ms for at_ms in candidates if at_ms > now_ms]
        return min(future) if future else None
