"""The record-set codec: one ledger entry holds one Arrow record batch, zstd-compressed.

Layout of an entry (big-endian; the header is 40 bytes, a multiple of 8, so an uncompressed
payload that starts right after it keeps the 8-byte alignment Arrow IPC buffers expect):

    offset  size  field
         0     4  magic b"DLRS"
         4     1  format version, u8 (1)
         5     1  codec, u8 (0 = none, 1 = zstd)
         6     2  flags, u16: bit 0 = HEADERS (the batch has the `headers` column after the
                  default schema's; untyped streams only); bit 1 = PRODUCERS (a producer
                  section follows the header); any other bit is refused, so a future flag
                  cannot be misread
         8     4  record_count, u32: rows in the batch
        12     8  first_record_index, u64: index of this entry's first record within its segment,
                  so the last entry of a segment gives the segment's record count
        20     8  min_timestamp_ms, i64 } from the batch's `timestamp` column when it is an Arrow
        28     8  max_timestamp_ms, i64 } timestamp (nulls skipped); 0/0 otherwise or if empty
        36     4  uncompressed_bytes, u32: length of the Arrow IPC message before compression
        40     -  with PRODUCERS only: the producer section (below), a multiple of 8 bytes
         -     -  payload: the IPC record-batch message (`RecordBatch.serialize()`), as is or as
                  ONE zstd frame that carries its content size

The producer section says which records of the entry are which idempotent producer's batch, so a
new owner rebuilds its deduplication table from the stream (docs/serving.md, "Producer dedup
across failover"); readers skip it (no record, column or header shows it):

    size  field
       4  section_bytes, u32: the whole section, this field and the padding included
       1  section version, u8 (1)
       1  reserved, u8 (0)
       2  run_count, u16
          per run: u16 producer length, the producer (UTF-8, 1-256 bytes), u16 epoch,
          u64 first_sequence, u64 last_sequence, u32 first_slot, u32 records: the batch
          first_sequence..last_sequence of that producer is the entry's records
          first_slot..first_slot+records-1, whole (a batch is never cut between entries)
       -  zero bytes up to a multiple of 8

The payload holds no schema: readers know the stream's schema from the stream config and pass it
to `pyarrow.ipc.read_record_batch`, so decoding is a handful of C++ calls whatever the record
count. Record headers (Kafka's: a list of (string key, binary value) per record) exist for
untyped streams only and cost nothing when unused: an entry whose records have none is written
without the column, exactly as before headers existed; an entry with the HEADERS flag has a
fourth column (`headers`). A codec decodes every entry to one shape: the stream's schema (any
headers dropped), or with `headers=True` the schema with `headers` (null where an entry has none).

`dlog bench codec` (dlog_tools/bench/codec.py) on ~120-byte JSON-like values: one frame over the whole
message decodes up to 2x faster than Arrow's own per-buffer IPC compression at 1,000-record batches and
encodes as fast, but Arrow's per-buffer frames are 4-12% smaller; levels 1 and 3 compress alike
and level 1 encodes 1.4-1.7x faster.

Entries carry no dictionaries, so a schema with a dictionary-encoded column is refused.
Anything `decode` cannot accept raises `CorruptRecordSetError`, never a raw library exception.
"""

from __future__ import annotations

import base64
import binascii
import enum
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import zstandard

from bookkeeper.clock import wall_ms
from bookkeeper.errors import ConfigError, CorruptMetadataError, DlogError, invariant

MAGIC = b"DLRS"
FORMAT_VERSION = 1
HEADER = struct.Struct(">4sBBHIQqqI")
HEADER_BYTES = HEADER.size  # 40
U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
# A bound on what one entry may inflate to; entries are a few MiB, so this only stops a corrupt
# or hostile header from making a reader allocate gigabytes.
UNCOMPRESSED_BYTES_MAX_DEFAULT = 64 * 2**20
ZSTD_LEVEL_MIN, ZSTD_LEVEL_MAX = 1, 22
# IPC message prefix: continuation marker (4) + metadata length (4).
IPC_PREFIX_BYTES = 8
IPC_SLACK_BYTES = 64
# Below this many bytes of Arrow IPC an entry is stored uncompressed: zstd's frame costs more than
# it saves on a record or two (0.4-0.7x measured), and 4-5 us of CPU per entry.
COMPRESS_BYTES_MIN = 1024


class CorruptRecordSetError(DlogError):
    """An entry is not a record set this codec can decode: fail closed, never guess."""

    code = 301


class Compression(enum.IntEnum):
    NONE = 0
    ZSTD = 1


FLAG_HEADERS = 0x0001
FLAG_PRODUCERS = 0x0002
KNOWN_FLAGS = FLAG_HEADERS | FLAG_PRODUCERS
PRODUCERS_VERSION = 1
PRODUCERS_HEAD = struct.Struct(">IBBH")  # section bytes, version, reserved, run count
RUN_NUMBERS = struct.Struct(">HQQII")  # epoch, first sequence, last sequence, first slot, records
PRODUCER_BYTES_MAX = 256
RUNS_PER_ENTRY_MAX = 2**16 - 1


