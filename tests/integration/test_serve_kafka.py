"""`dlog serve` serves real dlog streams to real Kafka clients (librdkafka through confluent-kafka,
kafka-python, aiokafka), each in its own process or thread against a `dlog serve` process on a
real cluster: what a producer writes reads back identically through Kafka consumers and through
`open_reader`/`dlog read` (keys, values, headers, timestamps; the Kafka offset is the stream
position), and what a native writer wrote reads back through Kafka consumers."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Callable

import pytest

from dlog import Namespace
from tests.helpers import dlog_runner
from tests.integration.serving import ServeProcess, serve_processes

RECORD_COUNT = 40
DEADLINE_S = 60.0

Records = list[tuple[bytes | None, bytes, tuple, int]]


@pytest.fixture
def serve(cluster_factory) -> Iterator[Callable[..., ServeProcess]]:
    with serve_processes(cluster_factory) as start:
        yield start


@pytest.fixture
def namespace() -> str:
    return f"kafka-{uuid.uuid4().hex[:8]}"


def expected_records(tag: str, count: int = RECORD_COUNT) -> Records:
    """(key, value, headers, timestamp ms): a null key now and then, headers on every other."""
    base = 1_700_000_000_000
    return [(None if n % 7 == 0 else f"key-{n}".encode(), f"{tag}-value-{n}".encode() * (n % 3 + 1),
             (("trace", f"t{n}".encode()), ("origin", tag.encode())) if n % 2 else (),
             base + n * 11) for n in range(count)]


# ------------------------------------------------------------------ the clients, each as a user would drive it


def librdkafka_produce(bootstrap: str, topic: str, records: Records, **config: object) -> list[int]:
    """Produce and return the offsets the server acknowledged, in order."""
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    offsets: list[int] = []
    failures: list[object] = []

    def delivered(error: object, message: object) -> None:
        if error is not None:
            failures.append(error)
        else:
            offsets.append(message.offset())  # type: ignore[attr-defined]

    for key, value, headers, timestamp in records:
        producer.produce(topic, value=value, key=key, headers=list(headers), timestamp=timestamp,
                         on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(DEADLINE_S) == 0 and failures == [], failures
    return offsets


def librdkafka_read(bootstrap: str, topic: str, count: int, start: int = 0) -> list[tuple]:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"unused-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, start)])
    got: list[tuple] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        assert message.error() is None, message.error()
        got.append((message.offset(), message.key(), message.value(), tuple(message.headers() or ()),
                    message.timestamp()[1]))
    consumer.close()
    return got


def kafka_python_round_trip(bootstrap: str, topic: str, records: Records) -> tuple[list[int], list[tuple]]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type="gzip", linger_ms=5)
    futures = [producer.send(topic, value=value, key=key, headers=list(headers), timestamp_ms=timestamp)
               for key, value, headers, timestamp in records]
    producer.flush(DEADLINE_S)
    offsets = [future.get(DEADLINE_S).offset for future in futures]
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    got: list[tuple] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < len(records) and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            got.extend((m.offset, m.key, m.value, tuple(m.headers), m.timestamp) for m in batch)
    consumer.close()
    return offsets, got


async def aiokafka_round_trip(bootstrap: str, topic: str, records: Records) -> tuple[list[int], list[tuple]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type="lz4", enable_idempotence=True)
    await producer.start()
    try:
        sent = [await producer.send(topic=topic, value=value, key=key, headers=list(headers), timestamp_ms=timestamp)
                for key, value, headers, timestamp in records]
        offsets = [(await future).offset for future in sent]
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    got: list[tuple] = []
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        async with asyncio.timeout(DEADLINE_S):
            while len(got) < len(records):
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend((m.offset, m.key, m.value, tuple(m.headers), m.timestamp) for m in batch)
    finally:
        await consumer.stop()
    return offsets, got


async def native_records(zk: str, zk_root: str, namespace: str, stream: str, count: int) -> list[tuple]:
    async with Namespace(zk, namespace, bookkeeper_root=zk_root) as ns:
        async with ns.open_reader(stream, "earliest", headers=True) as reader:
            got = []
            async with asyncio.timeout(DEADLINE_S):
                async for record in reader:
                    got.append((record.position, record.key, record.value, tuple(record.headers or ()),
                                record.timestamp_ms))
                    if len(got) == count:
                        return got
    return got


def with_offsets(records: Records, first: int = 0) -> list[tuple]:
    return [(first + n, key, value, headers, timestamp) for n, (key, value, headers, timestamp) in enumerate(records)]


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("client", ["librdkafka", "kafka-python", "aiokafka"])
async def test_each_client_produces_and_reads_back_through_a_server_and_natively(cluster_factory, serve, namespace,
                                                                                 client):
    cluster = cluster_factory(bookies=1)
    server = serve(cluster, namespace, "--auto-create-topics")
    topic = f"orders-{client}"
    records = expected_records(client)
    if client == "librdkafka":
        offsets = await asyncio.to_thread(librdkafka_produce, server.bootstrap, topic, records,
                                          **{"enable.idempotence": True, "compression.type": "zstd"})
        got = await asyncio.to_thread(librdkafka_read, server.bootstrap, topic, len(records))
    elif client == "kafka-python":
        offsets, got = await asyncio.to_thread(kafka_python_round_trip, server.bootstrap, topic, records)
    else:
        offsets, got = await aiokafka_round_trip(server.bootstrap, topic, records)
    assert offsets == list(range(len(records)))  # the base offset is the first record's stream position
    assert got == with_offsets(records)
    # the same records, natively: position = Kafka offset; headers, keys, timestamps as produced
    assert await native_records(cluster.zk_address, cluster.zk_root, namespace, topic, len(records)) == \
        with_offsets(records)
    run = dlog_runner(cluster.zk_address, cluster.zk_root, namespace)
    lines = [json.loads(line) for line in run("read", topic, "--json", "--to", str(len(records) - 1)).stdout.splitlines()]
    assert [line["position"] for line in lines] == list(range(len(records)))
    assert server.stop() == 0


async def test_native_records_read_back_through_kafka_consumers(cluster_factory, serve, namespace):
    cluster = cluster_factory(bookies=1)
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        await ns.create_stream("native", ensemble=1, write_quorum=1, ack_quorum=1)
        async with ns.open_writer("native") as writer:
            for key, value, headers, timestamp in expected_records("native"):
                await writer.write(value, key, timestamp, list(headers) or None)
    server = serve(cluster, namespace)
    got = await asyncio.to_thread(librdkafka_read, server.bootstrap, "native", RECORD_COUNT)
    assert got == with_offsets(expected_records("native"))
    got = await asyncio.to_thread(librdkafka_read, server.bootstrap, "native", RECORD_COUNT - 25, 25)
    assert got == with_offsets(expected_records("native")[25:], 25)


# ------------------------------------------------------------------ many producers, one stream


def test_eight_producers_into_one_topic_each_in_its_order_once(cluster_factory, serve, namespace):
    cluster = cluster_factory(bookies=1)
    server = serve(cluster, namespace, "--auto-create-topics")
    producers, per_producer = 8, 5_000

    def produce(index: int) -> list[int]:
        records = [(None, f"p{index}-{n}".encode(), (), 1_700_000_000_000 + n) for n in range(per_producer)]
        return librdkafka_produce(server.bootstrap, "shared", records, **{"linger.ms": 2, "batch.num.messages": 500})

    async def all_at_once() -> list[list[int]]:
        return await asyncio.gather(*(asyncio.to_thread(produce, index) for index in range(producers)))

    started = time.monotonic()
    offsets = asyncio.run(all_at_once())
    elapsed = time.monotonic() - started
    print(f"{producers * per_producer} records from {producers} librdkafka producers in {elapsed:.2f} s")
    every = sorted(offset for one in offsets for offset in one)
    assert every == list(range(producers * per_producer))  # each record acknowledged once, densely
    for one in offsets:
        assert one == sorted(one)  # a producer's records keep its order in the stream
    got = librdkafka_read(server.bootstrap, "shared", producers * per_producer)
    assert len(got) == producers * per_producer and [item[0] for item in got] == every
    seen: dict[str, list[int]] = {}
    for _, _, value, _, _ in got:
        producer, number = value.decode().split("-")
        seen.setdefault(producer, []).append(int(number))
    assert seen == {f"p{index}": list(range(per_producer)) for index in range(producers)}
    run = dlog_runner(cluster.zk_address, cluster.zk_root, namespace)
    natively = [json.loads(line) for line in
                run("read", "shared", "--json", "--to", str(producers * per_producer - 1)).stdout.splitlines()]
    assert [(line["position"], line["value"]) for line in natively] == \
        [(offset, value.decode()) for offset, _, value, _, _ in got]
