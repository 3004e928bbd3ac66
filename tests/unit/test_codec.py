"""The record-set codec round-trips any batch of its schema and refuses every corrupt entry cleanly.

Also: check_batch names each kind of mismatch, records_to_batch builds and refuses as documented,
split_batch keeps order and the entry bound, and schema text round-trips or is corrupt metadata.
"""

from __future__ import annotations

import os
import pickle
import struct
import threading
import time

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookkeeper.errors import ConfigError, CorruptMetadataError, DlogError
from dlog.segments.codec import (
    HEADER,
    HEADER_BYTES,
    MAGIC,
    Compression,
    CorruptRecordSetError,
    RecordSetCodec,
    check_batch,
    default_schema,
    records_to_batch,
    schema_from_text,
    schema_to_text,
    split_batch,
)

TYPED_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary(), nullable=True),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("small", pa.int32()),
        pa.field("name", pa.string()),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("point", pa.struct([pa.field("x", pa.float64()), pa.field("y", pa.float64())])),
        pa.field("timestamp", pa.timestamp("us"), nullable=False),
    ]
)


def typed_batch(count: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "key": [None if index % 3 == 0 else f"k{index}".encode() for index in range(count)],
            "count": list(range(count)),
            "small": [None if index % 5 == 0 else -index for index in range(count)],
            "name": [f"name-{index}-é" for index in range(count)],
            "tags": [[f"t{tag}" for tag in range(index % 4)] if index % 7 else None for index in range(count)],
            "point": [{"x": index / 2, "y": -index / 3} for index in range(count)],
            "timestamp": [1_700_000_000_000_001 + 1000 * index for index in range(count)],
        },
        schema=TYPED_SCHEMA,
    )


def default_batch(count: int, first_ms: int = 1_700_000_000_000) -> pa.RecordBatch:
    values = [f"value-{index}".encode() * (index % 5 + 1) for index in range(count)]
    keys = [None if index % 2 else f"key-{index}".encode() for index in range(count)]
    return records_to_batch(values, keys, [first_ms + index for index in range(count)])


def patch_header(entry: bytes, **changes: int) -> bytes:
    """The entry with some header fields replaced (names as in the module docstring)."""
    names = ("magic", "version", "codec", "flags", "record_count", "first_record_index",
             "min_timestamp_ms", "max_timestamp_ms", "uncompressed_bytes")  # fmt: skip
    fields = dict(zip(names, HEADER.unpack_from(entry)))
    fields.update(changes)
    return HEADER.pack(*fields.values()) + entry[HEADER_BYTES:]


# ------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("compress", [True, False])
def test_default_schema_round_trip_keeps_records_and_fills_the_header(compress: bool) -> None:
    codec = RecordSetCodec(default_schema(), compress=compress)
    batch = default_batch(10_000)
    entry = codec.encode(batch, first_record_index=42)
    header, decoded = codec.decode(entry)
    assert isinstance(decoded, pa.RecordBatch)
    assert decoded.equals(batch)
    assert decoded.schema.equals(default_schema())
    assert header.codec == (Compression.ZSTD if compress else Compression.NONE)
    assert (header.version, header.record_count, header.first_record_index) == (1, 10_000, 42)
    assert header.next_record_index == 10_042
    assert (header.min_timestamp_ms, header.max_timestamp_ms) == (1_700_000_000_000, 1_700_000_000_000 + 9_999)
    assert header.uncompressed_bytes == batch.serialize().size
    assert entry[:4] == MAGIC and (len(entry) < header.uncompressed_bytes) == compress
    assert codec.peek_header(entry) == header
    # the writer takes the timestamps from the encoder instead of reading its header back
    assert tuple(codec.encode_entry(batch, 42)) == (entry, header.min_timestamp_ms, header.max_timestamp_ms)


