"""The stream reader's rules: resolve the start, read ahead within bounds, tail, follow rolls, and
skip or refuse truncated data.

Theory of operation. A position (segment sequence, entry, slot) says what to fetch next. The
machine walks the segment list from the start position: completed segments are read in ranges up
to their last entry; the in-progress one up to its LAC, then long-polled for the next entry. At
most one operation is outstanding (list read, handle open, range read, long poll).

Read-ahead. Fetched entries wait, undecoded, until the consumer's queue has room, and are decoded
into it (a pure function handed in) one by one: at most `read_ahead_entries` entries and
`read_ahead_bytes` decoded bytes are queued (one entry always fits, however large). Reads start
only while there is room, so a slow consumer holds the reader back without losing anything. The
decoder gets the stream position of the entry's segment from the list the machine holds (V4), so
records read after a list read that brought positions (a stream migrated meanwhile) carry them.

Following. A list-change notification marks the list stale, whatever the machine is doing; the
next step is then a list read (a long poll in flight is cancelled first). Staleness is counted,
not flagged: a notification that arrives while a list read is in flight keeps the list stale, so
a roll seen by a slow reader is never missed. A long poll that finds its ledger closed marks the
list stale too, and so does a run of empty polls, so even a lost notification delays a reader by
a few poll timeouts, never forever.

Truncation (L5). Every new list is checked against the position and against what is queued: data
below a truncation point (a truncated segment, or below `min_active_*` in the segment) is never
handed out; the consumer gets TruncatedError, or with `skip_truncated` the reader moves to the
first record still there. A segment whose ledger is gone without being truncated is data loss:
the same error, or with `skip_truncated` the next segment; unless the segment has a copy on the
tier (its bookie copy was deleted after an offload), which the next open reads instead. Where
readable data starts and ends, and what counts as truncated, are the rules of `dlog.core.snapshot`,
which Spark's planner, `dlog stream info` and the status page follow too; this machine only decides
what a reader does about it.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bookkeeper.errors import DlogError, invariant
from dlog.core import snapshot
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
from dlog.core.snapshot import Cursor
from dlog.offsets import Offset
from dlog.segments.metadata import Segment, SegmentList

READ_BATCH_ENTRIES = 64
EMPTY_POLLS_BEFORE_LIST_READ = 5  # a lost notification delays a tailing reader this many polls at most

END = "end"  # queued after the last record of a reader that does not follow


@dataclass(frozen=True, slots=True)
class ReaderSettings:
    stream: str
    follow: bool = True
    skip_truncated: bool = False
    read_ahead_entries: int = 256
    read_ahead_bytes: int = 64 * 2**20
    poll_timeout_ms: int = 1000
    read_batch_entries: int = READ_BATCH_ENTRIES


# decode(ledger_id, entry_id, first_slot, payload, segment_first_position) -> (item, decoded
# bytes, records); items with no record are not queued. `segment_first_position` is the stream
# position of the segment's first record (None: not assigned yet), from the list the machine holds
Decoder = Callable[[int, int, int, bytes, int | None], tuple[Any, int, int]]


class Start(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"


@dataclass(frozen=True, slots=True)
class AtTimestamp:
    """Start at the first segment that may hold records stamped at or after `timestamp_ms` (the
    driver drops the earlier records of it)."""

    timestamp_ms: int


class ReaderMachine:
    def __init__(self, settings: ReaderSettings, decode: Decoder) -> None:
        self.settings = settings
        self.decode = decode
        self.position: Cursor | None = None
        self.listing: SegmentList | None = None
        self.step: str | None = None
        self.ended = False
        self.opened = False
        self._start: Any = None
        self._notified = 0  # notifications received
        self._listed = 0  # notifications seen by the latest list read
        self._list_read_from = 0  # ... and by the one in flight
        self._cancelled = False
        self._ledger_id: int | None = None  # whose handle is open, and its LAC
        self._lac = -1
        self._gone: int | None = None  # a ledger found missing, waiting for a list read to judge
        self._empty_polls = 0
        self._now_ms = 0
        self._timer_at_ms: int | None = None
        # read, not decoded: (ledger, entry, slot to start from, payload)
        self.fetched: deque[tuple[int, int, int, bytes]] = deque()
        # decoded, for the consumer: (item, bytes, ledger, entry, first slot, records)
        self.queue: deque[tuple[Any, int, int, int, int, int]] = deque()
        self.queued_bytes = 0
        self.held: tuple[Any, int, int, int, int, int] | None = None  # decoded, waiting for room
        self._tail: list[Any] = []  # END or an error, handed out after the queue

    # ------------------------------------------------------------------ queries

    @property
    def queued_entries(self) -> int:
        return len(self.queue)

    @property
    def has_room(self) -> bool:
        """Whether a read may start: nothing fetched or decoded waits, and the queue has room."""
        return (self.held is None and not self.fetched and len(self.queue) < self.settings.read_ahead_entries
                and self.queued_bytes < self.settings.read_ahead_bytes)

    def _fits(self, size_bytes: int) -> bool:
        if len(self.queue) >= self.settings.read_ahead_entries:
            return False
        return not self.queue or self.queued_bytes + size_bytes <= self.settings.read_ahead_bytes

    # ------------------------------------------------------------------ start

    def start(self, start: Start | Offset | AtTimestamp | Cursor, now_ms: int) -> list[Any]:
        """`start`: EARLIEST, LATEST, an Offset, a time (AtTimestamp), or a cursor the driver
        resolved from a stream position (`dlog.core.snapshot.located`; a later truncation is
        judged as for any position the reader holds)."""
        self._start, self._now_ms = start, now_ms
        return self._read_list()

    def _resolve_start(self, listing: SegmentList) -> list[Any]:
        start = self._start
        if start is Start.EARLIEST:
            return self._started(self._earliest(listing))
        if isinstance(start, Cursor):
            return self._started(start)
        if isinstance(start, AtTimestamp):
            segment = next((s for s in listing.live if snapshot.may_hold_at_or_after(s, start.timestamp_ms)), None)
            return self._started(snapshot.start_cursor(segment) if segment is not None
                                 else Cursor(listing.max_sequence + 1, 0, 0))
        in_progress = listing.in_progress
        if start is Start.LATEST:
            if in_progress is None:
                return self._started(Cursor(listing.max_sequence + 1, 0, 0))
            if self._ledger_id != in_progress.ledger_id:
                return self._open(in_progress)
            return self._started(Cursor(in_progress.sequence, snapshot.end_entry(in_progress, self._lac)))
        invariant(isinstance(start, Offset), f"bad start {start!r}")
        return self._start_at_offset(listing, start)

    def _start_at_offset(self, listing: SegmentList, offset: Offset) -> list[Any]:
        stream = self.settings.stream
        segment = listing.by_ledger(offset.ledger_id)
        if segment is None:
            live = ", ".join(str(s.ledger_id) for s in listing.live) or "none"
            return self._open_failed(OffsetOutOfRangeError(
                f"offset {offset} is not in stream {stream!r}: no segment has ledger {offset.ledger_id} "
                f"(its ledgers: {live})"))
        position = Cursor(segment.sequence, offset.entry_id, offset.slot)
        if snapshot.below_truncation(segment, offset.entry_id, offset.slot):
            if not self.settings.skip_truncated:
                return self._open_failed(TruncatedError(
                    f"offset {offset} of stream {stream!r} was truncated; open with skip_truncated=True "
                    "to start at the earliest record"))
            return self._started(self._earliest(listing))
        if segment.is_in_progress and self._ledger_id != segment.ledger_id:
            return self._open(segment)
        limit = snapshot.end_entry(segment, self._lac)
        if offset.entry_id > limit:
            return self._open_failed(OffsetOutOfRangeError(
                f"offset {offset} of stream {stream!r} is in the future: ledger {offset.ledger_id} "
                f"ends before entry {limit}"))
        return self._started(position)

    def _started(self, position: Cursor) -> list[Any]:
        self.position, self.opened = position, True
        return [ReaderOpened(), *self._pump()]

    def _open_failed(self, error: DlogError) -> list[Any]:
        self.ended = True
        return [ReaderOpened(error)]

    def _earliest(self, listing: SegmentList) -> Cursor:
        live = listing.live
        return snapshot.start_cursor(live[0]) if live else Cursor(listing.max_sequence + 1, 0, 0)

    # ------------------------------------------------------------------ answers

    def on_segments(self, listing: SegmentList, now_ms: int) -> list[Any]:
        invariant(self.step == "list", f"a segment list arrived while {self.step!r} was outstanding")
        self.step, self.listing, self._listed = None, listing, self._list_read_from
        self._now_ms = now_ms
        if not self.opened:
            return [] if self.ended else self._resolve_start(listing)
        effects = self._judge_gone(listing)
        effects += self._purge_queue(listing)
        return effects + self._pump()

    def on_segments_changed(self, now_ms: int) -> list[Any]:
        """A list-change notification (from the store's watch)."""
        self._notified, self._now_ms = self._notified + 1, now_ms
        if self.step == "wait" and not self._cancelled:
            self._cancelled = True
            return [CancelWait()]
        return self._pump() if self.opened else []

    def on_segment_opened(self, ledger_id: int, lac: int, now_ms: int) -> list[Any]:
        invariant(self.step == "open", f"a ledger opened while {self.step!r} was outstanding")
        self.step, self._now_ms = None, now_ms
        if self._ledger_id != ledger_id:
            self._ledger_id, self._lac = ledger_id, -1
        self._lac = max(self._lac, lac)
        if not self.opened:
            return [] if self.ended else self._resolve_start(self._known_listing())
        return self._pump()

    def on_ledger_missing(self, ledger_id: int, now_ms: int) -> list[Any]:
        """A segment's ledger is gone: a list read decides whether truncation removed it."""
        invariant(self.step in ("open", "read"), f"ledger missing while {self.step!r} was outstanding")
        self.step, self._gone = None, ledger_id
        if self._ledger_id == ledger_id:
            self._ledger_id, self._lac = None, -1
        if not self.opened:
            self._gone = None
            return self._open_failed(TruncatedError(
                f"stream {self.settings.stream!r}: the ledger {ledger_id} of the start position was deleted"))
        return self._read_list()

    def on_entries(self, ledger_id: int, entries: list[tuple[int, bytes]], now_ms: int) -> list[Any]:
        invariant(self.step == "read", f"entries arrived while {self.step!r} was outstanding")
        self.step, self._now_ms = None, now_ms
        position = self._position()
        for entry_id, payload in entries:
            invariant(entry_id == position.entry_id, f"entry {entry_id} read, {position.entry_id} was next")
            self.fetched.append((ledger_id, entry_id, position.slot, payload))
            position = Cursor(position.sequence, entry_id + 1, 0)
        self.position = position
        return self._pump()

    def on_read_failed(self, error: DlogError, now_ms: int) -> list[Any]:
        """A read or open failed for good: the consumer gets the error after what is queued."""
        self.step = None
        if not self.opened:
            return self._open_failed(error)
        return self.end(error)

    def on_waited(self, ledger_id: int, entry: tuple[int, bytes] | None, lac: int, closed: bool,
                  now_ms: int) -> list[Any]:
        invariant(self.step == "wait", f"a long poll ended while {self.step!r} was outstanding")
        self.step, self._cancelled, self._now_ms = None, False, now_ms
        if ledger_id == self._ledger_id:
            moved = lac > self._lac
            self._lac = max(self._lac, lac)
            self._empty_polls = 0 if moved or entry is not None else self._empty_polls + 1
        position = self._position()
        if entry is not None and entry[0] == position.entry_id:
            self.fetched.append((ledger_id, entry[0], position.slot, entry[1]))
            self.position = Cursor(position.sequence, entry[0] + 1, 0)
        if closed or self._empty_polls >= EMPTY_POLLS_BEFORE_LIST_READ:
            self._empty_polls = 0
            self._notified += 1  # the list must say more: the segment ended, or we missed a change
        return self._pump()

    def on_time(self, now_ms: int) -> list[Any]:
        """The idle timer of a reader waiting for a new segment: look at the list again."""
        self._notified, self._now_ms, self._timer_at_ms = self._notified + 1, now_ms, None
        return self._pump() if self.opened else []

    # ------------------------------------------------------------------ the consumer

    def take(self) -> tuple[Any, list[Any]]:
        """The next queued item: (item, effects); item is None when nothing is queued, END at the
        end, or a DlogError the consumer must raise."""
        if self.queue:
            item, size_bytes = self.queue.popleft()[:2]
            self.queued_bytes -= size_bytes
            return item, self._pump()
        if self._tail:
            return self._tail[0], []
        return None, []

    # ------------------------------------------------------------------ the walk

    def _pump(self) -> list[Any]:
        stale = self._notified > self._listed
        if stale:
            # the list changed: learn how before handing anything more out (a truncation point
            # may have passed what was fetched)
            return self._read_list() if self.step is None and not self.ended else []
        effects = self._decode_fetched()
        if self.step is not None or self.ended or not self.has_room:
            return effects
        listing = self._known_listing()
        while True:
            position = self._position()
            segment = listing.after(position.sequence)
            if segment is None:
                if not self.settings.follow:
                    return effects + self.end(END)
                return effects + self._idle()  # wait for a notification (or the idle timer)
            if (segment.sequence > position.sequence
                    or snapshot.below_truncation(segment, position.entry_id, position.slot)):
                moved = self._moved_to(segment, position)
                if isinstance(moved, DlogError):
                    return effects + self.end(moved)
                self.position = position = moved
            if segment.is_truncated:
                self.position = Cursor(segment.sequence + 1, 0, 0)
                continue
            if segment.ledger_id != self._ledger_id:
                return effects + self._open(segment)
            end = snapshot.end_entry(segment, self._lac)
            if position.entry_id < end:
                last = min(end - 1, position.entry_id + self.settings.read_batch_entries - 1)
                self.step = "read"
                return effects + [ReadEntries(segment, position.entry_id, last)]
            if not segment.is_in_progress:
                self.position = Cursor(segment.sequence + 1, 0, 0)
                continue
            if not self.settings.follow:
                return effects + self.end(END)
            self.step = "wait"
            return effects + [WaitForEntry(segment, position.entry_id, self.settings.poll_timeout_ms)]

    def _moved_to(self, segment: Segment, position: Cursor) -> Cursor | DlogError:
        """The position's segment is gone or partly truncated: move on, or refuse (L5)."""
        moved = snapshot.start_cursor(segment)
        if position.sequence < segment.sequence and position.entry_id == 0 and position.slot == 0:
            return moved  # plainly the start of a later segment: nothing skipped
        if not self.settings.skip_truncated:
            return TruncatedError(
                f"stream {self.settings.stream!r}: position {position.sequence}:{position.entry_id}:"
                f"{position.slot} was truncated while reading; reopen with skip_truncated=True to "
                "continue from the earliest record")
        return moved

    def _decode_fetched(self) -> list[Any]:
        """Move fetched entries into the queue while they fit (decoding each as it goes)."""
        woke = not self.queue and not self._tail
        listing = self._known_listing()
        while True:
            if self.held is None:
                if not self.fetched:
                    break
                ledger_id, entry_id, slot, payload = self.fetched.popleft()
                segment = listing.by_ledger(ledger_id)
                first_slot = snapshot.readable_slot(segment, entry_id, slot)
                if first_slot is None:
                    error = self._truncated_error(ledger_id, entry_id)  # truncated since it was read
                    if error is not None:
                        return self.end(error)
                    continue
                assert segment is not None
                item, size_bytes, records = self.decode(ledger_id, entry_id, first_slot, payload,
                                                        segment.first_position)
                if not records:
                    continue
                self.held = (item, size_bytes, ledger_id, entry_id, first_slot, records)
            if not self._fits(self.held[1]):
                break
            self.queue.append(self.held)
            self.queued_bytes += self.held[1]
            self.held = None
        return [WakeReaders()] if woke and self.queue else []

    def _purge_queue(self, listing: SegmentList) -> list[Any]:
        """Decoded entries a new truncation point passed are never handed out (L5). The held entry
        stays held: moving it into the queue here, behind the consumer's back, once left a consumer
        that had emptied the queue asleep beside a queued entry (the wake comes from _decode_fetched
        only when the queue goes from empty to not)."""
        held = self.held
        waiting = [*self.queue, *([held] if held is not None else [])]
        kept: deque[tuple[Any, int, int, int, int, int]] = deque()
        for queued in waiting:
            _, _, ledger_id, entry_id, first_slot, _ = queued
            segment = listing.by_ledger(ledger_id)
            if snapshot.readable_slot(segment, entry_id, first_slot) == first_slot:
                kept.append(queued)
                continue
            error = self._truncated_error(ledger_id, entry_id)
            if error is not None:
                self.queue, self.held, self.queued_bytes = deque(), None, 0
                return self.end(error)
            if segment is not None and not segment.is_truncated and entry_id == segment.min_active_entry:
                # the point falls inside this entry: read it again from there, and all after it
                self.position = Cursor(segment.sequence, entry_id, segment.min_active_slot)
                self.fetched.clear()
                break
        if held is not None and kept and kept[-1] is held:
            kept.pop()  # still readable: it waits for room as before
        else:
            held = None
        self.held, self.queue = held, kept
        self.queued_bytes = sum(queued[1] for queued in kept)
        return []

    def _truncated_error(self, ledger_id: int, entry_id: int) -> DlogError | None:
        if self.settings.skip_truncated:
            return None
        return TruncatedError(f"stream {self.settings.stream!r}: ledger {ledger_id} entry {entry_id} was "
                              "truncated before it was read; reopen with skip_truncated=True to continue "
                              "from the earliest record")

    def _judge_gone(self, listing: SegmentList) -> list[Any]:
        """The ledger of a segment is gone. Truncation that raced the read has marked it (the walk
        moves on); otherwise its records were removed without a truncation: data loss (L5)."""
        gone, self._gone = self._gone, None
        if gone is None:
            return []
        listed = listing.by_ledger(gone)
        position = self._position()
        if listed is None or snapshot.removed_by_truncation(listed, position.entry_id, position.slot):
            return []
        if listed.tier is not None:  # its bookie copy went after an offload: read on from the tier
            return []
        if listed.compacted is not None:  # compaction replaced it: read on from the compacted copy
            return []
        if not self.settings.skip_truncated:
            return self.end(TruncatedError(
                f"stream {self.settings.stream!r}: the ledger {gone} of segment {listed.sequence} was deleted, "
                f"so its records from entry {position.entry_id} on are gone; reopen with skip_truncated=True "
                "to skip them, or truncate the stream past the segment"))
        self.position = Cursor(listed.sequence + 1, 0, 0)
        return []

    # ------------------------------------------------------------------ helpers

    def _idle(self) -> list[Any]:
        """Nothing to read until the list changes; look again after a while all the same."""
        if self._timer_at_ms is not None:
            return []
        self._timer_at_ms = self._now_ms + self.settings.poll_timeout_ms * EMPTY_POLLS_BEFORE_LIST_READ
        return [SetTimer(self._timer_at_ms)]

    def _read_list(self) -> list[Any]:
        self.step, self._list_read_from = "list", self._notified
        return [ReadSegments()]

    def _open(self, segment: Segment) -> list[Any]:
        self.step = "open"
        return [OpenSegment(segment)]

    def end(self, item: Any) -> list[Any]:
        """Stop reading; the consumer gets `item` (END or an error) after what is queued."""
        self.ended = True
        self.fetched.clear()
        self._tail = [item]
        return [WakeReaders()]

    def _position(self) -> Cursor:
        assert self.position is not None
        return self.position

    def _known_listing(self) -> SegmentList:
        assert self.listing is not None
        return self.listing

