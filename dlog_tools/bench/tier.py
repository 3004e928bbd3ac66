"""`dlog bench tier`: tiered storage on a local cluster. Writes `records` records of 100 bytes
(E3/Qw2/Qa2) across `segments` segments, offloads them all (`Offloader.run(now=True)`, bookie
copies kept), then in the same run reads the stream back from the bookies and from the tier
(`StreamReader.read_batch` loops, `prefer="bookies"` and `prefer="tier"`; the tier twice: cold,
files fetched and parsed, then warm from the read cache) and compares bytes per record: the tier's
one Parquet copy against the bookies' Qw copies of each segment. With `spark`, Spark's count of
the tier's table (`spark.read.parquet`) against its count of the stream (`format("dlog")`).

The tier: a scratch directory (`file`), an S3 URI with its endpoint options, or `moto`: moto's
server mode on loopback, started here (dlog_tools.bench.moto)."""

from __future__ import annotations

import asyncio
import math
import tempfile
from pathlib import Path
from typing import Any

from bookkeeper.clock import perf_s
from bookkeeper.errors import ConfigError
from dlog.offload import Offloader
from dlog.segments.codec import records_to_batch
from dlog.segments.metadata import TierPolicy
from dlog.segments.tier import TierOptions, check_tier_uri, stream_table_uri
from dlog_tools.bench.common import (
    NAMESPACE,
    CpuMeter,
    event_values,
    mb_per_s,
    run_streams,
    stored_totals,
    stream_header,
)
from dlog_tools.cluster import LocalCluster

STREAM = "tier"
WRITE_QUORUM = 2  # the bench cluster's Qw: each segment is on this many bookies
READ_BATCH_RECORDS = 65536


async def _write(ns: Any, values: list[bytes], segments: int, batch_records: int, uri: str) -> dict[str, Any]:
    per_segment = math.ceil(len(values) / segments)
    await ns.create_stream(STREAM, tier=TierPolicy(uri=uri, offload_after_ms=-1, delete_lag_ms=-1))
    started = perf_s()
    for first in range(0, len(values), per_segment):  # one writer per segment: its close seals it
        chunk = values[first: first + per_segment]
        async with ns.open_writer(STREAM) as writer:
            for start in range(0, len(chunk), batch_records):
                await writer.write_batch(records_to_batch(chunk[start: start + batch_records]))
    elapsed_s = perf_s() - started
    stored = await stored_totals(ns, STREAM)
    return {"run": "write_batch (setup)", "records": stored["records"], "segments": stored["segments"],
            "records_per_s": round(len(values) / elapsed_s), "mb_per_s": mb_per_s(sum(map(len, values)), elapsed_s)}


async def _offload(ns: Any, cluster: LocalCluster, raw_bytes: int) -> tuple[dict[str, Any], Any]:
    meter = CpuMeter(cluster).start()
    started = perf_s()
    report = await Offloader(ns).run(STREAM, now=True, delete_copies=False)
    elapsed_s = perf_s() - started
    if report.error or not report.offloaded:
        raise ConfigError(f"the offload failed: {report.error or '; '.join(report.skipped)}")
    records = sum(o.records for o in report.offloaded)
    return {"run": "offload", "records": records, "segments": len(report.offloaded), "seconds": round(elapsed_s, 2),
            "records_per_s": round(records / elapsed_s), "mb_per_s": mb_per_s(raw_bytes, elapsed_s),
            "file_mb_per_s": mb_per_s(sum(o.size_bytes for o in report.offloaded), elapsed_s),
            **meter.per_op(records)}, report


async def _read(ns: Any, cluster: LocalCluster, prefer: str, run: str) -> dict[str, Any]:
    """A catch-up read of the whole stream as the README teaches: read_batch until None."""
    meter = CpuMeter(cluster).start()
    records = raw_bytes = 0
    async with ns.open_reader(STREAM, "earliest", follow=False, prefer=prefer) as reader:
        started = perf_s()
        while (batch := await reader.read_batch(READ_BATCH_RECORDS)) is not None:
            records += batch.num_rows
            raw_bytes += batch.column("value").nbytes
        elapsed_s = perf_s() - started
    return {"run": run, "prefer": prefer, "records": records, "seconds": round(elapsed_s, 2),
            "records_per_s": round(records / elapsed_s), "mb_per_s": mb_per_s(raw_bytes, elapsed_s),
            **meter.per_op(records)}


