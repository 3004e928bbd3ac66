"""`dlog bench kafka`: the serving tier (docs/serving.md) against the native write path, side by
side in one run on one cluster (3 bookies, E3/Qw2/Qa2, fsync on, 100-byte records):

- `offer`: the native per-record fast path (`writer.offer`) into a stream, in this process;
- `kafka_produce`: librdkafka (confluent-kafka) producers, one thread each, through one `dlog
  serve` process into one topic (acks=all, linger.ms 5, no compression);
- `kafka_latency`: many producers at a fixed rate each into one topic (linger.ms 0): produce
  latency as librdkafka measures it (produce() to acknowledgement, `Message.latency()`);
- `kafka_fetch`: one librdkafka consumer reading back what `kafka_produce` wrote, from offset 0;
- `failover`: a producer writes through two servers; the owner of its topic is killed (SIGKILL):
  the time from the kill to the first acknowledgement after it (the new owner's, once the dead
  one's ZooKeeper session expired).

Bounded: every run has a record count and a deadline; the servers and the cluster are stopped
whatever happens. Measured, never asserted; each run reports its target beside its figure.
"""

from __future__ import annotations

import asyncio
import functools
import json
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bookkeeper.clock import monotonic_s, perf_s
from bookkeeper.errors import DlogError
from dlog_tools.bench.common import (
    NAMESPACE,
    bookie_args,
    event_values,
    local_cluster,
    mb_per_s,
    process_cpu_s,
    stream_header,
)
from dlog_tools.bench.streams import offer_run
from dlog_tools.cluster import LocalCluster, ServeProcess

POLL_INTERVAL_S = 0.001  # how often the latency run serves its producers' delivery reports
RUN_DEADLINE_S = 300.0  # any one run gives up after this long (its figure says so)
TARGETS = {"kafka_produce_records_per_s": 150_000, "kafka_vs_offer": 0.5, "latency_p99_ms": 10.0,
           "fetch_records_per_s": 300_000}


def bench_kafka(records: int, producers: int, latency_producers: int, latency_rate: int, latency_seconds: float,
                session_timeout_s: float, fsync: bool = True) -> dict[str, Any]:
    """The five runs above, in that order, on one fresh cluster and two `dlog serve` processes."""
    try:
        import confluent_kafka  # noqa: F401  (the test extra's, or pip install confluent-kafka)
    except ImportError as exc:
        raise DlogError("dlog bench kafka needs confluent-kafka: pip install confluent-kafka") from exc
    values = event_values(records)
    with local_cluster(3, bookie_args(fsync)) as cluster, tempfile.TemporaryDirectory(prefix="dlog-kafka-") as logs:
        servers: list[ServeProcess] = []
        try:
            first = ServeProcess.start(cluster, NAMESPACE, Path(logs) / "serve-0.log", "--session-timeout",
                                       f"{session_timeout_s}s", "--admin-port", "0")
            servers.append(first)
            offer = asyncio.run(_offer(cluster, values))
            pid = first.process.pid
            produced = _server_cpu(pid, lambda: _produce_run(first.kafka, "kafka-throughput", values, producers))
            latency = _server_cpu(pid, lambda: _latency_run(first.kafka, "kafka-latency", latency_producers,
                                                            latency_rate, latency_seconds))
            fetched = _server_cpu(pid, lambda: _fetch_run(first.kafka, "kafka-throughput", records))
            second = ServeProcess.start(cluster, NAMESPACE, Path(logs) / "serve-1.log", "--session-timeout",
                                        f"{session_timeout_s}s", "--admin-port", "0")
            servers.append(second)
            failover = _failover_run(first, second, "kafka-failover", session_timeout_s)
        finally:
            for server in servers:
                server.stop()
    kafka_vs_offer = round(produced["records_per_s"] / max(offer["records_per_s"], 1), 2)
    return {**stream_header("kafka", fsync), "record_bytes": 100, "targets": TARGETS,
            "kafka_vs_offer": kafka_vs_offer,
            "runs": [offer, produced, latency, fetched, failover]}


