"""Streams on real bookie processes and ZooKeeper: records survive rolls, takeovers and a killed
writer (L1-L4), tailing readers follow rolls at once, truncation and retention remove exactly what
they should (L5), typed schemas are enforced, and bad names and offsets are refused."""

from __future__ import annotations

import asyncio
import datetime
import os
import signal
import subprocess
import sys
import time

import aiohttp
import pyarrow as pa
import pytest

from bookkeeper.errors import ConfigError, NoSuchLedgerError
from dlog import Namespace, Offset, OffsetOutOfRangeError, TruncatedError, WriterFencedError, WriterLockedError
from dlog.segments.metadata import SegmentState
from tests.helpers import eventually, local_clusters
from dlog_tools.cluster import LineReader


@pytest.fixture(scope="module")
def stream_cluster(zk_server, tmp_path_factory):
    """One 3-bookie cluster for the file's tests, which write streams of names of their own (a cluster
    start each was most of the file's time)."""
    with local_clusters(zk_server, tmp_path_factory.mktemp("streams"), "t", default_bookies=3) as make:
        yield make(bookie_args=["--gc-grace", "0"])  # GC collects deleted ledgers at once


@pytest.fixture
def own_cluster(cluster_factory):
    """A cluster of the test's own, for a test that counts what every bookie's garbage collection
    drops (the ledgers other tests deleted would be collected with its own)."""
    return cluster_factory(bookies=3, bookie_args=["--gc-grace", "0"])


def namespace(cluster, name: str = "test") -> Namespace:
    return Namespace(cluster.zk_address, name, bookkeeper_root=cluster.zk_root,
                     root=f"{cluster.zk_root}-dlog", add_timeout_s=3.0)


def values(count: int, start: int = 0) -> list[bytes]:
    return [f'{{"n": {index}, "kind": "event"}}'.encode() for index in range(start, start + count)]


async def read_all(ns: Namespace, name: str, start="earliest", **options) -> list:
    async with ns.open_reader(name, start, follow=False, **options) as reader:
        return [record async for record in reader]


async def write_all(writer, items: list[bytes]) -> list[Offset]:
    futures = []
    for value in items:
        await writer.wait_writable()
        futures.append(writer.write_nowait(value, key=value[:8]))
    return list(await asyncio.gather(*futures))


async def test_round_trip_across_many_rolls(stream_cluster):
    async with namespace(stream_cluster) as ns:
        await ns.create_stream("rolls", roll_records=400)
        async with ns.open_writer("rolls", flush_records=100) as writer:
            offsets = await write_all(writer, values(3000))
            batch = await writer.write_batch(values(1000, 3000))
        info = await ns.stream_info("rolls")
        segments = info["segments"]
        assert len(segments) >= 6 and all(s["state"] == "completed" for s in segments)
        assert sum(s["records"] for s in segments) == 4000
        assert [s["sequence"] for s in segments] == sorted(s["sequence"] for s in segments)
        records = await read_all(ns, "rolls")
        assert [r.value for r in records] == values(4000)
        assert [r.offset for r in records[:3000]] == offsets
        assert [r.offset for r in records[3000:]] == list(batch) and len(batch) == 1000
        assert records[5].key == values(6)[5][:8]
        ledger_order = [s["ledger"] for s in segments]
        positions = [(ledger_order.index(r.offset.ledger_id), r.offset.entry_id, r.offset.slot)
                     for r in records]
        assert positions == sorted(positions)  # offsets only increase across segments (L3)


async def test_takeover_fences_the_first_writer_and_keeps_what_it_acknowledged(stream_cluster):
    async with namespace(stream_cluster) as ns, namespace(stream_cluster) as other:
        await ns.create_stream("takeover")
        first = await ns.open_writer("takeover")
        acked = await write_all(first, values(200))
        with pytest.raises(WriterLockedError, match="takeover=True"):
            await other.open_writer("takeover", lock_timeout_s=0.2)
        second = await other.open_writer("takeover", lock_timeout_s=0.2, takeover=True)
        with pytest.raises(WriterFencedError):
            await first.write(b"too late")
        await write_all(second, values(100, 200))
        await second.close()
        await first.close()  # closing a fenced writer changes nothing
        records = await read_all(ns, "takeover")
        assert [r.value for r in records] == values(300)
        assert [r.offset for r in records[:200]] == acked
        listing = await ns.store.segments("takeover")
        assert [s.state for s in listing.segments] == [SegmentState.COMPLETED] * 2


