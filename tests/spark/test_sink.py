"""The dlog sink on real local Spark and real bookies: a stream-to-stream pipeline is exactly once
when Spark replays a batch after a restart (L6), batch writes append typed rows, a dead writer's
in-progress segment is sealed before the sink appends after it (L1, L3) and its segments are
positioned right after it (V4), and bad sink options are refused by name."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from dlog_spark.connection import connection
from dlog_spark.options import ConnectionOptions
from tests.spark.conftest import Dlog, input_rows, run_available_now, values

pytestmark = pytest.mark.spark


def ledgers(space: Dlog) -> set[int]:
    options = space.options
    conn = connection(ConnectionOptions(options["zk"], options["namespace"], options["zkRoot"],
                                        options["namespaceRoot"]))
    return set(conn.call(conn.namespace.client.list_ledgers()))


def read_values(spark, space: Dlog, stream: str) -> list[bytes]:
    """In stream order: a batch read has one partition per segment range, in segment order, and
    collect() keeps partition order (ledger ids need not follow segment order)."""
    frame = spark.read.format("dlog").options(**space.options).option("stream", stream).load()
    return [row.value for row in frame.select("value").collect()]


def sink_node(space: Dlog, stream: str, sink_id: str) -> dict:
    options = space.options
    conn = connection(ConnectionOptions(options["zk"], options["namespace"], options["zkRoot"],
                                        options["namespaceRoot"]))
    found = conn.call(conn.namespace.zk.get_or_none(conn.namespace.store.sink_path(stream, sink_id)))
    return json.loads(found[0])


def test_a_replayed_batch_of_a_stream_to_stream_pipeline_is_written_once(spark, dlog_ns, tmp_path):
    ns = dlog_ns.ns
    ns.create_stream("source")
    ns.create_stream("upper")
    dlog_ns.write("source", values(1000), entry_records=100)
    checkpoint = tmp_path / "checkpoint"

    def run():
        reader = (spark.readStream.format("dlog").options(**dlog_ns.options).option("stream", "source")
                  .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", "400").load()
                  .selectExpr("key", "upper(cast(value as string)) as value", "timestamp"))
        return run_available_now(reader, "dlog", checkpoint, stream="upper", sinkId="upper-job",
                                 **dlog_ns.options)

    query = run()
    assert query.exception() is None and input_rows(query) == [400, 400, 200]
    expected = [value.upper() for value in values(1000)]
    assert sorted(read_values(spark, dlog_ns, "upper")) == expected
    assert sink_node(dlog_ns, "upper", "upper-job")["batch"] == 2
    segments_before, ledgers_before = ns.stream_info("upper")["segments"], ledgers(dlog_ns)

    # Spark wrote batch 2 to dlog but "crashed" before its own commit log: it replays batch 2.
    (checkpoint / "commits" / "2").unlink()
    (checkpoint / "commits" / ".2.crc").unlink()
    replay = run()
    assert replay.exception() is None and input_rows(replay) == [200]
    assert sorted(read_values(spark, dlog_ns, "upper")) == expected  # not one record twice
    assert ns.stream_info("upper")["segments"] == segments_before
    assert ledgers(dlog_ns) == ledgers_before  # the replay's ledgers were deleted
    assert dlog_ns.records("upper") == 1000


def test_batch_writes_append_rows_of_a_typed_stream(spark, dlog_ns):
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()),
                        pa.field("timestamp", pa.timestamp("ms"), nullable=False)])
    dlog_ns.ns.create_stream("typed", schema=schema)
    rows = spark.range(500).selectExpr("id", "concat('n', id) as name")
    writer = rows.write.format("dlog").options(**dlog_ns.options).option("stream", "typed").mode("append")
    writer.save()
    writer.save()
    frame = spark.read.format("dlog").options(**dlog_ns.options).option("stream", "typed").load()
    assert frame.columns == ["stream", "ledger", "entry", "slot", "timestamp", "id", "name"]
    ids = sorted(row.id for row in frame.select("id").collect())
    assert ids == sorted(list(range(500)) * 2)
    assert frame.where("name = concat('n', id) and timestamp is not null").count() == 1000
    with pytest.raises(Exception, match="append-only"):
        rows.write.format("dlog").options(**dlog_ns.options).option("stream", "typed").mode("overwrite").save()
    with pytest.raises(Exception, match="column 'extra' has no place"):
        (rows.selectExpr("id", "name", "1 as extra").write.format("dlog").options(**dlog_ns.options)
         .option("stream", "typed").mode("append").save())


def test_the_sink_seals_a_dead_writers_in_progress_segment_before_appending(spark, dlog_ns, cluster):
    import dlog

    dlog_ns.ns.create_stream("shared")
    crashed = dlog.connect(cluster.zk_address, dlog_ns.options["namespace"], bookkeeper_root=cluster.zk_root,
                           root=dlog_ns.options["namespaceRoot"])
    writer = crashed.open_writer("shared")
    writer.write_batch(values(50, prefix="writer"))
    crashed.close()  # its session ends: the lock is free, the segment stays in progress
    assert [s["state"] for s in dlog_ns.ns.stream_info("shared")["segments"]] == ["in_progress"]

    frame = spark.createDataFrame([(value,) for value in values(100, prefix="spark")], "value binary")
    frame.write.format("dlog").options(**dlog_ns.options).option("stream", "shared").mode("append").save()
    segments = dlog_ns.ns.stream_info("shared")["segments"]
    assert [s["state"] for s in segments] == ["completed"] * len(segments)
    assert segments[0]["records"] == 50
    assert read_values(spark, dlog_ns, "shared") == values(50, prefix="writer") + values(100, prefix="spark")
    # V4: the task segments are positioned one after the other, after the sealed one
    assert [s["first_position"] for s in segments] == [sum(s["records"] for s in segments[:i])
                                                       for i in range(len(segments))]
    with dlog_ns.ns.open_reader("shared", follow=False) as reader:
        assert [record.position for record in reader] == list(range(150))


def test_bad_sink_options_are_refused_by_name(spark, dlog_ns):
    dlog_ns.ns.create_stream("target")
    frame = spark.createDataFrame([(b"x",)], "value binary")
    with pytest.raises(Exception, match=r"unknown option 'topic' for a batch write.*known options: .*sinkId"):
        frame.write.format("dlog").options(**dlog_ns.options).option("stream", "target").option("topic", "t").mode("append").save()
    with pytest.raises(Exception, match=r"stream 'absent' does not exist"):
        frame.write.format("dlog").options(**dlog_ns.options).option("stream", "absent").mode("append").save()


def test_a_streaming_aggregation_in_complete_mode_appends_its_results(spark, dlog_ns, tmp_path):
    """Like Kafka's sink: each micro-batch's aggregate rows are appended; batch overwrite stays refused."""
    from pyspark.sql import functions as F

    ns = dlog_ns.ns
    ns.create_stream("clicks")
    ns.create_stream("counts")
    actions = [b"buy", b"view", b"view", b"click", b"view", b"buy"] * 50
    dlog_ns.write("clicks", actions, entry_records=30)
    frame = (spark.readStream.format("dlog").options(**dlog_ns.options).option("stream", "clicks")
             .option("startingOffsets", "earliest").load()
             .groupBy(F.col("value").cast("string").alias("action")).count()
             .select(F.col("action").cast("binary").alias("key"),
                     F.col("count").cast("string").cast("binary").alias("value")))
    writer = (frame.writeStream.format("dlog").options(**dlog_ns.options).option("stream", "counts")
              .option("checkpointLocation", str(tmp_path / "checkpoint")).outputMode("complete"))
    query = writer.trigger(availableNow=True).start()
    assert query.awaitTermination(180) and query.exception() is None
    rows = (spark.read.format("dlog").options(**dlog_ns.options).option("stream", "counts").load()
            .select("key", "value").collect())
    assert {bytes(r.key): int(bytes(r.value)) for r in rows} == {b"buy": 100, b"view": 150, b"click": 50}


def test_record_headers_round_trip_through_the_source_and_the_sink(spark, dlog_ns):
    from dlog.segments.codec import records_to_batch

    ns = dlog_ns.ns
    ns.create_stream("traced")
    ns.create_stream("copied")
    headers = [[("trace", b"t%d" % i), ("hop", None)] if i % 2 else None for i in range(200)]
    with ns.open_writer("traced") as writer:
        writer.write_batch(records_to_batch(values(100), headers=headers[:100]))
        writer.write_batch(records_to_batch(values(100, start=100)))  # an entry with no headers at all

    def read(stream: str, **options: str):
        return spark.read.format("dlog").options(**dlog_ns.options).option("stream", stream).options(**options).load()

    assert "headers" not in read("traced").columns  # only with includeHeaders, as Kafka's source
    frame = read("traced", includeHeaders="true")
    assert frame.columns[-1] == "headers"
    expected = {value: ([(h[0], h[1]) for h in pairs] if pairs and index < 100 else None)
                for index, (value, pairs) in enumerate(zip(values(200), headers))}

    def seen(stream: str) -> dict[bytes, list | None]:
        rows = read(stream, includeHeaders="true").select("value", "headers").collect()
        return {bytes(r.value): None if r.headers is None else [(h.key, None if h.value is None else bytes(h.value))
                                                                 for h in r.headers] for r in rows}

    assert seen("traced") == expected
    frame.select("key", "value", "timestamp", "headers").write.format("dlog").options(**dlog_ns.options) \
        .option("stream", "copied").mode("append").save()
    assert seen("copied") == expected
    with pytest.raises(Exception, match=r"column 'headers' .*'key' of type string has nulls"):
        (spark.createDataFrame([(b"v", [(None, b"x")])], "value binary, headers array<struct<key:string,value:binary>>")
         .write.format("dlog").options(**dlog_ns.options).option("stream", "copied").mode("append").save())


def test_a_stream_column_routes_rows_and_create_stream_makes_missing_targets(spark, dlog_ns):
    ns = dlog_ns.ns
    ns.create_stream("eu")
    ns.create_stream("us")
    rows = [(("eu", "us", "apac")[i % 3], b"v%04d" % i) for i in range(300)]
    frame = spark.createDataFrame(rows, "stream string, value binary").repartition(3)

    def write(**options: str) -> None:
        frame.write.format("dlog").options(**dlog_ns.options).options(**options).mode("append").save()

    with pytest.raises(Exception, match=r"stream 'apac' does not exist.*createStream"):
        write()
    assert dlog_ns.records("eu") == dlog_ns.records("us") == 0  # the failed batch left nothing
    write(createStream="true", ensemble="3", writeQuorum="3", ackQuorum="2")
    for name in ("eu", "us", "apac"):
        assert sorted(read_values(spark, dlog_ns, name)) == sorted(v for s, v in rows if s == name)
    created = ns.stream_info("apac")["config"]
    assert (created["ensemble"], created["write_quorum"], created["ack_quorum"]) == (3, 3, 2)

    with pytest.raises(Exception, match=r"column 'stream' is null in 1 rows"):
        spark.createDataFrame([(None, b"x")], "stream string, value binary").write.format("dlog") \
            .options(**dlog_ns.options).mode("append").save()
    with pytest.raises(Exception, match=r"needs option 'stream' .* or a 'stream' column"):
        spark.createDataFrame([(b"x",)], "value binary").write.format("dlog").options(**dlog_ns.options) \
            .mode("append").save()
    with pytest.raises(Exception, match=r"option 'ensemble' only applies with createStream=true"):
        write(ensemble="3")
