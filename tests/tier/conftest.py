"""Fixtures of the tiered-storage tests: one 3-bookie cluster per file on the session's ZooKeeper."""

from __future__ import annotations

import uuid

import aiohttp
import pytest

from dlog import Namespace
from tests.helpers import eventually
from dlog_tools.cluster import LocalCluster
from tests.harness.s3 import MotoS3


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    # --gc-grace 0: a bookie's garbage collection drops a deleted ledger at once (of what its
    # checkpoints flushed: frequent here, so a collected ledger is really gone)
    cluster = LocalCluster(tmp_path_factory.mktemp("tier"), bookies=3, zk_root=f"/t-{uuid.uuid4().hex[:8]}",
                           zk_server=zk_server, bookie_args=["--gc-grace", "0", "--checkpoint-interval", "0.2"])
    cluster.start()
    yield cluster
    cluster.stop()


async def collect_garbage(cluster: LocalCluster) -> set[int]:
    """Run every bookie's garbage collection now, once its checkpoint flushed what it holds; the
    ledgers they dropped."""
    collected: set[int] = set()
    async with aiohttp.ClientSession() as session:
        for bookie in cluster.bookies:
            async def flushed(bookie=bookie) -> bool:
                async with session.get(f"{bookie.http}/api/v1/bookie/info") as response:
                    return (await response.json())["unflushed_bytes"] == 0

            assert await eventually(flushed, timeout_s=30)
            async with session.post(f"{bookie.http}/api/v1/gc") as response:
                collected.update((await response.json())["deleted_ledgers"])
    return collected


async def stored_ledgers(cluster: LocalCluster) -> set[int]:
    """The ledgers the bookies store."""
    stored: set[int] = set()
    async with aiohttp.ClientSession() as session:
        for bookie in cluster.bookies:
            async with session.get(f"{bookie.http}/api/v1/ledgers") as response:
                stored.update(item["ledger_id"] for item in (await response.json())["ledgers"])
    return stored


async def write_segments(ns, name: str, segments: int, per_segment: int, *, headers: bool = False) -> list[bytes]:
    """`segments` completed segments of `per_segment` records each (a writer's close seals its
    segment); the values written, in order."""
    values = []
    for number in range(segments):
        async with ns.open_writer(name) as writer:
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


def connect(cluster: LocalCluster, namespace: str | None = None, **options) -> Namespace:
    return Namespace(cluster.zk_address, namespace or f"ns{uuid.uuid4().hex[:6]}", bookkeeper_root=cluster.zk_root,
                     **options)


@pytest.fixture(scope="module")
def moto_s3(tmp_path_factory):
    """An S3 store (moto's server mode on loopback) with one bucket, for a file's tests."""
    store = MotoS3(tmp_path_factory.mktemp("moto")).start()
    yield store
    store.stop()
