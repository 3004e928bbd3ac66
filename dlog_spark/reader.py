"""The dlog source: a micro-batch stream reader and a batch reader (driver side; the partition
read that runs in Python workers is in `dlog_spark.partition`).

Theory of operation. Offsets are `{"<stream>": {"entry": E, "ledger": L}}` (next entry to read,
`dlog_spark.offsets`); a stream missing from an offset is read from its earliest record (new streams
of a `streamPattern`, and every stream of `startingOffsets=earliest`). `latestOffset` takes ONE
view of every stream for the trigger (`dlog.core.snapshot`: segment list and LAC), resolves the
start on it (noting data removed under the query, L5), measures the backlog up to the latest
readable entry, admits whole entries up to the trigger's limit, and returns where the batch ends.
`partitions` turns the (start, end) pair into entry ranges of single ledgers on those same views,
split for `minPartitions`; `read` decodes those entries in a worker straight into Arrow batches
of the read schema. The same (start, end) always yields the same records, which is what makes a
replayed batch after a restart exact (L6).

The driver keeps one reader object per query, but Spark pickles the data source to other
processes for `read`: nothing here holds a client; `dlog_spark.connection` caches one per process, and
with it the process's one cache of read handles and entry headers (`dlog.snapshot`), which the
driver's views and the workers' partition reads reuse from one trigger and one task to the next.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from bookkeeper.clock import monotonic_s
from bookkeeper.errors import ConfigError, DlogError
from dlog.core import snapshot
from dlog.core.snapshot import Cursor, StreamView
from dlog.offsets import Offset
from dlog.segments.store import StreamNotFoundError
from dlog_spark import plan
from dlog_spark.catalog import Catalog
from dlog_spark.connection import connection
from dlog_spark.offsets import offset_document, offsets_of, parse_offsets
from dlog_spark.options import SourceOptions
from dlog_spark.partition import DlogPartition, on_loss, read_partition
from dlog_spark.plan import Range

log = logging.getLogger(__name__)


class NoRecordAtTimestampError(DlogError):
    """A starting timestamp is later than every record of a stream (strategy `error`)."""

    code = 601


# ------------------------------------------------------------------------------ shared planning


class _Planner:
    """Offset resolution and partition planning shared by the stream and the batch reader."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._catalog: Catalog | None = None

    def catalog(self) -> Catalog:
        """A catalog on this process's connection, kept while the connection lives (its entry
        header cache spares re-reading headers on every trigger)."""
        conn = connection(self.options.connection)
        if self._catalog is None or self._catalog.conn is not conn:
            self._catalog = Catalog(conn, self.options)
        self._catalog.refresh()
        return self._catalog

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "schema": self.schema, "_catalog": None}

    def resolve(self, view: StreamView, position: Offset | None) -> tuple[Cursor, bool]:
        """The start cursor for `position` and whether data loss moved it (failOnDataLoss=false;
        with true, data loss raises)."""
        resolved = snapshot.resolve(view, position)
        if resolved.losses:
            on_loss(self.options.fail_on_data_loss, resolved.losses)
        return resolved.cursor, bool(resolved.losses)

    def partitions_between(self, catalog: Catalog, starts: Mapping[str, Cursor | Offset | None],
                           ends: Mapping[str, Cursor | Offset],
                           views: Mapping[str, StreamView] | None = None) -> list[DlogPartition]:
        """The partitions from `starts` to `ends`, planned on `views` (the views the offsets were
        taken from) or, for a stream it lacks, on a view taken now."""
        ranges: list[Range] = []
        for name in sorted(ends):
            view = (views or {}).get(name)
            try:
                view = view or catalog.view(name)
            except StreamNotFoundError:
                on_loss(self.options.fail_on_data_loss, (f"stream {name!r} was deleted",))
                continue
            start = starts.get(name)
            if not isinstance(start, Cursor):
                start, _ = self.resolve(view, start)
            end = ends[name]
            if not isinstance(end, Cursor):
                end = snapshot.resolve(view, end).cursor
            ranges += plan.spans(view, start, end)
        return [DlogPartition(span, self.options.fail_on_data_loss)
                for span in plan.split(ranges, self.options.min_partitions)]


