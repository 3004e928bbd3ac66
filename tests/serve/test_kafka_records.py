"""Record batches: what kafka-python's producer builds (every codec) decodes to the same records,
what dlog encodes for Fetch is what kafka-python's consumer reads, and each bad batch gets the
partition error Kafka answers with."""

from __future__ import annotations

import struct

import crc32c
import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from dlog.serve.kafka import BatchRefused, ErrorCode, ProducedBatch, Record, decode_produce_records, encode_record_batch
from dlog.serve.kafka.compression import CODEC_NAMES, GZIP, LZ4, NONE, SNAPPY, ZSTD
from dlog.serve.kafka.records import encode_record_columns

RECORDS = [Record(1_700_000_000_000 + n * 7, None if n % 4 == 0 else b"key-%d" % n,
                  None if n == 3 else b"value-%d" % n * (n % 5 + 1),
                  (("trace", b"t%d" % n), ("empty", None), ("ü", b"")) if n % 2 else ())
           for n in range(50)]


def build(records=RECORDS, codec=NONE, producer_id=-1, producer_epoch=-1, base_sequence=-1,
          transactional=False) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=transactional,
                                        producer_id=producer_id, producer_epoch=producer_epoch,
                                        base_sequence=base_sequence, batch_size=1 << 30)
    for delta, record in enumerate(records):
        builder.append(delta, timestamp=record.timestamp_ms, key=record.key, value=record.value,
                       headers=list(record.headers))
    return bytes(builder.build())


def reseal(batch: bytearray) -> bytes:
    """`batch` with its CRC-32C recomputed, so a test reaches the check after the CRC."""
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def refused(records, version=7, **limits) -> BatchRefused:
    result = decode_produce_records(records, version, **limits)
    assert isinstance(result, BatchRefused), result
    return result


@pytest.mark.parametrize("codec", sorted(CODEC_NAMES), ids=[CODEC_NAMES[c] for c in sorted(CODEC_NAMES)])
def test_a_batch_from_kafka_pythons_builder_decodes_to_its_records_with_every_codec(codec):
    batch = decode_produce_records(build(codec=codec, producer_id=4000, producer_epoch=3,
                                         base_sequence=2**31 - 10), 7)
    assert isinstance(batch, ProducedBatch), batch
    assert batch.records == tuple(RECORDS)
    assert batch.compression == codec
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (4000, 3, 2**31 - 10)
    assert (batch.record_count, batch.last_offset_delta) == (50, 49)
    assert batch.last_sequence == 39  # sequences wrap after 2**31 - 1
    assert batch.max_timestamp_ms == max(record.timestamp_ms for record in RECORDS)
    assert not batch.transactional


def test_an_encoded_batch_is_read_by_kafka_python_at_its_base_offset():
    wire = encode_record_batch(1_000_000, RECORDS)
    read = DefaultRecordBatch(wire)
    assert read.validate_crc() and read.magic == 2 and read.base_offset == 1_000_000
    got = [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in read]
    assert got == [(1_000_000 + n, r.timestamp_ms, r.key, r.value, r.headers) for n, r in enumerate(RECORDS)]
    assert decode_produce_records(wire, 7).records == tuple(RECORDS)  # and by this codec
    assert encode_record_batch(5, []) == b""


def test_records_with_gaps_between_their_offsets_are_read_by_kafka_python_at_those_offsets():
    """A compacted segment's kept records: each at its own offset, the batch's last offset delta the
    last record's, byte for byte what kafka-python's builder writes for the same offsets."""
    deltas = [0, 1, 5, 9, 200, 20_000]  # past the varint table too
    records = RECORDS[:len(deltas)]
    wire = encode_record_columns(700, [r.timestamp_ms for r in records], [r.key for r in records],
                                 [r.value for r in records], [r.headers for r in records], deltas)
    read = DefaultRecordBatch(wire)
    assert read.validate_crc() and read.base_offset == 700
    assert [r.offset for r in read] == [700 + delta for delta in deltas]
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 40)
    for delta, record in zip(deltas, records, strict=True):
        builder.append(delta, timestamp=record.timestamp_ms, key=record.key, value=record.value,
                       headers=list(record.headers))
    expected = bytearray(builder.build())
    expected[:8] = (700).to_bytes(8, "big")
    assert wire == bytes(expected)


def test_a_wrong_crc_is_corrupt_message():
    batch = bytearray(build())
    batch[-1] ^= 0x01
    assert refused(bytes(batch)).error == ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_a_batch_of_another_magic_is_invalid_record(magic):
    batch = bytearray(build())
    batch[16] = magic
    assert refused(bytes(batch)).error == ErrorCode.INVALID_RECORD


@pytest.mark.parametrize("records,error", [
    (None, ErrorCode.INVALID_RECORD), (b"", ErrorCode.INVALID_RECORD),
    (build() + build(), ErrorCode.INVALID_RECORD),  # Produce v3+ carries exactly one batch
    (build()[:-3], ErrorCode.CORRUPT_MESSAGE),  # truncated: the length runs past the bytes
], ids=["null", "empty", "two-batches", "truncated"])
def test_a_partition_record_set_that_is_not_exactly_one_batch_is_refused(records, error):
    assert refused(records).error == error


def test_a_batch_over_batch_bytes_max_is_message_too_large_before_its_crc_is_read():
    batch = build()
    assert isinstance(decode_produce_records(batch, 7, batch_bytes_max=len(batch)), ProducedBatch)
    damaged = bytearray(batch)
    damaged[-1] ^= 0x01
    assert refused(bytes(damaged), batch_bytes_max=len(batch) - 1).error == ErrorCode.MESSAGE_TOO_LARGE


