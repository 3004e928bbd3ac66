"""`dlog bench`: measured, never asserted. Each mode starts what it needs (a local cluster of real
processes in a temporary directory, fsync on) unless told otherwise, and returns one dict of
figures; `tools.bench_commands` prints it as tables or as JSON, and draws charts.

Modes: `bookie` (raw adds against one bookie process), `ledger` (appends through the client at
E3/Qw2/Qa2 on three bookie processes), `write`, `read` and `tail` (streams; `streams` runs all
three), `scale` (1 to 1,000 streams, and a reader's memory behind a large backlog), `limits` (what
this machine's disk and loopback can do at all) and `compare` (the same workload on Redis Streams).

Every result says whether fsync was on (`fsync`), and every run that stores records says how well
they compressed where they are stored (`compression_ratio`: value bytes / stored bytes). Record
values are realistic events (`event_values`), never zeros.

One module for all modes, past the house size of about 400 lines: the modes share the cluster,
value and percentile helpers and are read side by side; the CLI and the charts live apart in
tools/bench_commands.py.
"""

from __future__ import annotations

import asyncio
import collections
import json
import multiprocessing
import os
import random
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import pyarrow.compute as pc

from bookkeeper.errors import DlogError
from bookkeeper.protocol.entry import Digest, DigestType, master_key, pack_entry
from bookkeeper.protocol.wire import (AddRequest, ErrorResponse, ResponseDecoder, encode_request)
from dlog.segments.codec import records_to_batch
from tools.cluster import LocalCluster, _die_with_parent, free_port

PASSWORD = b"bench"
NAMESPACE = "bench"
DLOG_DURABILITY = "E3/Qw2/Qa2 on 3 bookie processes, fdatasync on each bookie, one disk"
DLOG_NO_FSYNC = "E3/Qw2/Qa2 on 3 bookie processes, NO fsync (not durable), one disk"


def event_payload(index: int, size: int) -> bytes:
    """A realistic record: a JSON-like event, padded or cut to `size` bytes (not all zeros)."""
    rng = random.Random(index)
    text = json.dumps({"ts": 1700000000000 + index, "user": f"u{rng.randrange(100000)}",
                       "action": rng.choice(["view", "click", "buy", "share"]),
                       "item": rng.randrange(10**6), "session": f"{rng.getrandbits(48):012x}"})
    while len(text) < size:
        text += " " + text
    return text[:size].encode()


def event_values(count: int, size: int = 100) -> list[bytes]:
    """`count` distinct realistic values: JSON-like events with random users, actions, items and
    session ids (what compresses is what real events share: field names, not whole records).
    The last 8 bytes are the value's index, so a reader can tell which write a value came from."""
    rng = random.Random(7)
    actions = [b"view", b"click", b"buy", b"share", b"search", b"scroll"]
    values = []
    for index in range(count):
        value = (b'{"ts":%d,"user":"u%06d","action":"%s","item":%d,"session":"%012x"}'
                 % (1700000000000 + index, rng.randrange(10**6), rng.choice(actions),
                    rng.randrange(10**7), rng.getrandbits(48)))
        values.append((value + b" " * size)[: size - 8] + b"%08d" % index)
    return values


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


def _bookie_args(fsync: bool) -> list[str]:
    return [] if fsync else ["--no-fsync"]


def _stream_header(mode: str, fsync: bool) -> dict[str, Any]:
    return {"mode": mode, "fsync": fsync, "bookies": 3, "quorum": "E3/Qw2/Qa2",
            "durability": DLOG_DURABILITY if fsync else DLOG_NO_FSYNC}


def _ratio(numerator: float, denominator: float) -> float:
    return round(numerator / max(denominator, 1), 2)


def _mb_per_s(byte_count: int, elapsed_s: float) -> float:
    return round(byte_count / elapsed_s / 1e6, 1)


async def _stored(ns: Any, stream: str) -> dict[str, int]:
    """Records, entries and bytes of a stream's completed segments (close its writer first)."""
    listing = await ns.store.segments(stream)
    segments = [s for s in listing.segments if not s.is_in_progress]
    return {"records": sum(s.records for s in segments),
            "entries": sum(s.last_entry - s.first_entry + 1 for s in segments),
            "bytes": sum(s.bytes for s in segments), "segments": len(segments)}


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) * 1024 / 1e6, 1)
    raise DlogError(f"/proc/self/status has no {field} line: the memory figures need Linux")


def rss_mb() -> float:
    """This process's resident set now (VmRSS), in MB."""
    return _status_mb("VmRSS")


def peak_rss_mb() -> float:
    """This process's largest resident set (VmHWM) since start or since `reset_peak_rss()`."""
    return _status_mb("VmHWM")


