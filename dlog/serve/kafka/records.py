"""Record batches (magic 2): a Produce partition's record set in, records out; records in, a
batch for a Fetch response out.

Decoding follows the order in which a Kafka broker checks a produced batch: exactly one batch of
magic 2 (INVALID_RECORD otherwise: Produce v3+ carries nothing else), its size against
`batch_bytes_max` (MESSAGE_TOO_LARGE), its CRC-32C over everything after the CRC field
(CORRUPT_MESSAGE), its codec (zstd needs Produce v7: UNSUPPORTED_COMPRESSION_TYPE), then the
records, decompressed within `batch_decompressed_bytes_max`. The rule for the two refusal codes:
bytes that do not parse are CORRUPT_MESSAGE; a batch that parses but breaks a rule a producer must
follow (a control batch, a record count or offset deltas other than 0..n-1) is INVALID_RECORD.

Encoding uses kafka-python's batch builder (the one its producer uses), uncompressed, and writes
the base offset, which is outside the CRC, afterwards.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from bookkeeper.errors import ProtocolError
from dlog.serve.kafka import compression
from dlog.serve.kafka.errors import ErrorCode

BATCH_BYTES_MAX_DEFAULT = 1_048_588  # Kafka's message.max.bytes (1 MiB + the batch overhead)
BATCH_DECOMPRESSED_BYTES_MAX_DEFAULT = 64 * 1024 * 1024

# base offset, length, partition leader epoch, magic, crc, attributes, last offset delta,
# first timestamp, max timestamp, producer id, producer epoch, base sequence, record count
_HEADER = struct.Struct(">qiibIhiqqqhii")
_LENGTH_END = 12  # base offset and length: the batch length counts the bytes after these
_MAGIC_AT = 16
_CRC_COVERS_FROM = 21  # attributes onward
_BASE_OFFSET = struct.Struct(">q")
_COMPRESSION_MASK, _TIMESTAMP_TYPE_BIT, _TRANSACTIONAL_BIT, _CONTROL_BIT = 0x07, 0x08, 0x10, 0x20
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Record:
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True, slots=True)
class ProducedBatch:
    """One produced record batch, checked: what the server needs to append and deduplicate it."""

    producer_id: int  # -1 unless the producer is idempotent
    producer_epoch: int
    base_sequence: int  # -1 unless the producer is idempotent
    last_offset_delta: int  # record count - 1
    first_timestamp_ms: int
    max_timestamp_ms: int  # the largest record timestamp
    compression: int  # compression.NONE ... compression.ZSTD
    transactional: bool
    records: tuple[Record, ...]
    size_bytes: int  # of the batch as it came, compressed

    @property
    def record_count(self) -> int:
        return len(self.records)

    @property
    def last_sequence(self) -> int:
        """The sequence of the batch's last record (sequences wrap after 2**31 - 1, as in Kafka)."""
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) % (_INT32_MAX + 1)


@dataclass(frozen=True, slots=True)
class BatchRefused:
    """The partition's answer: `error` in its error_code field, `reason` for the log."""

    error: ErrorCode
    reason: str


class RecordBatchError(ProtocolError):
    """A produced record batch the codec refuses; `error` is the Kafka code to answer with."""

    code = 651

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


def decode_produce_records(records: bytes | None, api_version: int, *,
                           batch_bytes_max: int = BATCH_BYTES_MAX_DEFAULT,
                           batch_decompressed_bytes_max: int = BATCH_DECOMPRESSED_BYTES_MAX_DEFAULT,
                           ) -> ProducedBatch | BatchRefused:
    """One partition's `records` field of a Produce request (v3+) -> its batch, or the refusal."""
    try:
        return _decode(memoryview(records or b""), api_version, batch_bytes_max,
                       batch_decompressed_bytes_max)
    except RecordBatchError as exc:
        return BatchRefused(exc.error, str(exc))


def _decode(data: memoryview, api_version: int, batch_bytes_max: int,
            batch_decompressed_bytes_max: int) -> ProducedBatch:
    if len(data) < _LENGTH_END:
        raise RecordBatchError(ErrorCode.INVALID_RECORD, f"Produce v{api_version} needs exactly one "
                               f"record batch per partition; got {len(data)} bytes")
    (length,) = struct.unpack_from(">i", data, 8)
    if length < _HEADER.size - _LENGTH_END or _LENGTH_END + length > len(data):
        raise RecordBatchError(ErrorCode.CORRUPT_MESSAGE, f"record batch length {length} does not "
                               f"fit the {len(data)} bytes of the record set")
    if data[_MAGIC_AT] != 2:
        raise RecordBatchError(ErrorCode.INVALID_RECORD, f"record batch has magic {data[_MAGIC_AT]}; "
                               f"Produce v{api_version} carries magic 2 only")
    if _LENGTH_END + length < len(data):
        raise RecordBatchError(ErrorCode.INVALID_RECORD, "record set holds more than one record "
                               f"batch ({len(data) - _LENGTH_END - length} bytes after the first)")
    if len(data) > batch_bytes_max:
        raise RecordBatchError(ErrorCode.MESSAGE_TOO_LARGE, f"record batch of {len(data)} bytes is "
                               f"over the limit of {batch_bytes_max} (batch_bytes_max)")
    (_, _, _, _, crc, attributes, last_offset_delta, first_timestamp, max_timestamp, producer_id,
     producer_epoch, base_sequence, count) = _HEADER.unpack_from(data)
    if crc32c.crc32c(data[_CRC_COVERS_FROM:]) != crc:
        raise RecordBatchError(ErrorCode.CORRUPT_MESSAGE, "record batch fails its CRC-32C")
    codec = attributes & _COMPRESSION_MASK
    _check_attributes(codec, attributes, api_version)
    if count < 1 or last_offset_delta != count - 1:
        raise RecordBatchError(ErrorCode.INVALID_RECORD, f"record batch says {count} records and "
                               f"last offset delta {last_offset_delta}; a produced batch has n >= 1 "
                               "records with deltas 0..n-1")
    payload = data[_HEADER.size:]
    if codec != compression.NONE:
        try:
            payload = memoryview(compression.decompress(codec, bytes(payload),
                                                        batch_decompressed_bytes_max))
        except compression.DecompressionError as exc:
            raise RecordBatchError(ErrorCode.MESSAGE_TOO_LARGE if exc.too_large
                                   else ErrorCode.CORRUPT_MESSAGE, str(exc)) from exc
    elif len(payload) > batch_decompressed_bytes_max:
        raise RecordBatchError(ErrorCode.MESSAGE_TOO_LARGE, f"records of {len(payload)} bytes are "
                               f"over {batch_decompressed_bytes_max} (batch_decompressed_bytes_max)")
    log_append_time = max_timestamp if attributes & _TIMESTAMP_TYPE_BIT else None
    parsed = _parse_records(payload, count, first_timestamp, log_append_time)
    return ProducedBatch(producer_id, producer_epoch, base_sequence, last_offset_delta,
                         first_timestamp, max(record.timestamp_ms for record in parsed), codec,
                         bool(attributes & _TRANSACTIONAL_BIT), parsed, len(data))


