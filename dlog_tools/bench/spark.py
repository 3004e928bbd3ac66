"""Spark benchmarks of the dlog data source, on a local cluster of real bookie processes.

    dlog bench spark --records 10000000
    dlog bench spark --records 10000000 --standalone     # on a standalone cluster from the wheel

Measured, never asserted. Three runs after the input stream is written (100-byte JSON-like
values, 1,024 distinct keys):
  read      readStream (Trigger.AvailableNow) of the whole stream into a streaming aggregation
            (`groupBy(key).count()`), rows/s from the query's wall time;
  sink      `df.write.format("dlog")` of N generated rows (the sink's write tasks and commit),
  pipeline  readStream dlog -> writeStream dlog (AvailableNow), read and sink together.
Each run's wall time starts when the query (or write) starts and ends when it has finished and
committed; the SparkSession is started (and its Python workers warmed) beforehand.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bookkeeper.clock import perf_s
from dlog.segments.codec import DEFAULT_SCHEMA
from dlog_tools.cluster import LocalCluster

NAMESPACE = "bench"
STANDALONE_WORKER_MEMORY = "3g"  # what the worker offers; one executor of this heap:
STANDALONE_EXECUTOR_MEMORY = "2g"
KEYS = 1024
ACTIONS = pa.array(["view", "click", "buy", "share"])


def event_batch(start: int, count: int, value_bytes: int = 100) -> pa.RecordBatch:
    """Rows start..start+count-1 of the default schema, built column-wise with Arrow compute:
    JSON-like values of exactly `value_bytes` bytes (distinct, compressible like real events)."""
    index = pa.array(range(start, start + count), pa.int64())
    mixed = pc.bit_wise_and(pc.multiply(index, 2654435761), 0x7FFFFFFF)
    text = pc.binary_join_element_wise(
        '{"ts":', pc.cast(pc.add(index, 1_700_000_000_000), pa.string()),
        ',"user":"u', pc.cast(pc.bit_wise_and(mixed, 0xFFFFF), pa.string()),
        '","action":"', pc.take(ACTIONS, pc.bit_wise_and(index, 3)),
        '","item":', pc.cast(pc.shift_right(mixed, 8), pa.string()),
        ',"n":', pc.utf8_lpad(pc.cast(index, pa.string()), 10, "0"), "}", "")
    value = pc.cast(pc.utf8_slice_codeunits(pc.utf8_rpad(text, value_bytes, " "), 0, value_bytes), pa.binary())
    key = pc.cast(pc.binary_join_element_wise("k", pc.cast(pc.bit_wise_and(mixed, KEYS - 1), pa.string()), ""),
                  pa.binary())
    timestamp = pc.cast(pc.add(index, 1_700_000_000_000), pa.timestamp("ms"))
    return pa.RecordBatch.from_arrays([key, value, timestamp], schema=DEFAULT_SCHEMA)


async def _write_input(cluster: LocalCluster, records: int, batch_records: int) -> dict[str, Any]:
    from dlog import Namespace

    async with Namespace(cluster.zk_address, NAMESPACE) as ns:
        for name in ("input", "warm", "sink", "pipeline"):
            await ns.create_stream(name)
        async with await ns.open_writer("warm") as writer:
            await writer.write_batch(event_batch(0, 1000))
        started = perf_s()
        async with await ns.open_writer("input") as writer:
            pending: list[asyncio.Future[Any]] = []
            for start in range(0, records, batch_records):
                pending.append(asyncio.ensure_future(writer.write_batch(
                    event_batch(start, min(batch_records, records - start)))))
                if len(pending) >= 8:
                    await pending.pop(0)
            await asyncio.gather(*pending)
        elapsed_s = perf_s() - started
        info = await ns.stream_info("input")
    segments = info["segments"]
    return {"run": "dlog write_batch (input)", "records": records, "seconds": round(elapsed_s, 2),
            "rows_per_s": round(records / elapsed_s), "segments": len(segments),
            "entries": sum(s["last_entry"] + 1 for s in segments),
            "stored_mb": round(sum(s["bytes"] for s in segments) / 1e6, 1)}


def spark_session(master: str, shuffle_partitions: int, conf: dict[str, str] | None = None) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # Spark binds to loopback only, never eth0
    builder = (SparkSession.builder.master(master).appName("dlog-bench")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.driver.memory", "4g"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _available_now(query_writer: Any) -> float:
    started = perf_s()
    query = query_writer.trigger(availableNow=True).start()
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"benchmark query failed: {query.exception()}")
    return perf_s() - started


def _spark_runs(spark: Any, options: dict[str, str], records: int, partitions: int, directory: str) -> list[dict]:
    runs = []
    source = spark.readStream.format("dlog").options(**options).option("startingOffsets", "earliest")
    source = source.option("minPartitions", str(partitions))
    # Warm-up: start the Python workers and the source's connections on a tiny stream.
    warm = source.option("stream", "warm").load().groupBy("key").count()
    _available_now(warm.writeStream.format("noop").outputMode("complete")
                   .option("checkpointLocation", f"{directory}/warm"))

    counts = source.option("stream", "input").load().groupBy("key").count()
    elapsed_s = _available_now(counts.writeStream.format("memory").queryName("bench_counts")
                               .outputMode("complete").option("checkpointLocation", f"{directory}/read"))
    total = spark.sql("select sum(count) as n, count(*) as keys from bench_counts").collect()[0]
    runs.append({"run": "read: readStream -> groupBy(key).count()", "records": int(total.n),
                 "keys": int(total["keys"]), "seconds": round(elapsed_s, 2), "rows_per_s": round(records / elapsed_s)})

    rows = spark.range(0, records, 1, partitions).selectExpr(
        f"cast(concat('k', cast(id % {KEYS} as string)) as binary) as key",
        "cast(rpad(concat('{\"n\":', cast(id as string), ',\"action\":\"view\",\"user\":\"u', "
        "cast((id * 7919) % 1000003 as string), '\"}'), 100, ' ') as binary) as value")
    started = perf_s()
    rows.write.format("dlog").options(**options).option("stream", "sink").mode("append").save()
    elapsed_s = perf_s() - started
    runs.append({"run": "sink: df.write.format('dlog') of generated rows", "records": records,
                 "seconds": round(elapsed_s, 2), "rows_per_s": round(records / elapsed_s)})

    piped = source.option("stream", "input").load().select("key", "value", "timestamp")
    elapsed_s = _available_now(piped.writeStream.format("dlog").options(**options).option("stream", "pipeline")
                               .option("checkpointLocation", f"{directory}/pipeline"))
    runs.append({"run": "pipeline: readStream dlog -> writeStream dlog", "records": records,
                 "seconds": round(elapsed_s, 2), "rows_per_s": round(records / elapsed_s)})
    return runs


async def _stored_records(cluster: LocalCluster, streams: list[str]) -> dict[str, int]:
    from dlog import Namespace

    async with Namespace(cluster.zk_address, NAMESPACE) as ns:
        return {name: sum(s["records"] for s in (await ns.stream_info(name))["segments"]) for name in streams}


def bench_spark(records: int = 10_000_000, *, cores: int = 2, partitions: int = 8, batch_records: int = 20_000,
                shuffle_partitions: int = 2, fsync: bool = True, standalone: bool = False) -> dict[str, Any]:
    """Write `records` into a stream, then time the Spark read, sink and pipeline runs (on
    local[cores], or with `standalone` on a standalone cluster of one worker with `cores` cores)."""
    with tempfile.TemporaryDirectory(prefix="dlog-bench-spark-") as directory:
        cluster = LocalCluster(f"{directory}/bookies", bookies=3, bookie_args=[] if fsync else ["--no-fsync"])
        cluster.start()
        engine = None
        try:
            runs = [asyncio.run(_write_input(cluster, records, batch_records))]
            options = {"zk": cluster.zk_address, "namespace": NAMESPACE}
            if standalone:
                from dlog_tools.spark_cluster import SparkStandalone

                engine = SparkStandalone(f"{directory}/spark", worker_cores=cores,
                                         worker_memory=STANDALONE_WORKER_MEMORY).start()
                spark = spark_session(engine.master_url, shuffle_partitions,
                                 engine.application_conf(STANDALONE_EXECUTOR_MEMORY, small_jvm=False))
            else:
                spark = spark_session(f"local[{cores}]", shuffle_partitions)
            try:
                runs += _spark_runs(spark, options, records, partitions, directory)
            finally:
                spark.stop()
            stored = asyncio.run(_stored_records(cluster, ["sink", "pipeline"]))
        finally:
            from dlog_spark.connection import close_all

            close_all()
            if engine is not None:
                engine.stop()
            cluster.stop()
    return {"mode": "spark", "records": records, "value_bytes": 100, "cores": cores, "read_partitions": partitions,
            "engine": "standalone (1 worker)" if standalone else f"local[{cores}]",
            "bookies": 3, "quorum": "E3/Qw2/Qa2", "fsync": fsync, "runs": runs, "stored_records": stored}
