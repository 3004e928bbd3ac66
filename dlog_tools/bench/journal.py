"""Journal throughput: N records of 100 bytes, K in flight (closed loop), fsync on.

Each of the K "clients" appends its next record only when the journal has called back for its
previous one, like a bookie with K outstanding adds. Prints appends/s, fsyncs/s and the mean
group size. Runs in a fresh temp dir under /tmp, removed afterwards.

    dlog bench journal --records 200000 --in-flight 64
    dlog bench journal --records 5000 --in-flight 1 --prealloc 0
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bookkeeper.bookie.journal import Journal
from bookkeeper.clock import perf_s


@dataclass(frozen=True, slots=True)
class BenchResult:
    records: int
    in_flight: int
    seconds: float
    groups: int
    write_and_sync_seconds: float



async def run(records: int, in_flight: int, record_bytes: int, prealloc_bytes: int, sync: bool) -> BenchResult:
    directory = Path(tempfile.mkdtemp(prefix="bench-journal-", dir="/tmp"))
    groups, sync_seconds = 0, 0.0

    def on_commit(_records: int, _bytes: int, seconds: float) -> None:
        nonlocal groups, sync_seconds
        groups += 1
        sync_seconds += seconds

    journal = Journal(directory, prealloc_bytes=prealloc_bytes, sync=sync, on_commit=on_commit)
    try:
        await journal.open_for_append()
        payload = b"r" * record_bytes
        issued = completed = 0
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_durable(_: object) -> None:
            nonlocal issued, completed
            completed += 1
            if issued < records:
                issued += 1
                journal.append(payload, on_durable, None)
            elif completed == records and not finished.done():
                finished.set_result(None)

        started = perf_s()
        for _ in range(min(in_flight, records)):
            issued += 1
            journal.append(payload, on_durable, None)
        await finished
        elapsed = perf_s() - started
        await journal.close()
        return BenchResult(records, in_flight, elapsed, groups, sync_seconds)
    finally:
        await journal.close()
        shutil.rmtree(directory, ignore_errors=True)


def bench_journal(records: int = 200_000, in_flights: tuple[int, ...] = (1, 64), record_bytes: int = 100,
                  prealloc_bytes: int = 16 * 2**20, sync: bool = True) -> dict[str, Any]:
    """Closed-loop journal appends at each in-flight count (K=1 is capped at 5,000 records: one
    fsync per record)."""
    runs = []
    for in_flight in in_flights:
        count = records if in_flight > 1 else min(records, 5_000)
        result = asyncio.run(run(count, in_flight, record_bytes, prealloc_bytes, sync))
        runs.append({"in_flight": in_flight, "records": count,
                     "appends_per_s": round(count / result.seconds),
                     "fsyncs_per_s": round(result.groups / result.seconds),
                     "records_per_group": round(count / max(result.groups, 1), 1),
                     "write_and_sync_us": round(1e6 * result.write_and_sync_seconds / max(result.groups, 1))})
    return {"mode": "journal", "fsync": sync, "record_bytes": record_bytes,
            "prealloc_bytes": prealloc_bytes, "runs": runs}
