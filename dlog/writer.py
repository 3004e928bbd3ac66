"""The stream writer: an asyncio driver of the writer machine (`dlog.core.writer`).

    async with ns.open_writer("orders") as writer:
        offset = await writer.write(b"value", key=b"k")          # one record, once durable
        future = writer.write_nowait(b"value")                  # pipelined; bound memory with
        await writer.wait_writable()                            #   wait_writable()
        written = await writer.write_batch(arrow_batch)         # a whole Arrow batch

The rules (locking, sealing the previous writer's segment, batching records into entries,
rolling, closing, coexisting with truncation and retention) are the machine's; this module only
carries out its effects, as `bookkeeper.client.ledger.LedgerHandle` does for the ledger writer:
segment-store calls and ledger creation, appends, closes and deletes as tasks whose outcome goes
back to the machine, and waiters resolved as the machine says: the machine keeps the future (or
batch collector) of every record until its outcome is known, so the driver keeps no list of its
own. It encodes entries for the machine (the record-set codec). What it needs of the namespace
comes in a `StreamContext`.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import pyarrow as pa

from bookkeeper.errors import ConfigError, DlogError, MetadataVersionError
from bookkeeper.runtime import start_task
from dlog.context import StreamContext
from dlog.core import backlog
from dlog.core.dedup import DedupTable, Duplicate, OutOfOrder, encode_stored, native_producer
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
    WriterEffect,
    WriterOpened,
)
from dlog.core.errors import (
    BacklogExceededError,
    LedgerDeletedError,
    ProducersFullError,
    SequenceError,
    WriterAbortedError,
    WriterClosedError,
    WriterFencedError,
    WriterLockedError,
)
from dlog.core.settings import RECORD_OVERHEAD_BYTES, WriterSettings
from dlog.core.writer import WriterMachine, WriterState
from dlog.offsets import Offset, record_offset
from dlog.seal import seal_in_progress
from dlog.segments.codec import (
    HEADERS_SCHEMA,
    EncodedEntry,
    Headers,
    ProducerRun,
    RecordSetCodec,
    check_batch,
    fill_missing_columns,
    records_to_batch,
    run_bytes,
    schema_with_headers,
    split_batch,
)
from dlog.segments.metadata import Segment, SegmentState
from dlog.segments.schemas import schema_version

__all__ = ["DuplicateWrite", "LedgerDeletedError", "ProducersFullError", "SequenceError", "StreamWriter",
           "WriterAbortedError", "WriterClosedError", "WriterFencedError",
           "WriterLockedError", "WrittenBatch"]

log = logging.getLogger(__name__)
ENTRY_BYTES_MAX = 4 << 20  # the bookie's entry maximum
ROW_COLUMNS = ("value", "key", "timestamp", "headers")  # what a buffered record holds, in this order
SETTLE_S_MAX = 30.0  # how long close() lets effect tasks (deletes, the lock release) end
ABORT_SETTLE_S_MAX = 1.0  # the same after abort(), which promised not to wait
RUN_RECORDS_MIN = 8  # offer_records of more records than this builds their Arrow columns at once
SEQUENCE_MAX = 2**63 - 1  # a named producer's sequences are 0..this (the entry's signed 64-bit field)


@dataclass(frozen=True, slots=True)
class DuplicateWrite:
    """The answer to a named producer's resend of sequences the stream already holds: nothing was
    written again. `first_position`..`last_position` are the stream positions of the original
    records when the resend matches (a part of) one of the producer's last 5 durable batches
    (`DedupLimits.batches_remembered_max`; a batch is one entry's run of the producer's records);
    None when it is older: then only "duplicate" is known."""

    first_sequence: int
    last_sequence: int
    first_position: int | None
    last_position: int | None


@dataclass(frozen=True, slots=True)
class WrittenBatch:
    """Where a batch went, all in one ledger: per entry, its id and how many records it holds
    (the batch's records fill each entry from slot 0). Its records have the consecutive stream
    positions from `first_position` on (None: the segment has no position)."""

    ledger_id: int
    entries: tuple[tuple[int, int], ...]  # (entry id, records)
    first_position: int | None = None

    def __len__(self) -> int:
        return sum(count for _, count in self.entries)

    def __iter__(self) -> Iterator[Offset]:
        position = self.first_position
        for entry_id, count in self.entries:
            for slot in range(count):
                yield record_offset(self.ledger_id, entry_id, slot, position)
                position = None if position is None else position + 1

    @property
    def first(self) -> Offset:
        return Offset(self.ledger_id, self.entries[0][0], 0, self.first_position)

    @property
    def last(self) -> Offset:
        entry_id, count = self.entries[-1]
        last_position = None if self.first_position is None else self.first_position + len(self) - 1
        return Offset(self.ledger_id, entry_id, count - 1, last_position)


class _BatchWaiter:
    """Collects where the pieces of one write_batch went (the waiter of each of its pieces)."""

    __slots__ = ("future", "entries", "left", "ledger_id", "first_position")

    def __init__(self, future: asyncio.Future[WrittenBatch], pieces: int) -> None:
        self.entries: list[tuple[int, int]] = []
        self.future, self.left, self.ledger_id = future, pieces, -1
        self.first_position: int | None = None

    def piece_done(self, ledger_id: int, entry_id: int, records: int, position: int | None) -> None:
        self.ledger_id = ledger_id
        if not self.entries:
            self.first_position = position
        self.entries.append((entry_id, records))
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(WrittenBatch(ledger_id, tuple(self.entries), self.first_position))

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


@dataclass(frozen=True, slots=True)
class _ProducerBatch:
    """A buffered idempotent producer's batch: its records (rows as `offer` buffers them), one chunk."""

    rows: list[tuple[bytes, bytes | None, int, Headers | None]]
    producer: str
    epoch: int
    first_sequence: int
    last_sequence: int


class _RunsWaiter:
    """Waits for the runs of one offer_records call (each run the waiter of its chunk): resolves
    its future to the first record's position once the last run is durable."""

    __slots__ = ("future", "left", "first_position", "started")

    def __init__(self, future: asyncio.Future[int | None], runs: int) -> None:
        self.future, self.left, self.started = future, runs, False
        self.first_position: int | None = None

    def piece_done(self, ledger_id: int, entry_id: int, records: int, position: int | None) -> None:
        if not self.started:
            self.first_position, self.started = position, True
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(self.first_position)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


@dataclass(frozen=True, slots=True)
class _Run:
    """Records of one offer_records call buffered as one chunk: their Arrow batch, built column by
    column, and the range of their timestamps (for the entry header, with no Arrow compute call)."""

    batch: pa.RecordBatch
    min_timestamp_ms: int
    max_timestamp_ms: int


_PIECE_WAITERS = (_BatchWaiter, _RunsWaiter)
_BYTES, _BYTES_OR_NONE, _INT = frozenset({bytes}), frozenset({bytes, type(None)}), frozenset({int})


class StreamWriter:
    def __init__(self, context: StreamContext, *, flush_bytes: int = 1 << 20,
                 flush_records: int = 20_000, linger_ms: float = 0.0, partial_entries_in_flight_max: int = 1,
                 buffer_bytes_max: int = 64 << 20, entry_bytes_max: int = 3 << 20, lock_timeout_s: float = 30.0,
                 takeover: bool = False, retention_on_roll: bool = False,
                 lock_holder: dict[str, Any] | None = None, producer_id: str | None = None) -> None:
        """`lock_holder`: what the writer-lock node says of its holder (default: this host and
        process); a serving-tier server names itself there, so other writers can say who serves
        the stream. `producer_id`: a named idempotent producer (`Namespace.open_writer` rebuilds its
        table before handing the writer out; docs/concepts.md, "Idempotent writers")."""
        if entry_bytes_max > ENTRY_BYTES_MAX:
            raise ConfigError(f"entry_bytes_max {entry_bytes_max} exceeds the bookie maximum of 4 MiB")
        for option, value, low in (("flush_bytes", flush_bytes, 1), ("flush_records", flush_records, 1),
                                   ("partial_entries_in_flight_max", partial_entries_in_flight_max, 1),
                                   ("buffer_bytes_max", buffer_bytes_max, 1), ("linger_ms", linger_ms, 0)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < low:
                raise ConfigError(f"bad {option} {value!r}: use a number >= {low}")
        self.context = context
        config = context.config
        self.name = config.name
        self.clock = context.clock
        self._wall_ms = self.clock.wall_ms  # bound once: the per-record path calls it
        self.codec = RecordSetCodec(context.schema)
        self.settings = WriterSettings(
            config.name, roll_bytes=config.roll_bytes, roll_age_ms=config.roll_age_ms,
            roll_records=config.roll_records, flush_bytes=flush_bytes, flush_records=flush_records,
            linger_ms=linger_ms, partial_entries_in_flight_max=partial_entries_in_flight_max,
            buffer_bytes_max=buffer_bytes_max, entry_bytes_max=entry_bytes_max, lock_timeout_s=lock_timeout_s,
            takeover=takeover, retention_on_roll=retention_on_roll, schema_version=schema_version(config),
            flush_rounds=True)
        self.machine = WriterMachine(self.settings, self._encode)
        self._record_bytes_max = self.machine.batcher.budget_bytes
        self._batcher = self.machine.batcher  # the machine's part, read by `writable` (never replaced)
        self._buffer_bytes_max = self.settings.buffer_bytes_max
        self.loop = asyncio.get_running_loop()
        self._flush_rounds = FlushRounds.of(self.loop)
        # this round's Arrow build of the rows at the front of the buffer: [batch, rows, next row]
        self._prebuilt: list[Any] | None = None
        self._ledgers: dict[int, Any] = {}  # ledger id -> LedgerHandle of this writer
        self._lock_token: str | None = None
        self._room = asyncio.Event()
        self._room.set()
        self._opened: asyncio.Future[Segment] = self.loop.create_future()
        self._closed: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: dict[asyncio.Task[None], None] = {}  # ordered: replays are deterministic
        self._crash: BaseException | None = None
        self._watches: dict[int, Callable[[], None]] = {}  # ledger id -> end of its deletion watch
        self._ended: asyncio.Future[None] = self.loop.create_future()
        self._aborted = False
        self._lock_holder = lock_holder
        self._runs_buffered = 0  # producer batches buffered and not encoded yet
        # backlog hold (dlog.core.backlog): the refusal while a subscription is over a limit, set or
        # cleared by a check at open, after each segment-list commit (a roll) and, while refused, at a
        # refused write (at most one check at a time); the per-record path only tests `_hold`
        self._holds = backlog.holds_writers(config)
        self._hold: BacklogExceededError | None = None
        self._hold_checking = False
        # a named producer (producer_id): every record carries a sequence; None: an ordinary writer
        self._producer: str | None = None if producer_id is None else native_producer(producer_id)
        self._table: DedupTable | None = None  # the stream's producer table, once rebuilt
        self._pushed = -1  # the highest sequence buffered (or durable) of our producer
        self._entry_runs: deque[tuple[int, int, int]] = deque()  # (first, last sequence, records) per entry sent
        self._piece_sequences: dict[int, tuple[pa.RecordBatch, int, int]] = {}  # id(piece) -> its sequences
        self.duplicates = 0  # resends answered as duplicates (offer's are dropped and only counted here)

    # ------------------------------------------------------------------ state

    @property
    def error(self) -> DlogError | None:
        return self.machine.error

    @property
    def segment(self) -> Segment | None:
        return self.machine.segment

    @property
    def ledger(self) -> Any:
        """The handle of the ledger being written (None between segments)."""
        return self._ledgers.get(self.machine.ledger_id) if self.machine.ledger_id is not None else None

    @property
    def in_flight_entries(self) -> int:
        """Entries sent and not acknowledged yet."""
        return len(self.machine.batcher.in_flight)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of records buffered and in flight (what buffer_bytes_max bounds)."""
        batcher = self.machine.batcher
        return batcher.buffered_bytes + batcher.in_flight_bytes

    @property
    def writable(self) -> bool:
        """False while buffered and in-flight bytes are at the buffer maximum (the batcher's rule,
        read here without two property calls: producers ask it once per record)."""
        batcher = self._batcher
        return batcher.buffered_bytes + batcher.in_flight_bytes < self._buffer_bytes_max

    def now_ms(self) -> int:
        return self.clock.wall_ms()

    # ------------------------------------------------------------------ named producer

    @property
    def producer_id(self) -> str | None:
        return self._producer

    @property
    def last_sequence(self) -> int | None:
        """A named producer's last durable sequence, where a restarted application resumes (None:
        the stream holds nothing of this producer, or it expired). Ordinary writers: None."""
        if self._producer is None or self._table is None:
            return None
        return self._table.last_sequence(self._producer)

    @property
    def producer_table(self) -> DedupTable | None:
        """The stream's producer table this writer keeps (its counters and limits; None until
        rebuilt, and for ordinary writers)."""
        return self._table

    def restore_producers(self, table: DedupTable) -> None:
        """Take the producer table rebuilt from the stream (the stored snapshot and the entries
        after it) before the first write; a new producer the table has no room for is refused."""
        producer = self._producer
        if producer is None or self._table is not None:
            raise ConfigError("restore_producers is for a writer opened with producer_id, once")
        refusal = table.room_for(producer)
        if refusal is not None:
            raise ProducersFullError(f"stream {self.name!r} cannot take producer {producer}: {refusal.message}")
        self._table = table
        last = table.last_sequence(producer)
        self._pushed = -1 if last is None else last

    def _claim(self, first: Any, last: Any) -> tuple[int, int] | DuplicateWrite:
        """Sequences first..last for a write of our producer: (first, last) to write them, a
        DuplicateWrite for a resend of durable ones, or SequenceError (nothing written)."""
        if type(first) is int and type(last) is int and self._pushed < first <= last <= SEQUENCE_MAX:
            self._pushed = last
            return first, last
        table, producer = self._table, self._producer
        if table is None or producer is None:
            raise ConfigError(f"the writer of stream {self.name!r} has no producer table yet: open it with "
                              "Namespace.open_writer(name, producer_id=...)")
        if type(first) is not int or type(last) is not int or not 0 <= first <= last <= SEQUENCE_MAX:
            raise SequenceError(f"producer {producer}: bad sequences {first!r}..{last!r}: sequences are integers "
                                f"0..{SEQUENCE_MAX}, increasing", None)
        durable = table.last_sequence(producer)
        if durable is None or last > durable:
            raise SequenceError(
                f"producer {producer}: sequences {first}..{last} are not above {self._pushed}, the last one "
                f"{'written' if durable == self._pushed else 'buffered (not acknowledged yet)'}: the next is "
                f"{self._pushed + 1} or more", self._pushed + 1)
        verdict = table.offer(producer, first, last, self._wall_ms())
        if isinstance(verdict, Duplicate):
            self.duplicates += 1
            return DuplicateWrite(first, last, verdict.first_offset, verdict.last_offset)
        if isinstance(verdict, OutOfOrder):
            raise SequenceError(verdict.message, None if verdict.expected is None else self._pushed + 1)
        raise SequenceError(f"producer {producer}: sequences {first}..{last} refused: {verdict}", self._pushed + 1)

    def _sequence_for(self, sequence: Any) -> tuple[int, int] | DuplicateWrite:
        if sequence is None:
            sequence = self._pushed + 1
        return self._claim(sequence, sequence)

    # ------------------------------------------------------------------ open and close

    async def open(self) -> StreamWriter:
        self.run(self.machine.open(self.now_ms()))
        await self._opened
        if self._holds:
            await self._check_backlog()
        return self

    async def close(self) -> None:
        """Send what is buffered, complete the in-progress segment (or drop it when empty),
        close its ledger, release the lock. Raises if the close itself failed."""
        if self._closed is None:
            self._closed = self.loop.create_future()
            self.run(self.machine.close(self.now_ms()))
        try:
            await asyncio.shield(self._closed)
        except asyncio.CancelledError:
            raise  # the caller stopped waiting: settling would make it wait again
        except BaseException:
            await self._settle_tasks()
            raise
        await self._settle_tasks()

    def abort(self, error: DlogError | None = None) -> None:
        """Stop at once, waiting for nothing (the second Ctrl-C of `dlog write`): every record not
        yet acknowledged fails with `error` (default WriterAbortedError), whose outcome is unknown;
        the in-progress segment stays in progress with its ledger open, and the next writer of the
        stream recovers it (L1). A close() under way, or a later one, returns at once."""
        self._aborted = True
        self.run(self.machine.abort(error or WriterAbortedError(
            f"the writer of stream {self.name!r} was stopped before these records were acknowledged: "
            "their outcome is unknown"), self.now_ms()))

    def until_ended(self) -> asyncio.Future[None]:
        """A future that resolves (never with an exception) once the writer has failed or closed;
        then `error` says why it failed, if it did."""
        return self._ended

    async def _settle_tasks(self) -> None:
        """Let effect tasks started for this writer end (deletes, the lock release)."""
        tasks = [task for task in self._tasks if not task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=ABORT_SETTLE_S_MAX if self._aborted else SETTLE_S_MAX)

    async def __aenter__(self) -> StreamWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ writes

    def _refuse(self) -> None:
        """Refuse a write while a subscription is over its backlog limit (hold policy), and check
        again whether it still is (so the refusal clears once the subscription commits past)."""
        assert self._hold is not None
        self._recheck_backlog()
        raise self._hold

    def _recheck_backlog(self) -> None:
        if not self._hold_checking:
            self._hold_checking = True
            coroutine = self._check_backlog()
            start_task(self.loop, self._tasks, coroutine, coroutine)

    async def _check_backlog(self) -> None:
        """Set or clear the hold refusal from the segment list and the subscriptions' offsets: a
        failed read keeps the current state (the next roll or refused write checks again)."""
        self._hold_checking = True
        store, config = self.context.store, self.context.config
        try:
            listing = await store.segments(self.name)
            stored = await store.subscriptions(self.name)
        except DlogError as exc:
            log.warning("stream %s: the backlog check failed, tried again at the next roll: %s", self.name, exc)
            return
        finally:
            self._hold_checking = False
        reason = backlog.hold_refusal(self.name, config, backlog.backlogs(listing, config, stored, self._wall_ms()))
        if (reason is None) != (self._hold is None):
            log.info("stream %s: %s", self.name, reason or "backlog back under its limits: writes accepted again")
        self._hold = None if reason is None else BacklogExceededError(reason)

    def _check_open(self) -> None:
        if self._crash is not None:
            raise self._crash
        if self.machine.ended or self._closed is not None:
            raise self.machine.closed_error()

    async def wait_writable(self) -> None:
        """Wait until buffered and in-flight bytes are below the buffer maximum; raises the
        writer's error if it fails or closes meanwhile."""
        while not self.machine.writable:
            self._check_open()
            self._room.clear()
            await self._room.wait()
        self._check_open()

    async def write(self, value: bytes, key: bytes | None = None, timestamp_ms: int | None = None,
                    headers: Headers | None = None, *, sequence: int | None = None) -> Offset | DuplicateWrite:
        """Write one record (default schema); returns its offset once durable. `headers`: a list
        of (str key, bytes value) pairs, as Kafka's record headers. `sequence`: a named producer's
        (see `write_nowait`)."""
        await self.wait_writable()
        return await self.write_nowait(value, key, timestamp_ms, headers, sequence=sequence)

    def write_nowait(self, value: bytes, key: bytes | None = None, timestamp_ms: int | None = None,
                     headers: Headers | None = None, *,
                     sequence: int | None = None) -> asyncio.Future[Offset | DuplicateWrite]:
        """Buffer one record without waiting; the future resolves to its offset once durable.
        The caller bounds memory with `wait_writable()`. A writer opened with `producer_id` gives
        every record a sequence: `sequence` (above every earlier one; gaps allowed) or, without
        it, the last one + 1. A resend of a durable sequence resolves to a `DuplicateWrite` at
        once, nothing written; a sequence not above those written or buffered raises SequenceError."""
        future: asyncio.Future[Offset | DuplicateWrite] = self.loop.create_future()
        if self._producer is None:
            if sequence is not None:
                raise ConfigError("sequence= is for writers opened with producer_id")
            self._buffer(value, key, timestamp_ms, headers, future)
            return future
        pushed = self._pushed
        claimed = self._sequence_for(sequence)
        if isinstance(claimed, DuplicateWrite):
            future.set_result(claimed)
            return future
        try:
            self._buffer(value, key, timestamp_ms, headers, future, claimed[0])
        except BaseException:  # refused (a bad record, a backlog hold): the sequence was not used
            self._pushed = pushed
            raise
        return future

    def offer(self, value: bytes, key: bytes | None = None, timestamp_ms: int | None = None,
              headers: Headers | None = None, sequence: int | None = None) -> None:
        """The fastest way to write records one by one: buffer one record (default schema) with
        no future and no task. `await flush()` returns once every record offered before it is
        durable, and raises if any of them failed (as does every later call); check `writable`
        (or `await wait_writable()`) now and then to bound memory, as with `write_nowait`.
        `sequence`: as `write_nowait`'s; a resend of a durable one is dropped (counted in
        `duplicates`)."""
        if self._producer is None:
            if sequence is not None:
                raise ConfigError("sequence= is for writers opened with producer_id")
            self._buffer(value, key, timestamp_ms, headers, None)
            return
        pushed = self._pushed
        claimed = self._sequence_for(sequence)
        if not isinstance(claimed, DuplicateWrite):
            try:
                self._buffer(value, key, timestamp_ms, headers, None, claimed[0])
            except BaseException:  # refused (a bad record, a backlog hold): the sequence was not used
                self._pushed = pushed
                raise

    def offer_records(self, values: Sequence[bytes], keys: Sequence[bytes | None] | None = None,
                      timestamps_ms: Sequence[int] | None = None,
                      headers: Sequence[Headers | None] | None = None) -> asyncio.Future[int | None]:
        """Buffer many records at once (default schema, untyped streams), column by column: one
        Arrow array per column, no per-record Python work beyond their sizes (up to
        RUN_RECORDS_MIN records go in as rows, as `offer`'s: an Arrow build per call costs more). They are buffered
        together, nothing between them, so they get consecutive positions; they go into entries
        as runs of at most `flush_bytes` (they may span entries and segments) and share entries
        with other writes. The future resolves to the first record's position (None: the stream
        has no positions) once all of them are durable, or fails with the writer's error. Bad
        records (not bytes, a record too large for an entry, headers of a typed stream) are refused
        here, before any is buffered. As with `offer`, the caller bounds memory with `writable`."""
        self._check_open()
        if self._hold is not None:
            self._refuse()
        if self._producer is not None:
            raise ConfigError("offer_records is for writers without producer_id: use offer or write_batch")
        count = len(values)
        if count == 0:
            raise ConfigError("offer_records needs at least one record")
        if schema_with_headers(self.codec.schema) is None:
            raise ConfigError(f"offer_records writes untyped streams; stream {self.name!r} is typed: use write_batch()")
        now_ms = self._wall_ms()
        keys = [None] * count if keys is None else keys
        timestamps = [now_ms] * count if timestamps_ms is None else timestamps_ms
        if len(keys) != count or len(timestamps) != count or (headers is not None and len(headers) != count):
            raise ConfigError(f"offer_records takes columns of one length: {count} values, {len(keys)} keys, "
                              f"{len(timestamps)} timestamps")
        if not set(map(type, values)) <= _BYTES or not set(map(type, keys)) <= _BYTES_OR_NONE \
                or not set(map(type, timestamps)) <= _INT:
            raise ConfigError("offer_records takes bytes values, bytes or None keys and integer timestamps "
                              "(milliseconds); typed streams take write_batch()")
        if headers is not None and not any(headers):
            headers = None
        header_sizes = [self._check_headers(pairs) if pairs else 0 for pairs in headers] if headers else None
        future: asyncio.Future[int | None] = self.loop.create_future()
        machine = self.machine
        if count <= RUN_RECORDS_MIN:  # a few records: rows, as offer's (one Arrow build per entry, not per call)
            waiter = _RunsWaiter(future, count)
            for index in range(count):
                value, key = values[index], keys[index]
                size_bytes = len(value) + (len(key) if key else 0) + RECORD_OVERHEAD_BYTES + (
                    header_sizes[index] if header_sizes else 0)
                if size_bytes > self._record_bytes_max:
                    raise ConfigError(machine.batcher.check_record(size_bytes) or "record too large")
            for index in range(count):
                value, key, pairs = values[index], keys[index], headers[index] if headers else None
                size_bytes = len(value) + (len(key) if key else 0) + RECORD_OVERHEAD_BYTES + (
                    header_sizes[index] if header_sizes else 0)
                effects = machine.write((value, key, timestamps[index], pairs or None), size_bytes, waiter, now_ms)
                if effects:
                    self.run(effects)
            return future
        total = (sum(map(len, values)) + sum(map(len, filter(None, keys))) + count * RECORD_OVERHEAD_BYTES
                 + (sum(header_sizes) if header_sizes else 0))
        runs = self._runs(values, keys, header_sizes, total)
        built = []
        try:
            for start, end, size_bytes in runs:
                stamps = timestamps[start:end]
                batch = records_to_batch(values[start:end], keys[start:end], stamps, self.codec.schema,
                                         None if headers is None else headers[start:end], check=False)
                built.append((_Run(batch, min(stamps), max(stamps)), end - start, size_bytes))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise ConfigError(f"offer_records cannot build these records' columns: {exc}") from exc
        waiter = _RunsWaiter(future, len(built))
        for run, records, size_bytes in built:
            effects = machine.write(run, size_bytes, waiter, now_ms, records)
            if effects:
                self.run(effects)
        return future

    def _runs(self, values: Sequence[bytes], keys: Sequence[bytes | None], header_sizes: list[int] | None,
              total: int) -> list[tuple[int, int, int]]:
        """(start, end, size bytes) of the runs of at most min(flush_bytes, an entry's budget)."""
        limit = min(self._record_bytes_max, self.settings.flush_bytes)
        if total <= limit:
            return [(0, len(values), total)]
        runs, start, taken = [], 0, 0
        for index, value in enumerate(values):
            key = keys[index]
            size = len(value) + (len(key) if key else 0) + RECORD_OVERHEAD_BYTES + (
                header_sizes[index] if header_sizes else 0)
            if size > self._record_bytes_max:
                raise ConfigError(self.machine.batcher.check_record(size) or "record too large")
            if taken and taken + size > limit:
                runs.append((start, index, taken))
                start, taken = index, 0
            taken += size
        runs.append((start, len(values), taken))
        return runs

    def _buffer(self, value: Any, key: Any, timestamp_ms: Any, headers: Headers | None,
                future: asyncio.Future[Any] | None, sequence: int | None = None) -> None:
        """The per-record hot path: refuse a bad record at the call (before it could fail an
        entry of other records), then hand it to the machine. A named producer's record carries
        its (claimed) sequence as a fifth column."""
        machine = self.machine
        if machine.ended or self._closed is not None or self._crash is not None:
            self._check_open()
        if self._hold is not None:
            self._refuse()
        if type(value) is not bytes or (key is not None and type(key) is not bytes) or (
                timestamp_ms is not None and type(timestamp_ms) is not int):
            value, key = _checked_record(value, key, timestamp_ms)
        headers_bytes = self._check_headers(headers) if headers else 0
        size_bytes = len(value) + (len(key) if key else 0) + headers_bytes + RECORD_OVERHEAD_BYTES
        if size_bytes > self._record_bytes_max:
            raise ConfigError(machine.batcher.check_record(size_bytes) or "record too large")
        now_ms = self._wall_ms()
        if sequence is None:
            row: tuple[Any, ...] = (value, key, now_ms if timestamp_ms is None else timestamp_ms, headers or None)
        else:
            row = (value, key, now_ms if timestamp_ms is None else timestamp_ms, headers or None, sequence)
        effects = machine.write(row, size_bytes, future, now_ms)
        if effects:
            self.run(effects)

    def write_producer_batch(self, records: Sequence[tuple[bytes, bytes | None, int, Headers | None]],
                             producer: str, epoch: int, first_sequence: int,
                             last_sequence: int) -> asyncio.Future[Offset]:
        """Buffer an idempotent producer's batch (value, key, timestamp ms, headers per record) to
        land whole in one entry, whose producer section names it (so a new owner rebuilds its
        dedup table from the stream); the future resolves to the first record's offset once
        durable. A batch that cannot fit in one entry is refused (ConfigError), nothing buffered."""
        machine = self.machine
        if machine.ended or self._closed is not None or self._crash is not None:
            self._check_open()
        if self._hold is not None:
            self._refuse()
        if self._producer is not None:
            raise ConfigError("a writer opened with producer_id writes its own producer's records only")
        rows = []
        size_bytes = run_bytes(producer)
        for value, key, timestamp_ms, headers in records:
            if type(value) is not bytes or (key is not None and type(key) is not bytes) \
                    or type(timestamp_ms) is not int:
                value, key = _checked_record(value, key, timestamp_ms)
            size_bytes += (len(value) + (len(key) if key else 0) + RECORD_OVERHEAD_BYTES
                           + (self._check_headers(headers) if headers else 0))
            rows.append((value, key, timestamp_ms, headers or None))
        if not rows:
            raise ConfigError("a producer batch holds at least one record")
        if size_bytes > self._record_bytes_max:
            raise ConfigError(f"a producer batch of {size_bytes} bytes does not fit in one entry of at most "
                              f"{self.settings.entry_bytes_limit} bytes (the smaller of the stream's roll size "
                              f"and the writer's entry_bytes_max); send smaller batches or raise those limits")
        future: asyncio.Future[Offset] = self.loop.create_future()
        self._runs_buffered += 1
        effects = machine.write(_ProducerBatch(rows, producer, epoch, first_sequence, last_sequence), size_bytes,
                                future, self._wall_ms(), len(rows))
        if effects:
            self.run(effects)
        return future

    def _check_headers(self, headers: Headers) -> int:
        """Refuse headers that could not be written (now, not at flush time); their size."""
        if schema_with_headers(self.codec.schema) is None:
            raise ConfigError(f"record headers exist for untyped streams only; stream {self.name!r} is typed")
        for pair in headers:
            if (not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], str)
                    or not (pair[1] is None or isinstance(pair[1], bytes))):
                raise ConfigError(f"a record header is a (str key, bytes value) pair, got {pair!r}")
        return _headers_bytes(headers)

    async def write_batch(self, batch: pa.RecordBatch | Sequence[bytes], *,
                          sequence: int | Sequence[int] | None = None) -> WrittenBatch | DuplicateWrite:
        """Write a whole Arrow batch (or a list of values) without per-record Python work. Missing
        nullable columns are filled with nulls and a missing `timestamp` with the write time. The
        batch lands in one segment, in entries of at most min(roll size, entry_bytes_max).
        A named producer's (`producer_id`) records get sequences: `sequence` an int (the first
        record's; the others follow densely), a list of one strictly increasing int per record
        (gaps allowed), or None (the last sequence + 1 on). A resend of durable sequences returns a
        `DuplicateWrite`; one that overlaps them, or is not above what is buffered, raises
        SequenceError; either way nothing is written."""
        self._check_open()
        if self._hold is not None:
            self._refuse()
        if not isinstance(batch, pa.RecordBatch):
            batch = records_to_batch(list(batch), schema=self.codec.schema)
        else:
            batch = fill_missing_columns(batch, self.codec.schema, self.now_ms())
        check_batch(batch, self.codec.schema)
        if self._producer is None and sequence is not None:
            raise ConfigError("sequence= is for writers opened with producer_id")
        listed = self._listed_sequences(sequence, batch.num_rows)
        await self.wait_writable()
        limit = self.settings.entry_bytes_limit
        if self._producer is not None:
            limit -= run_bytes(self._producer) + 64  # room for the entry's producer section
        pieces = split_batch(batch, limit)
        future: asyncio.Future[WrittenBatch] = self.loop.create_future()
        if not pieces:
            future.set_result(WrittenBatch(self.machine.ledger_id or 0, ()))
            return await future
        if self._producer is not None:  # claimed after the wait, so concurrent writes keep their order
            first = (self._pushed + 1 if sequence is None else cast(int, sequence)) if listed is None else listed[0]
            last = first + batch.num_rows - 1 if listed is None else listed[-1]
            claimed = self._claim(first, last)
            if isinstance(claimed, DuplicateWrite):
                return claimed
            start = 0
            for piece in pieces:
                end = start + piece.num_rows
                self._piece_sequences[id(piece)] = (piece, first + start, first + end - 1) if listed is None \
                    else (piece, listed[start], listed[end - 1])
                start = end
        waiter = _BatchWaiter(future, len(pieces))
        self.run(self.machine.write_group([(piece, piece.num_rows, piece.nbytes) for piece in pieces], waiter,
                                          self.now_ms()))
        return await future

    def _listed_sequences(self, sequence: Any, count: int) -> list[int] | None:
        """write_batch's per-record sequences (checked strictly increasing), or None for a first one."""
        if sequence is None or type(sequence) is int:
            return None
        if isinstance(sequence, (pa.Array, pa.ChunkedArray)):
            sequence = sequence.to_pylist()
        listed = list(sequence)
        if len(listed) != count or count == 0 or any(type(n) is not int for n in listed) \
                or any(a >= b for a, b in zip(listed, listed[1:], strict=False)):
            raise SequenceError(f"producer {self._producer}: write_batch's sequence holds one strictly increasing "
                                f"integer per record ({count} records, {len(listed)} sequences)", None)
        return listed

    async def flush(self) -> None:
        """Send what is buffered and wait until everything written so far is durable."""
        self._check_open()
        done: asyncio.Future[None] = self.loop.create_future()
        self.run(self.machine.flush(self.now_ms(), done))
        await done
        if self.machine.error is not None:
            raise self.machine.error

    def _encode(self, items: Sequence[Any], first_record_index: int) -> EncodedEntry:
        """The machine's encoder: buffered records (rows of ROW_COLUMNS, runs of offer_records) or
        one batch piece."""
        if self._producer is not None:
            return self._encode_producer(items, first_record_index, self._producer)
        if len(items) == 1 and isinstance(items[0], pa.RecordBatch):
            return self.codec.encode_entry(items[0], first_record_index)
        producers: list[ProducerRun] = []
        if self._runs_buffered:  # producer batches among the items: their records, and the section
            rows: list[Any] = []
            count = 0  # records before the item in the entry
            for item in items:
                if type(item) is _ProducerBatch:
                    producers.append(ProducerRun(item.producer, item.epoch, item.first_sequence, item.last_sequence,
                                                 count, len(item.rows)))
                    rows.extend(item.rows)
                    count += len(item.rows)
                else:
                    rows.append(item)
                    count += item.batch.num_rows if type(item) is _Run else 1
            self._runs_buffered -= len(producers)
            items = rows
        if self._prebuilt is not None and not producers:
            batch = self._prebuilt_slice(items)
            if batch is not None:  # built in this round together with other writers' rows
                stamps = [item[2] for item in items]
                return self.codec.encode_entry(batch, first_record_index,
                                               timestamp_range_ms=(min(stamps), max(stamps)), checked=True)
        if any(type(item) is _Run for item in items):
            return self._encode_runs(items, first_record_index, producers)
        values, keys, timestamps, headers = zip(*items, strict=True)
        return self._encode_rows(values, keys, timestamps, headers, first_record_index, producers)

    def _encode_rows(self, values: Sequence[bytes], keys: Sequence[bytes | None], timestamps: Sequence[int],
                     headers: Sequence[Headers | None], first_record_index: int,
                     producers: Sequence[ProducerRun]) -> EncodedEntry:
        if any(headers):
            return self.codec.encode_entry(records_to_batch(values, keys, timestamps, self.codec.schema, headers),
                                           first_record_index, producers=producers)
        # built here from checked bytes and integer timestamps: no schema check and no Arrow
        # compute call for the timestamp range (the per-record path's cost)
        batch = records_to_batch(values, keys, timestamps, self.codec.schema, check=False)
        return self.codec.encode_entry(batch, first_record_index, timestamp_range_ms=(min(timestamps), max(timestamps)),
                                       checked=True, producers=producers)

    def _encode_producer(self, items: Sequence[Any], first_record_index: int, producer: str) -> EncodedEntry:
        """A named producer's entry: every record is its, so one run names them all (the first and
        last sequence; the sequences between are increasing), remembered until the entry is durable."""
        if len(items) == 1 and isinstance(items[0], pa.RecordBatch):
            piece, first, last = self._piece_sequences.pop(id(items[0]))
            self._entry_runs.append((first, last, piece.num_rows))
            return self.codec.encode_entry(piece, first_record_index,
                                           producers=[ProducerRun(producer, 0, first, last, 0, piece.num_rows)])
        values, keys, timestamps, headers, sequences = zip(*items, strict=True)
        runs = [ProducerRun(producer, 0, sequences[0], sequences[-1], 0, len(items))]
        self._entry_runs.append((sequences[0], sequences[-1], len(items)))
        return self._encode_rows(values, keys, timestamps, headers, first_record_index, runs)

    def _encode_runs(self, items: Sequence[Any], first_record_index: int,
                     producers: Sequence[ProducerRun]) -> EncodedEntry:
        """An entry of runs and rows: rows in a row turned into a batch, the batches concatenated
        (with a null headers column where some have headers and others none)."""
        batches: list[pa.RecordBatch] = []
        low, high = [], []
        rows: list[Any] = []

        def rows_done() -> None:
            if rows:
                values, keys, timestamps, headers = zip(*rows, strict=True)
                batches.append(records_to_batch(values, keys, timestamps, self.codec.schema, headers, check=False))
                low.append(min(timestamps))
                high.append(max(timestamps))
                rows.clear()

        for item in items:
            if type(item) is _Run:
                rows_done()
                batches.append(item.batch)
                low.append(item.min_timestamp_ms)
                high.append(item.max_timestamp_ms)
            else:
                rows.append(item)
        rows_done()
        if len(batches) > 1:
            if any(not batch.schema.equals(batches[0].schema) for batch in batches):
                schema = HEADERS_SCHEMA if any(batch.num_columns == len(HEADERS_SCHEMA) for batch in batches) \
                    else batches[0].schema
                batches = [pa.RecordBatch.from_arrays(fill_missing_columns(batch, schema, 0).columns, schema=schema)
                           for batch in batches]
            batch = pa.concat_batches(batches)
        else:
            batch = batches[0]
        return self.codec.encode_entry(batch, first_record_index, timestamp_range_ms=(min(low), max(high)),
                                       checked=True, producers=producers)

    # ------------------------------------------------------------------ effects

    def run(self, effects: Sequence[WriterEffect]) -> None:
        for effect in effects:
            if type(effect) is AppendEntry:
                self._append(effect)
            elif type(effect) is CompleteChunks:
                self._complete(effect)
            elif type(effect) is WakeWriters:
                self._room.set()
                if self.machine.ended:
                    self._on_ended()
            elif type(effect) is SetTimer:
                self._set_timer(effect.at_ms)
            elif type(effect) is RequestRound:
                self._flush_rounds.ask(self)
            elif type(effect) is FailChunks:
                _fail_waiters(effect.waiters, effect.error)
            elif type(effect) is CompleteFlushes:
                self._flushed(effect.waiters)
            else:
                self._run_other(effect)

    def _run_other(self, effect: WriterEffect) -> None:
        machine, stream = self.machine, self.name
        context, store = self.context, self.context.store
        if isinstance(effect, LockStream):
            self._spawn(self._lock(effect.timeout_s))
        elif isinstance(effect, ReadSegments):
            self._answer(lambda: store.segments(stream), machine.on_segments)
        elif isinstance(effect, SealSegment):
            self._spawn(self._seal(effect.segment))
        elif isinstance(effect, CreateLedger):
            self._answer(self._create_ledger, machine.on_ledger_created)
        elif isinstance(effect, CommitSegments):
            self._spawn(self._commit(effect))
        elif isinstance(effect, CloseLedger):
            self._spawn(self._close_ledger(effect.ledger_id))
        elif isinstance(effect, DeleteLedger):
            self._unwatch(effect.ledger_id)  # our own deletion is no news
            self._spawn(self._quietly(f"delete ledger {effect.ledger_id}",
                                      lambda: context.delete_ledger(effect.ledger_id)))
        elif isinstance(effect, ConfirmLedgerDeleted):
            self._answer(lambda: store.segments(stream),
                         lambda listing, now_ms: machine.on_ledger_deleted(effect.ledger_id, listing, now_ms))
        elif isinstance(effect, ReleaseLock):
            self._spawn(self._unlock())
        elif isinstance(effect, ApplyRetention):
            self._spawn(self._quietly("retention on roll", context.apply_retention))
        elif isinstance(effect, WriterOpened):
            if self._opened.done():  # the opener stopped waiting (cancelled): nobody to tell
                pass
            elif effect.error is not None:
                self._opened.set_exception(effect.error)
            else:
                self._opened.set_result(effect.segment)  # type: ignore[arg-type]
        elif isinstance(effect, WriterClosed):
            self._on_closed(effect.error)
        else:
            raise TypeError(f"the writer machine asked for {effect!r}, which this driver cannot do")

    def _feed(self, event: Callable[..., Sequence[WriterEffect]], *args: Any) -> None:
        """Hand an answer to the machine and carry out what it says."""
        if self._crash is None:
            self.run(event(*args, self.now_ms()))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        start_task(self.loop, self._tasks, self._guarded(coroutine), coroutine)

    async def _guarded(self, coroutine: Awaitable[None]) -> None:
        """An effect task: an expected failure goes to the machine; a bug ends the writer with it."""
        try:
            await coroutine
        except DlogError as exc:
            self._feed(self.machine.on_operation_failed, exc)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug: every waiting caller gets it, nothing is swallowed
            log.exception("stream %s: the writer driver failed", self.name)
            self._crashed(exc)

    def _answer(self, operation: Callable[[], Awaitable[Any]], event: Callable[..., Sequence[WriterEffect]]) -> None:
        async def call() -> None:
            self._feed(event, await operation())

        self._spawn(call())

    async def _lock(self, timeout_s: float) -> None:
        if self._lock_holder is None:
            token = await self.context.store.lock(self.name, timeout_s)
        else:
            token = await self.context.store.lock(self.name, timeout_s, self._lock_holder)
        self._lock_token = token
        self._feed(self.machine.on_locked, token is not None)

    async def _unlock(self) -> None:
        token, self._lock_token = self._lock_token, None
        if token is not None:
            await self._quietly("release the writer lock", lambda: self.context.store.unlock(token))

    async def _seal(self, segment: Segment) -> None:
        sealed, exists = await seal_in_progress(self.context.client, self.context.password, segment, self.now_ms())
        if sealed is None:
            log.info("stream %s: removing empty in-progress segment %d", self.name, segment.sequence)
        else:
            log.info("stream %s: recovered segment %d (ledger %d) at entry %d", self.name, segment.sequence,
                     segment.ledger_id, sealed.last_entry)
        self._feed(self.machine.on_sealed, segment, sealed, exists)

    async def _create_ledger(self) -> int:
        context = self.context
        config = context.config
        handle = await context.client.create_ledger(
            config.ensemble, config.write_quorum, config.ack_quorum, password=context.password,
            custom={"stream": self.name, "namespace": context.namespace})
        self._ledgers[handle.ledger_id] = handle
        self._watch(handle.ledger_id)
        return handle.ledger_id

    def _watch(self, ledger_id: int) -> None:
        """Learn at once when the ledger's metadata is deleted under this writer (bookies go on
        acknowledging adds to it until garbage collection drops it)."""
        try:
            self._watches[ledger_id] = self.context.watch_ledger_deleted(
                ledger_id, lambda: self._ledger_gone(ledger_id))
        except DlogError as exc:  # the close's compare-and-set still finds a deletion
            log.warning("stream %s: cannot watch ledger %d: %s", self.name, ledger_id, exc)

    def _ledger_gone(self, ledger_id: int) -> None:
        """The watch's callback, which runs outside any task: a bug it meets must still reach every
        caller rather than the event loop's log."""
        try:
            self._feed(self.machine.on_ledger_gone, ledger_id)
        except Exception as exc:
            log.exception("stream %s: the writer driver failed", self.name)
            self._crashed(exc)

    def _unwatch(self, ledger_id: int) -> None:
        stop = self._watches.pop(ledger_id, None)
        if stop is not None:
            stop()

    async def _commit(self, effect: CommitSegments) -> None:
        store = self.context.store
        change = effect.change
        if self._table is not None:  # a named producer: the table's snapshot lands with each completed segment
            ends = [s.first_position + s.records for s in change.update
                    if s.state is SegmentState.COMPLETED and s.first_position is not None]
            if ends:
                self._table.expire(self.now_ms())
                change = replace(change, dedup=encode_stored(max(ends), self._table.snapshot()))
        try:
            listing = await store.commit(self.name, effect.based_on, change)
        except MetadataVersionError:
            self._feed(self.machine.on_commit_conflict, await store.segments(self.name))
            return
        self._feed(self.machine.on_committed, listing)
        if self._holds and self.machine.state is WriterState.OPEN:  # a roll (or the open) committed
            self._recheck_backlog()

    async def _close_ledger(self, ledger_id: int) -> None:
        handle = self._ledgers.pop(ledger_id, None)
        error: DlogError | None = None
        if handle is not None:
            try:
                await handle.close()
            except DlogError as exc:  # the segment list already says where it ends
                log.warning("stream %s: closing ledger %d failed: %s", self.name, ledger_id, exc)
                error = exc
        self._unwatch(ledger_id)
        self._feed(self.machine.on_ledger_closed, ledger_id, error)

    async def _quietly(self, what: str, operation: Callable[[], Awaitable[Any]]) -> None:
        try:
            await operation()
        except DlogError as exc:
            log.warning("stream %s: %s failed: %s", self.name, what, exc)

    def _append(self, effect: AppendEntry) -> None:
        handle = self._ledgers[effect.ledger_id]
        ledger_id, entry_id = effect.ledger_id, effect.entry_id
        try:
            appended = handle.append_async(effect.payload)
        except DlogError as exc:  # the ledger refused at once (its writer already failed)
            self.loop.call_soon(self._feed, self.machine.on_entry_failed, ledger_id, entry_id, exc)
            return

        def done(answer: asyncio.Future[int]) -> None:
            if answer.cancelled():
                self._feed(self.machine.on_entry_failed, ledger_id, entry_id,
                           DlogError(f"append of entry {entry_id} to ledger {ledger_id} was cancelled"))
                return
            error = answer.exception()
            if error is None:
                self._feed(self.machine.on_entry_acked, ledger_id, entry_id)
            elif isinstance(error, DlogError):
                self._feed(self.machine.on_entry_failed, ledger_id, entry_id, error)
            else:
                self._crashed(error)

        appended.add_done_callback(done)

    def _complete(self, effect: CompleteChunks) -> None:
        ledger_id, entry_id, slot, first_position = effect.ledger_id, effect.entry_id, 0, effect.first_position
        if self._producer is not None and self._table is not None:  # the table hears of it before the caller
            first, last, records = self._entry_runs.popleft()
            if first_position is None:
                raise DlogError(f"stream {self.name!r} has no positions: a named producer needs them")
            self._table.on_written(self._producer, first, last, first_position, first_position + records - 1,
                                   self._wall_ms())
        for waiter, records in zip(effect.waiters, effect.records, strict=True):
            if waiter is None:  # an offered record
                pass
            elif type(waiter) in _PIECE_WAITERS:
                waiter.piece_done(ledger_id, entry_id, records,
                                  None if first_position is None else first_position + slot)
            elif not waiter.done():
                waiter.set_result(record_offset(ledger_id, entry_id, slot,
                                                None if first_position is None else first_position + slot))
            slot += records

    @staticmethod
    def _flushed(waiters: Sequence[asyncio.Future[None]]) -> None:
        for done in waiters:
            if not done.done():
                done.set_result(None)

    def _set_timer(self, at_ms: int | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if at_ms is not None:
            delay_s = max(0.0, (at_ms - self.now_ms()) / 1000)
            self._timer = self.loop.call_later(delay_s, self._on_timer)

    def on_round(self) -> None:
        """The flush round (FlushRounds) runs this writer: a bug it meets reaches every caller
        rather than ending the round for the other writers."""
        try:
            self._feed(self.machine.on_round)
        except Exception as exc:
            log.exception("stream %s: the writer driver failed", self.name)
            self._crashed(exc)

    def round_rows(self) -> list[Any] | None:
        """The plain rows (no headers) at the front of the buffer that the round may build at
        once with other writers', at most one entry's records; None when this writer's entries
        are built otherwise (a named producer, producer batches or runs, a linger to wait out)."""
        if self._producer is not None or self._runs_buffered or self.settings.linger_ms:
            return None
        rows: list[Any] = []
        limit = self.settings.flush_records
        for chunk in self.machine.batcher.buffer:
            item = chunk[1]
            if type(item) is not tuple or item[3] is not None or len(rows) >= limit:
                break
            rows.append(item)
        return rows or None

    def round_built(self, prebuilt: list[Any] | None) -> None:
        """The round's build of `round_rows()` ([batch, rows, 0]), until the round ends (None)."""
        self._prebuilt = prebuilt

    def _prebuilt_slice(self, items: Sequence[Any]) -> pa.RecordBatch | None:
        """The rows `items`, if they are the next ones of this round's build: its zero-copy slice."""
        prebuilt = self._prebuilt
        assert prebuilt is not None
        batch, rows, start = prebuilt
        end = start + len(items)
        if end > len(rows) or items[0] is not rows[start] or items[-1] is not rows[end - 1]:
            return None
        prebuilt[2] = end
        return batch.slice(start, len(items))

    def _on_timer(self) -> None:
        self._timer = None
        self._feed(self.machine.on_time)

    def _on_ended(self) -> None:
        """The writer failed or closed: its watches end, and `until_ended()` resolves."""
        for ledger_id in list(self._watches):
            self._unwatch(ledger_id)
        if not self._ended.done():
            self._ended.set_result(None)

    def _on_closed(self, error: DlogError | None) -> None:
        self._set_timer(None)
        self._room.set()
        self._on_ended()
        if self._closed is None:
            self._closed = self.loop.create_future()
        if self._closed.done():
            return
        if error is not None:
            self._closed.set_exception(error)
        else:
            self._closed.set_result(None)

    def _crashed(self, exc: BaseException) -> None:
        """A bug in the driver or the machine: everyone waiting gets it."""
        if self._crash is not None:
            return
        self._crash = exc
        _fail_waiters(self.machine.batcher.waiters(), exc)
        for future in (self._opened, self._closed):
            if future is not None and not future.done():
                future.set_exception(exc)
        self._flushed([done for _, done in self.machine.batcher.flushes])
        self._room.set()
        self._on_ended()


class FlushRounds:
    """The flush round of one event loop (the writer machine's RequestRound): one callback per
    loop turn runs every stream writer that asked, in the order they asked, and builds the rows
    they will send as ONE Arrow batch per schema (one `pa.array` call per column for all of them),
    each writer encoding its zero-copy slice. With 1,000 writers of a record or two each, that
    build is what their entries would otherwise each pay for (`dlog bench write --streams`)."""

    _of: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FlushRounds] = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.writers: list[StreamWriter] = []  # asked for the next round
        self.rounds = 0  # rounds run (a count for tests and benchmarks)
        self.writers_run = 0  # writers run in them
        self.rows_built = 0  # rows built together in them

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> FlushRounds:
        rounds = cls._of.get(loop)
        if rounds is None:
            rounds = cls._of[loop] = cls(loop)
        return rounds

    def ask(self, writer: StreamWriter) -> None:
        if not self.writers:
            self.loop.call_soon(self._run)
        self.writers.append(writer)

    def _run(self) -> None:
        writers, self.writers = self.writers, []
        self.rounds += 1
        self.writers_run += len(writers)
        built = self._build(writers) if len(writers) > 1 else []
        try:
            for writer in writers:
                writer.on_round()
        finally:
            for writer in built:
                writer.round_built(None)

    def _build(self, writers: list[StreamWriter]) -> list[StreamWriter]:
        """One Arrow batch per schema of the rows the writers will send; the writers it serves."""
        by_schema: dict[pa.Schema, list[tuple[StreamWriter, list[Any]]]] = {}
        for writer in writers:
            rows = writer.round_rows()
            if rows is not None:
                by_schema.setdefault(writer.codec.schema, []).append((writer, rows))
        built = []
        for schema, parts in by_schema.items():
            if len(parts) < 2:
                continue
            values, keys, timestamps = [], [], []
            for _, rows in parts:
                for value, key, timestamp_ms, _ in rows:
                    values.append(value)
                    keys.append(key)
                    timestamps.append(timestamp_ms)
            try:
                batch = records_to_batch(values, keys, timestamps, schema, check=False)
            except DlogError:  # each writer builds its own entries, and meets its own problem
                continue
            start = 0
            for writer, rows in parts:
                writer.round_built([batch.slice(start, len(rows)), rows, 0])
                start += len(rows)
                built.append(writer)
            self.rows_built += start
        return built


