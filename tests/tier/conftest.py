"""Fixtures of the tiered-storage tests: one 3-bookie cluster per file on the session's ZooKeeper."""

from __future__ import annotations

import uuid

import pytest

from dlog import Namespace
from dlog_tools.cluster import LocalCluster
from tests.harness.s3 import MotoS3


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("tier"), bookies=3, zk_root=f"/t-{uuid.uuid4().hex[:8]}",
                           zk_server=zk_server)
    cluster.start()
    yield cluster
    cluster.stop()


def connect(cluster: LocalCluster, namespace: str | None = None, **options) -> Namespace:
    return Namespace(cluster.zk_address, namespace or f"ns{uuid.uuid4().hex[:6]}", bookkeeper_root=cluster.zk_root,
                     **options)


@pytest.fixture(scope="module")
def moto_s3(tmp_path_factory):
    """An S3 store (moto's server mode on loopback) with one bucket, for a file's tests."""
    store = MotoS3(tmp_path_factory.mktemp("moto")).start()
    yield store
    store.stop()