@pytest.mark.parametrize("compress", [True, False])
def test_typed_schema_round_trip_with_nested_and_nullable_columns(compress: bool) -> None:
    codec = RecordSetCodec(TYPED_SCHEMA, compress=compress)
    batch = typed_batch(500)
    header, decoded = codec.decode(codec.encode(batch, 0))
    assert decoded.equals(batch)
    assert decoded.column(0).null_count == 167 and decoded.column(4).null_count > 0
    # timestamp[us]: the minimum rounds down and the maximum up to whole milliseconds
    assert header.min_timestamp_ms == 1_700_000_000_000
    assert header.max_timestamp_ms == 1_700_000_000_000 + 499 + 1


def test_a_decoded_batch_takes_the_streams_schema_not_the_writers_field_flags() -> None:
    batch = pa.RecordBatch.from_arrays(
        [pa.array([b"k", None]), pa.array([b"a", b"b"]), pa.array([1, 2], pa.timestamp("ms"))],
        names=["key", "value", "timestamp"],
    )  # every field nullable, but no nulls where the stream forbids them
    _, decoded = RecordSetCodec(default_schema()).decode(RecordSetCodec(default_schema()).encode(batch, 0))
    assert decoded.schema.equals(default_schema())
    assert decoded.column(1).to_pylist() == [b"a", b"b"]


@pytest.mark.parametrize(
    ("schema", "expected_ms"),
    [
        (pa.schema([pa.field("timestamp", pa.timestamp("s"))]), (5_000, 9_000)),
        (pa.schema([pa.field("timestamp", pa.timestamp("ns"))]), (0, 1)),
        (pa.schema([pa.field("timestamp", pa.int64())]), (0, 0)),  # not a timestamp type: no range
        (pa.schema([pa.field("other", pa.timestamp("ms"))]), (0, 0)),
    ],
)
def test_timestamp_range_by_unit_and_column(schema: pa.Schema, expected_ms: tuple[int, int]) -> None:
    batch = pa.RecordBatch.from_arrays([pa.array([9, None, 5], schema.field(0).type)], schema=schema)
    header = RecordSetCodec(schema).peek_header(RecordSetCodec(schema).encode(batch, 0))
    assert (header.min_timestamp_ms, header.max_timestamp_ms) == expected_ms


def test_empty_and_all_null_timestamp_batches_have_a_zero_range() -> None:
    schema = pa.schema([pa.field("timestamp", pa.timestamp("ms"))])
    codec = RecordSetCodec(schema)
    for values in ([], [None, None]):
        batch = pa.RecordBatch.from_arrays([pa.array(values, pa.timestamp("ms"))], schema=schema)
        header, decoded = codec.decode(codec.encode(batch, 7))
        assert (header.min_timestamp_ms, header.max_timestamp_ms, header.record_count) == (0, 0, len(values))
        assert decoded.equals(batch)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(
        st.tuples(st.binary(max_size=300), st.one_of(st.none(), st.binary(max_size=20)),
                  st.integers(min_value=-(2**40), max_value=2**42)),
        max_size=200,
    ),
    first_record_index=st.integers(min_value=0, max_value=2**63),
    compress=st.booleans(),
    level=st.integers(min_value=1, max_value=9),
)
def test_any_records_round_trip(records: list[tuple[bytes, bytes | None, int]], first_record_index: int,
                                compress: bool, level: int) -> None:
    values, keys, timestamps_ms = (list(column) for column in zip(*records)) if records else ([], [], [])
    batch = records_to_batch(values, keys, timestamps_ms)
    codec = RecordSetCodec(default_schema(), compression_level=level, compress=compress)
    header, decoded = codec.decode(codec.encode(batch, first_record_index))
    assert decoded.column(0).to_pylist() == keys and decoded.column(1).to_pylist() == values
    assert decoded.column(2).cast(pa.int64()).to_pylist() == timestamps_ms
    assert header.first_record_index == first_record_index and header.record_count == len(records)
    expected_range = (min(timestamps_ms), max(timestamps_ms)) if records else (0, 0)
    assert (header.min_timestamp_ms, header.max_timestamp_ms) == expected_range


