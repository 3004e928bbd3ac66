"""The dlog source on streams offloaded in part (issue 24): batch and AvailableNow reads give
exactly the log's records (values, keys, headers, timestamps, ledger/entry/slot) across offloaded
segments whose bookie copies are gone, offloaded ones still on bookies, ledger-only ones and the
in-progress tail, whichever copy the query prefers; timestamp options place a start and an end
inside offloaded segments of a typed stream with microsecond stamps; a truncation point inside
an offloaded segment holds; a streaming query started before an offload reads on after the
bookie copies are deleted under it; and the stock `spark.read.parquet` of the tier directory
gives the offloaded records as they are in the log."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from dlog.bridge import LoopThread
from dlog.namespace import Namespace
from dlog.offload import Offloader
from dlog.offsets import Offset
from dlog.segments.metadata import TierPolicy
from dlog.segments.tier import stream_table_uri
from tests.helpers import eventually_blocking
from tests.spark.conftest import input_rows, run_available_now
from tests.tier import layers
from tests.tier.layers import Row, rows_of_table, without_positions

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


class Tiered:
    """One test's namespace, driven from its own event loop thread (the tier helpers are async)."""

    def __init__(self, cluster: Any) -> None:
        self.loop = LoopThread("tier-test")
        self.name = f"t-{uuid.uuid4().hex[:8]}"
        root = f"{cluster.zk_root}-dlog"
        self.ns = Namespace(cluster.zk_address, self.name, bookkeeper_root=cluster.zk_root, root=root)
        self.loop.call(self.ns.start())
        self.options = {"zk": cluster.zk_address, "namespace": self.name, "zkRoot": cluster.zk_root,
                        "namespaceRoot": root}

    def call(self, awaitable: Any) -> Any:
        return self.loop.call(awaitable, timeout_s=120)

    def close(self) -> None:
        self.loop.call(self.ns.close())
        self.loop.stop()


@pytest.fixture
def tiered(cluster) -> Iterator[Tiered]:
    space = Tiered(cluster)
    yield space
    space.close()


def spark_rows(frame: Any, typed: bool) -> list[Row]:
    """The frame's rows as layers.Row values, in the log's order (ledger order is not stream
    order: sorted by where each record is in `order`)."""
    return rows_of_table(frame.toArrow(), typed, position=False)


def in_log_order(rows: list[Row], expected: list[Row]) -> list[Row]:
    index = {(r.ledger, r.entry, r.slot): i for i, r in enumerate(expected)}
    return sorted(rows, key=lambda r: index.get((r.ledger, r.entry, r.slot), -1))


def test_batch_and_available_now_read_the_log_across_the_tier_and_the_tier_reads_as_a_table(
        spark, tiered, tmp_path):
    layered = tiered.call(layers.build(tiered.ns, "orders", f"file://{tmp_path}/tier"))
    try:
        expected = without_positions(layered.rows)  # the source has no position column
        base = spark.read.format("dlog").options(**tiered.options).option("stream", "orders") \
            .option("includeHeaders", "true")
        for prefer in ("bookies", "tier"):
            frame = base.option("prefer", prefer).option("minPartitions", "9").load()
            found = spark_rows(frame, False)
            assert in_log_order(found, expected) == expected, prefer
            assert len(found) == len(expected) == 200

        # AvailableNow in small triggers: admission counts records of tier segments from the file
        query = run_available_now(spark.readStream.format("dlog").options(**tiered.options)
                                  .options(stream="orders", startingOffsets="earliest", includeHeaders="true",
                                           maxRecordsPerTrigger="95", prefer="tier").load(),
                                  "parquet", tmp_path / "checkpoint", path=str(tmp_path / "out"))
        assert query.exception() is None
        assert input_rows(query) == [90, 90, 20]  # whole 10-record entries within 95
        assert in_log_order(spark_rows(spark.read.parquet(str(tmp_path / "out")), False), expected) == expected

        # the stock Parquet reader on the tier directory: the offloaded segments 1-4, as the log has them
        directory = stream_table_uri(f"file://{tmp_path}/tier", tiered.name, "orders")
        table = spark.read.parquet(directory).orderBy("segment", "entry", "slot")
        assert spark_rows(table, False) == expected[:120]
        assert [row.segment for row in table.select("segment").collect()] == [1] * 30 + [2] * 30 + [3] * 30 + [4] * 30
    finally:
        tiered.call(layered.writer.close())


