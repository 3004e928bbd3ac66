"""The dlog sink: each write task fills its own ledger; the driver appends the ledgers.

Theory of operation (exactly once, L6). A write task creates a NEW ledger with the stream's
quorum and password, appends its rows as entries (Arrow batches, zstd; record indexes counted
within that ledger), closes it and returns a commit message naming it. Nothing is visible to
readers yet: the ledger is in no segment list. The driver's `commit(messages, batch_id)` then,
under the stream's writer lock, appends every ledger of the batch as a COMPLETED segment (new
sequence numbers, in partition order) AND records `batch_id` in the sink node
`store.sink_path(stream, sink_id)`, in ONE ZooKeeper multi guarded by the segment-list version
(`commit_batch` in `dlog_spark.segments`). So the batch's records appear all at once or not at all,
and a batch that Spark replays after a restart (it committed to dlog but not to its own log)
finds its id already recorded: it appends nothing and deletes the replay's ledgers. `abort`
deletes the ledgers of failed batches. A ledger whose task died before it reported stays
outside every segment list: readers never see it (see the report on orphan ledgers).

Routing (no option `stream`): each row's `stream` column names its target, as Kafka's `topic`
column does. A task writes one ledger per target stream; the driver appends all of them and
records the batch id in every target's sink node in ONE multi (`commit_routed`), so a routed
batch too lands whole or not at all, and a replay finds its id recorded.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from bookkeeper.client.ledger import LedgerHandle
from bookkeeper.clock import wall_ms
from bookkeeper.errors import ConfigError, known
from dlog.names import check_stream_name
from dlog.segments.codec import ProducerRun, RecordSetCodec, split_batch
from dlog.segments.schemas import schema_version
from dlog.segments.store import StreamNotFoundError
from dlog_spark.connection import Connection, connection
from dlog_spark.options import ROUTE_COLUMN, SinkOptions, StreamCreation
from dlog_spark.schema import sink_batch
from dlog_spark.segments import ROUTED_STREAMS_MAX, commit_batch, commit_routed, delete_ledgers

log = logging.getLogger(__name__)
FLUSH_BYTES = 2 << 20  # rows gathered into entries of about this many uncompressed bytes
ENTRY_BYTES_MAX = 3 << 20  # below the bookie's 4 MiB entry limit
IN_FLIGHT_FLUSHES_MAX = 8
APPEND_TIMEOUT_S = 120.0


@dataclass
class DlogCommitMessage(WriterCommitMessage):
    """What one write task wrote: one closed ledger (None when the task had no rows)."""

    stream: str
    ledger_id: int | None
    last_entry: int = -1
    records: int = 0
    bytes: int = 0
    first_timestamp_ms: int = 0
    last_timestamp_ms: int = 0
    created_ms: int = 0
    schema_version: int = 0  # the stream's schema version the task wrote (typed streams)
    producer: str | None = None  # producerId: the task's producer and the sequences it wrote
    first_sequence: int = -1
    last_sequence: int = -1
    duplicates: int = 0  # rows at or below the producer's last sequence already in the stream: not written

    @property
    def ledger(self) -> int:
        """The ledger written: only asked of a task's message that wrote one (`_written`)."""
        return known(self.ledger_id, f"a commit message of stream {self.stream!r} without a ledger")


# ------------------------------------------------------------------------------ the stream


def prepare_stream(options: SinkOptions) -> None:
    """The sink's stream must exist when a query or a batch write starts (Spark makes the writer
    then, and again for each commit): one clear error at once rather than a failed task per
    partition in the first micro-batch. With `createStream` a missing stream is created. A routed
    sink's targets are known row by row: its write tasks check (or create) them."""
    if options.stream is None:
        return
    conn = connection(options.connection)
    conn.call(target_stream(conn.namespace, options.stream, options.creation))