CODEC_VALUES = frozenset(int(codec) for codec in Compression)


@dataclass(frozen=True, slots=True)
class RecordSetHeader:
    version: int
    codec: Compression
    record_count: int
    first_record_index: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    uncompressed_bytes: int
    flags: int = 0
    payload_start: int = HEADER_BYTES  # past the producer section when there is one

    @property
    def next_record_index(self) -> int:
        """Index (within the segment) of the record after this entry's last one."""
        return self.first_record_index + self.record_count


@dataclass(frozen=True, slots=True)
class ProducerRun:
    """One idempotent producer's batch in an entry: its sequences and the entry's records (slots
    first_slot..first_slot+records-1) that hold it."""

    producer: str
    epoch: int
    first_sequence: int
    last_sequence: int
    first_slot: int
    records: int


def run_bytes(producer: str) -> int:
    """What one run of `producer` adds to an entry's producer section."""
    return 2 + len(producer.encode()) + RUN_NUMBERS.size


def encode_producers(runs: Sequence[ProducerRun], record_count: int) -> bytes:
    """The producer section of an entry of `record_count` records (b"" for no runs)."""
    if not runs:
        return b""
    invariant(len(runs) <= RUNS_PER_ENTRY_MAX, f"an entry holds at most {RUNS_PER_ENTRY_MAX} producer runs")
    parts = []
    end = 0
    for run in runs:
        name = run.producer.encode()
        invariant(0 < len(name) <= PRODUCER_BYTES_MAX and run.first_slot >= end and run.records > 0
                  and run.first_slot + run.records <= record_count and 0 <= run.epoch < 2**16
                  and 0 <= run.first_sequence <= U64_MAX and 0 <= run.last_sequence <= U64_MAX,
                  f"bad producer run {run} in an entry of {record_count} records")
        end = run.first_slot + run.records
        parts.append(struct.pack(">H", len(name)) + name + RUN_NUMBERS.pack(
            run.epoch, run.first_sequence, run.last_sequence, run.first_slot, run.records))
    body = b"".join(parts)
    size = PRODUCERS_HEAD.size + len(body)
    size += -size % 8
    return PRODUCERS_HEAD.pack(size, PRODUCERS_VERSION, 0, len(runs)) + body + bytes(size - PRODUCERS_HEAD.size
                                                                                   - len(body))


def decode_producers(view: memoryview, record_count: int) -> tuple[int, tuple[ProducerRun, ...]]:
    """(section bytes, runs) of the producer section at the start of `view`; CorruptRecordSetError
    names what is wrong."""
    if view.nbytes < PRODUCERS_HEAD.size:
        raise CorruptRecordSetError("record set has the PRODUCERS flag but no room for its section")
    size, version, _, count = PRODUCERS_HEAD.unpack_from(view)
    if version != PRODUCERS_VERSION:
        raise CorruptRecordSetError(f"record set producer section version {version} is unknown "
                                    f"(known: {PRODUCERS_VERSION})")
    if size % 8 or not PRODUCERS_HEAD.size <= size <= view.nbytes:
        raise CorruptRecordSetError(f"record set producer section claims {size} bytes (of {view.nbytes} left)")
    at, end, runs = PRODUCERS_HEAD.size, 0, []
    for _ in range(count):
        if at + 2 > size:
            raise CorruptRecordSetError("record set producer section is shorter than its runs")
        (length,) = struct.unpack_from(">H", view, at)
        if not 0 < length <= PRODUCER_BYTES_MAX or at + 2 + length + RUN_NUMBERS.size > size:
            raise CorruptRecordSetError(f"record set producer section has a producer of {length} bytes "
                                        "that does not fit")
        try:
            producer = bytes(view[at + 2: at + 2 + length]).decode()
        except UnicodeDecodeError as error:
            raise CorruptRecordSetError(f"record set producer section names a producer that is not UTF-8: "
                                        f"{error}") from error
        epoch, first_sequence, last_sequence, first_slot, records = RUN_NUMBERS.unpack_from(view, at + 2 + length)
        if records == 0 or first_slot < end or first_slot + records > record_count:
            raise CorruptRecordSetError(f"record set producer run {producer} holds records "
                                        f"{first_slot}..{first_slot + records - 1} of {record_count}, "
                                        "overlapping or outside the entry")
        end = first_slot + records
        runs.append(ProducerRun(producer, epoch, first_sequence, last_sequence, first_slot, records))
        at += 2 + length + RUN_NUMBERS.size
    return size, tuple(runs)


