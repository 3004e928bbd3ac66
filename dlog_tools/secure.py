"""What `dlog standalone --secure` (and the tests) make under `<dir>/secure/`: a CA, certificates,
a token signing key and an admin token, ZooKeeper credentials, and the clients' `client.toml`.

    ca.pem, ca.key              the cluster CA (real certificates, made with `cryptography`)
    server.pem, server.key      the bookies' and admin endpoints' certificate (127.0.0.1, localhost)
    token.key                   the HS256 secret that signs and verifies tokens
    admin.token                 a token with the admin role
    cluster.secret              derives each namespace's ZooKeeper credentials
    zk-admin.password, zk-bookie.password
    client.toml                 the admin's client settings (TLS, token, ZooKeeper credentials)

Files are created once (mode 0600 for secrets) and reused by later starts with the same
directory; `load` reads them back.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bookkeeper.clock import wall_ms
from bookkeeper.errors import ConfigError
from bookkeeper.meta.acl import digest_id
from bookkeeper.security.settings import SecuritySettings
from bookkeeper.security.tokens import TokenKey, create_token

CERT_DAYS = 825
ADMIN_SUBJECT = "admin"
ZK_ADMIN_USER = "admin"
ZK_BOOKIE_USER = "bookie"


@dataclass(frozen=True, slots=True)
class SecureDir:
    path: Path

    @property
    def ca_file(self) -> Path:
        return self.path / "ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.path / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.path / "server.key"

    @property
    def token_key(self) -> Path:
        return self.path / "token.key"

    @property
    def admin_token_file(self) -> Path:
        return self.path / "admin.token"

    @property
    def client_toml(self) -> Path:
        return self.path / "client.toml"

    @property
    def cluster_secret_file(self) -> Path:
        return self.path / "cluster.secret"

    @property
    def zk_bookie_password_file(self) -> Path:
        return self.path / "zk-bookie.password"

    @property
    def bookie_digest(self) -> str:
        """The bookies' ZooKeeper digest id (they share one identity in a local cluster)."""
        return digest_id(ZK_BOOKIE_USER, self.zk_bookie_password_file.read_text().strip())

    @property
    def zk_admin_password(self) -> str:
        return (self.path / "zk-admin.password").read_text().strip()

    @property
    def admin_token(self) -> str:
        return self.admin_token_file.read_text().strip()

    @property
    def super_digest(self) -> str:
        return digest_id(ZK_ADMIN_USER, self.zk_admin_password)

    def bookie_args(self) -> list[str]:
        """`dlog bookie start` flags for a bookie of this secure cluster."""
        return ["--tls-cert", str(self.server_cert), "--tls-key", str(self.server_key),
                "--tls-ca", str(self.ca_file), "--token-key", str(self.token_key),
                "--zk-user", ZK_BOOKIE_USER, "--zk-password-file", str(self.zk_bookie_password_file)]

    def token(self, subject: str, roles: list[str], ttl_s: float | None = None) -> str:
        return create_token(TokenKey.from_file(self.token_key), subject, roles, ttl_s=ttl_s)

    def client_settings(self, namespace: str | None, roles: list[str], *, subject: str = "app",
                        token: str | None = None) -> SecuritySettings:
        """A client of `namespace` holding a token with `roles` (or `token`) and the ZooKeeper
        identities of its roles in that namespace, trusting the cluster CA."""
        from bookkeeper.security.settings import namespace_settings
        from bookkeeper.security.tls import ClientTls

        zookeeper: dict[str, object] = {}
        held = [role.split(":", 1)[0] for role in roles if role.endswith(f":{namespace}")]
        if namespace is not None and held:
            zookeeper = namespace_settings(self.cluster_secret_file.read_text().strip().encode(), namespace, held)
        return SecuritySettings(tls=ClientTls(str(self.ca_file)),
                                token=token if token is not None else self.token(subject, roles),
                                **zookeeper)  # type: ignore[arg-type]

    def admin_settings(self) -> SecuritySettings:
        from bookkeeper.security.tls import ClientTls

        return SecuritySettings(tls=ClientTls(str(self.ca_file)), token=self.admin_token,
                                zk_user=ZK_ADMIN_USER, zk_password=self.zk_admin_password,
                                cluster_secret=self.cluster_secret_file.read_text().strip().encode())


