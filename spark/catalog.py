"""What the driver reads to plan a micro-batch: stream lists, segment lists, LACs, entry headers.

Each call takes a fresh snapshot of ZooKeeper (segment lists change under a running query:
rolls, truncation, the sink appending). Entry headers are cached per (ledger, entry) because
they never change once written. Everything runs on the process's shared connection.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from bookkeeper.errors import ConfigError
from dlog.segments.codec import RecordSetCodec, RecordSetHeader, default_schema
from dlog.segments.metadata import Segment, SegmentState, StreamConfig
from dlog.segments.store import StreamNotFoundError
from spark.connection import Connection
from spark.options import SourceOptions
from spark import plan
from spark.plan import Cursor, Range, SegmentView, StreamView

log = logging.getLogger(__name__)
HEADER_CACHE_MAX = 100_000


class Catalog:
    def __init__(self, conn: Connection, options: SourceOptions) -> None:
        self.conn = conn
        self.options = options
        self.namespace = conn.namespace
        self._configs: dict[str, StreamConfig] = {}
        self._segments: dict[str, dict[int, Segment]] = {}  # stream -> ledger -> segment, as last seen
        self._entries: OrderedDict[tuple[int, int], EntryInfo] = OrderedDict()
        self._codec = RecordSetCodec(default_schema())  # headers do not depend on the schema

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
        return self.conn.call(self._view(self.config(name)))

    async def _view(self, config: StreamConfig) -> StreamView:
        name = config.name
        listing = await self.namespace.store.segments(name)
        self._segments[name] = {segment.ledger_id: segment for segment in listing.segments}
        views = []
        for segment in listing.segments:
            end_entry = segment.last_entry + 1
            if segment.is_in_progress:
                handle = await self.namespace.open_segment_ledger(config, segment)
                end_entry = handle.last_add_confirmed + 1
            views.append(SegmentView(
                segment.sequence, segment.ledger_id, live=not segment.is_truncated,
                completed=segment.state is not SegmentState.IN_PROGRESS,
                first_entry=segment.first_entry, end_entry=max(end_entry, segment.first_entry),
                min_active_entry=segment.min_active_entry, min_active_slot=segment.min_active_slot,
                records=None if segment.is_in_progress else segment.records,
                last_timestamp_ms=None if segment.is_in_progress else segment.last_timestamp_ms))
        return StreamView(name, tuple(views))

    # ------------------------------------------------------------------ entry headers

    def entry(self, stream: str, ledger_id: int, entry_id: int) -> EntryInfo:
        """An entry's record-set header and the ledger's length through it (cached: written
        entries never change)."""
        key = (ledger_id, entry_id)
        found = self._entries.get(key)
        if found is None:
            config, segment = self._configs[stream], self._segments[stream][ledger_id]
            found = self._entries[key] = self.conn.call(self._read_entry(config, segment, entry_id))
            if len(self._entries) > HEADER_CACHE_MAX:
                self._entries.popitem(last=False)
        return found

    async def _read_entry(self, config: StreamConfig, segment: Segment, entry_id: int) -> EntryInfo:
        handle = await self.namespace.open_segment_ledger(config, segment)
        if not segment.is_in_progress:
            handle.advance_lac(segment.last_entry)
        entry = (await handle.read(entry_id, entry_id))[0]
        return EntryInfo(self._codec.peek_header(entry.payload), entry.length)

    def records_before(self, span: Range, entry_id: int) -> int:
        """Records of the span's segment before `entry_id` (from the previous entry's header)."""
        segment = self._segments[span.stream][span.ledger_id]
        if entry_id <= segment.first_entry:
            return 0
        if not segment.is_in_progress and entry_id > segment.last_entry:
            return segment.records
        return self.entry(span.stream, span.ledger_id, entry_id - 1).header.next_record_index

    def bytes_before(self, span: Range, entry_id: int) -> int:
        """Bytes of the span's ledger before `entry_id` (the previous entry's cumulative length)."""
        segment = self._segments[span.stream][span.ledger_id]
        if entry_id <= 0:
            return 0
        if not segment.is_in_progress:
            entry_id = min(entry_id, segment.last_entry + 1)
        return self.entry(span.stream, span.ledger_id, entry_id - 1).length

    # ------------------------------------------------------------------ timestamps

    def at_timestamp(self, view: StreamView, timestamp_ms: int) -> Cursor | None:
        """Where the first record stamped at or after `timestamp_ms` is (Kafka's offsetsForTimes):
        segment metadata, then a binary search over entry headers, then one entry decoded for the
        slot. None when no record is that late."""
        name = view.name

        def entry_max_ms(index: int, entry_id: int) -> int:
            return self.entry(name, view.segments[index].ledger_id, entry_id).header.max_timestamp_ms

        cursor = plan.first_entry_at_or_after(view, timestamp_ms, entry_max_ms)
        if cursor is None:
            return None
        segment = self._segments[name][view.segments[cursor.index].ledger_id]
        batch = self.conn.call(self._decode(self.config(name), segment, cursor.entry))
        slot = first_slot_at_or_after(batch, timestamp_ms, cursor.slot)
        if slot is None:  # the header's max rounds sub-millisecond stamps up; none is really that late
            return plan.after_entry(view, cursor)
        return plan.Cursor(cursor.index, cursor.entry, slot)

    async def _decode(self, config: StreamConfig, segment: Segment, entry_id: int) -> pa.RecordBatch:
        handle = await self.namespace.open_segment_ledger(config, segment)
        if not segment.is_in_progress:
            handle.advance_lac(segment.last_entry)
        entry = (await handle.read(entry_id, entry_id))[0]
        return RecordSetCodec(self.schema(config.name)).decode(entry.payload)[1]


@dataclass(frozen=True, slots=True)
class EntryInfo:
    header: RecordSetHeader
    length: int  # the ledger's length through this entry


def first_slot_at_or_after(batch: pa.RecordBatch, timestamp_ms: int, from_slot: int = 0) -> int | None:
    """The first slot (from `from_slot`) whose record's `timestamp` is at or after `timestamp_ms`."""
    index = batch.schema.get_field_index("timestamp")
    if index < 0 or not pa.types.is_timestamp(batch.schema.field(index).type):
        return None
    stamps = pc.cast(batch.column(index).slice(from_slot), pa.timestamp("ms"), safe=False)  # floors
    late = pc.fill_null(pc.greater_equal(stamps, pa.scalar(timestamp_ms, pa.timestamp("ms"))), False)
    found = pc.index(late, True).as_py()
    return None if found < 0 else from_slot + found