def test_codec_survives_pickle_and_use_from_several_threads() -> None:
    codec = pickle.loads(pickle.dumps(RecordSetCodec(default_schema(), compression_level=5)))
    assert codec.compression_level == 5
    batches = [default_batch(200, first_ms=1000 * index) for index in range(8)]
    failures: list[BaseException] = []

    def work(batch: pa.RecordBatch) -> None:
        try:
            for _ in range(50):
                assert codec.decode(codec.encode(batch, 0))[1].equals(batch)
        except BaseException as error:  # handed to the main thread, which fails the test
            failures.append(error)

    threads = [threading.Thread(target=work, args=(batch,)) for batch in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


# ------------------------------------------------------------------------------ corrupt entries


@pytest.fixture
def zstd_entry() -> bytes:
    return RecordSetCodec(default_schema()).encode(default_batch(100), 3)


@pytest.fixture
def plain_entry() -> bytes:
    return RecordSetCodec(default_schema(), compress=False).encode(default_batch(100), 3)


def expect_corrupt(entry: bytes, words: str, schema: pa.Schema = default_schema()) -> None:
    codec = RecordSetCodec(schema)
    with pytest.raises(CorruptRecordSetError, match=words):
        codec.decode(entry)


def test_header_corruption_is_refused(zstd_entry: bytes) -> None:
    expect_corrupt(b"XXXX" + zstd_entry[4:], "magic")
    expect_corrupt(patch_header(zstd_entry, version=2), "version 2 is unknown")
    expect_corrupt(patch_header(zstd_entry, codec=7), "codec 7 is unknown")
    expect_corrupt(patch_header(zstd_entry, flags=4), "flags")
    expect_corrupt(patch_header(zstd_entry, flags=2), "producer section")  # the flag without its section
    expect_corrupt(patch_header(zstd_entry, flags=1), "not a valid Arrow record batch")  # no headers column
    expect_corrupt(patch_header(zstd_entry, min_timestamp_ms=10, max_timestamp_ms=9), "after its max")
    expect_corrupt(patch_header(zstd_entry, first_record_index=2**64 - 1), "overflows")
    expect_corrupt(patch_header(zstd_entry, uncompressed_bytes=2**32 - 1), "over the limit")
    for length in (0, 1, HEADER_BYTES - 1):
        expect_corrupt(zstd_entry[:length], "shorter than")


def test_payload_corruption_is_refused(zstd_entry: bytes, plain_entry: bytes) -> None:
    expect_corrupt(zstd_entry[:-1], "zstd")
    expect_corrupt(zstd_entry + b"\0", "zstd")  # a second (junk) frame after the one allowed
    expect_corrupt(zstd_entry[:HEADER_BYTES] + b"\x28\xb5\x2f\xfd" + b"\xff" * 60, "zstd")
    expect_corrupt(patch_header(zstd_entry, uncompressed_bytes=100), "declares")
    expect_corrupt(plain_entry[:-1], "payload bytes")
    junk = bytes((index * 131 + 7) % 256 for index in range(len(plain_entry) - HEADER_BYTES))
    expect_corrupt(plain_entry[:HEADER_BYTES] + junk, "Arrow")
    expect_corrupt(patch_header(zstd_entry, record_count=99), "says 99 records, batch has 100")
    expect_corrupt(patch_header(plain_entry, record_count=101), "says 101 records")


def test_offsets_that_go_backwards_are_refused_by_full_validation() -> None:
    # A value column's offsets that are each in bounds but not monotonic pass Arrow's cheap checks;
    # without full validation the batch would decode and hand out garbage slices.
    schema = pa.schema([pa.field("value", pa.binary(), nullable=False)])
    codec = RecordSetCodec(schema, compress=False)
    batch = pa.RecordBatch.from_arrays([pa.array([b"aaaa", b"bbbb", b"cccc"])], schema=schema)
    entry = bytearray(codec.encode(batch, 0))
    body_start = HEADER_BYTES + 8 + ipc.read_message(pa.py_buffer(bytes(entry[HEADER_BYTES:]))).metadata.size
    offsets = struct.unpack_from("<4i", entry, body_start)  # no validity buffer: no nulls
    assert offsets == (0, 4, 8, 12)
    struct.pack_into("<i", entry, body_start + 4, 11)  # offsets 0, 11, 8, 12
    expect_corrupt(bytes(entry), "Arrow", schema)


def test_a_schema_message_instead_of_a_batch_is_refused() -> None:
    schema_message = default_schema().serialize().to_pybytes()
    header = HEADER.pack(MAGIC, 1, 0, 0, 0, 0, 0, 0, len(schema_message))
    expect_corrupt(header + schema_message, "not a record batch")


@settings(max_examples=300, deadline=None)
@given(data=st.data(), compress=st.booleans())
def test_flipped_or_cut_bytes_give_a_batch_or_corrupt_record_set_error_only(data: st.DataObject,
                                                                          compress: bool) -> None:
    codec = RecordSetCodec(default_schema(), compress=compress)
    entry = bytearray(codec.encode(default_batch(20), 0))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(entry) - 1))
        entry[position] ^= data.draw(st.integers(1, 255))
    entry = entry[: data.draw(st.integers(0, len(entry)))]
    try:
        _, batch = codec.decode(bytes(entry))
    except CorruptRecordSetError:
        return
    batch.validate(full=True)
    assert batch.num_rows == 20


