"""The tier's files registered in an Iceberg table (issue 24, item 4), kept in step with offloads
and retention: the table's rows are the log's offloaded records, no file rewritten."""

from __future__ import annotations

import json

import pytest
from pyiceberg.catalog.sql import SqlCatalog

from dlog.iceberg import CATALOG_NAME
from dlog.offload import Offloader
from dlog.segments.metadata import TierPolicy
from tests.tier.conftest import connect, read_all, write_segments

pytestmark = pytest.mark.timeout(180)


def table_values(ns, config) -> list[bytes]:
    catalog = SqlCatalog(CATALOG_NAME, uri=config.iceberg_catalog, warehouse=config.iceberg_warehouse)
    table = catalog.load_table((ns.name, "events")).scan().to_arrow().sort_by("position")
    return table.column("value").to_pylist()


async def test_the_iceberg_table_follows_offloads_and_retention(cluster, tmp_path):
    tier = f"file://{tmp_path}/tier"
    async with connect(cluster) as ns:
        await ns.create_stream("events", tier=TierPolicy(uri=tier, delete_lag_ms=-1, retention_age_ms=1000))
        values = await write_segments(ns, "events", 2, 30)
        await Offloader(ns).run("events", now=True)
        files_before = sorted(s.tier.uri for s in (await ns.store.segments("events")).segments)
        result = await ns.register_iceberg("events")
        assert (result.added, result.removed) == (2, 0)
        config = await ns.config("events")
        assert config.iceberg_catalog.startswith("sqlite:///") and table_values(ns, config) == values
        values += await write_segments(ns, "events", 2, 30)  # two more segments, offloaded: the table follows
        await Offloader(ns).run("events", now=True)
        assert table_values(ns, config) == values == await read_all(ns, "events")
        listing = await ns.store.segments("events")
        assert sorted(s.tier.uri for s in listing.segments)[:2] == files_before  # registered, never rewritten
        removed = await ns.apply_retention("events", now_ms=listing.segments[-1].last_timestamp_ms + 60_000)
        assert [s.sequence for s in removed] == [1, 2, 3]  # the tier's retention; the last segment stays
        assert table_values(ns, config) == values[90:] == await read_all(ns, "events")


def test_dlog_tier_iceberg_registers_the_tier_files(cluster, tmp_path):
    from tests.helpers import dlog_runner

    namespace = "icecli"
    run = dlog_runner(cluster.zk_address, cluster.zk_root, namespace)
    run("stream", "create", "events", "--tier", f"file://{tmp_path}/tier")
    run("write", "events", stdin="".join(f"event {n}\n" for n in range(20)))
    run("offload", "events")
    found = json.loads(run("tier", "iceberg", "events", "--json").stdout)
    assert (found["added"], found["removed"]) == (1, 0) and found["catalog"].startswith("sqlite:///")
    catalog = SqlCatalog(CATALOG_NAME, uri=found["catalog"], warehouse=found["warehouse"])
    table = catalog.load_table((namespace, "events")).scan().to_arrow()
    assert sorted(table.column("value").to_pylist()) == sorted(f"event {n}".encode() for n in range(20))
    refused = run("tier", "iceberg", "nope", ok=False)
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1
