"""Sealed segments become Parquet files on the tier and read back transparently (issue 24)."""

from __future__ import annotations

import asyncio

import pyarrow.dataset as ds
import pytest

from dlog.offload import Offloader
from dlog.segments.metadata import TierPolicy
from dlog.segments.tier import stream_table_uri
from tests.helpers import eventually
from tests.tier.conftest import collect_garbage, connect, read_all, stored_ledgers, write_segments

pytestmark = pytest.mark.timeout(180)


async def test_offloaded_segments_read_back_whole_after_the_bookie_copies_are_collected(cluster, tmp_path):
    async with connect(cluster) as ns:
        await ns.create_stream("orders", tier=TierPolicy(uri=f"file://{tmp_path}/tier", delete_lag_ms=0))
        values = await write_segments(ns, "orders", 4, 300, headers=True)
        report = await Offloader(ns).run("orders", now=True)
        assert [o.sequence for o in report.offloaded] == [1, 2, 3, 4]
        listing = await ns.store.segments("orders")
        ledgers = {s.ledger_id for s in listing.segments}
        assert all(s.tier is not None and not s.tier.on_bookies for s in listing.segments)
        assert sorted(report.bookie_copies_deleted) == sorted(ledgers)
        assert await collect_garbage(cluster) == ledgers  # GC ran: the bookies hold none of it
        assert not ledgers & await stored_ledgers(cluster)
        async with connect(cluster, ns.name) as fresh:  # a client that never saw the ledgers
            assert await read_all(fresh, "orders") == values
            async with fresh.open_reader("orders", "earliest", follow=False, headers=True) as reader:
                records = [record async for record in reader]
            assert [dict(r.headers or []) for r in records[:4]] == [{}, {"n": b"1"}, {}, {"n": b"3"}]
            info = await fresh.stream_info("orders")
            assert {s["stored_on"] for s in info["segments"]} == {"tier"}
            assert not any(s["damaged"] for s in info["segments"])
        # the table view: the tier's directory is the stream's records, one file per segment
        table = ds.dataset(stream_table_uri(f"file://{tmp_path}/tier", ns.name, "orders").removeprefix("file://"),
                           format="parquet", partitioning="hive").to_table().sort_by("position")
        assert table.column("value").to_pylist() == values
        assert table.column("segment").to_pylist() == [n // 300 + 1 for n in range(1200)]


async def test_an_offloaded_segment_still_on_bookies_reads_from_either_and_the_bookie_copy_stays(cluster, tmp_path):
    async with connect(cluster) as ns:
        await ns.create_stream("kept", tier=TierPolicy(uri=f"file://{tmp_path}/tier", delete_lag_ms=-1))
        values = await write_segments(ns, "kept", 2, 100)
        report = await Offloader(ns).run("kept", now=True)
        assert len(report.offloaded) == 2 and report.bookie_copies_deleted == []
        before = ns.reads.tier_reads
        assert await read_all(ns, "kept", prefer="bookies") == values
        assert ns.reads.tier_reads == before  # read from the bookies
        assert await read_all(ns, "kept", prefer="tier") == values
        assert ns.reads.tier_reads > before
        listing = await ns.store.segments("kept")
        assert all(s.tier is not None and s.tier.on_bookies for s in listing.segments)


async def test_a_reader_reading_from_bookies_reads_on_from_the_tier_when_the_bookie_copy_goes(cluster, tmp_path):
    """Pulsar #21737: deleting an offloaded ledger under a reader must not fail the reader."""
    async with connect(cluster) as ns:
        await ns.create_stream("slow", tier=TierPolicy(uri=f"file://{tmp_path}/tier", delete_lag_ms=0))
        values = []
        for number in range(2):  # a record per entry: the reader is mid-segment when the copy goes
            async with ns.open_writer("slow") as writer:
                for index in range(150):  # more entries than one read fetches (64)
                    values.append(f"s{number}-r{index}".encode())
                    await writer.write(values[-1])
        await Offloader(ns).run("slow", now=True, delete_copies=False)
        before = ns.reads.tier_reads
        found = []
        async with ns.open_reader("slow", "earliest", follow=False, read_ahead_entries=1,
                                  prefer="bookies") as reader:
            iterator = reader.__aiter__()
            for _ in range(10):
                found.append((await iterator.__anext__()).value)
            deleted = await Offloader(ns).run("slow", now=True)  # the lag (0) has passed: copies go
            assert deleted.bookie_copies_deleted
            await collect_garbage(cluster)
            async for record in iterator:
                found.append(record.value)
        assert found == values
        assert ns.reads.tier_reads > before  # the rest came from the tier file


async def test_offload_is_one_at_a_time_per_stream(cluster, tmp_path):
    async with connect(cluster) as ns, connect(cluster, ns.name) as other:
        await ns.create_stream("busy", tier=TierPolicy(uri=f"file://{tmp_path}/tier"))
        await write_segments(ns, "busy", 1, 10)
        assert await ns.store.claim_offloader("busy", "someone-else") is None
        report = await Offloader(other).run("busy", now=True)
        assert report.offloaded == [] and "someone-else" in report.skipped[0]
        await ns.store.release_offloader("busy", "someone-else")
        report = await Offloader(other).run("busy", now=True)
        assert [o.sequence for o in report.offloaded] == [1]
        await asyncio.sleep(0)
        assert await eventually(lambda: ns.store.tier_status("busy"))