def _server_cpu(pid: int, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The run's figures and the server process's CPU per record it took (wall-clock rates move
    2-3x on a busy machine; CPU per record much less)."""
    before = process_cpu_s(pid)
    result = run()
    used_s = process_cpu_s(pid) - before
    return {**result, "server_cpu_us_per_record": round(used_s / max(result["records"], 1) * 1e6, 1)}


async def _offer(cluster: LocalCluster, values: list[bytes]) -> dict[str, Any]:
    from dlog import Namespace

    async with Namespace(cluster.zk_address, NAMESPACE) as ns:
        result = await offer_run(ns, "native-offer", values)
    return {"run": "offer", "clients": 1, "records": result["records"], "records_per_s": result["records_per_s"],
            "mb_per_s": result["mb_per_s"]}


def _producer(bootstrap: str, **config: Any) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "compression.type": "none",
                     "queue.buffering.max.messages": 200_000, "message.timeout.ms": int(RUN_DEADLINE_S * 1000),
                     **config})


def _warm(bootstrap: str, topic: str) -> None:
    """Create the topic and have the server take it, outside the timed part (one record)."""
    producer = _producer(bootstrap)
    failures: list[Any] = []

    def delivered(error: Any, _: Any) -> None:
        if error is not None:
            failures.append(error)

    producer.produce(topic, value=b"warm-up", on_delivery=delivered)
    if producer.flush(60) != 0 or failures:
        raise DlogError(f"cannot produce to {topic} through {bootstrap}: {failures or 'no acknowledgement'}")


def _produce_run(bootstrap: str, topic: str, values: list[bytes], producers: int) -> dict[str, Any]:
    """`producers` librdkafka producers, one thread each, share `values` (each its slice, in order)."""
    _warm(bootstrap, topic)
    share = [values[index::producers] for index in range(producers)]
    failures: list[Any] = []
    acknowledged = [0] * producers
    deadline = monotonic_s() + RUN_DEADLINE_S

    def produce(index: int) -> None:
        producer = _producer(bootstrap)

        def delivered(error: Any, _: Any) -> None:
            if error is not None:
                failures.append(error)
            else:
                acknowledged[index] += 1

        for value in share[index]:
            while True:
                try:
                    producer.produce(topic, value=value, on_delivery=delivered)
                    break
                except BufferError:  # its queue is full: serve delivery reports, then retry
                    producer.poll(0.01)
                    if monotonic_s() > deadline:
                        return
            producer.poll(0)
        producer.flush(max(0.0, deadline - monotonic_s()))

    threads = [threading.Thread(target=produce, args=(index,), daemon=True) for index in range(producers)]
    started = perf_s()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(RUN_DEADLINE_S)
    elapsed_s = perf_s() - started
    count = sum(acknowledged)
    return {"run": "kafka_produce", "clients": producers, "records": count, "records_per_s": round(count / elapsed_s),
            "mb_per_s": mb_per_s(count * 100, elapsed_s), "failed": len(failures) + len(values) - count}


def _latency_run(bootstrap: str, topic: str, producers: int, rate: int, seconds: float) -> dict[str, Any]:
    """`producers` producers at `rate` records/s each (one pacing thread) for `seconds`: the
    percentiles of librdkafka's produce-to-acknowledgement latency."""
    _warm(bootstrap, topic)
    clients = [_producer(bootstrap, **{"linger.ms": 0}) for _ in range(producers)]
    latencies: list[float] = []
    failures: list[Any] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(error)
        else:
            latencies.append(message.latency())

    value = event_values(1)[0]
    interval_s = 1.0 / rate
    ticks = max(1, int(seconds * rate))
    started = monotonic_s()
    for tick in range(ticks):
        for client in clients:
            client.produce(topic, value=value, on_delivery=delivered)
        # librdkafka's Message.latency() is taken when the delivery report is served (by poll),
        # not when the acknowledgement came: every producer is polled about every millisecond
        # while the run waits for its next tick, so a figure is at most ~1 ms late
        next_tick = started + (tick + 1) * interval_s
        while True:
            for client in clients:
                client.poll(0)
            pause = next_tick - monotonic_s()
            if pause <= 0:
                break
            time.sleep(min(pause, POLL_INTERVAL_S))  # pacing the offered rate, not waiting for an outcome
    for client in clients:
        client.flush(RUN_DEADLINE_S / 10)
    offered = ticks * producers
    result: dict[str, Any] = {"run": "kafka_latency", "clients": producers, "records": len(latencies),
                              "offered_per_s": producers * rate, "seconds": seconds,
                              "failed": offered - len(latencies)}
    if latencies:
        ordered = sorted(latencies)
        for name, fraction in (("p50_ms", 0.5), ("p99_ms", 0.99), ("p999_ms", 0.999)):
            result[name] = round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000, 2)
    return result