def test_timestamps_place_a_start_and_an_end_inside_offloaded_segments_of_a_typed_stream(spark, tiered, tmp_path):
    layered = tiered.call(layers.build(tiered.ns, "typed", f"file://{tmp_path}/tier", typed=True))
    tiered.call(layered.writer.close())
    expected = without_positions(layered.rows)
    # microsecond stamps: record n at (BASE + 10 n) ms + 7 us, so the first at or after
    # (BASE + 451) ms is record 46 (segment 2, bookie copy gone), and after (BASE + 1001) ms record 101
    # (segment 4, still on bookies)
    for prefer in ("bookies", "tier"):
        frame = (spark.read.format("dlog").options(**tiered.options)
                 .options(stream="typed", prefer=prefer, startingTimestamp=str(layers.stamp_ms(45) + 1),
                          endingTimestamp=str(layers.stamp_ms(100) + 1)).load())
        assert in_log_order(spark_rows(frame, True), expected) == expected[46:101], prefer


def test_a_truncation_point_inside_an_offloaded_segment_holds_for_batch_and_streaming_reads(spark, tiered, tmp_path):
    layered = tiered.call(layers.build(tiered.ns, "cut", f"file://{tmp_path}/tier"))
    tiered.call(layered.writer.close())
    listing = tiered.call(tiered.ns.store.segments("cut"))
    ledger = listing.by_sequence(2).ledger_id  # its bookie copy is gone: only the tier has it
    tiered.call(tiered.ns.truncate("cut", Offset(ledger, 1, 3)))
    expected = without_positions(layered.rows)
    first = expected.index(next(r for r in expected if (r.ledger, r.entry, r.slot) == (ledger, 1, 3)))
    frame = (spark.read.format("dlog").options(**tiered.options)
             .options(stream="cut", includeHeaders="true").load())
    assert in_log_order(spark_rows(frame, False), expected) == expected[first:]
    query = run_available_now(spark.readStream.format("dlog").options(**tiered.options)
                              .options(stream="cut", startingOffsets="earliest", includeHeaders="true").load(),
                              "parquet", tmp_path / "checkpoint", path=str(tmp_path / "out"))
    assert query.exception() is None
    assert in_log_order(spark_rows(spark.read.parquet(str(tmp_path / "out")), False), expected) == expected[first:]


def test_a_streaming_query_started_before_an_offload_reads_on_after_the_bookie_copies_are_deleted(
        spark, tiered, tmp_path):
    ns = tiered.ns
    tiered.call(ns.create_stream("live", tier=TierPolicy(uri=f"file://{tmp_path}/tier", delete_lag_ms=0)))
    layered = layers.Layered("live", False, f"file://{tmp_path}/tier")
    for _ in range(4):
        tiered.call(layers.write_segment(ns, layered, 30, 10))
    query = (spark.readStream.format("dlog").options(**tiered.options)
             .options(stream="live", startingOffsets="earliest", includeHeaders="true",
                      maxRecordsPerTrigger="10").load()
             .writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="1 second").start())
    try:
        eventually_blocking(lambda: sum(input_rows(query)) > 0, message="the first micro-batch")
        report = tiered.call(Offloader(ns).run("live", now=True))  # offload, then delete the bookie copies
        read_before = sum(input_rows(query))
        assert [o.sequence for o in report.offloaded] == [1, 2, 3, 4]
        assert read_before < 120  # one 10-record entry per second: most is still to be read
        listing = tiered.call(ns.store.segments("live"))
        assert all(not s.on_bookies for s in listing.segments)
        tiered.call(layers.write_segment(ns, layered, 30, 10))  # and the stream goes on, on the bookies
        eventually_blocking(lambda: sum(input_rows(query)) >= 150, timeout_s=120,
                            message="every record, through the tier")
    finally:
        query.stop()
    assert query.exception() is None
    expected = without_positions(layered.rows)
    found = spark_rows(spark.read.parquet(str(tmp_path / "out")), False)
    assert in_log_order(found, expected) == expected  # exactly once, nothing lost


