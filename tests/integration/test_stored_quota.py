"""Quotas the bookies enforce (issue 14): they publish what each namespace stores on them and refuse
the namespace's ADDs once the cluster's total reaches its stored_bytes_max (the writer ends with one
clear error, `dlog quota show` tells the usage, other namespaces go on writing), and they refuse
data for a stream beyond streams_max even when its metadata was made behind the client's check."""

from __future__ import annotations

import json
import os
import time

import pytest

from bookkeeper.errors import ForbiddenError, MetadataNotFoundError, QuotaExceededError
from bookkeeper.meta import layout
from bookkeeper.meta.acl import zk_options
from bookkeeper.meta.zk import AsyncZooKeeper
from bookkeeper.security.quota import Quota
from dlog.namespace import Namespace
from dlog.segments.metadata import StreamConfig
from tests.helpers import dlog_runner, eventually, secure_local_cluster
from dlog_tools.secure import provision_namespace

pytestmark = pytest.mark.timeout(180)
QUOTA_BYTES = 200_000


@pytest.fixture
def quota_cluster(tmp_path):
    with secure_local_cluster(tmp_path, 2, ["--usage-interval", "0.5", "--gc-interval", "0"]) as cluster:
        yield cluster


async def set_quota(cluster, namespace: str, quota: Quota) -> None:
    """Provision `namespace` and write its quota, as an admin."""
    admin = cluster.secure_dir.admin_settings()
    await provision_namespace(cluster.zk_address, admin, namespace)
    zk = AsyncZooKeeper(cluster.zk_address, **zk_options(admin, cluster.zk_root))
    await zk.start()
    try:
        await zk.create(layout.quota_path(cluster.zk_root, namespace), quota.to_bytes(), makepath=True)
    finally:
        await zk.close()


async def test_a_namespace_over_its_stored_bytes_is_refused_and_others_write_on(quota_cluster):
    cluster, secure = quota_cluster, quota_cluster.secure_dir
    await provision_namespace(cluster.zk_address, secure.admin_settings(), "free")
    await set_quota(cluster, "capped", Quota(stored_bytes_max=QUOTA_BYTES))

    settings = secure.client_settings("capped", ["produce:capped", "consume:capped"])
    async with Namespace(cluster.zk_address, "capped", security=settings) as ns:
        await ns.create_stream("s", ensemble=2, write_quorum=2, ack_quorum=2)
        writer = await ns.open_writer("s")
        written, deadline = 0, time.monotonic() + 60
        with pytest.raises(QuotaExceededError, match="stored_bytes_max 200000") as refused:
            while time.monotonic() < deadline:  # bounded: the quota must stop it well before
                await writer.write(os.urandom(8 * 1024))  # incompressible
                written += 8 * 1024
        assert QUOTA_BYTES // 2 <= written < 20 * QUOTA_BYTES, written  # every copy counts: 2 per entry
        assert "stores" in str(refused.value) and "capped" in str(refused.value)
        await writer.close()

    free = secure.client_settings("free", ["produce:free", "consume:free"])
    async with Namespace(cluster.zk_address, "free", security=free) as ns:
        await ns.create_stream("s", ensemble=2, write_quorum=2, ack_quorum=2)
        async with ns.open_writer("s") as writer:
            await writer.write(os.urandom(64 * 1024))  # another namespace is not held back

    run = dlog_runner(cluster.zk_address, cluster.zk_root, env={"DLOG_CONFIG": str(secure.client_toml)})
    shown = run("quota", "show", "capped", "--json")
    document = json.loads(shown.stdout)
    assert document["stored_bytes_max"] == QUOTA_BYTES and document["stored_bytes"] >= QUOTA_BYTES