@dataclass(frozen=True, slots=True)
class DecodedEntry:
    """An entry already decoded: its header and its records (with a `headers` column on an
    untyped stream), as a tier file gives them back in place of a ledger entry's payload. The
    codec hands it out as it is (`decode`, `peek_header`), so readers of entries need not know
    where an entry came from."""

    header: RecordSetHeader
    batch: pa.RecordBatch

    def __len__(self) -> int:  # what a cache counts as the entry's size
        return self.header.uncompressed_bytes


class EncodedEntry(NamedTuple):
    """An encoded entry and the range of its records' timestamps, as its header says."""

    payload: bytes
    min_timestamp_ms: int
    max_timestamp_ms: int


def default_schema() -> pa.Schema:
    """The schema of an untyped stream."""
    return DEFAULT_SCHEMA


DEFAULT_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary(), nullable=True),
        pa.field("value", pa.binary(), nullable=False),
        pa.field("timestamp", pa.timestamp("ms"), nullable=False),
    ]
)
# Record headers: per record a list of (string key, binary value), or null. Spark's Arrow form of
# array<struct<key: string, value: binary>> (list field "element"), so the source hands it as is.
HEADER_TYPE = pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_TYPE, nullable=False))
HEADERS_FIELD = pa.field("headers", HEADERS_TYPE, nullable=True)
HEADERS_SCHEMA = DEFAULT_SCHEMA.append(HEADERS_FIELD)


def schema_with_headers(schema: pa.Schema) -> pa.Schema | None:
    """The schema of entries with headers for a stream of `schema` (untyped streams only)."""
    return HEADERS_SCHEMA if schema.equals(DEFAULT_SCHEMA) else None


