"""`dlog serve` serves real dlog streams to real Kafka clients (librdkafka through confluent-kafka,
kafka-python, aiokafka), each in its own process or thread against a `dlog serve` process on a
real cluster: what a producer writes reads back identically through Kafka consumers and through
`open_reader`/`dlog read` (keys, values, headers, timestamps; the Kafka offset is the stream
position), and what a native writer wrote reads back through Kafka consumers."""

from __future__ import annotations

import asyncio
import collections
import json
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from dlog import Namespace
from dlog_tools.cluster import LocalCluster
from tests.helpers import dlog_runner, eventually, local_clusters
from tests.integration.serving import ServeProcess, serve_processes

RECORD_COUNT = 40
DEADLINE_S = 60.0

Records = list[tuple[bytes | None, bytes, tuple, int]]


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory) -> Iterator[LocalCluster]:
    """One 1-bookie cluster for the file: each test serves a namespace of its own, and servers
    register and own streams per namespace (a cluster start each was a sixth of the file's time)."""
    with local_clusters(zk_server, tmp_path_factory.mktemp("serve-kafka"), "t", default_bookies=1) as make:
        yield make()


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
    from kafka import KafkaConsumer, KafkaProducer
    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type="gzip", linger_ms=5)
    futures = [producer.send(topic, value=value, key=key, headers=list(headers), timestamp_ms=timestamp)
               for key, value, headers, timestamp in records]
    producer.flush(DEADLINE_S)
    offsets = [future.get(DEADLINE_S).offset for future in futures]
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id="kafka-python", auto_offset_reset="earliest",
                             enable_auto_commit=False)
    got: list[tuple] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < len(records) and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            got.extend((m.offset, m.key, m.value, tuple(m.headers), m.timestamp) for m in batch)
    consumer.commit()
    consumer.close()
    return offsets, got


async def aiokafka_round_trip(bootstrap: str, topic: str, records: Records) -> tuple[list[int], list[tuple]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type="lz4", enable_idempotence=True)
    await producer.start()
    try:
        sent = [await producer.send(topic=topic, value=value, key=key, headers=list(headers), timestamp_ms=timestamp)
                for key, value, headers, timestamp in records]
        offsets = [(await future).offset for future in sent]
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id="aiokafka", auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    got: list[tuple] = []
    try:
        async with asyncio.timeout(DEADLINE_S):
            while len(got) < len(records):
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend((m.offset, m.key, m.value, tuple(m.headers), m.timestamp) for m in batch)
        await consumer.commit()
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
async def test_each_client_produces_and_reads_back_through_a_server_and_natively(cluster, serve, namespace,
                                                                                 client):
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
    read = run("read", topic, "--json", "--to", str(len(records) - 1)).stdout
    lines = [json.loads(line) for line in read.splitlines()]
    assert [line["position"] for line in lines] == list(range(len(records)))
    if client != "librdkafka":  # these consumed through a group: its commit is the group's subscription
        lag = json.loads(run("subscription", "describe", topic, client, "--json").stdout)
        assert lag["lag_records"] == 0, lag
    assert server.stop() == 0


async def test_native_records_read_back_through_kafka_consumers(cluster, serve, namespace):
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


def test_eight_producers_into_one_topic_each_in_its_order_once(cluster, serve, namespace):
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


# ------------------------------------------------------------------ failover


