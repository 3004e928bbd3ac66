"""The dlog sink: each write task fills its own ledger; the driver appends the ledgers.

Theory of operation (exactly once, L6). A write task creates a NEW ledger with the stream's
quorum and password, appends its rows as entries (Arrow batches, zstd; record indexes counted
within that ledger), closes it and returns a commit message naming it. Nothing is visible to
readers yet: the ledger is in no segment list. The driver's `commit(messages, batch_id)` then,
under the stream's writer lock, appends every ledger of the batch as a COMPLETED segment (new
sequence numbers, in partition order) AND records `batch_id` in the sink node
`store.sink_path(stream, sink_id)`, in ONE ZooKeeper multi guarded by the segment-list version
(`commit_batch` in `spark.segments`). So the batch's records appear all at once or not at all,
and a batch that Spark replays after a restart (it committed to dlog but not to its own log)
finds its id already recorded: it appends nothing and deletes the replay's ledgers. `abort`
deletes the ledgers of failed batches. A ledger whose task died before it reported stays
outside every segment list: readers never see it (see the report on orphan ledgers).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from bookkeeper.client.ledger import LedgerHandle
from bookkeeper.clock import wall_ms
from bookkeeper.errors import ConfigError
from dlog.segments.store import StreamNotFoundError
from dlog.segments.codec import RecordSetCodec, split_batch
from spark.connection import Connection, connection
from spark.options import SinkOptions
from spark.schema import sink_batch
from spark.segments import commit_batch, delete_ledgers

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


# ------------------------------------------------------------------------------ the stream


def prepare_stream(options: SinkOptions) -> None:
    """The sink's stream must exist when a query or a batch write starts (Spark makes the writer
    then, and again for each commit): one clear error at once rather than a failed task per
    partition in the first micro-batch. With `createStream` a missing stream is created."""
    conn = connection(options.connection)
    try:
        conn.call(conn.namespace.config(options.stream))
        return
    except StreamNotFoundError:
        pass  # answered below, outside the except block: Spark then shows one error, not a chain
    if not options.creation.enabled:
        raise ConfigError(
            f"the dlog sink's stream {options.stream!r} does not exist in namespace "
            f"{options.connection.namespace!r}: create it with `dlog stream create {options.stream}`, "
            'or set .option("createStream", "true")')
    conn.call(conn.namespace.create_stream(options.stream, exist_ok=True))
    log.info("dlog sink: created stream %s", options.stream)


# ------------------------------------------------------------------------------ write tasks


class _LedgerTask:
    """Writes the rows of one task into one new ledger (executor side)."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.conn: Connection = connection(options.connection)
        namespace = self.conn.namespace
        self.config = self.conn.call(namespace.config(options.stream))
        self.schema = namespace.schema_of(self.config)
        self.codec = RecordSetCodec(self.schema)
        self.ledger: LedgerHandle | None = None
        self.message = DlogCommitMessage(options.stream, None, created_ms=wall_ms())
        self._buffer: list[pa.RecordBatch] = []
        self._buffered_bytes = 0
        self._in_flight: deque[Any] = deque()

    def run(self, batches: Iterator[pa.RecordBatch]) -> DlogCommitMessage:
        try:
            for batch in batches:
                if batch.num_rows:
                    self._add(sink_batch(batch, self.schema, self.options.stream))
            self._flush()
            while self._in_flight:
                self._in_flight.popleft().result(APPEND_TIMEOUT_S)
            if self.ledger is not None:
                self.conn.call(self.ledger.close())
                self.message.last_entry = self.ledger.last_add_confirmed
        except BaseException:
            self._discard()
            raise
        return self.message

    def _add(self, batch: pa.RecordBatch) -> None:
        self._buffer.append(batch)
        self._buffered_bytes += batch.nbytes
        if self._buffered_bytes >= FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        batch = self._buffer[0] if len(self._buffer) == 1 else pa.concat_batches(self._buffer)
        self._buffer, self._buffered_bytes = [], 0
        if self.ledger is None:
            self.ledger = self.conn.call(self.conn.namespace.client.create_ledger(
                self.config.ensemble, self.config.write_quorum, self.config.ack_quorum,
                password=self.conn.namespace.password_of(self.config),
                custom={"stream": self.options.stream, "namespace": self.conn.namespace.name,
                        "writer": f"spark-sink:{self.options.sink_id or 'batch'}"}))
            self.message.ledger_id = self.ledger.ledger_id
        payloads = []
        message = self.message
        for piece in split_batch(batch, ENTRY_BYTES_MAX):
            payload = self.codec.encode(piece, message.records)
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

    def _discard(self) -> None:
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

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DlogCommitMessage:
        return _LedgerTask(self.options).run(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        conn = connection(self.options.connection)
        conn.call(commit_batch(conn.namespace, self.options.stream, _written(messages), batchId,
                               self.options.sink_id))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort(self.options, messages)


class DlogBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        prepare_stream(options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DlogCommitMessage:
        return _LedgerTask(self.options).run(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        conn = connection(self.options.connection)
        conn.call(commit_batch(conn.namespace, self.options.stream, _written(messages), None, None))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self.options, messages)


def _written(messages: list[WriterCommitMessage | None]) -> list[DlogCommitMessage]:
    return [m for m in messages if isinstance(m, DlogCommitMessage) and m.ledger_id is not None]


def _abort(options: SinkOptions, messages: list[WriterCommitMessage | None]) -> None:
    ledgers = [m.ledger_id for m in _written(messages)]
    if not ledgers:
        return
    conn = connection(options.connection)
    conn.call(delete_ledgers(conn.namespace, ledgers, stream=options.stream))
    log.info("dlog sink: aborted; deleted ledgers %s", ledgers)