async def test_kill_9_of_the_writer_then_a_new_writer_recovers(stream_cluster):
    cluster = stream_cluster
    script = (
        "import sys, dlog\n"
        "ns = dlog.connect(sys.argv[1], 'test', bookkeeper_root=sys.argv[2], root=sys.argv[2] + '-dlog')\n"
        "ns.create_stream('killed')\n"
        "w = ns.open_writer('killed')\n"
        "for i in range(100000):\n"
        "    w.write(b'v%06d' % i)\n"
        "    print('acked', i, flush=True)\n")
    writer = subprocess.Popen([sys.executable, "-c", script, cluster.zk_address, cluster.zk_root],
                              stdout=subprocess.PIPE, text=True)
    lines, acked = LineReader(writer), -1
    try:
        while acked < 150:
            line = lines.next_line(60)
            assert line is not None, "the writer process stopped early"
            acked = int(line.split()[1])
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(timeout=30)
        writer.stdout.close()
    async with namespace(cluster) as ns:
        async with ns.open_writer("killed", lock_timeout_s=0.5, takeover=True) as second:
            await second.write(b"after")
        records = await read_all(ns, "killed")
        written = [r.value for r in records]
        assert written[: acked + 1] == [b"v%06d" % i for i in range(acked + 1)]
        assert written[-1] == b"after" and len(written) == len(set(written))
        listing = await ns.store.segments("killed")
        assert all(not s.is_in_progress for s in listing.segments)


async def test_tailing_reader_sees_records_at_once_and_follows_rolls(stream_cluster):
    async with namespace(stream_cluster) as ns, namespace(stream_cluster) as reader_ns:
        await ns.create_stream("tail", roll_records=50)
        writer = await ns.open_writer("tail", flush_records=10, linger_ms=1)
        reader = await reader_ns.open_reader("tail", "latest", poll_timeout_ms=20_000)
        seen: list[tuple[bytes, float]] = []

        async def follow() -> None:
            async for record in reader:
                seen.append((record.value, time.monotonic()))
                if len(seen) == 300:
                    return

        task = asyncio.create_task(follow())
        sent: dict[bytes, float] = {}
        for value in values(300):
            sent[value] = time.monotonic()
            await writer.write(value)
        await asyncio.wait_for(task, 60)
        assert [value for value, _ in seen] == values(300)
        # rolls happened under the reader, and with a 20 s poll timeout it still kept up: the
        # segment watch and the long poll woke it, not a timer
        assert len((await ns.stream_info("tail"))["segments"]) >= 6
        assert max(at - sent[value] for value, at in seen) < 5.0
        await reader.close()
        await writer.close()


async def test_truncation_removes_whole_segments_below_and_guards_the_rest(stream_cluster):
    async with namespace(stream_cluster) as ns:
        await ns.create_stream("trunc", roll_records=100)
        async with ns.open_writer("trunc", flush_records=25) as writer:
            offsets = await write_all(writer, values(1000))
        cut = offsets[450]  # inside the fifth segment
        before = (await ns.store.segments("trunc")).segments
        removed = await ns.truncate("trunc", before=cut)
        assert [s.ledger_id for s in removed] == [s.ledger_id for s in before[:4]]
        for segment in removed:
            with pytest.raises(NoSuchLedgerError):
                await ns.client.ledger_metadata(segment.ledger_id)
        records = await read_all(ns, "trunc")
        assert records[0].offset == cut and [r.value for r in records] == values(550, 450)
        with pytest.raises(TruncatedError, match="skip_truncated=True"):
            await read_all(ns, "trunc", start=offsets[10])
        skipped = await read_all(ns, "trunc", start=offsets[10], skip_truncated=True)
        assert skipped[0].offset == cut
        with pytest.raises(OffsetOutOfRangeError, match="past its end"):
            await ns.truncate("trunc", before=Offset(offsets[-1].ledger_id, offsets[-1].entry_id + 5))
        assert len(await read_all(ns, "trunc")) == 550  # a refused truncation changed nothing