def without_empty_headers(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A headers batch whose records carry no header at all, as a plain default-schema batch."""
    index = batch.schema.get_field_index("headers")
    if index < 0 or not batch.schema.equals(HEADERS_SCHEMA):
        return batch
    column = batch.column(index)
    if column.null_count == len(column) or pc.sum(pc.list_value_length(column)).as_py() in (None, 0):
        return batch.drop_columns(["headers"])
    return batch


class RecordSetCodec:
    """Encodes and decodes the entries of one stream (one schema).

    zstd contexts are not thread-safe, so each thread lazily gets its own pair and reuses it.
    Pickling keeps only the settings (Spark ships readers to workers by pickle).
    """

    __slots__ = ("schema", "compression_level", "compress", "uncompressed_bytes_max", "headers",
                 "_headers_schema", "_local")

    def __init__(
        self,
        schema: pa.Schema,
        *,
        compression_level: int = 1,
        compress: bool = True,
        uncompressed_bytes_max: int = UNCOMPRESSED_BYTES_MAX_DEFAULT,
        headers: bool = False,
    ) -> None:
        if not isinstance(schema, pa.Schema):
            raise ConfigError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
        _refuse_dictionaries(schema)
        if type(compression_level) is not int or not ZSTD_LEVEL_MIN <= compression_level <= ZSTD_LEVEL_MAX:
            raise ConfigError(
                f"bad compression_level {compression_level!r}: use an integer zstd level "
                f"{ZSTD_LEVEL_MIN}..{ZSTD_LEVEL_MAX} (3 is the default, 1 the fastest)"
            )
        if type(uncompressed_bytes_max) is not int or not 0 < uncompressed_bytes_max <= U32_MAX:
            raise ConfigError(
                f"bad uncompressed_bytes_max {uncompressed_bytes_max!r}: use an integer in 1..{U32_MAX}"
            )
        self.schema = schema
        self.compression_level = compression_level
        self.compress = bool(compress)
        self.uncompressed_bytes_max = uncompressed_bytes_max
        self._headers_schema = schema_with_headers(schema)
        if headers and self._headers_schema is None:
            raise ConfigError(f"record headers exist for untyped streams only; this stream's schema is "
                              f"({describe_schema(schema)})")
        self.headers = bool(headers)
        self._local = threading.local()

    def __reduce__(self) -> tuple[Any, ...]:
        settings = (self.schema, self.compression_level, self.compress, self.uncompressed_bytes_max, self.headers)
        return (_rebuild_codec, settings)

    def encode(self, batch: pa.RecordBatch, first_record_index: int) -> bytes:
        """One entry holding ``batch``; ``first_record_index`` is its first record's index in the
        segment (`encode_entry` says more, and also returns the timestamps it wrote)."""
        return self.encode_entry(batch, first_record_index).payload

    def encode_entry(self, batch: pa.RecordBatch, first_record_index: int, *,
                     timestamp_range_ms: tuple[int, int] | None = None, checked: bool = False,
                     producers: Sequence[ProducerRun] = ()) -> EncodedEntry:
        """One entry holding ``batch``, and the range of its records' timestamps as written into
        its header; ``first_record_index`` is its first record's index in the segment. A batch of
        an untyped stream may carry the `headers` column (HEADERS flag). A caller that built the
        batch itself may pass its timestamps' (min, max) in milliseconds and ``checked=True`` (the
        batch fits the schema): small entries then cost no Arrow compute call. ``producers``: the
        idempotent producers' batches among the records (PRODUCERS flag and section)."""
        flags = FLAG_PRODUCERS if producers else 0
        if self._headers_schema is not None and batch.schema.get_field_index("headers") >= 0:
            batch = without_empty_headers(batch)
        if self._headers_schema is not None and batch.schema.equals(self._headers_schema):
            flags |= FLAG_HEADERS
        if not checked:
            check_batch(batch, self.schema)
        invariant(
            type(first_record_index) is int and 0 <= first_record_index <= U64_MAX - batch.num_rows,
            f"first_record_index {first_record_index!r} is not a u64 leaving room for {batch.num_rows} records",
        )
        if batch.num_rows > U32_MAX:
            raise ConfigError(f"an entry holds at most {U32_MAX} records, got {batch.num_rows}: use split_batch")
        message = batch.serialize()
        if message.size > self.uncompressed_bytes_max:
            raise ConfigError(
                f"record batch is {message.size} bytes in Arrow IPC, over uncompressed_bytes_max "
                f"{self.uncompressed_bytes_max}: use split_batch to cut it into smaller entries"
            )
        payload: bytes | memoryview
        if self.compress and message.size >= COMPRESS_BYTES_MIN:
            codec, payload = Compression.ZSTD, self._compressor().compress(message)
        else:
            codec, payload = Compression.NONE, memoryview(message)
        if timestamp_range_ms is None:
            min_timestamp_ms, max_timestamp_ms = batch_timestamp_range_ms(batch)
        else:
            min_timestamp_ms, max_timestamp_ms = timestamp_range_ms
        header = HEADER.pack(
            MAGIC, FORMAT_VERSION, codec, flags, batch.num_rows, first_record_index,
            min_timestamp_ms, max_timestamp_ms, message.size,
        )  # fmt: skip
        section = encode_producers(producers, batch.num_rows)
        return EncodedEntry(b"".join((header, section, payload)), min_timestamp_ms, max_timestamp_ms)

    def peek_header(self, data: bytes | bytearray | memoryview | DecodedEntry) -> RecordSetHeader:
        """The header alone, checked but without decompressing anything."""
        if isinstance(data, DecodedEntry):
            return data.header
        view = memoryview(data)
        if view.nbytes < HEADER_BYTES:
            raise CorruptRecordSetError(f"record set is {view.nbytes} bytes, shorter than a header ({HEADER_BYTES})")
        magic, version, codec, flags, count, first, ts_min, ts_max, raw_bytes = HEADER.unpack_from(view)
        if magic != MAGIC:
            raise CorruptRecordSetError(f"record set starts with {bytes(magic)!r}, not the magic {MAGIC!r}")
        if version != FORMAT_VERSION:
            raise CorruptRecordSetError(f"record set format version {version} is unknown (known: {FORMAT_VERSION})")
        if codec not in CODEC_VALUES:
            raise CorruptRecordSetError(f"record set codec {codec} is unknown (known: 0 none, 1 zstd)")
        if flags & ~KNOWN_FLAGS:
            raise CorruptRecordSetError(f"record set flags {flags:#06x} are unknown (known: {KNOWN_FLAGS:#06x})")
        if ts_min > ts_max:
            raise CorruptRecordSetError(f"record set min timestamp {ts_min} is after its max timestamp {ts_max}")
        if first > U64_MAX - count:
            raise CorruptRecordSetError(f"record set first index {first} + count {count} overflows u64")
        if raw_bytes > self.uncompressed_bytes_max:
            raise CorruptRecordSetError(
                f"record set claims {raw_bytes} uncompressed bytes, over the limit {self.uncompressed_bytes_max}"
            )
        payload_start = HEADER_BYTES
        if flags & FLAG_PRODUCERS:
            if view.nbytes < HEADER_BYTES + PRODUCERS_HEAD.size:
                raise CorruptRecordSetError("record set has the PRODUCERS flag but no room for its section")
            (section_bytes,) = struct.unpack_from(">I", view, HEADER_BYTES)
            if section_bytes % 8 or not PRODUCERS_HEAD.size <= section_bytes <= view.nbytes - HEADER_BYTES:
                raise CorruptRecordSetError(f"record set producer section claims {section_bytes} bytes "
                                            f"(of {view.nbytes - HEADER_BYTES} after the header)")
            payload_start += section_bytes
        payload_bytes = view.nbytes - payload_start
        if codec == Compression.NONE and payload_bytes != raw_bytes:
            raise CorruptRecordSetError(f"record set has {payload_bytes} payload bytes, its header says {raw_bytes}")
        return RecordSetHeader(version, Compression(codec), count, first, ts_min, ts_max, raw_bytes, flags,
                               payload_start)

    def producer_runs(self, data: bytes | bytearray | memoryview | DecodedEntry) -> tuple[ProducerRun, ...]:
        """The idempotent producers' batches the entry holds (none for an entry without the
        PRODUCERS flag), read without decompressing the records."""
        header = self.peek_header(data)
        if not header.flags & FLAG_PRODUCERS or isinstance(data, DecodedEntry):
            return ()
        return decode_producers(memoryview(data)[HEADER_BYTES:header.payload_start],
                                header.record_count)[1]

    def records_from(self, payload: bytes | bytearray | memoryview | DecodedEntry, first_slot: int) -> pa.RecordBatch:
        """The entry's records from `first_slot` on: what a reader hands out of an entry it enters
        at an offset's slot or at a truncation point inside it (the stream reader and the Spark
        source both read entries this way)."""
        _, batch = self.decode(payload)
        return batch.slice(first_slot) if first_slot else batch

    def decode(self, data: bytes | bytearray | memoryview | DecodedEntry) -> tuple[RecordSetHeader, pa.RecordBatch]:
        """The header and the batch (with the stream's schema) of one entry.

        An uncompressed entry's batch shares memory with ``data``: do not change ``data`` after.
        """
        if isinstance(data, DecodedEntry):
            return data.header, self._as_read(data.batch)
        header = self.peek_header(data)
        schema = self.schema
        if header.flags & FLAG_HEADERS:
            if self._headers_schema is None:
                raise CorruptRecordSetError("record set has record headers but the stream is typed "
                                            f"({describe_schema(self.schema)}); only untyped streams have headers")
            schema = self._headers_schema
        payload = memoryview(data)[header.payload_start:]
        ipc: bytes | memoryview = payload
        if header.codec == Compression.ZSTD:
            ipc = self._decompress(payload, header.uncompressed_bytes)
        batch = _read_batch(pa.py_buffer(ipc), schema)
        if batch.num_rows != header.record_count:
            raise CorruptRecordSetError(
                f"record set header says {header.record_count} records, batch has {batch.num_rows}"
            )
        if self.headers and schema is self.schema:
            batch = batch.append_column(HEADERS_FIELD, pa.nulls(batch.num_rows, HEADERS_TYPE))
        elif not self.headers and schema is not self.schema:
            batch = batch.drop_columns(["headers"])
        return header, batch

    def _as_read(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A decoded entry's records with or without the headers column, as this codec reads."""
        has_headers = "headers" in batch.schema.names
        if self.headers and not has_headers:
            return batch.append_column(HEADERS_FIELD, pa.nulls(batch.num_rows, HEADERS_TYPE))
        if not self.headers and has_headers:
            return batch.drop_columns(["headers"])
        return batch

    def _decompress(self, payload: memoryview, expected_bytes: int) -> bytes:
        # Checking the frame's declared size first means a hostile frame cannot make us allocate
        # more than the header (already bounded by uncompressed_bytes_max) allows.
        try:
            frame_bytes = zstandard.frame_content_size(payload)
            if frame_bytes != expected_bytes:
                raise CorruptRecordSetError(f"zstd frame declares {frame_bytes} bytes, header says {expected_bytes}")
            raw = self._decompressor().decompress(payload, allow_extra_data=False)
        except zstandard.ZstdError as error:
            raise CorruptRecordSetError(f"record set payload is not one valid zstd frame: {error}") from error
        if len(raw) != expected_bytes:
            raise CorruptRecordSetError(f"record set inflated to {len(raw)} bytes, header says {expected_bytes}")
        return raw

    def _compressor(self) -> zstandard.ZstdCompressor:
        compressor = getattr(self._local, "compressor", None)
        if compressor is None:
            compressor = zstandard.ZstdCompressor(level=self.compression_level, write_content_size=True)
            self._local.compressor = compressor
        return compressor

    def _decompressor(self) -> zstandard.ZstdDecompressor:
        decompressor = getattr(self._local, "decompressor", None)
        if decompressor is None:
            decompressor = zstandard.ZstdDecompressor()
            self._local.decompressor = decompressor
        return decompressor


def _rebuild_codec(schema: pa.Schema, level: int, compress: bool, uncompressed_bytes_max: int,
                  headers: bool = False) -> RecordSetCodec:
    return RecordSetCodec(
        schema, compression_level=level, compress=compress, uncompressed_bytes_max=uncompressed_bytes_max,
        headers=headers,
    )


def _read_batch(buffer: pa.Buffer, schema: pa.Schema) -> pa.RecordBatch:
    try:
        message = ipc.read_message(buffer)
        if message.type != "record batch":
            raise CorruptRecordSetError(f"record set holds an Arrow {message.type!r} message, not a record batch")
        used_bytes = IPC_PREFIX_BYTES + message.metadata.size + message.body.size
        if used_bytes != buffer.size:
            raise CorruptRecordSetError(f"record set has {buffer.size - used_bytes} bytes around its Arrow message")
        batch = ipc.read_record_batch(message, schema)
        # Full validation is C++ work linear in bytes (about 2 ms per million records here). Without
        # it, offsets that go backwards pass the cheap checks and later abort the whole process
        # (std::length_error) in whoever prints or copies the column.
        batch.validate(full=True)
    except (pa.ArrowException, OSError) as error:
        raise CorruptRecordSetError(f"record set payload is not a valid Arrow record batch: {error}") from error
    return batch


def batch_timestamp_range_ms(batch: pa.RecordBatch) -> tuple[int, int]:
    """(min, max) of a batch's `timestamp` column in ms, floored and ceiled so the range covers
    every record whatever the column's unit; (0, 0) without one, or when all are null."""
    index = batch.schema.get_field_index("timestamp")
    if index < 0 or batch.num_rows == 0 or not pa.types.is_timestamp(batch.schema.field(index).type):
        return 0, 0
    column = batch.column(index)
    extremes = pc.min_max(column)
    if not extremes["min"].is_valid:  # every timestamp is null
        return 0, 0
    low, high = extremes["min"].value, extremes["max"].value
    if column.type.unit == "s":
        low, high = low * 1000, high * 1000
    else:  # floor the minimum and ceil the maximum so the range covers every record
        per_ms = {"ms": 1, "us": 1000, "ns": 1_000_000}[column.type.unit]
        low, high = low // per_ms, -(-high // per_ms)
    return max(I64_MIN, min(I64_MAX, low)), max(I64_MIN, min(I64_MAX, high))


# ------------------------------------------------------------------------------ batches


def describe_schema(schema: pa.Schema) -> str:
    """One line, e.g. "key: binary, value: binary not null", for error messages."""
    return ", ".join(f"{field.name}: {field.type}{'' if field.nullable else ' not null'}" for field in schema)


def check_batch(batch: pa.RecordBatch, schema: pa.Schema) -> None:
    """Raises ConfigError naming the first way ``batch`` does not fit the stream's ``schema``."""
    if not isinstance(batch, pa.RecordBatch):
        raise ConfigError(f"expected a pyarrow.RecordBatch, got {type(batch).__name__}")
    if batch.schema.equals(schema) and not _nulls_in_required(batch, schema):
        return  # the common case: one C++ comparison
    if "headers" in batch.schema.names and schema_with_headers(schema) is not None:
        schema = HEADERS_SCHEMA  # an untyped stream's batch may carry record headers
        if batch.schema.equals(schema) and not _nulls_in_required(batch, schema):
            return
    expected = f"the stream's schema is ({describe_schema(schema)})"
    names = batch.schema.names
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"batch has column {name!r} more than once; {expected}")
        if schema.get_field_index(name) < 0:
            raise ConfigError(f"batch has column {name!r} that the stream's schema lacks; {expected}")
    for position, field in enumerate(schema):
        if field.name not in names:
            raise ConfigError(f"batch has no column {field.name!r}; {expected}")
        found = names.index(field.name)
        if found != position:
            raise ConfigError(f"column {field.name!r} is at position {found}, expected {position}; {expected}")
        actual = batch.schema.field(position).type
        if not actual.equals(field.type):
            raise ConfigError(f"column {field.name!r} is {actual}, expected {field.type}; {expected}")
    for field, null_count in _nulls_in_required(batch, schema):
        raise ConfigError(f"column {field.name!r} has {null_count} nulls but is not nullable; {expected}")


