"""The attacks of issue 20's probe on a secure cluster achieve nothing: nobody but the cluster's
identities makes ledger directories, moves the id counter or creates ledger nodes; a tenant can
neither make a ledger claim another namespace nor relabel its own; the ZooKeeper root takes no
anonymous node; a jammed counter or squatted ids repair themselves; each time the victim's data
and writers go on untouched."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from bookkeeper.errors import ForbiddenError, MetadataPermissionError
from bookkeeper.meta import layout
from bookkeeper.meta.acl import digest_id
from bookkeeper.protocol.create import CreateLedgerRequest
from bookkeeper.protocol.metadata import LedgerMetadata
from bookkeeper.protocol.wire import ReadRequest
from bookkeeper.security.settings import role_zk_user
from dlog import Namespace
from dlog_tools.secure import provision_namespace

VICTIM, TENANT = "victim", "tenant"


def namespace(cluster, name: str, roles: list[str]) -> Namespace:
    return Namespace(cluster.zk_address, name, security=cluster.secure_dir.client_settings(name, roles))


def zk_client(cluster, settings=None) -> KazooClient:
    """A plain kazoo client: anonymous, or authenticated as every identity of `settings`."""
    client = KazooClient(hosts=cluster.zk_address, timeout=10,
                         auth_data=settings.zk_auth() if settings is not None else None)
    client.start(timeout=10)
    return client


def admin_zk(cluster) -> KazooClient:
    return zk_client(cluster, cluster.secure_dir.admin_settings())


@pytest.fixture(scope="module")
def victim(secure_cluster):
    """The victim namespace with a stream of three records; the tenant namespace provisioned."""

    async def setup() -> int:
        admin = secure_cluster.secure_dir.admin_settings()
        for name in (VICTIM, TENANT):
            await provision_namespace(secure_cluster.zk_address, admin, name)
        async with namespace(secure_cluster, VICTIM, [f"produce:{VICTIM}", f"consume:{VICTIM}"]) as ns:
            await ns.create_stream("s", ensemble=2, write_quorum=2, ack_quorum=2, exist_ok=True)
            async with ns.open_writer("s") as writer:
                return (await writer.write(b"mine")).ledger_id

    return asyncio.run(setup())


async def victim_reads(cluster) -> list[bytes]:
    async with namespace(cluster, VICTIM, [f"consume:{VICTIM}"]) as ns:
        async with ns.open_reader("s", start="earliest", follow=False) as reader:
            return [record.value async for record in reader]


def counter(cluster) -> int:
    client = admin_zk(cluster)
    try:
        return int(client.get(f"{layout.idgen_path(cluster.zk_root)}/next")[0])
    finally:
        client.stop()
        client.close()


async def new_victim_ledger(cluster) -> int:
    async with namespace(cluster, VICTIM, [f"produce:{VICTIM}"]) as ns:
        handle = await ns.client.create_ledger(2, 2, 2, password=b"pw", custom={"namespace": VICTIM})
        await handle.close()
        return handle.ledger_id


@pytest.mark.parametrize("who", ["anonymous", "tenant"])
def test_nobody_but_the_cluster_makes_directories_moves_the_counter_or_creates_ledgers(secure_cluster, victim,
                                                                                      who):
    root = secure_cluster.zk_root
    settings = None if who == "anonymous" else secure_cluster.secure_dir.client_settings(
        TENANT, [f"admin:{TENANT}"])
    client = zk_client(secure_cluster, settings)
    next_id = counter(secure_cluster)
    next_path = layout.ledger_path(root, next_id + 50_000)
    try:
        for attempt in (
                lambda: client.create(next_path.rsplit("/", 1)[0], b"", acl=OPEN_ACL_UNSAFE, makepath=True),
                lambda: client.create(f"{layout.ledgers_path(root)}/999", b"", acl=OPEN_ACL_UNSAFE),
                lambda: client.set(f"{layout.idgen_path(root)}/next", str(next_id + 50_000).encode()),
                lambda: client.create(layout.ledger_path(root, victim), b"{}"),
                lambda: client.set(layout.ledger_path(root, victim), b'{"deleted": true}'),
                lambda: client.delete(layout.ledger_path(root, victim)),
                lambda: client.create("/filler", b"x" * 1000),
                lambda: client.create("/zookeeper/quota/filler", b"x"),
                lambda: client.create(f"{root}/filler", b"x"),
                lambda: client.set_acls(f"{root}/ledgers", OPEN_ACL_UNSAFE)):
            with pytest.raises(NoAuthError):
                attempt()
    finally:
        client.stop()
        client.close()
    assert counter(secure_cluster) == next_id
    assert asyncio.run(victim_reads(secure_cluster))[:1] == [b"mine"]


async def test_a_tenant_cannot_have_a_ledger_made_for_another_namespace(secure_cluster, victim):
    """CREATE_LEDGER checks the principal's role in the namespace the metadata claims, and that the
    writer ids are that namespace's own producers (anything else could relabel it later)."""
    async with namespace(secure_cluster, TENANT, [f"produce:{TENANT}"]) as ns:
        own, _ = await ns.client.store.read_ledger(victim)  # ledger metadata is readable by anyone
        claims_victim = LedgerMetadata.from_bytes(own.to_bytes())
        bookie = ns.client.writable_bookies()[0]
        with pytest.raises(ForbiddenError, match=f"may not create ledgers in namespace '{VICTIM}'"):
            await ns.client.pool.send(bookie, CreateLedgerRequest(ns.client.pool.next_request_id(),
                                                                  claims_victim.to_bytes(), ()))
        victim_producer = digest_id(role_zk_user(VICTIM, "produce"), "guessed")
        mine = dataclasses.replace(claims_victim, custom=(("namespace", TENANT),))
        with pytest.raises(ForbiddenError, match="is not a producer or admin identity"):
            await ns.client.pool.send(bookie, CreateLedgerRequest(ns.client.pool.next_request_id(),
                                                                  mine.to_bytes(), (victim_producer,)))