async def test_retention_by_size_and_age_respects_subscribers(own_cluster):
    async with namespace(own_cluster) as ns:
        await ns.create_stream("keep", roll_records=100)
        async with ns.open_writer("keep", flush_records=50) as writer:
            offsets = await write_all(writer, values(1000))
        listing = await ns.store.segments("keep")
        segment_bytes = listing.segments[0].bytes
        await ns.commit_subscription("keep", "slow-reader", offsets[350])  # in segment 4
        await ns.set_retention("keep", size_bytes=segment_bytes * 3)
        plan = await ns.apply_retention("keep", dry_run=True)
        assert [s.sequence for s in plan] == [s.sequence for s in listing.segments[:3]]
        assert len((await ns.store.segments("keep")).segments) == 10  # dry run removed nothing
        removed = await ns.apply_retention("keep")
        assert [s.sequence for s in removed] == [s.sequence for s in listing.segments[:3]]
        records = await read_all(ns, "keep")
        kept_first = Offset(listing.segments[3].ledger_id, 0)
        assert records[0].offset == kept_first  # from the subscriber's segment on, all is still there
        assert offsets[350] in [r.offset for r in records]
        await ns.set_retention("keep", size_bytes=0, age_ms=1000, keep_unconsumed=False)
        future_ms = listing.segments[-1].last_timestamp_ms + 10_000
        removed = await ns.apply_retention("keep", now_ms=future_ms)
        remaining = (await ns.store.segments("keep")).live
        assert len(remaining) == 1 and remaining[0] == listing.segments[-1]  # the last one stays
        assert len(removed) == 6
        # removed segments' ledgers are deleted, so bookie garbage collection reclaims them
        removed_ledgers = {s.ledger_id for s in listing.segments[:-1]}
        collected: set[int] = set()
        async with aiohttp.ClientSession() as session:
            for bookie in own_cluster.bookies:
                async with session.post(f"{bookie.http}/api/v1/gc") as response:
                    collected.update((await response.json())["deleted_ledgers"])
        assert collected == removed_ledgers


async def test_typed_streams_check_every_batch(stream_cluster):
    schema = pa.schema([("id", pa.int64(), False), ("name", pa.string()),
                        ("timestamp", pa.timestamp("ms"), False)])
    async with namespace(stream_cluster) as ns:
        await ns.create_stream("typed", schema=schema)
        now = int(time.time() * 1000)
        good = pa.RecordBatch.from_pydict({"id": [1, 2], "name": ["a", None],
                                           "timestamp": pa.array([now, now], pa.timestamp("ms"))},
                                          schema=schema)
        async with ns.open_writer("typed") as writer:
            await writer.write_batch(good)
            bad = pa.RecordBatch.from_pydict({"id": ["x"], "name": ["a"],
                                              "timestamp": pa.array([now], pa.timestamp("ms"))})
            with pytest.raises(ConfigError, match="id"):
                await writer.write_batch(bad)
        async with ns.open_reader("typed", follow=False) as reader:
            batch = await reader.read_batch(100, timeout_ms=5000)
        assert batch.schema.equals(schema) and batch.column("id").to_pylist() == [1, 2]


async def test_record_values_may_be_any_bytes_like_and_nothing_else(stream_cluster):
    async with namespace(stream_cluster) as ns:
        await ns.create_stream("bytes-like")
        async with ns.open_writer("bytes-like") as writer:
            source = bytearray(b"from a bytearray")
            written = writer.write_nowait(source)
            source[:4] = b"XXXX"  # the writer copied it: a later change must not reach the stream
            await writer.write(memoryview(b"from a memoryview"))
            for wrong in ("text", 7, None):
                with pytest.raises(ConfigError, match="must be bytes"):
                    writer.write_nowait(wrong)  # type: ignore[arg-type]
            await writer.write(b"plain bytes")
            await written
        async with ns.open_reader("bytes-like", follow=False) as reader:
            values = [record.value async for record in reader]
        assert values == [b"from a bytearray", b"from a memoryview", b"plain bytes"]


