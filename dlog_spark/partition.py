"""The worker side of the dlog source: a partition (entries of one ledger) and its read, which
decodes entries straight into Arrow batches of the read schema in a Python worker (an executor's,
or the driver's in local mode). A worker process keeps its read handles (`dlog.snapshot`, on the
process's connection): the partitions of a ledger that later tasks read cost no second open.

Tiered segments. A partition of an offloaded segment carries the segment's `TierCopy` as the
planner saw it, so the worker (which never sees the segment list) reads the Parquet file when the
bookie copy is gone or the query prefers the tier (`prefer`), through the same read cache that
reads ledgers: the same entries, slots and headers come out. A ledger that turns out to be gone
(deleted after an offload the plan did not see yet, or while it was read) is looked up once in
the segment list: a tier copy there is read on from the entry reached; only a segment without
one is data loss.

Compacted segments (key compaction). A segment whose ledger compaction replaced is read from its
compacted copy (looked up in the segment list when its ledger is missing, or at once with option
`readCompacted`): the kept records of each entry, each with its original slot."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from bookkeeper.errors import NoSuchEntryError, NoSuchLedgerError
from dlog.segments.codec import HEADERS_SCHEMA, RecordSetCodec
from dlog.segments.compacted import CompactedEntry
from dlog.segments.metadata import Segment, StreamConfig, TierCopy
from dlog.segments.schemas import projection, schema_at, versions_of
from dlog.segments.store import StreamNotFoundError
from dlog.snapshot import TierHandle
from dlog_spark.connection import connection
from dlog_spark.options import SourceOptions
from dlog_spark.plan import DataLossError, Range
from dlog_spark.schema import BatchShaper, arrow_read_schema, read_schema

log = logging.getLogger(__name__)
READ_CHUNK_ENTRIES = 16
READ_TIMEOUT_S = 120.0


class DlogPartition(InputPartition):
    """Entries first..last of one ledger of one stream (records from `first_slot` of the first)."""

    def __init__(self, span: Range, fail_on_data_loss: bool) -> None:
        super().__init__(None)
        self.stream = span.stream
        self.ledger_id = span.ledger_id
        self.first_entry = span.first_entry
        self.last_entry = span.last_entry
        self.first_slot = span.first_slot
        self.end_slot = span.end_slot
        self.tier = span.tier
        self.fail_on_data_loss = fail_on_data_loss
        self.schema_version = span.schema_version

    def __repr__(self) -> str:
        end = "" if self.end_slot is None else f", end_slot={self.end_slot}"
        tier = "" if self.tier is None else f", tier={self.tier.uri!r}"
        return (f"DlogPartition({self.stream!r}, ledger={self.ledger_id}, entries={self.first_entry}.."
                f"{self.last_entry}, first_slot={self.first_slot}{end}{tier})")



def on_loss(fail: bool, losses: tuple[str, ...]) -> None:
    text = "; ".join(losses)
    if fail:
        raise DataLossError(f"data loss: {text}. Records the query had not read were removed by "
                            "truncation or retention. Start the query again from a new checkpoint, or set "
                            "failOnDataLoss=false to skip to the earliest available records")
    log.warning("dlog source skipped removed records (failOnDataLoss=false): %s", text)


# ------------------------------------------------------------------------------ workers


def read_partition(options: SourceOptions, schema: StructType, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Decode the partition's entries into record batches of the read schema (in a worker)."""
    if not isinstance(partition, DlogPartition):
        return  # Spark's placeholder partition of an empty batch read
    conn = connection(options.connection)
    namespace = conn.namespace
    try:
        config = conn.call(namespace.config(partition.stream))
        password = namespace.password_of(config)
        # the process's cached handle when an earlier task opened the ledger; the planner saw
        # these entries confirmed, so no LAC read
        compacted = _listed_compacted(conn, partition) if options.read_compacted else None
        handle: Any
        try:
            if compacted is not None:
                handle = conn.call(namespace.reads.compacted_handle(compacted, password))
            else:
                handle = conn.call(namespace.reads.handle(partition.ledger_id, password, partition.last_entry,
                                                          tier=partition.tier, prefer=options.prefer))
        except NoSuchLedgerError:
            copy = _listed_tier_copy(conn, partition)
            compacted = _listed_compacted(conn, partition) if copy is None else None
            if copy is not None:
                handle = conn.call(namespace.reads.tier_handle(copy, partition.last_entry))
            elif compacted is not None:
                handle = conn.call(namespace.reads.compacted_handle(compacted, password))
            else:
                raise
    except (StreamNotFoundError, NoSuchLedgerError) as error:
        on_loss(partition.fail_on_data_loss, (f"{partition!r} can no longer be read: {error}",))
        return
    stream_schema = namespace.schema_of(config)
    output = arrow_read_schema(schema)
    headers = "headers" in output.names  # includeHeaders: decode every entry with its headers column
    codec = RecordSetCodec(stream_schema, headers=headers)
    projected = None
    if config.schema:  # a typed stream: decoded in its segment's version, projected onto the query's
        stream_schema = query_version(config, output)
        written = schema_at(config, partition.schema_version)
        codec, projected = RecordSetCodec(written), projection(written, stream_schema, partition.schema_version)
    shaper = BatchShaper(partition.stream, HEADERS_SCHEMA if headers else stream_schema, output)
    first, last = partition.first_entry, partition.last_entry

    def fetch(start: int) -> Any:
        return conn.submit(handle.read(start, min(last, start + READ_CHUNK_ENTRIES - 1)))

    pending = fetch(first)
    next_start = first
    while pending is not None:
        try:
            entries = pending.result(READ_TIMEOUT_S)
        except (NoSuchLedgerError, NoSuchEntryError) as error:
            namespace.reads.forget(partition.ledger_id)
            copy = None if isinstance(handle, TierHandle) else _listed_tier_copy(conn, partition)
            compacted = _listed_compacted(conn, partition) if copy is None else None
            # the bookie copy went after an offload (compaction): read on from the tier file (compacted copy)
            if copy is not None:
                handle = conn.call(namespace.reads.tier_handle(copy, last))
            elif compacted is not None:
                handle = conn.call(namespace.reads.compacted_handle(compacted, password))
            else:
                on_loss(partition.fail_on_data_loss, (f"{partition!r} was removed while it was read: {error}",))
                return
            pending = fetch(next_start)
            continue
        next_start += len(entries)
        pending = fetch(next_start) if next_start <= last else None  # decode while the next arrives
        for entry in entries:
            slot = partition.first_slot if entry.entry_id == first else 0
            if isinstance(entry.payload, CompactedEntry):
                kept = _compacted_rows(codec, entry.payload, slot, partition.end_slot if entry.entry_id == last
                                       else None)
                if kept is not None:
                    yield shaper.shape(kept[0], partition.ledger_id, entry.entry_id, slot, kept[1])
                continue
            batch = codec.records_from(entry.payload, slot)
            if projected is not None:
                batch = projected.apply(batch)
            if entry.entry_id == last and partition.end_slot is not None:
                batch = batch.slice(0, max(0, partition.end_slot - slot))
            if batch.num_rows:
                yield shaper.shape(batch, partition.ledger_id, entry.entry_id, slot)


