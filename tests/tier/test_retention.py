"""Retention, truncation and deletion of a tiered stream (issue 24, item 5): offloaded files go with
their segments, idempotently; bookie retention and tier retention are separate settings."""

from __future__ import annotations

import os

import pytest

from dlog.offload import Offloader
from dlog.segments.metadata import TierPolicy
from dlog.segments.tier import stream_table_uri
from tests.tier.conftest import connect, read_all, write_segments

pytestmark = pytest.mark.timeout(180)


def files_under(tier: str, namespace: str, stream: str) -> list[str]:
    root = stream_table_uri(f"file://{tier}", namespace, stream).removeprefix("file://")
    return sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names)


async def test_truncation_removes_the_files_of_the_segments_it_removes(cluster, tmp_path):
    tier = str(tmp_path / "tier")
    async with connect(cluster) as ns:
        await ns.create_stream("cut", tier=TierPolicy(uri=f"file://{tier}", delete_lag_ms=0))
        values = await write_segments(ns, "cut", 3, 50)
        await Offloader(ns).run("cut", now=True)
        assert len(files_under(tier, ns.name, "cut")) == 3
        listing = await ns.store.segments("cut")
        third = listing.segments[2]
        async with ns.open_reader("cut", "earliest", follow=False) as reader:
            offsets = [record.offset async for record in reader]
        point = offsets[110]  # the third segment's 11th record, read from its tier file
        assert point.ledger_id == third.ledger_id and point.slot > 0
        await ns.truncate("cut", point)
        remaining = files_under(tier, ns.name, "cut")
        assert remaining == [third.tier.uri.removeprefix("file://")]
        assert await read_all(ns, "cut") == values[110:]  # the truncation point holds on the tier too
        await ns.truncate("cut", point)  # again: nothing more, no error
        assert files_under(tier, ns.name, "cut") == remaining


async def test_bookie_retention_drops_bookie_copies_and_tier_retention_drops_segments(cluster, tmp_path):
    tier = str(tmp_path / "tier")
    async with connect(cluster) as ns:
        # bookie retention 1 s; the tier keeps records for an hour; copies stay on bookies otherwise
        await ns.create_stream("split", retention_age_ms=1000,
                               tier=TierPolicy(uri=f"file://{tier}", delete_lag_ms=-1, retention_age_ms=3_600_000))
        values = await write_segments(ns, "split", 4, 20)
        listing = await ns.store.segments("split")
        later_ms = listing.segments[-1].last_timestamp_ms + 60_000
        # nothing offloaded yet: bookie retention waits for the offload rather than lose records
        assert await ns.apply_retention("split", now_ms=later_ms) == []
        offloader = Offloader(ns)
        await offloader.run("split", now=True, now_ms=later_ms)  # offloads, then bookie retention applies
        listing = await ns.store.segments("split")
        on_bookies = [s.sequence for s in listing.segments if s.on_bookies]
        assert on_bookies == [4]  # the last completed segment stays on bookies (as retention keeps it)
        assert all(s.tier is not None for s in listing.segments)
        assert await read_all(ns, "split") == values
        # an hour later the tier's retention removes whole segments, files and all
        removed = await ns.apply_retention("split", now_ms=later_ms + 3_600_000)
        assert [s.sequence for s in removed] == [1, 2, 3]
        assert files_under(tier, ns.name, "split") == [listing.segments[3].tier.uri.removeprefix("file://")]
        assert await read_all(ns, "split") == values[60:]


async def test_deleting_a_stream_removes_its_files_and_a_leftover_attempt(cluster, tmp_path):
    tier = str(tmp_path / "tier")
    async with connect(cluster) as ns:
        await ns.create_stream("gone", tier=TierPolicy(uri=f"file://{tier}"))
        await write_segments(ns, "gone", 2, 10)
        await Offloader(ns).run("gone", now=True)
        leftover = os.path.join(os.path.dirname(files_under(tier, ns.name, "gone")[0]), "leftover.parquet")
        with open(leftover, "wb") as file:
            file.write(b"an attempt that never committed")
        assert len(files_under(tier, ns.name, "gone")) == 3
        await ns.delete_stream("gone")
        assert files_under(tier, ns.name, "gone") == []