def _offsets(document: Mapping[str, Any] | None) -> dict[str, Offset]:
    return offsets_of(document) if document else {}


@dataclass(frozen=True, slots=True)
class _Planned:
    """What `latestOffset` planned a trigger on: its offsets and the views it took them from, so
    the trigger's `partitions` reads exactly those views instead of taking them again."""

    start: Mapping[str, Any]
    end: Mapping[str, Any]
    views: dict[str, StreamView]
    cursors: dict[str, Cursor]


def _check_timestamps(catalog: Catalog, stream: str) -> None:
    schema = catalog.schema(stream)
    index = schema.get_field_index("timestamp")
    if index < 0 or not pa.types.is_timestamp(schema.field(index).type):
        raise ConfigError(f"stream {stream!r} has no timestamp column (an Arrow timestamp), so a timestamp "
                          "option cannot place a start or an end in it; use startingOffsets/endingOffsets")


def start_cursor(catalog: Catalog, options: SourceOptions, view: StreamView) -> Cursor | None:
    """Where a stream starts by a timestamp option (Kafka's startingTimestamp and
    startingOffsetsByTimestamp), or None when none names it. No record that late: the strategy
    says fail (`error`) or start at the latest offset (`latest`)."""
    timestamp_ms = options.starting_timestamp_of(view.name)
    if timestamp_ms is None:
        return None
    _check_timestamps(catalog, view.name)
    found = catalog.at_timestamp(view, timestamp_ms)
    if found is not None:
        return found
    if options.timestamp_strategy == "latest":
        return snapshot.latest(view)
    raise NoRecordAtTimestampError(
        f"stream {view.name!r} has no record at or after timestamp {timestamp_ms}; set "
        "startingOffsetsByTimestampStrategy=latest to start at its latest offset instead")


def end_cursor(catalog: Catalog, options: SourceOptions, view: StreamView) -> Cursor | None:
    """Where a batch read ends by a timestamp option (exclusive), or None when none names the
    stream. No record that late: the latest offset, as Kafka's source does."""
    timestamp_ms = options.ending_timestamp_of(view.name)
    if timestamp_ms is None:
        return None
    _check_timestamps(catalog, view.name)
    return catalog.at_timestamp(view, timestamp_ms) or snapshot.latest(view)


# ------------------------------------------------------------------------------ streaming


class DlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._planner = _Planner(options, schema)
        self._target: dict[str, Offset] | None = None  # set by Trigger.AvailableNow
        self._last_batch_s = monotonic_s()
        self._latest_seen: dict[str, Offset] | None = None
        self._subscribed: dict | None = None  # the offsets last committed for the subscription
        self._planned: _Planned | None = None  # the trigger latestOffset planned last

    def __getstate__(self) -> dict[str, Any]:
        """What a worker's copy needs (`read`): not the driver's views."""
        return {**self.__dict__, "_planned": None}

    # ------------------------------------------------------------------ offsets

    def initialOffset(self) -> dict:
        """Per stream: a timestamp option's position, else startingOffsets' (a stream left out
        of the document starts at its earliest record)."""
        catalog = self._planner.catalog()
        starting = self.options.starting
        given = parse_offsets(starting) if starting not in ("earliest", "latest") else {}
        unknown = [name for name in given if not self.options.matches(name)]
        if unknown:
            raise ConfigError(f"startingOffsets names stream {unknown[0]!r}, which this query does not read")
        positions = dict(given)
        for name in catalog.stream_names():
            timed = self.options.starting_timestamp_of(name) is not None
            if not timed and starting != "latest":
                continue
            view = catalog.view(name)
            cursor = start_cursor(catalog, self.options, view) if timed else snapshot.latest(view)
            position = snapshot.offset_of(view, cursor) if cursor is not None else None
            if position is not None:
                positions[name] = position
            else:
                positions.pop(name, None)
        return offset_document(positions)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        if self.options.min_records_per_trigger is not None:
            return ReadMinRows(self.options.min_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        catalog = self._planner.catalog()
        target = {}
        for name in catalog.stream_names():
            view = catalog.view(name)
            position = snapshot.offset_of(view, snapshot.latest(view))
            if position is not None:
                target[name] = position
        self._target = target

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """Where this trigger's batch ends: one view of each stream, the start resolved on it
        (noting data removed under the query, L5), the backlog up to its latest readable entry,
        and as much of it as the trigger's limits admit."""
        self._commit_subscription(start)
        self._planned = None
        catalog = self._planner.catalog()
        starts = _offsets(start)
        views, cursors, moved = self._views(catalog, starts)
        backlogs = {}
        for name, view in views.items():
            end = self._end_limit(view, name)
            backlogs[name] = plan.spans(view, cursors[name], end) if end is not None else []
        self._latest_seen = {name: offset for name, view in views.items()
                             if (offset := snapshot.offset_of(view, snapshot.latest(view))) is not None}
        max_records, max_bytes, min_records = self._limits(limit)
        if max_records is None and max_bytes is None and min_records is None:
            admission = plan.Admission(backlogs)  # no limit: no need to count records
        else:
            admission = plan.admit(backlogs, max_records, catalog.records_before, max_bytes, catalog.bytes_before)
        if min_records is not None and admission.records < min_records:
            waited_ms = (monotonic_s() - self._last_batch_s) * 1000
            if waited_ms < self.options.max_trigger_delay_ms:
                return start  # wait for more records, or until maxTriggerDelay passes
        ends = {}
        for name, view in views.items():
            ranges = admission.ranges.get(name, [])
            position = snapshot.offset_of(view, plan.end_cursor(view, cursors[name], ranges))
            if not ranges and name in starts and (name not in moved or position is None):
                position = starts[name]  # nothing new: the same text, so Spark sees no new data
            if position is not None:
                ends[name] = position
        end_document = offset_document(ends)
        if end_document != offset_document(starts):
            self._last_batch_s = monotonic_s()
        self._planned = _Planned(start, end_document, views, cursors)
        return end_document

    def _views(self, catalog: Catalog, starts: Mapping[str, Offset]
               ) -> tuple[dict[str, StreamView], dict[str, Cursor], set[str]]:
        """A view of every stream the query reads (one per trigger), the start cursor on it, and
        the streams whose start data loss moved."""
        views, cursors, moved = {}, {}, set()
        expected: pa.Schema | None = None
        for name in sorted(set(catalog.stream_names()) | set(starts)):
            try:
                view = catalog.view(name)
            except StreamNotFoundError:
                on_loss(self.options.fail_on_data_loss, (f"stream {name!r} was deleted",))
                continue
            expected = expected or catalog.schema(name)
            catalog.check_schema(name, expected)
            cursor, skipped = self._planner.resolve(view, starts.get(name))
            if skipped:
                moved.add(name)
            views[name], cursors[name] = view, cursor
        return views, cursors, moved

    def _end_limit(self, view: StreamView, name: str) -> Cursor | None:
        latest = snapshot.latest(view)
        if self._target is None:
            return latest
        target = self._target.get(name)
        if target is None:
            return None  # a stream that appeared after the AvailableNow target was taken
        return min(snapshot.resolve(view, target).cursor, latest)

    def _limits(self, limit: ReadLimit) -> tuple[int | None, int | None, int | None]:
        """(max records, max bytes, min records) for this trigger. The engine's limit rules:
        ReadAllAvailable means ignore the options; minRecordsPerTrigger never holds back an
        AvailableNow run. Spark passes one ReadLimit (getDefaultReadLimit's), so the other
        maximum comes from the options: both apply when both are set."""
        if isinstance(limit, ReadAllAvailable) or limit is None:
            return None, None, None
        options = self.options
        min_records = None if self._target is not None else options.min_records_per_trigger
        if isinstance(limit, ReadMaxRows):
            return limit.max_rows, options.max_bytes_per_trigger, min_records
        if isinstance(limit, ReadMaxBytes):
            return options.max_records_per_trigger, limit.max_bytes, min_records
        if isinstance(limit, ReadMinRows):
            return (options.max_records_per_trigger, options.max_bytes_per_trigger,
                    None if self._target is not None else limit.min_rows)
        return None, None, None

    def reportLatestOffset(self) -> dict | None:
        return offset_document(self._latest_seen) if self._latest_seen else None

    # ------------------------------------------------------------------ partitions, read, commit

    def partitions(self, start: dict, end: dict) -> list[DlogPartition]:
        """The batch's partitions, on the views `latestOffset` took for it (a batch replayed after
        a restart, which no `latestOffset` of this process planned, takes views now)."""
        ends = _offsets(end)
        if not ends:
            return []
        planned = self._planned
        if planned is not None and planned.start == start and planned.end == end:
            return self._planner.partitions_between(self._planner.catalog(), planned.cursors, ends, planned.views)
        return self._planner.partitions_between(self._planner.catalog(), _offsets(start), ends)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, self.schema, partition)

    def commit(self, end: dict) -> None:
        self._commit_subscription(end)

    def _commit_subscription(self, done: dict) -> None:
        """Store `done` (everything before it is processed) as the subscription's offsets.

        Spark calls `commit(end)` of batch N only when it plans batch N+1, so the last batch of an
        AvailableNow or Once run is never committed that way; `latestOffset(start)` is also only
        called once everything before `start` is processed, so it commits `start` too."""
        subscription = self.options.subscription
        if subscription is None or not done or done == self._subscribed:
            return
        conn = connection(self.options.connection)
        for name, offset in _offsets(done).items():
            if (self._subscribed or {}).get(name) == done[name]:
                continue
            try:
                conn.call(conn.namespace.commit_subscription(name, subscription, offset))
            except StreamNotFoundError:
                log.warning("dlog source: stream %r is gone; subscription %r not committed", name, subscription)
        self._subscribed = dict(done)

    def stop(self) -> None:
        """Nothing to release: the process's connection is shared and closed at exit."""


