"""The JSON form of typed records (dlog.segments.typed_json, what Kafka consumers of a typed stream
get): each Arrow type as docs/serving.md's table says, nulls at every level, sliced arrays (a
reader's entry entered mid-way is a slice), and the values read back exactly where JSON can hold
them."""

from __future__ import annotations

import base64
import datetime
import decimal
import json

import pyarrow as pa
import pytest

from dlog.segments.typed_json import NO_TIMESTAMP, json_records, json_texts, json_values, record_times_ms

MOMENT = 1_700_000_000_123_456_789  # ns: 2023-11-14T22:13:20.123456789Z


@pytest.mark.parametrize(("array", "expected"), [
    (pa.array([True, None]), [True, None]),
    (pa.array([-2**63, 2**63 - 1, None], pa.int64()), [-2**63, 2**63 - 1, None]),
    (pa.array([2**64 - 1], pa.uint64()), [2**64 - 1]),
    (pa.array([0.1, float("nan"), float("inf"), float("-inf"), None]), [0.1, "NaN", "Infinity", "-Infinity", None]),
    (pa.array([1.5, float("nan")], pa.float32()), [1.5, "NaN"]),
    (pa.array([decimal.Decimal("-0.05"), decimal.Decimal("12345678.90"), None], pa.decimal128(10, 2)),
     ["-0.05", "12345678.90", None]),
    (pa.array(["é", "", None]), ["é", "", None]),
    (pa.array([b"\x00\xff", b"", None]), ["AP8=", "", None]),
    (pa.array([b"ab"], pa.binary(2)), ["YWI="]),
    (pa.array([MOMENT // 10**9, None], pa.timestamp("s")), ["2023-11-14T22:13:20", None]),
    (pa.array([MOMENT // 10**6], pa.timestamp("ms")), ["2023-11-14T22:13:20.123"]),
    (pa.array([MOMENT // 10**3], pa.timestamp("us")), ["2023-11-14T22:13:20.123456"]),
    (pa.array([MOMENT], pa.timestamp("ns")), ["2023-11-14T22:13:20.123456789"]),
    (pa.array([MOMENT // 10**6], pa.timestamp("ms", tz="Europe/Paris")), ["2023-11-14T22:13:20.123Z"]),  # in UTC
    (pa.array([datetime.date(2023, 11, 14), None], pa.date32()), ["2023-11-14", None]),
    (pa.array([datetime.date(2023, 11, 14)], pa.date64()), ["2023-11-14"]),
    (pa.array([datetime.time(22, 13, 20, 123000)], pa.time32("ms")), ["22:13:20.123"]),
    (pa.array([1500, None], pa.duration("ms")), [1500, None]),
    (pa.array([None, None], pa.null()), [None, None]),
    (pa.array(["x", "y", "x", None]).dictionary_encode(), ["x", "y", "x", None]),
    (pa.array([[1.0, float("nan")], None, []]), [[1.0, "NaN"], None, []]),
    (pa.array([[b"\x01"], [None]], pa.large_list(pa.binary())), [["AQ=="], [None]]),
    (pa.array([[1, 2], None], pa.list_(pa.int16(), 2)), [[1, 2], None]),
    (pa.array([{"a": 1, "b": [decimal.Decimal("1.5")]}, None, {"a": None, "b": None}],
              pa.struct([("a", pa.int8()), ("b", pa.list_(pa.decimal128(4, 1)))])),
     [{"a": 1, "b": ["1.5"]}, None, {"a": None, "b": None}]),
    (pa.array([[("k", 1), ("j", None)], None, []], pa.map_(pa.string(), pa.int32())), [{"k": 1, "j": None}, None, {}]),
    (pa.array([[(1, b"x")]], pa.map_(pa.int32(), pa.binary())), [[[1, "eA=="]]]),  # keys JSON cannot name
])
def test_each_arrow_type_maps_to_its_json_form(array, expected):
    assert json_values(array) == expected
    assert [json.loads(text) for text in json_texts(array)] == expected  # the texts records are made of


@pytest.mark.parametrize("array", [
    pa.array([[1], None, [2, 3], [4]]),
    pa.array([[("a", 1)], None, [("b", 2), ("c", 3)], [("d", 4)]], pa.map_(pa.string(), pa.int64())),
    pa.array([{"a": [1]}, None, {"a": [2, 3]}, {"a": None}], pa.struct([("a", pa.list_(pa.int64()))])),
    pa.array([[1, 2], None, [3, 4], [5, 6]], pa.list_(pa.int64(), 2)),
])
def test_a_slice_maps_to_the_same_values_as_the_whole(array):
    whole = json_values(array)
    for start in range(len(array)):
        for length in range(len(array) - start + 1):
            assert json_values(array.slice(start, length)) == whole[start:start + length]


def test_a_record_is_one_compact_utf8_object_in_the_schema_order_and_reads_back():
    batch = pa.record_batch({
        "z": pa.array([2**62, None], pa.int64()), "name": ["é\u2028", None],
        "price": pa.array([decimal.Decimal("123456789012345678.123456789"), None], pa.decimal128(38, 9)),
        "raw": pa.array([bytes(range(256)), None]), "score": [float("nan"), 2.5e-308]})
    lines = json_records(batch)
    assert lines[0].startswith(b'{"z":4611686018427387904,"name":"\xc3\xa9') and b" " not in lines[0]
    first, second = (json.loads(line) for line in lines)
    assert list(first) == ["z", "name", "price", "raw", "score"]
    assert (first["z"], first["name"], decimal.Decimal(first["price"]), base64.b64decode(first["raw"]),
            first["score"]) == (2**62, "é\u2028", decimal.Decimal("123456789012345678.123456789"), bytes(range(256)),
                                "NaN")
    assert second == {"z": None, "name": None, "price": None, "raw": None, "score": 2.5e-308}
    assert json_records(pa.record_batch([pa.array([], pa.int8())], names=["a"])) == []
    odd = pa.record_batch([pa.array([True, None]), pa.array(["%s", "\"\\\n"])], names=['100% "x"', "%(a)s"])
    assert [json.loads(line) for line in json_records(odd)] == [{'100% "x"': True, "%(a)s": "%s"},
                                                                 {'100% "x"': None, "%(a)s": "\"\\\n"}]


def test_record_times_come_from_a_timestamp_column_floored_to_the_millisecond():
    def times(array):
        return record_times_ms(pa.record_batch({"id": list(range(len(array))), "timestamp": array}))

    assert times(pa.array([MOMENT // 10**6, None], pa.timestamp("ms"))) == [MOMENT // 10**6, NO_TIMESTAMP]
    assert times(pa.array([MOMENT // 10**9], pa.timestamp("s"))) == [MOMENT // 10**9 * 1000]
    assert times(pa.array([MOMENT, -1_500_000], pa.timestamp("ns", tz="UTC"))) == [MOMENT // 10**6, -2]
    assert times(pa.array([MOMENT // 10**3], pa.timestamp("us"))) == [MOMENT // 10**6]
    assert times(pa.array([5, 6], pa.int64())) == [NO_TIMESTAMP] * 2  # not a timestamp: no record time
    assert record_times_ms(pa.record_batch({"at": pa.array([1], pa.timestamp("ms"))})) == [NO_TIMESTAMP]


def test_dlog_read_json_writes_non_finite_floats_of_a_typed_record_as_the_kafka_strings():
    """`dlog read --json` of a typed stream: NaN and the infinities as the strings Kafka consumers
    get (a bare NaN token is not JSON: `json.loads(..., parse_constant=...)` would be needed)."""
    from types import SimpleNamespace

    from dlog_tools.cli.read import record_json

    record = SimpleNamespace(offset="1:0:0", position=0, fields={
        "score": float("nan"), "high": float("inf"), "low": float("-inf"), "plain": 1.5,
        "series": [1.0, float("nan"), None]})
    text = json.dumps(record_json(record), allow_nan=False)  # raises on a bare NaN
    assert json.loads(text) == {"offset": "1:0:0", "position": 0, "score": "NaN", "high": "Infinity",
                                "low": "-Infinity", "plain": 1.5, "series": [1.0, "NaN", None]}