def reset_peak_rss() -> bool:
    """Start VmHWM afresh (Linux >= 4.0), so a peak says what came after, not imports at start;
    False where the kernel refuses (the peak then covers the whole process)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


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
                       rates_per_s: Sequence[int]) -> list[dict[str, Any]]:
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

        for rate_per_s in rates_per_s:
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
    offered_s = time.perf_counter() - started
    await asyncio.wait_for(tail, 60)
    await handle.close()
    return {"run": "tail", "entries": count, "rate_per_s": rate_per_s,
            "achieved_per_s": round(count / max(offered_s, interval_s)), **percentiles(latencies)}


def bench_ledger(entries: int = 100_000, in_flight: int = 256, latency_entries: int = 5_000,
                 rate_per_s: int = 1000, fsync: bool = True,
                 sweep_rates_per_s: Sequence[int] = ()) -> dict[str, Any]:
    """Throughput, sequential latency, and tail latency at `rate_per_s` (and at each sweep rate,
    for a chart of latency against offered throughput)."""
    rates = sorted({rate_per_s, *sweep_rates_per_s})
    with local_cluster(3, _bookie_args(fsync)) as cluster:
        runs = asyncio.run(_ledger_runs(cluster, entries, in_flight, latency_entries, rates))
    return {"mode": "ledger", "fsync": fsync, "bookies": 3, "quorum": "E3/Qw2/Qa2", "runs": runs}


# ---------------------------------------------------------------------------- streams: write, read, tail


async def _write_batch_run(ns: Any, stream: str, values: list[bytes], batch_records: int,
                           in_flight: int = 8) -> dict[str, Any]:
    """write_batch of pre-built Arrow batches, `in_flight` batches outstanding."""
    await ns.create_stream(stream)
    batches = [records_to_batch(values[start: start + batch_records])
               for start in range(0, len(values), batch_records)]
    async with ns.open_writer(stream) as writer:
        started = time.perf_counter()
        pending: list[asyncio.Future[Any]] = []
        for batch in batches:
            pending.append(asyncio.ensure_future(writer.write_batch(batch)))
            if len(pending) >= in_flight:
                await pending.pop(0)
        await asyncio.gather(*pending)
        elapsed_s = time.perf_counter() - started
    raw_bytes = sum(map(len, values))
    stored = await _stored(ns, stream)
    return {"run": "write_batch", "records": len(values), "batch_records": batch_records,
            "in_flight": in_flight, "records_per_s": round(len(values) / elapsed_s),
            "mb_per_s": _mb_per_s(raw_bytes, elapsed_s), "entries": stored["entries"],
            "stored_records": stored["records"], "compression_ratio": _ratio(raw_bytes, stored["bytes"])}


async def _write_records_run(ns: Any, stream: str, values: list[bytes]) -> dict[str, Any]:
    """Per-record write, pipelined: write_nowait, waiting only when the writer's buffer is full."""
    await ns.create_stream(stream)
    async with ns.open_writer(stream) as writer:
        started = time.perf_counter()
        pending: collections.deque[asyncio.Future[Any]] = collections.deque()
        for value in values:
            if not writer.writable:
                await writer.wait_writable()
            pending.append(writer.write_nowait(value))
            while pending and pending[0].done():  # outcomes are taken as they come, as a producer would
                pending.popleft().result()
        await writer.flush()
        for future in pending:
            future.result()
        elapsed_s = time.perf_counter() - started
    raw_bytes = sum(map(len, values))
    stored = await _stored(ns, stream)
    return {"run": "write", "records": len(values), "records_per_s": round(len(values) / elapsed_s),
            "mb_per_s": _mb_per_s(raw_bytes, elapsed_s), "entries": stored["entries"],
            "stored_records": stored["records"], "compression_ratio": _ratio(raw_bytes, stored["bytes"])}


async def _read_run(ns: Any, stream: str) -> dict[str, Any]:
    """Catch-up read of a stream whose segments are all completed, entry by entry as Arrow
    batches (`next_entry`), without following the tail."""
    stored = await _stored(ns, stream)
    reader = await ns.open_reader(stream, follow=False)
    started = time.perf_counter()
    records = entries = raw_bytes = 0
    while (entry := await reader.next_entry()) is not None:
        records += entry.batch.num_rows
        raw_bytes += pc.sum(pc.binary_length(entry.batch.column("value"))).as_py() or 0
        entries += 1
    elapsed_s = time.perf_counter() - started
    await reader.close()
    return {"run": "read", "records": records, "entries": entries, "segments": stored["segments"],
            "as": "arrow batches", "records_per_s": round(records / elapsed_s),
            "mb_per_s": _mb_per_s(raw_bytes, elapsed_s), "compression_ratio": _ratio(raw_bytes, stored["bytes"])}


