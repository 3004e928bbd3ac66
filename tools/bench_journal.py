"""Journal throughput: N records of 100 bytes, K in flight (closed loop), fsync on.

Each of the K "clients" appends its next record only when the journal has called back for its
previous one, like a bookie with K outstanding adds. Prints appends/s, fsyncs/s and the mean
group size. Runs in a fresh temp dir under /tmp, removed afterwards.

    .venv/bin/python tools/bench_journal.py --records 200000 --in-flight 64
    .venv/bin/python tools/bench_journal.py --records 5000 --in-flight 1 --prealloc-bytes 0
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bookkeeper.bookie.journal import Journal


@dataclass(frozen=True, slots=True)
class BenchResult:
    records: int
    in_flight: int
    seconds: float
    groups: int
    write_and_sync_seconds: float

    def line(self) -> str:
        return (
            f"K={self.in_flight:<4d} records={self.records:<8d} appends/s={self.records / self.seconds:>10,.0f} "
            f"fsyncs/s={self.groups / self.seconds:>8,.0f} records/group={self.records / max(self.groups, 1):>7.1f} "
            f"mean write+fsync={1e6 * self.write_and_sync_seconds / max(self.groups, 1):>6.0f}us"
        )


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

        started = time.perf_counter()
        for _ in range(min(in_flight, records)):
            issued += 1
            journal.append(payload, on_durable, None)
        await finished
        elapsed = time.perf_counter() - started
        await journal.close()
        return BenchResult(records, in_flight, elapsed, groups, sync_seconds)
    finally:
        await journal.close()
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--prealloc-bytes", type=int, default=16 * 2**20, help="0 disables preallocation")
    parser.add_argument("--no-sync", action="store_true", help="skip fdatasync (not a durability benchmark)")
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop instead of asyncio's loop")
    options = parser.parse_args()
    if options.uvloop:
        import uvloop

        uvloop.install()
    for in_flight in options.in_flight:
        # K=1 makes one fsync per record: cap its count so the run stays short.
        records = options.records if in_flight > 1 else min(options.records, 5_000)
        result = asyncio.run(run(records, in_flight, options.record_bytes, options.prealloc_bytes, not options.no_sync))
        print(f"prealloc={options.prealloc_bytes:<9d} {result.line()}", flush=True)


if __name__ == "__main__":
    main()