async def test_a_tenant_can_neither_fence_nor_forge_into_the_victims_ledger(secure_cluster, victim):
    async with namespace(secure_cluster, TENANT, [f"admin:{TENANT}"]) as ns:
        metadata, _ = await ns.client.store.read_ledger(victim)
        bookie = metadata.ensemble_for(0)[0]
        with pytest.raises(ForbiddenError):
            await ns.client.pool.send(bookie, ReadRequest(ns.client.pool.next_request_id(), victim, -1, fence=True,
                                                          master_key=bytes.fromhex(metadata.master_key)))
    assert (await victim_reads(secure_cluster))[:1] == [b"mine"]


async def test_an_open_directory_planted_in_the_way_is_skipped(secure_cluster, victim):
    """A ledger directory anyone could write (made before this fix, or by an admin's mistake) is
    never used: the next ledger lands past it, and the directory stays empty."""
    root = secure_cluster.zk_root
    ahead = (counter(secure_cluster) // 10_000 + 5) * 10_000  # a directory no ledger used yet
    planted = layout.ledger_path(root, ahead).rsplit("/", 1)[0]
    admin = admin_zk(secure_cluster)
    try:
        admin.create(planted, b"", acl=OPEN_ACL_UNSAFE, makepath=True)
        admin.set(f"{layout.idgen_path(root)}/next", str(ahead).encode())
        created = await new_victim_ledger(secure_cluster)
        assert layout.ledger_path(root, created).rsplit("/", 1)[0] != planted
        assert created >= ahead + 10_000 and admin.get_children(planted) == []
    finally:
        admin.stop()
        admin.close()


@pytest.mark.parametrize("jam", ["garbage", "-5", str(layout.LEDGER_ID_MAX), "squatted"])
async def test_a_jammed_counter_or_squatted_ids_repair_themselves(secure_cluster, victim, jam):
    """Only admins and bookies can write the counter now; still, what they might leave there (or
    nodes made ahead of it) costs a loud log line, never a ValueError or a stuck cluster."""
    root = secure_cluster.zk_root
    admin = admin_zk(secure_cluster)
    try:
        highest_before = counter(secure_cluster)
        if jam == "squatted":
            for ledger_id in range(highest_before, highest_before + 25):
                admin.create(layout.ledger_path(root, ledger_id), b'{"squatter": true}', makepath=True)
        else:
            admin.set(f"{layout.idgen_path(root)}/next", jam.encode())
        created = await new_victim_ledger(secure_cluster)
        assert created >= highest_before + (25 if jam == "squatted" else 0)
        assert admin.get(layout.ledger_path(root, created))[0] != b'{"squatter": true}'
        assert await new_victim_ledger(secure_cluster) > created
    finally:
        admin.stop()
        admin.close()


def test_zookeeper_refuses_nodes_larger_than_dlog_writes(secure_cluster):
    from bookkeeper.meta.zkserver import JUTE_MAX_BUFFER_BYTES

    admin = admin_zk(secure_cluster)
    try:
        with pytest.raises(ConnectionLoss):
            admin.create("/too-large", b"x" * (JUTE_MAX_BUFFER_BYTES + 1))
    finally:
        admin.stop()
        admin.close()
    admin = admin_zk(secure_cluster)
    try:
        assert admin.exists("/too-large") is None
    finally:
        admin.stop()
        admin.close()


async def test_a_namespace_made_before_role_identities_is_migrated(secure_cluster):
    """A namespace whose nodes and ledgers carry the one identity of earlier versions: its
    producers are refused until an admin provisions it again, then read and write as before."""
    from kazoo.security import ACL, Id, Permissions

    name = "legacy"
    admin = secure_cluster.secure_dir.admin_settings()
    await provision_namespace(secure_cluster.zk_address, admin, name)
    async with namespace(secure_cluster, name, [f"admin:{name}"]) as ns:
        await ns.create_stream("old", ensemble=2, write_quorum=2, ack_quorum=2)
        async with ns.open_writer("old") as writer:
            offset = await writer.write(b"before")
    old_identity = ACL(Permissions.ALL, Id("digest", digest_id(f"ns.{name}", "x")))
    client = admin_zk(secure_cluster)
    try:  # what an earlier version left: one identity everywhere, no role identities named
        client.set(f"/dlog/{name}", b"")
        stack = [f"/dlog/{name}"]
        while stack:
            path = stack.pop()
            client.set_acls(path, [old_identity])
            stack += [f"{path}/{child}" for child in client.get_children(path)]
        ledger = layout.ledger_path(secure_cluster.zk_root, offset.ledger_id)
        client.set_acls(ledger, [old_identity, *client.get_acls(ledger)[0]])
    finally:
        client.stop()
        client.close()
    with pytest.raises(MetadataPermissionError):
        async with namespace(secure_cluster, name, [f"produce:{name}"]) as ns:
            await ns.config("old")
    await provision_namespace(secure_cluster.zk_address, admin, name)
    async with namespace(secure_cluster, name, [f"produce:{name}", f"consume:{name}"]) as ns:
        async with ns.open_writer("old") as writer:
            await writer.write(b"after")
        async with ns.open_reader("old", start="earliest", follow=False) as reader:
            assert [record.value async for record in reader] == [b"before", b"after"]
