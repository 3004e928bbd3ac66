"""The stream writer's rules: lock, seal the previous writer's segment, open a segment, batch
records into entries, roll, close; coexist with truncation, retention and sink commits.

Theory of operation.

Opening (L1, L4). Take the writer lock (it only avoids needless fights: without it, a writer
opened with `takeover` goes on). Read the list; while it has an in-progress segment, seal it:
recovering its ledger fences its writer, whatever the lock says; a segment with no entry is
dropped. Then create a ledger and commit it as the new in-progress segment. Each commit is a
compare-and-set on the list version; a lost one means: read again and plan again.

Writing. Records (and pieces of Arrow batches) are buffered as chunks, in order. An entry is a run
of chunks: up to `flush_records` records and `flush_bytes` bytes, and never more than fits in one
entry of min(roll size, entry maximum) (a piece of a batch is an entry of its own). When nothing
is in flight an entry goes out at once; while `partial_entries_in_flight_max` entries are in
flight, records that arrive batch up until an acknowledgement frees a slot (Nagle's algorithm
without delayed ack; Kafka's linger.ms=0), or until they fill an entry, which always goes out.
`linger_ms` > 0 also holds a partial entry that long for more records. Buffered and in-flight
bytes are bounded by `buffer_bytes_max`: `writable` says whether there is room, `WakeWriters`
when room comes back or the writer ends.

Rolling (L2). After an entry that takes the segment to its roll size, record count or age, no new
entry is sent; a new ledger is created meanwhile; once every entry in flight is acknowledged, ONE
compare-and-set completes the segment and creates the next, and only then is the old ledger
closed. The chunks of one `write_group` (one write_batch) always land in one segment.

Sharing the list. Truncation, retention, subscriptions and sink commits change the list beside a
live writer. A lost compare-and-set is answered with the list as it now is: if the writer's change
is already there (an earlier answer was lost), it is done; if its in-progress segment is still in
progress and last, the change is rebased on the new list (`changes.rebase_progress`: the writer's
progress fields, the stored truncation point) and committed again; otherwise another writer took
over (WriterFencedError), as when an append finds the ledger fenced.

Ending. Every chunk ends: acknowledged (CompleteChunks), or failed with the writer's error
(FailChunks: everything from the first unresolved chunk, in flight or buffered) when an append, a
roll or a close fails. Closing sends what is buffered, waits for it, completes the segment (or
drops it when it holds no record), closes the ledger and releases the lock. Aborting waits for
nothing: what is not acknowledged fails (outcome unknown) and the segment stays in progress.

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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bookkeeper.errors import DlogError, LedgerFencedError, NoSuchLedgerError, invariant
from dlog.core import changes
from dlog.core.effects import (
    AppendEntry,
    ApplyRetention,
    CloseLedger,
    CommitSegments,
    CompleteChunks,
    ConfirmLedgerDeleted,
    CreateLedger,
    DeleteLedger,
    FailChunks,
    LockStream,
    ReadSegments,
    ReleaseLock,
    SealSegment,
    SetTimer,
    WakeWriters,
    WriterClosed,
    WriterOpened,
)
from dlog.core.errors import (
    LedgerDeletedError,
    StreamBusyError,
    WriterClosedError,
    WriterFencedError,
    WriterLockedError,
)
from dlog.segments.metadata import Segment, SegmentChange, SegmentList

NO_EFFECTS: tuple[Any, ...] = ()  # never appended to: a tuple
ENTRY_HEADER_BYTES = 40  # dlog.segments.codec's record-set header
ENTRY_SLACK_BYTES = 2048  # Arrow IPC metadata and buffer padding of one entry, and the zstd frame
RECORD_OVERHEAD_BYTES = 17  # what a record costs in an entry beyond its key and value (offsets, bitmaps)


def entry_budget_bytes(entry_bytes_limit: int) -> int:
    """Record bytes (as counted by `record_size_bytes`) that surely encode within the limit,
    compressed or not (zstd may grow incompressible data by 1/256)."""
    return (entry_bytes_limit - ENTRY_HEADER_BYTES) * 256 // 257 - ENTRY_SLACK_BYTES


class WriterState(enum.Enum):
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class WriterSettings:
    stream: str
    roll_bytes: int = 0  # 0: no limit
    roll_age_ms: int = 0
    roll_records: int = 0
    flush_bytes: int = 1 << 20
    flush_records: int = 20_000
    linger_ms: float = 0.0
    partial_entries_in_flight_max: int = 1
    buffer_bytes_max: int = 64 << 20
    entry_bytes_max: int = 3 << 20
    lock_timeout_s: float = 30.0
    takeover: bool = False
    retention_on_roll: bool = False
    commit_conflicts_max: int = 50

    @property
    def entry_bytes_limit(self) -> int:
        """No entry is larger than this: the entry maximum, and the roll size when it is smaller."""
        if self.roll_bytes and self.roll_bytes < self.entry_bytes_max:
            return self.roll_bytes
        return self.entry_bytes_max


@dataclass(frozen=True, slots=True)
class Encoded:
    """What the encoder made of some chunks: the entry's bytes and its records' time range."""

    payload: bytes
    min_timestamp_ms: int
    max_timestamp_ms: int


# encode(items, first_record_index) -> Encoded: a pure function (dlog.segments.codec in the driver)
Encoder = Callable[[Sequence[Any], int], Encoded]


@dataclass(slots=True)
class _Entry:
    ledger_id: int
    entry_id: int
    first_chunk_id: int
    chunk_count: int
    size_bytes: int  # as counted for the buffer bound


class WriterMachine:
    def __init__(self, settings: WriterSettings, encode: Encoder) -> None:
        self.settings = settings
        self.encode = encode
        self.budget_bytes = entry_budget_bytes(settings.entry_bytes_limit)
        invariant(self.budget_bytes > 0, f"entry limit {settings.entry_bytes_limit} leaves no room for records")
        self.state = WriterState.OPENING
        self.error: DlogError | None = None
        self.listing: SegmentList | None = None
        self.segment: Segment | None = None  # our in-progress segment, as last committed
        self.ledger_id: int | None = None
        self.locked = False
        # chunks: (chunk id, item, records, size bytes, alone); `alone` chunks are entries of their own
        self.buffer: deque[tuple[int, Any, int, int, bool]] = deque()
        self.buffered_bytes = 0
        self.buffered_records = 0
        self.in_flight: deque[_Entry] = deque()
        self.in_flight_bytes = 0
        self.next_chunk_id = 0
        self.first_unresolved_chunk_id = 0
        self.next_entry_id = 0
        self.segment_records = 0
        self.segment_bytes = 0
        self.segment_first_ts = 0
        self.segment_last_ts = 0
        self.segment_started_ms = 0
        self.rolling = False
        self.new_ledger_id: int | None = None  # created for the next segment, not committed yet
        self._step: str | None = None  # the segment-store operation outstanding
        self._commit: tuple[str, SegmentChange] | None = None
        self._sealing: Segment | None = None
        self._delete_after_commit: int | None = None
        self._conflicts = 0
        self._group_end_chunk_id = -1  # a write_group is sent whole into one segment
        self._forced_through = 0  # chunks below this id go out even as partial entries (flush, close)
        self._buffer_since_ms: int | None = None
        self._timer_at_ms: int | None = None
        self._closing_ledgers: set[int] = set()
        self._confirming: set[int] = set()  # ledgers found gone, the list not yet read
        self._gone: int | None = None  # the ledger being written, found gone: nothing more to or from it
        self._full = False

    # ------------------------------------------------------------------ queries

    @property
    def writable(self) -> bool:
        return self.buffered_bytes + self.in_flight_bytes < self.settings.buffer_bytes_max

    @property
    def pending_chunks(self) -> int:
        return self.next_chunk_id - self.first_unresolved_chunk_id

    @property
    def ended(self) -> bool:
        return self.state in (WriterState.CLOSED, WriterState.FAILED)

    # ------------------------------------------------------------------ opening

    def open(self, now_ms: int) -> list[Any]:
        invariant(self.state is WriterState.OPENING and self._step is None, "open() is called once")
        self._step = "lock"
        return [LockStream(self.settings.lock_timeout_s)]

    def on_locked(self, acquired: bool, now_ms: int) -> list[Any]:
        self._expect("lock")
        self.locked = acquired
        if not acquired and not self.settings.takeover:
            return self._fail(WriterLockedError(
                f"stream {self.settings.stream!r} has a live writer (lock not free within "
                f"{self.settings.lock_timeout_s} s); open with takeover=True to fence it and take over"), now_ms)
        self._step = "list"
        return [ReadSegments()]

    def on_segments(self, listing: SegmentList, now_ms: int) -> list[Any]:
        """The list, read while opening (the reader machine reads lists for other reasons)."""
        self._expect("list")
        return self._plan_open(listing, now_ms)

    def _plan_open(self, listing: SegmentList, now_ms: int) -> list[Any]:
        self.listing = listing
        in_progress = listing.in_progress
        if in_progress is not None:
            self._step, self._sealing = "seal", in_progress
            return [SealSegment(in_progress)]
        if self.new_ledger_id is None:
            self._step = "create"
            return [CreateLedger()]
        created = Segment(listing.max_sequence + 1, self.new_ledger_id, created_ms=now_ms)
        return self._start_commit("open", SegmentChange(create=(created,)))

    def on_sealed(self, segment: Segment, sealed: Segment | None, ledger_exists: bool, now_ms: int) -> list[Any]:
        self._expect("seal")
        invariant(segment == self._sealing, f"sealed segment {segment.sequence} was not asked for")
        self._sealing = None
        self._delete_after_commit = segment.ledger_id if sealed is None and ledger_exists else None
        return self._start_commit("seal", changes.seal_change(segment, sealed))

    def on_ledger_created(self, ledger_id: int, now_ms: int) -> list[Any]:
        self._expect("create")
        if self.ended:  # the writer failed (and maybe was closed) while it was being created
            return [DeleteLedger(ledger_id)]
        self.new_ledger_id = ledger_id
        if self.state is WriterState.OPENING:
            return self._plan_open(self._listing(), now_ms)
        return self._finish(self._maybe_commit_roll(now_ms), now_ms)

    # ------------------------------------------------------------------ commits

    def _start_commit(self, kind: str, change: SegmentChange) -> list[Any]:
        self._step, self._commit = "commit", (kind, change)
        return [CommitSegments(self._listing(), change)]

    def on_committed(self, listing: SegmentList, now_ms: int) -> list[Any]:
        self._expect("commit")
        if self.ended:  # failed meanwhile: whatever landed, a later writer seals
            return []
        assert self._commit is not None
        kind, change = self._commit
        self._commit, self.listing, self._conflicts = None, listing, 0
        return getattr(self, f"_committed_{kind}")(change, now_ms)

    def on_commit_conflict(self, current: SegmentList, now_ms: int) -> list[Any]:
        """The compare-and-set lost; `current` is the list as it now is."""
        self._expect("commit")
        if self.ended:
            return []
        assert self._commit is not None
        kind, change = self._commit
        if change.landed_in(current):  # an earlier attempt whose answer was lost went through
            self._step = "commit"
            return self.on_committed(current, now_ms)
        self._conflicts += 1
        if self._conflicts > self.settings.commit_conflicts_max:
            self._commit = None
            return self._fail(StreamBusyError(
                f"stream {self.settings.stream!r}: the segment list changed under {self._conflicts} "
                "changes in a row; try again"), now_ms)
        self.listing = current
        if kind in ("seal", "open"):
            self._commit = None
            effects: list[Any] = []
            if kind == "open" and self.new_ledger_id is not None:
                # never reuse it: an attempt whose answer was lost may have landed, and another
                # writer may have sealed and deleted it since; a fresh ledger is never ambiguous
                effects.append(DeleteLedger(self.new_ledger_id))
                self.new_ledger_id = None
            return effects + self._plan_open(current, now_ms)
        assert self.segment is not None
        stored = changes.still_owned(self.segment, current)
        if stored is None:
            self._commit = None
            return self._fail(WriterFencedError(
                f"stream {self.settings.stream!r} was taken over by another writer (its segment "
                f"{self.segment.sequence} was sealed by someone else)"), now_ms)
        return self._start_commit(kind, self._rebased(kind, change, stored, current))

    def _rebased(self, kind: str, change: SegmentChange, stored: Segment, current: SegmentList) -> SegmentChange:
        if kind == "close" and change.delete:
            return SegmentChange(delete=(stored,))
        update = changes.rebase_progress(change.update[0], stored)
        create = tuple(replace(s, sequence=current.max_sequence + 1) for s in change.create)
        return SegmentChange(update=(update,), create=create)

    def _committed_seal(self, change: SegmentChange, now_ms: int) -> list[Any]:
        effects: list[Any] = []
        if self._delete_after_commit is not None:
            effects.append(DeleteLedger(self._delete_after_commit))
            self._delete_after_commit = None
        self._step = None
        return effects + self._plan_open(self._listing(), now_ms)

    def _committed_open(self, change: SegmentChange, now_ms: int) -> list[Any]:
        self._step = None
        self._enter_segment(change.create[0], now_ms)
        self.state = WriterState.OPEN
        return self._finish([WriterOpened(self.segment), *self._pump(now_ms)], now_ms)

    def _committed_roll(self, change: SegmentChange, now_ms: int) -> list[Any]:
        self._step = None
        old_ledger = self.ledger_id
        assert old_ledger is not None
        self._enter_segment(change.create[0], now_ms)
        self.rolling = False
        self._closing_ledgers.add(old_ledger)
        effects: list[Any] = [CloseLedger(old_ledger)]
        if self.settings.retention_on_roll:
            effects.append(ApplyRetention())
        effects += self._pump(now_ms)
        effects += self._maybe_seal(now_ms)
        return self._finish(effects, now_ms)

    def _committed_close(self, change: SegmentChange, now_ms: int) -> list[Any]:
        self._step = None
        assert self.ledger_id is not None
        ledger_id = self.ledger_id
        self._closing_ledgers.add(ledger_id)
        effects: list[Any] = [CloseLedger(ledger_id)]
        if change.delete:
            self._delete_after_commit = ledger_id  # after its close
        self.segment = None
        effects += self._maybe_closed(now_ms)
        return effects

    def _enter_segment(self, segment: Segment, now_ms: int) -> None:
        self.segment, self.ledger_id, self.new_ledger_id = segment, segment.ledger_id, None
        self.next_entry_id = 0
        self.segment_records = self.segment_bytes = 0
        self.segment_first_ts = self.segment_last_ts = 0
        self.segment_started_ms = now_ms

    # ------------------------------------------------------------------ writes

    def check_record(self, size_bytes: int) -> str | None:
        """Why a record of this size can never be written (None: it can)."""
        if size_bytes > self.budget_bytes:
            return (f"a record of {size_bytes} bytes does not fit in one entry of at most "
                    f"{self.settings.entry_bytes_limit} bytes (the smaller of the stream's roll size and the "
                    f"writer's entry_bytes_max); write smaller records or raise those limits")
        return None

    def write(self, item: Any, size_bytes: int, now_ms: int) -> tuple[int, list[Any]]:
        """Buffer one record (the hot path of per-record writes: nothing it need not do)."""
        chunk_id = self.next_chunk_id
        self.next_chunk_id = chunk_id + 1
        self.buffer.append((chunk_id, item, 1, size_bytes, False))
        self.buffered_bytes += size_bytes
        self.buffered_records += 1
        if self._buffer_since_ms is None:
            self._buffer_since_ms = now_ms
        effects = NO_EFFECTS
        if self.state is WriterState.OPEN and not self.rolling and (
                len(self.in_flight) < self.settings.partial_entries_in_flight_max
                or self.buffered_records >= self.settings.flush_records
                or self.buffered_bytes >= self.settings.flush_bytes):
            effects = self._finish(self._pump(now_ms), now_ms)
        elif self.settings.linger_ms and len(self.buffer) == 1:
            effects = self._finish([], now_ms)
        if not self.writable:
            self._full = True
        return chunk_id, effects

    def write_group(self, pieces: Sequence[tuple[Any, int, int]], now_ms: int) -> tuple[int, list[Any]]:
        """Buffer pieces (item, records, size bytes) that must land in one segment, one entry each."""
        first = self.next_chunk_id
        for item, records, size_bytes in pieces:
            self.buffer.append((self.next_chunk_id, item, records, size_bytes, True))
            self.next_chunk_id += 1
            self.buffered_bytes += size_bytes
            self.buffered_records += records
        if self._buffer_since_ms is None:
            self._buffer_since_ms = now_ms
        self._forced_through = self.next_chunk_id  # a batch is never held back for more records
        effects = self._finish(self._pump(now_ms), now_ms) if self.state is WriterState.OPEN else []
        if not self.writable:
            self._full = True
        return first, effects

    def flush(self, now_ms: int) -> list[Any]:
        """Send every buffered record now, as partial entries if need be."""
        self._forced_through = self.next_chunk_id
        return self._finish(self._pump(now_ms), now_ms) if self.state is WriterState.OPEN else []

    def _pump(self, now_ms: int) -> list[Any]:
        """Send what may be sent: full entries always, partial ones while a slot is free."""
        effects: list[Any] = []
        settings = self.settings
        while (self.buffer and not self.rolling and self._gone is None
               and self.state in (WriterState.OPEN, WriterState.CLOSING)):
            taken, records, size_bytes, full = self._next_entry()
            forced = self.buffer[taken - 1][0] < self._forced_through
            if not full and not forced:
                if len(self.in_flight) >= settings.partial_entries_in_flight_max:
                    break
                if settings.linger_ms and now_ms - (self._buffer_since_ms or now_ms) < settings.linger_ms:
                    break
            effects.append(self._send(taken, records, size_bytes, now_ms))
            last_chunk_id = self.in_flight[-1].first_chunk_id + taken - 1
            if last_chunk_id >= self._group_end_chunk_id and self._roll_due(now_ms):
                effects += self._start_roll()
        return effects

    def _next_entry(self) -> tuple[int, int, int, bool]:
        """How many chunks from the front form the next entry, their records and size, and
        whether the entry is full (it cannot grow: more would not fit, or a flush limit is met)."""
        buffer, settings = self.buffer, self.settings
        if buffer[0][4]:  # a batch piece: an entry of its own
            return 1, buffer[0][2], buffer[0][3], True
        taken = records = size_bytes = 0
        for _, _, chunk_records, chunk_bytes, alone in buffer:
            if alone or (taken and (size_bytes + chunk_bytes > self.budget_bytes)):
                return taken, records, size_bytes, True
            taken, records, size_bytes = taken + 1, records + chunk_records, size_bytes + chunk_bytes
            if records >= settings.flush_records or size_bytes >= settings.flush_bytes:
                return taken, records, size_bytes, True
        return taken, records, size_bytes, False

    def _send(self, taken: int, records: int, size_bytes: int, now_ms: int) -> AppendEntry:
        assert self.ledger_id is not None
        chunks = [self.buffer.popleft() for _ in range(taken)]
        first_chunk_id = chunks[0][0]
        if chunks[-1][4] and taken == 1:
            self._group_end_chunk_id = max(self._group_end_chunk_id, self._group_end(first_chunk_id))
        self.buffered_bytes -= size_bytes
        self.buffered_records -= records
        self._buffer_since_ms = now_ms if self.buffer else None
        encoded = self.encode([chunk[1] for chunk in chunks], self.segment_records)
        invariant(len(encoded.payload) <= self.settings.entry_bytes_limit,
                  f"an entry of {len(encoded.payload)} bytes is over the limit {self.settings.entry_bytes_limit}")
        if self.segment_records == 0:
            self.segment_first_ts = encoded.min_timestamp_ms
        self.segment_last_ts = max(self.segment_last_ts, encoded.max_timestamp_ms)
        self.segment_records += records
        self.segment_bytes += len(encoded.payload)
        entry_id = self.next_entry_id
        self.next_entry_id += 1
        self.in_flight.append(_Entry(self.ledger_id, entry_id, first_chunk_id, taken, size_bytes))
        self.in_flight_bytes += size_bytes
        return AppendEntry(self.ledger_id, entry_id, encoded.payload)

    def _group_end(self, first_chunk_id: int) -> int:
        """The last chunk id of the run of batch pieces that starts at `first_chunk_id`."""
        end = first_chunk_id
        for chunk_id, _, _, _, alone in self.buffer:
            if not alone or chunk_id != end + 1:
                break
            end = chunk_id
        return end

    # ------------------------------------------------------------------ answers

    def on_entry_acked(self, ledger_id: int, entry_id: int, now_ms: int) -> list[Any]:
        if self.ended or ledger_id == self._gone:  # acknowledged into a ledger that no longer exists
            return NO_EFFECTS
        invariant(bool(self.in_flight), f"entry {ledger_id}:{entry_id} acknowledged with nothing in flight")
        entry = self.in_flight[0]
        invariant(entry.ledger_id == ledger_id and entry.entry_id == entry_id,
                  f"entry {ledger_id}:{entry_id} acknowledged, {entry.ledger_id}:{entry.entry_id} was next")
        self.in_flight.popleft()
        self.in_flight_bytes -= entry.size_bytes
        self.first_unresolved_chunk_id = entry.first_chunk_id + entry.chunk_count
        effects: list[Any] = [CompleteChunks(entry.first_chunk_id, entry.chunk_count, ledger_id, entry_id)]
        if self._full and self.writable:
            self._full = False
            effects.append(WakeWriters())
        effects += self._pump(now_ms)
        effects += self._maybe_commit_roll(now_ms)
        effects += self._maybe_seal(now_ms)
        return self._finish(effects, now_ms)

    def on_entry_failed(self, ledger_id: int, entry_id: int, error: DlogError, now_ms: int) -> list[Any]:
        if self.ended:
            return NO_EFFECTS
        if isinstance(error, NoSuchLedgerError) and ledger_id == self.ledger_id:
            return self.on_ledger_gone(ledger_id, now_ms)  # its metadata was deleted under the writer
        if isinstance(error, LedgerFencedError):
            error = WriterFencedError(f"stream {self.settings.stream!r} was taken over by another writer "
                                      f"(ledger {ledger_id} was fenced); the outcome of pending records is unknown")
        return self._fail(error, now_ms)

    def on_ledger_closed(self, ledger_id: int, error: DlogError | None, now_ms: int) -> list[Any]:
        """The close of a ledger whose segment is already committed as completed (or dropped):
        an error leaves the ledger open in its own metadata, which no reader relies on, except
        that its metadata is gone: then the ledger stays closing until the list says whether that
        lost records (`on_ledger_deleted`)."""
        if isinstance(error, NoSuchLedgerError) and ledger_id in self._closing_ledgers and not self.ended:
            return self.on_ledger_gone(ledger_id, now_ms)
        self._closing_ledgers.discard(ledger_id)
        effects: list[Any] = []
        if self._delete_after_commit == ledger_id:
            self._delete_after_commit = None
            effects.append(DeleteLedger(ledger_id))
        effects += self._maybe_closed(now_ms)
        return effects

    def on_operation_failed(self, error: DlogError, now_ms: int) -> list[Any]:
        """A segment-store or ledger operation failed for good (its driver retried what it could)."""
        self._step = None
        self._commit = None
        return self._fail(error, now_ms)

    def on_time(self, now_ms: int) -> list[Any]:
        self._timer_at_ms = None
        effects: list[Any] = []
        if self.state is WriterState.OPEN and not self.rolling and self._roll_due(now_ms) \
                and self.next_chunk_id - 1 >= self._group_end_chunk_id:
            effects += self._start_roll()
        effects += self._pump(now_ms)
        return self._finish(effects, now_ms)

    # ------------------------------------------------------------------ ledgers deleted under the writer

    def on_ledger_gone(self, ledger_id: int, now_ms: int) -> list[Any]:
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

    def on_ledger_deleted(self, ledger_id: int, listing: SegmentList, now_ms: int) -> list[Any]:
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

    def abort(self, error: DlogError, now_ms: int) -> list[Any]:
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
        settings = self.settings
        if self.rolling or self.segment_records == 0:
            return False
        if self.state is WriterState.CLOSING and not self.buffer:
            return False
        if self.state is not WriterState.OPEN and self.state is not WriterState.CLOSING:
            return False
        full = bool((settings.roll_bytes and self.segment_bytes >= settings.roll_bytes)
                    or (settings.roll_records and self.segment_records >= settings.roll_records))
        old = bool(settings.roll_age_ms and now_ms - self.segment_started_ms >= settings.roll_age_ms)
        return full or (old and self.state is WriterState.OPEN)

    def _start_roll(self) -> list[Any]:
        self.rolling = True
        self._step = "create"
        return [CreateLedger()]

    def _maybe_commit_roll(self, now_ms: int) -> list[Any]:
        if (not self.rolling or self.in_flight or self.new_ledger_id is None or self._step is not None
                or self._gone is not None):
            return NO_EFFECTS
        assert self.segment is not None
        completed = changes.sealed_segment(
            self.segment, last_entry=self.next_entry_id - 1, records=self.segment_records,
            size_bytes=self.segment_bytes, first_timestamp_ms=self.segment_first_ts,
            last_timestamp_ms=self.segment_last_ts, now_ms=now_ms)
        created = Segment(self._listing().max_sequence + 1, self.new_ledger_id, created_ms=now_ms)
        return self._start_commit("roll", SegmentChange(update=(completed,), create=(created,)))

    # ------------------------------------------------------------------ closing

    def close(self, now_ms: int) -> list[Any]:
        if self.state in (WriterState.CLOSED, WriterState.CLOSING):
            return NO_EFFECTS
        if self.state is WriterState.FAILED:
            self.state = WriterState.CLOSED
            return self._release() + [WriterClosed()]
        invariant(self.state is WriterState.OPEN, f"close() while {self.state.value}")
        self.state = WriterState.CLOSING
        self._forced_through = self.next_chunk_id + 2**62
        effects = self._pump(now_ms)
        effects += self._maybe_seal(now_ms)
        return self._finish(effects, now_ms)

    def _maybe_seal(self, now_ms: int) -> list[Any]:
        if (self.state is not WriterState.CLOSING or self.rolling or self.buffer or self.in_flight
                or self._step is not None or self.segment is None or self._gone is not None):
            return NO_EFFECTS
        if self.segment_records == 0:
            return self._start_commit("close", SegmentChange(delete=(self.segment,)))
        completed = changes.sealed_segment(
            self.segment, last_entry=self.next_entry_id - 1, records=self.segment_records,
            size_bytes=self.segment_bytes, first_timestamp_ms=self.segment_first_ts,
            last_timestamp_ms=self.segment_last_ts, now_ms=now_ms)
        return self._start_commit("close", SegmentChange(update=(completed,)))

    def _maybe_closed(self, now_ms: int) -> list[Any]:
        if (self.state is not WriterState.CLOSING or self.segment is not None or self._closing_ledgers
                or self._delete_after_commit is not None):
            return NO_EFFECTS
        self.state = WriterState.CLOSED
        return self._release() + [WakeWriters(), WriterClosed(), SetTimer(None)]

    def _release(self) -> list[Any]:
        if not self.locked:
            return []
        self.locked = False
        return [ReleaseLock()]

    # ------------------------------------------------------------------ failure

    def _fail(self, error: DlogError, now_ms: int) -> list[Any]:
        """The writer ends with `error`: every chunk not yet acknowledged fails with it."""
        if self.ended:
            return NO_EFFECTS
        previous = self.state
        self.state, self.error = WriterState.FAILED, error
        effects: list[Any] = []
        if self.next_chunk_id > self.first_unresolved_chunk_id:
            effects.append(FailChunks(self.first_unresolved_chunk_id, error))
            self.first_unresolved_chunk_id = self.next_chunk_id
        self.buffer.clear()
        self.in_flight.clear()
        self.buffered_bytes = self.buffered_records = self.in_flight_bytes = 0
        if self.new_ledger_id is not None and self._step != "commit":
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

    def closed_error(self) -> DlogError:
        """What a write to this writer raises now."""
        if self.error is not None:
            return self.error
        return WriterClosedError(f"the writer of stream {self.settings.stream!r} is closed")

    # ------------------------------------------------------------------ helpers

    def _expect(self, step: str) -> None:
        invariant(self._step == step, f"answer to {step!r} while {self._step!r} is outstanding")
        self._step = None

    def _listing(self) -> SegmentList:
        assert self.listing is not None
        return self.listing

    def _finish(self, effects: Sequence[Any], now_ms: int) -> Sequence[Any]:
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
        settings = self.settings
        if settings.linger_ms and self.buffer and self._buffer_since_ms is not None:
            candidates.append(self._buffer_since_ms + int(settings.linger_ms + 0.999))
        if settings.roll_age_ms and self.segment_records and not self.rolling and self.state is WriterState.OPEN:
            candidates.append(self.segment_started_ms + settings.roll_age_ms)
        future = [at_ms for at_ms in candidates if at_ms > now_ms]
        return min(future) if future else None
