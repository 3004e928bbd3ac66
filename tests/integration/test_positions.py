"""Stream positions on real bookie processes and ZooKeeper (V4): whatever wrote a record (write,
write_nowait, offer, write_batch, a Spark-sink commit), across rolls, a writer takeover and
truncation, every record has one dense, stable position; `open_reader(start=p)` returns exactly
the record at p, a truncated or future p is refused clearly; a stream from before positions is
read without them and gets them at its next writer open."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from dlog import Namespace, OffsetOutOfRangeError, PositionsUnknownError, TruncatedError, WriterFencedError
from dlog.segments.codec import RecordSetCodec, default_schema, records_to_batch
from dlog.segments.store import StreamStore
from dlog_spark.segments import commit_batch
from tests.harness.streamsim.actors import SinkMessage
from tests.helpers import local_clusters
from dlog_tools.cli.read import record_json

PROBE_EVERY = 1000


@pytest.fixture(scope="module")
def stream_cluster(zk_server, tmp_path_factory):  # type: ignore[no-untyped-def]
    """One 3-bookie cluster for the file's tests, which write streams of names of their own."""
    with local_clusters(zk_server, tmp_path_factory.mktemp("positions"), "t", default_bookies=3) as make:
        yield make()


def namespace(cluster) -> Namespace:
    return Namespace(cluster.zk_address, "test", bookkeeper_root=cluster.zk_root, root=f"{cluster.zk_root}-dlog",
                     add_timeout_s=3.0)


