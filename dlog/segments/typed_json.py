"""A typed stream's records as JSON objects, column by column: what a Kafka consumer of a typed
stream gets as each record's value (docs/serving.md, "Typed streams"). Pure: no I/O, no clock.

The mapping of Arrow types (docs/serving.md has it as a table), lossless wherever JSON can hold
the value: null -> null; bool -> true/false; ints -> numbers, exact; floats -> numbers, NaN and the
infinities as the strings "NaN", "Infinity", "-Infinity"; decimals -> strings, every digit kept;
strings -> strings; binaries -> base64 strings; timestamps -> ISO-8601 strings with the unit's
fraction digits (no zone for a zone-less type, in UTC with "Z" for a zoned one); dates, times ->
ISO-8601 strings; durations -> numbers in their unit; lists -> arrays; structs -> objects; maps ->
objects for string keys, else arrays of [key, value] pairs; dictionary-encoded -> the decoded
values; anything else -> pyarrow's text of the value.

A record is one object of its columns in the schema's order, serialized compactly (no spaces) as
UTF-8 (non-ASCII characters as they are, not escaped).

Column-wise: each column becomes one list of JSON texts at once (pyarrow's `to_pylist`, its casts
and `strftime`, the json module's C encoders, and only the values JSON cannot hold as such, e.g.
bytes and NaN, touched one by one in Python), then each record is one %-format of its texts.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["json_records", "json_texts", "json_values", "record_times_ms"]

NO_TIMESTAMP = -1  # Kafka's "no timestamp": a record of a typed stream without a `timestamp` column
_MS_PER = {"s": 1000}
_PER_MS = {"ms": 1, "us": 1000, "ns": 1_000_000}
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
_encode: Callable[[Any], str] = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_quote: Callable[[str], str] = json.encoder.encode_basestring


def json_records(batch: pa.RecordBatch) -> list[bytes]:
    """Each record of `batch` as one JSON object of its columns (UTF-8), in the schema's order."""
    names = batch.schema.names
    if not names:
        return [b"{}"] * batch.num_rows
    # one %-template per batch ({"name":%s,...}); each column's values as JSON texts
    template = "{" + ",".join(_encode(name).replace("%", "%%") + ":%s" for name in names) + "}"
    texts = [json_texts(column) for column in batch.columns]
    return [(template % row).encode() for row in zip(*texts, strict=True)]


def json_texts(array: pa.Array) -> list[str]:
    """The values of one column as JSON texts: ints and bools cast to text by pyarrow, strings
    through the json module's C escaper, anything else `json_values` encoded."""
    kind = array.type
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return pc.fill_null(array.cast(pa.string()), "null").to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        values = array.to_pylist()
        if array.null_count:
            return ["null" if value is None else _quote(value) for value in values]
        return list(map(_quote, values))
    return list(map(_encode, json_values(array)))


