"""The dlog sink on real local Spark and real bookies: a stream-to-stream pipeline is exactly once
when Spark replays a batch after a restart (L6), batch writes append typed rows, a dead writer's
in-progress segment is sealed before the sink appends after it (L1, L3) and its segments are
positioned right after it (V4), and bad sink options are refused by name."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from dlog import SequenceError
from dlog.segments.codec import RecordSetCodec, records_to_batch
from dlog_spark.connection import connection
from dlog_spark.options import ConnectionOptions
from dlog_spark.segments import commit_batch, delete_ledgers
from dlog_spark.sink import DlogCommitMessage
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


def test_a_rerun_of_a_batch_write_with_a_producer_id_writes_only_the_rows_not_yet_in_the_stream(spark, dlog_ns):
    """producerId: each task is the idempotent producer <producerId>.p<partition>, its rows' sequences
    from sequenceColumn; rows at or below what the stream holds for it are not written again."""
    ns = dlog_ns.ns
    ns.create_stream("loaded")

    def write(where: str = "true", producer: str = "loader") -> None:
        rows = spark.range(0, 100, numPartitions=4).selectExpr("id as seq", "cast(id as string) as value")
        (rows.where(where).write.format("dlog").options(**dlog_ns.options).option("stream", "loaded")
         .option("producerId", producer).option("sequenceColumn", "seq").mode("append").save())

    def loaded() -> list[int]:
        return sorted(int(value) for value in read_values(spark, dlog_ns, "loaded"))

    write("seq % 25 < 10")  # a first run that got part of each partition in (0..24 is partition 0, ...)
    assert loaded() == [n for n in range(100) if n % 25 < 10]
    assert [ns.last_sequence("loaded", f"loader.p{p}") for p in range(4)] == [9, 34, 59, 84]
    write()  # the whole job again: each task writes only its rows above its producer's last sequence
    assert loaded() == list(range(100))
    assert [ns.last_sequence("loaded", f"loader.p{p}") for p in range(4)] == [24, 49, 74, 99]
    before = len(ns.stream_info("loaded")["segments"])
    write()  # and again: nothing to write, no segment added
    assert loaded() == list(range(100)) and len(ns.stream_info("loaded")["segments"]) == before
    with ns.open_writer("loaded", producer_id="loader.p3") as writer:  # the same producers a native writer sees
        assert writer.last_sequence == 99
    write(producer="other")  # another producer id is another producer: its rows are new
    assert loaded() == sorted(list(range(100)) * 2)

    # A task that read the producer's state before another job committed (its rows 90..99 are in the
    # stream now): the driver's commit refuses it, nothing appended.
    options = dlog_ns.options
    conn = connection(ConnectionOptions(options["zk"], options["namespace"], options["zkRoot"],
                                        options["namespaceRoot"]))
    namespace = conn.namespace
    config = conn.call(namespace.config("loaded"))
    ledger = conn.call(namespace.client.create_ledger(config.ensemble, config.write_quorum, config.ack_quorum,
                                                      password=namespace.password_of(config)))
    codec = RecordSetCodec(namespace.schema_of(config))
    conn.call(ledger.append(codec.encode(records_to_batch([b"late"]), 0)))
    conn.call(ledger.close())
    late = DlogCommitMessage("loaded", ledger.ledger_id, last_entry=0, records=1, producer="loader.p3",
                             first_sequence=95, last_sequence=95)
    segments = ns.stream_info("loaded")["segments"]
    with pytest.raises(SequenceError, match=r"producer 'loader.p3' of stream 'loaded' wrote sequences 95..95 but "
                                            r"the stream already holds up to 99"):
        conn.call(commit_batch(namespace, "loaded", [late], None, None))
    assert ns.stream_info("loaded")["segments"] == segments
    conn.call(delete_ledgers(namespace, [ledger.ledger_id], stream="loaded"))

    with pytest.raises(Exception, match=r"sequenceColumn 'seq' does not increase within the rows of task producer"):
        (spark.range(0, 5, numPartitions=1).selectExpr("4 - id as seq", "cast(id as string) as value")
         .write.format("dlog").options(**dlog_ns.options).option("stream", "loaded").option("producerId", "down")
         .option("sequenceColumn", "seq").mode("append").save())
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")  # two Arrow batches in one task
    try:
        with pytest.raises(Exception, match=r"sequenceColumn 'seq' does not increase within the rows of task producer"):
            (spark.range(0, 150, numPartitions=1)  # 0..99, then 50..99 again: refused, never taken as duplicates
             .selectExpr("case when id < 100 then id else id - 50 end as seq", "cast(id as string) as value")
             .write.format("dlog").options(**dlog_ns.options).option("stream", "loaded").option("producerId", "twice")
             .option("sequenceColumn", "seq").mode("append").save())
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    with pytest.raises(Exception, match=r"options 'producerId' and 'sequenceColumn' go together"):
        (spark.range(1).selectExpr("cast(id as string) as value").write.format("dlog").options(**dlog_ns.options)
         .option("stream", "loaded").option("producerId", "alone").mode("append").save())
    assert ns.last_sequence("loaded", "down") is None and ns.last_sequence("loaded", "twice.p0") is None
    assert loaded() == sorted(list(range(100)) * 2)


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