class PacedProducer:
    """An idempotent librdkafka producer writing numbered records to `topic` in a thread until
    stopped, at most `window` unacknowledged at a time, keeping what the server acknowledged."""

    def __init__(self, bootstrap: str, topic: str, window: int = 200) -> None:
        import threading
        self.topic, self.window = topic, window
        self.produced = 0
        self.acked: list[tuple[int, int]] = []  # (record number, offset)
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(bootstrap,), daemon=True)
        self.thread.start()

    def _run(self, bootstrap: str) -> None:
        from confluent_kafka import Producer
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                             "message.timeout.ms": 90_000, "topic.metadata.refresh.interval.ms": 1_000,
                             "reconnect.backoff.max.ms": 500})

        def delivered(error: object, message: object) -> None:
            if error is not None:
                self.failures.append(str(error))
            else:
                self.acked.append((int(message.value().decode().rsplit("-", 1)[1]), message.offset()))  # type: ignore

        deadline = time.monotonic() + 240
        while not self.stop.is_set() and time.monotonic() < deadline:
            if self.produced - len(self.acked) >= self.window:
                producer.poll(0.01)
                continue
            producer.produce(self.topic, value=f"{self.topic}-{self.produced}".encode(), on_delivery=delivered)
            self.produced += 1
            producer.poll(0)
            if self.produced % 20 == 0:
                time.sleep(0.01)
        producer.flush(120)

    def wait_acked(self, count: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while len(self.acked) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return len(self.acked) >= count


def owners(run: Callable[..., object]) -> dict[str, int]:
    servers = json.loads(run("serve", "list", "--json").stdout)["servers"]  # type: ignore[attr-defined]
    return {stream: server["id"] for server in servers for stream in server["streams"]}


def test_a_killed_server_s_streams_are_taken_without_any_client_asking(cluster, serve, namespace):
    """Proactive takeover: once the killed server's session expired, the live server that hashing
    picks takes each of its streams by itself (no client request reaches any server meanwhile)."""
    first = serve(cluster, namespace, "--auto-create-topics", "--session-timeout", "2s")
    second = serve(cluster, namespace, "--auto-create-topics", "--session-timeout", "2s")
    servers = {first.server_id: first, second.server_id: second}
    run = dlog_runner(cluster.zk_address, cluster.zk_root, namespace)
    topics = [f"idle-{n}" for n in range(6)]
    for topic in topics:
        assert librdkafka_produce(f"{first.bootstrap},{second.bootstrap}", topic, expected_records(topic, 3)) == \
            [0, 1, 2]
    owned = owners(run)
    assert set(owned) == set(topics)
    victim = max(servers, key=lambda server_id: list(owned.values()).count(server_id))
    survivor = next(iter(set(servers) - {victim}))
    victims = sorted(topic for topic, server_id in owned.items() if server_id == victim)
    assert victims  # some stream is the victim's
    servers[victim].kill()
    killed_at = time.monotonic()
    deadline_s = 2.0 + 15.0  # the session timeout, and the few seconds the expiry and the takeover take
    while set(owners(run).values()) != {survivor}:
        assert time.monotonic() - killed_at < deadline_s, owners(run)
        time.sleep(0.2)
    assert owners(run) == dict.fromkeys(topics, survivor)
    # every acknowledged record is where it was, served by the survivor
    for topic in victims:
        got = librdkafka_read_from(servers[survivor].bootstrap, topic)
        assert [offset for offset, *_ in got] == [0, 1, 2], got


def test_a_killed_server_s_streams_move_and_every_acknowledged_record_is_read_once(cluster, serve,
                                                                                     namespace):
    first = serve(cluster, namespace, "--auto-create-topics", "--session-timeout", "2s")
    second = serve(cluster, namespace, "--auto-create-topics", "--session-timeout", "2s")
    servers = {first.server_id: first, second.server_id: second}
    run = dlog_runner(cluster.zk_address, cluster.zk_root, namespace)
    topics = [f"fail-{n}" for n in range(4)]
    producers = [PacedProducer(f"{first.bootstrap},{second.bootstrap}", topic) for topic in topics]
    assert all(producer.wait_acked(300, DEADLINE_S) for producer in producers), [len(p.acked) for p in producers]
    owned = owners(run)
    assert set(owned) == set(topics)
    victim = max(servers, key=lambda server_id: list(owned.values()).count(server_id))
    servers[victim].kill()
    killed_at = time.monotonic()
    print(f"killed server {victim} at {time.strftime('%H:%M:%S')}")
    survivor = servers[next(iter(set(servers) - {victim}))]
    assert all(p.wait_acked(len(p.acked) + 200, DEADLINE_S) for p in producers), [len(p.acked) for p in producers]
    print(f"producers resumed within {time.monotonic() - killed_at:.1f} s of the kill")
    assert set(owners(run).values()) == {survivor.server_id}  # the survivor took every stream
    # the killed server comes back (same id, same port); then the survivor is killed: the streams move to it
    restarted = serve(cluster, namespace, "--auto-create-topics", "--session-timeout", "2s", "--id", str(victim),
                      "--kafka-port", str(servers[victim].port))
    survivor.kill()
    killed_at = time.monotonic()
    assert all(p.wait_acked(len(p.acked) + 200, DEADLINE_S) for p in producers), [len(p.acked) for p in producers]
    print(f"producers resumed within {time.monotonic() - killed_at:.1f} s of the second kill")
    for producer in producers:
        producer.stop.set()
    for producer in producers:
        producer.thread.join(DEADLINE_S * 2)
    assert all(not p.thread.is_alive() for p in producers)
    assert set(owners(run).values()) == {restarted.server_id}
    for producer in producers:
        assert producer.failures == [], producer.failures[:3]
        assert sorted(number for number, _ in producer.acked) == list(range(producer.produced))
        got = librdkafka_read_from(restarted.bootstrap, producer.topic)
        numbers = [int(value.decode().rsplit("-", 1)[1]) for _, _, value, _, _ in got]
        assert set(numbers) == set(range(producer.produced))  # nothing acknowledged was lost
        # the offsets acknowledged hold the records acknowledged
        by_offset = {offset: int(value.decode().rsplit("-", 1)[1]) for offset, _, value, _, _ in got}
        assert all(by_offset[offset] == number for number, offset in producer.acked)
        # a batch the killed owner made durable but could not acknowledge is resent to the new
        # owner, whose rebuilt dedup table answers it instead of writing it twice
        duplicated = sorted(number for number, times in collections.Counter(numbers).items() if times > 1)
        assert len(numbers) == producer.produced and not duplicated, (producer.topic, duplicated[:10])


def librdkafka_read_from(bootstrap: str, topic: str) -> list[tuple]:
    """Everything up to the end offset of partition 0."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"unused-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False})
    _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    consumer.close()
    return librdkafka_read(bootstrap, topic, end)


# ------------------------------------------------------------------ routing and offsets, request by request


def raw_request(address: str, message: object, version: int) -> object:
    """One request on a fresh connection; its decoded answer."""
    import socket
    import struct

    from tests.serve.samples import framed_request
    message.API_VERSION = version  # type: ignore[attr-defined]
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(framed_request(message, 7))
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = connection.recv(65536)
            assert chunk, "the server closed the connection"
            data += chunk
    assert struct.unpack(">i", data[4:8])[0] == 7
    from dlog.serve.kafka import SUPPORTED_APIS
    return SUPPORTED_APIS[message.API_KEY].response.decode(data[8:], version=version)  # type: ignore[attr-defined]


def produce_request(topic: str, values: list[bytes]) -> object:
    from kafka.protocol.producer import ProduceRequest

    from dlog.serve.kafka import Record
    from dlog.serve.kafka.records import encode_record_batch
    batch = encode_record_batch(0, [Record(1_700_000_000_000, None, value) for value in values])
    Topic = ProduceRequest.TopicProduceData
    return ProduceRequest(version=7, transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[
        Topic(name=topic, partition_data=[Topic.PartitionProduceData(index=0, records=batch)])])


def fetch_request(topic: str, offset: int, max_wait_ms: int = 0) -> object:
    from kafka.protocol.consumer import FetchRequest
    Topic = FetchRequest.FetchTopic
    return FetchRequest(version=11, replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
                        isolation_level=0, session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=[],
                        topics=[Topic(topic=topic, partitions=[Topic.FetchPartition(
                            partition=0, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
                            partition_max_bytes=1 << 20)])])


def list_offsets_request(topic: str, timestamp: int) -> object:
    from kafka.protocol.consumer import ListOffsetsRequest
    Topic = ListOffsetsRequest.ListOffsetsTopic
    return ListOffsetsRequest(version=3, replica_id=-1, isolation_level=0, topics=[Topic(name=topic, partitions=[
        Topic.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=timestamp)])])


def metadata_request(topic: str) -> object:
    from kafka.protocol.metadata import MetadataRequest
    return MetadataRequest(version=5, topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                           allow_auto_topic_creation=False)


async def test_only_the_owner_serves_a_stream_and_a_native_writer_is_told_which_server(cluster, serve,
                                                                                       namespace):
    from dlog import WriterLockedError
    from dlog.serve.kafka import ErrorCode
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        await ns.create_stream("routed", ensemble=1, write_quorum=1, ack_quorum=1)
    first, second = serve(cluster, namespace), serve(cluster, namespace)
    by_id = {first.server_id: first, second.server_id: second}
    # once each server sees the other registered (a ZooKeeper watch, so not at once: until then the
    # first one started picks from itself alone), either names the same leader, which takes the
    # stream on its first produce
    def both_see_both() -> bool:
        return all(len(raw_request(server.bootstrap, metadata_request("routed"), 5).brokers) == 2
                   for server in (first, second))
    await eventually(both_see_both, timeout_s=30, message="each server lists both servers")
    leaders = {raw_request(server.bootstrap, metadata_request("routed"), 5).topics[0].partitions[0].leader_id
               for server in (first, second)}
    assert len(leaders) == 1
    owner = by_id[leaders.pop()]
    other = second if owner is first else first
    answer = raw_request(other.bootstrap, produce_request("routed", [b"refused"]), 7)
    assert answer.responses[0].partition_responses[0].error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    answer = raw_request(owner.bootstrap, produce_request("routed", [b"a", b"b"]), 7)
    assert (answer.responses[0].partition_responses[0].error_code,
            answer.responses[0].partition_responses[0].base_offset) == (0, 0)
    answer = raw_request(other.bootstrap, fetch_request("routed", 0), 11)
    assert answer.responses[0].partitions[0].error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    answer = raw_request(owner.bootstrap, fetch_request("routed", 0), 11)
    assert answer.responses[0].partitions[0].error_code == 0 and answer.responses[0].partitions[0].high_watermark == 2
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        with pytest.raises(WriterLockedError, match=f"served by dlog server {owner.server_id} .*{owner.bootstrap}"):
            await ns.open_writer("routed")
    # a clean stop hands the stream over at once: the other server serves it on the next produce
    assert owner.stop() == 0
    answer = raw_request(other.bootstrap, produce_request("routed", [b"c"]), 7)
    assert (answer.responses[0].partition_responses[0].error_code,
            answer.responses[0].partition_responses[0].base_offset) == (0, 2)


async def test_offsets_with_native_and_kafka_writes_and_truncation(cluster, serve, namespace):
    from dlog.serve.kafka import ErrorCode
    base = 1_700_000_000_000
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        await ns.create_stream("mixed", ensemble=1, write_quorum=1, ack_quorum=1)
        async with ns.open_writer("mixed") as writer:
            for n in range(3_000):
                writer.offer(f"native-{n}".encode(), None, base + n)
            await writer.flush()
    server = serve(cluster, namespace)
    records = [(None, f"kafka-{n}".encode(), (), base + 3_000 + n) for n in range(3_000)]
    assert librdkafka_produce(server.bootstrap, "mixed", records) == list(range(3_000, 6_000))
    for offset in range(0, 6_000, 1_000):  # a fetch at every 1,000th offset starts with that record
        answer = raw_request(server.bootstrap, fetch_request("mixed", offset), 11)
        got = librdkafka_read(server.bootstrap, "mixed", 1, offset)
        kind = "native" if offset < 3_000 else "kafka"
        assert answer.responses[0].partitions[0].error_code == 0
        assert got[0][:3] == (offset, None, f"{kind}-{offset % 3_000}".encode()), got
        assert got[0][4] == base + offset
    def listed(timestamp: int) -> tuple[int, int]:
        part = raw_request(server.bootstrap, list_offsets_request("mixed", timestamp), 3).topics[0].partitions[0]
        return part.error_code, part.offset
    assert listed(-2) == (0, 0) and listed(-1) == (0, 6_000)
    assert listed(base + 4_321) == (0, 4_321) and listed(base + 10_000) == (0, 6_000)
    # truncation: a truncated offset is OFFSET_OUT_OF_RANGE, earliest moves
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        async with ns.open_reader("mixed", start=2_500) as reader:
            cut = (await reader.__anext__()).offset
        await ns.truncate("mixed", cut)
    answer = raw_request(server.bootstrap, fetch_request("mixed", 100), 11)
    assert answer.responses[0].partitions[0].error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert answer.responses[0].partitions[0].log_start_offset > 100
    earliest = listed(-2)[1]
    assert 100 < earliest <= 2_500
    assert librdkafka_read(server.bootstrap, "mixed", 1, earliest)[0][0] == earliest


# ------------------------------------------------------------------ consumer groups


class GroupMember:
    """A librdkafka consumer of a group in a thread: what it was assigned and what it read."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        import threading
        self.assigned: set[int] = set()
        self.got: list[tuple[int, int, bytes]] = []  # (partition, offset, value)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(bootstrap, group, topic), daemon=True)
        self.thread.start()

    def _run(self, bootstrap: str, group: str, topic: str) -> None:
        from confluent_kafka import Consumer
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                             "enable.auto.commit": False, "session.timeout.ms": 6_000,
                             "heartbeat.interval.ms": 500, "partition.assignment.strategy": "range"})

        def assigned(_: object, partitions: list) -> None:
            self.assigned = {partition.partition for partition in partitions}

        def revoked(_: object, partitions: list) -> None:
            self.assigned = set()

        consumer.subscribe([topic], on_assign=assigned, on_revoke=revoked)
        deadline = time.monotonic() + 120
        uncommitted = False
        while not self.stop.is_set() and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None and uncommitted:  # caught up: commit what was read
                consumer.commit(asynchronous=False)
                uncommitted = False
            if message is None or message.error() is not None:
                continue
            self.got.append((message.partition(), message.offset(), message.value()))
            uncommitted = True
        if uncommitted:
            consumer.commit(asynchronous=False)
        consumer.close()