@pytest.mark.parametrize("codec", [NONE, GZIP, SNAPPY, LZ4, ZSTD], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_records_that_decompress_past_the_bound_are_message_too_large(codec):
    bomb = build([Record(1, None, bytes(200_000))], codec=codec)  # zeros: compresses to a few bytes
    assert len(bomb) < 20_000 or codec == NONE
    assert isinstance(decode_produce_records(bomb, 7, batch_decompressed_bytes_max=300_000), ProducedBatch)
    result = refused(bomb, batch_decompressed_bytes_max=100_000)
    assert result.error == ErrorCode.MESSAGE_TOO_LARGE and "batch_decompressed_bytes_max" in result.reason


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD], ids=["gzip", "snappy", "lz4", "zstd"])
def test_compressed_records_that_do_not_decompress_are_corrupt_message(codec):
    batch = bytearray(build(codec=codec))
    del batch[-8:]  # the compressed payload ends early; length and CRC say it is whole
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    assert refused(reseal(batch)).error == ErrorCode.CORRUPT_MESSAGE


def test_zstd_needs_produce_v7():
    batch = build(codec=ZSTD)
    assert refused(batch, version=6).error == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    assert isinstance(decode_produce_records(batch, 7), ProducedBatch)


def test_a_control_batch_from_a_client_is_invalid_record():
    batch = bytearray(build())
    struct.pack_into(">h", batch, 21, 0x20)
    assert refused(reseal(batch)).error == ErrorCode.INVALID_RECORD


def test_a_record_count_that_disagrees_with_the_records_is_refused():
    batch = bytearray(build())
    struct.pack_into(">i", batch, 57, 51)  # count 51, last offset delta still 49
    assert refused(reseal(batch)).error == ErrorCode.INVALID_RECORD
    struct.pack_into(">i", batch, 23, 50)  # both say 51 records; 50 are there
    assert refused(reseal(batch)).error == ErrorCode.CORRUPT_MESSAGE


def test_a_record_that_runs_past_its_batch_is_corrupt_message():
    batch = bytearray(build([Record(5, b"k", b"v")]))
    batch[61] = 0x7E  # the record's length varint: 63 bytes, far more than are there
    assert refused(reseal(batch)).error == ErrorCode.CORRUPT_MESSAGE


def test_a_transactional_batch_is_decoded_and_said_to_be_transactional():
    batch = decode_produce_records(build(producer_id=9, producer_epoch=0, base_sequence=0,
                                         transactional=True), 7)
    assert batch.transactional  # the server decides (dlog has no transactions)


def bomb(codec: int, size_bytes: int) -> bytes:
    """`size_bytes` of zeros compressed with `codec`, built in chunks (never whole in memory)."""
    import zlib

    import lz4.frame
    import zstandard
    chunk, chunks = bytes(1 << 20), size_bytes >> 20
    if codec == GZIP:
        compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return b"".join(compressor.compress(chunk) for _ in range(chunks)) + compressor.flush()
    if codec == LZ4:
        compressor = lz4.frame.LZ4FrameCompressor(block_linked=False)
        return compressor.begin() + b"".join(compressor.compress(chunk) for _ in range(chunks)) + compressor.flush()
    compressor = zstandard.ZstdCompressor().compressobj()
    return b"".join(compressor.compress(chunk) for _ in range(chunks)) + compressor.flush()


@pytest.mark.parametrize("codec", [GZIP, LZ4, ZSTD], ids=["gzip", "lz4", "zstd"])
def test_a_decompression_bomb_is_refused_without_inflating_it(codec):
    import tracemalloc
    payload = bomb(codec, 256 << 20)  # 256 MiB of zeros in a few hundred KiB
    batch = bytearray(build([Record(1, None, b"x")]))  # one real record, then the bomb as payload
    batch[61:] = payload
    struct.pack_into(">h", batch, 21, codec)
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    sealed = reseal(batch)
    tracemalloc.start()
    try:
        result = decode_produce_records(sealed, 7, batch_bytes_max=len(sealed),
                                        batch_decompressed_bytes_max=1 << 20)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(result, BatchRefused) and result.error == ErrorCode.MESSAGE_TOO_LARGE
    assert peak_bytes < 16 << 20, f"decoding took {peak_bytes >> 20} MiB for a 1 MiB bound"


def test_the_columnar_encoder_writes_what_kafka_pythons_builder_writes_byte_for_byte():
    """Every varint width: timestamps before and far after the first, keys, values and header
    names and values past the 2**13 table, null keys, values and header values, 20,000 records."""
    records = [Record(1_700_000_000_000 + (n - 3) * 1_000_003 * (n % 5), None if n % 3 == 0 else b"k" * (n % 9000),
                      None if n == 7 else bytes(n % 20000),
                      (("h" * (n % 9000), None if n % 2 else b"v" * n),) if n % 11 == 0 else ())
               for n in range(20_000)]
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 40)
    for delta, record in enumerate(records):
        builder.append(delta, timestamp=record.timestamp_ms, key=record.key, value=record.value,
                       headers=list(record.headers))
    expected = bytearray(builder.build())
    expected[:8] = (123_456_789).to_bytes(8, "big")  # the base offset, outside the CRC
    assert encode_record_batch(123_456_789, records) == bytes(expected)
