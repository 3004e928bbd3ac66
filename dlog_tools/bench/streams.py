"""`dlog bench write`, `read`, `tail` and `streams`: stream writes (`write_batch()` and per-record
`write()`), catch-up reads as Arrow batches, and write-to-tailing-reader latency."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any

import pyarrow.compute as pc

from bookkeeper.clock import perf_s
from bookkeeper.errors import DlogError
from dlog.segments.codec import records_to_batch
from dlog_tools.bench.common import (
    CpuMeter,
    event_values,
    mb_per_s,
    percentiles,
    ratio,
    run_streams,
    stored_totals,
    stream_header,
)
from dlog_tools.bench.explain import TailExplainer
from dlog_tools.bench.profile import Profiler
from dlog_tools.cluster import LocalCluster


async def _write_batch_run(ns: Any, stream: str, values: list[bytes], batch_records: int,
                           in_flight: int = 8, producer_id: str | None = None) -> dict[str, Any]:
    """write_batch of pre-built Arrow batches, `in_flight` batches outstanding (`producer_id`: as a
    named idempotent producer, the writer numbering the records)."""
    await ns.create_stream(stream)
    batches = [records_to_batch(values[start: start + batch_records])
               for start in range(0, len(values), batch_records)]
    async with ns.open_writer(stream, **_producer(producer_id)) as writer:
        started = perf_s()
        pending: list[asyncio.Future[Any]] = []
        for batch in batches:
            pending.append(asyncio.ensure_future(writer.write_batch(batch)))
            if len(pending) >= in_flight:
                await pending.pop(0)
        await asyncio.gather(*pending)
        elapsed_s = perf_s() - started
    raw_bytes = sum(map(len, values))
    stored = await stored_totals(ns, stream)
    return {"run": "write_batch", "records": len(values), "batch_records": batch_records,
            "in_flight": in_flight, "records_per_s": round(len(values) / elapsed_s),
            "mb_per_s": mb_per_s(raw_bytes, elapsed_s), "entries": stored["entries"],
            "stored_records": stored["records"], "compression_ratio": ratio(raw_bytes, stored["bytes"])}


async def _write_records_run(ns: Any, stream: str, values: list[bytes]) -> dict[str, Any]:
    """Per-record write, pipelined: write_nowait, waiting only when the writer's buffer is full."""
    await ns.create_stream(stream)
    async with ns.open_writer(stream) as writer:
        meter = CpuMeter().start()
        started = perf_s()
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
        elapsed_s = perf_s() - started
        cpu = meter.per_op(len(values))
    return await _per_record_result(ns, stream, "write", values, elapsed_s, cpu)


async def gathered_run(ns: Any, stream: str, values: list[bytes], every: int = 5_000) -> dict[str, Any]:
    """The usual producer loop: write_nowait each record, keeping the futures, and gather them
    every `every` records (no wait_writable: `every` records stay far below the buffer bound)."""
    await ns.create_stream(stream)
    async with ns.open_writer(stream) as writer:
        meter = CpuMeter().start()
        started = perf_s()
        futures: list[asyncio.Future[Any]] = []
        for value in values:
            futures.append(writer.write_nowait(value))
            if len(futures) >= every:
                await asyncio.gather(*futures)
                futures = []
        await asyncio.gather(*futures)
        elapsed_s = perf_s() - started
        cpu = meter.per_op(len(values))
    result = await _per_record_result(ns, stream, "write_nowait_gathered", values, elapsed_s, cpu)
    return {**result, "gathered_every": every}


def _producer(producer_id: str | None) -> dict[str, Any]:
    return {} if producer_id is None else {"producer_id": producer_id}


async def offer_run(ns: Any, stream: str, values: list[bytes], producer_id: str | None = None) -> dict[str, Any]:
    """The documented fast path of per-record writes: `offer()` each record (no future, no task),
    checking `writable` as a producer must, then one `flush()` for all of their outcomes
    (`producer_id`: as a named idempotent producer, the writer numbering the records)."""
    await ns.create_stream(stream)
    async with ns.open_writer(stream, **_producer(producer_id)) as writer:
        meter = CpuMeter().start()
        started = perf_s()
        offer = writer.offer
        for value in values:
            if not writer.writable:
                await writer.wait_writable()
            offer(value)
        await writer.flush()
        elapsed_s = perf_s() - started
        cpu = meter.per_op(len(values))
    return await _per_record_result(ns, stream, "offer", values, elapsed_s, cpu)


async def _per_record_result(ns: Any, stream: str, run: str, values: list[bytes], elapsed_s: float,
                             cpu: dict[str, Any]) -> dict[str, Any]:
    """A per-record run's figures: records/s and MB/s, and what the stream stored."""
    raw_bytes = sum(map(len, values))
    stored = await stored_totals(ns, stream)
    return {"run": run, "records": len(values), "records_per_s": round(len(values) / elapsed_s),
            "mb_per_s": mb_per_s(raw_bytes, elapsed_s), "entries": stored["entries"],
            "stored_records": stored["records"], "compression_ratio": ratio(raw_bytes, stored["bytes"]),
            **cpu}