def _fail_waiters(waiters: Sequence[Any], error: BaseException) -> None:
    for waiter in waiters:
        if type(waiter) in _PIECE_WAITERS:
            waiter.fail(error)
        elif waiter is not None and not waiter.done():  # None: an offered record
            waiter.set_exception(error)


def _headers_bytes(headers: Headers | None) -> int:
    """What a record's headers cost in the buffer."""
    return sum(len(key) + len(value or b"") + RECORD_OVERHEAD_BYTES for key, value in headers or ())


def _checked_record(value: Any, key: Any, timestamp_ms: Any) -> tuple[bytes, bytes | None]:
    """The slow path of write_nowait and offer: bytes-like values and keys become bytes; anything
    else is refused at the call, before it could fail an entry of other records."""
    def as_bytes(what: str, item: Any) -> bytes:
        if isinstance(item, (bytes, bytearray, memoryview)):
            return bytes(item)
        raise ConfigError(f"a record {what} must be bytes, got {type(item).__name__}; typed streams "
                          "take write_batch()")

    if timestamp_ms is not None and (type(timestamp_ms) is not int or isinstance(timestamp_ms, bool)):
        raise ConfigError(f"a record timestamp is an integer of milliseconds, got {timestamp_ms!r}")
    return as_bytes("value", value), None if key is None else as_bytes("key", key)
