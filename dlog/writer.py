"""The stream writer: one per stream at a time, records batched into entries of one segment.

Theory of operation. Opening takes the stream's writer lock (which only avoids needless fights),
recovers the previous in-progress segment — opening its ledger with recovery fences its writer,
whatever the lock says — and completes it, or removes it when empty (L1, L4). Then it creates a
ledger and commits it as the new in-progress segment; only then are writes accepted.

Records are buffered and become one entry (an Arrow record batch, zstd-compressed) when the
buffer passes `flush_bytes` or `flush_records`, or `linger_ms` after the first buffered record.
A record's offset is returned once its entry is durable on an ack quorum. Rolling (by size, age or
record count) creates the next ledger, commits both segment changes in one compare-and-set, and
closes the old ledger afterwards (L2); entries are never split across the roll.

Every segment-list change is a compare-and-set on the list version. A lost compare-and-set or a
fenced ledger means another writer took over: every pending record fails with WriterFencedError
(outcome unknown) and this writer accepts nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from time import time as _time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bookkeeper.clock import wall_ms
from bookkeeper.errors import (
    ConfigError,
    DlogError,
    LedgerFencedError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from dlog.linger import flusher_of
from dlog.offsets import Offset
from dlog.segments.codec import (
    SMALL_BATCH_SLACK_BYTES,
    RecordSetCodec,
    check_batch,
    records_to_batch,
    split_batch,
)
from dlog.segments.metadata import Segment, StreamConfig
from dlog.segments.store import SegmentList

if TYPE_CHECKING:
    from bookkeeper.client.ledger import LedgerHandle
    from dlog.namespace import Namespace

log = logging.getLogger(__name__)
COMMIT_RETRIES_MAX = 5
RECORD_OVERHEAD_BYTES = 16  # what a buffered record costs beyond its key and value


class WriterFencedError(DlogError):
    """Another writer took the stream over; pending records have an unknown outcome."""

    code = 320


class WriterLockedError(DlogError):
    code = 321
    retryable = True


class WriterClosedError(DlogError):
    code = 322


@dataclass(frozen=True, slots=True)
class WrittenBatch:
    """Where a batch went, all in one ledger: per entry, its id and how many records it holds
    (the batch's records fill each entry from slot 0)."""

    ledger_id: int
    entries: tuple[tuple[int, int], ...]  # (entry id, records)

    def __len__(self) -> int:
        return sum(count for _, count in self.entries)

    def __iter__(self) -> Iterator[Offset]:
        for entry_id, count in self.entries:
            for slot in range(count):
                yield Offset(self.ledger_id, entry_id, slot)

    @property
    def first(self) -> Offset:
        return Offset(self.ledger_id, self.entries[0][0], 0)

    @property
    def last(self) -> Offset:
        entry_id, count = self.entries[-1]
        return Offset(self.ledger_id, entry_id, count - 1)


class StreamWriter:
    def __init__(self, namespace: Namespace, config: StreamConfig, *, flush_bytes: int = 1 << 20,
                 flush_records: int = 20_000, linger_ms: float = 2.0, buffer_bytes_max: int = 64 << 20,
                 entry_bytes_max: int = 3 << 20, lock_timeout_s: float = 30.0, takeover: bool = False,
                 retention_on_roll: bool = False) -> None:
        if entry_bytes_max > 4 << 20:
            raise ConfigError(f"entry_bytes_max {entry_bytes_max} exceeds the bookie maximum of 4 MiB")
        self.namespace = namespace
        self.config = config
        self.name = config.name
        self.codec = RecordSetCodec(namespace.schema_of(config))
        self.flush_bytes = flush_bytes
        self.flush_records = flush_records
        self.linger_s = linger_ms / 1000
        self.buffer_bytes_max = buffer_bytes_max
        self.entry_bytes_max = entry_bytes_max
        self.lock_timeout_s = lock_timeout_s
        self.takeover = takeover
        self.retention_on_roll = retention_on_roll
        self.error: DlogError | None = None
        self._closed = False
        self._lock_node: str | None = None
        self._listing: SegmentList | None = None
        self._segment: Segment | None = None
        self._ledger: LedgerHandle | None = None
        self._values: list[bytes] = []
        self._keys: list[bytes | None] = []
        self._timestamps: list[int] = []
        self._futures: list[asyncio.Future[Offset] | None] = []  # None: an offered record
        self._buffered_bytes = 0
        self._in_flight: set[asyncio.Future[Any]] = set()
        self._in_flight_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._linger: int | None = None  # the linger flusher's round this writer waits for
        self._flusher = flusher_of(asyncio.get_running_loop())
        self._rolling: asyncio.Task[None] | None = None
        self._segment_records = 0
        self._segment_bytes = 0
        self._segment_first_ts = 0
        self._segment_last_ts = 0
        self._segment_started_s = 0.0

    # ------------------------------------------------------------------ open

    async def open(self) -> StreamWriter:
        store = self.namespace.store
        self._lock_node = await store.lock(self.name, self.lock_timeout_s)
        if self._lock_node is None and not self.takeover:
            raise WriterLockedError(
                f"stream {self.name!r} has a live writer (lock not free within "
                f"{self.lock_timeout_s} s); open with takeover=True to fence it and take over")
        try:
            listing = await store.segments(self.name)
            listing = await self._recover(listing)
            await self._start_segment(listing)
        except BaseException:
            await self._release_lock()
            raise
        return self

    async def _recover(self, listing: SegmentList) -> SegmentList:
        """Seal the previous writer's in-progress segment (fencing it), or drop it when empty."""
        segment = listing.in_progress
        if segment is None:
            return listing
        client = self.namespace.client
        try:
            handle = await client.open_ledger(segment.ledger_id, password=self.namespace.password_of(self.config),
                                              recovery=True)
        except NoSuchLedgerError:
            handle = None
        if handle is None or handle.last_add_confirmed < segment.first_entry:
            await self._commit(listing, delete=[segment])
            if handle is not None:
                await self.namespace.delete_ledger_quietly(segment.ledger_id)
            log.info("stream %s: removed empty in-progress segment %d", self.name, segment.sequence)
        else:
            completed = await self._summarize(segment, handle)
            await self._commit(listing, update=[completed])
            log.info("stream %s: recovered segment %d (ledger %d) at entry %d", self.name,
                     segment.sequence, segment.ledger_id, completed.last_entry)
        return await self.namespace.store.segments(self.name)

    async def _summarize(self, segment: Segment, handle: Any) -> Segment:
        last = handle.last_add_confirmed
        first_entry = (await handle.read(segment.first_entry, segment.first_entry))[0]
        last_entry = first_entry if last == segment.first_entry else (await handle.read(last, last))[0]
        first_header = self.codec.peek_header(first_entry.payload)
        last_header = self.codec.peek_header(last_entry.payload)
        records = last_header.first_record_index + last_header.record_count
        return segment.completed(last, records, handle.metadata.length, first_header.min_timestamp_ms,
                                 last_header.max_timestamp_ms, wall_ms())

    async def _start_segment(self, listing: SegmentList) -> None:
        ledger = await self.namespace.client.create_ledger(
            self.config.ensemble, self.config.write_quorum, self.config.ack_quorum,
            password=self.namespace.password_of(self.config),
            custom={"stream": self.name, "namespace": self.namespace.name})
        segment = Segment(listing.max_sequence + 1, ledger.ledger_id, created_ms=wall_ms())
        await self._commit(listing, create=[segment])
        self._segment, self._ledger = segment, ledger
        self._segment_records = self._segment_bytes = 0
        self._segment_first_ts = self._segment_last_ts = 0
        self._segment_started_s = time.monotonic()

    async def _commit(self, listing: SegmentList, *, create: Sequence[Segment] = (),
                      update: Sequence[Segment] = (), delete: Sequence[Segment] = ()) -> None:
        try:
            await self.namespace.store.commit(self.name, listing, create=create, update=update,
                                              delete=delete)
        except MetadataVersionError as exc:
            raise self._fenced(f"the segment list of stream {self.name!r} changed under this "
                               "writer: another writer took over") from exc
        self._listing = SegmentList(
            [s for s in listing.segments if s not in delete and s.sequence not in {u.sequence for u in update}]
            + list(update) + list(create), listing.version + 1,
            max([listing.max_sequence, *(s.sequence for s in create)]))
        self._listing.segments.sort(key=lambda s: s.sequence)

    # ------------------------------------------------------------------ writes

    def _check_open(self) -> None:
        if self.error is not None:
            raise self.error
        if self._closed:
            raise WriterClosedError(f"the writer of stream {self.name!r} is closed")

    @property
    def writable(self) -> bool:
        """False while buffered and in-flight bytes are at the buffer maximum."""
        return self._buffered_bytes + self._in_flight_bytes < self.buffer_bytes_max

    async def wait_writable(self) -> None:
        """Wait until buffered and in-flight bytes are below the buffer maximum."""
        while self._buffered_bytes + self._in_flight_bytes >= self.buffer_bytes_max:
            self._check_open()
            self._room.clear()
            await self._room.wait()

    async def write(self, value: bytes, key: bytes | None = None, timestamp_ms: int | None = None) -> Offset:
        """Write one record (default schema); returns its offset once durable."""
        await self.wait_writable()
        return await self.write_nowait(value, key, timestamp_ms)

    def write_nowait(self, value: bytes, key: bytes | None = None,
                     timestamp_ms: int | None = None) -> asyncio.Future[Offset]:
        """Buffer one record without waiting; the future resolves to its offset once durable.
        The caller bounds memory with `wait_writable()`."""
        # the hot path of per-record writes: no call that is not needed
        if self.error is not None or self._closed:
            self._check_open()
        if type(value) is not bytes or (key is not None and type(key) is not bytes) or (
                timestamp_ms is not None and type(timestamp_ms) is not int):
            value, key = _checked_record(value, key, timestamp_ms)
        future: asyncio.Future[Offset] = asyncio.get_running_loop().create_future()
        self._values.append(value)
        self._keys.append(key)
        self._timestamps.append(int(_time() * 1000) if timestamp_ms is None else timestamp_ms)
        self._futures.append(future)
        self._buffered_bytes += len(value) + (len(key) if key else 0) + RECORD_OVERHEAD_BYTES
        if self._buffered_bytes >= self.flush_bytes or len(self._values) >= self.flush_records:
            self._flush_buffer()
        elif self._linger is None:
            self._linger = self._flusher.schedule(self, self.linger_s)
        return future

    def offer(self, value: bytes, key: bytes | None = None, timestamp_ms: int | None = None) -> None:
        """The fastest way to write records one by one: buffer one record (default schema) with no
        future and no task. `await flush()` returns once every record offered before it is durable,
        and raises if any of them failed (as does every later call); check `writable` (or
        `await wait_writable()`) now and then to bound memory, as with `write_nowait`."""
        if self.error is not None or self._closed:
            self._check_open()
        if type(value) is not bytes or (key is not None and type(key) is not bytes) or (
                timestamp_ms is not None and type(timestamp_ms) is not int):
            value, key = _checked_record(value, key, timestamp_ms)
        self._values.append(value)
        self._keys.append(key)
        self._timestamps.append(int(_time() * 1000) if timestamp_ms is None else timestamp_ms)
        self._futures.append(None)
        self._buffered_bytes += len(value) + (len(key) if key else 0) + RECORD_OVERHEAD_BYTES
        if self._buffered_bytes >= self.flush_bytes or len(self._values) >= self.flush_records:
            self._flush_buffer()
        elif self._linger is None:
            self._linger = self._flusher.schedule(self, self.linger_s)

    def take_lingering(self, round_id: int) -> tuple[list[Any], ...] | None:
        """For the linger flusher (linger.py): the buffered records (values, keys, timestamps,
        futures) if this writer is due in that round and may send them now; they leave the buffer."""
        if self._linger != round_id:
            return None  # flushed meanwhile (its round was another one, or none)
        self._linger = None
        if (not self._values or self._rolling is not None or self.error is not None
                or len(self._values) > self.flush_records):
            self._flush_buffer()  # the writer's own rules (failing, rolling, splitting)
            return None
        taken = self._values, self._keys, self._timestamps, self._futures, self._buffered_bytes
        self._values, self._keys, self._timestamps, self._futures = [], [], [], []
        self._buffered_bytes = 0
        return taken

    def reject_taken(self, futures: list[asyncio.Future[Offset] | None], error: DlogError) -> None:
        """Records `take_lingering` returned could not be built (a key that is not bytes, a
        timestamp that is not an integer): they get the error, and the writer stops, since offered
        records have no future to carry it (`flush()` and every later call raise it)."""
        if self.error is None:
            self.error = error
        for future in futures:
            if future is not None and not future.done():
                future.set_exception(error)

    def send_taken(self, batch: pa.RecordBatch, timestamps: list[int],
                   futures: list[asyncio.Future[Offset] | None], taken_bytes: int) -> None:
        """The records `take_lingering` returned, as one Arrow batch, into entries."""
        self._send_records(batch, futures, (min(timestamps), max(timestamps)), taken_bytes)

    async def write_batch(self, batch: pa.RecordBatch | Sequence[bytes]) -> WrittenBatch:
        """Write a whole Arrow batch (or a list of values) without per-record Python work."""
        self._check_open()
        if not isinstance(batch, pa.RecordBatch):
            batch = records_to_batch(list(batch), schema=self.codec.schema)
        check_batch(batch, self.codec.schema)
        await self.wait_writable()
        self._flush_buffer()  # records written before this batch come first
        while self._rolling is not None:
            await self._rolling
        ledger = self._ledger
        assert ledger is not None
        pieces = split_batch(batch, self.entry_bytes_max)
        firsts = await asyncio.gather(*(self._append(piece) for piece in pieces))
        return WrittenBatch(ledger.ledger_id, tuple((first.entry_id, piece.num_rows)
                                                    for first, piece in zip(firsts, pieces)))

    def _flush_buffer(self) -> None:
        """Turn buffered records into entries of at most `flush_records` records; stop as soon as a
        roll starts, so a segment overshoots its record limit by less than one entry."""
        self._linger = None  # its round, when it comes, finds nothing to take
        if self.error is not None and self._futures:
            self._fail_buffered(self.error)
        while self._values and self._rolling is None and self.error is None:
            count = min(len(self._values), self.flush_records)
            values, keys, timestamps = self._values[:count], self._keys[:count], self._timestamps[:count]
            futures = self._futures[:count]
            del self._values[:count], self._keys[:count], self._timestamps[:count], self._futures[:count]
            if self._values:
                taken_bytes = sum(len(v) + (len(k) if k else 0) + RECORD_OVERHEAD_BYTES
                                  for v, k in zip(values, keys))
                self._buffered_bytes -= taken_bytes
            else:
                taken_bytes, self._buffered_bytes = self._buffered_bytes, 0
            batch = records_to_batch(values, keys, timestamps, self.codec.schema, check=False)
            self._send_records(batch, futures, (min(timestamps), max(timestamps)), taken_bytes)

    def _send_records(self, batch: pa.RecordBatch, futures: list[asyncio.Future[Offset] | None],
                      timestamp_range_ms: tuple[int, int], taken_bytes: int) -> None:
        """Records taken from the buffer (`taken_bytes` as the buffer counts them) into entries;
        their futures (None for offered records) resolve with the entries' offsets, or all fail
        with the error that stopped them."""
        if taken_bytes * 2 + SMALL_BATCH_SLACK_BYTES <= self.entry_bytes_max:
            pieces = [batch]  # Arrow needs no more than the buffer counted: one entry, no estimate
        else:
            pieces = split_batch(batch, self.entry_bytes_max)
        whole = len(pieces) == 1
        for piece_start, piece in _pieces(pieces):
            piece_futures = futures[piece_start: piece_start + piece.num_rows]
            wanted = any(piece_futures)  # offered records have none: nothing to resolve per record
            try:
                appended = self._append(piece, timestamp_range_ms if whole else None, wanted)
            except DlogError as exc:
                # the ledger refused at once (its writer already failed, e.g. fenced): these
                # records left the buffer, so they must get the error here or never complete
                error = (self._fenced(f"stream {self.name!r} was taken over by another writer; "
                                      "the outcome of these records is unknown")
                         if isinstance(exc, LedgerFencedError) else exc)
                if self.error is None:
                    self.error = error
                for future in futures[piece_start:]:
                    if future is not None and not future.done():
                        future.set_exception(self.error)
                return
            if wanted:
                appended.add_done_callback(lambda done, fs=piece_futures: _resolve(done, fs))

    def _append(self, piece: pa.RecordBatch, timestamp_range_ms: tuple[int, int] | None = None,
                want_offset: bool = True) -> asyncio.Future[Offset]:
        """Encode and append one entry; resolves to the entry's first Offset (slot 0). Without
        `want_offset` (offered records: nobody awaits them one by one) the ledger's own future is
        what `flush()` waits for, and an error reaches the writer only."""
        ledger = self._ledger
        assert ledger is not None
        if timestamp_range_ms is None:
            payload = self.codec.encode(piece, self._segment_records)
            header = self.codec.peek_header(payload)
            timestamp_range_ms = header.min_timestamp_ms, header.max_timestamp_ms
        else:  # built here from bytes and integer timestamps: no Arrow compute, no schema check
            payload = self.codec.encode(piece, self._segment_records,
                                        timestamp_range_ms=timestamp_range_ms, checked=True)
        if self._segment_records == 0:
            self._segment_first_ts = timestamp_range_ms[0]
        self._segment_records += piece.num_rows
        self._segment_bytes += len(payload)
        self._segment_last_ts = max(self._segment_last_ts, timestamp_range_ms[1])
        appended = ledger.append_async(payload)
        offset: asyncio.Future[Offset] = (asyncio.get_running_loop().create_future() if want_offset
                                          else appended)  # type: ignore[assignment]
        self._in_flight.add(offset)
        self._in_flight_bytes += len(payload)
        ledger_id, size = ledger.ledger_id, len(payload)

        def done(answer: asyncio.Future[int]) -> None:
            self._in_flight.discard(offset)
            self._in_flight_bytes -= size
            if not self._room.is_set():
                self._room.set()
            error = answer.exception()
            if error is not None:
                if isinstance(error, LedgerFencedError):
                    error = self._fenced(f"stream {self.name!r} was taken over by another writer; "
                                         "the outcome of this record is unknown")
                elif self.error is None and isinstance(error, DlogError):
                    self.error = error
                if want_offset:
                    offset.set_exception(error)
                return
            if want_offset:
                offset.set_result(Offset(ledger_id, answer.result(), 0))

        appended.add_done_callback(done)
        if self._should_roll():
            self._rolling = asyncio.get_running_loop().create_task(self._roll())
        return offset

    def _fail_buffered(self, error: DlogError) -> None:
        """Records not yet sent when the writer failed will never be: they get its error."""
        futures = self._futures
        self._values, self._keys, self._timestamps, self._futures = [], [], [], []
        self._buffered_bytes = 0
        for future in futures:
            if future is not None and not future.done():
                future.set_exception(error)

    def _should_roll(self) -> bool:
        if self._rolling is not None:
            return False
        config = self.config
        return ((config.roll_bytes and self._segment_bytes >= config.roll_bytes)
                or (config.roll_records and self._segment_records >= config.roll_records)
                or (config.roll_age_ms and (time.monotonic() - self._segment_started_s) * 1000
                    >= config.roll_age_ms)) or False

    def _fenced(self, message: str) -> WriterFencedError:
        if not isinstance(self.error, WriterFencedError):
            self.error = WriterFencedError(message)
        return self.error

    # ------------------------------------------------------------------ rolling and closing

    async def _drain(self) -> None:
        if self._in_flight:
            await asyncio.gather(*list(self._in_flight), return_exceptions=True)

    def _completed_segment(self) -> Segment:
        assert self._segment is not None and self._ledger is not None
        return self._segment.completed(self._ledger.last_add_confirmed, self._segment_records,
                                       self._segment_bytes, self._segment_first_ts,
                                       self._segment_last_ts, wall_ms())

    async def _roll(self) -> None:
        """L2: create the next ledger, commit both segment changes at once, then close the old."""
        try:
            await self._drain()
            if self.error is not None:
                return
            old_ledger = self._ledger
            completed = self._completed_segment()
            listing = self._listing
            assert listing is not None and old_ledger is not None
            ledger = await self.namespace.client.create_ledger(
                self.config.ensemble, self.config.write_quorum, self.config.ack_quorum,
                password=self.namespace.password_of(self.config),
                custom={"stream": self.name, "namespace": self.namespace.name})
            segment = Segment(listing.max_sequence + 1, ledger.ledger_id, created_ms=wall_ms())
            await self._commit(listing, update=[completed], create=[segment])
            self._segment, self._ledger = segment, ledger
            self._segment_records = self._segment_bytes = 0
            self._segment_first_ts = self._segment_last_ts = 0
            self._segment_started_s = time.monotonic()
            await old_ledger.close()
            if self.retention_on_roll:
                asyncio.get_running_loop().create_task(self._apply_retention())
        except DlogError as exc:
            if self.error is None:
                self.error = exc
            log.warning("stream %s: roll failed: %s", self.name, exc)
        finally:
            self._rolling = None
            self._flush_buffer()

    async def _apply_retention(self) -> None:
        try:
            await self.namespace.apply_retention(self.name)
        except DlogError as exc:
            log.warning("stream %s: retention on roll failed: %s", self.name, exc)

    async def flush(self) -> None:
        """Send what is buffered and wait until everything written so far is durable."""
        self._flush_buffer()
        while self._rolling is not None:
            await self._rolling
            self._flush_buffer()
        await self._drain()
        if self.error is not None:
            raise self.error

    async def close(self) -> None:
        """Flush, complete the in-progress segment (or drop it if empty), release the lock."""
        if self._closed:
            return
        try:
            if self.error is None:
                await self.flush()
                await self._seal()
        finally:
            self._closed = True
            if self._futures:
                self._fail_buffered(self.error or WriterClosedError(
                    f"the writer of stream {self.name!r} closed before these records were sent"))
            await self._release_lock()

    async def _seal(self) -> None:
        assert self._segment is not None and self._ledger is not None and self._listing is not None
        if self._segment_records == 0:
            await self._commit(self._listing, delete=[self._segment])
            await self._ledger.close()
            await self.namespace.delete_ledger_quietly(self._ledger.ledger_id)
            return
        await self._commit(self._listing, update=[self._completed_segment()])
        await self._ledger.close()

    async def _release_lock(self) -> None:
        if self._lock_node is not None:
            node, self._lock_node = self._lock_node, None
            try:
                await self.namespace.store.unlock(node)
            except DlogError as exc:
                log.warning("stream %s: releasing the writer lock failed: %s", self.name, exc)

    async def __aenter__(self) -> StreamWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def segment(self) -> Segment | None:
        return self._segment


def _checked_record(value: Any, key: Any, timestamp_ms: Any) -> tuple[bytes, bytes | None]:
    """The slow path of write_nowait and offer: bytes-like values and keys become bytes; anything
    else is refused at the call, before it could fail an entry of other records."""
    def as_bytes(what: str, item: Any) -> bytes:
        if type(item) is bytes:
            return item  # type: ignore[no-any-return]
        if isinstance(item, (bytes, bytearray, memoryview)):
            return bytes(item)
        raise ConfigError(f"a record {what} must be bytes, got {type(item).__name__}; typed streams "
                          "take write_batch()")

    if timestamp_ms is not None and (type(timestamp_ms) is not int or isinstance(timestamp_ms, bool)):
        raise ConfigError(f"a record timestamp is an integer of milliseconds, got {timestamp_ms!r}")
    return as_bytes("value", value), None if key is None else as_bytes("key", key)


def _pieces(pieces: list[pa.RecordBatch]) -> Iterator[tuple[int, pa.RecordBatch]]:
    start = 0
    for piece in pieces:
        yield start, piece
        start += piece.num_rows


def _resolve(done: asyncio.Future[Offset], futures: list[asyncio.Future[Offset]]) -> None:
    error = done.exception()
    if error is not None:
        for future in futures:
            if future is not None and not future.done():
                future.set_exception(error)
        return
    first = done.result()
    for slot, future in enumerate(futures):
        if future is not None and not future.done():
            future.set_result(Offset(first.ledger_id, first.entry_id, slot))
