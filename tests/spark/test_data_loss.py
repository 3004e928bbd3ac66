"""Rolls and truncation under a Spark query (L5, L6): removing records the query already read is
not data loss; removing records it had not read fails the query (failOnDataLoss=true, the
default) with a message that says what to do, or is skipped to the earliest record left
(failOnDataLoss=false)."""

from __future__ import annotations

import pytest

from dlog.offsets import Offset
from tests.helpers import eventually_blocking
from tests.spark.conftest import Dlog, input_rows, run_available_now, values

pytestmark = pytest.mark.spark


def segments(space: Dlog, stream: str) -> list[dict]:
    return space.ns.stream_info(stream)["segments"]


def parquet_values(spark, path) -> list[bytes]:
    return sorted(row.value for row in spark.read.parquet(str(path)).select("value").collect())


def test_rolls_and_truncation_of_read_records_do_not_stop_a_running_query(spark, dlog_ns):
    ns = dlog_ns.ns
    ns.create_stream("rolling", roll_records=300)
    query = (spark.readStream.format("dlog").options(**dlog_ns.options)
             .option("stream", "rolling").option("startingOffsets", "earliest").load()
             .selectExpr("value").writeStream.format("memory").queryName("rolling_seen")
             .trigger(processingTime="300 milliseconds").start())
    def seen():
        return spark.sql("select count(*) as n from rolling_seen").collect()[0].n
    try:
        dlog_ns.write("rolling", values(900))  # three segments, rolled while the query runs
        eventually_blocking(lambda: seen() >= 900, message="the first 900 records")
        last = segments(dlog_ns, "rolling")[-1]
        ns.truncate("rolling", Offset(last["ledger"], last["last_entry"] + 1))  # everything read so far
        assert [s["state"] for s in segments(dlog_ns, "rolling")][:2] == ["truncated", "truncated"]
        dlog_ns.write("rolling", values(600, start=900))
        eventually_blocking(lambda: seen() >= 1500, message="records written after the truncation")
        assert query.exception() is None and query.isActive
        assert sorted(row.value for row in spark.sql("select value from rolling_seen").collect()) == values(1500)
    finally:
        query.stop()


def test_truncating_unread_records_fails_a_running_query_by_default(spark, dlog_ns):
    ns = dlog_ns.ns
    ns.create_stream("held", roll_records=300)
    dlog_ns.write("held", values(300))
    query = (spark.readStream.format("dlog").options(**dlog_ns.options)
             .option("stream", "held").option("startingOffsets", "earliest")
             .option("minRecordsPerTrigger", "300").option("maxTriggerDelay", "10m").load()
             .writeStream.format("noop").trigger(processingTime="300 milliseconds").start())
    try:
        eventually_blocking(lambda: sum(input_rows(query)) == 300, message="the first 300 records")
        dlog_ns.write("held", values(200, start=300))  # held back: fewer than minRecordsPerTrigger
        second = segments(dlog_ns, "held")[1]
        ns.truncate("held", Offset(second["ledger"], 1))  # 100 records nobody read
        eventually_blocking(lambda: not query.isActive, message="the query to fail")
        message = str(query.exception())
        assert "data loss" in message and "failOnDataLoss=false" in message
    finally:
        query.stop()


def test_unread_records_removed_between_runs_fail_then_are_skipped_when_allowed(spark, dlog_ns, tmp_path):
    ns = dlog_ns.ns
    ns.create_stream("gappy", roll_records=300)
    dlog_ns.write("gappy", values(600))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run(fail_on_data_loss: str):
        reader = (spark.readStream.format("dlog").options(**dlog_ns.options).option("stream", "gappy")
                  .option("startingOffsets", "earliest").option("failOnDataLoss", fail_on_data_loss).load())
        return run_available_now(reader.select("value"), "parquet", checkpoint, path=str(out))

    assert run("true").exception() is None and len(parquet_values(spark, out)) == 600
    dlog_ns.write("gappy", values(900, start=600))  # segments 3, 4, 5 of 300 records
    fifth = segments(dlog_ns, "gappy")[4]
    ns.truncate("gappy", Offset(fifth["ledger"], 1))  # removes 700 records nobody read

    failed = run("true")
    assert "data loss" in str(failed.exception())
    assert len(parquet_values(spark, out)) == 600  # nothing written past the loss

    skipped = run("false")
    assert skipped.exception() is None and sum(input_rows(skipped)) == 200
    assert parquet_values(spark, out) == values(600) + values(200, start=1300)
