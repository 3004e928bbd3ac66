"""Fixtures for tests that run real bookie processes against the session's real ZooKeeper."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.helpers import local_clusters
from tools.cluster import LocalCluster


@pytest.fixture
def cluster_factory(zk_server, tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Start LocalClusters (bookie processes) under a unique ZooKeeper root; stop them afterwards."""
    with local_clusters(zk_server, tmp_path, "t", default_bookies=1) as make:
        yield make


@pytest.fixture(scope="session")
def secure_cluster(tmp_path_factory):
    """A secure cluster for the whole session (started by the first test that asks): its own
    ZooKeeper with dlog's admin as super user, two TLS bookies requiring tokens and registering
    under ACLs, and the namespaces `orders` and `billing` provisioned."""
    import asyncio

    from tools.secure import create, provision_namespace

    directory = tmp_path_factory.mktemp("secure")
    secure = create(directory / "secure")
    cluster = LocalCluster(directory / "cluster", bookies=2, secure=secure,
                           bookie_args=["--gc-interval", "0"])
    cluster.start()
    admin = secure.admin_settings()
    for namespace in ("orders", "billing"):
        asyncio.run(provision_namespace(cluster.zk_address, admin, namespace))
    cluster.secure_dir = secure
    yield cluster
    cluster.stop()
