"""Record batches (magic 2): a Produce partition's record set in, records out; records in, a
batch for a Fetch response out.

Decoding follows the order in which a Kafka broker checks a produced batch: exactly one batch of
magic 2 (INVALID_RECORD otherwise: Produce v3+ carries nothing else), its size against
`batch_bytes_max` (MESSAGE_TOO_LARGE), its CRC-32C over everything after the CRC field
(CORRUPT_MESSAGE), its codec (zstd needs Produce v7: UNSUPPORTED_COMPRESSION_TYPE), then the
records, decompressed within `batch_decompressed_bytes_max`. The rule for the two refusal codes:
bytes that do not parse are CORRUPT_MESSAGE; a batch that parses but breaks a rule a producer must
follow (a control batch, a record count or offset deltas other than 0..n-1) is INVALID_RECORD.

Encoding writes uncompressed batches from the records' columns (`encode_record_columns`: the
varints from a table, the CRC-32C by crc32c), as kafka-python's batch builder would (the tests
read them back with it).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

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


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs 6x, once per produced record
class Record:
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(slots=True)  # not frozen, as Record: one per produced batch, on the hot path
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
    """The hot loop of a produce: one-byte varints (lengths below 64, the first deltas) are read
    inline, longer ones by `_varint`; the payload is copied to bytes once, so each key and
    value is one slice."""
    records: list[Record] = []
    append = records.append
    raw = bytes(data)
    size = len(raw)
    position = 0
    for index in range(count):
        if position >= size:
            raise _corrupt(f"records end after {index} of the {count} the batch header counts")
        byte = raw[position]
        if byte < 0x80:
            length, position = (byte >> 1) ^ -(byte & 1), position + 1
        elif position + 1 < size and (second := raw[position + 1]) < 0x80:
            word = (byte & 0x7F) | (second << 7)
            length, position = (word >> 1) ^ -(word & 1), position + 2
        else:
            length, position = _varint(raw, position)
        end = position + length
        if length < 1 or end > size:
            raise _corrupt(f"record {index} of length {length} runs past its batch")
        byte = raw[position + 1] if position + 1 < end else 0x80  # after the record attributes (unused)
        if byte < 0x80:
            timestamp_delta, position = (byte >> 1) ^ -(byte & 1), position + 2
        else:
            timestamp_delta, position = _varint(raw, position + 1, end)
        byte = raw[position] if position < end else 0x80
        if byte < 0x80:
            offset_delta, position = (byte >> 1) ^ -(byte & 1), position + 1
        elif position + 1 < end and (second := raw[position + 1]) < 0x80:
            word = (byte & 0x7F) | (second << 7)
            offset_delta, position = (word >> 1) ^ -(word & 1), position + 2
        else:
            offset_delta, position = _varint(raw, position, end)
        if offset_delta != index:
            raise RecordBatchError(ErrorCode.INVALID_RECORD, f"record {index} has offset delta "
                                   f"{offset_delta}; a produced batch numbers its records 0..n-1")
        key, position = _bytes(raw, position, end)
        value, position = _bytes(raw, position, end)
        if position < end and raw[position] == 0:  # no headers: the usual case
            headers: tuple[tuple[str, bytes | None], ...] = ()
            position += 1
        else:
            headers, position = _headers(raw, position, end)
        if position != end:
            raise _corrupt(f"record {index} says {length} bytes and its fields take "
                           f"{length + position - end}")
        append(Record(log_append_time if log_append_time is not None else first_timestamp + timestamp_delta,
                      key, value, headers))
    if position != size:
        raise _corrupt(f"{size - position} bytes follow the batch's {count} records")
    return tuple(records)


def _headers(data: bytes, position: int, end: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
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


def _bytes(data: bytes, position: int, end: int) -> tuple[bytes | None, int]:
    byte = data[position] if position < end else 0x80
    if byte < 0x80:
        length, position = (byte >> 1) ^ -(byte & 1), position + 1
    else:
        length, position = _varint(data, position, end)
    if length < 0:
        return None, position
    if position + length > end:
        raise _corrupt(f"a field of {length} bytes runs past its record")
    return data[position: position + length], position + length


def _varint(data: bytes | memoryview, position: int, end: int | None = None) -> tuple[int, int]:
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
    return encode_record_columns(base_offset, [record.timestamp_ms for record in records],
                                 [record.key for record in records], [record.value for record in records],
                                 [record.headers for record in records])


def encode_record_columns(base_offset: int, timestamps_ms: Sequence[int], keys: Sequence[bytes | None],
                          values: Sequence[bytes | None],
                          headers: Sequence[Sequence[tuple[str, bytes | None]] | None] | None = None,
                          offset_deltas: Sequence[int] | None = None) -> bytes:
    """The same batch from columns (a record per index; `headers` None: none has any). The hot
    loop of a fetch: each record is its varints (from a table below 2**13) and its bytes, joined
    once with the batch header; the CRC-32C is crc32c's (C). `offset_deltas`: each record's offset
    minus `base_offset`, increasing from 0, for records with gaps between them (a compacted
    segment's kept records); None: the records are at consecutive offsets."""
    count = len(values)
    if count == 0:
        return b""
    first = timestamps_ms[0]
    varint = _VARINTS
    parts: list[bytes] = [b""]  # the batch header, once the records are known
    extend = parts.extend
    no_headers = b"\x00"
    for index in range(count):
        key, value = keys[index], values[index]
        delta = timestamps_ms[index] - first
        zigzag = (delta << 1) ^ (delta >> 63)
        stamp = varint[zigzag] if zigzag < _VARINTS_MAX else _encode_varint(delta)
        step = index if offset_deltas is None else offset_deltas[index]
        offset = varint[step << 1] if step < _VARINTS_MAX >> 1 else _encode_varint(step)
        key_length = b"\x01" if key is None else (varint[len(key) << 1] if len(key) < _VARINTS_MAX >> 1
                                                   else _encode_varint(len(key)))
        value_length = b"\x01" if value is None else (varint[len(value) << 1] if len(value) < _VARINTS_MAX >> 1
                                                       else _encode_varint(len(value)))
        pairs = headers[index] if headers is not None else None
        tail = _encode_headers(pairs) if pairs else no_headers
        length = (1 + len(stamp) + len(offset) + len(key_length) + (len(key) if key else 0) + len(value_length)
                  + (len(value) if value else 0) + len(tail))
        extend((_encode_varint(length), no_headers, stamp, offset, key_length, key or b"", value_length,
                value or b"", tail))
    records = b"".join(parts)
    last_delta = count - 1 if offset_deltas is None else offset_deltas[-1]
    after_crc = _AFTER_CRC.pack(0, last_delta, first, max(timestamps_ms), -1, -1, -1, count) + records
    return b"".join((_BEFORE_CRC.pack(base_offset, _HEADER.size - _LENGTH_END + len(records), 0, 2,
                                      crc32c.crc32c(after_crc)), after_crc))


def _encode_headers(pairs: Sequence[tuple[str, bytes | None]]) -> bytes:
    parts = [_encode_varint(len(pairs))]
    for name, value in pairs:
        raw = name.encode()
        parts += (_encode_varint(len(raw)), raw)
        parts += (b"\x01",) if value is None else (_encode_varint(len(value)), value)
    return b"".join(parts)


def _encode_varint(number: int) -> bytes:
    """Kafka's zigzag varint (and varlong) of `number`."""
    zigzag = (number << 1) ^ (number >> 63)
    if 0 <= zigzag < _VARINTS_MAX:
        return _VARINTS[zigzag]
    return _varint_bytes(zigzag & ((1 << 64) - 1))


def _varint_bytes(zigzag: int) -> bytes:
    """The varint bytes of an already zigzagged number (7 bits a byte, low first)."""
    out = bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


_VARINTS_MAX = 1 << 14  # zigzag values with a ready encoding (one or two bytes)
_VARINTS = [_varint_bytes(zigzag) for zigzag in range(_VARINTS_MAX)]
# the batch header around its CRC: base offset, length, leader epoch, magic, crc | attributes on
_BEFORE_CRC = struct.Struct(">qiibI")
_AFTER_CRC = struct.Struct(">hiqqqhii")