def fill_missing_columns(batch: pa.RecordBatch, schema: pa.Schema, now_ms: int) -> pa.RecordBatch:
    """``batch`` with its columns in the schema's order (taken by name) and the stream's columns it
    lacks added: a nullable column as nulls, a `timestamp` column (of an Arrow timestamp type) as
    the write time ``now_ms``. A missing column that is neither is a ConfigError; types are not
    converted (check_batch judges them). write_batch() and the Spark sink both take
    batches through this one function, so both fill the same way."""
    names = batch.schema.names
    if "headers" in names and schema_with_headers(schema) is not None:
        schema = HEADERS_SCHEMA  # an untyped stream's batch may carry record headers
    if names == schema.names:
        return batch
    expected = f"the stream's schema is ({describe_schema(schema)})"
    columns = []
    for field in schema:
        if field.name in names:
            columns.append(batch.column(names.index(field.name)))
        else:
            columns.append(missing_column(field, batch.num_rows, now_ms, expected))
    extra = [name for name in names if schema.get_field_index(name) < 0]
    if extra:
        raise ConfigError(f"batch has column {extra[0]!r} that the stream's schema lacks; {expected}")
    return pa.RecordBatch.from_arrays(columns, names=[field.name for field in schema])


def missing_column(field: pa.Field, count: int, now_ms: int, expected: str) -> pa.Array:
    """The column a batch without `field` gets (see `fill_missing_columns`)."""
    if field.name == "timestamp" and pa.types.is_timestamp(field.type):
        return pc.cast(pa.repeat(pa.scalar(now_ms, pa.timestamp("ms")), count), field.type, safe=False)
    if field.nullable:
        return pa.nulls(count, field.type)
    raise ConfigError(f"batch has no column {field.name!r}, which is not nullable; {expected}")