def _spark_counts(cluster: LocalCluster, table: str, records: int) -> list[dict[str, Any]]:
    from dlog_tools.bench.spark import spark_session

    spark = spark_session("local[2]", 2)
    try:
        runs = []
        for run, load in (("spark: read.parquet(tier).count()", lambda: spark.read.parquet(table)),
                          ("spark: read.format('dlog').count()",
                           lambda: spark.read.format("dlog").option("zk", cluster.zk_address)
                           .option("namespace", NAMESPACE).option("stream", STREAM).load())):
            load().count()  # warm-up: the JVM's and the Python workers' first run
            started = perf_s()
            counted = load().count()
            elapsed_s = perf_s() - started
            runs.append({"run": run, "records": counted, "seconds": round(elapsed_s, 2),
                         "rows_per_s": round(records / elapsed_s)})
        return runs
    finally:
        spark.stop()
        from dlog_spark.connection import close_all

        close_all()


def bench_tier(records: int = 1_000_000, segments: int = 4, batch_records: int = 10_000, *, tier: str = "file",
               s3_endpoint: str | None = None, spark: bool = False, fsync: bool = True) -> dict[str, Any]:
    """`tier`: "file" (a scratch directory), "moto" (moto on loopback), or a tier URI."""
    values = event_values(records)
    raw_bytes = sum(map(len, values))
    with tempfile.TemporaryDirectory(prefix="dlog-bench-tier-") as directory:
        moto = None
        options = TierOptions(s3_endpoint=s3_endpoint)
        if tier == "file":
            uri = f"file://{directory}/tier"
        elif tier == "moto":
            from dlog_tools.bench.moto import MotoS3

            moto = MotoS3(Path(directory) / "moto").start()
            uri, options = moto.uri("bench"), moto.options()
        else:
            uri = check_tier_uri(tier)
        try:
            def action(ns: Any, cluster: LocalCluster) -> Any:
                return _runs(ns, cluster, values, raw_bytes, segments, batch_records, uri, spark)

            runs, sizes = run_streams(fsync, action, tier_options=options)
        finally:
            if moto is not None:
                moto.stop()
    return {**stream_header("tier", fsync), "record_bytes": 100, "tier": "moto (S3 on loopback)" if moto else
            uri.split("?")[0], **sizes, "runs": runs}


async def _runs(ns: Any, cluster: LocalCluster, values: list[bytes], raw_bytes: int, segments: int,
                batch_records: int, uri: str, spark: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    runs = [await _write(ns, values, segments, batch_records, uri)]
    offload, report = await _offload(ns, cluster, raw_bytes)
    runs.append(offload)
    runs.append(await _read(ns, cluster, "bookies", "read from bookies"))
    runs.append(await _read(ns, cluster, "tier", "read from the tier (cold: fetch + parse)"))
    runs.append(await _read(ns, cluster, "tier", "read from the tier (warm: read cache)"))
    stored = await stored_totals(ns, STREAM)
    tier_bytes = sum(o.size_bytes for o in report.offloaded)
    records = stored["records"]
    sizes = {"records": records, "segments": stored["segments"],
             "bookie_bytes_per_record": round(stored["bytes"] * WRITE_QUORUM / records, 2),
             "tier_bytes_per_record": round(tier_bytes / records, 2),
             "bookie_copies": WRITE_QUORUM}
    if spark:
        if uri.startswith("s3://"):
            runs.append({"run": "spark: read.parquet(tier).count()",
                         "skipped": "an s3:// table needs Hadoop's S3A jars, not in the pyspark wheel"})
        else:
            table = stream_table_uri(uri, ns.name, STREAM)
            runs += await asyncio.to_thread(_spark_counts, cluster, table, records)
    return runs, sizes
