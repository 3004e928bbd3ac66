"""The source and the sink on a real Spark standalone cluster started from the pyspark wheel (a
master and one worker; tasks run in an executor JVM of their own and its Python workers, never in
the driver): batch read and write, and a streaming dlog -> dlog query with a routed sink whose
driver is killed (SIGKILL) and restarted: the batch Spark replays, which dlog had committed,
lands in each of its streams exactly once (L6)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dlog_spark.connection import connection
from dlog_spark.options import ConnectionOptions
from tests.helpers import eventually_blocking
from tests.spark.conftest import Dlog, classic_session, input_rows, run_available_now, stop_session, values
from dlog_tools.cluster import die_with_parent
from dlog_tools.spark_cluster import SparkStandalone

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    """A master and a worker of 2 cores and 1 GiB: room for two applications of one 512 MiB
    executor each (this module's session and a driver process that a test kills)."""
    with SparkStandalone(tmp_path_factory.mktemp("spark-standalone"), worker_cores=2, worker_memory="1g") as engine:
        yield engine


@pytest.fixture(scope="module")
def spark(standalone: SparkStandalone, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """This module's SparkSession: the driver here, its tasks on the standalone cluster."""
    session = classic_session(tmp_path_factory, standalone.master_url, standalone.application_conf(cores=1))
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


OUTPUTS = ("out-0", "out-1", "out-2")


def committed_batch(space: Dlog, sink_id: str) -> int:
    """The highest batch id the routed sink recorded in any of its target streams (-1: none)."""
    options = space.options
    conn = connection(ConnectionOptions(options["zk"], options["namespace"], options["zkRoot"],
                                        options["namespaceRoot"]))
    best = -1
    for stream in OUTPUTS:
        found = conn.call(conn.namespace.zk.get_or_none(conn.namespace.store.sink_path(stream, sink_id)))
        if found is not None:
            best = max(best, json.loads(found[0])["batch"])
    return best


def forget_batch(checkpoint: Path, batch_id: int) -> None:
    """Make Spark's checkpoint say batch `batch_id` was planned but never committed (as when the
    driver dies after the sink's commit and before Spark's own): its commit log entry and any
    later plan go."""
    for log_dir, first in (("commits", batch_id), ("offsets", batch_id + 1)):
        for path in (checkpoint / log_dir).iterdir():
            name = path.name.lstrip(".").removesuffix(".crc")
            if name.isdigit() and int(name) >= first:
                path.unlink()


def test_a_routed_batch_replayed_after_a_driver_kill_lands_exactly_once(spark, standalone, dlog_ns, tmp_path):
    from tests.spark.routed_driver import routed_records

    ns = dlog_ns.ns
    for name in ("source", *OUTPUTS):
        ns.create_stream(name)
    dlog_ns.write("source", values(1200), entry_records=100)
    checkpoint = tmp_path / "checkpoint"
    driver_log = (tmp_path / "driver.log").open("wb")
    driver = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("routed_driver.py")), standalone.master_url, str(checkpoint),
         json.dumps(dlog_ns.options), json.dumps(standalone.application_conf(cores=1))],
        stdout=driver_log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True, preexec_fn=die_with_parent)
    try:
        eventually_blocking(lambda: committed_batch(dlog_ns, "routed-job") >= 0 or driver.poll() is not None,
                            timeout_s=180, message="the routed driver committing a batch")
        assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and its JVM: its own session, started here
        driver.wait(30)
        driver_log.close()
    recorded = committed_batch(dlog_ns, "routed-job")
    forget_batch(checkpoint, recorded)  # the kill landed between dlog's commit and Spark's

    reader = (spark.readStream.format("dlog").options(**dlog_ns.options).option("stream", "source")
              .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", "300").load())
    query = run_available_now(routed_records(reader), "dlog", checkpoint, sinkId="routed-job", **dlog_ns.options)
    assert query.exception() is None
    rows = input_rows(query)
    assert rows[0] == 300 and sum(rows) == 1200 - 300 * recorded  # batch `recorded` runs again, then the rest
    expected = {name: sorted(v for i, v in enumerate(values(1200)) if i % 3 == index)
                for index, name in enumerate(OUTPUTS)}
    for name in OUTPUTS:
        frame = spark.read.format("dlog").options(**dlog_ns.options).option("stream", name).load()
        assert sorted(row.value for row in frame.select("value").collect()) == expected[name]  # each row once