async def sequential_run(ns: Any, stream: str, values: list[bytes]) -> dict[str, Any]:
    """One awaited write() at a time (the README's loop): each record's latency, and records/s."""
    await ns.create_stream(stream)
    latencies: list[float] = []
    async with ns.open_writer(stream) as writer:
        started = perf_s()
        for value in values:
            before = perf_s()
            await writer.write(value)
            latencies.append(perf_s() - before)
        elapsed_s = perf_s() - started
    return {"run": "sequential", "records": len(values), "records_per_s": round(len(values) / elapsed_s),
            **percentiles(latencies)}


async def read_run(ns: Any, stream: str) -> dict[str, Any]:
    """Catch-up read of a stream whose segments are all completed, entry by entry as Arrow
    batches (`next_entry`), without following the tail."""
    stored = await stored_totals(ns, stream)
    reader = await ns.open_reader(stream, follow=False)
    started = perf_s()
    records = entries = raw_bytes = 0
    while (entry := await reader.next_entry()) is not None:
        records += entry.batch.num_rows
        raw_bytes += pc.sum(pc.binary_length(entry.batch.column("value"))).as_py() or 0
        entries += 1
    elapsed_s = perf_s() - started
    await reader.close()
    return {"run": "read", "records": records, "entries": entries, "segments": stored["segments"],
            "as": "arrow batches", "records_per_s": round(records / elapsed_s),
            "mb_per_s": mb_per_s(raw_bytes, elapsed_s), "compression_ratio": ratio(raw_bytes, stored["bytes"])}


async def _stream_tail(ns: Any, stream: str, rate_per_s: int, seconds: float,
                       explain: LocalCluster | None = None) -> dict[str, Any]:
    """Write realistic values at a fixed rate; a tailing reader records each record's
    write-to-read latency (the value's last 8 bytes say which write it was). `explain` (the
    cluster): also time each record's acknowledgement and probe the client's loop and the
    bookies' histograms, for the stages under "explain" (dlog_tools/bench/explain.py)."""
    await ns.create_stream(stream)
    writer = await ns.open_writer(stream)
    reader = await ns.open_reader(stream, "latest")
    count = max(1, int(rate_per_s * seconds))
    values = event_values(count)
    sent_at: list[float] = [0.0] * count
    latencies: list[float] = []
    explainer = TailExplainer(explain, count) if explain else None

    async def follow() -> None:
        while len(latencies) < count:
            entry = await reader.next_entry(timeout_s=30)
            if entry is None:
                raise DlogError(f"the tailing reader of stream {stream!r} stalled for 30 s")
            now = perf_s()
            for value in entry.batch.column("value").to_pylist():
                index = int(value[-8:])
                latencies.append(now - sent_at[index])
                if explainer:
                    explainer.seen(index, now)

    if explainer:
        await explainer.start()
    task = asyncio.create_task(follow())
    started = perf_s()
    written = 0
    while written < count:
        due = min(count, int((perf_s() - started) * rate_per_s) + 1)
        while written < due:
            sent_at[written] = perf_s()
            future = writer.write_nowait(values[written])
            if explainer:
                explainer.time_ack(future, written)
            written += 1
        await asyncio.sleep(0.001)
    offered_s = perf_s() - started
    async with asyncio.timeout(60):
        await task
    await reader.close()
    await writer.close()
    stages: dict[str, Any] = {}
    if explainer:
        stages["explain"] = await explainer.rows(rate_per_s, sent_at, latencies, call="write()")
    stored = await stored_totals(ns, stream)
    return {**stages, "run": "tail", "records": count, "rate_per_s": rate_per_s,
            "achieved_per_s": round(count / max(offered_s, 1 / rate_per_s)), **percentiles(latencies),
            "records_per_entry": round(count / max(stored["entries"], 1), 1),
            "compression_ratio": ratio(sum(map(len, values)), stored["bytes"])}


def bench_streams(records: int = 1_000_000, batch_records: int = 10_000, tail_rate: int = 10_000,
                  tail_seconds: float = 5.0, fsync: bool = True, profiler: Profiler | None = None) -> dict[str, Any]:
    """Stream writes (write_batch and per-record write), catch-up read, and tail latency."""

    async def runs(ns: Any, _: LocalCluster) -> list[dict[str, Any]]:
        values = event_values(records)
        return [await _write_batch_run(ns, "batches", values, batch_records),
                await _write_records_run(ns, "records", values[:min(records, 300_000)]),
                await read_run(ns, "batches"),
                await _stream_tail(ns, "tail", tail_rate, tail_seconds)]

    return {**stream_header("streams", fsync), "record_bytes": 100,
            "runs": run_streams(fsync, runs, profiler=profiler)}


