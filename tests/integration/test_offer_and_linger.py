"""Per-record writes without a future per record (`offer` + `flush`) and many writers lingering
together (one timer and one Arrow build per round) keep every record, in order, per stream; one
writer's bad record fails that writer only."""

from __future__ import annotations

import asyncio

import pytest

from bookkeeper.errors import ConfigError
from dlog.linger import flusher_of
from tests.integration.test_streams import namespace, read_all, values


@pytest.fixture
def stream_cluster(cluster_factory):  # type: ignore[no-untyped-def]
    return cluster_factory(bookies=3)


async def test_offered_records_are_durable_once_flush_returns(stream_cluster):
    async with namespace(stream_cluster) as ns:
        await ns.create_stream("offered")
        async with ns.open_writer("offered", flush_records=300) as writer:
            for value in values(1000):
                if not writer.writable:
                    await writer.wait_writable()
                writer.offer(value, key=value[:6])
            writer.write_nowait(b"last")  # offers and futures mix in one buffer
            await writer.flush()
            assert not writer._in_flight  # noqa: SLF001  (everything answered)
        records = await read_all(ns, "offered")
        assert [record.value for record in records] == [*values(1000), b"last"]
        assert [record.key for record in records[:3]] == [value[:6] for value in values(3)]


async def test_writers_lingering_together_share_rounds_and_keep_their_records(stream_cluster):
    async with namespace(stream_cluster) as ns:
        names = [f"many-{index}" for index in range(12)]
        for name in names:
            await ns.create_stream(name)
        writers = [await ns.open_writer(name, linger_ms=5) for name in names]
        flusher = flusher_of(asyncio.get_running_loop())
        rounds_before = flusher.rounds_fired
        futures = []
        for turn in range(3):
            for writer in writers:  # one loop turn: every writer lingers into the same round
                futures += [writer.write_nowait(value) for value in values(5, turn * 5)]
            await asyncio.gather(*futures)
        assert flusher.rounds_fired - rounds_before <= 6  # rounds shared, not one per writer
        offsets = [future.result() for future in futures]
        assert len({(offset.ledger_id, offset.entry_id) for offset in offsets}) == 3 * len(writers)
        for writer in writers:
            await writer.close()
        for name in names:
            assert [record.value for record in await read_all(ns, name)] == values(15)


async def test_a_bad_record_is_refused_at_the_call_and_the_writer_goes_on(stream_cluster):
    async with namespace(stream_cluster) as ns:
        await ns.create_stream("checked")
        async with ns.open_writer("checked") as writer:
            writer.offer(b"fine", key=bytearray(b"k"))
            for bad in ({"key": 12345}, {"timestamp_ms": "soon"}, {"timestamp_ms": 1.5}):
                with pytest.raises(ConfigError, match="key must be bytes|integer of milliseconds"):
                    writer.offer(b"broken", **bad)
                with pytest.raises(ConfigError):
                    writer.write_nowait(b"broken", **bad)
            with pytest.raises(ConfigError, match="value must be bytes"):
                writer.offer("text")  # type: ignore[arg-type]
            writer.offer(b"also fine")
            await writer.flush()
        records = await read_all(ns, "checked")
        assert [(record.key, record.value) for record in records] == [(b"k", b"fine"), (None, b"also fine")]