async def _stream_tail(ns: Any, stream: str, rate_per_s: int, seconds: float) -> dict[str, Any]:
    """Write realistic values at a fixed rate; a tailing reader records each record's
    write-to-read latency (the value's last 8 bytes say which write it was)."""
    await ns.create_stream(stream)
    writer = await ns.open_writer(stream, linger_ms=1)
    reader = await ns.open_reader(stream, "latest")
    count = max(1, int(rate_per_s * seconds))
    values = event_values(count)
    sent_at: list[float] = [0.0] * count
    latencies: list[float] = []

    async def follow() -> None:
        while len(latencies) < count:
            entry = await reader.next_entry(timeout_s=30)
            if entry is None:
                raise DlogError(f"the tailing reader of stream {stream!r} stalled for 30 s")
            now = time.perf_counter()
            for value in entry.batch.column("value").to_pylist():
                latencies.append(now - sent_at[int(value[-8:])])

    task = asyncio.create_task(follow())
    started = time.perf_counter()
    written = 0
    while written < count:
        due = min(count, int((time.perf_counter() - started) * rate_per_s) + 1)
        while written < due:
            sent_at[written] = time.perf_counter()
            writer.write_nowait(values[written])
            written += 1
        await asyncio.sleep(0.001)
    offered_s = time.perf_counter() - started
    await asyncio.wait_for(task, 60)
    await reader.close()
    await writer.close()
    stored = await _stored(ns, stream)
    return {"run": "tail", "records": count, "rate_per_s": rate_per_s,
            "achieved_per_s": round(count / max(offered_s, 1 / rate_per_s)), **percentiles(latencies),
            "records_per_entry": round(count / max(stored["entries"], 1), 1),
            "compression_ratio": _ratio(sum(map(len, values)), stored["bytes"])}


def _run_streams(fsync: bool, action: Any) -> Any:
    """Start a 3-bookie cluster, open the bench namespace, and run `action(ns)` in it."""
    from dlog import Namespace

    async def go(cluster: LocalCluster) -> Any:
        async with Namespace(cluster.zk_address, NAMESPACE) as ns:
            return await action(ns, cluster)

    with local_cluster(3, _bookie_args(fsync)) as cluster:
        return asyncio.run(go(cluster))


def bench_streams(records: int = 1_000_000, batch_records: int = 10_000, tail_rate: int = 10_000,
                  tail_seconds: float = 5.0, fsync: bool = True) -> dict[str, Any]:
    """Stream writes (write_batch and per-record write), catch-up read, and tail latency."""

    async def runs(ns: Any, _: LocalCluster) -> list[dict[str, Any]]:
        values = event_values(records)
        return [await _write_batch_run(ns, "batches", values, batch_records),
                await _write_records_run(ns, "records", values[:min(records, 300_000)]),
                await _read_run(ns, "batches"),
                await _stream_tail(ns, "tail", tail_rate, tail_seconds)]

    return {**_stream_header("streams", fsync), "record_bytes": 100, "runs": _run_streams(fsync, runs)}


def bench_write(records: int = 1_000_000, batch_records: int = 10_000,
                write_records: int = 300_000, fsync: bool = True) -> dict[str, Any]:
    """Stream writes: write_batch of Arrow batches, and per-record write() of `write_records`."""

    async def runs(ns: Any, _: LocalCluster) -> list[dict[str, Any]]:
        values = event_values(records)
        return [await _write_batch_run(ns, "batches", values, batch_records),
                await _write_records_run(ns, "records", values[:min(records, write_records)])]

    return {**_stream_header("write", fsync), "record_bytes": 100, "runs": _run_streams(fsync, runs)}


def bench_read(records: int = 1_000_000, batch_records: int = 10_000, fsync: bool = True) -> dict[str, Any]:
    """Catch-up read of a closed segment as Arrow batches (written first with write_batch, untimed)."""

    async def runs(ns: Any, _: LocalCluster) -> list[dict[str, Any]]:
        written = await _write_batch_run(ns, "read", event_values(records), batch_records)
        return [{**written, "run": "write_batch (setup)"}, await _read_run(ns, "read")]

    return {**_stream_header("read", fsync), "record_bytes": 100, "runs": _run_streams(fsync, runs)}