def json_values(array: pa.Array) -> list[Any]:
    """The values of one column as JSON-ready Python values (the module's table)."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        return json_values(array.dictionary_decode())
    if pa.types.is_null(kind):
        return [None] * len(array)
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_string(kind) \
            or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return array.to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_floating(kind):
        return _floats(array)
    if pa.types.is_decimal(kind) or pa.types.is_date(kind) or pa.types.is_time(kind):
        return array.cast(pa.string()).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_timestamp(kind):
        return _timestamps(array)
    if pa.types.is_duration(kind):
        return array.cast(pa.int64()).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind) \
            or pa.types.is_binary_view(kind):
        return [None if value is None else base64.b64encode(value).decode("ascii") for value in array.to_pylist()]
    if pa.types.is_map(kind):
        return _maps(array)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _lists(array)
    if pa.types.is_fixed_size_list(kind):
        return _lists(array.cast(pa.list_(kind.value_field)))
    if pa.types.is_struct(kind):
        return _structs(array)
    return [None if value is None else str(value) for value in array.to_pylist()]


def record_times_ms(batch: pa.RecordBatch) -> list[int]:
    """Each record's time in milliseconds since the epoch: its `timestamp` column when that is a
    timestamp (the column the codec stamps entries with: `batch_timestamp_range_ms`), floored to the
    millisecond; NO_TIMESTAMP for a null one and for every record of a batch without it."""
    index = batch.schema.get_field_index("timestamp")
    if index < 0 or not pa.types.is_timestamp(batch.schema.field(index).type):
        return [NO_TIMESTAMP] * batch.num_rows
    column = batch.column(index)
    unit = column.type.unit
    counts = column.cast(pa.int64())
    if unit in _MS_PER:
        millis = pc.multiply(counts, _MS_PER[unit])
    elif _PER_MS[unit] == 1:
        millis = counts
    else:  # floored, as the entry header's minimum is
        per_ms = _PER_MS[unit]
        quotient = pc.divide(counts, per_ms)  # truncates toward zero
        behind = pc.and_(pc.less(counts, 0), pc.not_equal(pc.multiply(quotient, per_ms), counts))
        millis = pc.if_else(behind, pc.subtract(quotient, 1), quotient)
    return pc.fill_null(millis, NO_TIMESTAMP).to_pylist()  # type: ignore[no-any-return]


def _floats(array: pa.Array) -> list[Any]:
    values: list[Any] = array.to_pylist()
    odd = pc.invert(pc.is_finite(array))
    if pc.any(odd).as_py():  # only the non-finite values, by index
        for index in pc.indices_nonzero(pc.fill_null(odd, False)).to_pylist():
            value = values[index]
            values[index] = "NaN" if value != value else _NON_FINITE[value]
    return values


def _timestamps(array: pa.Array) -> list[Any]:
    kind = array.type
    if kind.tz is None:
        return pc.strftime(array, format="%Y-%m-%dT%H:%M:%S").to_pylist()  # type: ignore[no-any-return]
    in_utc = array.cast(pa.timestamp(kind.unit, tz="UTC"))
    return pc.strftime(in_utc, format="%Y-%m-%dT%H:%M:%SZ").to_pylist()  # type: ignore[no-any-return]


def _spans(array: pa.Array) -> tuple[list[int], int, int]:
    """(offsets, first, last) of a list or map array: its rows' item ranges in its values."""
    offsets: list[int] = array.offsets.to_pylist()
    return offsets, offsets[0], offsets[-1]


def _rows(array: pa.Array, items: list[Any], offsets: list[int], first: int) -> list[Any]:
    valid = None if array.null_count == 0 else array.is_valid().to_pylist()
    return [items[offsets[row] - first:offsets[row + 1] - first] if valid is None or valid[row] else None
            for row in range(len(array))]


def _lists(array: pa.Array) -> list[Any]:
    offsets, first, last = _spans(array)
    return _rows(array, json_values(array.values.slice(first, last - first)), offsets, first)


def _maps(array: pa.Array) -> list[Any]:
    offsets, first, last = _spans(array)
    keys = json_values(array.keys.slice(first, last - first))
    items = json_values(array.items.slice(first, last - first))
    rows = _rows(array, [list(pair) for pair in zip(keys, items, strict=True)], offsets, first)
    key_type = array.type.key_type
    if pa.types.is_string(key_type) or pa.types.is_large_string(key_type):
        return [None if pairs is None else dict(pairs) for pairs in rows]
    return rows


def _structs(array: pa.Array) -> list[Any]:
    names = [array.type.field(index).name for index in range(array.type.num_fields)]
    children = [json_values(child) for child in array.flatten()]
    valid = None if array.null_count == 0 else array.is_valid().to_pylist()
    if not names:
        return [{} if valid is None or valid[row] else None for row in range(len(array))]
    return [dict(zip(names, values, strict=True)) if valid is None or valid[row] else None
            for row, values in enumerate(zip(*children, strict=True))]
