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
        """A client of `namespace` holding a token with `roles` (or `token`) and the namespace's
        ZooKeeper credentials, trusting the cluster CA."""
        from bookkeeper.security.settings import derive_namespace_password, namespace_zk_user
        from bookkeeper.security.tls import ClientTls

        secret = self.cluster_secret_file.read_text().strip().encode()
        user = password = None
        if namespace is not None:
            user, password = namespace_zk_user(namespace), derive_namespace_password(secret, namespace)
        return SecuritySettings(tls=ClientTls(str(self.ca_file)),
                                token=token if token is not None else self.token(subject, roles),
                                zk_user=user, zk_password=password)

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
    write_client_toml(secure.client_toml, zk=zk, ca_file=secure.ca_file, token_file=secure.admin_token_file,
                      zk_user=ZK_ADMIN_USER, zk_password=secure.zk_admin_password,
                      cluster_secret_file=secure.cluster_secret_file, token_key_file=secure.token_key)
    return secure.client_toml


async def provision_namespace(zk: str, settings: SecuritySettings, namespace: str,
                              namespace_root: str = "/dlog",
                              bookkeeper_root: str = "/bookkeeper") -> None:
    """Create `<namespace_root>/<namespace>` owned by the namespace's ZooKeeper identity, as an
    admin (whose settings hold the cluster secret that derives it). Idempotent."""
    from bookkeeper.meta.acl import zk_options
    from bookkeeper.meta.zk import AsyncZooKeeper

    if settings.namespace_credentials(namespace) is None:
        raise ConfigError("creating a namespace needs an admin's client.toml (cluster_secret_file)")
    client = AsyncZooKeeper(zk, **zk_options(settings, bookkeeper_root, namespace, namespace_root))
    await client.start()
    try:
        await client.ensure_path(f"{namespace_root}/{namespace}/streams")
    finally:
        await client.close()


def write_client_toml(path: Path, *, zk: str, ca_file: Path, token_file: Path | None = None,
                      token: str | None = None, zk_user: str | None = None,
                      zk_password: str | None = None, cluster_secret_file: Path | None = None,
                      token_key_file: Path | None = None) -> None:
    lines = ["# dlog client settings: dlog --config FILE ..., or DLOG_CONFIG=FILE", "[cluster]",
             f'zk = "{zk}"', "", "[security]", f'ca_file = "{ca_file}"', "check_hostname = true"]
    if token_file is not None:
        lines.append(f'token_file = "{token_file}"')
    if token is not None:
        lines.append(f'token = "{token}"')
    if zk_user is not None and zk_password is not None:
        lines += [f'zk_user = "{zk_user}"', f'zk_password = "{zk_password}"']
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


def make_ca(name: str):  # type: ignore[no-untyped-def]
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
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


def make_certificate(ca_key, ca_cert, name: str, *, hosts: tuple[str, ...] = (),  # type: ignore[no-untyped-def]
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
    now = datetime.datetime.now(datetime.timezone.utc)
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


def private_pem(key) -> bytes:  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def certificate_pem(cert) -> bytes:  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)