def _nulls_in_required(batch: pa.RecordBatch, schema: pa.Schema) -> list[tuple[pa.Field, int]]:
    return [
        (field, batch.column(position).null_count)
        for position, field in enumerate(schema)
        if not field.nullable and position < batch.num_columns and batch.column(position).null_count
    ]


def _refuse_dictionaries(schema: pa.Schema) -> None:
    def has_dictionary(data_type: pa.DataType) -> bool:
        if pa.types.is_dictionary(data_type):
            return True
        return any(has_dictionary(data_type.field(i).type) for i in range(data_type.num_fields))

    for field in schema:
        if has_dictionary(field.type):
            raise ConfigError(
                f"column {field.name!r} is {field.type}: entries carry no Arrow dictionaries, "
                f"so declare the column with its value type instead"
            )


_conversions_warm = False


def warm_arrow_conversions() -> None:
    """Load what pyarrow loads the first time it converts Python objects: `pa.array` asks whether
    its input is a pandas object, and the first such question imports pandas (where installed),
    about 0.35 s here, which a process's first entry spent on the event loop, stalling every
    stream, reader and timer of the process. `Namespace.open_writer` calls it in a thread, once:
    a process that never writes never pays it."""
    global _conversions_warm
    if not _conversions_warm:
        pa.array([b""], type=pa.binary())
        _conversions_warm = True