async def target_stream(namespace: Any, stream: str, creation: StreamCreation) -> Any:
    """A target stream's config; with createStream a missing stream is created (by whichever task
    or query gets there first: creating an existing one is no error) with the sink's quorum."""
    try:
        return await namespace.config(stream)
    except StreamNotFoundError:
        pass  # answered below, outside the except block: Spark then shows one error, not a chain
    if not creation.enabled:
        raise ConfigError(
            f"the dlog sink's stream {stream!r} does not exist in namespace {namespace.name!r}: create it "
            f'with `dlog stream create {stream}`, or set .option("createStream", "true")')
    log.info("dlog sink: creating stream %s", stream)
    return await namespace.create_stream(stream, ensemble=creation.ensemble, write_quorum=creation.write_quorum,
                                         ack_quorum=creation.ack_quorum, exist_ok=True)


# ------------------------------------------------------------------------------ write tasks


@dataclass
class DlogRoutedCommitMessage(WriterCommitMessage):
    """What one write task of a routed sink wrote: one closed ledger per target stream."""

    parts: list[DlogCommitMessage]


class _WriteTask:
    """One Spark write task (executor side): its rows go to one new ledger per target stream,
    the sink's stream, or with routing each row's `stream` column."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.conn: Connection = connection(options.connection)
        self.ledgers: dict[str, _LedgerTask] = {}
        self.producer = None if options.producer is None else options.producer.of_partition(task_partition())

    def run(self, batches: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        try:
            if self.options.stream is not None:
                self._ledger(self.options.stream)  # a missing stream fails (or is created) even with no rows
            for batch in batches:
                if not batch.num_rows:
                    continue
                if self.options.stream is not None:
                    self._ledger(self.options.stream).add(batch)
                    continue
                for stream, rows in routed(batch):
                    self._ledger(stream).add(rows)
            parts = [task.finish() for task in self.ledgers.values()]
        except BaseException:
            for task in self.ledgers.values():
                task.discard()
            raise
        if self.options.stream is not None:
            return parts[0]
        return DlogRoutedCommitMessage(parts)

    def _ledger(self, stream: str) -> _LedgerTask:
        task = self.ledgers.get(stream)
        if task is None:
            if len(self.ledgers) >= ROUTED_STREAMS_MAX:
                raise ConfigError(f"a write task of the dlog sink got rows for more than {ROUTED_STREAMS_MAX} "
                                  "streams; one batch may route to at most that many")
            task = self.ledgers[stream] = _LedgerTask(self.conn, self.options, stream, self.producer)
        return task


def task_partition() -> int:
    """The Spark partition this write task writes (a producerId's task producer is named by it)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise ConfigError("option 'producerId' needs a Spark task context to name each task's producer")
    return context.partitionId()


def routed(batch: pa.RecordBatch) -> Iterator[tuple[str, pa.RecordBatch]]:
    """The batch's rows grouped by their `stream` column (each target's rows in input order)."""
    index = batch.schema.get_field_index(ROUTE_COLUMN)
    if index < 0:
        raise ConfigError(f"the dlog sink needs option 'stream' (the stream to append to) or a {ROUTE_COLUMN!r} "
                          "column naming each row's stream")
    column = batch.column(index)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise ConfigError(f"column {ROUTE_COLUMN!r} is {column.type}; it names each row's target stream, a string")
    if column.null_count:
        raise ConfigError(f"column {ROUTE_COLUMN!r} is null in {column.null_count} rows; each row needs its "
                          "target stream (or set option 'stream' for all rows)")
    for stream in pc.unique(column).to_pylist():
        check_stream_name(stream)
        yield stream, batch.filter(pc.equal(column, stream))


class _LedgerTask:
    """Writes one task's rows for one stream into one new ledger (executor side)."""

    def __init__(self, conn: Connection, options: SinkOptions, stream: str, producer: str | None = None) -> None:
        self.options = options
        self.stream = stream
        self.conn = conn
        namespace = self.conn.namespace
        self.config = self.conn.call(target_stream(namespace, stream, options.creation))
        self.schema = namespace.schema_of(self.config)
        self.codec = RecordSetCodec(self.schema)
        self.ledger: LedgerHandle | None = None
        self.message = DlogCommitMessage(stream, None, created_ms=wall_ms(), schema_version=schema_version(self.config),
                                         producer=producer)
        self._buffer: list[pa.RecordBatch] = []
        self._sequences: list[pa.Array] = []  # with a producer: each buffered batch's sequences
        self._buffered_bytes = 0
        self._in_flight: deque[Any] = deque()
        self.stream_last: int | None = None  # the producer's last sequence in the stream: rows at or below are there
        self.task_last: int | None = None  # the last sequence this task took: the next must be above it
        if producer is not None:
            self.stream_last = self.conn.call(namespace.last_sequence(stream, producer))

    def add(self, batch: pa.RecordBatch) -> None:
        if self.message.producer is None:
            self._add(sink_batch(batch, self.schema, self.stream))
            return
        assert self.options.producer is not None
        batch, sequences = self._new_rows(batch, self.options.producer.column)
        if batch.num_rows:
            self._add(sink_batch(batch, self.schema, self.stream), sequences)

    def _new_rows(self, batch: pa.RecordBatch, column: str) -> tuple[pa.RecordBatch, pa.Array]:
        """The rows above the producer's last sequence (the others are in the stream already) and
        their sequences; the sequence column leaves the rows unless the stream has a column of
        that name. Sequences must be whole, not null, and increase within the task's rows."""
        index = batch.schema.get_field_index(column)
        if index < 0:
            raise ConfigError(f"the dlog sink's sequenceColumn {column!r} is not a column of the rows "
                              f"({', '.join(batch.schema.names)})")
        sequences = batch.column(index)
        if not pa.types.is_integer(sequences.type):
            raise ConfigError(f"sequenceColumn {column!r} is {sequences.type}; it must be an integer column")
        if sequences.null_count:
            raise ConfigError(f"sequenceColumn {column!r} is null in {sequences.null_count} rows; every row needs "
                              "its sequence")
        sequences = sequences.cast(pa.int64())
        if self.schema.get_field_index(column) < 0:
            batch = batch.remove_column(index)
        if self.stream_last is not None:
            kept = pc.greater(sequences, self.stream_last)
            self.message.duplicates += batch.num_rows - kept.true_count
            batch, sequences = batch.filter(kept), sequences.filter(kept)
        if not len(sequences):
            return batch, sequences
        if pc.min(sequences).as_py() < 0:
            raise ConfigError(f"sequenceColumn {column!r} has a negative value; sequences are 0 or above")
        first = sequences[0].as_py()
        if (self.task_last is not None and first <= self.task_last) or \
                (len(sequences) > 1 and not pc.all(pc.greater(sequences[1:], sequences[:-1])).as_py()):
            raise ConfigError(f"sequenceColumn {column!r} does not increase within the rows of task producer "
                              f"{self.message.producer!r} (stream {self.stream!r}): order each partition by it "
                              "(sortWithinPartitions) and keep it unique")
        self.task_last = sequences[-1].as_py()
        return batch, sequences

    def finish(self) -> DlogCommitMessage:
        self._flush()
        while self._in_flight:
            self._in_flight.popleft().result(APPEND_TIMEOUT_S)
        if self.ledger is not None:
            self.conn.call(self.ledger.close())
            self.message.last_entry = self.ledger.last_add_confirmed
        return self.message

    def _add(self, batch: pa.RecordBatch, sequences: pa.Array | None = None) -> None:
        self._buffer.append(batch)
        if sequences is not None:
            self._sequences.append(sequences)
        self._buffered_bytes += batch.nbytes
        if self._buffered_bytes >= FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        batch = self._buffer[0] if len(self._buffer) == 1 else pa.concat_batches(self._buffer)
        sequences = pa.concat_arrays(self._sequences) if self._sequences else None
        self._buffer, self._sequences, self._buffered_bytes = [], [], 0
        if self.ledger is None:
            self.ledger = self.conn.call(self.conn.namespace.client.create_ledger(
                self.config.ensemble, self.config.write_quorum, self.config.ack_quorum,
                password=self.conn.namespace.password_of(self.config),
                custom={"stream": self.stream, "namespace": self.conn.namespace.name,
                        "writer": f"spark-sink:{self.options.sink_id or 'batch'}"}))
            self.message.ledger_id = self.ledger.ledger_id
        payloads = []
        message = self.message
        at = 0
        for piece in split_batch(batch, ENTRY_BYTES_MAX):
            runs: tuple[ProducerRun, ...] = ()
            if sequences is not None:
                assert message.producer is not None
                first, last = sequences[at].as_py(), sequences[at + piece.num_rows - 1].as_py()
                runs = (ProducerRun(message.producer, 0, first, last, 0, piece.num_rows),)
                message.first_sequence = first if message.first_sequence < 0 else message.first_sequence
                message.last_sequence = last
            at += piece.num_rows
            payload = self.codec.encode_entry(piece, message.records, producers=runs).payload
            header = self.codec.peek_header(payload)
            if message.records == 0:
                message.first_timestamp_ms = header.min_timestamp_ms
            message.last_timestamp_ms = max(message.last_timestamp_ms, header.max_timestamp_ms)
            message.records += piece.num_rows
            message.bytes += len(payload)
            payloads.append(payload)
        while len(self._in_flight) >= IN_FLIGHT_FLUSHES_MAX:
            self._in_flight.popleft().result(APPEND_TIMEOUT_S)
        self._in_flight.append(self.conn.submit(_append_all(self.ledger, payloads)))

    def discard(self) -> None:
        """A failed task leaves nothing behind: its ledger is in no segment list, delete it."""
        if self.ledger is None:
            return
        try:
            self.conn.call(delete_ledgers(self.conn.namespace, [self.ledger.ledger_id]), 30.0)
        except Exception as error:  # best effort: the task is failing anyway
            log.warning("dlog sink: could not delete ledger %d of a failed task: %s", self.ledger.ledger_id, error)


async def _append_all(ledger: LedgerHandle, payloads: list[bytes]) -> None:
    """Append in order (all appends start before the first await), then wait for durability."""
    import asyncio

    futures = [ledger.append_async(payload) for payload in payloads]
    await asyncio.gather(*futures)


# ------------------------------------------------------------------------------ writers


class DlogStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        prepare_stream(options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _WriteTask(self.options).run(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _commit(self.options, messages, batchId, self.options.sink_id)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort(self.options, messages)


class DlogBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        prepare_stream(options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _WriteTask(self.options).run(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit(self.options, messages, None, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self.options, messages)


def _parts(messages: list[WriterCommitMessage | None]) -> list[DlogCommitMessage]:
    """Every task's message for each stream, in partition order (a routed task's in stream order)."""
    found: list[DlogCommitMessage] = []
    for message in messages:
        parts = message.parts if isinstance(message, DlogRoutedCommitMessage) else [message]
        found += [m for m in parts if isinstance(m, DlogCommitMessage)]
    return found


def _written(messages: list[WriterCommitMessage | None]) -> list[DlogCommitMessage]:
    """Every ledger written, in partition order (a routed task's parts in their stream order)."""
    return [m for m in _parts(messages) if m.ledger_id is not None]


def _commit(options: SinkOptions, messages: list[WriterCommitMessage | None], batch_id: int | None,
            sink_id: str | None) -> None:
    conn = connection(options.connection)
    skipped = sum(m.duplicates for m in _parts(messages))
    if skipped:
        log.info("dlog sink: %d rows were in the stream already (their producers' sequences): not written again",
                 skipped)
    if options.stream is not None:
        conn.call(commit_batch(conn.namespace, options.stream, _written(messages), batch_id, sink_id))
        return
    batches: dict[str, list[DlogCommitMessage]] = {}
    for message in _written(messages):
        batches.setdefault(message.stream, []).append(message)
    if batches:
        conn.call(commit_routed(conn.namespace, batches, batch_id, sink_id))


def _abort(options: SinkOptions, messages: list[WriterCommitMessage | None]) -> None:
    written = _written(messages)
    if not written:
        return
    conn = connection(options.connection)
    for stream in sorted({m.stream for m in written}):
        ledgers = [m.ledger for m in written if m.stream == stream]
        conn.call(delete_ledgers(conn.namespace, ledgers, stream=stream))
        log.info("dlog sink: aborted; deleted ledgers %s of stream %s", ledgers, stream)
