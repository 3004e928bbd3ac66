"""Every attack of issue 14 on the bookie protocol and ZooKeeper is refused on a real secure
cluster (TLS bookies requiring tokens, ZooKeeper ACLs), while an authorized client works end to end."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import time

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from bookkeeper.client import BookKeeper
from bookkeeper.client.connection import BookieConnection, ConnectSecurity
from bookkeeper.errors import (
    AuthenticationError,
    BookieUnavailableError,
    ForbiddenError,
    MetadataPermissionError,
    NoSuchLedgerError,
)
from bookkeeper.meta import layout
from bookkeeper.meta.acl import world_writable
from bookkeeper.protocol.entry import Digest, DigestType, master_key, pack_entry
from bookkeeper.protocol.wire import (
    AuthMechanism,
    AuthRequest,
    BookieInfoRequest,
    ErrorResponse,
    ReadRequest,
    ResponseDecoder,
    Status,
    encode_request,
)
from bookkeeper.security.settings import SEALED_PREFIX
from bookkeeper.security.tls import ClientTls
from dlog import Namespace

KEY = master_key(b"pw")


def tls_context(cluster) -> ssl.SSLContext:
    return ClientTls(str(cluster.secure_dir.ca_file)).context()


def connect_security(cluster, token: str | None) -> ConnectSecurity:
    return ConnectSecurity(tls_context(cluster), token)


def namespace(cluster, name: str, roles: list[str], **options) -> Namespace:
    settings = cluster.secure_dir.client_settings(name, roles)
    return Namespace(cluster.zk_address, name, security=settings, **options)


def raw_tls(address: str, context: ssl.SSLContext, data: bytes, timeout_s: float = 10.0):
    """Send raw frames over TLS; the decoded answers and whether the bookie closed."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as plain:
        with context.wrap_socket(plain, server_hostname=host) as sock:
            sock.sendall(data)
            decoder, answers, closed = ResponseDecoder(), [], False
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                try:
                    chunk = sock.recv(65536)
                except (TimeoutError, ssl.SSLError, ConnectionResetError):
                    break
                if not chunk:
                    closed = True
                    break
                decoder.receive_data(chunk)
                while (answer := decoder.next_message()) is not None:
                    answers.append(answer)
            return answers, closed


@pytest.fixture(scope="module")
def written(secure_cluster):
    """A stream in namespace `orders` with three records, written by an authorized producer."""

    async def write() -> tuple[int, str]:
        async with namespace(secure_cluster, "orders", ["produce:orders", "consume:orders"]) as ns:
            await ns.create_stream("s", ensemble=2, write_quorum=2, ack_quorum=2, exist_ok=True)
            async with ns.open_writer("s") as writer:
                offsets = [await writer.write(value) for value in (b"a", b"b", b"c")]
            config = await ns.config("s")
            return offsets[0].ledger_id, config.password

    return asyncio.run(write())


async def test_an_authorized_client_writes_and_reads_end_to_end(secure_cluster, written):
    async with namespace(secure_cluster, "orders", ["consume:orders"]) as ns:
        async with ns.open_reader("s", "earliest") as reader:
            batch = await reader.read_batch(3, timeout_ms=10_000)
            values = batch.column("value").to_pylist()
    assert values == [b"a", b"b", b"c"]


async def test_the_stream_password_is_sealed_in_zookeeper(secure_cluster, written):
    _, stored = written
    assert stored.startswith(SEALED_PREFIX)
    async with namespace(secure_cluster, "orders", ["consume:orders"]) as ns:
        password = ns.password_of(await ns.config("s")).decode()
    assert password not in stored


async def test_a_plain_read_without_credentials_is_refused(secure_cluster, written):
    """The first attack: a READ with no password returned any ledger's entries."""
    ledger_id, _ = written
    address = secure_cluster.bookies[0].address
    answers, closed = raw_tls(address, tls_context(secure_cluster),
                              encode_request(ReadRequest(7, ledger_id, 0)))
    assert isinstance(answers[0], ErrorResponse) and answers[0].status == Status.UNAUTHENTICATED
    assert "AUTH" in answers[0].message and closed