def arrow_conversions_warm() -> bool:
    return _conversions_warm


def records_to_batch(
    values: Sequence[Any] | pa.Array,
    keys: Sequence[Any] | pa.Array | None = None,
    timestamps_ms: Sequence[int] | pa.Array | None = None,
    schema: pa.Schema = DEFAULT_SCHEMA,
    headers: Sequence[Headers | None] | None = None,
    *,
    check: bool = True,
) -> pa.RecordBatch:
    """A batch of a key/value/timestamp schema from Python lists (one `pa.array` call per column).

    Missing keys are null; missing timestamps are the wall clock now, the same for every record.
    `headers` (untyped streams): per record None or a list of (str key, bytes value) pairs; the
    batch has a `headers` column only when some record has one.
    `check=False` skips the final schema check, for callers whose columns cannot break it (a writer
    that took bytes values and integer timestamps only: `pa.array` refuses anything else).
    """
    count = len(values)
    sources: dict[str, Any] = {"value": values, "key": keys, "timestamp": timestamps_ms}
    if headers is not None and any(headers):
        if schema_with_headers(schema) is None:
            raise ConfigError(f"record headers exist for untyped streams only; this stream's schema is "
                              f"({describe_schema(schema)})")
        schema = HEADERS_SCHEMA
        sources["headers"] = headers_column(headers, count)
    columns = []
    for field in schema:
        if field.name not in sources:
            raise ConfigError(
                f"records_to_batch fills only key, value and timestamp columns, the schema has {field.name!r}: "
                f"build the batch with pyarrow.RecordBatch.from_arrays instead"
            )
        columns.append(_column(field, sources[field.name], count))
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    if check:
        check_batch(batch, schema)
    return batch


Headers = Sequence[tuple[str, bytes | None]]
MILLISECONDS = pa.timestamp("ms")  # a timestamp column built from integers needs no cast in this unit


def headers_column(headers: Sequence[Headers | None], count: int) -> pa.Array:
    """The `headers` column of `count` records: each None or a list of (str key, bytes value)."""
    if len(headers) != count:
        raise ConfigError(f"got {count} values but {len(headers)} header lists; pass one per record (or None)")
    rows: list[list[dict[str, Any]] | None] = []
    for index, pairs in enumerate(headers):
        if pairs is None:
            rows.append(None)
            continue
        items = list(pairs.items()) if isinstance(pairs, Mapping) else list(pairs)
        row = []
        for pair in items:
            if (not isinstance(pair, (tuple, list)) or len(pair) != 2 or not isinstance(pair[0], str)
                    or not (pair[1] is None or isinstance(pair[1], (bytes, bytearray, memoryview)))):
                raise ConfigError(f"record {index}: a header is a (str key, bytes value) pair, got {pair!r}")
            row.append({"key": pair[0], "value": None if pair[1] is None else bytes(pair[1])})
        rows.append(row)
    return pa.array(rows, type=HEADERS_TYPE)