# ------------------------------------------------------------------------------ check_batch


BINARY, STAMP = pa.binary(), pa.timestamp("ms")


@pytest.mark.parametrize(
    ("columns", "words"),
    [
        ({"key": ([b"k"], BINARY), "value": ([b"v"], BINARY)}, "no column 'timestamp'"),
        ({"key": ([b"k"], BINARY), "value": ([b"v"], BINARY), "timestamp": ([1], STAMP), "extra": ([1], None)},
         "column 'extra' that the stream"),
        ({"key": ([b"k"], BINARY), "value": (["text"], None), "timestamp": ([1], STAMP)},
         "column 'value' is string, expected binary"),
        ({"key": ([b"k"], BINARY), "value": ([None], BINARY), "timestamp": ([1], STAMP)},
         "column 'value' has 1 nulls"),
        ({"key": ([b"k"], BINARY), "value": ([b"v"], BINARY), "timestamp": ([None], STAMP)},
         "column 'timestamp' has 1 nulls"),
        ({"value": ([b"v"], BINARY), "key": ([b"k"], BINARY), "timestamp": ([1], STAMP)},
         "column 'key' is at position 1, expected 0"),
    ],
)
def test_check_batch_names_the_first_mismatch(columns: dict[str, tuple[list[object], pa.DataType | None]],
                                              words: str) -> None:
    arrays = [pa.array(values, data_type) for values, data_type in columns.values()]
    batch = pa.RecordBatch.from_arrays(arrays, names=list(columns))
    with pytest.raises(ConfigError, match=words) as caught:
        check_batch(batch, default_schema())
    assert "value: binary not null" in str(caught.value)  # the expected schema is shown


def test_check_batch_refuses_duplicates_and_non_batches_and_encode_checks_too() -> None:
    twice = pa.RecordBatch.from_arrays([pa.array([b"v"])] * 2, names=["value", "value"])
    with pytest.raises(ConfigError, match="'value' more than once"):
        check_batch(twice, default_schema())
    with pytest.raises(ConfigError, match="expected a pyarrow.RecordBatch, got list"):
        check_batch([b"v"], default_schema())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="column 'count' is int32, expected int64"):
        RecordSetCodec(TYPED_SCHEMA).encode(typed_batch(3).set_column(1, "count", pa.array([1, 2, 3], pa.int32())), 0)


