"""The entry format of compaction ledgers (key compaction, `dlog.core.compaction`), and the
decoded form a reader gets of a compacted segment's entry.

An entry of a compaction ledger is one Arrow IPC stream (zstd-compressed buffers) after the magic
`DLCP1`: one record batch of kept records of ONE segment, in stream order, with the stream's
columns (an untyped stream's `headers` too) and three more saying where each record was written:
`_entry` (its entry in the segment's ledger), `_slot` (its index in that entry) and `_index` (its
index in the segment, so its position is the segment's first position plus it).

`CompactedEntry` is what a compacted segment's handle answers for one of the segment's original
entries: a `DecodedEntry` holding only the records of that entry compaction kept, with their
slots and indexes (the reader hands out those offsets, not dense ones).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from dlog.segments.codec import FORMAT_VERSION, Compression, CorruptRecordSetError, DecodedEntry, RecordSetHeader

MAGIC = b"DLCP1"
ENTRY_COLUMN, SLOT_COLUMN, INDEX_COLUMN = "_entry", "_slot", "_index"
PLACE_COLUMNS = (ENTRY_COLUMN, SLOT_COLUMN, INDEX_COLUMN)
ENTRY_RECORDS_MAX = 4096  # kept records per compaction-ledger entry
_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")
# no Arrow thread pool when decoding: Spark's Python workers are forked, and a pool inherited
# through fork deadlocks
_READ_OPTIONS = pa.ipc.IpcReadOptions(use_threads=False)


def encode(batch: pa.RecordBatch, entries: pa.Array, slots: pa.Array, indexes: pa.Array) -> bytes:
    """One compaction-ledger entry: `batch`'s records with their original places."""
    placed = batch
    for name, column, kind in ((ENTRY_COLUMN, entries, pa.int64()), (SLOT_COLUMN, slots, pa.int32()),
                               (INDEX_COLUMN, indexes, pa.int64())):
        placed = placed.append_column(name, column.cast(kind))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, placed.schema, options=_OPTIONS) as writer:
        writer.write_batch(placed)
    data: bytes = sink.getvalue().to_pybytes()
    return MAGIC + data


def decode(payload: bytes | bytearray | memoryview) -> pa.RecordBatch:
    """The batch of one compaction-ledger entry (with its place columns)."""
    view = memoryview(payload)
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise CorruptRecordSetError(f"compaction entry starts with {bytes(view[:len(MAGIC)])!r}, not {MAGIC!r}")
    try:
        table = pa.ipc.open_stream(pa.py_buffer(view[len(MAGIC):]), options=_READ_OPTIONS).read_all()
    except pa.ArrowInvalid as exc:
        raise CorruptRecordSetError(f"compaction entry is not a valid Arrow stream: {exc}") from exc
    if any(name not in table.column_names for name in PLACE_COLUMNS):
        raise CorruptRecordSetError(f"compaction entry lacks its place columns {PLACE_COLUMNS}")
    return table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist(
        [], schema=table.schema)


@dataclass(frozen=True, slots=True)
class CompactedEntry(DecodedEntry):
    """The kept records of one original entry: row i is at slot `record_slots[i]` of the entry and
    index `record_indexes[i]` of the segment."""

    record_slots: tuple[int, ...] = ()
    record_indexes: tuple[int, ...] = ()


def compacted_entry(batch: pa.RecordBatch) -> CompactedEntry:
    """A decoded entry of a slice of a compaction entry's batch (all rows of one original entry)."""
    slots = tuple(batch.column(SLOT_COLUMN).to_pylist())
    indexes = tuple(batch.column(INDEX_COLUMN).to_pylist())
    records = batch.drop_columns(list(PLACE_COLUMNS))
    timestamps = records.column("timestamp").cast(pa.int64()).to_pylist() if "timestamp" in records.schema.names \
        else [0]
    header = RecordSetHeader(FORMAT_VERSION, Compression.NONE, records.num_rows, indexes[0] if indexes else 0,
                             min(timestamps, default=0), max(timestamps, default=0), records.nbytes)
    return CompactedEntry(header, records, slots, indexes)


def empty_entry(batch: pa.RecordBatch | None) -> CompactedEntry:
    """What an original entry compaction emptied reads as: no records (of `batch`'s columns)."""
    if batch is not None:
        return compacted_entry(batch.slice(0, 0))
    header = RecordSetHeader(FORMAT_VERSION, Compression.NONE, 0, 0, 0, 0, 0)
    return CompactedEntry(header, pa.RecordBatch.from_pydict({}), (), ())
