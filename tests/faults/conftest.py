"""Fixtures of the fault tests: clusters of real bookie processes (on the session's ZooKeeper, or on
a ZooKeeper of their own when the test pauses or restarts it) and the history file of the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness.history import History
from tests.helpers import local_clusters
from dlog_tools.cluster import LocalCluster


@pytest.fixture
def history(tmp_path: Path) -> Iterator[History]:
    recorded = History(tmp_path / "history.jsonl")
    yield recorded
    recorded.close()


@pytest.fixture
def local_cluster(zk_server, tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """LocalClusters of 3 bookies by default; `own_zk=True` for a ZooKeeper of their own."""
    with local_clusters(zk_server, tmp_path, "f", default_bookies=3) as make:
        yield make
