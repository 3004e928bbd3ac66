"""A stream this server owns: its one writer, into which every producer's records go (so one
fsynced quorum write serves many producers, and each producer's records keep their order: a
produced batch is buffered whole, without a pause, in the order the requests came), the stream
positions known durable, the recent tail kept in memory for fetches, and the producer table.

Durable first: a record enters the tail (and the end position moves past it) only once its entry
is acknowledged by an ack quorum of bookies, so a fetch never returns what could still be lost.

Idempotent producers (`produce_idempotent`) go through the dedup table, which outlives the owner:
each batch lands whole in one entry whose producer section names it, the table's snapshot is
stored under the stream now and then, and a new owner rebuilds the table (`rebuild_dedup`: the
snapshot, then the entries after it) before it serves (docs/serving.md, "Producer dedup across
failover").
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from bookkeeper.clock import monotonic_s
from bookkeeper.errors import DlogError
from dlog.core.dedup import (
    Accepted,
    DedupTable,
    Duplicate,
    Fenced,
    InFlight,
    OutOfOrder,
    encode_stored,
    kafka_producer,
)
from dlog.core.errors import BacklogExceededError
from dlog.core.settings import RECORD_OVERHEAD_BYTES
from dlog.namespace import Namespace
from dlog.offsets import Offset
from dlog.producers import rebuild_producers
from dlog.segments.codec import run_bytes, schema_with_headers
from dlog.serve.kafka import ErrorCode, Record
from dlog.writer import StreamWriter

log = logging.getLogger(__name__)
TAIL_BATCHES_MAX = 65_536  # per stream, whatever their size: bounds the index of the tail
IN_FLIGHT_RESEND_WAIT_S = 30.0  # a resend of a batch not yet durable waits this long for it
TAIL_RECORD_BYTES = 64  # what the tail counts for a record beyond its key and value


class RecordRefused(Exception):
    """A record the stream cannot take (too large for an entry, or headers on a typed stream)."""


SaveSnapshot = Callable[["OwnedStream", bytes], None]  # stores the stored form; calls snapshot_saved after
READ_POLL_S = 0.1  # a long-polling fetch of a read-only typed stream looks at the stream's end this often


def typed_refusal(name: str) -> str:
    """Why a Kafka producer cannot write the typed stream `name` (one line)."""
    return (f"stream {name!r} is typed (its records are a schema's columns): Kafka producers write only untyped "
            "streams (key, value, timestamp); write it natively (write_batch, `dlog write`), Kafka consumers read "
            "it as JSON")


class ReadOnlyStream:
    """A typed stream this server serves for reading only, without its writer lock (native writers
    write it meanwhile: `dlog.serve.ownership`, READ): made per request, its bounds read from the
    stream, no tail. A long-polling fetch looks at the stream's end again every READ_POLL_S (the
    event `grown_event` gives is set then), since no writer here tells it of new records."""

    typed = True

    def __init__(self, name: str, start_position: int, end_position: int) -> None:
        self.name = name
        self.start_position = start_position
        self.end_position = end_position

    def check(self, records: Sequence[Record], producer: str | None = None) -> str | None:
        return typed_refusal(self.name)

    def read_tail(self, position: int, bytes_max: int) -> list[tuple[int, Sequence[Record]]] | None:
        return None

    def grown_event(self) -> asyncio.Event:
        event = asyncio.Event()
        asyncio.get_running_loop().call_later(READ_POLL_S, event.set)
        return event


class OwnedStream:
    def __init__(self, name: str, writer: StreamWriter, start_position: int, end_position: int,
                 tail_bytes_max: int, dedup: DedupTable | None = None, replay_bytes_max: int = 8 << 20,
                 save_snapshot: SaveSnapshot | None = None) -> None:
        self.name = name
        self.writer = writer
        self.start_position = start_position  # the first readable record (Kafka's log start offset)
        self.end_position = end_position  # the position the next durable record gets (high watermark)
        self.tail_bytes_max = tail_bytes_max
        # rebuilt by the owner before it serves (`dlog.core.dedup.rebuild`); its snapshot is stored
        # with the stream once `replay_bytes_max` of records became durable since the last one
        self.dedup = dedup or DedupTable()
        self.replay_bytes_max = replay_bytes_max
        self._save_snapshot = save_snapshot
        self._bytes_since_snapshot = 0
        self._saving = False
        self.snapshots_stored = 0
        self.typed = schema_with_headers(writer.codec.schema) is None
        # the tail: durable batches in position order (first positions, records, bytes)
        self._firsts: list[int] = []
        self._batches: list[tuple[Record, ...]] = []
        self._sizes: list[int] = []
        self._head = 0  # batches before it were dropped
        self._tail_bytes = 0
        self._grown = asyncio.Event()
        self._durable_waiters: dict[str, asyncio.Event] = {}  # producer -> set at its next durable batch
        self.records_written = 0

    # ------------------------------------------------------------------ writing

    def check(self, records: Sequence[Record], producer: str | None = None) -> str | None:
        """Why these records cannot be written (None: they can), before any of them is buffered;
        an idempotent `producer`'s batch must fit in one entry whole."""
        if self.typed:
            return typed_refusal(self.name)
        batcher = self.writer.machine.batcher
        total = 0 if producer is None else run_bytes(producer)
        for record in records:
            size = (len(record.value or b"") + len(record.key or b"") + RECORD_OVERHEAD_BYTES
                    + sum(len(key) + len(value or b"") + RECORD_OVERHEAD_BYTES for key, value in record.headers))
            problem = batcher.check_record(size)
            if problem is not None:
                return problem
            total += size
        if producer is not None and batcher.check_record(total) is not None:
            return (f"an idempotent batch of {total} bytes does not fit in one entry of at most "
                    f"{self.writer.settings.entry_bytes_limit} bytes (a producer's batch is never cut between "
                    f"entries): send smaller batches, or raise the stream's roll size")
        return None

    def append(self, records: Sequence[Record]) -> asyncio.Future[int]:
        """Buffer `records` (checked) into the writer at once, in order; the future resolves to the
        first record's position once all are durable (they get consecutive positions: nothing else
        is buffered between them). One bulk call: the writer builds their Arrow columns at once
        (`StreamWriter.offer_records`), with no per-record call into it."""
        values = [record.value or b"" for record in records]
        keys = [record.key for record in records]
        headers = [record.headers for record in records]
        written = self.writer.offer_records(values, keys, [record.timestamp_ms for record in records],
                                            [list(pairs) or None for pairs in headers] if any(headers) else None)
        result: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        kept = tuple(records)
        size = sum(map(len, values)) + sum(map(len, filter(None, keys))) + TAIL_RECORD_BYTES * len(kept)

        def durable(done: asyncio.Future[int | None]) -> None:
            if result.done():
                return
            if done.cancelled():
                result.set_exception(asyncio.CancelledError())
            elif (error := done.exception()) is not None:
                result.set_exception(error)
            elif (position := done.result()) is None:  # an open writer always assigns positions (V4)
                result.set_exception(RuntimeError(f"stream {self.name!r} gave no position"))
            else:
                self._durable(position, kept, size)
                result.set_result(position)

        written.add_done_callback(durable)
        return result

    def append_idempotent(self, records: Sequence[Record], producer: str, epoch: int, first_sequence: int,
                          last_sequence: int) -> asyncio.Future[int]:
        """Buffer an idempotent producer's batch (checked, accepted by the dedup table) whole into
        one entry whose producer section names it; the future resolves to its first position once
        durable, after the table heard of it (`on_durable`, before the end position moves past it,
        so a snapshot never claims a position whose batches the table does not hold)."""
        loop = asyncio.get_running_loop()
        result: asyncio.Future[int] = loop.create_future()
        written = self.writer.write_producer_batch(
            [(record.value or b"", record.key, record.timestamp_ms, list(record.headers) or None)
             for record in records], producer, epoch, first_sequence, last_sequence)
        kept = tuple(records)
        size = sum(len(r.value or b"") + len(r.key or b"") for r in kept) + TAIL_RECORD_BYTES * len(kept)

        def durable(done: asyncio.Future[Offset]) -> None:
            error: BaseException | None = asyncio.CancelledError() if done.cancelled() else done.exception()
            position = None if error is not None else done.result().position
            if error is not None or position is None:
                if not result.done():
                    result.set_exception(error or RuntimeError(f"stream {self.name!r} gave no position"))
                return
            self.dedup.on_durable(producer, first_sequence, last_sequence, position, position + len(kept) - 1,
                                  self.writer.now_ms(), epoch)
            self._durable(position, kept, size)
            if not result.done():
                result.set_result(position)

        written.add_done_callback(durable)
        return result

    async def produce_idempotent(self, records: Sequence[Record], producer_id: int, epoch: int, first_sequence: int,
                                 last_sequence: int, appended: Callable[[], None],
                                 refusals: Any = log) -> tuple[ErrorCode, int]:
        """An idempotent Kafka producer's batch (checked), through the stream's dedup table: a
        resend of a durable batch is answered with its first offset, not written twice; a resend
        of one in flight waits for it. (error, base offset); `appended` is called once the batch
        is buffered; `refusals` logs the refused ones (a rate-limited log)."""
        producer = kafka_producer(producer_id)
        dedup = self.dedup
        deadline = monotonic_s() + IN_FLIGHT_RESEND_WAIT_S
        while True:
            verdict = dedup.offer(producer, first_sequence, last_sequence, self.writer.now_ms(), epoch)
            if isinstance(verdict, Accepted):
                break
            if isinstance(verdict, Duplicate):  # design.md, "Producer deduplication"
                if verdict.first_offset is None:
                    return ErrorCode.DUPLICATE_SEQUENCE_NUMBER, -1
                return ErrorCode.NONE, verdict.first_offset
            if isinstance(verdict, InFlight) and (remaining := deadline - monotonic_s()) > 0:
                next_durable = self.durable_event(producer)
                try:
                    async with asyncio.timeout(remaining):
                        await next_durable.wait()
                except TimeoutError:
                    return ErrorCode.REQUEST_TIMED_OUT, -1
                continue
            if isinstance(verdict, InFlight):
                return ErrorCode.REQUEST_TIMED_OUT, -1
            if isinstance(verdict, OutOfOrder):
                refusals.warning("sequence", "%s", verdict.message)
                return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1
            if isinstance(verdict, Fenced):
                return ErrorCode.INVALID_PRODUCER_EPOCH, -1
            refusals.warning("producers", "%s", verdict.message)  # Refused: a limit of the table
            return ErrorCode.THROTTLING_QUOTA_EXCEEDED, -1
        try:  # the batch lands whole in one entry that names it; the table hears of it as it is durable
            written = self.append_idempotent(records, producer, epoch, first_sequence, last_sequence)
        except DlogError as exc:
            dedup.on_failed(producer, first_sequence, epoch)  # nothing was buffered
            self.producer_settled(producer)
            if isinstance(exc, BacklogExceededError):  # held until a subscription's backlog drains
                refusals.warning("backlog", "produce to %s refused: %s", self.name, exc)
                return ErrorCode.POLICY_VIOLATION, -1
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
        appended()

        def settled(_: asyncio.Future[int]) -> None:  # a parked resend looks again
            self.producer_settled(producer)

        written.add_done_callback(settled)
        try:
            return ErrorCode.NONE, await written
        except DlogError:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1  # outcome unknown: the stream's next owner decides

    def _durable(self, first_position: int, records: tuple[Record, ...], size: int) -> None:
        self._bytes_since_snapshot += size
        self._firsts.append(first_position)
        self._batches.append(records)
        self._sizes.append(size)
        self._tail_bytes += size
        self.end_position = max(self.end_position, first_position + len(records))
        self.records_written += len(records)
        while (self._tail_bytes > self.tail_bytes_max or len(self._firsts) - self._head > TAIL_BATCHES_MAX) \
                and len(self._firsts) - self._head > 1:
            self._tail_bytes -= self._sizes[self._head]
            self._head += 1
        if self._head > 1024 and self._head * 2 > len(self._firsts):
            del self._firsts[: self._head], self._batches[: self._head], self._sizes[: self._head]
            self._head = 0
        grown, self._grown = self._grown, asyncio.Event()
        grown.set()
        if self._bytes_since_snapshot >= self.replay_bytes_max:
            self.store_snapshot()

    def store_snapshot(self) -> bool:
        """Store the dedup table's snapshot at the end position now (one store at a time)."""
        if self._saving or self._save_snapshot is None:
            return False
        self._saving = True
        self._bytes_since_snapshot = 0
        self._save_snapshot(self, encode_stored(self.end_position, self.dedup.snapshot()))
        return True

    def snapshot_saved(self, stored: bool) -> None:
        self._saving = False
        self.snapshots_stored += stored

    # ------------------------------------------------------------------ producers

    def durable_event(self, producer: str) -> asyncio.Event:
        """Set once the producer's next batch is durable or failed (an in-flight resend waits on it)."""
        event = self._durable_waiters.get(producer)
        if event is None:
            event = self._durable_waiters[producer] = asyncio.Event()
        return event

    def producer_settled(self, producer: str) -> None:
        event = self._durable_waiters.pop(producer, None)
        if event is not None:
            event.set()

    # ------------------------------------------------------------------ reading

    @property
    def tail_bytes(self) -> int:
        """Bytes of durable records the in-memory tail holds (bounded by tail_bytes_max)."""
        return self._tail_bytes

    @property
    def tail_start(self) -> int:
        """The first position the in-memory tail holds (end_position when it holds none)."""
        return self._firsts[self._head] if self._head < len(self._firsts) else self.end_position

    def read_tail(self, position: int, bytes_max: int) -> list[tuple[int, Sequence[Record]]] | None:
        """(first position, records) runs from `position` on, about `bytes_max` at most (at least one
        run when there is one); None when `position` is before the tail."""
        if position < self.tail_start:
            return None
        index = bisect.bisect_right(self._firsts, position, lo=self._head) - 1
        runs: list[tuple[int, Sequence[Record]]] = []
        taken = 0
        while 0 <= index < len(self._firsts) and (not runs or taken < bytes_max):
            first, records = self._firsts[index], self._batches[index]
            skip = position - first if position > first else 0
            if skip < len(records):
                runs.append((first + skip, records[skip:] if skip else records))
                taken += self._sizes[index]
            index += 1
        return runs

    async def wait_growth(self, timeout_s: float) -> None:
        """Return when a record becomes durable, or after `timeout_s`."""
        grown = self._grown
        try:
            async with asyncio.timeout(timeout_s):
                await grown.wait()
        except TimeoutError:
            pass

    def grown_event(self) -> asyncio.Event:
        return self._grown

    def stats(self) -> dict[str, Any]:
        return {"stream": self.name, "start_position": self.start_position, "end_position": self.end_position,
                "tail_records": sum(len(b) for b in self._batches[self._head:]), "tail_bytes": self._tail_bytes,
                "producers": self.dedup.producer_count, "records_written": self.records_written,
                "dedup_snapshots_stored": self.snapshots_stored}


async def rebuild_dedup(ns: Namespace, stream: str, end: int) -> tuple[DedupTable, int, int]:
    """The producer dedup table of `stream` as its previous owners left it (docs/serving.md,
    "Producer dedup across failover"), for an owner whose writer is open and whose stream ends at
    `end`: the stored snapshot restored, the entries from its position to `end` replayed (their
    producer sections), idle producers expired (`dlog.core.dedup.rebuild`); then stored again at
    `end`, so the next owner replays only what this one writes. (table, stored version, batches
    replayed). A stream no owner ever stored a snapshot of holds no producer section: nothing to
    replay. MetadataVersionError: another owner stored one meanwhile."""
    table, found_version, replayed, position = await rebuild_producers(
        ns.store, lambda start: ns.open_reader(stream, start, follow=False, skip_truncated=True), stream, end,
        ns.clock.wall_ms())
    version = await ns.store.store_dedup_snapshot(stream, encode_stored(end, table.snapshot()), found_version)
    log.info("stream %s: dedup table rebuilt with %d producers (%d batches replayed from position %s)", stream,
             table.producer_count, replayed, position)
    return table, version, replayed