def test_codec_refuses_bad_settings_and_dictionary_columns() -> None:
    for level in (0, 23, "3", 2.5):
        with pytest.raises(ConfigError, match="compression_level"):
            RecordSetCodec(default_schema(), compression_level=level)  # type: ignore[arg-type]
    nested = pa.schema([pa.field("tags", pa.list_(pa.dictionary(pa.int32(), pa.string())))])
    with pytest.raises(ConfigError, match="column 'tags'.*dictionar"):
        RecordSetCodec(nested)
    with pytest.raises(ConfigError, match="uncompressed_bytes_max 1000"):
        RecordSetCodec(default_schema(), uncompressed_bytes_max=1000).encode(default_batch(100), 0)


# ------------------------------------------------------------------------------ records_to_batch


def test_records_to_batch_defaults_keys_to_null_and_timestamps_to_now() -> None:
    before_ms = time.time_ns() // 1_000_000
    batch = records_to_batch([b"a", "b"])
    after_ms = time.time_ns() // 1_000_000
    assert batch.schema.equals(default_schema())
    assert batch.column(0).to_pylist() == [None, None] and batch.column(1).to_pylist() == [b"a", b"b"]
    stamps = batch.column(2).cast(pa.int64()).to_pylist()
    assert stamps[0] == stamps[1] and before_ms <= stamps[0] <= after_ms


def test_records_to_batch_takes_arrow_arrays_as_they_are() -> None:
    values = pa.array([b"x", b"y"])
    column = records_to_batch(values, timestamps_ms=[1, 2]).column(1)
    assert column.buffers()[2].address == values.buffers()[2].address


