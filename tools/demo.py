"""`make demo`: the mission end to end on a fresh local cluster, every step checking its result.

cluster (ZooKeeper + 3 bookie processes) -> a ledger written and recovered through the client ->
a stream -> 1,000,000 records written -> tail-read by a live reader -> rolled and truncated ->
retention applied -> exported to Parquet and Arrow -> [Spark query, when available] -> stop.
Exit status 0 only when every step's check passed.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bookkeeper.errors import DlogError
from tools.bench import event_values
from tools.cluster import LocalCluster

RECORDS = 1_000_000
BATCH_RECORDS = 10_000
STREAM = "clicks"
console = Console()


class DemoFailure(DlogError):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise DemoFailure(message)


def progress() -> Progress:
    return Progress(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=True)


class Demo:
    def __init__(self, cluster: LocalCluster, directory: Path) -> None:
        self.cluster = cluster
        self.directory = directory
        self.summary: list[tuple[str, str]] = []
        self.values = event_values(RECORDS)

    def note(self, step: str, result: str) -> None:
        self.summary.append((step, result))
        console.print(f"[green]ok[/green] {step}: {result}")

    async def run(self) -> None:
        from dlog import Namespace

        async with Namespace(self.cluster.zk_address, "demo") as ns:
            for step in (self.ledger_round_trip, self.write_stream, self.roll_and_truncate,
                         self.retention, self.export):
                await step(ns)

    async def ledger_round_trip(self, ns: Any) -> None:
        client = ns.client
        handle = await client.create_ledger(3, 2, 2, password=b"demo")
        for index in range(1000):
            handle.append_async(self.values[index])
        await handle.close()
        reader = await client.open_ledger(handle.ledger_id, password=b"demo", recovery=True)
        entries = await reader.read(0, reader.last_add_confirmed)
        check([e.data for e in entries] == self.values[:1000], "ledger entries differ after recovery")
        self.note("ledger: 1,000 entries on E3/Qw2/Qa2, sealed and read back",
                  f"ledger {handle.ledger_id}, fragments {len(reader.metadata.ensembles)}")

    async def write_stream(self, ns: Any) -> None:
        from dlog.segments.codec import records_to_batch

        await ns.create_stream(STREAM, roll_bytes=4 << 20)
        reader = await ns.open_reader(STREAM, "earliest")
        received = 0
        tail_started = time.perf_counter()

        async def tail() -> None:
            nonlocal received
            while received < RECORDS:
                entry = await reader.next_entry(timeout_s=60)
                check(entry is not None, "the tailing reader stalled")
                received += entry.batch.num_rows

        tailing = asyncio.create_task(tail())
        with progress() as bar:
            task = bar.add_task("write 1,000,000 records", total=RECORDS)
            started = time.perf_counter()
            async with ns.open_writer(STREAM) as writer:
                for start in range(0, RECORDS, BATCH_RECORDS):
                    await writer.write_batch(records_to_batch(self.values[start: start + BATCH_RECORDS]))
                    bar.update(task, advance=BATCH_RECORDS)
            elapsed_s = time.perf_counter() - started
        await asyncio.wait_for(tailing, 120)
        await reader.close()
        check(received == RECORDS, f"the tailing reader got {received} records")
        self.note("stream: 1,000,000 records written (durable, fsync on)",
                  f"{RECORDS / elapsed_s:,.0f} records/s")
        self.note("stream: a live reader tailed them all",
                  f"{received:,} records in {time.perf_counter() - tail_started:.1f} s")

    async def roll_and_truncate(self, ns: Any) -> None:
        info = await ns.stream_info(STREAM)
        segments = info["segments"]
        check(len(segments) >= 3, f"expected several segments after rolls, got {len(segments)}")
        listing = await ns.store.segments(STREAM)
        cut = listing.segments[1]
        from dlog import Offset

        removed = await ns.truncate(STREAM, Offset(cut.ledger_id, 0))
        first = await self._first_record(ns)
        check(first.offset == Offset(cut.ledger_id, 0, 0), f"reading starts at {first.offset}")
        self.note("rolled into segments, truncated before the second",
                  f"{len(segments)} segments, {len(removed)} removed, reads start at {first.offset}")

    async def _first_record(self, ns: Any) -> Any:
        async with ns.open_reader(STREAM, follow=False) as reader:
            return await reader.__anext__()

    async def retention(self, ns: Any) -> None:
        await ns.set_retention(STREAM, size_bytes=8 << 20)
        removed = await ns.apply_retention(STREAM)
        live = (await ns.store.segments(STREAM)).live
        check(sum(s.bytes for s in live) <= (8 << 20) or len(live) == 1, "retention left too much")
        self.note("retention by size (8 MiB) applied",
                  f"segments removed: {[s.sequence for s in removed]}, {len(live)} kept")

    async def export(self, ns: Any) -> None:
        from tools.export import export_stream

        expected = sum(s.records for s in (await ns.store.segments(STREAM)).live)
        parquet = await export_stream(ns, STREAM, self.directory / "clicks.parquet", "parquet",
                                      "earliest", None, progress=True)
        arrow = await export_stream(ns, STREAM, self.directory / "clicks.arrow", "arrow",
                                    "earliest", None, progress=True)
        table = pq.read_table(self.directory / "clicks.parquet")
        with pa.ipc.open_file(str(self.directory / "clicks.arrow")) as arrow_file:
            arrow_rows = arrow_file.read_all().num_rows
        check(table.num_rows == arrow_rows == parquet["records"] == arrow["records"] == expected,
              f"exported {table.num_rows} / {arrow_rows} rows, expected {expected}")
        self.note("exported to Parquet and Arrow", f"{expected:,} records each")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="dlog-demo-") as name:
        directory = Path(name)
        console.print(f"[bold]dlog demo[/bold]: ZooKeeper and 3 bookie processes in {directory}")
        started = time.perf_counter()
        cluster = LocalCluster(directory / "cluster", bookies=3)
        demo = Demo(cluster, directory)
        try:
            cluster.start()
            demo.note("cluster started", f"zk={cluster.zk_address}, 3 bookies, "
                                         f"{time.perf_counter() - started:.1f} s")
            asyncio.run(demo.run())
        except (DlogError, OSError) as exc:
            console.print(f"[red]demo failed:[/red] {exc}")
            return 1
        finally:
            cluster.stop()
        demo.note("cluster stopped", "cleanly")
    table = Table("step", "result", title=f"dlog demo: every step checked ({time.perf_counter() - started:.0f} s)")
    for step, result in demo.summary:
        table.add_row(step, result)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
