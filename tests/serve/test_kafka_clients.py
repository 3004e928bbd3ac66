"""Real Kafka clients (librdkafka through confluent-kafka, kafka-python, aiokafka) produce records
with keys, headers and timestamps to a test-only broker built on dlog.serve.kafka and consume
them back identically through a consumer group; librdkafka compresses with every codec."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from dlog.serve.kafka import ErrorCode
from dlog.serve.kafka.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD
from tests.serve.memory_broker import MemoryBroker

RECORD_COUNT = 40
DEADLINE_S = 60.0
CODECS = {"none": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}


def expected_records(tag: str) -> list[tuple[bytes | None, bytes, tuple, int]]:
    """(key, value, headers, timestamp ms): a null key now and then, headers on every other."""
    base = 1_700_000_000_000
    return [(None if n % 7 == 0 else f"key-{n}".encode(), f"{tag}-value-{n}".encode() * (n % 3 + 1),
             (("trace", f"t{n}".encode()), ("origin", tag.encode())) if n % 2 else (),
             base + n * 11) for n in range(RECORD_COUNT)]


@pytest.fixture
async def broker() -> AsyncIterator[MemoryBroker]:
    server = MemoryBroker()
    await server.start()
    yield server
    await server.stop()


def assert_served_without_closing(broker: MemoryBroker) -> None:
    """Only ApiVersions at a version newer than ours may be refused (and it is answered)."""
    closing = [refusal for refusal in broker.refusals if refusal.close_connection]
    assert not closing, closing
    assert all(refusal.error == ErrorCode.UNSUPPORTED_VERSION for refusal in broker.refusals)


# ------------------------------------------------------------------ librdkafka (confluent-kafka)


def librdkafka_produce(port: int, topic: str, codec: str, records) -> None:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "compression.type": codec,
                         "enable.idempotence": True, "linger.ms": 20})
    failures = []
    for key, value, headers, timestamp in records:
        producer.produce(topic, value=value, key=key, headers=list(headers), timestamp=timestamp,
                         on_delivery=lambda error, message: error and failures.append(error))
    assert producer.flush(DEADLINE_S) == 0 and failures == []


def librdkafka_consume(port: int, topic: str, group: str, count: int) -> list:
    from confluent_kafka import Consumer
    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got, deadline = [], time.monotonic() + DEADLINE_S
    while len(got) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        assert message.error() is None, message.error()
        got.append((message.key(), message.value(), tuple(message.headers() or ()), message.timestamp()[1]))
    consumer.commit(asynchronous=False)
    consumer.close()
    return got


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_librdkafka_compresses_with_each_codec_and_reads_back_through_a_group(broker, codec):
    records = expected_records(codec)
    await asyncio.to_thread(librdkafka_produce, broker.port, f"topic-{codec}", codec, records)
    # each batch arrived compressed with the codec asked for, by an idempotent producer
    assert {batch.compression for batch in broker.produced} == {CODECS[codec]}
    assert all(batch.producer_id >= 1000 and batch.base_sequence >= 0 for batch in broker.produced)
    got = await asyncio.to_thread(librdkafka_consume, broker.port, f"topic-{codec}", f"group-{codec}", RECORD_COUNT)
    assert got == records
    assert broker.groups[f"group-{codec}"].offsets[(f"topic-{codec}", 0)][0] == RECORD_COUNT
    assert_served_without_closing(broker)


# ------------------------------------------------------------------ kafka-python


def kafka_python_round_trip(port: int, topic: str, records) -> list:
    from kafka import KafkaConsumer, KafkaProducer
    producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", compression_type="gzip",
                             linger_ms=20)
    for key, value, headers, timestamp in records:
        producer.send(topic, value=value, key=key, headers=list(headers), timestamp_ms=timestamp)
    producer.flush(DEADLINE_S)
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=f"127.0.0.1:{port}", group_id="kafka-python",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    got, deadline = [], time.monotonic() + DEADLINE_S
    while len(got) < len(records) and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            got.extend((m.key, m.value, tuple(m.headers), m.timestamp) for m in batch)
    consumer.commit()
    consumer.close()
    return got


async def test_kafka_python_produces_and_consumes_through_a_group(broker):
    records = expected_records("kafka-python")
    got = await asyncio.to_thread(kafka_python_round_trip, broker.port, "topic-kafka-python", records)
    assert got == records
    assert {batch.compression for batch in broker.produced} == {GZIP}
    assert broker.groups["kafka-python"].offsets[("topic-kafka-python", 0)][0] == RECORD_COUNT
    assert_served_without_closing(broker)


# ------------------------------------------------------------------ aiokafka


async def test_aiokafka_produces_idempotently_and_consumes_through_a_group(broker):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    records = expected_records("aiokafka")
    bootstrap = f"127.0.0.1:{broker.port}"
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type="lz4", enable_idempotence=True)
    await producer.start()
    try:
        for key, value, headers, timestamp in records:
            await producer.send(topic="topic-aiokafka", value=value, key=key, headers=list(headers),
                                timestamp_ms=timestamp)
        await producer.flush()
    finally:
        await producer.stop()
    assert {batch.compression for batch in broker.produced} == {LZ4}
    consumer = AIOKafkaConsumer("topic-aiokafka", bootstrap_servers=bootstrap, group_id="aiokafka",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    got = []
    try:
        async with asyncio.timeout(DEADLINE_S):
            while len(got) < RECORD_COUNT:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend((m.key, m.value, tuple(m.headers), m.timestamp) for m in batch)
        await consumer.commit()
    finally:
        await consumer.stop()
    assert got == records
    assert broker.groups["aiokafka"].offsets[("topic-aiokafka", 0)][0] == RECORD_COUNT
    assert_served_without_closing(broker)