@pytest.mark.parametrize(
    ("arguments", "words"),
    [
        (dict(values=[b"a", b"b"], keys=[b"k"]), "2 values but 1 for column 'key'"),
        (dict(values=[b"a"], timestamps_ms=[1, 2]), "column 'timestamp'"),
        (dict(values=[1.5]), "column 'value' cannot be built as binary"),
        (dict(values=[b"a", None]), "column 'value' has 1 nulls"),
        (dict(values=[b"a"], timestamps_ms=[2**70]), "column 'timestamp' cannot be built"),
        (dict(values=[b"a"], schema=TYPED_SCHEMA), "only key, value and timestamp"),
        (dict(values=[b"a"], schema=pa.schema([pa.field("key", pa.binary(), nullable=False),
                                               pa.field("value", pa.binary())])), "column 'key' is not nullable"),
    ],
)
def test_records_to_batch_refuses_what_does_not_fit(arguments: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        records_to_batch(**arguments)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ split_batch


@pytest.mark.parametrize("entry_bytes_max", [4096, 65_536, 1_048_576])
def test_split_batch_keeps_order_shares_memory_and_every_entry_fits(entry_bytes_max: int) -> None:
    sizes = [(index * 7919) % 900 for index in range(3000)]  # varied, incompressible
    batch = records_to_batch([os.urandom(size) for size in sizes], timestamps_ms=list(range(3000)))
    pieces = split_batch(batch, entry_bytes_max)
    assert pa.Table.from_batches(pieces).equals(pa.Table.from_batches([batch]))
    values_address = batch.column(1).buffers()[2].address
    assert all(piece.column(1).buffers()[2].address == values_address for piece in pieces)  # zero copy
    for compress in (True, False):
        codec = RecordSetCodec(default_schema(), compress=compress)
        assert max(len(codec.encode(piece, 0)) for piece in pieces) <= entry_bytes_max
    if entry_bytes_max == 65_536:  # and the entries are not needlessly small
        assert len(pieces) <= 1.5 * batch.nbytes / entry_bytes_max + 1


def test_split_batch_refuses_a_record_too_big_for_any_entry() -> None:
    batch = records_to_batch([b"a", b"b" * 10_000, b"c"])
    with pytest.raises(ConfigError, match=r"record 1 is \d+ bytes, .*entry_bytes_max 4096"):
        split_batch(batch, 4096)
    with pytest.raises(ConfigError, match="entry_bytes_max"):
        split_batch(batch, 0)
    with pytest.raises(ConfigError, match="leaves no room"):
        split_batch(batch, 200)
    assert split_batch(batch.slice(0, 0), 4096) == []
    assert [piece.num_rows for piece in split_batch(batch, 1 << 20)] == [3]


# ------------------------------------------------------------------------------ schema text


@pytest.mark.parametrize("schema", [default_schema(), TYPED_SCHEMA, TYPED_SCHEMA.with_metadata({"owner": "ops"})])
def test_schema_text_round_trips(schema: pa.Schema) -> None:
    text = schema_to_text(schema)
    assert text.isascii() and schema_from_text(text).equals(schema, check_metadata=True)


@pytest.mark.parametrize("text", ["not base64!", "", "QUJD", "é", 12])
def test_corrupt_schema_text_is_corrupt_metadata(text: object) -> None:
    with pytest.raises(CorruptMetadataError, match="stored schema"):
        schema_from_text(text)  # type: ignore[arg-type]


def test_corrupt_record_set_error_is_a_dlog_error_with_its_own_code() -> None:
    assert issubclass(CorruptRecordSetError, DlogError) and CorruptRecordSetError.code == 301
    assert not CorruptRecordSetError.retryable


# ------------------------------------------------------------------------------ record headers


def test_record_headers_round_trip_and_entries_without_any_keep_the_old_format() -> None:
    from dlog.segments.codec import FLAG_HEADERS, HEADERS_SCHEMA

    codec = RecordSetCodec(default_schema(), headers=True)
    batch = records_to_batch([b"a", b"b", b"c"], headers=[[("trace", b"1"), ("trace", None)], None, []])
    assert batch.schema.equals(HEADERS_SCHEMA)
    entry = codec.encode(batch, 0)
    header, decoded = codec.decode(entry)
    assert header.flags == FLAG_HEADERS
    assert decoded.column("headers").to_pylist() == [[{"key": "trace", "value": b"1"}, {"key": "trace", "value": None}],
                                                     None, []]
    plain = records_to_batch([b"a"], headers=[None])  # no record has a header: no column at all
    assert plain.schema.equals(default_schema())
    nulls = plain.append_column(HEADERS_SCHEMA.field("headers"), pa.nulls(1, HEADERS_SCHEMA.field("headers").type))
    plain_entry = codec.encode(nulls, 0)
    assert codec.peek_header(plain_entry).flags == 0  # all-null headers are not written
    # One shape per codec, whatever the entry: with headers (null where none) or without.
    assert codec.decode(plain_entry)[1].schema.equals(HEADERS_SCHEMA)
    assert codec.decode(plain_entry)[1].column("headers").to_pylist() == [None]
    assert pickle.loads(pickle.dumps(codec)).headers
    assert RecordSetCodec(default_schema()).decode(entry)[1].schema.equals(default_schema())


def test_record_headers_are_refused_where_they_have_no_place() -> None:
    typed = pa.schema([pa.field("id", pa.int64())])
    with pytest.raises(ConfigError, match="untyped streams only"):
        records_to_batch([b"a"], schema=typed, headers=[[("k", b"v")]])
    with pytest.raises(ConfigError, match=r"a header is a \(str key, bytes value\) pair"):
        records_to_batch([b"a"], headers=[[("k", "text")]])
    entry = RecordSetCodec(default_schema()).encode(records_to_batch([b"a"], headers=[[("k", b"v")]]), 0)
    expect_corrupt(entry, "only untyped streams have headers", schema=pa.schema([pa.field("value", pa.binary())]))


# ------------------------------------------------------------------ the producer section


def test_producer_runs_round_trip_and_readers_see_only_the_records() -> None:
    from dlog.segments.codec import ProducerRun
    codec = RecordSetCodec(default_schema())
    batch = records_to_batch([b"a" * 50] * 600, headers=[[("h", b"1")]] + [None] * 599)
    runs = (ProducerRun("kafka:7", 3, 2**31 - 2, 1, 0, 3), ProducerRun("billing-1", 0, 2**63 - 1, 2**63 - 1, 5, 595))
    plain = codec.encode(batch, 9)
    for compress in (True, False):
        with_runs = RecordSetCodec(default_schema(), compress=compress).encode_entry(batch, 9, producers=runs).payload
        assert codec.producer_runs(with_runs) == runs
        header, decoded = codec.decode(with_runs)
        assert (header.record_count, header.first_record_index) == (600, 9)
        assert decoded.equals(codec.decode(plain)[1])  # no column, no header, no record shows the section
        assert decoded.schema.names == ["key", "value", "timestamp"]
        assert (header.payload_start - HEADER_BYTES) % 8 == 0 and header.payload_start > HEADER_BYTES
        with_headers = RecordSetCodec(default_schema(), headers=True).decode(with_runs)[1]
        assert with_headers.column("headers").to_pylist()[0] == [{"key": "h", "value": b"1"}]
    assert codec.producer_runs(plain) == ()  # an entry written before the section existed decodes as before
    assert codec.peek_header(plain).payload_start == HEADER_BYTES


def test_an_old_entry_written_before_the_section_still_decodes() -> None:
    """An entry as the codec wrote it before producer sections (built here byte by byte) decodes."""
    codec = RecordSetCodec(default_schema(), compress=False)
    batch = records_to_batch([b"x", b"y"], timestamps_ms=[5, 6])
    message = batch.serialize()
    old = HEADER.pack(MAGIC, 1, 0, 0, 2, 4, 5, 6, message.size) + message.to_pybytes()
    header, decoded = codec.decode(old)
    assert decoded.column("value").to_pylist() == [b"x", b"y"] and header.first_record_index == 4
    assert codec.producer_runs(old) == ()


def test_a_corrupt_producer_section_is_refused() -> None:
    from dlog.segments.codec import FLAG_PRODUCERS, ProducerRun
    codec = RecordSetCodec(default_schema(), compress=False)
    batch = records_to_batch([b"x", b"y"])
    good = codec.encode_entry(batch, 0, producers=(ProducerRun("kafka:1", 0, 0, 1, 0, 2),)).payload

    def patched(offset: int, raw: bytes) -> bytes:
        return good[:offset] + raw + good[offset + len(raw):]

    cases = {
        "version": patched(HEADER_BYTES + 4, b"\x09"),
        "claims": patched(HEADER_BYTES, struct.pack(">I", 12)),
        "claims 2": patched(HEADER_BYTES, struct.pack(">I", len(good))),
        "records": patched(HEADER_BYTES + 8 + 2 + 7 + 2 + 16, struct.pack(">II", 1, 2)),  # slots 1..2 of 2
        "empty": patched(HEADER_BYTES + 8 + 2 + 7 + 2 + 16, struct.pack(">II", 0, 0)),
        "name": patched(HEADER_BYTES + 8, struct.pack(">H", 900)),
        "utf8": patched(HEADER_BYTES + 10, b"\xff"),
        "flag without room": HEADER.pack(MAGIC, 1, 0, FLAG_PRODUCERS, 0, 0, 0, 0, 0),
    }
    for name, data in cases.items():
        with pytest.raises(CorruptRecordSetError):
            codec.producer_runs(data)
            codec.decode(data)
            raise AssertionError(f"case {name} was accepted")
    from bookkeeper.errors import InvariantError
    with pytest.raises(InvariantError):  # overlapping runs are never written
        codec.encode_entry(batch, 0, producers=(ProducerRun("a", 0, 0, 1, 0, 2), ProducerRun("b", 0, 0, 0, 1, 1)))