def bench_write(records: int = 1_000_000, batch_records: int = 10_000,
                write_records: int = 300_000, sequential_records: int = 5_000, fsync: bool = True,
                secure: bool = False, streams: int = 1, profiler: Profiler | None = None) -> dict[str, Any]:
    """Stream writes: write_batch of Arrow batches, pipelined per-record write_nowait() of
    `write_records` and the same records with offer() (with `streams` > 1, both spread
    round-robin over that many streams, one writer each), and `sequential_records` awaited one
    at a time."""
    from dlog_tools.bench.scale import spread_run

    async def runs(ns: Any, _: LocalCluster) -> list[dict[str, Any]]:
        values = event_values(records)
        per_record = values[:min(records, write_records)]
        if streams > 1:
            return [await _write_batch_run(ns, "batches", values, batch_records),
                    await spread_run(ns, streams, per_record),
                    await spread_run(ns, streams, per_record, offer=True)]
        return [await _write_batch_run(ns, "batches", values, batch_records),
                await _write_records_run(ns, "records", per_record),
                await gathered_run(ns, "gathered", per_record),
                await offer_run(ns, "offered", per_record),
                await sequential_run(ns, "sequential", values[:min(records, sequential_records)])]

    return {**stream_header("write", fsync, secure), "record_bytes": 100,
            "runs": run_streams(fsync, runs, secure, profiler)}


def bench_idempotent(records: int = 1_000_000, batch_records: int = 10_000, offer_records: int = 300_000,
                     rounds: int = 2, fsync: bool = True) -> dict[str, Any]:
    """What a named idempotent producer (`open_writer(name, producer_id=...)`) costs: write_batch and
    offer throughput without and with a producer id in the same run, alternating `rounds` times
    (the best of each kind counts: the machine is shared), and the cost of each as a percentage."""

    async def runs(ns: Any, _: LocalCluster) -> list[dict[str, Any]]:
        values = event_values(records)
        per_record = values[:min(records, offer_records)]
        results: list[dict[str, Any]] = []
        for index in range(rounds):
            for producer_id in (None, "bench"):
                kind = "plain" if producer_id is None else "idempotent"
                batch = await _write_batch_run(ns, f"batch-{kind}-{index}", values, batch_records,
                                               producer_id=producer_id)
                offered = await offer_run(ns, f"offer-{kind}-{index}", per_record, producer_id)
                results += [{**batch, "run": f"write_batch {kind}"}, {**offered, "run": f"offer {kind}"}]
        return results

    result = {**stream_header("dedup", fsync), "record_bytes": 100, "runs": run_streams(fsync, runs)}
    best: dict[str, int] = {}
    for run in result["runs"]:
        best[run["run"]] = max(best.get(run["run"], 0), run["records_per_s"])
    for write in ("write_batch", "offer"):
        plain, idempotent = best[f"{write} plain"], best[f"{write} idempotent"]
        result[f"{write}_idempotent_cost_pct"] = round(100 * (plain - idempotent) / plain, 1)
    return result


def bench_read(records: int = 1_000_000, batch_records: int = 10_000, fsync: bool = True,
               profiler: Profiler | None = None) -> dict[str, Any]:
    """Catch-up read of a closed segment as Arrow batches (written first with write_batch, untimed)."""

    async def runs(ns: Any, _: LocalCluster) -> list[dict[str, Any]]:
        written = await _write_batch_run(ns, "read", event_values(records), batch_records)
        return [{**written, "run": "write_batch (setup)"}, await read_run(ns, "read")]

    return {**stream_header("read", fsync), "record_bytes": 100, "runs": run_streams(fsync, runs, profiler=profiler)}


def bench_tail(rate_per_s: int = 10_000, seconds: float = 5.0, fsync: bool = True,
               sweep_rates_per_s: Sequence[int] = (), profiler: Profiler | None = None,
               explain: bool = False) -> dict[str, Any]:
    """Write-to-tailing-reader latency at `rate_per_s` (and at each sweep rate), one stream each;
    `explain`: and the stages of each run under "explain" (one table of all runs)."""
    rates = sorted({rate_per_s, *sweep_rates_per_s})

    async def runs(ns: Any, cluster: LocalCluster) -> list[dict[str, Any]]:
        return [await _stream_tail(ns, f"tail-{rate}", rate, seconds, cluster if explain else None)
                for rate in rates]

    results = run_streams(fsync, runs, profiler=profiler, bookie_probes=explain)
    stages = [row for run in results for row in run.pop("explain", [])]
    return {**stream_header("tail", fsync), "record_bytes": 100, "seconds_per_rate": seconds,
            "runs": results, **({"explain": stages} if explain else {})}