async def test_a_reader_reads_ahead_within_its_byte_bound(stream_cluster):
    async with namespace(stream_cluster) as ns:
        await ns.create_stream("ahead")
        values = [b"%06d" % index + b"x" * 994 for index in range(2000)]  # 1 KB records
        async with ns.open_writer("ahead") as writer:
            for start in range(0, len(values), 100):  # 20 entries of about 100 KB decoded
                await writer.write_batch(values[start:start + 100])
        with pytest.raises(ConfigError, match="read_ahead_bytes"):
            await ns.open_reader("ahead", read_ahead_bytes=0)
        async with ns.open_reader("ahead", follow=False, read_ahead_bytes=250_000) as reader:
            first = await reader.next_entry(timeout_s=10)
            assert first is not None
            one_entry = first.batch.nbytes

            machine = reader.machine

            def held_back() -> bool:  # a decoded entry waits for room, with the queue as it is
                return machine.held is not None

            await eventually(held_back, timeout_s=10)
            assert machine.queued_entries == 250_000 // one_entry  # two entries fit, a third would not
            assert machine.queued_bytes <= 250_000
            read = [value for value in first.batch.column("value").to_pylist()]
            while (entry := await reader.next_entry(timeout_s=10)) is not None:
                read += entry.batch.column("value").to_pylist()
        assert read == values


@pytest.mark.parametrize("name", ["", "/", "a//b", "../x", ".hidden", "a\x00b", "x" * 300, "a/./b"])
async def test_bad_stream_names_are_refused(stream_cluster, name):
    async with namespace(stream_cluster, "bad-names") as ns:  # a namespace no other test writes in
        with pytest.raises(ConfigError):
            await ns.create_stream(name)
        assert await ns.list_streams() == []


async def test_bad_and_future_offsets_are_refused(stream_cluster):
    async with namespace(stream_cluster) as ns:
        await ns.create_stream("offsets")
        async with ns.open_writer("offsets") as writer:
            offsets = await write_all(writer, values(10))
        with pytest.raises(ConfigError, match="L:E"):
            await ns.open_reader("offsets", "not-an-offset")
        with pytest.raises(OffsetOutOfRangeError, match="future"):
            await ns.open_reader("offsets", Offset(offsets[0].ledger_id, 999))
        with pytest.raises(OffsetOutOfRangeError, match="no segment"):
            await ns.open_reader("offsets", Offset(offsets[0].ledger_id + 1000, 0))
        records = await read_all(ns, "offsets", start=offsets[4])
        assert [r.value for r in records] == values(6, 4)


async def test_read_from_a_timestamp(stream_cluster):
    async with namespace(stream_cluster) as ns:
        await ns.create_stream("clock", roll_records=20)
        async with ns.open_writer("clock") as writer:
            for index, value in enumerate(values(100)):
                writer.write_nowait(value, timestamp_ms=1_000_000 + index * 10)
            await writer.flush()
        moment = datetime.datetime.fromtimestamp(1_000.555, datetime.UTC)
        records = await read_all(ns, "clock", start=moment)  # a time is a datetime; an int is a stream position
        assert [r.value for r in records] == values(44, 56)


