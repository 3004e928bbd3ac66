"""The stream reader: catch-up reads of completed segments, tailing of the in-progress one.

Theory of operation. A producer task walks the segment list from the start position and puts
decoded entries (Arrow record batches with their ledger and entry ids) into a bounded queue: the
read-ahead. Completed segments are read in ranges up to their last entry. The in-progress segment
is tailed with the bookie long poll; a ZooKeeper watch on the segment list interrupts the wait, so
a roll (the segment completed, a new one appeared) is followed at once rather than after a poll
timeout. The consumer takes records one by one (`async for`) or as whole batches (`read_batch`).

Positions below a truncation point raise TruncatedError unless the reader was opened with
`skip_truncated=True`, in which case it moves to the earliest available record (L5).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bookkeeper.errors import ConfigError, DlogError, NoSuchLedgerError
from dlog.offsets import Offset
from dlog.segments.codec import RecordSetCodec
from dlog.segments.metadata import Segment, StreamConfig
from dlog.segments.store import SegmentList

if TYPE_CHECKING:
    from dlog.namespace import Namespace

log = logging.getLogger(__name__)
READ_BATCH_ENTRIES = 32  # entries per ledger read; one more range is fetched ahead (64 in flight)
READ_AHEAD_BYTES = 64 * 2**20  # decoded Arrow bytes a reader holds ahead of its consumer


class TruncatedError(DlogError):
    """The position asked for was removed by truncation or retention."""

    code = 330


class OffsetOutOfRangeError(DlogError):
    code = 331


@dataclass(frozen=True, slots=True)
class Record:
    offset: Offset
    key: bytes | None
    value: bytes
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class EntryBatch:
    """One entry's records; `first_slot` > 0 when the entry was partly truncated or skipped."""

    ledger_id: int
    entry_id: int
    first_slot: int
    batch: pa.RecordBatch


@dataclass(frozen=True, slots=True)
class _Position:
    sequence: int  # segment sequence
    entry_id: int
    slot: int


_END = object()