def _column(field: pa.Field, source: Sequence[Any] | pa.Array | None, count: int) -> pa.Array:
    is_timestamp = field.name == "timestamp"
    if is_timestamp and not pa.types.is_timestamp(field.type):
        raise ConfigError(f"column 'timestamp' is {field.type}; records_to_batch needs an Arrow timestamp type")
    if source is None:
        if is_timestamp:
            return pa.repeat(pa.scalar(wall_ms(), pa.timestamp("ms")).cast(field.type), count)
        if not field.nullable:
            raise ConfigError(f"column {field.name!r} is not nullable: pass a list of {count} values for it")
        return pa.nulls(count, field.type)
    if len(source) != count:
        raise ConfigError(f"got {count} values but {len(source)} for column {field.name!r}; pass one per record")
    try:
        if isinstance(source, pa.Array) and source.type.equals(field.type):
            return source
        if is_timestamp:  # integers are milliseconds whatever unit the column stores
            stamps = pa.array(source, type=MILLISECONDS)
            return stamps if field.type.equals(MILLISECONDS) else stamps.cast(field.type)
        return pa.array(source, type=field.type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
        raise ConfigError(f"column {field.name!r} cannot be built as {field.type}: {error}") from error


def split_batch(batch: pa.RecordBatch, entry_bytes_max: int) -> list[pa.RecordBatch]:
    """Zero-copy slices of ``batch``, in order, each small enough to encode under ``entry_bytes_max``.

    Sizes are estimated from `nbytes` plus room for the header, the IPC metadata, buffer padding
    and zstd's worst-case growth on incompressible data, so the bound holds with or without
    compression.
    """
    if not isinstance(batch, pa.RecordBatch):
        raise ConfigError(f"expected a pyarrow.RecordBatch, got {type(batch).__name__}")
    if type(entry_bytes_max) is not int or entry_bytes_max <= 0:
        raise ConfigError(f"bad entry_bytes_max {entry_bytes_max!r}: use a positive integer number of bytes")
    if batch.num_rows == 0:
        return []
    if batch.nbytes * 2 + SMALL_BATCH_SLACK_BYTES <= entry_bytes_max:
        return [batch]  # far below the bound whatever the overheads below: no estimate needed
    budget_bytes = _payload_budget_bytes(batch, entry_bytes_max)
    if budget_bytes <= 0:
        raise ConfigError(f"entry_bytes_max {entry_bytes_max} leaves no room for records after the entry's overhead")
    total_rows, total_bytes = batch.num_rows, batch.nbytes
    rows_guess = max(1, total_rows * budget_bytes // max(total_bytes, 1))
    pieces: list[pa.RecordBatch] = []
    start = 0
    while start < total_rows:
        count = min(rows_guess, total_rows - start)
        piece = batch.slice(start, count)
        while piece.nbytes > budget_bytes and count > 1:
            # Shrink in proportion to the overshoot (at least by one row): a few steps even when
            # one large record sits among small ones.
            count = max(1, min(count - 1, count * budget_bytes // piece.nbytes))
            piece = batch.slice(start, count)
        if piece.nbytes > budget_bytes:
            raise ConfigError(
                f"record {start} is {piece.nbytes} bytes, more than fits in one entry of entry_bytes_max "
                f"{entry_bytes_max} ({budget_bytes} bytes for records): make it smaller or raise the entry size"
            )
        pieces.append(piece)
        start += count
    invariant(sum(piece.num_rows for piece in pieces) == total_rows, "split_batch lost or duplicated rows")
    return pieces


# IPC metadata (a few hundred bytes per schema), 8-byte padding of every buffer, the header and
# zstd's worst-case growth are together far below this for any batch of at most half an entry
SMALL_BATCH_SLACK_BYTES = 65536


def _payload_budget_bytes(batch: pa.RecordBatch, entry_bytes_max: int) -> int:
    """How many bytes of `nbytes` a slice may have so that its entry fits in ``entry_bytes_max``."""
    # IPC message = metadata (almost fixed per schema: measured on a one-row slice) + each buffer
    # padded to 8 bytes. Slack covers flatbuffer fields that appear only when non-zero.
    buffer_count = sum(len(column.buffers()) for column in batch.columns)
    one_row = batch.slice(0, 1)
    ipc_overhead_bytes = one_row.serialize().size - one_row.nbytes + 8 * buffer_count + IPC_SLACK_BYTES
    # zstd's worst case on incompressible input, frame header included: n + n/256 + 64.
    ipc_bytes_max = (entry_bytes_max - HEADER_BYTES - 64) * 256 // 257
    return int(ipc_bytes_max - ipc_overhead_bytes)  # pyarrow is untyped: say it is an int


# ------------------------------------------------------------------------------ schema text


def schema_to_text(schema: pa.Schema) -> str:
    """ASCII text of ``schema`` for a JSON config node: base64 of its Arrow IPC encoding."""
    return base64.b64encode(schema.serialize()).decode("ascii")


def schema_from_text(text: str) -> pa.Schema:
    """Inverse of `schema_to_text`; anything that is not such text is CorruptMetadataError."""
    if not isinstance(text, str):
        raise CorruptMetadataError(f"stored schema must be base64 text, got {type(text).__name__}")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
        return ipc.read_schema(pa.py_buffer(raw))
    except (binascii.Error, UnicodeEncodeError, pa.ArrowException, OSError) as error:
        raise CorruptMetadataError(f"stored schema is not base64 of an Arrow IPC schema: {error}") from error