def bench_tail(rate_per_s: int = 10_000, seconds: float = 5.0, fsync: bool = True,
               sweep_rates_per_s: Sequence[int] = ()) -> dict[str, Any]:
    """Write-to-tailing-reader latency at `rate_per_s` (and at each sweep rate), one stream each."""
    rates = sorted({rate_per_s, *sweep_rates_per_s})

    async def runs(ns: Any, _: LocalCluster) -> list[dict[str, Any]]:
        return [await _stream_tail(ns, f"tail-{rate}", rate, seconds) for rate in rates]

    return {**_stream_header("tail", fsync), "record_bytes": 100, "seconds_per_rate": seconds,
            "runs": _run_streams(fsync, runs)}


# ---------------------------------------------------------------------------- scale

# Streams created and writers opened at once in `scale`. Kept low because ledger ids come from a
# compare-and-set on one counter without backoff (bookkeeper.meta.zkstore._allocate_id): at 32
# concurrent creates from this one process, some lost 100 races in a row and failed.
OPEN_CONCURRENCY = 4
PRODUCER_YIELD_RECORDS = 1000  # records a `scale` producer hands out before the loop runs timers
READ_AHEAD_ENTRIES = 256  # StreamReader's default read-ahead, in entries ...
READ_AHEAD_BYTES = 64 * 2**20  # ... and in decoded bytes


async def _bounded(concurrency: int, coroutines: list[Any]) -> list[Any]:
    """Each coroutine's result or exception, at most `concurrency` running at a time."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(coroutine: Any) -> Any:
        async with semaphore:
            return await coroutine

    return await asyncio.gather(*(one(coroutine) for coroutine in coroutines), return_exceptions=True)


def _raise_first(results: list[Any]) -> list[Any]:
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


async def _open_writers(ns: Any, names: list[str]) -> list[Any]:
    """Create each stream and open its writer; on any failure close those that opened."""

    async def open_one(name: str) -> Any:
        await ns.create_stream(name)
        return await ns.open_writer(name)

    results = await _bounded(OPEN_CONCURRENCY, [open_one(name) for name in names])
    if any(isinstance(result, BaseException) for result in results):
        await _bounded(OPEN_CONCURRENCY, [result.close() for result in results
                                          if not isinstance(result, BaseException)])
    return _raise_first(results)


async def _round_robin(writers: list[Any], values: list[bytes]) -> float:
    """Write `values` one by one over the writers in turn; seconds until all are durable."""
    started = time.perf_counter()
    futures = []
    for index, value in enumerate(values):
        writer = writers[index % len(writers)]
        if not writer.writable:
            await writer.wait_writable()
        futures.append(writer.write_nowait(value))
        if index % PRODUCER_YIELD_RECORDS == PRODUCER_YIELD_RECORDS - 1:
            await asyncio.sleep(0)
    await asyncio.gather(*futures)
    return time.perf_counter() - started


async def _scale_run(ns: Any, stream_count: int, values: list[bytes]) -> dict[str, Any]:
    """The same records spread round-robin over `stream_count` streams, each with its own writer.
    The producer lets the event loop run every PRODUCER_YIELD_RECORDS records, as one fed by a
    socket would, so each writer's linger timer fires on time and entries hold what arrived."""
    names = [f"scale-{stream_count}-{index}" for index in range(stream_count)]
    started = time.perf_counter()
    writers = await _open_writers(ns, names)
    open_s = time.perf_counter() - started
    try:
        elapsed_s = await _round_robin(writers, values)
    finally:
        closed = await _bounded(OPEN_CONCURRENCY, [writer.close() for writer in writers])
    _raise_first(closed)
    stored = _raise_first(await _bounded(OPEN_CONCURRENCY, [_stored(ns, name) for name in names]))
    raw_bytes = sum(map(len, values))
    entries = sum(item["entries"] for item in stored)
    return {"run": "spread", "streams": stream_count, "records": len(values),
            "records_per_s": round(len(values) / elapsed_s), "mb_per_s": _mb_per_s(raw_bytes, elapsed_s),
            "entries": entries, "records_per_entry": round(len(values) / max(entries, 1), 1),
            "stored_records": sum(item["records"] for item in stored),
            "compression_ratio": _ratio(raw_bytes, sum(item["bytes"] for item in stored)),
            "open_s": round(open_s, 2)}


async def _answer(connection: Any, timeout_s: float) -> dict[str, Any]:
    """The backlog reader process's next message, without blocking the event loop."""
    ready = await asyncio.get_running_loop().run_in_executor(None, connection.poll, timeout_s)
    if not ready:
        raise DlogError(f"the backlog reader process did not answer within {timeout_s} s")
    message = connection.recv()
    if "error" in message:
        raise DlogError(f"the backlog reader process failed: {message['error']}")
    return message


