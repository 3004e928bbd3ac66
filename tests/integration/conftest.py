"""Fixtures for tests that run real bookie processes against the session's real ZooKeeper."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import local_clusters
from dlog_tools.cluster import LocalCluster


@pytest.fixture
def cluster_factory(zk_server, tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Start LocalClusters (bookie processes) under a unique ZooKeeper root; stop them afterwards."""
    with local_clusters(zk_server, tmp_path, "t", default_bookies=1) as make:
        yield make

