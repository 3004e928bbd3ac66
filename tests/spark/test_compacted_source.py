"""The dlog source on a compacted stream (issue 25, key compaction): a batch read gives exactly the
log's records as they are now, the kept ones of compacted segments with their original ledger,
entry and slot, then the rest, whether or not the query asks for the compacted copies at once
(`readCompacted`)."""

from __future__ import annotations

import pytest

from dlog.compaction import Compactor
from tests.spark.conftest import values

pytestmark = [pytest.mark.spark, pytest.mark.timeout(200)]


def test_a_batch_read_of_a_compacted_stream_gives_the_kept_records_at_their_offsets(spark, dlog_ns):
    keys = [f"k{index % 20}".encode() for index in range(600)]
    dlog_ns.ns.create_stream("kv")
    for first in (0, 200, 400):  # three segments: a writer session each (its close seals it)
        dlog_ns.write("kv", values(200, first), entry_records=10, keys=keys[first:first + 200])
    ns = dlog_ns.ns
    report = ns._loop.call(Compactor(ns.namespace).run("kv"))
    assert report.segments == [1, 2, 3] and report.records_kept == 20
    with ns.open_reader("kv", follow=False) as reader:
        expected = [(r.offset.ledger_id, r.offset.entry_id, r.offset.slot, r.key, r.value) for r in reader]
    assert len(expected) == 20
    for read_compacted in ("false", "true"):
        frame = (spark.read.format("dlog").options(**dlog_ns.options).option("stream", "kv")
                 .option("readCompacted", read_compacted).option("minPartitions", "4").load())
        rows = sorted((row.ledger, row.entry, row.slot, row.key, row.value) for row in frame.collect())
        assert rows == sorted(expected), read_compacted