def test_a_worker_reads_the_planned_tier_copy_and_finds_one_the_plan_did_not_see(tiered, tmp_path, monkeypatch):
    """In this process, as a worker would: a partition of an offloaded segment carries its tier
    copy, so prefer=tier reads the file without opening the ledger, and a segment whose bookie
    copy is gone is read without a segment-list read; a partition planned before the offload
    whose ledger is deleted (before its task opens it, or between two of its reads) finds the
    copy with one list read and reads on from the file."""
    from bookkeeper.errors import NoSuchLedgerError
    from dlog.segments.codec import default_schema
    from dlog.snapshot import TierHandle
    from dlog_spark.connection import connection
    from dlog_spark.options import parse_source_options
    from dlog_spark.partition import DlogPartition, read_partition
    from dlog_spark.plan import Range
    from dlog_spark.schema import read_schema

    layered = tiered.call(layers.build(tiered.ns, "work", f"file://{tmp_path}/tier"))
    tiered.call(layered.writer.close())
    listing = {s.sequence: s for s in tiered.call(tiered.ns.store.segments("work")).segments}
    schema = read_schema(default_schema(), include_headers=True)

    def read(span: Range, prefer: str = "bookies") -> list[Row]:
        options = parse_source_options({**tiered.options, "stream": "work", "includeHeaders": "true",
                                        "prefer": prefer}, batch=True)
        batches = list(read_partition(options, schema, DlogPartition(span, fail_on_data_loss=True)))
        return without_positions([row for batch in batches for row in rows_of_table(batch, False)])

    def expected(sequence: int) -> list[Row]:
        return without_positions([r for r in layered.rows if r.ledger == listing[sequence].ledger_id])

    conn = connection(parse_source_options({**tiered.options, "stream": "work"}, batch=True).connection)
    opened: list[int] = []
    lists: list[str] = []
    open_ledger, segments = conn.namespace.client.open_ledger, conn.namespace.store.segments

    async def counted_open(ledger: int, **kwargs: Any) -> Any:
        opened.append(ledger)
        return await open_ledger(ledger, **kwargs)

    async def counted_segments(name: str) -> Any:
        lists.append(name)
        return await segments(name)

    monkeypatch.setattr(conn.namespace.client, "open_ledger", counted_open)
    monkeypatch.setattr(conn.namespace.store, "segments", counted_segments)

    def span(sequence: int, planned_tier: bool) -> Range:
        segment = listing[sequence]
        return Range("work", sequence, segment.ledger_id, 0, segment.last_entry,
                     tier=segment.tier if planned_tier else None)

    reads_before = conn.namespace.reads.tier_reads
    assert read(span(3, True), prefer="tier") == expected(3)  # on bookies too, read from its file
    assert read(span(1, True)) == expected(1)  # bookie copy gone: the planned copy says where
    assert opened == [] and lists == [] and conn.namespace.reads.tier_reads == reads_before + 2

    assert read(span(2, False)) == expected(2)  # planned before the offload: one list read finds the copy
    assert lists == ["work"] and opened == [listing[2].ledger_id]  # the deleted ledger, tried once

    assert read(span(4, False)) == expected(4)  # from the bookies; the worker keeps the ledger's handle
    assert opened == [listing[2].ledger_id, listing[4].ledger_id]
    tiered.call(tiered.ns.set_tier("work", TierPolicy(delete_lag_ms=0)))
    tiered.call(Offloader(tiered.ns).run("work"))  # deletes the bookie copies of 3 and 4
    assert not tiered.call(tiered.ns.store.segments("work")).by_sequence(4).on_bookies
    # the bookies keep a deleted ledger's entries until their garbage collection runs; once it
    # has, the cached handle's reads fail: stand in for that at the handle
    handle_of = conn.namespace.reads.handle

    class Collected:
        async def read(self, first: int, last: int) -> Any:
            raise NoSuchLedgerError(f"ledger {listing[4].ledger_id} was garbage-collected")

    async def collected(ledger_id: int, *args: Any, **kwargs: Any) -> Any:
        handle = await handle_of(ledger_id, *args, **kwargs)
        return Collected() if ledger_id == listing[4].ledger_id and not isinstance(handle, TierHandle) else handle

    monkeypatch.setattr(conn.namespace.reads, "handle", collected)
    assert read(span(4, False)) == expected(4)  # the handle fails mid-read: read on from the file
    assert lists == ["work", "work"]
