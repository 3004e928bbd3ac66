"""`dlog bench`: measured, never asserted. Each mode starts what it needs (a local cluster of real
processes in a temporary directory, fsync on) unless told otherwise, and returns one dict of
figures; the CLI prints it as a table or as JSON.

Modes here: `bookie` (raw adds against one bookie process) and `ledger` (appends through the
client at E3/Qw2/Qa2 on three bookie processes).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Iterator

from bookkeeper.protocol.entry import Digest, DigestType, master_key, pack_entry
from dlog.segments.codec import records_to_batch
from bookkeeper.protocol.wire import (AddRequest, ErrorResponse, ResponseDecoder, encode_request)
from tools.cluster import LocalCluster

PASSWORD = b"bench"


def event_payload(index: int, size: int) -> bytes:
    """A realistic record: a JSON-like event, padded or cut to `size` bytes (not all zeros)."""
    rng = random.Random(index)
    text = json.dumps({"ts": 1700000000000 + index, "user": f"u{rng.randrange(100000)}",
                       "action": rng.choice(["view", "click", "buy", "share"]),
                       "item": rng.randrange(10**6), "session": f"{rng.getrandbits(48):012x}"})
    while len(text) < size:
        text += " " + text
    return text[:size].encode()


def percentiles(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)

    def at(fraction: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000, 3)

    return {"p50_ms": at(0.50), "p99_ms": at(0.99), "p999_ms": at(0.999),
            "mean_ms": round(statistics.fmean(ordered) * 1000, 3)}


@contextmanager
def local_cluster(bookies: int, bookie_args: list[str] | None = None) -> Iterator[LocalCluster]:
    with tempfile.TemporaryDirectory(prefix="dlog-bench-") as directory:
        cluster = LocalCluster(directory, bookies=bookies, bookie_args=bookie_args)
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()


# ---------------------------------------------------------------------------- bookie


class _RawAdder(asyncio.Protocol):
    """Keeps `in_flight` pre-encoded adds outstanding on one connection and times each."""

    def __init__(self, frames: list[bytes], in_flight: int, done: asyncio.Future[list[float]]) -> None:
        self.frames = frames
        self.in_flight = in_flight
        self.done = done
        self.decoder = ResponseDecoder()
        self.sent_at: list[float] = [0.0] * len(frames)
        self.latencies: list[float] = []
        self.next_index = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._send(min(self.in_flight, len(self.frames)))

    def _send(self, count: int) -> None:
        now = time.perf_counter()
        start = self.next_index
        end = min(len(self.frames), start + count)
        for index in range(start, end):
            self.sent_at[index] = now
        self.next_index = end
        if end > start:
            self.transport.write(b"".join(self.frames[start:end]))  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        self.decoder.receive_data(data)
        now = time.perf_counter()
        answered = 0
        while (response := self.decoder.next_message()) is not None:
            if isinstance(response, ErrorResponse):
                self.done.set_exception(RuntimeError(f"add failed: {response}"))
                return
            self.latencies.append(now - self.sent_at[response.request_id])
            answered += 1
        self._send(answered)
        if len(self.latencies) == len(self.frames) and not self.done.done():
            self.done.set_result(self.latencies)


async def _raw_adds(address: str, ledger_id: int, count: int, size: int, in_flight: int) -> dict[str, Any]:
    key, digest = master_key(PASSWORD), Digest.for_ledger(DigestType.CRC32C, PASSWORD)
    frames = [encode_request(AddRequest(index, ledger_id, index, key,
                                        pack_entry(digest, ledger_id, index, index - 1, 0,
                                                   event_payload(index, size))))
              for index in range(count)]
    loop = asyncio.get_running_loop()
    done: asyncio.Future[list[float]] = loop.create_future()
    host, _, port = address.rpartition(":")
    started = time.perf_counter()
    transport, _ = await loop.create_connection(lambda: _RawAdder(frames, in_flight, done), host, int(port))
    latencies = await done
    elapsed_s = time.perf_counter() - started
    transport.close()
    return {"entries": count, "entry_bytes": size, "in_flight": in_flight,
            "adds_per_s": round(count / elapsed_s), **percentiles(latencies)}


def bench_bookie(entries: int = 200_000, sizes: tuple[int, ...] = (100, 1024),
                 in_flights: tuple[int, ...] = (1, 64), fsync: bool = True) -> dict[str, Any]:
    """Raw adds against one bookie process; each run on a fresh ledger."""
    args = [] if fsync else ["--no-fsync"]
    runs = []
    with local_cluster(1, args) as cluster:
        address = cluster.bookies[0].address
        ledger_id = 1
        for size in sizes:
            for in_flight in in_flights:
                count = entries if in_flight > 1 else min(entries, 20_000)
                runs.append(asyncio.run(_raw_adds(address, ledger_id, count, size, in_flight)))
                ledger_id += 1
    return {"mode": "bookie", "fsync": fsync, "bookies": 1, "runs": runs}


# ---------------------------------------------------------------------------- ledger


async def _ledger_runs(cluster: LocalCluster, entries: int, in_flight: int, latency_entries: int,
                       rate_per_s: int) -> list[dict[str, Any]]:
    from bookkeeper.client import BookKeeper

    runs = []
    async with BookKeeper(zk=cluster.zk_address) as client:
        handle = await client.create_ledger(3, 2, 2, password=PASSWORD)
        payloads = [event_payload(index, 100) for index in range(entries)]
        semaphore = asyncio.Semaphore(in_flight)
        started = time.perf_counter()

        def release(_: object) -> None:
            semaphore.release()

        futures = []
        for payload in payloads:
            await semaphore.acquire()
            future = handle.append_async(payload)
            future.add_done_callback(release)
            futures.append(future)
        await asyncio.gather(*futures)
        elapsed_s = time.perf_counter() - started
        runs.append({"run": "throughput", "entries": entries, "entry_bytes": 100,
                     "in_flight": in_flight, "appends_per_s": round(entries / elapsed_s)})
        await handle.close()

        handle = await client.create_ledger(3, 2, 2, password=PASSWORD)
        latencies = []
        for index in range(latency_entries):
            sent = time.perf_counter()
            await handle.append(event_payload(index, 1024))
            latencies.append(time.perf_counter() - sent)
        runs.append({"run": "sequential", "entries": latency_entries, "entry_bytes": 1024,
                     "in_flight": 1, **percentiles(latencies)})
        await handle.close()

        runs.append(await _tail_latency(client, rate_per_s, latency_entries))
    return runs


async def _tail_latency(client: Any, rate_per_s: int, count: int) -> dict[str, Any]:
    """Append at a fixed rate; a tailing reader records when each entry reaches it."""
    handle = await client.create_ledger(3, 2, 2, password=PASSWORD)
    reader = await client.open_ledger(handle.ledger_id, password=PASSWORD, recovery=False)
    sent_at: dict[int, float] = {}
    latencies: list[float] = []

    async def follow() -> None:
        async for entry in reader.tail(0, poll_timeout_ms=1000):
            latencies.append(time.perf_counter() - sent_at[entry.entry_id])
            if entry.entry_id == count - 1:
                return

    tail = asyncio.create_task(follow())
    interval_s = 1 / rate_per_s
    started = time.perf_counter()
    for index in range(count):
        delay_s = started + index * interval_s - time.perf_counter()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        sent_at[index] = time.perf_counter()
        handle.append_async(event_payload(index, 100))
    await asyncio.wait_for(tail, 60)
    await handle.close()
    return {"run": "tail", "entries": count, "rate_per_s": rate_per_s, **percentiles(latencies)}


def event_values(count: int, size: int = 100) -> list[bytes]:
    """`count` distinct realistic values: JSON-like events with random users, actions, items and
    session ids (what compresses is what real events share: field names, not whole records)."""
    rng = random.Random(7)
    actions = [b"view", b"click", b"buy", b"share", b"search", b"scroll"]
    values = []
    for index in range(count):
        value = (b'{"ts":%d,"user":"u%06d","action":"%s","item":%d,"session":"%012x"}'
                 % (1700000000000 + index, rng.randrange(10**6), rng.choice(actions),
                    rng.randrange(10**7), rng.getrandbits(48)))
        values.append((value + b" " * size)[: size - 8] + b"%08d" % index)
    return values


async def _stream_runs(cluster: LocalCluster, records: int, batch_records: int, tail_rate: int,
                       tail_seconds: float) -> list[dict[str, Any]]:
    from dlog import Namespace

    runs: list[dict[str, Any]] = []
    async with Namespace(cluster.zk_address, "bench") as ns:
        await ns.create_stream("batches")
        values = event_values(records)

        batches = [records_to_batch(values[start: start + batch_records])
                   for start in range(0, records, batch_records)]
        raw_bytes = sum(len(value) for value in values)
        async with ns.open_writer("batches") as writer:
            started = time.perf_counter()
            pending = []
            for batch in batches:
                pending.append(asyncio.ensure_future(writer.write_batch(batch)))
                if len(pending) >= 8:
                    await pending.pop(0)
            await asyncio.gather(*pending)
            elapsed_s = time.perf_counter() - started
        stored = sum(s["bytes"] for s in (await ns.stream_info("batches"))["segments"])
        runs.append({"run": "write_batch", "records": records, "records_per_s": round(records / elapsed_s),
                     "mb_per_s": round(raw_bytes / elapsed_s / 1e6, 1),
                     "compression_ratio": round(raw_bytes / max(stored, 1), 2)})

        await ns.create_stream("records")
        count = min(records, 300_000)
        async with ns.open_writer("records") as writer:
            started = time.perf_counter()
            futures = []
            for value in values[:count]:
                if not writer.writable:
                    await writer.wait_writable()
                futures.append(writer.write_nowait(value))
            await asyncio.gather(*futures)
            elapsed_s = time.perf_counter() - started
        runs.append({"run": "write", "records": count, "records_per_s": round(count / elapsed_s),
                     "mb_per_s": round(sum(map(len, values[:count])) / elapsed_s / 1e6, 1)})

        reader = await ns.open_reader("batches", follow=False)
        started = time.perf_counter()
        read = 0
        while (entry := await reader.next_entry()) is not None:
            read += entry.batch.num_rows
        elapsed_s = time.perf_counter() - started
        await reader.close()
        runs.append({"run": "read", "records": read, "records_per_s": round(read / elapsed_s),
                     "as": "arrow batches"})
        runs.append(await _stream_tail(ns, tail_rate, tail_seconds))
    return runs


async def _stream_tail(ns: Any, rate_per_s: int, seconds: float) -> dict[str, Any]:
    """Write at a fixed rate; a tailing reader records each record's write-to-read latency."""
    await ns.create_stream("tail")
    writer = await ns.open_writer("tail", linger_ms=1)
    reader = await ns.open_reader("tail", "latest")
    count = int(rate_per_s * seconds)
    sent_at: list[float] = [0.0] * count
    latencies: list[float] = []

    async def follow() -> None:
        while len(latencies) < count:
            entry = await reader.next_entry(timeout_s=30)
            if entry is None:
                raise RuntimeError("the tailing reader stalled for 30 s")
            now = time.perf_counter()
            for index in entry.batch.column("value").to_pylist():
                latencies.append(now - sent_at[int(index[-8:])])

    task = asyncio.create_task(follow())
    started = time.perf_counter()
    tick_s = 0.001
    written = 0
    while written < count:
        due = min(count, int((time.perf_counter() - started) * rate_per_s) + 1)
        while written < due:
            sent_at[written] = time.perf_counter()
            writer.write_nowait(b"tail-event-%08d" % written)
            written += 1
        await asyncio.sleep(tick_s)
    await asyncio.wait_for(task, 60)
    await reader.close()
    await writer.close()
    return {"run": "tail", "records": count, "rate_per_s": rate_per_s, **percentiles(latencies)}


def bench_streams(records: int = 1_000_000, batch_records: int = 10_000, tail_rate: int = 10_000,
                  tail_seconds: float = 5.0, fsync: bool = True) -> dict[str, Any]:
    """Stream writes (write_batch and per-record write), catch-up read, and tail latency."""
    args = [] if fsync else ["--no-fsync"]
    with local_cluster(3, args) as cluster:
        runs = asyncio.run(_stream_runs(cluster, records, batch_records, tail_rate, tail_seconds))
    return {"mode": "streams", "fsync": fsync, "bookies": 3, "quorum": "E3/Qw2/Qa2",
            "record_bytes": 100, "runs": runs}


def bench_ledger(entries: int = 100_000, in_flight: int = 256, latency_entries: int = 5_000,
                 rate_per_s: int = 1000, fsync: bool = True) -> dict[str, Any]:
    args = [] if fsync else ["--no-fsync"]
    with local_cluster(3, args) as cluster:
        runs = asyncio.run(_ledger_runs(cluster, entries, in_flight, latency_entries, rate_per_s))
    return {"mode": "ledger", "fsync": fsync, "bookies": 3, "quorum": "E3/Qw2/Qa2", "runs": runs}
