"""Fixtures for tests that run real bookie processes against the session's real ZooKeeper."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tools.cluster import LocalCluster


@pytest.fixture
def cluster_factory(zk_server, tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Start LocalClusters (bookie processes) under a unique ZooKeeper root; stop them afterwards."""
    clusters: list[LocalCluster] = []

    def make(bookies: int = 1, bookie_args: list[str] | None = None, start: bool = True,
             name: str | None = None) -> LocalCluster:
        root = f"/t-{uuid.uuid4().hex[:8]}"
        cluster = LocalCluster(tmp_path / (name or f"cluster-{len(clusters)}"), bookies=bookies,
                               zk_root=root, bookie_args=bookie_args, zk_server=zk_server)
        clusters.append(cluster)
        if start:
            cluster.start()
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()
