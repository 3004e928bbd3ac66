"""Batching records into entries: the half of the stream writer machine that decides what goes
out and when, and keeps every caller's waiter until its records end (`writer` is the other half:
the writer's life and the segment commits around its entries).

Theory of operation. Records (and pieces of Arrow batches) are buffered as chunks, in order, each
with its waiter. An entry is a run of chunks: up to `flush_records` records and `flush_bytes`
bytes, and never more than fits in one entry of min(roll size, entry maximum) (a piece of a batch
is an entry of its own). When nothing is in flight an entry goes out at once (with the writer's
`flush_rounds`, at the process's next flush round: see `writer`); while
`partial_entries_in_flight_max` entries are in flight, records that arrive batch up until an
acknowledgement frees a slot (Nagle's algorithm without delayed ack; Kafka's linger.ms=0), or
until they fill an entry, which always goes out. `linger_ms` > 0 also holds a partial entry that
long for more records. A flush (and a close) sends every chunk buffered before it, as partial
entries if need be. Buffered and in-flight bytes are bounded by `buffer_bytes_max`: `writable`
says whether there is room, WakeWriters when room comes back.

Waiters. A chunk keeps its waiter until it ends: acknowledged with its entry (CompleteChunks;
entries are acknowledged in order), or failed with every chunk not acknowledged yet (FailChunks).
A flush's waiter waits for every chunk written before it (CompleteFlushes).

Whether anything may go out at all (the writer is open, not rolling, its ledger not gone) is the
writer machine's: it asks for one entry at a time (`next_entry`), and reads what went into the
segment so far in `progress`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bookkeeper.errors import DlogError, invariant
from dlog.core.effects import AppendEntry, CompleteChunks, CompleteFlushes, FailChunks, WakeWriters
from dlog.core.settings import WriterSettings, entry_budget_bytes

# encode(items, first_record_index) -> (payload, min timestamp ms, max timestamp ms), the range of
# the records' timestamps it wrote into the entry's header: a pure function (the record-set
# codec's `encode_entry` in the driver)
Encoder = Callable[[Sequence[Any], int], tuple[bytes, int, int]]

# a buffered chunk: (chunk id, item, records, size bytes, alone, waiter); `alone` chunks (batch
# pieces) are entries of their own
Chunk = tuple[int, Any, int, int, bool, Any]


@dataclass(slots=True)
class InFlightEntry:
    ledger_id: int
    entry_id: int
    end_chunk_id: int  # the chunk after its last one
    size_bytes: int  # as counted for the buffer bound
    waiters: tuple[Any, ...]
    records: tuple[int, ...]  # of each waiter's chunk
    first_position: int | None  # the stream position of its first record (None: not assigned)


@dataclass(slots=True)
class SegmentProgress:
    """What this writer sent into the segment it writes (acknowledged or not)."""

    ledger_id: int | None = None
    started_ms: int = 0
    first_position: int | None = None  # the segment's
    next_entry_id: int = 0
    records: int = 0
    bytes: int = 0
    first_timestamp_ms: int = 0
    last_timestamp_ms: int = 0


class EntryBatcher:
    def __init__(self, settings: WriterSettings, encode: Encoder) -> None:
        self.settings = settings
        self.encode = encode
        self.budget_bytes = entry_budget_bytes(settings.entry_bytes_limit)
        invariant(self.budget_bytes > 0, f"entry limit {settings.entry_bytes_limit} leaves no room for records")
        self.buffer: deque[Chunk] = deque()
        self.buffered_bytes = 0
        self.buffered_records = 0
        self.in_flight: deque[InFlightEntry] = deque()
        self.in_flight_bytes = 0
        self.next_chunk_id = 0
        self.first_unresolved_chunk_id = 0
        self.sent_chunk_id = -1  # the last chunk sent
        self.group_end_chunk_id = -1  # a write_group is sent whole, never cut by a roll
        self.forced_through = 0  # chunks below this id go out even as partial entries (flush, close)
        self.buffer_since_ms: int | None = None
        self.full = False  # found without room since the last WakeWriters
        self.flushes: deque[tuple[int, Any]] = deque()  # (chunk id every chunk below which must end, waiter)
        self.progress = SegmentProgress()

    # ------------------------------------------------------------------ queries

    @property
    def writable(self) -> bool:
        return self.buffered_bytes + self.in_flight_bytes < self.settings.buffer_bytes_max

    @property
    def mid_group(self) -> bool:
        """Whether the entries sent so far end inside a write_group, which no roll may cut."""
        return self.sent_chunk_id < self.group_end_chunk_id

    @property
    def entry_due(self) -> bool:
        """Whether the buffered records fill an entry (a flush limit is met): it goes out now."""
        settings = self.settings
        return self.buffered_records >= settings.flush_records or self.buffered_bytes >= settings.flush_bytes

    def check_record(self, size_bytes: int) -> str | None:
        """Why a record of this size can never be written (None: it can)."""
        if size_bytes > self.budget_bytes:
            return (f"a record of {size_bytes} bytes does not fit in one entry of at most "
                    f"{self.settings.entry_bytes_limit} bytes (the smaller of the stream's roll size and the "
                    f"writer's entry_bytes_max); write smaller records or raise those limits")
        return None

    def linger_deadline_ms(self) -> int | None:
        """When the oldest buffered record's linger ends (None: nothing lingers)."""
        linger_ms = self.settings.linger_ms
        if linger_ms and self.buffer and self.buffer_since_ms is not None:
            return self.buffer_since_ms + int(linger_ms + 0.999)
        return None

    def waiters(self) -> list[Any]:
        """Every waiter of a chunk not ended yet, oldest first."""
        return [waiter for entry in self.in_flight for waiter in entry.waiters] + [chunk[5] for chunk in self.buffer]

    # ------------------------------------------------------------------ buffering

    def add(self, item: Any, size_bytes: int, waiter: Any, now_ms: int, records: int = 1) -> bool:
        """Buffer one record (the hot path of per-record writes: nothing it need not do), or a run
        of `records` records that must share one entry (an idempotent producer's batch, never cut
        between entries, or records taken at once by `offer_records`, at most an entry's budget,
        which the caller splits by); whether an entry may be due now (a slot is free, or a flush
        limit is met)."""
        chunk_id = self.next_chunk_id
        self.next_chunk_id = chunk_id + 1
        self.buffer.append((chunk_id, item, records, size_bytes, False, waiter))
        self.buffered_bytes += size_bytes
        self.buffered_records += records
        if self.buffer_since_ms is None:
            self.buffer_since_ms = now_ms
        if not self.writable:
            self.full = True
        settings = self.settings
        return (len(self.in_flight) < settings.partial_entries_in_flight_max
                or self.buffered_records >= settings.flush_records or self.buffered_bytes >= settings.flush_bytes)

    def add_group(self, pieces: Sequence[tuple[Any, int, int]], waiter: Any, now_ms: int) -> None:
        """Buffer pieces (item, records, size bytes) of one write_group, one entry each, all sent
        at once whatever the flush limits; `waiter` hears of each piece."""
        for item, records, size_bytes in pieces:
            self.buffer.append((self.next_chunk_id, item, records, size_bytes, True, waiter))
            self.next_chunk_id += 1
            self.buffered_bytes += size_bytes
            self.buffered_records += records
        if self.buffer_since_ms is None:
            self.buffer_since_ms = now_ms
        self.forced_through = self.next_chunk_id
        if not self.writable:
            self.full = True

    def force_through(self, chunk_id: int) -> None:
        """Send every chunk below `chunk_id` even as partial entries (a flush, a close)."""
        self.forced_through = chunk_id

    def add_flush(self, waiter: Any) -> list[Any]:
        """Wait for every chunk written so far to end: at once when none is pending."""
        if self.first_unresolved_chunk_id >= self.next_chunk_id:
            return [CompleteFlushes((waiter,))]
        self.flushes.append((self.next_chunk_id, waiter))
        return []

    # ------------------------------------------------------------------ sending

    def next_entry(self, now_ms: int) -> AppendEntry | None:
        """Send the next entry if the batching rules let it go now: a full entry always, a
        partial one while a slot is free and its linger is over, or when forced through."""
        if not self.buffer:
            return None
        taken, records, size_bytes, full = self._next_run()
        if not full and self.buffer[taken - 1][0] >= self.forced_through:
            settings = self.settings
            if len(self.in_flight) >= settings.partial_entries_in_flight_max:
                return None
            if settings.linger_ms and now_ms - (self.buffer_since_ms or now_ms) < settings.linger_ms:
                return None
        return self._send(taken, records, size_bytes, now_ms)

    def _next_run(self) -> tuple[int, int, int, bool]:
        """How many chunks from the front form the next entry, their records and size, and
        whether the entry is full (it cannot grow: more would not fit, or a flush limit is met)."""
        buffer, settings = self.buffer, self.settings
        if buffer[0][4]:  # a batch piece: an entry of its own
            return 1, buffer[0][2], buffer[0][3], True
        taken = records = size_bytes = 0
        for _, _, chunk_records, chunk_bytes, alone, _ in buffer:
            if alone or (taken and (size_bytes + chunk_bytes > self.budget_bytes)):
                return taken, records, size_bytes, True
            taken, records, size_bytes = taken + 1, records + chunk_records, size_bytes + chunk_bytes
            if records >= settings.flush_records or size_bytes >= settings.flush_bytes:
                return taken, records, size_bytes, True
        return taken, records, size_bytes, False

    def _send(self, taken: int, records: int, size_bytes: int, now_ms: int) -> AppendEntry:
        progress = self.progress
        ledger_id = progress.ledger_id
        assert ledger_id is not None
        chunks = [self.buffer.popleft() for _ in range(taken)]
        chunk_ids, items, counts, _, alone, waiters = zip(*chunks, strict=True)
        if alone[0] and taken == 1:
            self.group_end_chunk_id = max(self.group_end_chunk_id, self._group_end(chunk_ids[0]))
        self.sent_chunk_id = chunk_ids[-1]
        self.buffered_bytes -= size_bytes
        self.buffered_records -= records
        self.buffer_since_ms = now_ms if self.buffer else None
        first_record_index = progress.records  # within the segment: the entry header's
        payload, min_timestamp_ms, max_timestamp_ms = self.encode(items, first_record_index)
        invariant(len(payload) <= self.settings.entry_bytes_limit,
                  f"an entry of {len(payload)} bytes is over the limit {self.settings.entry_bytes_limit}")
        if progress.records == 0:
            progress.first_timestamp_ms = min_timestamp_ms
        progress.last_timestamp_ms = max(progress.last_timestamp_ms, max_timestamp_ms)
        progress.records += records
        progress.bytes += len(payload)
        entry_id = progress.next_entry_id
        progress.next_entry_id += 1
        segment_position = progress.first_position
        first_position = None if segment_position is None else segment_position + first_record_index
        self.in_flight.append(InFlightEntry(ledger_id, entry_id, chunk_ids[-1] + 1, size_bytes, waiters, counts,
                                            first_position))
        self.in_flight_bytes += size_bytes
        return AppendEntry(ledger_id, entry_id, payload)

    def _group_end(self, first_chunk_id: int) -> int:
        """The last chunk id of the run of batch pieces that starts at `first_chunk_id`."""
        end = first_chunk_id
        for chunk in self.buffer:
            if not chunk[4] or chunk[0] != end + 1:
                break
            end = chunk[0]
        return end

    def start_segment(self, ledger_id: int, now_ms: int, first_position: int | None = None) -> None:
        """Entries go to `ledger_id` from entry 0 on, counted afresh; its first record is at stream
        position `first_position`."""
        self.progress = SegmentProgress(ledger_id, now_ms, first_position)

    # ------------------------------------------------------------------ endings

    def acked(self, ledger_id: int, entry_id: int) -> list[Any]:
        """The oldest entry in flight is acknowledged: its chunks complete."""
        invariant(bool(self.in_flight), f"entry {ledger_id}:{entry_id} acknowledged with nothing in flight")
        entry = self.in_flight[0]
        invariant(entry.ledger_id == ledger_id and entry.entry_id == entry_id,
                  f"entry {ledger_id}:{entry_id} acknowledged, {entry.ledger_id}:{entry.entry_id} was next")
        self.in_flight.popleft()
        self.in_flight_bytes -= entry.size_bytes
        self.first_unresolved_chunk_id = entry.end_chunk_id
        effects: list[Any] = [CompleteChunks(ledger_id, entry_id, entry.waiters, entry.records, entry.first_position)]
        if self.flushes and self.flushes[0][0] <= entry.end_chunk_id:
            done = []
            while self.flushes and self.flushes[0][0] <= entry.end_chunk_id:
                done.append(self.flushes.popleft()[1])
            effects.append(CompleteFlushes(tuple(done)))
        if self.full and self.writable:
            self.full = False
            effects.append(WakeWriters())
        return effects

    def fail(self, error: DlogError) -> list[Any]:
        """Every chunk not acknowledged yet, in flight or buffered, ends with `error`; so does
        every flush waiting for them. Nothing stays buffered or in flight."""
        effects: list[Any] = []
        if self.next_chunk_id > self.first_unresolved_chunk_id:
            effects.append(FailChunks(error, tuple(self.waiters())))
            self.first_unresolved_chunk_id = self.next_chunk_id
        if self.flushes:
            effects.append(CompleteFlushes(tuple(waiter for _, waiter in self.flushes)))
            self.flushes.clear()
        self.buffer.clear()
        self.in_flight.clear()
        self.buffered_bytes = self.buffered_records = self.in_flight_bytes = 0
        return effects