async def test_a_plaintext_client_gets_a_clean_refusal(secure_cluster):
    connection = await BookieConnection.open(secure_cluster.bookies[0].address)
    with pytest.raises(BookieUnavailableError) as refused:
        await connection.info()
    assert "TLS" in str(refused.value)
    await connection.close()
    bookie_log = (secure_cluster.bookies[0].data_dir / "bookie.log").read_text()
    assert "Traceback" not in bookie_log  # the bookie's side is quiet too


async def test_a_bookie_with_an_untrusted_certificate_is_refused(secure_cluster, tmp_path):
    from dlog_tools.secure import create

    other_ca = create(tmp_path / "other").ca_file
    context = ClientTls(str(other_ca)).context()
    with pytest.raises(AuthenticationError, match="not trusted"):
        await BookieConnection.open(secure_cluster.bookies[0].address,
                                    security=ConnectSecurity(context, "x"))


@pytest.mark.parametrize("case", ["expired", "tampered", "other key", "garbage"])
async def test_bad_tokens_are_refused(secure_cluster, case):
    from bookkeeper.security.tokens import TokenKey, create_token

    secure = secure_cluster.secure_dir
    key = TokenKey.from_file(secure.token_key)
    token = {
        "expired": create_token(key, "app", ["admin"], ttl_s=1, now_s=time.time() - 3600),
        "tampered": _tampered(create_token(key, "app", ["consume:orders"])),
        "other key": create_token(TokenKey("HS256", b"k" * 32), "app", ["admin"]),
        "garbage": "not.a.token",
    }[case]
    with pytest.raises(AuthenticationError):
        await BookieConnection.open(secure_cluster.bookies[0].address,
                                    security=connect_security(secure_cluster, token))


def _tampered(token: str) -> str:
    import base64

    header, claims, signature = token.split(".")
    decoded = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    decoded["roles"] = ["admin"]
    forged = base64.urlsafe_b64encode(json.dumps(decoded).encode()).rstrip(b"=").decode()
    return f"{header}.{forged}.{signature}"


async def test_a_token_for_another_namespace_or_role_is_forbidden(secure_cluster, written):
    ledger_id, _ = written
    secure = secure_cluster.secure_dir
    address = secure_cluster.bookies[0].address
    other = await BookieConnection.open(address, security=connect_security(
        secure_cluster, secure.token("intruder", ["produce:billing", "consume:billing"])))
    reader = await BookieConnection.open(address, security=connect_security(
        secure_cluster, secure.token("reader", ["consume:orders"])))
    try:
        with pytest.raises(ForbiddenError, match="orders"):
            await other.read(ledger_id, 0)
        with pytest.raises(ForbiddenError):  # a consumer may not fence (take over) the writer
            await reader.read(ledger_id, -1, fence_key=KEY)
        with pytest.raises(ForbiddenError):
            await reader.write_lac(ledger_id, KEY, 5)
        assert (await reader.read(ledger_id, 0)).packed_entry  # but it may read
    finally:
        await other.close()
        await reader.close()


async def test_add_or_fence_of_a_ledger_without_metadata_never_creates_it(secure_cluster):
    """A fencing READ or ADD for an id with no metadata used to create the ledger under the
    caller's key, so its real owner could never write it."""
    admin = await BookieConnection.open(secure_cluster.bookies[0].address,
                                        security=connect_security(secure_cluster,
                                                                  secure_cluster.secure_dir.admin_token))
    squatted = 9_000_000_000
    digest = Digest.for_ledger(DigestType.CRC32C, b"pw")
    try:
        with pytest.raises(NoSuchLedgerError, match="no metadata"):
            await admin.read(squatted, -1, fence_key=KEY)
        with pytest.raises(NoSuchLedgerError, match="no metadata"):
            await admin.add(squatted, 0, KEY, pack_entry(digest, squatted, 0, -1, 1, b"x"))
        with pytest.raises(NoSuchLedgerError):  # nothing was created
            await admin.read_lac(squatted)
    finally:
        await admin.close()


async def test_a_client_that_skips_auth_learns_why(secure_cluster):
    answers, closed = raw_tls(secure_cluster.bookies[0].address, tls_context(secure_cluster),
                              encode_request(BookieInfoRequest(3)))
    assert answers[0].status == Status.UNAUTHENTICATED and closed
    garbage_auth = encode_request(AuthRequest(4, 99, b""))
    answers, closed = raw_tls(secure_cluster.bookies[0].address, tls_context(secure_cluster), garbage_auth)
    assert answers[0].status == Status.UNAUTHENTICATED and "mechanism" in answers[0].message
    assert AuthMechanism.TOKEN == 1