async def _backlog_run(ns: Any, cluster: LocalCluster, records: int, batch_records: int) -> dict[str, Any]:
    """A reader in its own process opens a stream at its start and reads nothing while `records`
    are written; then it catches up. Its RSS before, while behind, after, and at peak show what
    the backlog costs it: at most READ_AHEAD_ENTRIES decoded entries, whatever the backlog."""
    stream = f"backlog-{records}"
    await ns.create_stream(stream)
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_backlog_reader_main, daemon=True,
                              args=(cluster.zk_address, stream, records, child))
    process.start()
    try:
        before = await _answer(parent, 120)
        values = event_values(records)
        async with ns.open_writer(stream) as writer:
            pending: list[asyncio.Future[Any]] = []
            for start in range(0, records, batch_records):
                pending.append(asyncio.ensure_future(writer.write_batch(values[start: start + batch_records])))
                if len(pending) >= 8:
                    await pending.pop(0)
            await asyncio.gather(*pending)
        parent.send("written")
        after = await _answer(parent, 600)
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join()
    raw_bytes = sum(map(len, values))
    stored = await _stored(ns, stream)
    return {"run": "backlog", "records": records, "entry_records": batch_records,
            "entries": stored["entries"], "backlog_mb": round(raw_bytes / 1e6, 1),
            "stored_mb": round(stored["bytes"] / 1e6, 1), "read_ahead_entries": READ_AHEAD_ENTRIES,
            "read_ahead_mb": round(READ_AHEAD_BYTES / 2**20), **before, **after}


def _backlog_reader_main(zk: str, stream: str, records: int, connection: Any) -> None:
    """Entry point of the backlog reader process: its memory is the reader's alone."""
    try:
        asyncio.run(_backlog_reader(zk, stream, records, connection))
    except BaseException as exc:
        connection.send({"error": repr(exc)})
        raise


async def _backlog_reader(zk: str, stream: str, records: int, connection: Any) -> None:
    from dlog import Namespace

    loop = asyncio.get_running_loop()
    async with Namespace(zk, NAMESPACE) as ns:
        reader = await ns.open_reader(stream, "earliest", read_ahead_entries=READ_AHEAD_ENTRIES,
                                      read_ahead_bytes=READ_AHEAD_BYTES)
        reset = reset_peak_rss()
        connection.send({"rss_before_mb": rss_mb(), "peak_since": "reader opened" if reset else "process start"})
        await loop.run_in_executor(None, connection.recv)  # every record is written now
        behind_mb = sampled_mb = rss_mb()
        started = time.perf_counter()
        read = entries = 0
        while read < records:
            entry = await reader.next_entry(timeout_s=30)
            if entry is None:
                raise DlogError(f"the backlog reader of {stream!r} got nothing for 30 s at record {read}")
            read += entry.batch.num_rows
            entries += 1
            if entries % 16 == 0:
                sampled_mb = max(sampled_mb, rss_mb())
        elapsed_s = time.perf_counter() - started
        await reader.close()
        after_mb = rss_mb()
        # VmHWM misses pages an allocator handed back with madvise, so samples count too
        connection.send({"rss_behind_mb": behind_mb, "rss_after_mb": after_mb,
                         "rss_peak_mb": max(peak_rss_mb(), sampled_mb, after_mb), "records_read": read,
                         "catch_up_records_per_s": round(read / elapsed_s)})


def bench_scale(records: int = 200_000, stream_counts: Sequence[int] = (1, 10, 100, 1000),
                backlog_records: Sequence[int] = (200_000, 2_000_000), backlog_batch_records: int = 1000,
                fsync: bool = True) -> dict[str, Any]:
    """The same records over 1..1,000 streams; a lagging reader's memory behind each backlog."""

    async def runs(ns: Any, cluster: LocalCluster) -> tuple[list[Any], list[Any]]:
        values = event_values(records)
        spread = [await _scale_run(ns, count, values) for count in stream_counts]
        memory = [await _backlog_run(ns, cluster, count, backlog_batch_records) for count in backlog_records]
        return spread, memory

    spread, memory = _run_streams(fsync, runs)
    return {**_stream_header("scale", fsync), "record_bytes": 100,
            "writes": f"per-record write_nowait, round-robin, loop yields every {PRODUCER_YIELD_RECORDS}",
            "runs": spread, "memory": memory}


# ---------------------------------------------------------------------------- limits

JOURNAL_WRITE_BYTES = 4096
SEQUENTIAL_CHUNK_BYTES = 1 << 20