def test_a_group_of_three_shares_six_partitions_and_its_commits_are_subscriptions(cluster, serve,
                                                                                  namespace):
    run = dlog_runner(cluster.zk_address, cluster.zk_root, namespace)
    for index in range(6):
        run("stream", "create", f"grouped/partition-{index}", "--ensemble", "1", "--write-quorum", "1",
            "--ack-quorum", "1")
    server = serve(cluster, namespace)
    records = [(f"key-{n}".encode(), f"value-{n}".encode(), (), 1_700_000_000_000 + n) for n in range(600)]
    librdkafka_produce(server.bootstrap, "grouped", records)
    members = [GroupMember(server.bootstrap, "g3", "grouped") for _ in range(3)]

    def settled() -> bool:
        parts = [member.assigned for member in members]
        return sum(len(p) for p in parts) == 6 and set().union(*parts) == set(range(6)) and all(parts)

    deadline = time.monotonic() + DEADLINE_S
    while not (settled() and sum(len(m.got) for m in members) >= 600) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert settled(), [member.assigned for member in members]
    read = sorted(value for member in members for _, _, value in member.got)
    assert read == sorted(value for _, value, _, _ in records)  # each record to one member, once
    for member in members:  # each member read only its partitions
        assert {partition for partition, _, _ in member.got} <= member.assigned
    # one member leaves: its partitions move to the other two
    leaving = members.pop()
    leaving.stop.set()
    leaving.thread.join(30)
    deadline = time.monotonic() + DEADLINE_S
    while set().union(*(m.assigned for m in members)) != set(range(6)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set().union(*(m.assigned for m in members)) == set(range(6))
    for member in members:
        member.stop.set()
        member.thread.join(30)
    # the committed offsets are the group's subscriptions: no lag left
    for index in range(6):
        lag = json.loads(run("subscription", "describe", f"grouped/partition-{index}", "g3", "--json").stdout)
        assert lag["lag_records"] == 0, lag
    # and they survive a server restart: a new member of the group reads nothing old
    assert server.stop() == 0
    server = serve(cluster, namespace)
    librdkafka_produce(server.bootstrap, "grouped", [(b"key-0", b"after-restart", (), 1_700_000_001_000)])
    late = GroupMember(server.bootstrap, "g3", "grouped")
    deadline = time.monotonic() + DEADLINE_S
    while not late.got and time.monotonic() < deadline:
        time.sleep(0.1)
    late.stop.set()
    late.thread.join(30)
    assert [value for _, _, value in late.got] == [b"after-restart"]


# ------------------------------------------------------------------ topic administration, idempotent resends


def test_topics_are_created_described_and_deleted_as_streams(cluster, serve, namespace):
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
    server = serve(cluster, namespace)
    run = dlog_runner(cluster.zk_address, cluster.zk_root, namespace)
    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    try:
        admin.create_topics([NewTopic("orders", 3, 1, topic_configs={"retention.ms": "3600000"}),
                             NewTopic("audit", 1, 1)])
        streams = json.loads(run("stream", "list", "--json").stdout)
        names = sorted(item["name"] if isinstance(item, dict) else item for item in
                       (streams["streams"] if isinstance(streams, dict) else streams))
        assert names == ["audit", "orders/partition-0", "orders/partition-1", "orders/partition-2"]
        assert sorted(admin.list_topics()) == ["audit", "orders"]
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "orders")],
                                         config_filter="all")["topic"]["orders"]
        described = {name: data["value"] if isinstance(data, dict) else data.value for name, data in configs.items()}
        assert described["retention.ms"] == "3600000" and described["retention.bytes"] == "-1", described
        with pytest.raises(Exception, match="TopicAlreadyExists"):
            admin.create_topics([NewTopic("audit", 1, 1)])
        with pytest.raises(Exception, match="InvalidConfiguration|INVALID_CONFIG|InvalidConfig"):
            admin.create_topics([NewTopic("bad", 1, 1, topic_configs={"cleanup.policy": "archive"})])
        from confluent_kafka import Producer
        producer = Producer({"bootstrap.servers": server.bootstrap})
        for partition in range(3):
            producer.produce("orders", value=f"to-{partition}".encode(), partition=partition)
        assert producer.flush(DEADLINE_S) == 0
        lines = run("read", "orders/partition-2").stdout.splitlines()
        assert lines == ["to-2"]
        admin.delete_topics(["orders"])
        streams = json.loads(run("stream", "list", "--json").stdout)
        names = [item["name"] if isinstance(item, dict) else item for item in
                 (streams["streams"] if isinstance(streams, dict) else streams)]
        assert names == ["audit"]
    finally:
        admin.close()


