"""The Spark read schema of dlog streams and the Arrow conversions on both sides.

Read schema: `stream string, ledger bigint, entry bigint, slot int, timestamp timestamp`, then
the stream's own columns: `key binary, value binary` for an untyped stream, or a typed stream's
columns in its order. The record's own `timestamp` column (when its schema has one of Arrow
timestamp type) becomes the `timestamp` column; otherwise `timestamp` is null.

`read()` yields Arrow batches that must equal Spark's Arrow form of the read schema exactly
(`to_arrow_schema(..., timezone="UTC")`: timestamps as microseconds in UTC), so each decoded
entry is turned into that form here, column by column, without a row ever becoming a Python
object.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from bookkeeper.clock import wall_ms
from bookkeeper.errors import ConfigError
from dlog.segments.codec import HEADERS_SCHEMA, describe_schema, missing_column, schema_with_headers

METADATA_FIELDS = (
    StructField("stream", StringType(), False),
    StructField("ledger", LongType(), False),
    StructField("entry", LongType(), False),
    StructField("slot", IntegerType(), False),
    StructField("timestamp", TimestampType(), True),
)
METADATA_NAMES = frozenset(field.name for field in METADATA_FIELDS)
# Kafka's source column: array<struct<key: string, value: binary>>, last, with includeHeaders.
HEADERS_FIELD = StructField("headers", ArrayType(StructType([
    StructField("key", StringType(), False), StructField("value", BinaryType(), True)]), False), True)
SOURCE_ONLY_COLUMNS = frozenset({"stream", "ledger", "entry", "slot"})  # the sink ignores these


def read_schema(stream_schema: pa.Schema, include_headers: bool = False) -> StructType:
    """The Spark schema a stream with this Arrow schema reads as (with `headers` last when asked)."""
    if include_headers and schema_with_headers(stream_schema) is None:
        raise ConfigError(f"includeHeaders: record headers exist for untyped streams only; this stream's "
                          f"schema is ({describe_schema(stream_schema)})")
    fields = list(METADATA_FIELDS)
    for field in stream_schema:
        if field.name == "timestamp" and pa.types.is_timestamp(field.type):
            continue
        if field.name in METADATA_NAMES:
            raise ConfigError(f"the stream's column {field.name!r} clashes with the read schema's own "
                              f"{field.name!r} column; schema: ({describe_schema(stream_schema)})")
        try:
            data_type = from_arrow_type(field.type, prefer_timestamp_ntz=False)
        except Exception as error:  # pyspark raises its own TypeError kinds here
            raise ConfigError(f"the stream's column {field.name!r} of Arrow type {field.type} has no "
                              f"Spark type: {error}") from error
        fields.append(StructField(field.name, data_type, field.nullable))
    if include_headers:
        fields.append(HEADERS_FIELD)
    return StructType(fields)


def arrow_read_schema(schema: StructType) -> pa.Schema:
    return to_arrow_schema(schema, timezone="UTC")


class BatchShaper:
    """Turns decoded entries of one stream into record batches of the read schema's Arrow form."""

    def __init__(self, stream: str, stream_schema: pa.Schema, output: pa.Schema) -> None:
        self.stream = stream
        self.output = output
        self._stream_scalar = pa.scalar(stream, pa.string())
        index = stream_schema.get_field_index("timestamp")
        has_timestamp = index >= 0 and pa.types.is_timestamp(stream_schema.field(index).type)
        self._timestamp_index = index if has_timestamp else -1
        own = [name for name in output.names if name not in METADATA_NAMES]
        self._own = [(stream_schema.get_field_index(name), output.field(name).type) for name in own]
        missing = [name for name, (position, _) in zip(own, self._own, strict=True) if position < 0]
        if missing:
            raise ConfigError(f"stream {stream!r} has no column {missing[0]!r} of the read schema; its "
                              f"schema is ({describe_schema(stream_schema)})")

    def shape(self, batch: pa.RecordBatch, ledger_id: int, entry_id: int, first_slot: int,
              row_slots: pa.Array | None = None) -> pa.RecordBatch:
        """`row_slots`: each row's slot, when they are not dense from `first_slot` (the kept
        records of a compacted segment's entry)."""
        count = batch.num_rows
        columns = [
            pa.repeat(self._stream_scalar, count),
            pa.repeat(pa.scalar(ledger_id, pa.int64()), count),
            pa.repeat(pa.scalar(entry_id, pa.int64()), count),
            slots(first_slot, count) if row_slots is None else row_slots,
            self._timestamps(batch),
        ]
        for position, data_type in self._own:
            column = batch.column(position)
            columns.append(column if column.type.equals(data_type) else pc.cast(column, data_type))
        return pa.RecordBatch.from_arrays(columns, schema=self.output)

    def _timestamps(self, batch: pa.RecordBatch) -> pa.Array:
        target = self.output.field("timestamp").type
        if self._timestamp_index < 0:
            return pa.nulls(batch.num_rows, target)
        return pc.cast(batch.column(self._timestamp_index), target)


