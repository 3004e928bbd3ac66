"""`dlog bench scale`: one write load spread over 1 to 1,000 streams, and the memory of a reader
that falls far behind (it runs in its own process, so its memory is its own)."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Sequence
from typing import Any

from bookkeeper.clock import perf_s
from bookkeeper.errors import DlogError
from dlog_tools.bench.common import (
    NAMESPACE,
    CpuMeter,
    event_values,
    mb_per_s,
    peak_rss_mb,
    ratio,
    reset_peak_rss,
    rss_mb,
    run_streams,
    stored_totals,
    stream_header,
)
from dlog_tools.bench.profile import Profiler
from dlog_tools.cluster import LocalCluster

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


async def _round_robin(writers: list[Any], values: list[bytes], offer: bool = False) -> float:
    """Write `values` one by one over the writers in turn (`write_nowait`, or with `offer` the
    fast path with no future per record); seconds until all are durable."""
    started = perf_s()
    futures = []
    for index, value in enumerate(values):
        writer = writers[index % len(writers)]
        if not writer.writable:
            await writer.wait_writable()
        if offer:
            writer.offer(value)
        else:
            futures.append(writer.write_nowait(value))
        if index % PRODUCER_YIELD_RECORDS == PRODUCER_YIELD_RECORDS - 1:
            await asyncio.sleep(0)
    if offer:
        await asyncio.gather(*(writer.flush() for writer in writers))
    else:
        await asyncio.gather(*futures)
    return perf_s() - started


async def spread_run(ns: Any, stream_count: int, values: list[bytes], offer: bool = False) -> dict[str, Any]:
    """The same records spread round-robin over `stream_count` streams, each with its own writer.
    The producer lets the event loop run every PRODUCER_YIELD_RECORDS records, as one fed by a
    socket would, so each writer's linger timer fires on time and entries hold what arrived."""
    names = [f"scale-{'offer' if offer else 'write'}-{stream_count}-{index}" for index in range(stream_count)]
    started = perf_s()
    writers = await _open_writers(ns, names)
    open_s = perf_s() - started
    meter = CpuMeter().start()
    try:
        elapsed_s = await _round_robin(writers, values, offer)
        cpu = meter.per_op(len(values))
    finally:
        closed = await _bounded(OPEN_CONCURRENCY, [writer.close() for writer in writers])
    _raise_first(closed)
    stored = _raise_first(await _bounded(OPEN_CONCURRENCY, [stored_totals(ns, name) for name in names]))
    raw_bytes = sum(map(len, values))
    entries = sum(item["entries"] for item in stored)
    return {"run": "spread", "api": "offer" if offer else "write_nowait", "streams": stream_count,
            "records": len(values),
            "records_per_s": round(len(values) / elapsed_s), "mb_per_s": mb_per_s(raw_bytes, elapsed_s),
            "entries": entries, "records_per_entry": round(len(values) / max(entries, 1), 1),
            "stored_records": sum(item["records"] for item in stored),
            "compression_ratio": ratio(raw_bytes, sum(item["bytes"] for item in stored)),
            "open_s": round(open_s, 2), **cpu}


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
    stored = await stored_totals(ns, stream)
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
        started = perf_s()
        read = entries = 0
        while read < records:
            entry = await reader.next_entry(timeout_s=30)
            if entry is None:
                raise DlogError(f"the backlog reader of {stream!r} got nothing for 30 s at record {read}")
            read += entry.batch.num_rows
            entries += 1
            if entries % 16 == 0:
                sampled_mb = max(sampled_mb, rss_mb())
        elapsed_s = perf_s() - started
        await reader.close()
        after_mb = rss_mb()
        # VmHWM misses pages an allocator handed back with madvise, so samples count too
        connection.send({"rss_behind_mb": behind_mb, "rss_after_mb": after_mb,
                         "rss_peak_mb": max(peak_rss_mb(), sampled_mb, after_mb), "records_read": read,
                         "catch_up_records_per_s": round(read / elapsed_s)})


def bench_scale(records: int = 200_000, stream_counts: Sequence[int] = (1, 10, 100, 1000),
                backlog_records: Sequence[int] = (200_000, 2_000_000), backlog_batch_records: int = 1000,
                fsync: bool = True, profiler: Profiler | None = None) -> dict[str, Any]:
    """The same records over 1..1,000 streams; a lagging reader's memory behind each backlog."""

    async def runs(ns: Any, cluster: LocalCluster) -> tuple[list[Any], list[Any]]:
        values = event_values(records)
        spread = [await spread_run(ns, count, values) for count in stream_counts]
        memory = [await _backlog_run(ns, cluster, count, backlog_batch_records) for count in backlog_records]
        return spread, memory

    spread, memory = run_streams(fsync, runs, profiler=profiler)
    return {**stream_header("scale", fsync), "record_bytes": 100,
            "writes": f"per-record write_nowait, round-robin, loop yields every {PRODUCER_YIELD_RECORDS}",
            "runs": spread, "memory": memory}
