"""Fixtures for real local Spark against real bookie processes: one SparkSession per test module,
one cluster for all of them (the Spark files run on one worker, one after another), each test in
its own namespace."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dlog
from dlog.blocking import BlockingNamespace
from dlog.segments.codec import records_to_batch
from dlog_tools.cluster import LocalCluster


@pytest.fixture(scope="session")
def cluster(zk_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The Spark files' cluster: 3 bookies, started once (a start per file was ~6 s each on that one
    worker); the tests keep apart by namespace (`dlog_ns`)."""
    root = f"/t-{uuid.uuid4().hex[:8]}"
    local = LocalCluster(tmp_path_factory.mktemp("spark-cluster"), bookies=3, zk_root=root, zk_server=zk_server)
    local.start()
    yield local
    from dlog_spark.connection import close_all

    close_all()  # this process's cached connections, before their ZooKeeper root goes away
    local.stop()


def classic_session(tmp_path_factory: pytest.TempPathFactory, master: str,
                    conf: dict[str, str] | None = None) -> Any:
    """A classic SparkSession whose JVM, and so every local Python worker, starts in a scratch
    directory: workers then import dlog and find `pyspark_dlog` only through the installed
    package, as a user's would, never because the project happens to be the working directory."""
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers must run this interpreter
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # Spark binds to loopback only, never eth0
    from pyspark.sql import SparkSession

    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("spark-cwd"))
    try:
        builder = (SparkSession.builder.master(master).appName("dlog-tests")
                   .config("spark.ui.enabled", "false")
                   .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
                   .config("spark.sql.shuffle.partitions", "2")
                   .config("spark.default.parallelism", "2")
                   .config("spark.sql.streaming.stopTimeout", "30s"))
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
    finally:
        os.chdir(here)
    session.sparkContext.setLogLevel("ERROR")
    return session


def stop_session(session: Any) -> None:
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The module's SparkSession: local[2], tasks in this JVM, Python workers forked from it."""
    session = classic_session(tmp_path_factory, "local[2]")
    yield session
    stop_session(session)


class Dlog:
    """One test's namespace on the module's cluster, with the Spark options that reach it."""

    def __init__(self, cluster: LocalCluster, name: str) -> None:
        self.options = {"zk": cluster.zk_address, "namespace": name, "zkRoot": cluster.zk_root,
                        "namespaceRoot": f"{cluster.zk_root}-dlog"}
        self.ns: BlockingNamespace = dlog.connect(cluster.zk_address, name, bookkeeper_root=cluster.zk_root,
                                                  root=f"{cluster.zk_root}-dlog")

    def write(self, stream: str, values: list[bytes], *, entry_records: int = 100,
              keys: list[bytes] | None = None) -> None:
        """Append `values` as entries of exactly `entry_records` records (one writer session)."""
        with self.ns.open_writer(stream) as writer:
            for start in range(0, len(values), entry_records):
                piece_keys = keys[start: start + entry_records] if keys is not None else None
                writer.write_batch(records_to_batch(values[start: start + entry_records], keys=piece_keys))

    def records(self, stream: str) -> int:
        return sum(segment["records"] for segment in self.ns.stream_info(stream)["segments"]
                   if segment["state"] != "truncated")

    def close(self) -> None:
        self.ns.close()


@pytest.fixture
def dlog_ns(cluster: LocalCluster) -> Iterator[Dlog]:
    space = Dlog(cluster, f"s-{uuid.uuid4().hex[:8]}")
    yield space
    space.close()


def values(count: int, start: int = 0, prefix: str = "event") -> list[bytes]:
    return [f"{prefix}-{index:07d}".encode() for index in range(start, start + count)]


def run_available_now(reader: Any, writer_format: str, checkpoint: Path, **writer_options: str) -> Any:
    """Start `reader` -> sink with Trigger.AvailableNow and wait for it to end; returns the query
    (a failure is left in `query.exception()`)."""
    from pyspark.errors import StreamingQueryException

    writer = reader.writeStream.format(writer_format).option("checkpointLocation", str(checkpoint))
    for key, value in writer_options.items():
        writer = writer.option(key, value)
    query = writer.trigger(availableNow=True).start()
    try:
        finished = query.awaitTermination(180)
    except StreamingQueryException:
        return query
    if not finished:
        query.stop()
        raise AssertionError("the AvailableNow query did not finish within 180 s")
    return query


def input_rows(query: Any) -> list[int]:
    return [progress["numInputRows"] for progress in query.recentProgress if progress["numInputRows"]]
