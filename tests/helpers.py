"""Small helpers shared by tests: wait for conditions by polling with a deadline, never by sleeping."""

from __future__ import annotations

import asyncio
import inspect
import signal
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Awaitable, Callable, Iterator, TypeVar

from bookkeeper.meta.zkserver import EmbeddedZooKeeper
from tools.cluster import LocalCluster

T = TypeVar("T")

POLL_INTERVAL_S = 0.02


async def eventually(predicate: Callable[[], T | Awaitable[T]], timeout_s: float = 10.0,
                     interval_s: float = POLL_INTERVAL_S, message: str = "") -> T:
    """Poll ``predicate`` (plain or async) until it returns something truthy; return that.

    Fails the test with AssertionError if ``timeout_s`` passes first. Exceptions from the
    predicate propagate: a condition that errors is a failure, not "not yet".
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__qualname__", repr(predicate))
            raise AssertionError(f"condition not met within {timeout_s}s: {what} (last value {result!r})")
        await asyncio.sleep(interval_s)


def eventually_blocking(predicate: Callable[[], T], timeout_s: float = 60.0, interval_s: float = 0.2,
                        message: str = "") -> T:
    """`eventually` for blocking code (the Spark tests): poll, sleeping between tries, until truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__qualname__", repr(predicate))
            raise AssertionError(f"condition not met within {timeout_s}s: {what} (last value {result!r})")
        time.sleep(interval_s)


@contextmanager
def local_clusters(zk_server: EmbeddedZooKeeper, directory: Path, root_prefix: str,
                   default_bookies: int) -> Iterator[Callable[..., LocalCluster]]:
    """A factory of LocalClusters (bookie processes) under unique roots of the session's ZooKeeper,
    or, with own_zk=True, on a ZooKeeper of their own (for tests that pause or restart it); all of
    them are stopped afterwards, even when a test left ZooKeeper or a bookie SIGSTOPped."""
    clusters: list[LocalCluster] = []

    def make(bookies: int = default_bookies, bookie_args: list[str] | None = None, start: bool = True,
             own_zk: bool = False) -> LocalCluster:
        root = f"/{root_prefix}-{uuid.uuid4().hex[:8]}"
        cluster = LocalCluster(directory / f"cluster-{len(clusters)}", bookies=bookies, zk_root=root,
                               bookie_args=bookie_args, zk_server=None if own_zk else zk_server)
        clusters.append(cluster)
        if start:
            cluster.start()
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            if cluster.zk.running and cluster.zk.paused:
                cluster.zk.resume()
            for bookie in cluster.bookies:  # a SIGSTOPped bookie would ignore the SIGTERM of stop()
                if bookie.running:
                    cluster.kill_bookie(bookie.index, signal.SIGCONT)
            cluster.stop()