def _fetch_run(bootstrap: str, topic: str, records: int) -> dict[str, Any]:
    """One consumer reads the produce run's records back from offset 0 (the warm-up record too)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-unused", "enable.auto.commit": False,
                         "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20})
    wanted = records + 1
    got = 0
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = monotonic_s() + RUN_DEADLINE_S
        started = perf_s()
        while got < wanted and monotonic_s() < deadline:
            for message in consumer.consume(min(10_000, wanted - got), 0.5):
                if message.error() is None:
                    got += 1
        elapsed_s = perf_s() - started
    finally:
        consumer.close()
    return {"run": "kafka_fetch", "clients": 1, "records": got, "records_per_s": round(got / elapsed_s),
            "mb_per_s": mb_per_s(got * 100, elapsed_s)}


def _owned(server: ServeProcess) -> list[str]:
    """The streams a server owns, from its admin endpoint's /health."""
    assert server.admin is not None
    with urllib.request.urlopen(f"{server.admin}/health", timeout=10) as answer:
        return list(json.load(answer)["streams"])


def _failover_run(first: ServeProcess, second: ServeProcess, topic: str, session_timeout_s: float) -> dict[str, Any]:
    """A producer paced at 100 records/s through both servers; the owner of `topic` is killed."""
    _warm(f"{first.kafka},{second.kafka}", topic)  # rendezvous hashing picks its owner
    owner, other = (first, second) if topic in _owned(first) else (second, first)
    if topic not in _owned(owner):
        raise DlogError(f"neither server owns {topic} after a produce to it")
    # its connection errors while the owner is dead are the point: not logged
    producer = _producer(f"{owner.kafka},{other.kafka}", **{"linger.ms": 0, "log_level": 2})
    acknowledged: list[tuple[float, float]] = []  # (produced at, acknowledged at)
    failures: list[Any] = []

    def delivered(produced_at: float, error: Any, _: Any) -> None:
        if error is not None:
            failures.append(error)
        else:
            acknowledged.append((produced_at, monotonic_s()))

    value = event_values(1)[0]
    killed_at: float | None = None
    deadline = monotonic_s() + session_timeout_s + RUN_DEADLINE_S / 10
    sent = 0
    while monotonic_s() < deadline:
        producer.produce(topic, value=value, on_delivery=functools.partial(delivered, monotonic_s()))
        sent += 1
        producer.poll(0.01)
        if killed_at is None and len(acknowledged) >= 100:
            owner.kill()
            killed_at = monotonic_s()
        if killed_at is not None and any(produced > killed_at for produced, _ in acknowledged[-5:]):
            break
    producer.flush(RUN_DEADLINE_S / 10)
    # the first acknowledgement of a record produced after the kill: the new owner's (the acks of
    # records sent before it could have been read off the dead owner's socket before it died)
    after = [done for produced, done in acknowledged if killed_at is not None and produced > killed_at]
    return {"run": "failover", "clients": 1, "records": len(acknowledged), "session_timeout_s": session_timeout_s,
            "failover_s": round(min(after) - killed_at, 2) if after and killed_at is not None else None,
            "failed": len(failures) + sent - len(acknowledged)}