async def test_a_stream_made_behind_the_clients_quota_check_gets_no_data(quota_cluster):
    cluster, secure = quota_cluster, quota_cluster.secure_dir
    await set_quota(cluster, "counted", Quota(streams_max=1))
    settings = secure.client_settings("counted", ["produce:counted", "consume:counted"])
    async with Namespace(cluster.zk_address, "counted", security=settings) as ns:
        await ns.create_stream("first", ensemble=2, write_quorum=2, ack_quorum=2)
        async with ns.open_writer("first") as writer:
            for _ in range(20):  # the bookies learn the quota (read on the first adds) and the stream
                await writer.write(b"x" * 100)
        with pytest.raises(QuotaExceededError, match="streams_max is 1"):
            await ns.create_stream("second", ensemble=2, write_quorum=2, ack_quorum=2)  # the client's check
        # a principal writing ZooKeeper itself passes the client's check ...
        await ns.store.create_stream(StreamConfig("second", ensemble=2, write_quorum=2, ack_quorum=2,
                                                  password=(await ns.config("first")).password))
        writer = await ns.open_writer("second")
        with pytest.raises(QuotaExceededError, match="streams_max 1"):  # ... but the bookies refuse its data
            await writer.write(b"y" * 100)
        await writer.close()
        async with ns.open_writer("first") as writer:
            await writer.write(b"z")  # the stream within the quota goes on


async def test_a_relabelled_ledger_counts_for_no_namespace_and_serves_nobody(quota_cluster):
    """A tenant may write its own ledger's metadata (to close it); rewriting its namespace to
    another's made the bookies count its bytes against that namespace (issue 20: 20 MiB) and read
    it as that namespace's. Now the ledger's ACL cannot vouch for the claim: after the bookies
    forget what they knew (a restart), it counts nowhere and is refused to everyone."""
    cluster, secure = quota_cluster, quota_cluster.secure_dir
    for name in ("tenant", "victim"):
        await provision_namespace(cluster.zk_address, secure.admin_settings(), name)
    settings = secure.client_settings("tenant", ["produce:tenant", "consume:tenant"])
    async with Namespace(cluster.zk_address, "tenant", security=settings) as ns:
        handle = await ns.client.create_ledger(2, 2, 2, password=b"pw", custom={"namespace": "tenant"})
        for _ in range(8):
            await handle.append(os.urandom(8 * 1024))
        await handle.close()
        path = layout.ledger_path(cluster.zk_root, handle.ledger_id)
        data, version = await ns.zk.get(path)
        relabelled = json.loads(data)
        relabelled["custom"] = {**relabelled.get("custom", {}), "namespace": "victim"}
        await ns.zk.set(path, json.dumps(relabelled).encode(), version)  # its own node: allowed
    for index in range(len(cluster.bookies)):
        cluster.stop_bookie(index)
        cluster.start_bookie(index)
    admin = AsyncZooKeeper(cluster.zk_address, **zk_options(secure.admin_settings(), cluster.zk_root))
    await admin.start()
    try:  # every bookie published again since its restart (its usage node is ephemeral)
        await eventually(lambda: _published_by_all(admin, cluster), timeout_s=30)
    finally:
        await admin.close()
    run = dlog_runner(cluster.zk_address, cluster.zk_root, env={"DLOG_CONFIG": str(secure.client_toml)})
    assert json.loads(run("quota", "show", "victim", "--json").stdout)["stored_bytes"] == 0
    victim = secure.client_settings("victim", ["admin:victim"])
    async with Namespace(cluster.zk_address, "victim", security=victim) as ns:
        reader = await ns.client.open_ledger(handle.ledger_id, password=b"pw", recovery=False)
        with pytest.raises(ForbiddenError, match="cannot vouch for its namespace"):
            await reader.read(0, 0)


async def _published_by_all(zk: AsyncZooKeeper, cluster) -> bool:
    from bookkeeper.meta.usage import usage_dir

    try:
        return len(await zk.children(usage_dir(cluster.zk_root))) == len(cluster.bookies)
    except MetadataNotFoundError:
        return False
