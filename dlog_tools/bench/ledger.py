"""`dlog bench bookie` (raw adds against one bookie process) and `dlog bench ledger` (appends
through the ledger client at E3/Qw2/Qa2 on three bookie processes)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any

from bookkeeper.clock import perf_s
from bookkeeper.errors import DlogError
from bookkeeper.protocol.batch import encode_add_batch
from bookkeeper.protocol.entry import Digest, DigestType, master_key, pack_entry
from bookkeeper.protocol.wire import (
    AddRequest,
    ErrorResponse,
    ResponseDecoder,
    encode_request,
)
from bookkeeper.runtime import tune_garbage_collector
from dlog_tools.bench.common import (
    PASSWORD,
    CpuMeter,
    bookie_args,
    client_security,
    event_payload,
    local_cluster,
    percentiles,
)
from dlog_tools.bench.explain import TailExplainer
from dlog_tools.bench.profile import Profiler
from dlog_tools.cluster import LocalCluster

# ---------------------------------------------------------------------------- bookie


class _RawAdder(asyncio.Protocol):
    """Keeps `in_flight` pre-encoded add frames outstanding on one connection and times each; a
    frame holds `per_frame` entries (an ADD_BATCH when more than one)."""

    def __init__(self, frames: list[bytes], in_flight: int, per_frame: int,
                 done: asyncio.Future[list[float]]) -> None:
        self.frames = frames
        self.in_flight = in_flight
        self.per_frame = per_frame
        self.done = done
        self.decoder = ResponseDecoder()
        self.sent_at: list[float] = [0.0] * len(frames)
        self.latencies: list[float] = []
        self.answered = 0
        self.next_index = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._send(min(self.in_flight, len(self.frames)))

    def _send(self, count: int) -> None:
        now = perf_s()
        start = self.next_index
        end = min(len(self.frames), start + count)
        for index in range(start, end):
            self.sent_at[index] = now
        self.next_index = end
        if end > start:
            self.transport.write(b"".join(self.frames[start:end]))  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        self.decoder.receive_data(data)
        now = perf_s()
        answered = 0
        while (response := self.decoder.next_message()) is not None:
            if isinstance(response, ErrorResponse) or getattr(response, "failures", None):
                self.done.set_exception(RuntimeError(f"add failed: {response}"))
                return
            self.latencies += [now - self.sent_at[response.request_id]] * self.per_frame
            answered += 1
        self.answered += answered
        self._send(answered)
        if self.answered == len(self.frames) and not self.done.done():
            self.done.set_result(self.latencies)


def _add_frames(ledger_id: int, count: int, size: int, per_frame: int) -> list[bytes]:
    """`count` entries as single ADD frames (`per_frame` 1) or ADD_BATCH frames of `per_frame`."""
    key, digest = master_key(PASSWORD), Digest.for_ledger(DigestType.CRC32C, PASSWORD)
    entries = [pack_entry(digest, ledger_id, index, index - 1, 0, event_payload(index, size))
               for index in range(count)]
    if per_frame == 1:
        return [encode_request(AddRequest(index, ledger_id, index, key, entry))
                for index, entry in enumerate(entries)]
    return [encode_add_batch(index, [(ledger_id, key, False, entries[start: start + per_frame])])
            for index, start in enumerate(range(0, count, per_frame))]


async def _raw_adds(address: str, ledger_id: int, count: int, size: int, in_flight: int,
                    per_frame: int, meter: CpuMeter) -> dict[str, Any]:
    per_frame = min(per_frame, in_flight)
    count -= count % per_frame
    frames = _add_frames(ledger_id, count, size, per_frame)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[list[float]] = loop.create_future()
    host, _, port = address.rpartition(":")
    meter.start()
    started = perf_s()
    transport, _ = await loop.create_connection(
        lambda: _RawAdder(frames, max(1, in_flight // per_frame), per_frame, done), host, int(port))
    latencies = await done
    elapsed_s = perf_s() - started
    transport.close()
    return {"entries": count, "entry_bytes": size, "in_flight": in_flight,
            "frame": "ADD" if per_frame == 1 else f"ADD_BATCH of {per_frame}",
            "adds_per_s": round(count / elapsed_s), **percentiles(latencies),
            "bookie_cpu_us_per_add": meter.per_op(count)["bookies_cpu_us_per_op"]}


def bench_bookie(entries: int = 200_000, sizes: tuple[int, ...] = (100, 1024),
                 in_flights: tuple[int, ...] = (1, 64), fsync: bool = True,
                 batches: tuple[int, ...] = (1, 16)) -> dict[str, Any]:
    """Raw adds against one bookie process, each run on a fresh ledger: single ADD frames, and
    (with more than one in flight) ADD_BATCH frames of each of `batches` entries."""
    args = [] if fsync else ["--no-fsync"]
    runs = []
    with local_cluster(1, args) as cluster:
        address = cluster.bookies[0].address
        ledger_id = 1
        for size in sizes:
            for in_flight in in_flights:
                count = entries if in_flight > 1 else min(entries, 20_000)
                for per_frame in sorted({1, *(batch for batch in batches if batch <= in_flight)}):
                    runs.append(asyncio.run(_raw_adds(address, ledger_id, count, size, in_flight,
                                                      per_frame, CpuMeter(cluster))))
                    ledger_id += 1
    return {"mode": "bookie", "fsync": fsync, "bookies": 1, "runs": runs}


# ---------------------------------------------------------------------------- ledger


async def _throughput(client: Any, cluster: LocalCluster, entries: int, in_flight: int,
                      batch_entries: int) -> dict[str, Any]:
    """`entries` appends of 100 B with `in_flight` outstanding: one future per append, or with
    `batch_entries` > 0 one `append_batch` call (one future) per that many entries."""
    handle = await client.create_ledger(3, 2, 2, password=PASSWORD)
    payloads = [event_payload(index, 100) for index in range(entries)]
    meter = CpuMeter(cluster).start()
    started = perf_s()
    if batch_entries:
        await _append_batches(handle, payloads, in_flight, batch_entries)
    else:
        await _append_each(handle, payloads, in_flight)
    elapsed_s = perf_s() - started
    cpu = meter.per_op(entries)
    await handle.close()
    return {"run": "throughput", "entries": entries, "entry_bytes": 100, "in_flight": in_flight,
            "batch_entries": batch_entries or 1, "appends_per_s": round(entries / elapsed_s), **cpu}


async def _append_each(handle: Any, payloads: list[bytes], in_flight: int) -> None:
    semaphore = asyncio.Semaphore(in_flight)

    def release(_: object) -> None:
        semaphore.release()

    futures = []
    for payload in payloads:
        await semaphore.acquire()
        future = handle.append_async(payload)
        future.add_done_callback(release)
        futures.append(future)
    await asyncio.gather(*futures)


async def _append_batches(handle: Any, payloads: list[bytes], in_flight: int, batch_entries: int) -> None:
    """At most `in_flight` entries outstanding, appended `batch_entries` at a time."""
    pending: collections.deque[tuple[asyncio.Future[int], int]] = collections.deque()
    outstanding = 0
    for start in range(0, len(payloads), batch_entries):
        chunk = payloads[start: start + batch_entries]
        while pending and outstanding + len(chunk) > in_flight:
            future, count = pending.popleft()
            await future
            outstanding -= count
        pending.append((handle.append_batch(chunk), len(chunk)))
        outstanding += len(chunk)
    for future, _ in pending:
        await future


CHECKPOINT_TAIL_S = 12.0  # longer than the bookies' checkpoint interval (10 s)


async def _ledger_runs(cluster: LocalCluster, entries: int, in_flight: int, latency_entries: int,
                       rates_per_s: Sequence[int], batch_entries: int = 0,
                       checkpoint_entries: int = 0,
                       checkpoint_seconds: float = CHECKPOINT_TAIL_S, explain: bool = False) -> list[dict[str, Any]]:
    from bookkeeper.client import BookKeeper

    runs = []
    async with BookKeeper(zk=cluster.zk_address, security=client_security(cluster, admin=True)) as client:
        runs.append(await _throughput(client, cluster, entries, in_flight, batch_entries))

        handle = await client.create_ledger(3, 2, 2, password=PASSWORD)
        latencies = []
        for index in range(latency_entries):
            sent = perf_s()
            await handle.append(event_payload(index, 1024))
            latencies.append(perf_s() - sent)
        runs.append({"run": "sequential", "entries": latency_entries, "entry_bytes": 1024,
                     "in_flight": 1, **percentiles(latencies)})
        await handle.close()

        explained = cluster if explain else None
        for rate_per_s in rates_per_s:
            runs.append(await _tail_latency(client, rate_per_s, latency_entries, explained))
        if checkpoint_entries:
            runs.append(await _tail_during_checkpoint(client, cluster, rates_per_s[0], checkpoint_entries,
                                                      checkpoint_seconds, explained))
    return runs


def _checkpoints(cluster: LocalCluster) -> int:
    """Checkpoints completed by all bookies (their /metrics)."""
    import urllib.request

    total = 0
    for bookie in cluster.bookies:
        if bookie.http is None:
            continue
        with urllib.request.urlopen(f"{bookie.http}/metrics", timeout=10) as answer:
            found = [line for line in answer.read().decode().splitlines()
                     if line.startswith("dlog_bookie_checkpoints_total ")]
        if not found:  # a renamed metric would otherwise read as "no checkpoint ran"
            raise DlogError(f"bookie at {bookie.http} has no dlog_bookie_checkpoints_total metric")
        total += int(float(found[0].split()[1]))
    return total


async def _tail_during_checkpoint(client: Any, cluster: LocalCluster, rate_per_s: int,
                                  entries: int, seconds: float,
                                  explain: LocalCluster | None = None) -> dict[str, Any]:
    """Append-to-tail latency at `rate_per_s` for `seconds` (by default longer than the bookies'
    10 s checkpoint interval) right after `entries` entries were written, which the bookies'
    next checkpoint moves to entry logs meanwhile; `checkpoints` says how many ran."""
    loader = await client.create_ledger(3, 2, 2, password=PASSWORD)
    payloads = [event_payload(index, 100) for index in range(entries)]
    await _append_batches(loader, payloads, 4096, 512)
    await loader.close()
    before = await asyncio.to_thread(_checkpoints, cluster)
    count = max(1, int(rate_per_s * seconds))
    result = await _tail_latency(client, rate_per_s, count, explain)
    after = await asyncio.to_thread(_checkpoints, cluster)
    return {**result, "run": "tail during checkpoint", "checkpointed_entries": entries,
            "checkpoints": after - before}


async def _tail_latency(client: Any, rate_per_s: int, count: int,
                        explain: LocalCluster | None = None) -> dict[str, Any]:
    """Append at a fixed rate; a tailing reader records when each entry reaches it. `explain` (the
    cluster): also time each append's acknowledgement and probe the client's loop and the bookies'
    histograms, for the stages under "explain" (dlog_tools/bench/explain.py)."""
    handle = await client.create_ledger(3, 2, 2, password=PASSWORD)
    reader = await client.open_ledger(handle.ledger_id, password=PASSWORD, recovery=False)
    sent_at: dict[int, float] = {}
    latencies: list[float] = []
    explainer = TailExplainer(explain, count) if explain else None

    async def follow() -> None:
        async for entry in reader.tail(0, poll_timeout_ms=1000):
            now = perf_s()
            latencies.append(now - sent_at[entry.entry_id])
            if explainer:
                explainer.seen(entry.entry_id, now)
            if entry.entry_id == count - 1:
                return

    if explainer:
        await explainer.start()
    tail = asyncio.create_task(follow())
    interval_s = 1 / rate_per_s
    started = perf_s()
    for index in range(count):
        delay_s = started + index * interval_s - perf_s()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        sent_at[index] = perf_s()
        future = handle.append_async(event_payload(index, 100))
        if explainer:
            explainer.time_ack(future, index)
    offered_s = perf_s() - started
    async with asyncio.timeout(60):
        await tail
    await handle.close()
    stages: dict[str, Any] = {}
    if explainer:
        stages["explain"] = await explainer.rows(rate_per_s, sent_at, latencies, call="append_async()")
    return {**stages, "run": "tail", "entries": count, "rate_per_s": rate_per_s,
            "achieved_per_s": round(count / max(offered_s, interval_s)), **percentiles(latencies)}


def bench_ledger(entries: int = 100_000, in_flight: int = 256, latency_entries: int = 5_000,
                 rate_per_s: int = 1000, fsync: bool = True,
                 sweep_rates_per_s: Sequence[int] = (), secure: bool = False,
                 batch_entries: int = 0, checkpoint_entries: int = 0,
                 checkpoint_seconds: float = CHECKPOINT_TAIL_S, profiler: Profiler | None = None,
                 explain: bool = False) -> dict[str, Any]:
    """Throughput, sequential latency, and tail latency at `rate_per_s` (and at each sweep rate,
    for a chart of latency against offered throughput); `explain`: the stages of each tail run
    under "explain" (the bookies run with --latency-probes)."""
    rates = sorted({rate_per_s, *sweep_rates_per_s})
    tune_garbage_collector()  # as run_streams does (common.py)
    args = bookie_args(fsync) + (["--latency-probes"] if explain else [])
    with local_cluster(3, args, secure=secure, profiler=profiler) as cluster:
        runs = asyncio.run(_ledger_runs(cluster, entries, in_flight, latency_entries,
                                        [rate_per_s, *(rate for rate in rates if rate != rate_per_s)],
                                        batch_entries, checkpoint_entries, checkpoint_seconds, explain))
    stages = [{"run": run["run"], **row} for run in runs for row in run.pop("explain", [])]
    return {"mode": "ledger", "fsync": fsync, "bookies": 3, "quorum": "E3/Qw2/Qa2",
            **({"security": "TLS + token auth + ZooKeeper ACLs (admin token)"} if secure else {}),
            "runs": runs, **({"explain": stages} if explain else {})}