async def test_offer_records_buffers_runs_at_once_beside_single_records_in_order(stream_cluster):
    """offer_records: column-wise runs share entries with per-record writes, split where an entry
    would overflow, keep every record's key, timestamp and headers, and get consecutive positions;
    a bad record refuses the whole call before anything is buffered."""
    async with namespace(stream_cluster) as ns:
        await ns.create_stream("runs")
        async with ns.open_writer("runs", entry_bytes_max=4096, linger_ms=5) as writer:
            single = writer.write_nowait(b"first", key=b"k0", timestamp_ms=1_700_000_000_000)
            many = values(300)
            keys = [None if n % 3 else b"key-%d" % n for n in range(300)]
            stamps = [1_700_000_000_000 + n * 7 for n in range(300)]
            headers = [[("trace", b"t%d" % n)] if n % 5 == 0 else None for n in range(300)]
            run = writer.offer_records(many, keys, stamps, headers)
            plain = writer.offer_records([b"a", b"b"])
            with pytest.raises(ConfigError, match="bytes"):
                writer.offer_records([b"fine", "not bytes"])  # type: ignore[list-item]
            with pytest.raises(ConfigError, match="one length"):
                writer.offer_records([b"x", b"y"], keys=[None])
            last = writer.write_nowait(b"last")
            assert (await single).position == 0
            assert await run == 1  # the first record's position, once all 300 are durable
            assert await plain == 301
            assert (await last).position == 303
        records = await read_all(ns, "runs", headers=True)
    assert [record.value for record in records] == [b"first", *many, b"a", b"b", b"last"]
    assert [record.position for record in records] == list(range(304))
    got = records[1:301]
    assert [record.key for record in got] == keys
    assert [record.timestamp_ms for record in got] == stamps
    assert [record.headers or None for record in got] == headers
    entries = {record.offset.entry_id for record in got}
    assert len(entries) > 3  # 300 records of ~45 bytes: runs cut to fit entries of at most 4 KiB


async def test_offer_records_refuses_a_typed_stream_and_a_closed_writer(stream_cluster):
    async with namespace(stream_cluster) as ns:
        schema = pa.schema([pa.field("timestamp", pa.timestamp("ms"), nullable=False), pa.field("n", pa.int64())])
        await ns.create_stream("typed-runs", schema=schema)
        async with ns.open_writer("typed-runs") as writer:
            with pytest.raises(ConfigError, match="typed"):
                writer.offer_records([b"x"])
        await ns.create_stream("closed-runs")
        writer = await ns.open_writer("closed-runs")
        await writer.close()
        with pytest.raises(Exception, match="closed"):
            writer.offer_records([b"x"])


async def test_writers_of_one_process_send_the_records_of_a_turn_in_one_shared_round(stream_cluster):
    """Issue 26 item 1: records written to many writers in one event-loop turn go out in ONE flush
    round, each writer's as one entry built from a slice of one Arrow build, and every stream gets
    back exactly its own records (keys, timestamps, order); a writer with headers builds its own."""
    from dlog.writer import FlushRounds

    async with namespace(stream_cluster) as ns:
        names = [f"round-{index}" for index in range(6)]
        for name in names:
            await ns.create_stream(name)
        writers = [await ns.open_writer(name) for name in names]
        try:
            rounds = FlushRounds.of(asyncio.get_running_loop())
            before = (rounds.rounds, rounds.writers_run, rounds.rows_built)
            futures = []
            for turn in range(3):  # one turn: no await between the writes
                for index, writer in enumerate(writers):
                    headers = [("trace", b"t")] if index == 5 and turn == 1 else None
                    futures.append(writer.write_nowait(b"%s-%d" % (names[index].encode(), turn),
                                                       key=b"k%d" % index if turn else None,
                                                       timestamp_ms=1_700_000_000_000 + 10 * index + turn,
                                                       headers=headers))
            offsets = await asyncio.gather(*futures)
            after = (rounds.rounds, rounds.writers_run, rounds.rows_built)
        finally:
            for writer in writers:
                await writer.close()
        assert after[0] - before[0] == 1 and after[1] - before[1] == 6  # one round ran all six
        # built together: every writer's rows, of the last writer's only those before its headers (its
        # entry, which holds all three, then builds its own)
        assert after[2] - before[2] == 5 * 3 + 1
        for index, name in enumerate(names):
            mine = offsets[index::6]
            assert len({(offset.ledger_id, offset.entry_id) for offset in mine}) == 1  # one entry each
            records = await read_all(ns, name, headers=True)
            assert [record.value for record in records] == [b"%s-%d" % (name.encode(), turn) for turn in range(3)]
            assert [record.headers or None for record in records] == [None, [("trace", b"t")] if index == 5 else None,
                                                                       None]
            assert [record.key for record in records] == [None, b"k%d" % index, b"k%d" % index]
            assert [record.timestamp_ms for record in records] == [1_700_000_000_000 + 10 * index + turn
                                                                   for turn in range(3)]