_slots_lock = threading.Lock()
_slots = pa.array(range(1 << 16), pa.int32())


def slots(first: int, count: int) -> pa.Array:
    """int32 first..first+count-1 as a zero-copy slice of one cached range."""
    global _slots
    end = first + count
    if end > len(_slots):
        with _slots_lock:
            if end > len(_slots):
                size = max(end, 2 * len(_slots))
                _slots = pa.array(range(size), pa.int32())
    return _slots.slice(first, count)


# ------------------------------------------------------------------------------ the sink side


def sink_batch(batch: pa.RecordBatch, stream_schema: pa.Schema, stream: str,
               now_ms: int | None = None) -> pa.RecordBatch:
    """An input batch (Spark's Arrow form of the query's rows) in the stream's own schema.

    Untyped streams take `value` (binary or string), optional `key` (binary or string) and
    optional `timestamp`. Typed streams take their columns by name. A missing column is filled as
    write_batch() fills it (`dlog.segments.codec.missing_column`: nulls, or the write time for
    `timestamp`). The dlog source's own columns (stream, ledger, entry, slot) are ignored so a read
    can be written as is; any other extra column is an error, never silently dropped.
    """
    now_ms = wall_ms() if now_ms is None else now_ms
    names = batch.schema.names
    if "headers" in names and schema_with_headers(stream_schema) is not None:
        stream_schema = HEADERS_SCHEMA  # record headers, as Kafka's sink takes them
    expected = f"stream {stream!r} takes columns ({describe_schema(stream_schema)})"
    for name in names:
        if stream_schema.get_field_index(name) < 0 and name not in SOURCE_ONLY_COLUMNS:
            raise ConfigError(f"column {name!r} has no place in {expected}; select only those columns")
    columns = []
    for field in stream_schema:
        if field.name not in names:
            columns.append(missing_column(field, batch.num_rows, now_ms, expected))
            continue
        column = batch.column(names.index(field.name))
        columns.append(_cast_column(column, field, expected))
    return pa.RecordBatch.from_arrays(columns, schema=stream_schema)


def _cast_column(column: pa.Array, field: pa.Field, expected: str) -> pa.Array:
    if column.type.equals(field.type):
        result = column
    else:
        timestamp = pa.types.is_timestamp(column.type) and pa.types.is_timestamp(field.type)
        if timestamp and column.type.tz is not None and field.type.tz is None:
            column = column.cast(pa.timestamp(column.type.unit))  # UTC instants, zone dropped
        try:
            # Timestamps may lose sub-millisecond digits; everything else must convert exactly.
            result = pc.cast(column, field.type, safe=not timestamp)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise ConfigError(f"column {field.name!r} is {column.type} and cannot become {field.type}: "
                              f"{error}; {expected}") from error
    if not field.nullable and result.null_count:
        raise ConfigError(f"column {field.name!r} has {result.null_count} nulls but the stream's column "
                          f"is not nullable; {expected}")
    if field.name == "headers" and field.type.equals(HEADERS_SCHEMA.field("headers").type):
        pairs = pc.list_flatten(result)
        if pairs.null_count or pairs.field("key").null_count:
            raise ConfigError(f"column 'headers' holds a null header or a header with a null key; each "
                              f"header is a (key string, value binary) pair with a key; {expected}")
    return result