def create(path: Path, zk: str | None = None,
           hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> SecureDir:
    """Make (or keep) everything a secure local cluster needs under `path`; client.toml is written
    once the ZooKeeper address is known (`zk`, or later `write_admin_config`)."""
    secure = SecureDir(Path(path))
    secure.path.mkdir(parents=True, exist_ok=True)
    os.chmod(secure.path, 0o700)
    if not secure.ca_file.exists():
        ca_key, ca_cert = make_ca("dlog local CA")
        _write(secure.path / "ca.key", private_pem(ca_key), secret=True)
        _write(secure.ca_file, certificate_pem(ca_cert))
        # the bookies' certificate also authenticates them to each other (auto-recovery)
        key, cert = make_certificate(ca_key, ca_cert, "dlog bookie", hosts=hosts, roles=("bookie",))
        _write(secure.server_key, private_pem(key), secret=True)
        _write(secure.server_cert, certificate_pem(cert))
    for name, maker in (("token.key", lambda: secrets.token_hex(32)),
                        ("cluster.secret", lambda: secrets.token_hex(32)),
                        ("zk-admin.password", lambda: secrets.token_hex(16)),
                        ("zk-bookie.password", lambda: secrets.token_hex(16))):
        if not (secure.path / name).exists():
            _write(secure.path / name, maker().encode(), secret=True)
    if not secure.admin_token_file.exists():
        _write(secure.admin_token_file, secure.token(ADMIN_SUBJECT, ["admin"]).encode(), secret=True)
    if zk is not None:
        write_admin_config(secure, zk)
    return secure


def write_admin_config(secure: SecureDir, zk: str) -> Path:
    """Write the admin's client.toml, and remember its path for the cluster at `zk` (see
    `remembered_client_config`)."""
    write_client_toml(secure.client_toml, zk=zk, ca_file=secure.ca_file, token_file=secure.admin_token_file,
                      zk_user=ZK_ADMIN_USER, zk_password=secure.zk_admin_password,
                      cluster_secret_file=secure.cluster_secret_file, token_key_file=secure.token_key)
    try:
        _remembered_path(zk).parent.mkdir(parents=True, exist_ok=True)
        _write(_remembered_path(zk), str(secure.client_toml.resolve()).encode())
    except OSError:
        pass  # only a hint for error messages: a read-only home changes nothing else
    return secure.client_toml


def remembered_client_config(zk: str) -> Path | None:
    """Where the admin's client.toml of the secure local cluster at `zk` is, if this user made one
    (`dlog standalone --secure`), so a command run without $DLOG_CONFIG can name the file to export.
    Only the path is kept ($DLOG_HOME, default ~/.dlog, under clusters/), never a secret."""
    try:
        found = Path(_remembered_path(zk).read_text().strip())
    except OSError:
        return None
    return found if found.is_file() else None


def _remembered_path(zk: str) -> Path:
    home = Path(os.environ.get("DLOG_HOME") or Path.home() / ".dlog")
    return home / "clusters" / (zk.replace(":", "_").replace(",", "+").replace("/", "_") + ".client-config")


async def provision_namespace(zk: str, settings: SecuritySettings, namespace: str,
                              namespace_root: str = "/dlog",
                              bookkeeper_root: str = "/bookkeeper") -> None:
    """Create `<namespace_root>/<namespace>` (naming its role identities, acl.py) and its streams
    node, as an admin (whose settings hold the cluster secret that derives them). Idempotent; a
    namespace made before role identities gets them, and every node below it the ACL it needs."""
    from bookkeeper.meta.acl import digest_id, namespace_node_data, parse_namespace_node, zk_options
    from bookkeeper.meta.zk import AsyncZooKeeper

    if settings.cluster_secret is None:
        raise ConfigError("creating a namespace needs an admin's client.toml (cluster_secret_file)")
    identities = {role: digest_id(*identity) for role, identity in settings.role_identities(namespace).items()}
    client = AsyncZooKeeper(zk, **zk_options(settings, bookkeeper_root, namespace, namespace_root))
    await client.start()
    try:
        path = f"{namespace_root}/{namespace}"
        await client.ensure_path(namespace_root)
        found = await client.get_or_none(path)
        if found is None:
            await client.create(path, namespace_node_data(identities))
        elif parse_namespace_node(found[0]) != identities:
            await client.set(path, namespace_node_data(identities))
            await reacl_subtree(client, path)  # made before role identities: every node's ACL anew
            await _reacl_segment_ledgers(client, path, namespace, bookkeeper_root)
        await client.ensure_path(f"{path}/streams")
    finally:
        await client.close()


async def _reacl_segment_ledgers(client: Any, path: str, namespace: str, bookkeeper_root: str) -> None:
    """The ledgers of the namespace's streams, created before role identities, get the ACL a
    bookie gives new ones (writable by the namespace's producers and admins only), so bookies
    believe their namespace again (acl.py)."""
    from bookkeeper.meta.acl import parse_bookie_ids, security_path
    from bookkeeper.meta.layout import ledger_path
    from bookkeeper.protocol.metadata import LedgerMetadata
    from dlog.segments.metadata import Segment

    policy = client.acl_policy
    found = await client.get_or_none(security_path(bookkeeper_root))
    policy.learn_bookies(parse_bookie_ids(found[0]) if found is not None else [])
    writers = policy.ledger_writers(namespace)
    streams = await client.children(f"{path}/streams") if await client.exists(f"{path}/streams") else []
    for stream in streams:
        segments = f"{path}/streams/{stream}/segments"
        for name in await client.children(segments) if await client.exists(segments) else []:
            segment = Segment.from_bytes((await client.get(f"{segments}/{name}"))[0])
            ledger = ledger_path(bookkeeper_root, segment.ledger_id)
            metadata = await client.get_or_none(ledger)
            custom = dict(LedgerMetadata.from_bytes(metadata[0]).custom) if metadata is not None else {}
            if custom.get("namespace") == namespace:
                await client.set_acls(ledger, policy.acl_for(ledger, writers))


async def reacl_subtree(client: Any, path: str) -> int:
    """Give `path` and every node below it the ACL the client's policy chooses (an admin's
    client: ZooKeeper super users may change any ACL). Returns the nodes changed."""
    changed = 0
    stack = [path]
    while stack:
        node = stack.pop()
        await client.set_acls(node, client.acl_policy.acl_for(node))
        changed += 1
        stack += [f"{node}/{child}" for child in await client.children(node)]
    return changed


def write_client_toml(path: Path, *, zk: str, ca_file: Path, token_file: Path | None = None,
                      token: str | None = None, zk_user: str | None = None,
                      zk_password: str | None = None, zk_identities: tuple[tuple[str, str], ...] = (),
                      namespace_key: str | None = None, cluster_secret_file: Path | None = None,
                      token_key_file: Path | None = None) -> None:
    lines = ["# dlog client settings: dlog --config FILE ..., or DLOG_CONFIG=FILE", "[cluster]",
             f'zk = "{zk}"', "", "[security]", f'ca_file = "{ca_file}"', "check_hostname = true"]
    if token_file is not None:
        lines.append(f'token_file = "{token_file}"')
    if token is not None:
        lines.append(f'token = "{token}"')
    if zk_user is not None and zk_password is not None:
        lines += [f'zk_user = "{zk_user}"', f'zk_password = "{zk_password}"']
    if zk_identities:
        lines.append("zk_identities = [" + ", ".join(f'"{user}:{password}"' for user, password in zk_identities) + "]")
    if namespace_key is not None:
        lines.append(f'namespace_key = "{namespace_key}"')
    if cluster_secret_file is not None:
        lines.append(f'cluster_secret_file = "{cluster_secret_file}"')
    if token_key_file is not None:
        lines.append(f'token_key_file = "{token_key_file}"')
    _write(path, ("\n".join(lines) + "\n").encode(), secret=True)


def _write(path: Path, data: bytes, *, secret: bool = False) -> None:
    temporary = path.with_name(path.name + ".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


# ------------------------------------------------------------------------------ certificates


def make_ca(name: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.fromtimestamp(wall_ms() / 1000, datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_certificate(ca_key, ca_cert, name: str, *, hosts: tuple[str, ...] = (),
                     roles: tuple[str, ...] = (), days: int = CERT_DAYS):
    """A certificate signed by the CA: server names in `hosts` (IPs and DNS names), client roles
    as `dlog-role=<role>` organizational units."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
    attributes += [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, f"dlog-role={role}") for role in roles]
    now = datetime.datetime.fromtimestamp(wall_ms() / 1000, datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(x509.Name(attributes)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def private_pem(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def certificate_pem(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


# ------------------------------------------------------------------------------ ZooKeeper itself


def lock_down(zk: str, admin_user: str, admin_password: str, bookie_ids: list[str],
              bookkeeper_root: str = "/bookkeeper", namespace_root: str = "/dlog") -> dict[str, int]:
    """Close a secure cluster's ZooKeeper to everyone but its own identities, as an admin (a super
    user): the cluster root (bookies create below it) and the namespace root exist with their
    ACLs; the root node and `/zookeeper/quota` let nobody but super users create (an anonymous
    client once filled the embedded ZooKeeper's heap with 1 MB nodes); ledger directories and the id
    counter that an earlier version left open are closed. Idempotent. Returns what it changed."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import KazooException, NoAuthError, NoNodeError
    from kazoo.handlers.threading import KazooTimeoutError

    from bookkeeper.errors import MetadataError, MetadataPermissionError
    from bookkeeper.meta.acl import WORLD_READ, AclPolicy, world_writable
    from bookkeeper.meta.layout import idgen_path, ledgers_path

    policy = AclPolicy(admin_user, admin_password, bookkeeper_root, namespace_root)
    policy.learn_bookies(bookie_ids)
    client = KazooClient(hosts=zk, timeout=10, auth_data=[("digest", f"{admin_user}:{admin_password}")])
    try:
        client.start(timeout=10)
    except KazooTimeoutError as exc:
        raise MetadataError(f"cannot reach ZooKeeper at {zk} within 10 s: is it running there?") from exc
    changed = {"created": 0, "closed": 0}
    try:
        for path, acl in ((bookkeeper_root, policy.cluster_owned()), (namespace_root, policy.acl_for(namespace_root))):
            if client.exists(path) is None:
                client.create(path, b"", acl=acl, makepath=True)
                changed["created"] += 1
        paths = ["/", "/zookeeper", "/zookeeper/quota", bookkeeper_root, idgen_path(bookkeeper_root),
                 f"{idgen_path(bookkeeper_root)}/next"]
        level = [ledgers_path(bookkeeper_root)]
        for _depth in range(5):
            paths += level
            level = [f"{path}/{name}" for path in level if client.exists(path) is not None
                     for name in client.get_children(path) if not name.startswith("L")]
        for path in paths:
            try:
                acls, _stat = client.get_acls(path)
                if not world_writable(acls):
                    continue
                wanted = [WORLD_READ] if path in ("/", "/zookeeper", "/zookeeper/quota") else policy.acl_for(path)
                client.set_acls(path, wanted)
                changed["closed"] += 1
            except NoNodeError:
                continue
    except NoAuthError as exc:
        raise MetadataPermissionError(f"ZooKeeper refused {admin_user!r}: securing it needs a super user "
                                      "(an admin's client.toml)") from exc
    except KazooException as exc:
        raise MetadataError(f"securing ZooKeeper at {zk} failed: {type(exc).__name__} {exc}") from exc
    finally:
        client.stop()
        client.close()
    return changed
