"""Per-record writes without a future per record (`offer` + `flush`) keep every record, in order;
a bad record is refused at the call and the writer goes on."""

from __future__ import annotations

import pytest

from bookkeeper.errors import ConfigError
from tests.helpers import local_clusters
from tests.integration.test_streams import namespace, read_all, values


@pytest.fixture(scope="module")
def stream_cluster(zk_server, tmp_path_factory):  # type: ignore[no-untyped-def]
    """One 3-bookie cluster for the file's tests, which write streams of names of their own."""
    with local_clusters(zk_server, tmp_path_factory.mktemp("offer"), "t", default_bookies=3) as make:
        yield make()


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
            assert writer.in_flight_entries == 0  # everything answered
        records = await read_all(ns, "offered")
        assert [record.value for record in records] == [*values(1000), b"last"]
        assert [record.key for record in records[:3]] == [value[:6] for value in values(3)]


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
