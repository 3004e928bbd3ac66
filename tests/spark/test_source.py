"""The dlog source on real local Spark and real bookies: found with no registration, reads exactly
what was written (across rolls, restarts and admission limits), tails a live writer, reads
batches between offsets, commits a subscription whose lag shows, and refuses unknown options by
name (L6). Kafka's timestamp options: a start or an end at a timestamp is the first record
stamped at or after it (between two entries, inside an entry, before the earliest record, after
the latest under each strategy), per stream or for all; maxBytesPerTrigger takes whole entries
and combines with maxRecordsPerTrigger."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest

from dlog import Namespace
from dlog.offsets import Offset
from dlog.segments.codec import records_to_batch
from tests.helpers import eventually_blocking
from tests.spark.conftest import Dlog, input_rows, run_available_now, values

pytestmark = pytest.mark.spark


def stream_reader(spark, space: Dlog, **options: str):
    reader = spark.readStream.format("dlog").options(**space.options)
    return reader.options(**options).load()


def test_found_by_name_with_no_registration_through_the_installed_package(spark, dlog_ns):
    """Spark's lookup imports top-level `pyspark_*` modules it finds on the workers' sys.path;
    the workers here do not run in the project directory, so only the install can put it there."""
    import os
    from pathlib import Path

    project = str(Path(__file__).resolve().parents[2])
    worker_cwd = spark.sparkContext.parallelize([0], 1).map(lambda _: os.getcwd()).collect()[0]
    assert worker_cwd != project
    dlog_ns.ns.create_stream("found")
    dlog_ns.write("found", values(300))
    assert spark.read.format("dlog").options(**dlog_ns.options).option("stream", "found").load().count() == 300


def test_available_now_reads_exactly_what_was_written_and_a_restart_only_new_records(spark, dlog_ns, tmp_path):
    ns = dlog_ns.ns
    ns.create_stream("events", roll_records=1000)
    written = values(2500)
    dlog_ns.write("events", written, keys=[b"k%d" % (i % 7) for i in range(2500)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    query = run_available_now(stream_reader(spark, dlog_ns, stream="events", startingOffsets="earliest"),
                              "parquet", checkpoint, path=str(out))
    assert query.exception() is None
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(row.value for row in rows) == written
    assert len({(row.ledger, row.entry, row.slot) for row in rows}) == 2500
    assert {row.stream for row in rows} == {"events"} and all(row.key is not None for row in rows)

    dlog_ns.write("events", values(700, start=2500))
    query = run_available_now(stream_reader(spark, dlog_ns, stream="events", startingOffsets="earliest"),
                              "parquet", checkpoint, path=str(out))
    assert sum(input_rows(query)) == 700  # the restarted query read only the new records
    assert sorted(row.value for row in spark.read.parquet(str(out)).collect()) == values(3200)


def test_max_records_per_trigger_splits_a_backlog_into_whole_entries(spark, dlog_ns, tmp_path):
    dlog_ns.ns.create_stream("backlog", roll_records=400)
    dlog_ns.write("backlog", values(1000), entry_records=100)  # 10 entries of 100 over 3 segments
    query = run_available_now(stream_reader(spark, dlog_ns, stream="backlog", startingOffsets="earliest",
                                            maxRecordsPerTrigger="250"),
                              "parquet", tmp_path / "checkpoint", path=str(tmp_path / "out"))
    assert input_rows(query) == [200, 200, 200, 200, 200]  # 250 admits two whole 100-record entries
    assert spark.read.parquet(str(tmp_path / "out")).count() == 1000


def test_min_records_per_trigger_waits_until_max_trigger_delay(spark, dlog_ns):
    dlog_ns.ns.create_stream("trickle")
    dlog_ns.write("trickle", values(300), entry_records=100)
    started = time.monotonic()
    query = (stream_reader(spark, dlog_ns, stream="trickle", startingOffsets="earliest",
                           minRecordsPerTrigger="1000", maxTriggerDelay="3s")
             .writeStream.format("noop").trigger(processingTime="200 milliseconds").start())
    try:
        eventually_blocking(lambda: sum(input_rows(query)) == 300, message="the held-back records")
        assert time.monotonic() - started >= 3.0  # held until the delay, then all 300 at once
        assert input_rows(query) == [300]
    finally:
        query.stop()


def test_a_processing_time_query_tails_records_written_while_it_runs(spark, dlog_ns):
    ns = dlog_ns.ns
    ns.create_stream("live", roll_records=300)
    dlog_ns.write("live", values(100, prefix="old"))
    query = (stream_reader(spark, dlog_ns, stream="live")  # startingOffsets latest: not the old ones
             .selectExpr("cast(value as string) as value")
             .writeStream.format("memory").queryName("tail_live").trigger(processingTime="300 milliseconds")
             .start())
    try:
        eventually_blocking(lambda: query.lastProgress is not None, message="the first trigger")
        with ns.open_writer("live", linger_ms=1) as writer:  # an in-progress segment, rolling every 300
            for index in range(1000):
                writer.write(b"new-%04d" % index)
                if index % 100 == 99:
                    writer.flush()
            def seen():
                return spark.sql("select count(*) as n from tail_live").collect()[0].n
            eventually_blocking(lambda: seen() >= 1000, timeout_s=90, message="records written while the query runs")
        values_seen = [row.value for row in spark.sql("select value from tail_live").collect()]
        assert sorted(values_seen) == [f"new-{i:04d}" for i in range(1000)]
    finally:
        query.stop()


def test_batch_read_between_offsets_and_a_pattern_of_streams(spark, dlog_ns):
    ns = dlog_ns.ns
    for name in ("orders/eu", "orders/us", "other"):
        ns.create_stream(name)
        dlog_ns.write(name, values(300, prefix=name), entry_records=100)
    ledger = ns.stream_info("orders/eu")["segments"][0]["ledger"]
    frame = (spark.read.format("dlog").options(**dlog_ns.options).option("stream", "orders/eu")
             .option("startingOffsets", json.dumps({"orders/eu": {"ledger": ledger, "entry": 1}}))
             .option("endingOffsets", json.dumps({"orders/eu": {"ledger": ledger, "entry": 2}})).load())
    assert sorted(row.value for row in frame.collect()) == values(100, start=100, prefix="orders/eu")
    both = spark.read.format("dlog").options(**dlog_ns.options).option("streamPattern", "orders/.*").load()
    counts = {row.stream: row["count"] for row in both.groupBy("stream").count().collect()}
    assert counts == {"orders/eu": 300, "orders/us": 300}


def test_subscription_is_committed_at_the_end_of_each_batch_and_its_lag_is_visible(spark, dlog_ns, cluster,
                                                                                    tmp_path):
    ns = dlog_ns.ns
    ns.create_stream("subscribed")
    dlog_ns.write("subscribed", values(500), entry_records=100)
    query = run_available_now(stream_reader(spark, dlog_ns, stream="subscribed", startingOffsets="earliest",
                                            subscription="spark-job"),
                              "noop", tmp_path / "checkpoint")
    ledger = ns.stream_info("subscribed")["segments"][-1]["ledger"]
    assert ns.subscriptions("subscribed") == {"spark-job": Offset(ledger, 5, 0)}
    # Spark's progress shows where the stream ends (reportLatestOffset): the source's only metric
    # pyspark 4.3 lets a Python source report.
    source = query.lastProgress["sources"][0]
    assert json.loads(source["latestOffset"]) == {"subscribed": {"entry": 5, "ledger": ledger}}

    dlog_ns.write("subscribed", values(200, start=500), entry_records=100)
    lag = ns.subscription_lag("subscribed", "spark-job")["spark-job"]  # what `dlog subscription describe` shows
    assert lag["lag_records"] == 200 and lag["lag_bytes"] > 0
    from dlog_tools.ui import UiOptions, UiThread

    page = UiThread(UiOptions(cluster.zk_address, cluster.zk_root, dlog_ns.options["namespaceRoot"],
                                namespaces=(dlog_ns.options["namespace"],)))
    url = page.start()
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/api/cluster", timeout=30) as answer:
            status = json.loads(answer.read())
    finally:
        page.stop()
    namespace = next(n for n in status["namespaces"] if n["name"] == dlog_ns.options["namespace"])
    shown = next(s for s in namespace["streams"] if s["name"] == "subscribed")["subscriptions"]
    assert [(s["name"], s["lag_records"], s["lag_bytes"]) for s in shown] == [("spark-job", 200, lag["lag_bytes"])]


def test_unknown_and_bad_options_are_refused_by_name(spark, dlog_ns):
    dlog_ns.ns.create_stream("strict")
    with pytest.raises(Exception, match=r"unknown option 'startingoffset'.*known options: .*startingOffsets"):
        stream_reader(spark, dlog_ns, stream="strict", startingOffset="earliest")
    with pytest.raises(Exception, match=r"bad maxRecordsPerTrigger '-5'"):
        stream_reader(spark, dlog_ns, stream="strict", maxRecordsPerTrigger="-5")
    with pytest.raises(Exception, match=r"stream 'absent' does not exist"):
        spark.read.format("dlog").options(**dlog_ns.options).option("stream", "absent").load()


def test_registered_explicitly_and_option_names_ignore_case(spark, dlog_ns):
    from dlog_spark.source import DlogDataSource

    spark.dataSource.register(DlogDataSource)
    dlog_ns.ns.create_stream("cased")
    dlog_ns.write("cased", values(200))
    options = {key.upper(): value for key, value in dlog_ns.options.items()}
    frame = spark.read.format("dlog").options(**options).option("STREAM", "cased").load()
    assert frame.count() == 200


# ------------------------------------------------------------------------------ timestamps and bytes

BASE_MS = 1_700_000_000_000


def write_timed(space: Dlog, stream: str, entries: int = 5, per_entry: int = 100) -> list[bytes]:
    """Entry e holds records stamped BASE + 1000 e + slot: a gap of 900 ms between entries."""
    space.ns.create_stream(stream, roll_records=300)  # entries 0-2 in one segment, the rest in the next
    written = values(entries * per_entry)
    with space.ns.open_writer(stream) as writer:
        for entry in range(entries):
            stamps = [BASE_MS + 1000 * entry + slot for slot in range(per_entry)]
            writer.write_batch(records_to_batch(written[entry * per_entry:(entry + 1) * per_entry],
                                                timestamps_ms=stamps))
    return written


def batch_values(spark, space: Dlog, **options: str) -> list[bytes]:
    frame = spark.read.format("dlog").options(**space.options).options(**options).load()
    return sorted(row.value for row in frame.select("value").collect())


@pytest.fixture
def timed(dlog_ns) -> tuple[Dlog, list[bytes]]:
    return dlog_ns, write_timed(dlog_ns, "timed")


def test_a_starting_timestamp_between_two_entries_inside_one_and_before_the_earliest(spark, timed):
    space, written = timed
    between = batch_values(spark, space, stream="timed", startingTimestamp=str(BASE_MS + 1500))
    assert between == written[200:]  # entry 1 ends at +1099, entry 2 starts at +2000
    inside = batch_values(spark, space, stream="timed", startingTimestamp=str(BASE_MS + 3050))
    assert inside == written[350:]  # from slot 50 of entry 3 (in the second segment)
    assert batch_values(spark, space, stream="timed", startingTimestamp="0") == written


def test_a_starting_timestamp_after_the_latest_record_fails_or_starts_at_the_latest(spark, timed):
    space, _ = timed
    late = str(BASE_MS + 10_000)
    with pytest.raises(Exception, match=r"stream 'timed' has no record at or after timestamp .*"
                                        r"startingOffsetsByTimestampStrategy=latest"):
        batch_values(spark, space, stream="timed", startingTimestamp=late)
    assert batch_values(spark, space, stream="timed", startingTimestamp=late,
                        startingOffsetsByTimestampStrategy="latest") == []


def test_ending_timestamps_end_before_the_first_record_at_or_after_them(spark, timed):
    space, written = timed
    assert batch_values(spark, space, stream="timed", endingTimestamp=str(BASE_MS + 3050)) == written[:350]
    window = batch_values(spark, space, stream="timed", startingTimestamp=str(BASE_MS + 1050),
                          endingOffsetsByTimestamp=json.dumps({"timed": BASE_MS + 1060}))
    assert window == written[150:160]  # both ends inside entry 1
    assert batch_values(spark, space, stream="timed", endingTimestamp=str(BASE_MS + 10_000)) == written


def test_streaming_starts_per_stream_by_timestamp_then_reads_new_records(spark, dlog_ns, tmp_path):
    written = write_timed(dlog_ns, "timed")
    dlog_ns.ns.create_stream("other")
    dlog_ns.write("other", values(100, prefix="other"))
    reader = (spark.readStream.format("dlog").options(**dlog_ns.options).option("streams", "timed,other")
              .option("startingOffsetsByTimestamp", json.dumps({"timed": BASE_MS + 2050}))
              .option("startingOffsets", "latest").load())
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = run_available_now(reader.select("stream", "value"), "parquet", checkpoint, path=str(out))
    assert query.exception() is None
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(row.value for row in rows) == written[250:]  # "other" starts at its latest: nothing

    with dlog_ns.ns.open_writer("other") as writer:
        writer.write_batch(records_to_batch(values(10, prefix="new")))
    query = run_available_now(reader.select("stream", "value"), "parquet", checkpoint, path=str(out))
    assert sum(input_rows(query)) == 10


def test_max_bytes_per_trigger_takes_whole_entries_and_combines_with_max_records(spark, dlog_ns, tmp_path):
    dlog_ns.ns.create_stream("sized")
    dlog_ns.write("sized", values(1000), entry_records=100)  # ten entries of about equal size
    entry_bytes = max(s["bytes"] for s in dlog_ns.ns.stream_info("sized")["segments"]) // 10

    def run(name: str, **limits: str):
        reader = (spark.readStream.format("dlog").options(**dlog_ns.options).option("stream", "sized")
                  .option("startingOffsets", "earliest").options(**limits).load())
        return run_available_now(reader, "noop", tmp_path / name)

    assert input_rows(run("bytes", maxBytesPerTrigger=str(int(entry_bytes * 3.5)))) == [300, 300, 300, 100]
    combined = run("both", maxBytesPerTrigger=str(int(entry_bytes * 3.5)), maxRecordsPerTrigger="250")
    assert input_rows(combined) == [200] * 5  # the record budget binds first (below one entry: test_plan)


def test_a_typed_stream_reads_in_its_latest_schema_across_three_versions(spark, dlog_ns):
    import pyarrow as pa

    ns = dlog_ns.ns
    ns.create_stream("evolving", schema="id:int32, name:string, note:string?")
    for columns, spec in (
            ({"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"], "note": ["n1", None]},
             "id:int32, full_name#2:string, note:string?, score:float64?"),  # adds `score`, renames `name`
            ({"id": pa.array([3], pa.int32()), "full_name": ["c"], "note": pa.array([None], pa.string()),
              "score": [0.5]},
             "id:int64, full_name:string, score:float64?"),  # widens `id`, drops `note`
            ({"id": pa.array([2**40], pa.int64()), "full_name": ["d"], "score": [1.5]}, None)):
        with ns.open_writer("evolving") as writer:
            writer.write_batch(pa.record_batch(columns))
        if spec:
            ns.alter_stream("evolving", schema=spec)
    frame = spark.read.format("dlog").options(**dlog_ns.options).option("stream", "evolving").load()
    assert frame.columns[-3:] == ["id", "full_name", "score"] and dict(frame.dtypes)["id"] == "bigint"
    assert sorted((row.id, row.full_name, row.score) for row in frame.collect()) == [
        (1, "a", None), (2, "b", None), (3, "c", 0.5), (2**40, "d", 1.5)]


# key compaction (issue 25): a batch read of a compacted stream gives exactly the log's records as
# they are now, the kept ones of compacted segments at their original ledger, entry and slot, then
# the rest, whether or not the query asks for the compacted copies at once (`readCompacted`)
async def compact(options: dict[str, str], stream: str) -> object:
    """Run one compaction of `stream` (as `dlog compact` does) on a namespace of its own."""
    from dlog.compaction import Compactor
    async with Namespace(options["zk"], options["namespace"], bookkeeper_root=options["zkRoot"],
                         root=options["namespaceRoot"]) as ns:
        return await Compactor(ns).run(stream)


@pytest.mark.timeout(200)
def test_a_batch_read_of_a_compacted_stream_gives_the_kept_records_at_their_offsets(spark, dlog_ns):
    keys = [f"k{index % 20}".encode() for index in range(600)]
    dlog_ns.ns.create_stream("kv")
    for first in (0, 200, 400):  # three segments: a writer session each (its close seals it)
        dlog_ns.write("kv", values(200, first), entry_records=10, keys=keys[first:first + 200])
    report = asyncio.run(compact(dlog_ns.options, "kv"))
    assert report.segments == [1, 2, 3] and report.records_kept == 20
    with dlog_ns.ns.open_reader("kv", follow=False) as reader:
        expected = [(r.offset.ledger_id, r.offset.entry_id, r.offset.slot, r.key, r.value) for r in reader]
    assert len(expected) == 20
    for read_compacted in ("false", "true"):
        frame = (spark.read.format("dlog").options(**dlog_ns.options).option("stream", "kv")
                 .option("readCompacted", read_compacted).option("minPartitions", "4").load())
        rows = sorted((row.ledger, row.entry, row.slot, row.key, row.value) for row in frame.collect())
        assert rows == sorted(expected), read_compacted
