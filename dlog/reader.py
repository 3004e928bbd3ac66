"""The stream reader: an asyncio driver of the reader machine (`dlog.core.reader`).

    async with ns.open_reader("orders", "earliest") as reader:
        async for record in reader: ...                      # one record at a time
        batch = await reader.read_batch(10_000, timeout_ms=500)  # or Arrow batches
        entry = await reader.next_entry(timeout_s=1.0)       # or entry by entry

A reader starts at "earliest", "latest", an `Offset` (or its text "L:E[:S]"), a stream position
(an int: the record numbered so from the stream's first record, V4) or a time (a
`datetime.datetime`: the first record stamped at or after it; a naive one is local time). Each
record carries its position (`Record.position`, `EntryBatch.first_position`), or None in a stream
written before positions existed, until a writer opens it again.

The rules (where to start, how far to read ahead, when to long-poll, how to follow a roll, what
truncation means for a reader) are the machine's. This module carries out its effects: segment
lists from the store, ledger handles from the namespace's cache (both in its `StreamContext`),
range reads and long polls as tasks whose answers go back to the machine, and the list watch as
notifications. It decodes entries for the machine (the record-set codec) and hands the consumer
what the machine queued.

Positions below a truncation point raise TruncatedError unless the reader was opened with
`skip_truncated=True`, in which case it moves to the earliest available record (L5). A stream
position is resolved before the machine starts (`dlog.snapshot.SegmentReads.locate`: binary
searches over the list and entry headers); the machine starts at the cursor found.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from bookkeeper.errors import ConfigError, DlogError, NoSuchEntryError, NoSuchLedgerError
from bookkeeper.runtime import start_task
from dlog.context import StreamContext
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
from dlog.core.errors import OffsetOutOfRangeError, PositionsUnknownError, TruncatedError
from dlog.core.reader import END, AtTimestamp, ReaderMachine, ReaderSettings, Start
from dlog.core.snapshot import Cursor, Located, PositionAt, StreamView
from dlog.offsets import Offset, check_position, record_offset
from dlog.segments.codec import FLAG_PRODUCERS, ProducerRun, RecordSetCodec
from dlog.segments.compacted import CompactedEntry
from dlog.segments.metadata import Segment
from dlog.segments.schemas import Projection, projection, schema_at, versions_of
from dlog.snapshot import PREFER

__all__ = ["EntryBatch", "OffsetOutOfRangeError", "PositionsUnknownError", "Record", "StreamReader",
           "TruncatedError"]

log = logging.getLogger(__name__)
READ_AHEAD_BYTES = 64 * 2**20  # decoded Arrow bytes a reader holds ahead of its consumer
SEGMENT_VERSIONS_KEPT = 64  # segments whose schema version a reader remembers (it reads one or two at a time)


@dataclass(frozen=True, slots=True)
class Record:
    offset: Offset  # with its `position` when known
    key: bytes | None
    value: bytes | None  # None only in a typed stream without a `value` column
    timestamp_ms: int
    headers: list[tuple[str, bytes | None]] | None = None  # only from a reader opened with headers=True
    fields: dict[str, Any] | None = None  # a typed stream's record: its columns (the reader's schema version)

    @property
    def position(self) -> int | None:
        """The record's stream position (None: the stream has no positions yet)."""
        return self.offset.position


@dataclass(frozen=True, slots=True)
class EntryBatch:
    """One entry's records; `first_slot` > 0 when the entry was partly truncated or skipped. The
    batch's row i is at stream position `first_position + i` (None: not known yet)."""

    ledger_id: int
    entry_id: int
    first_slot: int
    batch: pa.RecordBatch
    first_position: int | None = None
    # the idempotent producers' batches the whole entry holds (slots count from the entry's first
    # record, not from `first_slot`): what a serving-tier owner rebuilds its dedup table from
    producers: tuple[ProducerRun, ...] = ()
    # a compacted segment's entry holds only the records compaction kept: row i is at slot
    # slots[i] and stream position positions[i] (None: dense, first_slot + i and first_position + i)
    slots: tuple[int, ...] | None = None
    positions: tuple[int, ...] | None = None

    def slot_of(self, row: int) -> int:
        return self.first_slot + row if self.slots is None else self.slots[row]

    def position_of(self, row: int) -> int | None:
        if self.positions is not None:
            return self.positions[row]
        return None if self.first_position is None else self.first_position + row