def _journal_writes(path: Path, count: int, zero_filled: bool) -> dict[str, Any]:
    """4 KiB pwrite + fdatasync, one after another, into a preallocated file: the journal's
    floor when every group commit holds one small record."""
    block = os.urandom(JOURNAL_WRITE_BYTES)
    size = count * JOURNAL_WRITE_BYTES
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if zero_filled:
            zeros = bytes(SEQUENTIAL_CHUNK_BYTES)
            for offset in range(0, size, SEQUENTIAL_CHUNK_BYTES):
                os.pwrite(fd, zeros[: min(SEQUENTIAL_CHUNK_BYTES, size - offset)], offset)
        else:
            os.posix_fallocate(fd, 0, size)
        os.fsync(fd)
        latencies = []
        started = time.perf_counter()
        for index in range(count):
            sent = time.perf_counter()
            os.pwrite(fd, block, index * JOURNAL_WRITE_BYTES)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - sent)
        elapsed_s = time.perf_counter() - started
    finally:
        os.close(fd)
        path.unlink()
    how = "zero-filled" if zero_filled else "fallocated"
    return {"run": f"4KiB+fdatasync, {how}", "operations": count,
            "per_s": round(count / elapsed_s), "mb_per_s": _mb_per_s(size, elapsed_s), **percentiles(latencies)}


def _sequential_writes(path: Path, size: int) -> dict[str, Any]:
    """Appending 1 MiB writes, each followed by fdatasync: the disk's streaming bandwidth."""
    chunk = os.urandom(SEQUENTIAL_CHUNK_BYTES)
    count = max(1, size // SEQUENTIAL_CHUNK_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    try:
        latencies = []
        started = time.perf_counter()
        for _ in range(count):
            sent = time.perf_counter()
            os.write(fd, chunk)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - sent)
        elapsed_s = time.perf_counter() - started
    finally:
        os.close(fd)
        path.unlink()
    return {"run": "1MiB append+fdatasync", "operations": count, "per_s": round(count / elapsed_s),
            "mb_per_s": _mb_per_s(count * SEQUENTIAL_CHUNK_BYTES, elapsed_s), **percentiles(latencies)}


