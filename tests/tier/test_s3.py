"""Tiered storage on S3 for real: moto's server mode on loopback (issue 24, item 7). Offloaded
segments are objects in the bucket, read back whole after their bookie copies go; truncation,
retention and stream deletion remove the objects; the endpoint and credentials come from
TierOptions or from the tier URI's query and the environment."""

from __future__ import annotations

import asyncio

import pyarrow.dataset as ds
import pytest

from dlog.offload import Offloader
from dlog.offsets import Offset
from dlog.segments.metadata import TierPolicy
from dlog.segments.tier import stream_table_uri
from tests.harness.s3 import ACCESS_KEY, REGION, SECRET_KEY
from tests.tier.conftest import connect
from tests.tier.test_offload import read_all, write_segments

pytestmark = pytest.mark.timeout(180)


def key_of(uri: str) -> str:
    """The object key of an s3:// URI (the bucket and any query left out)."""
    return uri.split("://", 1)[1].split("?", 1)[0].split("/", 1)[1]


def test_the_table_uri_of_an_s3_tier_keeps_its_endpoint():
    uri = "s3://bucket/tier?endpoint_override=127.0.0.1:9000&scheme=http"
    assert stream_table_uri(uri, "ns", "a/b") == "s3://bucket/tier/ns/a%2Fb?endpoint_override=127.0.0.1:9000&scheme=http"
    assert stream_table_uri("file:///data/tier", "ns", "s") == "file:///data/tier/ns/s"


async def test_segments_offloaded_to_s3_read_back_whole_after_their_bookie_copies_go(cluster, moto_s3):
    async with connect(cluster, tier_options=moto_s3.options()) as ns:
        await ns.create_stream("orders", tier=TierPolicy(uri=moto_s3.uri("whole"), delete_lag_ms=0))
        values = await write_segments(ns, "orders", 3, 200, headers=True)
        report = await Offloader(ns).run("orders", now=True)
        assert [o.sequence for o in report.offloaded] == [1, 2, 3]
        listing = await ns.store.segments("orders")
        assert all(s.tier is not None and not s.tier.on_bookies for s in listing.segments)
        assert moto_s3.keys(f"whole/{ns.name}") == sorted(key_of(s.tier.uri) for s in listing.segments)
        assert sorted(report.bookie_copies_deleted) == sorted(s.ledger_id for s in listing.segments)

        async with connect(cluster, ns.name, tier_options=moto_s3.options()) as fresh:  # nothing cached
            assert await read_all(fresh, "orders") == values
            assert fresh.reads.tier_reads >= 3
        table = ds.dataset(f"{moto_s3.bucket}/whole/{ns.name}/orders", filesystem=moto_s3.filesystem(),
                           format="parquet", partitioning="hive").to_table()
        assert sorted(table.column("value").to_pylist()) == sorted(values)  # the table view of the bucket
        # every upload went as a multipart upload (pyarrow's S3 stream: POST ?uploads, PUT parts, POST)
        for segment in listing.segments:
            key = key_of(segment.tier.uri)
            assert ("POST", f"/{moto_s3.bucket}/{key}?uploads", 200) in moto_s3.requests()


async def test_truncation_retention_and_stream_deletion_remove_the_s3_objects(cluster, moto_s3):
    async with connect(cluster, tier_options=moto_s3.options()) as ns:
        await ns.create_stream("orders", tier=TierPolicy(uri=moto_s3.uri("gone"), delete_lag_ms=0))
        await write_segments(ns, "orders", 4, 50)
        await Offloader(ns).run("orders", now=True)
        segments = (await ns.store.segments("orders")).segments
        prefix = f"gone/{ns.name}/orders"
        assert len(moto_s3.keys(prefix)) == 4

        removed = await ns.truncate("orders", before=Offset(segments[1].ledger_id, segments[1].first_entry))
        assert [s.sequence for s in removed] == [1]
        assert moto_s3.keys(prefix) == sorted(key_of(s.tier.uri) for s in segments[1:])

        await ns.set_tier("orders", TierPolicy(retention_age_ms=1))
        removed = await ns.apply_retention("orders", now_ms=segments[-1].completed_ms + 10)
        assert removed and all(key_of(s.tier.uri) not in moto_s3.keys(prefix) for s in removed)
        kept = [s for s in segments[1:] if s.sequence not in {r.sequence for r in removed}]
        assert moto_s3.keys(prefix) == sorted(key_of(s.tier.uri) for s in kept)

        await ns.delete_stream("orders")
        assert moto_s3.keys(prefix) == []


async def test_an_s3_tier_named_with_its_endpoint_and_credentials_from_the_environment(
        cluster, moto_s3, monkeypatch):
    """No TierOptions: the endpoint is in the URI's query, the credentials in the environment
    (as pyarrow reads them); a leftover attempt's object goes with the stream."""
    for name, value in (("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
                        ("AWS_DEFAULT_REGION", REGION), ("AWS_EC2_METADATA_DISABLED", "true")):
        monkeypatch.setenv(name, value)
    async with connect(cluster) as ns:
        uri = moto_s3.uri("env", in_uri=True)
        await ns.create_stream("orders", tier=TierPolicy(uri=uri, delete_lag_ms=0))
        values = await write_segments(ns, "orders", 2, 100)
        await Offloader(ns).run("orders", now=True)
        assert await read_all(ns, "orders") == values
        prefix = f"env/{ns.name}/orders"
        with moto_s3.filesystem().open_output_stream(f"{moto_s3.bucket}/{prefix}/segment=9/leftover.parquet") as out:
            out.write(b"an attempt nobody names")
        assert len(moto_s3.keys(prefix)) == 3
        await ns.delete_stream("orders")
        assert await asyncio.to_thread(moto_s3.keys, prefix) == []