def _check_attributes(codec: int, attributes: int, api_version: int) -> None:
    if codec not in compression.CODEC_NAMES:
        raise RecordBatchError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"record batch uses unknown "
                               f"compression codec {codec} (known: 0 none, 1 gzip, 2 snappy, "
                               "3 lz4, 4 zstd)")
    if codec == compression.ZSTD and api_version < 7:
        raise RecordBatchError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"zstd batches need Produce "
                               f"v7 or later; this request is v{api_version}")
    if attributes & _CONTROL_BIT:
        raise RecordBatchError(ErrorCode.INVALID_RECORD, "clients may not produce control batches")


def _parse_records(data: memoryview, count: int, first_timestamp: int,
                   log_append_time: int | None) -> tuple[Record, ...]:
    records = []
    position = 0
    for index in range(count):
        if position >= len(data):
            raise _corrupt(f"records end after {index} of the {count} the batch header counts")
        length, position = _varint(data, position)
        end = position + length
        if length < 1 or end > len(data):
            raise _corrupt(f"record {index} of length {length} runs past its batch")
        position += 1  # record attributes: unused in magic 2
        timestamp_delta, position = _varint(data, position, end)
        offset_delta, position = _varint(data, position, end)
        if offset_delta != index:
            raise RecordBatchError(ErrorCode.INVALID_RECORD, f"record {index} has offset delta "
                                   f"{offset_delta}; a produced batch numbers its records 0..n-1")
        key, position = _bytes(data, position, end)
        value, position = _bytes(data, position, end)
        headers, position = _headers(data, position, end)
        if position != end:
            raise _corrupt(f"record {index} says {length} bytes and its fields take "
                           f"{length + position - end}")
        timestamp = log_append_time if log_append_time is not None else first_timestamp + timestamp_delta
        records.append(Record(timestamp, key, value, headers))
    if position != len(data):
        raise _corrupt(f"{len(data) - position} bytes follow the batch's {count} records")
    return tuple(records)


def _headers(data: memoryview, position: int, end: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    header_count, position = _varint(data, position, end)
    if header_count < 0:
        raise _corrupt(f"record has {header_count} headers")
    headers = []
    for _ in range(header_count):
        name, position = _bytes(data, position, end)
        if name is None:
            raise _corrupt("a record header has a null name")
        try:
            text = name.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _corrupt(f"a record header name is not UTF-8 ({exc})") from exc
        value, position = _bytes(data, position, end)
        headers.append((text, value))
    return tuple(headers), position


def _bytes(data: memoryview, position: int, end: int) -> tuple[bytes | None, int]:
    length, position = _varint(data, position, end)
    if length < 0:
        return None, position
    if position + length > end:
        raise _corrupt(f"a field of {length} bytes runs past its record")
    return bytes(data[position: position + length]), position + length


def _varint(data: memoryview, position: int, end: int | None = None) -> tuple[int, int]:
    """A zigzag varint (Kafka's varint and varlong) at `position`, not reading at or past `end`."""
    limit = len(data) if end is None else end
    result = shift = 0
    while True:
        if position >= limit:
            raise _corrupt("a record ends inside a varint")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7
        if shift > 63:
            raise _corrupt("a varint is longer than 10 bytes")


def _corrupt(message: str) -> RecordBatchError:
    return RecordBatchError(ErrorCode.CORRUPT_MESSAGE, message)


def encode_record_batch(base_offset: int, records: Sequence[Record]) -> bytes:
    """An uncompressed magic-2 batch of `records` whose first record is at stream position
    `base_offset`, for a Fetch response's records field (batches of one partition concatenate)."""
    if not records:
        return b""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression.NONE,
                                        is_transactional=False, producer_id=-1, producer_epoch=-1,
                                        base_sequence=-1, batch_size=sys.maxsize)
    for delta, record in enumerate(records):
        builder.append(delta, timestamp=record.timestamp_ms, key=record.key, value=record.value,
                       headers=list(record.headers))
    batch = builder.build()
    _BASE_OFFSET.pack_into(batch, 0, base_offset)  # the CRC covers attributes onward, not this
    return bytes(batch)
