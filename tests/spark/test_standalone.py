"""The source and the sink on a real Spark standalone cluster started from the pyspark wheel (a
master and one worker; tasks run in an executor JVM of their own and its Python workers, never in
the driver): batch read and write, and a streaming pipeline that stays exactly once when Spark
replays a batch (L6)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.spark.conftest import classic_session, stop_session, values
from tools.spark_cluster import SparkStandalone

# The streaming pipeline and its replay check, run here on the cluster's executors: pytest
# collects these imported tests again in this module, where `spark` is the cluster's session.
from tests.spark.test_sink import (  # noqa: F401
    test_a_replayed_batch_of_a_stream_to_stream_pipeline_is_written_once as test_replayed_batch_on_the_cluster,
)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    with SparkStandalone(tmp_path_factory.mktemp("spark-standalone")) as engine:
        yield engine


@pytest.fixture(scope="module")
def spark(standalone: SparkStandalone, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """This module's SparkSession: the driver here, its tasks on the standalone cluster."""
    session = classic_session(tmp_path_factory, standalone.master_url, standalone.application_conf())
    yield session
    stop_session(session)


def ancestors(pid: int) -> list[int]:
    found = []
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        found.append(pid)
    return found


def test_batch_reads_and_writes_run_in_executor_processes(spark, standalone, dlog_ns):
    dlog_ns.ns.create_stream("events")
    dlog_ns.ns.create_stream("copy")
    dlog_ns.write("events", values(1000), entry_records=100)
    frame = spark.read.format("dlog").options(**dlog_ns.options).option("stream", "events").load()
    assert sorted(row.value for row in frame.select("value").collect()) == values(1000)

    frame.select("key", "value", "timestamp").write.format("dlog").options(**dlog_ns.options) \
        .option("stream", "copy").mode("append").save()
    copied = spark.read.format("dlog").options(**dlog_ns.options).option("stream", "copy").load()
    assert sorted(row.value for row in copied.select("value").collect()) == values(1000)

    # Where the tasks ran: Python workers whose ancestor is an executor JVM that the worker started,
    # a process of its own (neither this driver nor the worker daemon).
    executors = standalone.executor_pids()
    assert executors and os.getpid() not in executors
    workers = spark.sparkContext.parallelize(range(2), 2).map(lambda _: os.getpid()).collect()
    assert all(set(ancestors(pid)) & set(executors) for pid in workers)