def _loopback_round_trips(count: int, message_bytes: int = 64) -> dict[str, Any]:
    """Blocking TCP ping-pong over 127.0.0.1 with an echo server in a thread (TCP_NODELAY both
    ways): the floor under any request/response between our processes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := connection.recv(65536):
                connection.sendall(data)

    server = threading.Thread(target=echo, name="bench-echo", daemon=True)
    server.start()
    message = os.urandom(message_bytes)
    latencies = []
    with socket.create_connection(listener.getsockname()) as client:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.perf_counter()
        for _ in range(count):
            sent = time.perf_counter()
            client.sendall(message)
            received = 0
            while received < message_bytes:
                received += len(client.recv(message_bytes - received))
            latencies.append(time.perf_counter() - sent)
        elapsed_s = time.perf_counter() - started
    server.join(5)
    listener.close()
    return {"run": f"loopback TCP {message_bytes}B ping-pong", "operations": count,
            "per_s": round(count / elapsed_s), **percentiles(latencies)}


def bench_limits(directory: Path | None = None, journal_writes: int = 5000,
                 sequential_bytes: int = 256 << 20, round_trips: int = 20_000) -> dict[str, Any]:
    """What this machine can do at all, without dlog: small synced writes, synced streaming
    writes, loopback round trips. Files go to `directory` (default: the temporary directory,
    where the other modes put their bookies)."""
    with tempfile.TemporaryDirectory(prefix="dlog-limits-", dir=directory) as scratch:
        base = Path(scratch)
        runs = [_journal_writes(base / "journal-fallocate", journal_writes, zero_filled=False),
                _journal_writes(base / "journal-zeroed", journal_writes, zero_filled=True),
                _sequential_writes(base / "sequential", sequential_bytes),
                _loopback_round_trips(round_trips)]
        where = str(Path(scratch).parent.resolve())
    return {"mode": "limits", "fsync": True, "directory": where, "runs": runs}


# ---------------------------------------------------------------------------- compare

ENSURE_REDIS = "scripts/ensure-redis.sh"
REDIS_READ_COUNT = 10_000  # entries per XREAD, as dlog reads ranges of entries


def _check_redis() -> str:
    """The redis-server path; refuses clearly when the server or the client package is missing."""
    server = shutil.which("redis-server")
    try:
        import redis  # noqa: F401
    except ImportError:
        raise DlogError(f"dlog bench compare needs the Python package redis in this environment: "
                        f"run {ENSURE_REDIS} (it installs redis-server and the redis package)") from None
    if server is None:
        raise DlogError(f"dlog bench compare needs Debian's redis-server on PATH: run {ENSURE_REDIS}")
    return server


@contextmanager
def redis_server(server: str, directory: Path, fsync: bool) -> Iterator[int]:
    """Our own redis-server on a free loopback port, AOF with fsync on every write (or never);
    stopped by its pid at the end. Yields the port."""
    import redis

    port = free_port()
    log_path = directory / "redis.log"
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--appendonly", "yes",
         "--appendfsync", "always" if fsync else "no", "--save", "", "--dir", str(directory),
         "--daemonize", "no", "--logfile", str(log_path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent)
    try:
        deadline = time.monotonic() + 15
        client = redis.Redis(host="127.0.0.1", port=port)
        while True:
            if process.poll() is not None:
                log = log_path.read_text()[-2000:] if log_path.exists() else ""
                raise DlogError(f"redis-server exited with status {process.returncode}: {log}")
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise DlogError(f"redis-server did not answer on port {port} within 15 s") from None
                time.sleep(0.05)
        client.close()
        yield port
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _redis_py_label() -> str:
    import redis
    from redis.utils import HIREDIS_AVAILABLE

    return f"redis-py {redis.__version__}" + (" + hiredis" if HIREDIS_AVAILABLE else " (no hiredis)")


async def _redis_runs(port: int, directory: Path, values: list[bytes], batch_records: int,
                      in_flight: int) -> list[dict[str, Any]]:
    """XADD pipelines of `batch_records`, `in_flight` at once over as many connections, then
    XREAD catch-up from the start, with the ordinary Python client."""
    import redis.asyncio as aioredis

    client = aioredis.Redis(host="127.0.0.1", port=port, max_connections=in_flight + 1)
    semaphore = asyncio.Semaphore(in_flight)

    async def pipeline(chunk: list[bytes]) -> None:
        async with semaphore:
            pipe = client.pipeline(transaction=False)
            for value in chunk:
                pipe.xadd("events", {b"v": value})
            await pipe.execute()

    raw_bytes = sum(map(len, values))
    started = time.perf_counter()
    await asyncio.gather(*(pipeline(values[start: start + batch_records])
                           for start in range(0, len(values), batch_records)))
    write_s = time.perf_counter() - started
    stored_records = await client.xlen("events")
    memory_bytes = await client.memory_usage("events", samples=0)
    # Redis 7 keeps a multi-part AOF: a base file (RDB after an automatic rewrite) plus increments
    aof_bytes = sum(path.stat().st_size for path in directory.rglob("*") if path.is_file()
                    and path.name != "redis.log")

    started = time.perf_counter()
    last_id, read, read_bytes, first, last = b"0-0", 0, 0, None, None
    while read < stored_records:
        answer = await client.xread({"events": last_id}, count=REDIS_READ_COUNT)
        if not answer:
            raise DlogError(f"redis XREAD returned nothing after {read} of {stored_records} entries")
        entries = answer[0][1]
        read += len(entries)
        read_bytes += sum(len(fields[b"v"]) for _, fields in entries)
        first = first if first is not None else entries[0][1][b"v"]
        last_id, last = entries[-1][0], entries[-1][1][b"v"]
    read_s = time.perf_counter() - started
    await client.aclose()
    if (first, last) != (values[0], values[-1]):
        raise DlogError("redis read back other values than were written")
    client_label = _redis_py_label()
    return [{"system": "redis", "client": client_label, "run": "write", "records": len(values),
             "stored_records": stored_records, "records_per_s": round(len(values) / write_s),
             "mb_per_s": _mb_per_s(raw_bytes, write_s), "stored_as": "AOF files on disk",
             "stored_mb": round(aof_bytes / 1e6, 1), "compression_ratio": _ratio(raw_bytes, aof_bytes),
             "memory_mb": round(memory_bytes / 1e6, 1)},
            {"system": "redis", "client": client_label, "run": "read", "records": read,
             "records_per_s": round(read / read_s), "mb_per_s": _mb_per_s(read_bytes, read_s),
             "as": f"XREAD COUNT {REDIS_READ_COUNT}"}]


def _redis_benchmark(tool: str, port: int, arguments: list[str]) -> float:
    """Requests per second that redis-benchmark reports (its --csv line for the one test)."""
    result = subprocess.run([tool, "-h", "127.0.0.1", "-p", str(port), "--csv", *arguments],
                            capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line and not line.startswith('"test"')]
    if result.returncode != 0 or not lines:
        raise DlogError(f"redis-benchmark failed ({result.returncode}): {result.stderr[-500:]}")
    # the test name echoes the command, quotes and commas included: count the 7 figures from the end
    return float(lines[-1].rstrip('"').split('","')[-7])


def _redis_c_client_runs(port: int, value: bytes, records: int, batch_records: int,
                         in_flight: int) -> list[dict[str, Any]]:
    """The server's ceiling with Redis's own C client: the same pipeline depth and concurrency,
    one value repeated (Redis stores values as they are, so their content does not matter to it);
    reads repeat XRANGE of the first REDIS_READ_COUNT entries."""
    tool = shutil.which("redis-benchmark")
    if tool is None:
        return []
    write_per_s = _redis_benchmark(tool, port, ["-P", str(batch_records), "-c", str(in_flight),
                                                "-n", str(records), "XADD", "events-c", "*", "v", value.decode()])
    requests = max(1, records // REDIS_READ_COUNT)
    per_request = min(records, REDIS_READ_COUNT)
    read_per_s = _redis_benchmark(tool, port, ["-P", "1", "-c", "1", "-n", str(requests),
                                               "XRANGE", "events-c", "-", "+", "COUNT", str(REDIS_READ_COUNT)])
    client = "redis-benchmark (C)"
    return [{"system": "redis", "client": client, "run": "write", "records": records,
             "records_per_s": round(write_per_s), "mb_per_s": round(write_per_s * len(value) / 1e6, 1)},
            {"system": "redis", "client": client, "run": "read", "records": requests * per_request,
             "records_per_s": round(read_per_s * per_request),
             "mb_per_s": round(read_per_s * per_request * len(value) / 1e6, 1),
             "as": f"XRANGE - + COUNT {REDIS_READ_COUNT}, repeated"}]


async def _dlog_compare_runs(ns: Any, values: list[bytes], batch_records: int,
                             in_flight: int) -> list[dict[str, Any]]:
    """write_batch of the same values in the same chunks (a list of values per call, so building
    the Arrow batch is timed as Redis's command encoding is), then a catch-up read."""
    await ns.create_stream("compare")
    async with ns.open_writer("compare") as writer:
        started = time.perf_counter()
        pending: list[asyncio.Future[Any]] = []
        for start in range(0, len(values), batch_records):
            pending.append(asyncio.ensure_future(writer.write_batch(values[start: start + batch_records])))
            if len(pending) >= in_flight:
                await pending.pop(0)
        await asyncio.gather(*pending)
        write_s = time.perf_counter() - started
    raw_bytes = sum(map(len, values))
    stored = await _stored(ns, "compare")
    read = await _read_run(ns, "compare")
    client = "dlog (Python)"
    return [{"system": "dlog", "client": client, "run": "write", "records": len(values),
             "stored_records": stored["records"], "records_per_s": round(len(values) / write_s),
             "mb_per_s": _mb_per_s(raw_bytes, write_s), "stored_as": "zstd Arrow entries (each copy)",
             "stored_mb": round(stored["bytes"] / 1e6, 1), "compression_ratio": _ratio(raw_bytes, stored["bytes"])},
            {"system": "dlog", "client": client, "run": "read", "records": read["records"],
             "records_per_s": read["records_per_s"], "mb_per_s": read["mb_per_s"], "as": "arrow batches"}]


def _ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """dlog/redis records per second for each run, against each Redis client measured."""
    dlog = {run["run"]: run for run in runs if run["system"] == "dlog"}
    return [{"run": run["run"], "redis_client": run["client"],
             "dlog_records_per_s": dlog[run["run"]]["records_per_s"],
             "redis_records_per_s": run["records_per_s"],
             "dlog_over_redis": round(dlog[run["run"]]["records_per_s"] / max(run["records_per_s"], 1), 2)}
            for run in runs if run["system"] == "redis"]


def bench_compare(records: int = 1_000_000, batch_records: int = 1000, in_flight: int = 8,
                  fsync: bool = True) -> dict[str, Any]:
    """The same write and catch-up read workload on dlog and on Redis Streams, one after the other
    on this machine; figures side by side and as ratios dlog/redis."""
    server = _check_redis()
    values = event_values(records)

    async def dlog_side(ns: Any, _: LocalCluster) -> list[dict[str, Any]]:
        return await _dlog_compare_runs(ns, values, batch_records, in_flight)

    runs = _run_streams(fsync, dlog_side)
    with tempfile.TemporaryDirectory(prefix="dlog-bench-redis-") as scratch:
        with redis_server(server, Path(scratch), fsync) as port:
            runs += asyncio.run(_redis_runs(port, Path(scratch), values, batch_records, in_flight))
            runs += _redis_c_client_runs(port, values[0], records, batch_records, in_flight)
    return {"mode": "compare", "fsync": fsync, "record_bytes": 100, "batch_records": batch_records,
            "in_flight": in_flight,
            "dlog": DLOG_DURABILITY if fsync else DLOG_NO_FSYNC,
            "redis": ("redis-server, appendonly yes, appendfsync " + ("always" if fsync else "no (NOT durable)")
                      + ", single node, no replication; XADD pipelines, XREAD catch-up"),
            "runs": runs, "ratios": _ratios(runs)}
