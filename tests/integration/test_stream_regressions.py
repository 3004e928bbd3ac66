"""Issue 11's bugs, each tried as a user would on real bookie processes and ZooKeeper: routine
operations beside a live writer (truncation, retention from the command line and on roll) leave it
writing and keep their truncation point; a slow tailing reader follows rolls; parked and buffered
writes always end; a reader inside the in-progress segment honours a new truncation point;
retention keeps the last completed segment; the roll size bounds entries; write_batch fills missing
nullable columns; an idle writer sends a record at once. (Bug 10 is in test_bookie.py, bug 11 in
tests/faults/test_regressions.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid

import pyarrow as pa
import pytest

from dlog import Namespace, Offset, TruncatedError
from dlog.segments.metadata import SegmentState
from tests.helpers import dlog_runner, eventually
from dlog_tools.cluster import LocalCluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("issue11"), bookies=3, zk_root=f"/t-{uuid.uuid4().hex[:8]}",
                           zk_server=zk_server)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def names(cluster):
    """A namespace of its own for each test, and the `dlog` command on it."""
    namespace = f"ns{uuid.uuid4().hex[:6]}"
    return namespace, dlog_runner(cluster.zk_address, cluster.zk_root, namespace)


def connect(cluster, namespace: str) -> Namespace:
    return Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root, add_timeout_s=3.0)


def values(count: int, start: int = 0, size: int = 20) -> list[bytes]:
    return [b"%06d" % index + b"." * (size - 6) for index in range(start, start + count)]


async def write_all(writer, items: list[bytes]) -> list[Offset]:
    futures = []
    for value in items:
        await writer.wait_writable()
        futures.append(writer.write_nowait(value))
    return list(await asyncio.gather(*futures))


async def read_values(ns: Namespace, stream: str) -> list[bytes]:
    async with ns.open_reader(stream, "earliest", follow=False) as reader:
        return [record.value async for record in reader]


async def test_1_truncate_and_retention_apply_beside_a_live_writer_leave_it_writing(cluster, names):
    namespace, run = names
    async with connect(cluster, namespace) as ns:
        await ns.create_stream("live", roll_records=30)
        writer = await ns.open_writer("live", flush_records=5)
        offsets = await write_all(writer, values(45))  # one roll: segment 2 is in progress
        cut = offsets[40]
        run("truncate", "live", "--before", str(cut))  # the operator's commands, from cron
        run("retention", "set", "live", "--size", "1B", "--ignore-subscribers")
        run("retention", "apply", "live")
        offsets += await write_all(writer, values(70, 45))  # more rolls after both
        await writer.close()
        assert writer.error is None
        listing = await ns.store.segments("live")
        straddled = listing.by_ledger(cut.ledger_id)
        assert straddled is not None and straddled.state is SegmentState.COMPLETED
        assert (straddled.min_active_entry, straddled.min_active_slot) == (cut.entry_id, cut.slot)  # kept
        assert await read_values(ns, "live") == values(75, 40)


async def test_1_a_writer_applying_retention_on_roll_survives_its_rolls(cluster, names):
    namespace, _ = names
    async with connect(cluster, namespace) as ns:
        await ns.create_stream("self", roll_records=20, retention_bytes=1)
        async with ns.open_writer("self", flush_records=5, retention_on_roll=True) as writer:
            for start in range(0, 100, 10):
                await write_all(writer, values(10, start))
            assert writer.error is None
        segments = (await ns.store.segments("self")).segments
        assert len(segments) >= 5 and any(s.is_truncated for s in segments)


async def test_2_a_slow_tailing_reader_follows_rolls_of_a_writer_that_then_idles(cluster, names):
    namespace, _ = names
    async with connect(cluster, namespace) as ns, connect(cluster, namespace) as reader_ns:
        await ns.create_stream("slow", roll_records=20)
        writer = await ns.open_writer("slow", flush_records=2)
        reader = await reader_ns.open_reader("slow", "earliest", read_ahead_entries=1, poll_timeout_ms=1000)
        await write_all(writer, values(100))  # five rolls; then the writer stays open and idle
        seen: list[bytes] = []

        async def consume() -> None:
            async for record in reader:
                seen.append(record.value)
                await asyncio.sleep(0.005)  # a consumer slower than the writer: the queue stays full
                if len(seen) == 100:
                    return

        await asyncio.wait_for(consume(), 60)
        assert seen == values(100)
        await reader.close()
        await writer.close()


async def test_3_writes_parked_for_room_all_end_when_a_roll_meets_a_list_change(cluster, names):
    namespace, run = names
    async with connect(cluster, namespace) as ns:
        await ns.create_stream("parked", roll_records=50)
        writer = await ns.open_writer("parked", flush_records=25, buffer_bytes_max=2000)
        offsets = await write_all(writer, values(40, size=100))
        run("truncate", "parked", "--before", str(offsets[10]))  # the list changes under the writer
        calls = [asyncio.ensure_future(writer.write(value)) for value in values(60, 40, size=100)]
        done, pending = await asyncio.wait(calls, timeout=30)
        assert not pending, f"{len(pending)} write() calls still wait for room"
        assert all(call.exception() is None for call in done)
        await writer.close()


async def test_4_records_buffered_behind_a_failure_fail_with_it(cluster, names):
    namespace, _ = names
    async with connect(cluster, namespace) as ns, connect(cluster, namespace) as other:
        await ns.create_stream("behind", roll_records=10)
        first = await ns.open_writer("behind", flush_records=5, linger_ms=60_000)
        acked = [first.write_nowait(value) for value in values(8)]
        await first.flush()  # the last 3 of the 8 would otherwise wait out the 60 s linger
        await asyncio.gather(*acked)
        second = await other.open_writer("behind", takeover=True, lock_timeout_s=0.2)  # fences the first
        buffered = [first.write_nowait(value) for value in values(30, 8)]  # a roll falls due among them
        results = await asyncio.wait_for(asyncio.gather(*buffered, return_exceptions=True), 30)
        assert all(isinstance(result, Exception) for result in results)  # none left pending
        await first.close()
        await second.close()


async def test_5_a_reader_in_the_in_progress_segment_honours_a_new_truncation_point(cluster, names):
    namespace, run = names
    async with connect(cluster, namespace) as ns, connect(cluster, namespace) as reader_ns:
        await ns.create_stream("inside")
        writer = await ns.open_writer("inside", flush_records=1)
        offsets = [await writer.write(value) for value in values(60)]
        for skip, first, cut_at in ((False, 0, 30), (True, 30, 45)):
            reader = await reader_ns.open_reader("inside", "earliest", read_ahead_entries=1, skip_truncated=skip)
            assert [(await reader.__anext__()).value for _ in range(10)] == values(10, first)
            cut = offsets[cut_at]
            run("truncate", "inside", "--before", str(cut))
            version = (await ns.store.segments("inside")).version
            await eventually(lambda: reader.machine.listing.version >= version, timeout_s=10)  # it knows
            after: list[Offset] = []  # what the reader hands out once it knows of the truncation
            with pytest.raises(TruncatedError) if not skip else contextlib.nullcontext():
                while not after or after[-1] != cut:
                    after.append((await asyncio.wait_for(reader.__anext__(), 10)).offset)
            assert after == ([cut] if skip else []), after  # nothing below the cut, whatever was read ahead
            await reader.close()
        await writer.close()


async def test_6_retention_keeps_the_last_completed_segment_while_one_is_in_progress(cluster, names):
    namespace, _ = names
    async with connect(cluster, namespace) as ns:
        await ns.create_stream("last", roll_records=10)
        writer = await ns.open_writer("last", flush_records=5)
        await write_all(writer, values(35))  # three completed segments, the fourth in progress
        await ns.set_retention("last", size_bytes=1, keep_unconsumed=False)
        removed = await ns.apply_retention("last")
        listing = await ns.store.segments("last")
        completed = [s for s in listing.segments if s.state is SegmentState.COMPLETED]
        assert len(removed) == 2 and len(completed) == 1 and listing.in_progress is not None
        assert completed[0].sequence > max(s.sequence for s in removed)  # the last completed one stays
        await writer.close()


async def test_7_the_roll_size_bounds_every_entry_of_a_dlog_write(cluster, names):
    namespace, run = names
    run("stream", "create", "small", "--roll-size", "16KiB")
    lines = "".join(f"{index:08d} " + "x" * 28 + "\n" for index in range(8000))  # ~300 KB
    run("write", "small", stdin=lines)
    info = json.loads(run("stream", "info", "small", "--json").stdout)
    assert len(info["segments"]) >= 3 and info["records"] == 8000, [(s["records"], s["bytes"], s["last_entry"]) for s in info["segments"]]
    async with connect(cluster, namespace) as ns:
        config = await ns.config("small")
        for segment in (await ns.store.segments("small")).segments:
            handle = await ns.client.open_ledger(segment.ledger_id, password=ns.password_of(config), recovery=False)
            entries = await handle.read(0, segment.last_entry)
            assert max(len(entry.payload) for entry in entries) <= 16 * 1024


async def test_8_write_batch_fills_missing_nullable_columns_and_the_timestamp(cluster, names):
    namespace, _ = names
    async with connect(cluster, namespace) as ns:
        await ns.create_stream("sparse")
        before_ms = ns.clock.wall_ms()
        async with ns.open_writer("sparse") as writer:
            written = await writer.write_batch(pa.RecordBatch.from_pydict({"value": pa.array([b"a", b"b"])}))
            later = pa.RecordBatch.from_pydict({"value": pa.array([b"c"]), "key": pa.array([b"k"])})
            await writer.write_batch(later)
        assert len(written) == 2
        async with ns.open_reader("sparse", follow=False) as reader:
            records = [record async for record in reader]
        assert [(r.value, r.key) for r in records] == [(b"a", None), (b"b", None), (b"c", b"k")]
        assert all(before_ms - 1000 <= r.timestamp_ms <= ns.clock.wall_ms() + 1000 for r in records)


async def test_9_an_idle_writer_sends_a_record_at_once_and_batches_while_busy(cluster, names):
    """At once: at the end of the event-loop turn it was written in (the process's flush round,
    issue 26), with no timer."""
    namespace, _ = names
    async with connect(cluster, namespace) as ns:
        await ns.create_stream("eager")
        async with ns.open_writer("eager") as writer:
            first = writer.write_nowait(b"alone")
            assert writer.ledger.machine.pending_count == 0  # the turn is not over: records may join it
            await asyncio.sleep(0)  # the turn ends: its flush round appends the entry
            assert writer.ledger.machine.pending_count == 1
            rest = [writer.write_nowait(value) for value in values(200)]  # they batch behind it
            assert writer.ledger.machine.pending_count == 1
            offsets = await asyncio.gather(first, *rest)
        entries = {(offset.ledger_id, offset.entry_id) for offset in offsets}
        assert len(entries) < 20  # 201 records in a few entries