class StreamReader:
    def __init__(self, context: StreamContext, start: str | Offset | int | datetime.datetime = "earliest",
                 *, skip_truncated: bool = False, read_ahead_entries: int = 256,
                 read_ahead_bytes: int = READ_AHEAD_BYTES, poll_timeout_ms: int = 1000,
                 follow: bool = True, headers: bool = False, prefer: str = "bookies",
                 schema_version: int | None = None, compacted: bool = False) -> None:
        if prefer not in PREFER:
            raise ConfigError(f"bad prefer {prefer!r}: use one of {', '.join(PREFER)} (where to read segments "
                              "that are both on bookies and on the tier)")
        self.prefer = prefer
        self.compacted = compacted  # read compacted segments' compacted copies (key compaction)
        for option, value in (("read_ahead_entries", read_ahead_entries),
                              ("read_ahead_bytes", read_ahead_bytes), ("poll_timeout_ms", poll_timeout_ms)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"bad {option} {value!r}: use a whole number >= 1")
        self.context = context
        config = context.config
        self.name = config.name
        self.clock = context.clock
        # a typed stream's records all come in one schema version: the latest, or `schema_version`
        # (each segment's records are decoded with the version they were written with, then projected)
        self._versions = versions_of(config)
        self.schema_version = len(self._versions) if schema_version is None else schema_version
        schema = schema_at(config, self.schema_version) if self._versions or schema_version else context.schema
        self.schema_version = max(self.schema_version, 1) if self._versions else 0
        # headers=True: record headers too (untyped streams): every batch gets the `headers` column
        self.codec = RecordSetCodec(schema, headers=headers)
        self._decoders: dict[int, tuple[RecordSetCodec, Projection | None]] = {self.schema_version: (self.codec, None)}
        self._segment_versions: dict[int, int] = {}  # ledger -> the schema version its records have
        self.start = _parse_start(start)
        self.machine = ReaderMachine(
            ReaderSettings(config.name, follow=follow, skip_truncated=skip_truncated,
                           read_ahead_entries=read_ahead_entries, read_ahead_bytes=read_ahead_bytes,
                           poll_timeout_ms=poll_timeout_ms), self._decode)
        self.loop = asyncio.get_running_loop()
        self._skip_before_ms: int | None = self.start.timestamp_ms if isinstance(self.start, AtTimestamp) else None
        self._queued = asyncio.Event()
        self._opened: asyncio.Future[None] = self.loop.create_future()
        self._handles: dict[int, Any] = {}
        self._tasks: dict[asyncio.Task[None], None] = {}  # ordered: replays are deterministic
        self._wait_cut: asyncio.Future[None] | None = None  # set: the long poll in flight ends now
        self._timer: asyncio.TimerHandle | None = None
        self._unwatch: Callable[[], None] | None = None
        self._closed = False
        self._current: EntryBatch | None = None
        self._current_rows: dict[str, list[Any]] | None = None
        self._current_index = 0
        self.position: Offset | None = None  # of the next record to hand out
        self._done = False

    def now_ms(self) -> int:
        return self.clock.wall_ms()

    @property
    def tasks_running(self) -> int:
        """Effect tasks (list reads, range reads, long polls) not finished yet."""
        return sum(1 for task in self._tasks if not task.done())

    # ------------------------------------------------------------------ open and close

    async def open(self) -> StreamReader:
        self._unwatch = self.context.store.watch_segments(self.name, self._on_change)
        try:
            start = self.start
            resolved = await self._start_at_position(start) if isinstance(start, int) else start
            self.run(self.machine.start(resolved, self.now_ms()))
            await self._opened
        except BaseException:
            await self.close()
            raise
        return self

    async def _start_at_position(self, position: int) -> Cursor | Start:
        """Where the record at stream `position` is (binary searches through the one header cache),
        or one clear error: removed (unless skip_truncated: the earliest record), past the end,
        or a stream without positions yet."""
        context = self.context
        view = await context.reads.view(context.store, self.name, context.password)
        found = await context.reads.locate(view, position, context.password)
        if found.cursor is not None:
            return found.cursor
        if found.at is PositionAt.REMOVED and self.machine.settings.skip_truncated:
            return Start.EARLIEST
        raise await self._position_error(view, position, found)

    async def _position_error(self, view: StreamView, position: int, found: Located) -> DlogError:
        stream = self.name
        if found.at is PositionAt.UNKNOWN:
            return PositionsUnknownError(
                f"stream {stream!r} has no record positions yet: it was written before positions existed, and "
                "they are assigned when a writer next opens it; start at an offset L:E[:S] meanwhile")
        if found.at is PositionAt.FUTURE:
            return OffsetOutOfRangeError(f"position {position} of stream {stream!r} is in the future: the next "
                                         f"record written gets position {found.end_position}")
        earliest, _ = await self.context.reads.position_bounds(view, self.context.password)
        return TruncatedError(f"position {position} of stream {stream!r} was removed by truncation or retention "
                              f"(its records now start at position {earliest}); open with skip_truncated=True "
                              "to start at the earliest record")

    async def close(self) -> None:
        self._closed = True
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        if self._timer is not None:
            self._timer.cancel()
        tasks = [task for task in self._tasks if not task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=10)

    async def __aenter__(self) -> StreamReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ effects

    def run(self, effects: Sequence[Any]) -> None:
        for effect in effects:
            if isinstance(effect, WakeReaders):
                self._queued.set()
            elif isinstance(effect, ReadSegments):
                self._spawn(self._read_segments())
            elif isinstance(effect, OpenSegment):
                self._spawn(self._open_segment(effect.segment))
            elif isinstance(effect, ReadEntries):
                self._spawn(self._read_entries(effect))
            elif isinstance(effect, WaitForEntry):
                self._wait_cut = self.loop.create_future()
                self._spawn(self._wait_for_entry(effect, self._wait_cut))
            elif isinstance(effect, CancelWait):
                if self._wait_cut is not None and not self._wait_cut.done():
                    self._wait_cut.set_result(None)
            elif isinstance(effect, SetTimer):
                self._set_timer(effect.at_ms)
            elif isinstance(effect, ReaderOpened):
                if not self._opened.done():
                    if effect.error is not None:
                        self._opened.set_exception(effect.error)
                    else:
                        self._opened.set_result(None)
            else:
                raise TypeError(f"the reader machine asked for {effect!r}, which this driver cannot do")

    def _feed(self, event: Callable[..., Sequence[Any]], *args: Any) -> None:
        if not self._closed:
            self.run(event(*args, self.now_ms()))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return start_task(self.loop, self._tasks, self._guarded(coroutine), coroutine)

    async def _guarded(self, coroutine: Awaitable[None]) -> None:
        try:
            await coroutine
        except DlogError as exc:
            self._feed(self.machine.on_read_failed, exc)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug: the consumer gets it, nothing is swallowed
            log.exception("stream %s: the reader driver failed", self.name)
            self._crash(exc)

    def _on_change(self) -> None:
        if not self._closed:
            self._feed(self.machine.on_segments_changed)

    async def _read_segments(self) -> None:
        self._feed(self.machine.on_segments, await self.context.store.segments(self.name))

    async def _handle(self, segment: Segment) -> Any:
        try:
            handle = await self.context.reads.segment_handle(segment, self.context.password, self.prefer,
                                                             self.compacted)
        except NoSuchLedgerError:
            self.context.reads.forget(segment.ledger_id)
            self._handles.pop(segment.ledger_id, None)
            self._feed(self.machine.on_ledger_missing, segment.ledger_id)
            return None
        self._handles = {segment.ledger_id: handle}
        return handle

    async def _open_segment(self, segment: Segment) -> None:
        handle = await self._handle(segment)
        if handle is not None:
            self._feed(self.machine.on_segment_opened, segment.ledger_id, handle.last_add_confirmed)

    async def _read_entries(self, effect: ReadEntries) -> None:
        segment = effect.segment
        handle = self._handles.get(segment.ledger_id)
        if handle is None:
            handle = await self._handle(segment)
            if handle is None:
                return
        await self._learn_version(segment)
        if not segment.is_in_progress:
            handle.advance_lac(segment.last_entry)  # the list vouches for it before the close lands
        try:
            entries = await handle.read(effect.first_entry, effect.last_entry)
        except (NoSuchLedgerError, NoSuchEntryError) as exc:
            if segment.compacted is not None:  # compaction replaced it meanwhile: its copy has the records
                handle = await self.context.reads.compacted_handle(segment, self.context.password)
                self._handles = {segment.ledger_id: handle}
                entries = await handle.read(effect.first_entry, effect.last_entry)
                self._feed(self.machine.on_entries, segment.ledger_id, [(e.entry_id, e.payload) for e in entries])
                return
            if segment.tier is not None:  # its bookie copy went after the offload: the file has it
                handle = await self.context.reads.tier_handle(segment.tier, segment.last_entry)
                self._handles = {segment.ledger_id: handle}
                entries = await handle.read(effect.first_entry, effect.last_entry)
                self._feed(self.machine.on_entries, segment.ledger_id, [(e.entry_id, e.payload) for e in entries])
                return
            if isinstance(exc, NoSuchEntryError):
                raise
            self.context.reads.forget(segment.ledger_id)
            self._handles.pop(segment.ledger_id, None)
            self._feed(self.machine.on_ledger_missing, segment.ledger_id)
            return
        self._feed(self.machine.on_entries, segment.ledger_id, [(e.entry_id, e.payload) for e in entries])

    async def _wait_for_entry(self, effect: WaitForEntry, cut: asyncio.Future[None]) -> None:
        """The long poll, which CancelWait ends early: through a future it races, not by cancelling
        this task (a task cancelled before it first ran would never answer the machine)."""
        segment = effect.segment
        await self._learn_version(segment)
        handle = self._handles.get(segment.ledger_id)
        entry = None
        if handle is not None:
            poll = asyncio.ensure_future(handle.wait_for_entry(effect.entry_id, effect.timeout_ms))
            try:
                await asyncio.wait({poll, cut}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not poll.done():
                    poll.cancel()
                    await asyncio.gather(poll, return_exceptions=True)
            if poll.done() and not poll.cancelled():
                error = poll.exception()
                if error is not None and not isinstance(error, NoSuchLedgerError):
                    raise error  # the list read that follows a missing ledger says why
                found = poll.result() if error is None else None
                entry = (found.entry_id, found.payload) if found is not None else None
        if self._closed:
            return
        lac = handle.last_add_confirmed if handle is not None else -1
        closed = handle.is_closed if handle is not None else True
        self._feed(self.machine.on_waited, segment.ledger_id, entry, lac, closed)

    def _set_timer(self, at_ms: int | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if at_ms is not None:
            self._timer = self.loop.call_later(max(0.0, (at_ms - self.now_ms()) / 1000), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._feed(self.machine.on_time)

    def _crash(self, exc: BaseException) -> None:
        self.machine.end(exc)
        if not self._opened.done():
            self._opened.set_exception(exc)
        self._queued.set()

    async def _learn_version(self, segment: Segment) -> None:
        """Note the schema version of a segment's records (a version newer than the reader knows:
        the stream's config read again, for the schemas)."""
        if not self._versions:
            return
        version = max(segment.schema_version, 1)
        if version > len(self._versions):
            self._versions = versions_of(await self.context.store.config(self.name))
        self._segment_versions[segment.ledger_id] = version
        while len(self._segment_versions) > SEGMENT_VERSIONS_KEPT:
            del self._segment_versions[next(iter(self._segment_versions))]

    def _decoder(self, ledger_id: int) -> tuple[RecordSetCodec, Projection | None]:
        """The codec of a segment's records, and their projection onto the reader's version."""
        if not self._versions:
            return self.codec, None
        version = self._segment_versions.get(ledger_id)
        if version is None:  # every read learns its segment's version first (_learn_version)
            raise ConfigError(f"stream {self.name!r}: the schema version of ledger {ledger_id}'s records is "
                              "not known to this reader")
        found = self._decoders.get(version)
        if found is None:
            if version > len(self._versions):
                raise ConfigError(f"stream {self.name!r}: ledger {ledger_id} holds records of schema version "
                                  f"{version}, which the stream's config does not list")
            written = self._versions[version - 1]
            found = self._decoders[version] = (RecordSetCodec(written), projection(
                written, self.codec.schema, version, self.schema_version))
        return found

    def _decode(self, ledger_id: int, entry_id: int, first_slot: int, payload: bytes,
                segment_first_position: int | None) -> tuple[Any, int, int]:
        codec, projected = self._decoder(ledger_id)
        header, batch = codec.decode(payload)
        if projected is not None:
            batch = projected.apply(batch)
        if isinstance(payload, CompactedEntry):  # kept records only, each at its original slot
            return self._decode_compacted(ledger_id, entry_id, first_slot, payload, batch, segment_first_position)
        if first_slot:
            batch = batch.slice(first_slot)
        first_position = None
        if segment_first_position is not None:  # V4: the segment's first, plus the records before this one
            first_position = segment_first_position + header.first_record_index + first_slot
        producers = codec.producer_runs(payload) if header.flags & FLAG_PRODUCERS else ()
        return (EntryBatch(ledger_id, entry_id, first_slot, batch, first_position, producers), batch.nbytes,
                batch.num_rows)

    @staticmethod
    def _decode_compacted(ledger_id: int, entry_id: int, first_slot: int, payload: CompactedEntry,
                          batch: pa.RecordBatch, segment_first_position: int | None) -> tuple[Any, int, int]:
        slots = payload.record_slots
        skip = next((row for row, slot in enumerate(slots) if slot >= first_slot), len(slots))
        batch, slots = batch.slice(skip), slots[skip:]
        positions = None
        if segment_first_position is not None:
            positions = tuple(segment_first_position + index for index in payload.record_indexes[skip:])
        first = slots[0] if slots else first_slot
        return (EntryBatch(ledger_id, entry_id, first, batch, positions[0] if positions else None, (), slots,
                           positions), batch.nbytes, batch.num_rows)

    # ------------------------------------------------------------------ consumer

    async def next_entry(self, timeout_s: float | None = None) -> EntryBatch | None:
        """The next entry's records (None at the end, or when `timeout_s` passes first)."""
        if self._done:
            return None
        deadline = None if timeout_s is None else self.clock.monotonic_s() + timeout_s
        while True:
            item, effects = self.machine.take()
            if effects:
                self.run(effects)
            if item is not None:
                break
            remaining_s = None if deadline is None else deadline - self.clock.monotonic_s()
            if remaining_s is not None and remaining_s <= 0:
                return None
            self._queued.clear()
            try:
                async with asyncio.timeout(remaining_s):
                    await self._queued.wait()
            except TimeoutError:
                return None
        if item == END:
            self._done = True
            return None
        if isinstance(item, BaseException):
            self._done = True
            raise item
        return self._skip_early(item)

    def _skip_early(self, item: EntryBatch) -> EntryBatch | None:
        """With a timestamp start, drop records before it (only until the first one after)."""
        if self._skip_before_ms is None or "timestamp" not in item.batch.schema.names:
            return item
        import pyarrow.compute as pc

        keep = pc.greater_equal(pc.cast(item.batch.column("timestamp"), pa.int64()), self._skip_before_ms)
        indices = pc.indices_nonzero(keep)
        if len(indices) == 0:
            return EntryBatch(item.ledger_id, item.entry_id, item.first_slot, item.batch.slice(0, 0),
                              item.first_position, item.producers)
        first = indices[0].as_py()
        self._skip_before_ms = None
        if item.slots is not None:
            positions = None if item.positions is None else item.positions[first:]
            return EntryBatch(item.ledger_id, item.entry_id, item.slots[first], item.batch.slice(first),
                              item.position_of(first), item.producers, item.slots[first:], positions)
        position = None if item.first_position is None else item.first_position + first
        return EntryBatch(item.ledger_id, item.entry_id, item.first_slot + first, item.batch.slice(first), position,
                          item.producers)

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
        if entry.slots is None:  # the common case inline: this runs once per record
            first_position, slot = entry.first_position, entry.first_slot + index
            position = None if first_position is None else first_position + index
        else:  # a compacted segment's kept records: each at its original slot
            slot, position = entry.slots[index], entry.position_of(index)
        offset = record_offset(entry.ledger_id, entry.entry_id, slot, position)
        self.position = record_offset(entry.ledger_id, entry.entry_id, slot + 1,
                                      None if position is None else position + 1)
        keys, values, timestamps = rows.get("key"), rows.get("value"), rows.get("timestamp")
        headers = rows.get("headers")
        pairs = headers[index] if headers is not None else None
        return Record(offset, keys[index] if keys is not None else None,
                      values[index] if values is not None else None,
                      _to_ms(timestamps[index]) if timestamps is not None else 0,
                      None if pairs is None else [(pair["key"], pair["value"]) for pair in pairs],
                      {name: column[index] for name, column in rows.items()} if self._versions else None)

    async def read_batch(self, max_records: int = 65536, timeout_ms: int = 1000) -> pa.RecordBatch | None:
        """Up to `max_records` records as one Arrow batch: what arrived within `timeout_ms` (maybe
        none: an empty batch), or None once a non-following reader reached the end."""
        pieces: list[pa.RecordBatch] = []
        count = 0
        deadline = self.clock.monotonic_s() + timeout_ms / 1000
        current = self._current
        if current is not None and self._current_index < current.batch.num_rows:
            rest = current.batch.slice(self._current_index, max_records)
            pieces.append(rest)
            count += rest.num_rows
            self._current_index += rest.num_rows
        while count < max_records:
            remaining_s = deadline - self.clock.monotonic_s()
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
            if tail is not None and tail.slots is not None:  # after its last record handed out
                row = self._current_index - 1
                position = tail.position_of(row)
                self.position = Offset(tail.ledger_id, tail.entry_id, tail.slot_of(row) + 1,
                                       None if position is None else position + 1)
            elif tail is not None:
                position = None if tail.first_position is None else tail.first_position + self._current_index
                self.position = Offset(tail.ledger_id, tail.entry_id, tail.first_slot + self._current_index, position)
            return last if len(pieces) == 1 else pa.concat_batches(pieces)
        if self._done:
            return None
        return pa.RecordBatch.from_pylist([], schema=self.codec.schema)


def _parse_start(start: str | Offset | int | datetime.datetime) -> Start | Offset | int | AtTimestamp:
    if isinstance(start, str):
        if start in ("earliest", "latest"):
            return Start(start)
        return Offset.parse(start)
    if isinstance(start, Offset):
        return start
    if isinstance(start, datetime.datetime):
        return AtTimestamp(_first_ms_at_or_after(start))
    if isinstance(start, int) and not isinstance(start, bool):
        return check_position(start, "start position")
    raise ConfigError(f"bad start {start!r}: use 'earliest', 'latest', an offset 'L:E[:S]', a stream position "
                      "(an int) or a time (a datetime.datetime)")


def _first_ms_at_or_after(moment: datetime.datetime) -> int:
    """The first whole millisecond since the epoch at or after `moment` (exact: no float on the
    way); a naive datetime is local time, as on the command line."""
    if moment.tzinfo is None:
        moment = moment.astimezone()
    elapsed = moment - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return -(-elapsed // datetime.timedelta(milliseconds=1))


def _to_ms(value: Any) -> int:
    if value is None:
        return 0
    if hasattr(value, "timestamp"):
        return int(value.timestamp() * 1000)
    return int(value)
