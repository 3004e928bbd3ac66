"""Bugs the fault scenarios found, each pinned by the smallest test that shows it on real processes.
A test here is `xfail(strict=True)` until its bug is fixed; then it passes, xfail fails the suite,
and whoever fixed it removes the mark."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import aiohttp
import pytest

from bookkeeper.bookie.config import BookieConfig
from bookkeeper.bookie.service import BookieService
from bookkeeper.client import BookKeeper
from bookkeeper.errors import DlogError
from bookkeeper.meta.zkensemble import ZooKeeperEnsemble
from bookkeeper.protocol.wire import ReadRequest
from dlog import Namespace, TruncatedError, WriterFencedError
from tests.harness.faults.faults import entry_log_records, flip_entry_log_bytes
from tests.helpers import eventually
from dlog_tools.cluster import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]


def namespace(cluster) -> Namespace:
    return Namespace(cluster.zk_address, "regress", bookkeeper_root=cluster.zk_root,
                     root=f"{cluster.zk_root}-dlog", add_timeout_s=2.0)


async def test_records_buffered_when_the_writer_fails_are_resolved(local_cluster):
    cluster = local_cluster(bookies=3)
    async with namespace(cluster) as ns, namespace(cluster) as other:
        await ns.create_stream("buffered")
        first = await ns.open_writer("buffered", flush_bytes=1000, linger_ms=60_000)
        # a record first, so the takeover seals the segment rather than dropping it and deleting its
        # ledger, which the first writer's metadata watch would report before anything is sent
        first.write_nowait(b"before the takeover")
        await first.flush()  # now, not after the linger
        second = await other.open_writer("buffered", takeover=True, lock_timeout_s=0.2)  # fences first
        sent = first.write_nowait(b"x" * 2000)  # over flush_bytes: sent at once, will be fenced
        buffered = first.write_nowait(b"y")  # waits in the buffer for the linger
        with pytest.raises(WriterFencedError):
            await sent
        await first.close()
        await second.close()
        # the buffered record was never sent; its caller must get an error, not wait forever
        with pytest.raises(WriterFencedError):
            await asyncio.wait_for(buffered, 5)


async def test_wait_stopped_returns_only_once_the_bookie_has_stopped(tmp_path):
    """`serve()` returns (and `asyncio.run` cancels every task left) as soon as `wait_stopped()`
    does, so that must mean the stop is over. Whether a SIGTERMed bookie then finishes its stop
    is a race (a cancel landing in `asyncio.wait_for` may be swallowed), so this is checked on
    the service itself, where it is deterministic."""
    service = BookieService(BookieConfig(data_dir=tmp_path / "bookie", port=0, http_port=None))
    await service.start()
    stopping = asyncio.get_running_loop().create_task(service.stop())
    await asyncio.wait_for(service.wait_stopped(), 30)
    finished = stopping.done()
    await stopping
    assert finished, "wait_stopped() returned while stop() was still running"


async def test_closing_a_deleted_ledger_fails_instead_of_hanging(local_cluster):
    cluster = local_cluster(bookies=3)
    async with BookKeeper(zk=cluster.zk_address, root=cluster.zk_root) as client:
        handle = await client.create_ledger(3, 2, 2, password=b"pw")
        await handle.append(b"x")
        await client.delete_ledger(handle.ledger_id)
        with pytest.raises(DlogError):
            await asyncio.wait_for(handle.close(), 10)


async def test_a_segment_whose_ledger_was_deleted_can_be_skipped(local_cluster):
    cluster = local_cluster(bookies=3)
    async with namespace(cluster) as ns, namespace(cluster) as other:
        await ns.create_stream("hole", roll_records=10)
        async with await ns.open_writer("hole", flush_records=5) as writer:
            for start in range(0, 30, 10):  # one batch, one entry, one segment each
                await writer.write_batch([b"v%02d" % index for index in range(start, start + 10)])
        segments = (await ns.store.segments("hole")).segments
        assert len(segments) == 3
        await ns.client.delete_ledger(segments[1].ledger_id)
        async with await other.open_reader("hole", "earliest", follow=False) as reader:
            with pytest.raises(TruncatedError, match=f"ledger {segments[1].ledger_id} .* was deleted"):
                [record async for record in reader]
        async with await other.open_reader("hole", "earliest", follow=False, skip_truncated=True) as reader:
            values = [record.value async for record in reader]
        assert values == [b"v%02d" % i for i in range(10)] + [b"v%02d" % i for i in range(20, 30)]


async def test_a_damaged_entry_does_not_break_reads_of_other_entries(local_cluster):
    cluster = local_cluster(bookies=3, bookie_args=["--checkpoint-interval", "0.2"])
    bookie = cluster.bookies[0]
    logs = bookie.data_dir / "ledgers" / "entrylogs"
    async with BookKeeper(zk=cluster.zk_address, root=cluster.zk_root) as writer:
        handle = await writer.create_ledger(3, 3, 3, password=b"pw")
        for index in range(20):
            await handle.append(b"entry %d" % index)
        await handle.close()

        def checkpointed(ledger_id: int, entry_id: int) -> Callable[[], bool]:  # in an entry log
            return lambda: any(record[2:] == (ledger_id, entry_id) for path in logs.glob("*.log")
                               for record in entry_log_records(path))

        await eventually(checkpointed(handle.ledger_id, 19), timeout_s=20)
        # a later checkpoint must finish too: the one that wrote entry 19 may not have moved the
        # journal's mark yet, and a replay from an older mark would restore the undamaged entry
        marker = await writer.create_ledger(3, 3, 3, password=b"pw")
        await marker.append(b"marker")
        await eventually(checkpointed(marker.ledger_id, 0), timeout_s=20)
    cluster.kill_bookie(0)
    assert flip_entry_log_bytes(bookie.data_dir, random.Random(1), entries={(handle.ledger_id, 19)}) == 1
    cluster.start_bookie(0)
    async with BookKeeper(zk=cluster.zk_address, root=cluster.zk_root) as client:
        pool = client.pool
        # entry 0 is intact on this bookie: reading it must work although entry 19 is damaged
        answer = await pool.send(bookie.address, ReadRequest(pool.next_request_id(), handle.ledger_id, 0))
        assert answer.packed_entry
        with pytest.raises(DlogError):  # the damaged entry is refused, on the same connection ...
            await pool.send(bookie.address, ReadRequest(pool.next_request_id(), handle.ledger_id, 19))
        again = await pool.send(bookie.address, ReadRequest(pool.next_request_id(), handle.ledger_id, 1))
        assert again.packed_entry  # ... which still serves the others
    assert "Fatal error on transport" not in (bookie.data_dir / "bookie.log").read_text()


async def test_clients_see_a_bookie_turn_read_only_and_back(local_cluster):
    cluster = local_cluster(bookies=3)
    async with BookKeeper(zk=cluster.zk_address, root=cluster.zk_root) as client:
        bookie = cluster.bookies[0]
        assert bookie.address in client.writable_bookies()
        async with aiohttp.ClientSession() as session:
            async with session.put(f"{bookie.http}/api/v1/bookie/state", json={"read_only": True}) as answer:
                assert (await answer.json())["state"] == "read_only"
        await eventually(lambda: bookie.address not in client.writable_bookies(), timeout_s=10,
                         message="the client still places ledgers on a read-only bookie")


async def test_closing_a_reader_stops_it_even_when_its_wait_just_ended(local_cluster):
    cluster = local_cluster(bookies=3)
    async with namespace(cluster) as ns:
        await ns.create_stream("idle")
        reader = await ns.open_reader("idle", "earliest", follow=True, poll_timeout_ms=1000)
        # nothing to read: the reader waits for the segment list to change, with nothing in flight
        await eventually(lambda: reader.machine.step is None and reader.tasks_running == 0, timeout_s=10)
        # the segment list changes (its watch fires) in the same moment the reader is closed
        async with asyncio.timeout(10):
            reader.run(reader.machine.on_segments_changed(reader.now_ms()))
            await reader.close()
        assert reader.tasks_running == 0


async def test_a_reader_namespace_follows_ensemble_changes_of_a_segment_it_read_before(local_cluster):
    cluster = local_cluster(bookies=5)
    async with namespace(cluster) as writer_ns, namespace(cluster) as reader_ns:
        await writer_ns.create_stream("moving")
        writer = await writer_ns.open_writer("moving", flush_records=1)

        async def write(first: int, count: int) -> None:
            for index in range(first, first + count):
                writer.write_nowait(b"v%03d" % index)
            await writer.flush()

        async def read_all(ns: Namespace = reader_ns) -> list[bytes]:
            async with asyncio.timeout(20):
                async with await ns.open_reader("moving", "earliest", follow=False) as reader:
                    return [record.value async for record in reader]

        await write(0, 30)
        assert len(await read_all()) == 30  # reader_ns now caches the ledger's read handle
        killed = None
        for position in (1, 2):  # two ensemble changes: some entries share no bookie with the old set
            ensemble = writer.ledger.metadata.last_ensemble[1]
            if killed is not None:  # back with its data: every entry keeps a live replica
                cluster.start_bookie(killed)
            killed = next(b.index for b in cluster.bookies if b.address == ensemble[position])
            cluster.kill_bookie(killed)
            await write(30 * position, 30)
        assert len(writer.ledger.metadata.ensembles) == 3
        expected = [b"v%03d" % i for i in range(90)]
        async with namespace(cluster) as fresh:
            assert await read_all(fresh) == expected  # the records are all there ...
        assert await read_all() == expected  # ... and the namespace that read before sees them too
        await writer.close()


@pytest.mark.timeout(240)
async def test_a_writer_survives_the_zookeeper_leader_killed_while_it_rolls(tmp_path):
    """Issue 11 item 11: on a three-server ensemble, kill -9 of the leader made a rolling writer
    fail with a (retryable) ConnectionLoss about half the time. Three leader kills while the writer
    rolls every few records: it must go on, and every acknowledged record must be there."""
    ensemble = ZooKeeperEnsemble(tmp_path / "zk")
    await asyncio.to_thread(ensemble.start)
    cluster = LocalCluster(tmp_path / "cluster", bookies=3, zk_root="/ensemble", zk_server=ensemble)  # type: ignore[arg-type]
    try:
        await asyncio.to_thread(cluster.start)
        async with namespace(cluster) as ns:
            await ns.create_stream("rolling", roll_records=10)
            writer = await ns.open_writer("rolling", flush_records=2)
            acked: list[bytes] = []

            async def write_until(count: int) -> None:
                while len(acked) < count:
                    value = b"v%06d" % len(acked)
                    await writer.write(value)  # one at a time: a roll every five entries
                    acked.append(value)

            await write_until(30)
            for _ in range(3):
                leader = await asyncio.to_thread(ensemble.leader)
                await asyncio.to_thread(ensemble.kill, leader)
                await asyncio.wait_for(write_until(len(acked) + 40), 60)  # rolls through the election
                await asyncio.to_thread(ensemble.start_member, leader)
            await writer.close()
            assert writer.error is None
            async with ns.open_reader("rolling", follow=False) as reader:
                assert [record.value async for record in reader] == acked
    finally:
        await asyncio.to_thread(cluster.stop)
        await asyncio.to_thread(ensemble.stop)