def _anonymous_zk(cluster) -> KazooClient:
    client = KazooClient(hosts=cluster.zk_address, timeout=10)
    client.start(timeout=10)
    return client


def test_zookeeper_nodes_are_not_world_writable(secure_cluster, written):
    client = _anonymous_zk(secure_cluster)
    admin = KazooClient(hosts=secure_cluster.zk_address, timeout=10,
                        auth_data=[("digest", f"admin:{secure_cluster.secure_dir.zk_admin_password}")])
    admin.start(timeout=10)
    try:
        checked = 0
        stack = ["/"]
        while stack:
            path = stack.pop()
            acls, _ = admin.get_acls(path)
            if path != "/zookeeper/config":  # ZooKeeper's own read-only node
                assert not world_writable(acls), (path, acls)  # not even create (issue 20)
            checked += 1
            stack += [f"{path.rstrip('/')}/{child}" for child in admin.get_children(path)]
        assert checked > 15
    finally:
        client.stop()
        client.close()
        admin.stop()
        admin.close()


def test_without_credentials_zookeeper_refuses_every_attack(secure_cluster, written):
    """Reading a stream's config, fencing by rewriting metadata, deleting a stream's nodes,
    rewriting or forging a bookie registration: all refused by ACLs."""
    ledger_id, _ = written
    root = secure_cluster.zk_root
    client = _anonymous_zk(secure_cluster)
    try:
        with pytest.raises(NoAuthError):
            client.get("/dlog/orders/streams/s")
        with pytest.raises(NoAuthError):
            client.delete("/dlog/orders/streams/s", recursive=True)
        with pytest.raises(NoAuthError):
            client.set(layout.ledger_path(root, ledger_id), b"{}")
        with pytest.raises(NoAuthError):
            client.delete(layout.ledger_path(root, ledger_id))
        bookie = secure_cluster.bookies[0].bookie_id
        with pytest.raises(NoAuthError):
            client.set(layout.bookie_path(root, bookie), json.dumps({"address": "127.0.0.1:1"}).encode())
        with pytest.raises(NoAuthError):
            client.create(layout.bookie_path(root, "127.0.0.1:1"), b"{}")
        with pytest.raises(NoAuthError):
            client.delete(layout.cookie_path(root, bookie))
    finally:
        client.stop()
        client.close()


async def test_a_namespace_principal_cannot_touch_another_namespace(secure_cluster, written):
    with pytest.raises(MetadataPermissionError):
        async with namespace(secure_cluster, "billing", ["admin:billing"]) as ns:
            await ns.store.zk.get("/dlog/orders/streams/s")


async def test_registrations_anyone_could_write_are_not_trusted(secure_cluster):
    """An admin mistake (a registration with an open ACL) must not let clients send entries to
    whatever address it names."""
    root = secure_cluster.zk_root
    admin = KazooClient(hosts=secure_cluster.zk_address, timeout=10,
                        auth_data=[("digest", f"admin:{secure_cluster.secure_dir.zk_admin_password}")])
    admin.start(timeout=10)
    fake = layout.bookie_path(root, "127.0.0.1:1")
    admin.create(fake, json.dumps({"id": "127.0.0.1:1", "address": "127.0.0.1:1"}).encode(),
                 acl=OPEN_ACL_UNSAFE, ephemeral=True)
    try:
        async with BookKeeper(secure_cluster.zk_address, root=root,
                              security=secure_cluster.secure_dir.admin_settings()) as client:
            ids = {info.bookie_id for info in await client.store.bookies()}
        assert "127.0.0.1:1" not in ids and len(ids) == 2
    finally:
        admin.delete(fake)
        admin.stop()
        admin.close()


async def test_ledger_deletion_by_a_namespace_leaves_a_tombstone_gc_collects(secure_cluster):
    async with namespace(secure_cluster, "billing", ["admin:billing"]) as ns:
        await ns.create_stream("gone", ensemble=2, write_quorum=2, ack_quorum=2)
        async with ns.open_writer("gone") as writer:
            offset = await writer.write(b"x")
        deleted = await ns.delete_stream("gone")
        assert deleted == [offset.ledger_id]
        with pytest.raises(NoSuchLedgerError):
            await ns.client.open_ledger(offset.ledger_id, recovery=False)


