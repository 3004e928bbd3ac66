"""What the driver reads to plan a micro-batch: stream lists, stream views, entry headers.

`view` takes a fresh snapshot of a stream (segment lists change under a running query: rolls,
truncation, the sink appending): one segment-list read and one LAC read, through the process's
one cache of read handles and entry headers (`dlog.snapshot`, the namespace's `reads`). The stream
reader takes one view per stream per trigger and plans the trigger's partitions from that same
view. Entry headers (records and bytes before an entry, timestamps) are read from a view's
confirmed entries only, so they cost no LAC read, and are cached: they never change once written.
Everything runs on the process's shared connection.
"""

from __future__ import annotations

import logging
import re

import pyarrow as pa
import pyarrow.compute as pc

from bookkeeper.errors import ConfigError
from dlog.core import snapshot
from dlog.core.snapshot import Cursor, SegmentView, StreamView
from dlog.segments.codec import RecordSetCodec
from dlog.segments.metadata import StreamConfig
from dlog.segments.schemas import schema_at
from dlog.segments.store import StreamNotFoundError
from dlog.snapshot import EntryInfo
from dlog_spark.connection import Connection
from dlog_spark.options import SourceOptions
from dlog_spark.plan import Range

log = logging.getLogger(__name__)


class Catalog:
    def __init__(self, conn: Connection, options: SourceOptions) -> None:
        self.conn = conn
        self.options = options
        self.namespace = conn.namespace
        self.reads = conn.namespace.reads
        self._configs: dict[str, StreamConfig] = {}
        self._segments: dict[str, dict[int, SegmentView]] = {}  # stream -> ledger -> segment, as last viewed

    # ------------------------------------------------------------------ streams

    def stream_names(self) -> list[str]:
        """The streams the query reads now: the named ones (each must exist) or the matching ones."""
        existing = self.conn.call(self.namespace.list_streams())
        if self.options.pattern is None:
            missing = [name for name in self.options.streams if name not in existing]
            if missing:
                raise StreamNotFoundError(f"stream {missing[0]!r} does not exist in namespace "
                                          f"{self.options.connection.namespace!r} (see `dlog stream list`)")
            return list(self.options.streams)
        pattern = re.compile(self.options.pattern)
        return sorted(name for name in existing if pattern.fullmatch(name))

    def refresh(self) -> None:
        """Forget stream configs (a stream may have been deleted and created again); entry
        headers stay cached, they never change."""
        self._configs.clear()

    def config(self, name: str) -> StreamConfig:
        config = self._configs.get(name)
        if config is None:
            config = self._configs[name] = self.conn.call(self.namespace.config(name))
        return config

    def schema(self, name: str) -> pa.Schema:
        return self.namespace.schema_of(self.config(name))

    def check_schema(self, name: str, expected: pa.Schema) -> None:
        schema = self.schema(name)
        if not schema.equals(expected):
            raise ConfigError(f"stream {name!r} has schema ({schema}) but this query reads ({expected}); "
                              "every stream of one query must have the same schema")

    # ------------------------------------------------------------------ snapshots

    def view(self, name: str) -> StreamView:
        config = self.config(name)
        view = self.conn.call(self.reads.view(self.namespace.store, name, self.namespace.password_of(config)))
        self._segments[name] = {segment.ledger_id: segment for segment in view.segments}
        return view

    # ------------------------------------------------------------------ entry headers

    def entry(self, stream: str, ledger_id: int, entry_id: int) -> EntryInfo:
        """An entry's record-set header and the ledger's length through it (cached: written
        entries never change)."""
        segment = self._segments[stream][ledger_id]
        return self.conn.call(self.reads.entry_info(ledger_id, entry_id, self._password(stream),
                                                    segment.end_entry - 1))

    def _password(self, stream: str) -> bytes:
        return self.namespace.password_of(self.config(stream))

    def records_before(self, span: Range, entry_id: int) -> int:
        """Records of the span's segment before `entry_id` (from the previous entry's header)."""
        segment = self._segments[span.stream][span.ledger_id]
        if entry_id <= segment.first_entry:
            return 0
        if segment.completed and entry_id >= segment.end_entry:
            return segment.records or 0
        return self.entry(span.stream, span.ledger_id, entry_id - 1).header.next_record_index

    def bytes_before(self, span: Range, entry_id: int) -> int:
        """Bytes of the span's ledger before `entry_id` (the previous entry's cumulative length);
        of an offloaded segment, its tier file's bytes per record times the records before
        `entry_id` (what reading it from the tier costs; a tier file has no ledger lengths, and
        one measure per segment keeps it monotone whichever copy answered a header)."""
        segment = self._segments[span.stream][span.ledger_id]
        if entry_id <= 0:
            return 0
        if segment.tier is not None:
            rows = segment.tier.rows
            return segment.tier.size_bytes * self.records_before(span, entry_id) // rows if rows else 0
        if segment.completed:
            entry_id = min(entry_id, segment.end_entry)
        return self.entry(span.stream, span.ledger_id, entry_id - 1).length

    # ------------------------------------------------------------------ timestamps

    def at_timestamp(self, view: StreamView, timestamp_ms: int) -> Cursor | None:
        """Where the first record stamped at or after `timestamp_ms` is (Kafka's offsetsForTimes):
        segment metadata, then a binary search over entry headers, then one entry decoded for the
        slot. None when no record is that late."""
        name = view.name

        def entry_max_ms(index: int, entry_id: int) -> int:
            return self.entry(name, view.segments[index].ledger_id, entry_id).header.max_timestamp_ms

        cursor = snapshot.first_entry_at_or_after(view, timestamp_ms, entry_max_ms)
        if cursor is None:
            return None
        segment = view.segments[view.index_at(cursor)]
        entry = self.conn.call(self.reads.entry(segment.ledger_id, cursor.entry_id, self._password(name),
                                                segment.end_entry - 1))
        config = self.config(name)
        written = schema_at(config, segment.schema_version) if config.schema else self.schema(name)
        batch = RecordSetCodec(written).decode(entry.payload)[1]
        slot = first_slot_at_or_after(batch, timestamp_ms, cursor.slot)
        if slot is None:  # the header's max rounds sub-millisecond stamps up; none is really that late
            return snapshot.after_entry(view, cursor)
        return Cursor(cursor.sequence, cursor.entry_id, slot)


def first_slot_at_or_after(batch: pa.RecordBatch, timestamp_ms: int, from_slot: int = 0) -> int | None:
    """The first slot (from `from_slot`) whose record's `timestamp` is at or after `timestamp_ms`."""
    index = batch.schema.get_field_index("timestamp")
    if index < 0 or not pa.types.is_timestamp(batch.schema.field(index).type):
        return None
    stamps = pc.cast(batch.column(index).slice(from_slot), pa.timestamp("ms"), safe=False)  # floors
    late = pc.fill_null(pc.greater_equal(stamps, pa.scalar(timestamp_ms, pa.timestamp("ms"))), False)
    found = pc.index(late, True).as_py()
    return None if found < 0 else from_slot + found
