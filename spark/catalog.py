"""What the driver reads to plan a micro-batch: stream lists, segment lists, LACs, entry headers.

Each call takes a fresh snapshot of ZooKeeper (segment lists change under a running query:
rolls, truncation, the sink appending). Entry headers are cached per (ledger, entry) because
they never change once written. Everything runs on the process's shared connection.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict

import pyarrow as pa

from bookkeeper.errors import ConfigError
from dlog.segments.codec import RecordSetCodec, default_schema
from dlog.segments.metadata import Segment, SegmentState, StreamConfig
from dlog.segments.store import StreamNotFoundError
from spark.connection import Connection
from spark.options import SourceOptions
from spark.plan import Range, SegmentView, StreamView

log = logging.getLogger(__name__)
HEADER_CACHE_MAX = 100_000


class Catalog:
    def __init__(self, conn: Connection, options: SourceOptions) -> None:
        self.conn = conn
        self.options = options
        self.namespace = conn.namespace
        self._configs: dict[str, StreamConfig] = {}
        self._segments: dict[str, dict[int, Segment]] = {}  # stream -> ledger -> segment, as last seen
        self._headers: OrderedDict[tuple[int, int], int] = OrderedDict()
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
                records=None if segment.is_in_progress else segment.records))
        return StreamView(name, tuple(views))

    # ------------------------------------------------------------------ record counts

    def records_before(self, span: Range, entry_id: int) -> int:
        """Records of the span's segment before `entry_id` (from entry headers, cached)."""
        config, segment = self._configs[span.stream], self._segments[span.stream][span.ledger_id]
        if entry_id <= segment.first_entry:
            return 0
        if not segment.is_in_progress and entry_id > segment.last_entry:
            return segment.records
        key = (span.ledger_id, entry_id)
        found = self._headers.get(key)
        if found is None:
            found = self.conn.call(self._first_record_index(config, segment, entry_id))
            self._headers[key] = found
            if len(self._headers) > HEADER_CACHE_MAX:
                self._headers.popitem(last=False)
        return found

    async def _first_record_index(self, config: StreamConfig, segment: Segment, entry_id: int) -> int:
        """The index of `entry_id`'s first record; for one past the last readable entry, the
        count of the records before it (read from the previous entry's header)."""
        handle = await self.namespace.open_segment_ledger(config, segment)
        if not segment.is_in_progress:
            handle.advance_lac(segment.last_entry)
        if entry_id <= handle.last_add_confirmed:
            entry = (await handle.read(entry_id, entry_id))[0]
            return self._codec.peek_header(entry.payload).first_record_index
        previous = (await handle.read(entry_id - 1, entry_id - 1))[0]
        return self._codec.peek_header(previous.payload).next_record_index
