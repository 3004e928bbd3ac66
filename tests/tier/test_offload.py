"""Sealed segments become Parquet files on the tier and read back transparently (issue 24)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from dlog.offload import Offloader
from dlog.segments.metadata import TierPolicy
from tests.tier.conftest import connect

pytestmark = pytest.mark.timeout(180)


async def write_segments(ns, name: str, segments: int, per_segment: int, *, headers: bool = False) -> list[bytes]:
    values = []
    for number in range(segments):
        async with ns.open_writer(name) as writer:  # each writer's close seals its segment
            for index in range(per_segment):
                value = f"s{number}-r{index}".encode()
                values.append(value)
                record_headers = [("n", str(index).encode())] if headers and index % 2 else None
                writer.write_nowait(value, key=f"k{index % 7}".encode(), headers=record_headers)
            await writer.flush()
    return values


async def read_all(ns, name: str, **options) -> list[bytes]:
    found = []
    async with ns.open_reader(name, "earliest", follow=False, **options) as reader:
        async for record in reader:
            found.append(record.value)
    return found


async def test_offloaded_segments_read_back_whole_from_the_tier_after_the_bookie_copies_go(cluster, tmp_path):
    async with connect(cluster) as ns:
        await ns.create_stream("orders", tier=TierPolicy(uri=f"file://{tmp_path}/tier", delete_lag_ms=0))
        values = await write_segments(ns, "orders", 4, 300)
        report = await Offloader(ns).run("orders", now=True)
        assert [o.sequence for o in report.offloaded] == [1, 2, 3, 4]
        listing = await ns.store.segments("orders")
        assert all(s.tier is not None and not s.tier.on_bookies for s in listing.segments)
        for segment in listing.segments:  # the bookie copies are gone: their ledgers deleted
            with pytest.raises(Exception):
                await ns.client.open_ledger(segment.ledger_id, password=ns.password_of(await ns.config("orders")))
        assert await read_all(ns, "orders") == values
        table = pq.read_table(f"{tmp_path}/tier/{ns.name}/orders")
        assert table.column("value").to_pylist() == values or sorted(table.column("value").to_pylist()) == sorted(values)
