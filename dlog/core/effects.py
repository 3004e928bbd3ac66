"""Effects: what the stream machines ask their driver to do. Frozen, slotted, inert.

Each effect that does I/O has one answer, fed back as the event named in its docstring. A machine
never has two segment-store changes outstanding at once, so answers need no ids beyond the
ledger and entry ids they carry. `WriterEffect` and `ReaderEffect` name what each machine may ask
for; a driver that meets anything else has a bug.

Waiters. What a caller hands the writer machine with a record, a batch or a flush (a future, the
driver's batch collector; None for a record nobody waits for) is the machine's to keep, inert to
it, until an effect hands it back: CompleteChunks, FailChunks or CompleteFlushes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bookkeeper.errors import DlogError
from dlog.segments.metadata import Segment, SegmentChange, SegmentList

# ---------------------------------------------------------------------------------- shared


@dataclass(frozen=True, slots=True)
class ReadSegments:
    """Read the segment list -> `on_segments(listing)`."""


@dataclass(frozen=True, slots=True)
class SetTimer:
    """Call `on_time(now_ms)` at `at_ms` (None: no timer needed). Replaces any earlier timer."""

    at_ms: int | None


# ---------------------------------------------------------------------------------- writer


@dataclass(frozen=True, slots=True)
class LockStream:
    """Take the stream's writer lock within `timeout_s` -> `on_locked(acquired)`."""

    timeout_s: float


@dataclass(frozen=True, slots=True)
class ReleaseLock:
    """Release the writer lock if held (no answer)."""


@dataclass(frozen=True, slots=True)
class SealSegment:
    """Recover the ledger of a previous writer's in-progress segment (this fences that writer)
    and summarize it -> `on_sealed(segment, sealed, ledger_exists)`; `sealed` is the completed
    segment, or None when the ledger holds no entry of it (or is gone)."""

    segment: Segment


@dataclass(frozen=True, slots=True)
class CreateLedger:
    """Create a ledger for the next segment -> `on_ledger_created(ledger_id)`."""


@dataclass(frozen=True, slots=True)
class CommitSegments:
    """Compare-and-set `change` on the list at `based_on.version` -> `on_committed(listing)`, or
    `on_commit_conflict(current)` with the list as it now is when the compare-and-set lost."""

    based_on: SegmentList
    change: SegmentChange


@dataclass(frozen=True, slots=True)
class AppendEntry:
    """Append `payload` as entry `entry_id` of ledger `ledger_id` -> `on_entry_acked` or
    `on_entry_failed`. Entries of one ledger are appended in entry-id order."""

    ledger_id: int
    entry_id: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class CloseLedger:
    """Seal a ledger this writer wrote (after its segment was committed) -> `on_ledger_closed`."""

    ledger_id: int


@dataclass(frozen=True, slots=True)
class DeleteLedger:
    """Delete a ledger no segment references (no answer: a failure only leaves garbage)."""

    ledger_id: int


@dataclass(frozen=True, slots=True)
class ConfirmLedgerDeleted:
    """The metadata of ledger `ledger_id`, whose segment this writer completed, is gone: read the
    segment list -> `on_ledger_deleted(ledger_id, listing)`, which tells a truncation or retention
    (the list no longer names it live) from a deletion that lost records. A read only, so it may
    run beside the one outstanding segment-store change; its answer names its ledger."""

    ledger_id: int


@dataclass(frozen=True, slots=True)
class ApplyRetention:
    """Run the stream's retention policy now (after a roll; no answer)."""


@dataclass(frozen=True, slots=True)
class CompleteChunks:
    """The chunks of entry `entry_id` of `ledger_id` are durable: `waiters[i]` gets its chunk's
    `records[i]` records, which follow on in the entry from slot 0 in this order; the record in
    slot s is at stream position `first_position + s` (None: the segment has no position)."""

    ledger_id: int
    entry_id: int
    waiters: tuple[Any, ...]
    records: tuple[int, ...]
    first_position: int | None = None


@dataclass(frozen=True, slots=True)
class FailChunks:
    """The chunks of `waiters` (every one not acknowledged yet, oldest first) end with `error`
    (WriterFencedError: outcome unknown)."""

    error: DlogError
    waiters: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class CompleteFlushes:
    """Every chunk written before these flushes ended (acknowledged or failed): wake their
    `waiters`, oldest first."""

    waiters: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class WakeWriters:
    """Buffer room came back, or the writer ended: wake callers parked in wait_writable()."""


@dataclass(frozen=True, slots=True)
class RequestRound:
    """Call `on_round(now_ms)` once this event-loop turn's callbacks have run, in the one flush
    round the process runs per turn for every writer that asked (`WriterSettings.flush_rounds`):
    the records that arrived meanwhile go out together, and the driver builds the entries of
    all those writers at once. Asked at most once until `on_round` runs."""


ROUND = RequestRound()  # inert: one instance serves every writer


@dataclass(frozen=True, slots=True)
class WriterOpened:
    """Opening ended: with the in-progress segment this writer appends to, or with `error`."""

    segment: Segment | None
    error: DlogError | None = None


@dataclass(frozen=True, slots=True)
class WriterClosed:
    """Closing ended (the lock is released); `error` when the close itself failed."""

    error: DlogError | None = None


# ---------------------------------------------------------------------------------- reader


@dataclass(frozen=True, slots=True)
class OpenSegment:
    """Open (or refresh) the read handle of a segment's ledger -> `on_segment_opened(ledger_id,
    lac)`, or `on_ledger_missing(ledger_id)` when its ledger is gone."""

    segment: Segment


@dataclass(frozen=True, slots=True)
class ReadEntries:
    """Read entries first..last of the segment's ledger -> `on_entries(ledger_id, entries)`."""

    segment: Segment
    first_entry: int
    last_entry: int


@dataclass(frozen=True, slots=True)
class WaitForEntry:
    """Long-poll the segment's ledger for `entry_id` (at most `timeout_ms`) -> `on_waited(ledger_id,
    entry, lac, closed)`."""

    segment: Segment
    entry_id: int
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class CancelWait:
    """Stop the long poll in flight early; its answer then comes as `on_waited(..., None, ...)`."""


@dataclass(frozen=True, slots=True)
class ReaderOpened:
    """The start position is resolved (reads begin), or opening failed with `error`."""

    error: DlogError | None = None


@dataclass(frozen=True, slots=True)
class WakeReaders:
    """Something was queued for the consumer (records, the end, or an error)."""


WriterEffect = (LockStream | ReleaseLock | ReadSegments | SealSegment | CreateLedger | CommitSegments
                | AppendEntry | CloseLedger | DeleteLedger | ConfirmLedgerDeleted | ApplyRetention
                | CompleteChunks | FailChunks | CompleteFlushes | WakeWriters | SetTimer | WriterOpened
                | WriterClosed | RequestRound)
ReaderEffect = (ReadSegments | SetTimer | OpenSegment | ReadEntries | WaitForEntry | CancelWait | ReaderOpened
                | WakeReaders)
Effect = WriterEffect | ReaderEffect