def query_version(config: StreamConfig, output: pa.Schema) -> pa.Schema:
    """The schema version of a typed stream that a query reads in: the latest whose read schema is
    the query's (the latest when the query was planned; a version added since is not its)."""
    versions = versions_of(config)
    for version in reversed(versions):
        if arrow_read_schema(read_schema(version)).equals(output):
            return version
    return versions[-1]


def _compacted_rows(codec: RecordSetCodec, payload: CompactedEntry, first_slot: int,
                    end_slot: int | None) -> tuple[pa.RecordBatch, pa.Array] | None:
    """The kept records of a compacted entry from `first_slot` up to `end_slot`, with their slots."""
    _, batch = codec.decode(payload)
    rows = [row for row, slot in enumerate(payload.record_slots)
            if slot >= first_slot and (end_slot is None or slot < end_slot)]
    if not rows:
        return None
    taken = pa.array(rows, pa.int64())
    return batch.take(taken), pa.array([payload.record_slots[row] for row in rows], pa.int32())


def _listed_compacted(conn: Any, partition: DlogPartition) -> Segment | None:
    """The partition's segment as the segment list holds it now, if it is compacted (None else)."""
    try:
        listing = conn.call(conn.namespace.store.segments(partition.stream))
    except StreamNotFoundError:
        return None
    segment = listing.by_ledger(partition.ledger_id)
    return segment if segment is not None and segment.compacted is not None else None


def _listed_tier_copy(conn: Any, partition: DlogPartition) -> TierCopy | None:
    """The tier copy of the partition's segment: the planned one, else the one the segment list
    holds now (an offload the plan did not see), else None (the records are gone: data loss)."""
    if partition.tier is not None:
        return partition.tier
    try:
        listing = conn.call(conn.namespace.store.segments(partition.stream))
    except StreamNotFoundError:
        return None
    segment = listing.by_ledger(partition.ledger_id)
    if segment is None or segment.tier is None:
        return None
    conn.namespace.reads.know(segment)
    return segment.tier
