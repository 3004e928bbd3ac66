"""What one micro-batch trigger costs the cluster (no Spark session: the source's own calls, as the
engine makes them): each stream is viewed once per trigger (one segment-list read, one config
read, one LAC read of its in-progress segment), `partitions` plans on `latestOffset`'s view, and
a worker's partition reads of a ledger reuse the handle an earlier task opened."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from bookkeeper.client.ledger import ReadHandle
from dlog.segments.codec import default_schema, records_to_batch
from dlog_spark.connection import connection
from dlog_spark.options import parse_source_options
from dlog_spark.partition import DlogPartition, read_partition
from dlog_spark.plan import Range
from dlog_spark.reader import DlogStreamReader
from dlog_spark.schema import read_schema
from tests.spark.conftest import values

STREAMS = ("left", "right")


class CountingStore:
    """The namespace's segment store, counting the reads made through it by (method, stream)."""

    def __init__(self, store: Any, counts: Counter) -> None:
        self._store = store
        self._counts = counts

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._store, name)
        if name not in ("config", "segments", "list_streams"):
            return found

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self._counts[(name, args[0] if args else None)] += 1
            return await found(*args, **kwargs)

        return counted


@pytest.fixture
def counts(monkeypatch) -> Counter:
    """Counts of store reads and of LAC reads (each one asks every bookie of a ledger's last
    ensemble: one fan-out), by ledger."""
    found: Counter = Counter()
    read_lac = ReadHandle.read_lac

    async def counted_read_lac(handle: ReadHandle) -> int:
        if not handle.is_closed:
            found[("lac", handle.ledger_id)] += 1
        return await read_lac(handle)

    monkeypatch.setattr(ReadHandle, "read_lac", counted_read_lac)
    return found


@pytest.fixture
def live_streams(dlog_ns):
    """Two streams, each with a completed segment and an in-progress one that a live writer holds."""
    writers = []
    for name in STREAMS:
        dlog_ns.ns.create_stream(name)
        dlog_ns.write(name, values(300))
        writer = dlog_ns.ns.open_writer(name)
        writer.write_batch(records_to_batch(values(200, start=300)))
        writers.append(writer)
    yield dlog_ns, writers
    for writer in writers:
        writer.close()


def spark_json(document: dict) -> dict:
    """An offset as Spark hands it back: through its JSON text."""
    return json.loads(json.dumps(document))


@pytest.mark.parametrize("limit", [ReadAllAvailable(), ReadMaxRows(150)], ids=["all", "maxRecords"])
def test_a_trigger_views_each_stream_once(live_streams, counts, limit):
    space, writers = live_streams
    options = parse_source_options({**space.options, "streams": ",".join(STREAMS),
                                    "startingOffsets": "earliest"}, batch=False)
    reader = DlogStreamReader(options, read_schema(default_schema()))
    conn = connection(options.connection)
    start = spark_json(reader.initialOffset())
    end = spark_json(reader.latestOffset(start, limit))  # the first trigger opens the handles
    reader.partitions(start, end)
    reader.commit(end)
    for writer in writers:
        writer.write_batch(records_to_batch(values(100, start=500)))

    conn.namespace.store = CountingStore(conn.namespace.store, counts)
    counts.clear()
    try:
        later = spark_json(reader.latestOffset(end, limit))
        partitions = reader.partitions(end, later)
    finally:
        conn.namespace.store = conn.namespace.store._store
    tails = {name: conn.call(conn.namespace.store.segments(name)).segments[-1].ledger_id for name in STREAMS}
    seen = {name: {"segments": counts[("segments", name)], "config": counts[("config", name)],
                   "lac": counts[("lac", tails[name])]} for name in STREAMS}
    print(f"\nper stream, one trigger ({type(limit).__name__}): {seen}; streams listed "
          f"{counts[('list_streams', None)]} times")
    assert partitions and later != end
    assert seen == {name: {"segments": 1, "config": 1, "lac": 1} for name in STREAMS}
    assert counts[("list_streams", None)] == 1


def test_partition_reads_in_a_worker_reuse_the_ledgers_handle(live_streams, monkeypatch):
    space, _ = live_streams
    options = parse_source_options({**space.options, "stream": "left"}, batch=False)
    conn = connection(options.connection)
    ledger_id = conn.call(conn.namespace.store.segments("left")).segments[0].ledger_id
    opened: Counter = Counter()
    open_ledger = conn.namespace.client.open_ledger

    async def counted_open(ledger: int, **kwargs: Any) -> Any:
        opened[ledger] += 1
        return await open_ledger(ledger, **kwargs)

    monkeypatch.setattr(conn.namespace.client, "open_ledger", counted_open)
    schema = read_schema(default_schema())
    rows = 0
    for first, last in ((0, 0), (1, 1), (2, 2)):  # three tasks, one entry of 100 records each
        partition = DlogPartition(Range("left", 1, ledger_id, first, last), fail_on_data_loss=True)
        rows += sum(batch.num_rows for batch in read_partition(options, schema, partition))
    print(f"\nopens of ledger {ledger_id} for three partitions: {opened[ledger_id]}")
    assert rows == 300
    assert opened[ledger_id] == 1  # the first task opens it; the others reuse its handle