class StreamReader:
    def __init__(self, namespace: Namespace, config: StreamConfig, start: str | Offset | int = "earliest",
                 *, skip_truncated: bool = False, read_ahead_entries: int = 256,
                 read_ahead_bytes: int = READ_AHEAD_BYTES, poll_timeout_ms: int = 1000,
                 follow: bool = True) -> None:
        for option, value in (("read_ahead_entries", read_ahead_entries),
                              ("read_ahead_bytes", read_ahead_bytes), ("poll_timeout_ms", poll_timeout_ms)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"bad {option} {value!r}: use a whole number >= 1")
        self.namespace = namespace
        self.config = config
        self.name = config.name
        self.codec = RecordSetCodec(namespace.schema_of(config))
        self.start = start
        self.skip_truncated = skip_truncated
        self.poll_timeout_ms = poll_timeout_ms
        self.follow = follow
        self._queue: asyncio.Queue[Any] = asyncio.Queue(read_ahead_entries)
        # read-ahead is bounded in entries and in decoded bytes (an entry may hold 10 MiB of Arrow
        # data); one entry is always let through, however large, so a reader never stalls on it
        self.read_ahead_bytes = read_ahead_bytes
        self._queued_bytes = 0
        self._dequeued = asyncio.Event()
        self._producer: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._unwatch: Any = None
        self._current: EntryBatch | None = None
        self._current_rows: dict[str, list[Any]] | None = None
        self._current_index = 0
        self._skip_before_ms: int | None = None
        self.position: Offset | None = None  # of the next record to hand out
        self._done = False

    # ------------------------------------------------------------------ open and close

    async def open(self) -> StreamReader:
        store = self.namespace.store
        self._unwatch = store.watch_segments(self.name, self._changed.set)
        listing = await store.segments(self.name)
        position = await self._resolve_start(listing)
        self._producer = asyncio.get_running_loop().create_task(self._produce(position))
        return self

    async def close(self) -> None:
        producer = self._producer
        # Python 3.11's wait_for can swallow a cancel that lands just as its wait ends, so cancel
        # again until the producer has really stopped (bounded: it stops within a few tries)
        for _ in range(100):
            if producer is None or producer.done():
                break
            producer.cancel()
            await asyncio.wait({producer}, timeout=0.1)
        if producer is not None and producer.done() and not producer.cancelled():
            producer.exception()  # retrieved: an error it ended with was already queued
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None

    async def __aenter__(self) -> StreamReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ start positions

    async def _resolve_start(self, listing: SegmentList) -> _Position:
        start = self.start
        if isinstance(start, str) and start not in ("earliest", "latest"):
            start = Offset.parse(start)
        if start == "earliest":
            return self._earliest(listing)
        if start == "latest":
            return await self._latest(listing)
        if isinstance(start, int) and not isinstance(start, bool):  # a timestamp in ms
            self._skip_before_ms = start
            return self._by_timestamp(listing, start)
        if isinstance(start, Offset):
            return await self._at_offset(listing, start)
        raise ConfigError(f"bad start {start!r}: use 'earliest', 'latest', an offset 'L:E[:S]' or a "
                          "timestamp in ms")

    def _earliest(self, listing: SegmentList) -> _Position:
        live = listing.live
        if not live:
            return _Position(listing.max_sequence + 1, 0, 0)
        first = live[0]
        return _Position(first.sequence, max(first.first_entry, first.min_active_entry),
                         first.min_active_slot)

    async def _latest(self, listing: SegmentList) -> _Position:
        segment = listing.in_progress
        if segment is None:
            return _Position(listing.max_sequence + 1, 0, 0)
        handle = await self.namespace.open_segment_ledger(self.config, segment)
        return _Position(segment.sequence, handle.last_add_confirmed + 1, 0)

    def _by_timestamp(self, listing: SegmentList, timestamp_ms: int) -> _Position:
        for segment in listing.live:
            if segment.is_in_progress or segment.last_timestamp_ms >= timestamp_ms:
                return _Position(segment.sequence, max(segment.first_entry, segment.min_active_entry),
                                 segment.min_active_slot)
        return _Position(listing.max_sequence + 1, 0, 0)

    async def _at_offset(self, listing: SegmentList, offset: Offset) -> _Position:
        segment = listing.by_ledger(offset.ledger_id)
        if segment is None:
            live = ", ".join(str(s.ledger_id) for s in listing.live) or "none"
            raise OffsetOutOfRangeError(f"offset {offset} is not in stream {self.name!r}: no segment "
                                        f"has ledger {offset.ledger_id} (its ledgers: {live})")
        position = _Position(segment.sequence, offset.entry_id, offset.slot)
        if self._below_truncation(segment, position):
            if not self.skip_truncated:
                raise TruncatedError(f"offset {offset} of stream {self.name!r} was truncated; open "
                                     "with skip_truncated=True to start at the earliest record")
            return self._earliest(listing)
        limit = segment.last_entry + 1
        if segment.is_in_progress:
            limit = (await self.namespace.open_segment_ledger(self.config, segment)).last_add_confirmed + 1
        if offset.entry_id > limit:
            raise OffsetOutOfRangeError(f"offset {offset} of stream {self.name!r} is in the future: "
                                        f"ledger {offset.ledger_id} ends before entry {limit}")
        return position

    @staticmethod
    def _below_truncation(segment: Segment, position: _Position) -> bool:
        return segment.is_truncated or (position.entry_id, position.slot) < (
            segment.min_active_entry, segment.min_active_slot)

    # ------------------------------------------------------------------ producer

    async def _produce(self, position: _Position) -> None:
        try:
            while True:
                listing = await self.namespace.store.segments(self.name)
                segment = next((s for s in listing.segments if s.sequence >= position.sequence), None)
                if segment is None:
                    if not self.follow:
                        break
                    await self._wait_change()
                    continue
                if segment.sequence > position.sequence or self._below_truncation(segment, position):
                    position = self._moved_to(segment, position)
                if segment.is_truncated:
                    position = _Position(segment.sequence + 1, 0, 0)
                    continue
                try:
                    position = await self._read_segment(segment, position)
                except NoSuchLedgerError:
                    position = await self._ledger_gone(segment, position)
                    continue
                if position is None:
                    break
            await self._queue.put(_END)
        except DlogError as exc:
            await self._queue.put(exc)
        except asyncio.CancelledError:
            raise

    def _moved_to(self, segment: Segment, position: _Position) -> _Position:
        """The position's segment is gone or partly truncated: move on, or refuse (L5)."""
        moved = _Position(segment.sequence, max(segment.first_entry, segment.min_active_entry),
                          segment.min_active_slot)
        if position.sequence < segment.sequence and position.entry_id == 0 and position.slot == 0:
            return moved  # plainly the start of a later segment, nothing skipped
        if self._below_truncation(segment, position) or position.sequence < segment.sequence:
            if not self.skip_truncated:
                raise TruncatedError(
                    f"stream {self.name!r}: position {position.sequence}:{position.entry_id}:"
                    f"{position.slot} was truncated while reading; reopen with skip_truncated=True "
                    "to continue from the earliest record")
            log.warning("stream %s: skipped truncated records up to segment %d entry %d", self.name,
                        moved.sequence, moved.entry_id)
        return moved

    async def _ledger_gone(self, segment: Segment, position: _Position) -> _Position:
        """The segment's ledger was deleted. A truncation that raced this read has already marked it
        in the list (the next turn handles that); otherwise its records were removed without a
        truncation, which is data loss (L5): refuse, or skip the segment when asked to."""
        self.namespace.forget_segment_ledger(segment.ledger_id)
        listing = await self.namespace.store.segments(self.name)
        listed = listing.by_ledger(segment.ledger_id)
        if listed is None or listed.is_truncated or self._below_truncation(listed, position):
            return position
        if not self.skip_truncated:
            raise TruncatedError(
                f"stream {self.name!r}: the ledger {segment.ledger_id} of segment {segment.sequence} was "
                f"deleted, so its records from entry {position.entry_id} on are gone; reopen with "
                "skip_truncated=True to skip them, or truncate the stream past the segment")
        log.warning("stream %s: skipped segment %d, whose ledger %d was deleted", self.name,
                    segment.sequence, segment.ledger_id)
        return _Position(segment.sequence + 1, 0, 0)

    async def _read_segment(self, segment: Segment, position: _Position) -> _Position | None:
        handle = await self.namespace.open_segment_ledger(self.config, segment)
        prefetch = _Prefetch(handle)
        try:
            return await self._read_segment_from(segment, position, handle, prefetch)
        finally:
            prefetch.cancel()

    async def _read_segment_from(self, segment: Segment, position: _Position, handle: Any,
                                 prefetch: _Prefetch) -> _Position | None:
        next_entry = position.entry_id
        first_slot = position.slot
        while True:
            if segment.is_in_progress:
                limit = handle.last_add_confirmed
            else:
                limit = segment.last_entry
                handle.advance_lac(limit)  # the list changed since the handle was opened
            if next_entry <= limit:
                last = min(limit, next_entry + READ_BATCH_ENTRIES - 1)
                entries = await prefetch.take(next_entry, last)
                if last < limit:  # fetched while this range is decoded: bookies and decoding overlap
                    prefetch.start(last + 1, min(limit, last + READ_BATCH_ENTRIES))
                for entry in entries:
                    await self._emit(segment, entry.entry_id, entry.payload, first_slot)
                    first_slot = 0
                next_entry = last + 1
                continue
            if not segment.is_in_progress:
                return _Position(segment.sequence + 1, 0, 0)
            if not self.follow:
                return None
            refreshed, emitted = await self._wait_for_entry(segment, handle, next_entry)
            if emitted:
                next_entry += 1
                first_slot = 0
            if refreshed is not None:
                segment = refreshed

    async def _wait_for_entry(self, segment: Segment, handle: Any,
                              entry_id: int) -> tuple[Segment | None, bool]:
        """Long-poll for the next entry; a change of the segment list interrupts the wait.
        Returns the segment as now listed (if the list changed) and whether the entry was emitted."""
        self._changed.clear()
        poll = asyncio.ensure_future(handle.wait_for_entry(entry_id, self.poll_timeout_ms))
        change = asyncio.ensure_future(self._changed.wait())
        try:
            done, _ = await asyncio.wait({poll, change}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            poll.cancel()  # the reader is closing: nothing may outlive it
            change.cancel()
            raise
        if poll in done:
            change.cancel()
            entry = poll.result()
            if entry is None:
                return None, False
            await self._emit(segment, entry.entry_id, entry.payload, 0)
            return None, True
        poll.cancel()
        await asyncio.gather(poll, return_exceptions=True)
        listing = await self.namespace.store.segments(self.name)
        return listing.by_ledger(segment.ledger_id), False

    async def _wait_change(self) -> None:
        self._changed.clear()
        try:
            await asyncio.wait_for(self._changed.wait(), self.poll_timeout_ms / 1000 * 5)
        except asyncio.TimeoutError:
            pass

    async def _emit(self, segment: Segment, entry_id: int, payload: bytes, first_slot: int) -> None:
        first_slot = segment.first_readable_slot(entry_id, first_slot)
        batch = self.codec.records_from(payload, first_slot)
        if batch.num_rows:
            size = batch.nbytes
            while self._queued_bytes and self._queued_bytes + size > self.read_ahead_bytes:
                self._dequeued.clear()
                await self._dequeued.wait()
            self._queued_bytes += size
            await self._queue.put(EntryBatch(segment.ledger_id, entry_id, first_slot, batch))

    # ------------------------------------------------------------------ consumer

    async def next_entry(self, timeout_s: float | None = None) -> EntryBatch | None:
        """The next entry's records (None at the end, or when `timeout_s` passes first)."""
        if self._done:
            return None
        try:
            if timeout_s is None:
                item = await self._queue.get()
            elif timeout_s <= 0:
                item = self._queue.get_nowait()
            else:
                item = await asyncio.wait_for(self._queue.get(), timeout_s)
        except (asyncio.TimeoutError, asyncio.QueueEmpty):
            return None
        if item is _END:
            self._done = True
            return None
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._queued_bytes -= item.batch.nbytes
        self._dequeued.set()
        return self._skip_early(item)

    def _skip_early(self, item: EntryBatch) -> EntryBatch | None:
        """With a timestamp start, drop records before it (only until the first one after)."""
        if self._skip_before_ms is None or "timestamp" not in item.batch.schema.names:
            return item
        import pyarrow.compute as pc

        keep = pc.greater_equal(pc.cast(item.batch.column("timestamp"), pa.int64()), self._skip_before_ms)
        indices = pc.indices_nonzero(keep)
        if len(indices) == 0:
            return EntryBatch(item.ledger_id, item.entry_id, item.first_slot, item.batch.slice(0, 0))
        first = indices[0].as_py()
        self._skip_before_ms = None
        return EntryBatch(item.ledger_id, item.entry_id, item.first_slot + first, item.batch.slice(first))

    def __aiter__(self) -> StreamReader:
        return self

    async def __anext__(self) -> Record:
        while self._current is None or self._current_index >= self._current.batch.num_rows:
            entry = await self.next_entry()
            if entry is None:
                raise StopAsyncIteration
            self._current, self._current_index, self._current_rows = entry, 0, None
        entry, index = self._current, self._current_index
        if self._current_rows is None:  # one conversion per entry, not per record
            self._current_rows = entry.batch.to_pydict()
        rows = self._current_rows
        self._current_index += 1
        offset = Offset(entry.ledger_id, entry.entry_id, entry.first_slot + index)
        self.position = Offset(entry.ledger_id, entry.entry_id, entry.first_slot + index + 1)
        keys, values, timestamps = rows.get("key"), rows.get("value"), rows.get("timestamp")
        return Record(offset, keys[index] if keys is not None else None,
                      values[index] if values is not None else None,
                      _to_ms(timestamps[index]) if timestamps is not None else 0)

    async def read_batch(self, max_records: int = 65536, timeout_ms: int = 1000) -> pa.RecordBatch | None:
        """Up to `max_records` records as one Arrow batch: what arrived within `timeout_ms` (maybe
        none: an empty batch), or None once a non-following reader reached the end."""
        pieces: list[pa.RecordBatch] = []
        count = 0
        deadline = time.monotonic() + timeout_ms / 1000
        current = self._current
        if current is not None and self._current_index < current.batch.num_rows:
            rest = current.batch.slice(self._current_index, max_records)
            pieces.append(rest)
            count += rest.num_rows
            self._current_index += rest.num_rows
        while count < max_records:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0 and pieces:
                break
            entry = await self.next_entry(max(remaining_s, 0.0))
            if entry is None:
                break
            piece = entry.batch.slice(0, max_records - count)
            pieces.append(piece)
            count += piece.num_rows
            self._current, self._current_index, self._current_rows = entry, piece.num_rows, None
        if pieces:
            last = pieces[-1]
            tail = self._current
            if tail is not None:
                self.position = Offset(tail.ledger_id, tail.entry_id, tail.first_slot + self._current_index)
            return last if len(pieces) == 1 else pa.concat_batches(pieces)
        if self._done:
            return None
        return pa.RecordBatch.from_pylist([], schema=self.codec.schema)


def _to_ms(value: Any) -> int:
    if value is None:
        return 0
    if hasattr(value, "timestamp"):
        return int(value.timestamp() * 1000)
    return int(value)


class _Prefetch:
    """At most one ledger range read ahead of the one being decoded."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._range: tuple[int, int] | None = None
        self._task: asyncio.Task[Any] | None = None

    def start(self, first: int, last: int) -> None:
        self.cancel()
        self._range = (first, last)
        self._task = asyncio.ensure_future(self.handle.read(first, last))

    async def take(self, first: int, last: int) -> Any:
        task, wanted = self._task, self._range
        self._task = self._range = None
        if task is not None and wanted == (first, last):
            return await task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return await self.handle.read(first, last)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task.add_done_callback(_consume)
        self._task = self._range = None


def _consume(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # a prefetch nobody took: its failure was not this reader's

