"""Fixtures of the fault tests: clusters of real bookie processes (on the session's ZooKeeper, or on
a ZooKeeper of their own when the test pauses or restarts it) and the history file of the test."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tools.cluster import LocalCluster
from tools.history import History


@pytest.fixture
def history(tmp_path: Path) -> Iterator[History]:
    recorded = History(tmp_path / "history.jsonl")
    yield recorded
    recorded.close()


@pytest.fixture
def local_cluster(zk_server, tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Start a LocalCluster of bookie processes under a unique root of the session's ZooKeeper;
    with own_zk=True it runs its own ZooKeeper (for tests that pause or restart it)."""
    clusters: list[LocalCluster] = []

    def make(bookies: int = 3, bookie_args: list[str] | None = None, own_zk: bool = False,
             start: bool = True) -> LocalCluster:
        root = f"/f-{uuid.uuid4().hex[:8]}"
        cluster = LocalCluster(tmp_path / f"cluster-{len(clusters)}", bookies=bookies, zk_root=root,
                               bookie_args=bookie_args, zk_server=None if own_zk else zk_server)
        clusters.append(cluster)
        if start:
            cluster.start()
        return cluster

    yield make
    for cluster in clusters:
        if cluster.zk.running and cluster.zk.paused:
            cluster.zk.resume()
        for bookie in cluster.bookies:  # a SIGSTOPped bookie would ignore the SIGTERM of stop()
            if bookie.running:
                cluster.kill_bookie(bookie.index, signal.SIGCONT)
        cluster.stop()