def test_an_idempotent_resend_is_answered_with_its_first_offset_and_written_once(cluster, serve, namespace):
    from kafka.protocol.producer import InitProducerIdRequest

    from dlog.serve.kafka import ErrorCode
    server = serve(cluster, namespace, "--auto-create-topics")
    ids = [raw_request(server.bootstrap, InitProducerIdRequest(version=0, transactional_id=None,
                                                               transaction_timeout_ms=60_000), 0)
           for _ in range(2)]
    assert [answer.error_code for answer in ids] == [0, 0] and ids[0].producer_id != ids[1].producer_id

    def idempotent(values: list[bytes], sequence: int) -> object:
        from kafka.record.default_records import DefaultRecordBatchBuilder
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                            producer_id=ids[0].producer_id, producer_epoch=0,
                                            base_sequence=sequence, batch_size=1 << 20)
        for delta, value in enumerate(values):
            builder.append(delta, timestamp=1_700_000_000_000, key=None, value=value, headers=[])
        request = produce_request("dedup", [b"placeholder"])
        request.topic_data[0].partition_data[0].records = bytes(builder.build())  # type: ignore[attr-defined]
        return request

    def produced(request: object) -> tuple[int, int]:
        part = raw_request(server.bootstrap, request, 7).responses[0].partition_responses[0]
        return part.error_code, part.base_offset

    assert produced(idempotent([b"a", b"b"], 0)) == (0, 0)
    assert produced(idempotent([b"c"], 2)) == (0, 2)
    assert produced(idempotent([b"a", b"b"], 0)) == (0, 0)  # a resend: its original offset, not written again
    assert produced(idempotent([b"z"], 9))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert produced(idempotent([b"d"], 3)) == (0, 3)
    run = dlog_runner(cluster.zk_address, cluster.zk_root, namespace)
    assert run("read", "dedup").stdout.splitlines() == ["a", "b", "c", "d"]


