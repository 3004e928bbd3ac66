"""The source and the sink through Spark Connect: a Connect server started from the pyspark wheel
runs the "dlog" data source in its own Python workers (found there with no registration); the
client is only a gRPC session (`SparkSession.builder.remote`) that names the format. A batch read
and a streaming query (dlog -> dlog, exactly the records written)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.spark.conftest import values
from dlog_tools.spark_cluster import SparkConnectServer

pytestmark = pytest.mark.spark
CONNECT_MODE_VARIABLES = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkConnectServer]:
    with SparkConnectServer(tmp_path_factory.mktemp("spark-connect")) as server:
        yield server


@pytest.fixture(scope="module")
def spark(connect_server: SparkConnectServer) -> Iterator[Any]:
    """A Spark Connect session. It leaves this process in "connect mode" (environment variables
    pyspark reads), which is undone afterwards so later modules get classic sessions again."""
    # gRPC's fork handlers restart its poller in forked children, where it can abort a child
    # between fork and exec (seen with bookie processes the next module starts): keep them off.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    saved = {name: os.environ.get(name) for name in CONNECT_MODE_VARIABLES}
    from pyspark.sql import SparkSession

    session = SparkSession.builder.remote(connect_server.url).getOrCreate()
    yield session
    session.stop()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def test_a_batch_read_through_spark_connect(spark, dlog_ns):
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    assert isinstance(spark, ConnectSession)
    dlog_ns.ns.create_stream("events")
    dlog_ns.write("events", values(600), entry_records=100, keys=[b"k%d" % (i % 3) for i in range(600)])
    frame = spark.read.format("dlog").options(**dlog_ns.options).option("stream", "events").load()
    assert frame.columns == ["stream", "ledger", "entry", "slot", "timestamp", "key", "value"]
    counts = {bytes(row.key): row["count"] for row in frame.groupBy("key").count().collect()}
    assert counts == {b"k0": 200, b"k1": 200, b"k2": 200}
    assert sorted(bytes(row.value) for row in frame.select("value").collect()) == values(600)


def test_a_streaming_query_through_spark_connect(spark, dlog_ns, tmp_path):
    ns = dlog_ns.ns
    ns.create_stream("source")
    ns.create_stream("upper")
    dlog_ns.write("source", values(900), entry_records=100)
    query = (spark.readStream.format("dlog").options(**dlog_ns.options).option("stream", "source")
             .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", "400").load()
             .selectExpr("key", "upper(cast(value as string)) as value", "timestamp")
             .writeStream.format("dlog").options(**dlog_ns.options).option("stream", "upper")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    assert query.awaitTermination(180) and query.exception() is None
    assert [p.numInputRows for p in query.recentProgress if p.numInputRows] == [400, 400, 100]
    frame = spark.read.format("dlog").options(**dlog_ns.options).option("stream", "upper").load()
    assert sorted(bytes(row.value) for row in frame.select("value").collect()) == [v.upper() for v in values(900)]
    assert dlog_ns.records("upper") == 900
