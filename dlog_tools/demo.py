"""`make demo`: the mission end to end on a fresh local cluster, every step checking its result.

cluster (ZooKeeper + 3 bookie processes) -> a ledger written and recovered through the client ->
a stream -> 1,000,000 records written -> tail-read by a live reader -> rolled and truncated ->
retention applied -> exported to Parquet and Arrow -> a stream offloaded to a local tier, its bookie
copies deleted and its records read back through the log -> a Spark Structured Streaming query
(readStream.format("dlog") -> count by action -> writeStream.format("dlog")) -> its result read
back and checked against the export, and `spark.read.parquet` of the tier counting what the log
holds -> stop.
Exit status 0 only when every step's check passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from bookkeeper.clock import perf_s
from bookkeeper.errors import DlogError
from dlog_tools.cluster import LocalCluster

RECORDS = 1_000_000
BATCH_RECORDS = 10_000
STREAM = "clicks"
ARCHIVE = "archive"  # the stream the tier step offloads
ARCHIVE_RECORDS, ARCHIVE_SEGMENT_RECORDS = 50_000, 10_000
console = Console()


class DemoFailure(DlogError):
    """A step of the demo did not see what it expected."""

    code = 390


def check(condition: bool, message: str) -> None:
    if not condition:
        raise DemoFailure(message)


ACTIONS = ("view", "click", "buy", "share", "search")


def demo_events(count: int) -> list[bytes]:
    """JSON click events of about 100 bytes, each with an action the Spark query counts."""
    rng = random.Random(42)
    return [b'{"n":%d,"user":"u%05d","action":"%s","item":%d,"session":"%012x"}'
            % (index, rng.randrange(10**5), rng.choice(ACTIONS).encode(), rng.randrange(10**6),
               rng.getrandbits(48)) for index in range(count)]


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Point this process's stderr (descriptor 2) at a file while processes started now inherit it."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log_file:
        os.dup2(log_file.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def progress() -> Progress:
    return Progress(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=True)


class Demo:
    def __init__(self, cluster: LocalCluster, directory: Path) -> None:
        self.cluster = cluster
        self.directory = directory
        self.summary: list[tuple[str, str]] = []
        self.values = demo_events(RECORDS)

    def note(self, step: str, result: str) -> None:
        self.summary.append((step, result))
        console.print(f"[green]ok[/green] {step}: {result}")

    async def run(self, steps: tuple[Callable[[Any], Awaitable[None]], ...]) -> None:
        from dlog import Namespace

        async with Namespace(self.cluster.zk_address, "demo") as ns:
            for step in steps:
                await step(ns)

    def run_all(self) -> None:
        asyncio.run(self.run((self.ledger_round_trip, self.write_stream, self.roll_and_truncate,
                              self.retention, self.export, self.offload, self.create_result_stream)))
        self.spark_query()
        asyncio.run(self.run((self.spark_result,)))

    async def create_result_stream(self, ns: Any) -> None:
        await ns.create_stream("action_counts")

    async def ledger_round_trip(self, ns: Any) -> None:
        client = ns.client
        handle = await client.create_ledger(3, 2, 2, password=b"demo")
        for index in range(1000):
            handle.append_async(self.values[index])
        await handle.close()
        reader = await client.open_ledger(handle.ledger_id, password=b"demo", recovery=True)
        entries = await reader.read(0, reader.last_add_confirmed)
        check([e.payload for e in entries] == self.values[:1000], "ledger entries differ after recovery")
        self.note("ledger: 1,000 entries on E3/Qw2/Qa2, sealed and read back",
                  f"ledger {handle.ledger_id}, fragments {len(reader.metadata.ensembles)}")

    async def write_stream(self, ns: Any) -> None:
        from dlog.segments.codec import records_to_batch

        await ns.create_stream(STREAM, roll_bytes=4 << 20)
        reader = await ns.open_reader(STREAM, "earliest")
        received = 0
        tail_started = perf_s()

        async def tail() -> None:
            nonlocal received
            while received < RECORDS:
                entry = await reader.next_entry(timeout_s=60)
                check(entry is not None, "the tailing reader stalled")
                received += entry.batch.num_rows

        tailing = asyncio.create_task(tail())
        with progress() as bar:
            task = bar.add_task("write 1,000,000 records", total=RECORDS)
            started = perf_s()
            async with ns.open_writer(STREAM) as writer:
                for start in range(0, RECORDS, BATCH_RECORDS):
                    await writer.write_batch(records_to_batch(self.values[start: start + BATCH_RECORDS]))
                    bar.update(task, advance=BATCH_RECORDS)
            elapsed_s = perf_s() - started
        async with asyncio.timeout(120):
            await tailing
        await reader.close()
        check(received == RECORDS, f"the tailing reader got {received} records")
        self.note("stream: 1,000,000 records written (durable, fsync on)",
                  f"{RECORDS / elapsed_s:,.0f} records/s")
        self.note("stream: a live reader tailed them all",
                  f"{received:,} records in {perf_s() - tail_started:.1f} s")

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
        from dlog_tools.export import export_stream

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
        self.exported = table
        self.note("exported to Parquet and Arrow", f"{expected:,} records each")

    async def offload(self, ns: Any) -> None:
        """A stream with a local tier: its completed segments offloaded as Parquet files, the bookie
        copies deleted (delete lag 0), and every record read back through the log, now from the tier."""
        from dlog import Offloader, TierPolicy
        from dlog.segments.codec import records_to_batch

        self.tier_dir = self.directory / "tier"
        await ns.create_stream(ARCHIVE, roll_records=ARCHIVE_SEGMENT_RECORDS,
                               tier=TierPolicy(uri=f"file://{self.tier_dir}", delete_lag_ms=0))
        values = self.values[:ARCHIVE_RECORDS]
        async with ns.open_writer(ARCHIVE) as writer:
            for start in range(0, ARCHIVE_RECORDS, BATCH_RECORDS):
                await writer.write_batch(records_to_batch(values[start: start + BATCH_RECORDS]))
        started = perf_s()
        report = await Offloader(ns).run(ARCHIVE, now=True)
        offload_s = perf_s() - started
        listing = await ns.store.segments(ARCHIVE)
        check(bool(report.offloaded) and all(s.tier is not None and not s.tier.on_bookies for s in listing.live),
              f"offloaded {len(report.offloaded)} segments, some still only on the bookies")
        async with ns.open_reader(ARCHIVE, "earliest", follow=False) as reader:
            read_back = [record.value async for record in reader]
        check(read_back == values, f"read {len(read_back)} records back from the tier, expected {len(values)}")
        self.archive_records = len(read_back)
        tier_bytes = sum(o.size_bytes for o in report.offloaded)
        bookie_bytes = sum(o.segment_bytes for o in report.offloaded)
        self.note("tier: a stream offloaded to Parquet, bookie copies deleted, read back through the log",
                  f"{len(report.offloaded)} segments, {len(read_back):,} records, {bookie_bytes / 2**20:.1f} MiB "
                  f"per bookie -> {tier_bytes / 2**20:.1f} MiB on the tier in {offload_s:.1f} s")

    def spark_query(self) -> None:
        """readStream.format("dlog") -> count by action -> writeStream.format("dlog")."""
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # Spark binds to loopback only, never eth0
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        started = perf_s()
        log_path = self.directory / "spark.log"
        console.print(f"  starting Spark (a JVM: some seconds; its log goes to {log_path})")
        with stderr_to(log_path):  # the JVM and its Python workers inherit it: no log amid our lines
            spark = (SparkSession.builder.master("local[2]").appName("dlog-demo")
                     .config("spark.ui.enabled", "false")
                     .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
                     .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2")
                     .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        try:
            options = {"zk": self.cluster.zk_address, "namespace": "demo"}
            clicks = (spark.readStream.format("dlog").options(**options).option("stream", STREAM)
                      .option("startingOffsets", "earliest").load())
            counts = (clicks.select(F.get_json_object(F.col("value").cast("string"), "$.action")
                                    .alias("action"))
                      .groupBy("action").count()
                      .select(F.col("action").cast("binary").alias("key"),
                              F.col("count").cast("string").cast("binary").alias("value")))
            query = (counts.writeStream.format("dlog").options(**options).option("stream", "action_counts")
                     .option("checkpointLocation", str(self.directory / "checkpoint"))
                     .outputMode("complete").trigger(availableNow=True).start())
            check(query.awaitTermination(240) is not False and query.exception() is None,
                  f"the Spark query failed: {query.exception()}")
            tier_count = spark.read.parquet(str(self.tier_dir / "demo" / ARCHIVE)).count()
            check(tier_count == self.archive_records,
                  f"spark.read.parquet of the tier counted {tier_count}, the log holds {self.archive_records}")
            self.tier_count = tier_count
        finally:
            spark.stop()
        self.spark_seconds = perf_s() - started

    async def spark_result(self, ns: Any) -> None:
        async with ns.open_reader("action_counts", follow=False) as reader:
            counts = {record.key.decode(): int(record.value) async for record in reader}
        import json

        expected: dict[str, int] = {}
        for value in self.exported.column("value").to_pylist():
            action = json.loads(value)["action"]
            expected[action] = expected.get(action, 0) + 1
        check(counts == expected, f"Spark counted {counts}, the export says {expected}")
        self.note("Spark: readStream dlog -> count by action -> writeStream dlog, read back",
                  f"{len(counts)} actions, {sum(counts.values()):,} records counted "
                  f"in {self.spark_seconds:.0f} s")
        self.note("Spark: spark.read.parquet of the tier directory, as a table",
                  f"{self.tier_count:,} rows, as many as the log's records")


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="dlog-demo-") as name:
        directory = Path(name)
        console.print(f"[bold]dlog demo[/bold]: ZooKeeper and 3 bookie processes in {directory}")
        started = perf_s()
        cluster = LocalCluster(directory / "cluster", bookies=3)
        demo = Demo(cluster, directory)
        try:
            cluster.start()
            demo.note("cluster started", f"zk={cluster.zk_address}, 3 bookies, "
                                         f"{perf_s() - started:.1f} s")
            demo.run_all()
        except (DlogError, OSError) as exc:
            console.print(f"[red]demo failed:[/red] {exc}")
            return 1
        finally:
            cluster.stop()
        demo.note("cluster stopped", "cleanly")
    table = Table("step", "result", title=f"dlog demo: every step checked ({perf_s() - started:.0f} s)")
    for step, result in demo.summary:
        table.add_row(step, result)
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