# ------------------------------------------------------------------------------ batch


class DlogBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        planner = _Planner(self.options, self.schema)
        catalog = planner.catalog()
        names = catalog.stream_names()
        starting, ending = self.options.starting, self.options.ending
        starts: dict[str, Cursor | Offset | None] = {}
        ends: dict[str, Cursor | Offset] = {}
        given_start = parse_offsets(starting) if starting not in ("earliest", "latest") else {}
        given_end = parse_offsets(ending) if ending != "latest" else {}
        for offsets, what in ((given_start, "startingOffsets"), (given_end, "endingOffsets")):
            unknown = [name for name in offsets if name not in names]
            if unknown:
                raise ConfigError(f"{what} names stream {unknown[0]!r}, which this read does not include")
        views = {}
        for name in names:
            view = views[name] = catalog.view(name)
            start = start_cursor(catalog, self.options, view)
            if start is not None:
                starts[name] = start
            elif starting == "latest":
                starts[name] = snapshot.offset_of(view, snapshot.latest(view))
            else:
                starts[name] = given_start.get(name)
            ends[name] = end_cursor(catalog, self.options, view) or given_end.get(name) or snapshot.latest(view)
        partitions: list[InputPartition] = list(planner.partitions_between(catalog, starts, ends, views))
        return partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, self.schema, partition)