def values(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{index:05d}".encode() for index in range(count)]


async def read_all(ns: Namespace, name: str, start="earliest", **options) -> list:
    async with ns.open_reader(name, start, follow=False, **options) as reader:
        return [record async for record in reader]


async def sink_task(ns: Namespace, name: str, items: list[bytes], per_entry: int) -> SinkMessage:
    """A Spark sink write task: its rows in a new ledger of its own, outside the stream until the commit."""
    config = await ns.config(name)
    handle = await ns.client.create_ledger(config.ensemble, config.write_quorum, config.ack_quorum,
                                           password=ns.password_of(config), custom={"stream": name})
    codec, message = RecordSetCodec(default_schema()), SinkMessage(handle.ledger_id)
    for start in range(0, len(items), per_entry):
        rows = items[start:start + per_entry]
        piece = records_to_batch(rows, timestamps_ms=[1] * len(rows))
        payload = codec.encode(piece, message.records)
        await handle.append_async(payload)
        message.records += piece.num_rows
        message.bytes += len(payload)
    await handle.close()
    message.last_entry = handle.last_add_confirmed
    return message


async def write_mixed(ns: Namespace, name: str) -> dict[bytes, int | None]:
    """Every way of writing, rolls, a writer takeover and a sink commit; the positions acknowledged
    (offered records have no acknowledgement of their own: their positions come from reads)."""
    acked: dict[bytes, int | None] = {}
    first = await ns.open_writer(name, flush_records=100)
    for value in values("seq", 30):
        acked[value] = (await first.write(value)).position
    futures = {}
    for value in values("nowait", 3000):
        await first.wait_writable()
        futures[value] = first.write_nowait(value)
    for value, future in futures.items():
        acked[value] = (await future).position
    for value in values("offer", 2000):
        first.offer(value)
    await first.flush()
    batch = values("batch", 2500)
    written = await first.write_batch(pa.RecordBatch.from_pydict({"value": pa.array(batch, pa.binary())}))
    acked.update(zip(batch, (offset.position for offset in written)))
    # a second writer takes the stream over: it seals the first one's segment, which fences it
    async with ns.open_writer(name, takeover=True, lock_timeout_s=0.2, flush_records=100) as second:
        with pytest.raises(WriterFencedError):
            await first.write(b"fenced")
        await first.close()
        futures = {value: second.write_nowait(value) for value in values("after", 1500)}
        for value, future in futures.items():
            acked[value] = (await future).position
    tasks = [await sink_task(ns, name, values(f"sink{task}", 1200), per_entry=100) for task in range(2)]
    assert await commit_batch(ns, name, tasks, 0, "positions-test")
    async with ns.open_writer(name) as third:
        batch = values("last", 1800)
        written = await third.write_batch(pa.RecordBatch.from_pydict({"value": pa.array(batch, pa.binary())}))
        acked.update(zip(batch, (offset.position for offset in written)))
    return acked


async def test_positions_are_dense_and_stable_whatever_wrote_and_a_position_opens_a_reader(stream_cluster):
    async with namespace(stream_cluster) as ns:
        await ns.create_stream("dense", roll_records=700)
        acked = await write_mixed(ns, "dense")
        before = await read_all(ns, "dense")
        assert [r.position for r in before] == list(range(len(before))) == list(range(13_230))
        assert all(acked[r.value] == r.position for r in before if r.value in acked)  # acknowledged = read
        assert len((await ns.store.segments("dense")).segments) > 10  # rolls, the takeover, the sink

        cut = before[4321]
        await ns.truncate("dense", cut.offset)
        after = await read_all(ns, "dense")
        assert [(r.value, r.position) for r in after] == [(r.value, r.position) for r in before[4321:]]
        assert await ns.position_bounds("dense") == (4321, len(before))

        for position in range(0, len(before), PROBE_EVERY):
            if position < 4321:
                with pytest.raises(TruncatedError):
                    await ns.open_reader("dense", position)
                continue
            async with ns.open_reader("dense", position, follow=False) as reader:
                record = await anext(reader)
            assert (record.value, record.offset, record.position) == (
                before[position].value, before[position].offset, position)
        assert await read_all(ns, "dense", len(before)) == []  # the end: nothing yet
        with pytest.raises(TruncatedError, match=r"position 4000 of stream 'dense' was removed .* now start at "
                                                 r"position 4321\); open with skip_truncated=True"):
            await ns.open_reader("dense", 4000)
        skipped = await read_all(ns, "dense", 4000, skip_truncated=True)
        assert skipped[0].position == 4321
        with pytest.raises(OffsetOutOfRangeError, match=f"position {len(before) + 1} .* in the future: the next "
                                                        f"record written gets position {len(before)}"):
            await ns.open_reader("dense", len(before) + 1)


async def test_a_stream_from_before_positions_reads_without_them_and_gets_them_at_its_next_open(
        stream_cluster, zk):
    async with namespace(stream_cluster) as ns:
        await ns.create_stream("old", roll_records=300)
        async with ns.open_writer("old") as writer:
            await writer.write_batch(values("old", 1000))
        crashed = await ns.open_writer("old")
        await crashed.write_batch(values("crashed", 200))
        crashed.abort()  # the writer died: its segment stays in progress for the next one to recover
        store = StreamStore(zk, ns.root)
        for segment in (await store.segments("old")).segments:  # as written before positions existed
            path = store.segment_path("old", segment.sequence)
            document = json.loads((await zk.get(path))[0])
            del document["first_position"]
            await zk.set(path, json.dumps(document).encode())

        records = await read_all(ns, "old")
        assert len(records) == 1200 and {r.position for r in records} == {None}
        assert record_json(records[0])["position"] is None
        with pytest.raises(PositionsUnknownError, match="no record positions yet"):
            await ns.open_reader("old", 0)
        assert await ns.position_bounds("old") == (None, None)

        async with ns.open_reader("old", "earliest") as tailing:  # opened before the migration, following
            for _ in range(1200):
                assert (await anext(tailing)).position is None
            async with ns.open_writer("old") as writer:  # seals the crashed segment and assigns positions
                await writer.write_batch(values("new", 500))
            news = [await anext(tailing) for _ in range(500)]
        assert [r.position for r in news] == list(range(1200, 1700))
        records = await read_all(ns, "old")
        assert [r.position for r in records] == list(range(1700))
        assert [r.value for r in await read_all(ns, "old", 1100)][:2] == values("crashed", 200)[100:102]
        assert await ns.position_bounds("old") == (0, 1700)