async def test_namespace_quotas_limit_streams_and_pace_writes(secure_cluster):
    """Quotas are set by admins only (the quota node's ACL); streams_max is checked at creation
    and write_bytes_per_s paced by every bookie, which slows the writer instead of failing it."""
    import urllib.request

    from bookkeeper.errors import QuotaExceededError
    from bookkeeper.meta.acl import zk_options
    from bookkeeper.meta.zk import AsyncZooKeeper
    from bookkeeper.security.quota import Quota

    def throttles() -> float:
        total = 0.0
        context = tls_context(secure_cluster)
        for bookie in secure_cluster.bookies:
            text = urllib.request.urlopen(bookie.http + "/metrics", timeout=5, context=context).read().decode()
            total += next(float(line.split()[1]) for line in text.splitlines()
                          if line.startswith("dlog_bookie_quota_throttles_total "))
        return total

    root = secure_cluster.zk_root
    path = layout.quota_path(root, "billing")
    admin = secure_cluster.secure_dir.admin_settings()
    zk = AsyncZooKeeper(secure_cluster.zk_address, **zk_options(admin, root))
    await zk.start()
    try:
        await zk.create(path, Quota(streams_max=1, write_bytes_per_s=32 * 1024).to_bytes(), makepath=True)
    finally:
        await zk.close()
    try:
        async with namespace(secure_cluster, "billing", ["admin:billing", "produce:billing"]) as ns:
            with pytest.raises(MetadataPermissionError):  # a namespace cannot raise its own quota
                await ns.zk.set(path, Quota().to_bytes())
            for name in await ns.list_streams():
                await ns.delete_stream(name)
            await ns.create_stream("paid", ensemble=2, write_quorum=2, ack_quorum=2)
            with pytest.raises(QuotaExceededError, match="streams_max is 1"):
                await ns.create_stream("second", ensemble=2, write_quorum=2, ack_quorum=2)
            # bookies read a quota again within 10 s (QUOTA_REFRESH_S): write until the pacing shows
            async with ns.open_writer("paid") as writer:
                deadline = time.monotonic() + 40
                while throttles() == 0:
                    assert time.monotonic() < deadline, "writes were never paced by the quota"
                    for _ in range(4):
                        await writer.write(os.urandom(16 * 1024))  # incompressible
                    await writer.flush()
    finally:  # the session's secure cluster is shared: later tests create streams in billing
        zk = AsyncZooKeeper(secure_cluster.zk_address, **zk_options(admin, root))
        await zk.start()
        try:
            await zk.delete(path)
        finally:
            await zk.close()


async def test_mutual_tls_names_the_principal_by_its_certificate(secure_cluster, tmp_path):
    """A bookie requiring client certificates: a certificate signed by the cluster CA authenticates
    (its OU roles are the principal's), a client without one is refused at the handshake."""
    from dlog_tools.cluster import LocalCluster
    from dlog_tools.secure import certificate_pem, make_certificate, private_pem

    secure = secure_cluster.secure_dir
    cluster = LocalCluster(tmp_path / "mtls", bookies=1, zk_server=secure_cluster.zk, zk_root="/mtls",
                           secure=secure, bookie_args=["--tls-require-client-cert"])
    cluster.start()
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        ca_key = load_pem_private_key((secure.path / "ca.key").read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate(secure.ca_file.read_bytes())
        key, cert = make_certificate(ca_key, ca_cert, "ops-1", roles=("admin",))
        (tmp_path / "client.pem").write_bytes(certificate_pem(cert))
        (tmp_path / "client.key").write_bytes(private_pem(key))
        with_cert = ClientTls(str(secure.ca_file), cert_file=str(tmp_path / "client.pem"),
                              key_file=str(tmp_path / "client.key")).context()
        address = cluster.bookies[0].address
        connection = await BookieConnection.open(address, security=ConnectSecurity(with_cert, None, True))
        try:
            assert (await connection.info()).bookie_id == address
            assert await connection.authenticate(ConnectSecurity(with_cert, None, True)) == "cert:ops-1"
        finally:
            await connection.close()
        with pytest.raises((BookieUnavailableError, AuthenticationError)):
            plain = await BookieConnection.open(address, security=ConnectSecurity(tls_context(secure_cluster), None, True))
            await plain.info()
    finally:
        cluster.stop()