def idempotent_request(topic: str, producer_id: int, values: list[bytes], sequence: int, epoch: int = 0) -> object:
    """A Produce request holding one idempotent batch of `values` from `sequence` on."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=producer_id,
                                        producer_epoch=epoch, base_sequence=sequence, batch_size=1 << 20)
    for delta, value in enumerate(values):
        builder.append(delta, timestamp=1_700_000_000_000, key=None, value=value, headers=[])
    request = produce_request(topic, [b"placeholder"])
    request.topic_data[0].partition_data[0].records = bytes(builder.build())  # type: ignore[attr-defined]
    return request


def test_a_resend_after_the_owner_is_killed_is_answered_by_the_new_owner_and_written_once(cluster, serve,
                                                                                          namespace):
    """The new owner rebuilds the dedup table (the stored snapshot, then the entries written after
    it) before it takes a write: resends of batches the killed owner made durable get their
    original offsets, and the stream holds each record once."""
    from kafka.protocol.producer import InitProducerIdRequest
    # a snapshot is stored after about every second batch: both the snapshot and the replay matter
    first = serve(cluster, namespace, "--auto-create-topics", "--session-timeout", "2s", "--dedup-replay-bytes", "300")
    producer_id = raw_request(first.bootstrap, InitProducerIdRequest(version=0, transactional_id=None,
                                                                     transaction_timeout_ms=60_000), 0).producer_id

    def produced(server: ServeProcess, values: list[bytes], sequence: int) -> tuple[int, int]:
        part = raw_request(server.bootstrap, idempotent_request("failover", producer_id, values, sequence),
                           7).responses[0].partition_responses[0]
        return part.error_code, part.base_offset

    batches = [[f"b{n}-{i}".encode() * 8 for i in range(3)] for n in range(5)]
    for n, values in enumerate(batches):
        assert produced(first, values, 3 * n) == (0, 3 * n)
    second = serve(cluster, namespace, "--auto-create-topics", "--session-timeout", "2s")
    first.kill()
    deadline = time.monotonic() + DEADLINE_S
    while (answer := produced(second, batches[4], 12))[0] != 0 and time.monotonic() < deadline:
        time.sleep(0.2)  # NOT_LEADER / LEADER_NOT_AVAILABLE until the killed owner's session expires
    assert answer == (0, 12)  # the last batch again: its original offset, not written twice
    assert produced(second, batches[1], 3) == (0, 3)
    assert produced(second, [b"after"], 15) == (0, 15)
    run = dlog_runner(cluster.zk_address, cluster.zk_root, namespace)
    lines = run("read", "failover").stdout.splitlines()
    assert lines == [value.decode() for values in batches for value in values] + ["after"]


async def test_a_native_takeover_fences_the_server_which_stops_serving_the_stream(cluster, serve, namespace):
    from dlog.serve.kafka import ErrorCode
    from tests.helpers import eventually
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        await ns.create_stream("taken", ensemble=1, write_quorum=1, ack_quorum=1)
    server = serve(cluster, namespace)
    first = await asyncio.to_thread(raw_request, server.bootstrap, produce_request("taken", [b"served"]), 7)
    assert first.responses[0].partition_responses[0].error_code == 0
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        async with ns.open_writer("taken", takeover=True, lock_timeout_s=1.0) as writer:
            await writer.write(b"native")

    async def refused() -> bool:
        answer = await asyncio.to_thread(raw_request, server.bootstrap, produce_request("taken", [b"late"]), 7)
        code = answer.responses[0].partition_responses[0].error_code
        assert code in (ErrorCode.NONE, ErrorCode.NOT_LEADER_OR_FOLLOWER), code
        return code == ErrorCode.NOT_LEADER_OR_FOLLOWER

    await eventually(refused, timeout_s=30, interval_s=0.2)
    run = dlog_runner(cluster.zk_address, cluster.zk_root, namespace)
    values = run("read", "taken").stdout.splitlines()
    assert values[:2] == ["served", "native"] and set(values[2:]) <= {"late"}, values


def test_a_malformed_frame_closes_only_its_connection(cluster, serve, namespace):
    import socket
    import struct

    from kafka.protocol.metadata import ApiVersionsRequest
    server = serve(cluster, namespace)
    host, port = server.bootstrap.rsplit(":", 1)
    for frame in (struct.pack(">ihhih", 10, 99, 0, 1, -1),  # unknown api key
                  struct.pack(">i", -5),  # negative size
                  struct.pack(">ihhih", 12, 3, 5, 1, -1) + b"\xff\xff"):  # Metadata body that does not parse
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            connection.sendall(frame)
            assert connection.recv(100) == b""  # closed without an answer, as Kafka does
    answer = raw_request(server.bootstrap, ApiVersionsRequest(version=2), 2)
    assert answer.error_code == 0 and {api.api_key for api in answer.api_keys} >= {0, 1, 2, 3, 18}
    assert 17 not in {api.api_key for api in answer.api_keys}  # SASL is not served yet, so not listed


def test_a_server_whose_session_expired_registers_again_and_serves(cluster, serve, namespace):
    import signal
    server = serve(cluster, namespace, "--auto-create-topics", "--session-timeout", "1s")
    run = dlog_runner(cluster.zk_address, cluster.zk_root, namespace)
    assert librdkafka_produce(server.bootstrap, "paused", expected_records("before", 5)) == list(range(5))
    assert owners(run) == {"paused": server.server_id}
    server.process.send_signal(signal.SIGSTOP)  # frozen past its session timeout: ZooKeeper expires it
    try:
        deadline = time.monotonic() + DEADLINE_S
        while owners(run) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert owners(run) == {} and json.loads(run("serve", "list", "--json").stdout)["servers"] == []
    finally:
        server.process.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + DEADLINE_S
    while not json.loads(run("serve", "list", "--json").stdout)["servers"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [s["id"] for s in json.loads(run("serve", "list", "--json").stdout)["servers"]] == [server.server_id]
    # it serves again: the stream is taken afresh (its old writer lost the lock with the session)
    assert librdkafka_produce(server.bootstrap, "paused", expected_records("after", 5)) == list(range(5, 10))
    assert owners(run) == {"paused": server.server_id}


async def test_the_owner_applies_the_retention_of_the_streams_it_owns(cluster, serve, namespace):
    """Issue 23 item 1: a stream's policies run in the process that owns it; nobody runs
    `dlog retention apply`."""
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        await ns.create_stream("kept", ensemble=1, write_quorum=1, ack_quorum=1, retention_bytes=1)
        for session in range(3):  # three completed segments of five records
            async with ns.open_writer("kept") as writer:
                for index in range(5):
                    await writer.write(b"%d-%d" % (session, index))
        assert (await ns.position_bounds("kept"))[0] == 0
        server = serve(cluster, namespace)
        offsets = await asyncio.to_thread(librdkafka_produce, server.bootstrap, "kept",
                                          expected_records("kafka", 1))
        assert offsets == [15]  # the server owns the stream now

        async def retained() -> bool:
            return (await ns.position_bounds("kept"))[0] == 10  # the last completed segment is kept

        await eventually(retained, DEADLINE_S, interval_s=0.5, message="the owner applied the retention")


async def test_a_compacted_topic_is_read_by_a_kafka_consumer_at_its_original_offsets(cluster, serve, namespace):
    """Issue 25 item 2: a topic created with cleanup.policy=compact is a stream with compaction on,
    which its owner compacts; a Kafka consumer then reads the latest record per key at its original
    offset (gaps between, as in a Kafka compacted topic), and the records after the compacted part."""
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
    server = serve(cluster, namespace)
    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    try:
        admin.create_topics([NewTopic("table", 1, 1, topic_configs={"cleanup.policy": "compact",
                                                                     "min.compaction.lag.ms": "0"})])
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "table")])
        described = {name: data["value"] if isinstance(data, dict) else data.value
                     for name, data in configs["topic"]["table"].items()}
        assert described["cleanup.policy"] == "compact" and described["min.compaction.lag.ms"] == "0", described
    finally:
        admin.close()
    # keys k0..k6 end at offset 29, j0..j2 run to 59: the latest per key are 23..29 and 57..59
    keys = [f"k{n % 7}" if n < 30 else f"j{n % 3}" for n in range(60)]
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        for first in (0, 20, 40):  # three completed segments (a writer session each)
            async with ns.open_writer("table") as writer:
                for n in range(first, first + 20):
                    await writer.write(f"v{n}".encode(), keys[n].encode())
        offsets = await asyncio.to_thread(librdkafka_produce, server.bootstrap, "table",
                                          [(b"k0", b"after", (), 1_700_000_000_000)])
        assert offsets == [60]  # the server owns the stream now, and its policy runner compacts it

        async def compacted() -> bool:
            segments = (await ns.stream_info("table"))["segments"]
            return sum(1 for segment in segments if segment.get("compacted")) == 3

        await eventually(compacted, DEADLINE_S, interval_s=0.5, message="the owner compacted the topic")
    expected = [(n, keys[n].encode(), f"v{n}".encode()) for n in (*range(23, 30), 57, 58, 59)] + [(60, b"k0", b"after")]
    got = await asyncio.to_thread(librdkafka_read, server.bootstrap, "table", len(expected))
    assert [item[:3] for item in got] == expected
    got = await asyncio.to_thread(librdkafka_read, server.bootstrap, "table", 4, 40)  # a start in a gap
    assert [item[:3] for item in got] == expected[-4:]



async def test_a_held_stream_refuses_kafka_producers_until_its_subscription_drains(cluster, serve, namespace):
    """Issue 25 item 4 through the serving tier: while a subscription is over the backlog limit of a
    stream whose policy is hold, a Kafka produce is refused with POLICY_VIOLATION (one clear error,
    not a leader change the client would chase), and taken again once the subscription commits past."""
    from dlog.offsets import Offset
    from dlog.serve.kafka import ErrorCode
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        await ns.create_stream("held", ensemble=1, write_quorum=1, ack_quorum=1, backlog_bytes=1,
                               backlog_policy="hold")
        async with ns.open_writer("held") as writer:  # a completed segment the subscription has not read
            written: list[Offset] = [await writer.write(b"unread-%d" % index) for index in range(5)]
        await ns.commit_subscription("held", "abandoned", written[0])
        server = serve(cluster, namespace)

        def produced() -> tuple[int, int]:
            part = raw_request(server.bootstrap, produce_request("held", [b"kafka"]), 7).responses[0]
            return part.partition_responses[0].error_code, part.partition_responses[0].base_offset

        assert await asyncio.to_thread(produced) == (ErrorCode.POLICY_VIOLATION, -1)
        serving = (await ns.stream_info("held"))["segments"][-1]  # the server's segment, in progress
        assert serving["ledger"] != written[0].ledger_id
        await ns.commit_subscription("held", "abandoned", Offset(serving["ledger"], 0))  # read it all

        async def taken() -> bool:  # each refused produce checks again: a later one sees the commit
            return await asyncio.to_thread(produced) == (ErrorCode.NONE, 5)

        await eventually(taken, DEADLINE_S, interval_s=0.2, message="the hold cleared")


async def test_a_typed_stream_reads_through_kafka_as_json_in_its_latest_schema(cluster, serve, namespace):
    """Issue 25 item 3 through the serving tier: a Kafka consumer of a typed stream gets each
    record with a null key and its columns as one JSON object in the stream's latest schema
    (records of schema version 1 projected by field id: the renamed field under its new name, the
    added one null), its `timestamp` column as the Kafka timestamp (ListOffsets by time finds it
    too; without one, -1); a Kafka producer is refused with INVALID_RECORD and one line in the
    server's log; records the latest schema cannot project fail the fetch with one line, not the
    connection."""
    import base64
    import decimal

    import pyarrow as pa
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

    from dlog.serve.kafka import ErrorCode
    v1 = "id:int32, name:string, timestamp:timestamp[ms], price:decimal(10,2), raw:binary?"
    v2 = "id:int32, full_name#2:string, timestamp:timestamp[ms], price:decimal(10,2), raw:binary?, score:float64?"
    base = 1_700_000_000_000  # 2023-11-14T22:13:20Z
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        await ns.create_stream("typed", schema=v1, ensemble=1, write_quorum=1, ack_quorum=1)
        async with ns.open_writer("typed") as writer:
            await writer.write_batch(pa.record_batch({
                "id": pa.array(range(10), pa.int32()), "name": [f"n{n}" for n in range(10)],
                "timestamp": pa.array([base + n for n in range(10)], pa.timestamp("ms")),
                "price": pa.array([decimal.Decimal(f"{n}.25") for n in range(10)], pa.decimal128(10, 2)),
                "raw": pa.array([bytes([n, 255]) if n % 2 else None for n in range(10)], pa.binary())}))
        await ns.alter_stream("typed", schema=v2)  # renames `name` (id 2 kept), adds the nullable `score`
        async with ns.open_writer("typed") as writer:
            await writer.write_batch(pa.record_batch({
                "id": pa.array(range(10, 20), pa.int32()), "full_name": [f"f{n}" for n in range(10, 20)],
                "timestamp": pa.array([base + n for n in range(10, 20)], pa.timestamp("ms")),
                "price": pa.array([decimal.Decimal("-0.05")] * 10, pa.decimal128(10, 2)),
                "raw": pa.array([b"\x00"] * 10, pa.binary()),
                "score": [float("nan") if n == 10 else float("-inf") if n == 11 else n / 4 for n in range(10, 20)]}))
        # unchecked (NONE): `name` becomes an int, so the string records of version 1 cannot be projected
        await ns.create_stream("loose", schema="id:int32, name:string", schema_compatibility="NONE", ensemble=1,
                               write_quorum=1, ack_quorum=1)
        async with ns.open_writer("loose") as writer:
            await writer.write_batch(pa.record_batch({"id": pa.array([1], pa.int32()), "name": ["one"]}))
        await ns.alter_stream("loose", schema="id:int32, name:int64")
        await ns.create_stream("untimed", schema="id:int32", ensemble=1, write_quorum=1, ack_quorum=1)
        async with ns.open_writer("untimed") as writer:  # no `timestamp` column: no record time
            await writer.write_batch(pa.record_batch({"id": pa.array([7, 8], pa.int32())}))
    expected = [{"id": n, "full_name": f"n{n}", "timestamp": f"2023-11-14T22:13:20.{n:03d}", "price": f"{n}.25",
                 "raw": base64.b64encode(bytes([n, 255])).decode() if n % 2 else None, "score": None}
                for n in range(10)]
    expected += [{"id": n, "full_name": f"f{n}", "timestamp": f"2023-11-14T22:13:20.{n:03d}", "price": "-0.05",
                  "raw": "AA==", "score": "NaN" if n == 10 else "-Infinity" if n == 11 else n / 4}
                 for n in range(10, 20)]
    server = serve(cluster, namespace)
    got = await asyncio.to_thread(librdkafka_read, server.bootstrap, "typed", 20)
    assert [(offset, key, headers, timestamp) for offset, key, _, headers, timestamp in got] == \
        [(n, None, (), base + n) for n in range(20)]
    assert [json.loads(value) for _, _, value, _, _ in got] == expected
    assert {tuple(json.loads(value)) for _, _, value, _, _ in got} == {tuple(expected[0])}  # the schema's order

    def by_time() -> int:
        consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "unused-typed"})
        try:
            return consumer.offsets_for_times([TopicPartition("typed", 0, base + 15)], timeout=DEADLINE_S)[0].offset
        finally:
            consumer.close()

    assert await asyncio.to_thread(by_time) == 15

    # no server takes a typed stream's lock (Kafka cannot write it): a native writer writes while
    # Kafka consumers read, and they see its records as they become durable
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns, \
            ns.open_writer("typed", lock_timeout_s=1.0) as writer:
        for first in (20, 25):
            await writer.write_batch(pa.record_batch({
                "id": pa.array(range(first, first + 5), pa.int32()), "full_name": ["w"] * 5,
                "timestamp": pa.array([base] * 5, pa.timestamp("ms")),
                "price": pa.array([decimal.Decimal("1.00")] * 5, pa.decimal128(10, 2)),
                "raw": pa.array([None] * 5, pa.binary()), "score": pa.array([None] * 5, pa.float64())}))
            got = await asyncio.to_thread(librdkafka_read, server.bootstrap, "typed", 5, first)
            assert [(offset, json.loads(value)["id"]) for offset, _, value, _, _ in got] == \
                [(n, n) for n in range(first, first + 5)]

    def produce() -> list[object]:
        producer = Producer({"bootstrap.servers": server.bootstrap, "message.timeout.ms": 30_000})
        errors: list[object] = []
        producer.produce("typed", value=b'{"id": 99}', on_delivery=lambda error, _: errors.append(error))
        producer.flush(DEADLINE_S)
        return errors

    errors = await asyncio.to_thread(produce)
    assert [error.code() for error in errors] == [KafkaError.INVALID_RECORD], errors  # type: ignore[attr-defined]
    answer = await asyncio.to_thread(raw_request, server.bootstrap, fetch_request("typed", 0), 11)
    assert answer.responses[0].partitions[0].high_watermark == 30  # nothing written
    got = await asyncio.to_thread(librdkafka_read, server.bootstrap, "untimed", 2)
    assert [(offset, key, value, timestamp) for offset, key, value, _, timestamp in got] == \
        [(0, None, b'{"id":7}', -1), (1, None, b'{"id":8}', -1)]  # -1: Kafka's "no timestamp"
    # records the latest schema cannot project: an error for the fetch (the connection stays), one line
    answer = await asyncio.to_thread(raw_request, server.bootstrap, fetch_request("loose", 0), 11)
    assert answer.responses[0].partitions[0].error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    assert server.stop() == 0
    log = server.process.stderr.read()
    assert "stream 'typed' is typed (its records are a schema's columns): Kafka producers write only untyped" in log
    assert "fetch of loose-0 at 0 failed: records cannot be read with this schema: field 'name'" in log
    assert "Traceback" not in log
