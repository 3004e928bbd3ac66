"""The client's security settings, and the small loader of client.toml the libraries use.

`client.toml` (written by `dlog standalone --secure`, or by hand):

    [cluster]
    zk = "127.0.0.1:2181"
    [security]
    ca_file = "/path/ca.pem"            # TLS to bookies and admin endpoints; trusts this CA
    check_hostname = true               # the bookie's certificate must name its registered host
    cert_file = "..."  key_file = "..." # optional client certificate (mutual TLS)
    token_file = "/path/admin.token"    # or token = "..." ; $DLOG_TOKEN overrides both
    zk_user = "admin"  zk_password = "..."   # ZooKeeper digest credentials
    zk_identities = ["ns.shop.consume:..."]  # further ZooKeeper identities (one per namespace role)
    namespace_key = "..."               # unseals the namespace's stream passwords
    cluster_secret_file = "..."         # admins only: derives namespaces' ZooKeeper credentials
    token_key_file = "..."              # admins only: signs tokens (dlog token create)

Shipped libraries read it themselves (`load_client_settings`), so `Namespace(...)` honours
`$DLOG_CONFIG` without the command-line tools.

A namespace has one ZooKeeper identity per role (`ns.<namespace>.produce`, `.consume`, `.admin`,
passwords derived from the cluster secret), so ZooKeeper itself keeps a consumer from changing what
only producers or admins may (bookkeeper/meta/acl.py); a client authenticates as every role
identity it holds. Stream passwords are sealed with the namespace key (derived from the cluster
secret too, given to every principal of the namespace): what ZooKeeper stores
("sealed:v1:<nonce>") is useless without it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bookkeeper.errors import ConfigError, ForbiddenError
from bookkeeper.security.tls import ClientTls

CONFIG_ENV = "DLOG_CONFIG"
TOKEN_ENV = "DLOG_TOKEN"
SECURITY_KEYS = frozenset({"ca_file", "check_hostname", "cert_file", "key_file", "token", "token_file",
                           "zk_user", "zk_password", "zk_identities", "namespace_key", "cluster_secret_file",
                           "token_key_file", "tls"})
SEALED_PREFIX = "sealed:v1:"
NAMESPACE_ZK_USER_PREFIX = "ns."
NAMESPACE_ZK_ROLES = ("produce", "consume", "admin")
# the ZooKeeper identities a namespace role holds: a namespace admin may do what its producers and
# consumers may, so it authenticates as all three
ZK_ROLES_OF = {"produce": ("produce",), "consume": ("consume",), "admin": ("admin", "produce", "consume")}
ZK_PASSWORD_CHARS = 32
ZK_IDENTITIES_MAX = 16


@dataclass(frozen=True, slots=True)
class SecuritySettings:
    tls: ClientTls | None = None
    token: str | None = None
    zk_user: str | None = None
    zk_password: str | None = None
    zk_identities: tuple[tuple[str, str], ...] = ()  # further (user, password) ZooKeeper identities
    namespace_key: str | None = None  # unseals the stream passwords of this client's namespace
    cluster_secret: bytes | None = None  # admins: derive any namespace's ZooKeeper credentials
    token_key_file: str | None = None  # admins: sign tokens
    source: str = ""  # where these came from, for messages

    @property
    def enabled(self) -> bool:
        return self.tls is not None or self.token is not None or self.zk_user is not None

    def zk_credentials(self) -> list[tuple[str, str]]:
        """Every ZooKeeper identity this client authenticates as: (user, password)."""
        found = [(self.zk_user, self.zk_password)] if self.zk_user and self.zk_password else []
        return found + [item for item in self.zk_identities if item not in found]

    def zk_auth(self) -> list[tuple[str, str]]:
        """kazoo auth_data: one digest per identity."""
        return [("digest", f"{user}:{password}") for user, password in self.zk_credentials()]

    def role_identities(self, namespace: str) -> dict[str, tuple[str, str]]:
        """role -> (user, password) of the namespace's role identities this client holds, or all
        three for an admin who can derive them from the cluster secret."""
        if self.cluster_secret is not None:
            return {role: (role_zk_user(namespace, role), derive_role_password(self.cluster_secret, namespace, role))
                    for role in NAMESPACE_ZK_ROLES}
        held = {}
        for user, password in self.zk_credentials():
            parsed = parse_role_zk_user(user)
            if parsed is not None and parsed[0] == namespace:
                held[parsed[1]] = (user, password)
        return held

    def require_role(self, namespace: str, role: str, action: str) -> None:
        """ForbiddenError naming what is missing when this client holds role identities of
        `namespace` but not `role`'s: refused before anything changes (ZooKeeper's ACLs refuse it
        anyway, but a destructive command could otherwise do half its work first). A client with
        no role identities there (an open cluster, or a cluster admin) is not asked here."""
        held = self.role_identities(namespace)
        if held and role not in held:
            having = ", ".join(f"{name}:{namespace}" for name in sorted(held))
            raise ForbiddenError(f"{action} needs the {role}:{namespace} role; this client holds {having} "
                                 f"(an admin makes one with `dlog token create --role {role} --namespace "
                                 f"{namespace} --client-config FILE`)")

    def seal_key(self, namespace: str) -> bytes | None:
        key = self.namespace_key_of(namespace)
        if key is None:
            return None
        return hmac.new(key.encode(), b"dlog-seal\x00" + namespace.encode(), hashlib.sha256).digest()

    def namespace_key_of(self, namespace: str) -> str | None:
        """The namespace key, if we hold it or can derive it (a client.toml made before role
        identities held it as the password of the identity `ns.<namespace>`)."""
        if self.cluster_secret is not None:
            return derive_namespace_key(self.cluster_secret, namespace)
        if self.namespace_key is not None and self.role_identities(namespace):
            return self.namespace_key
        if self.zk_user == NAMESPACE_ZK_USER_PREFIX + namespace and self.zk_password:
            return self.zk_password
        return None


NO_SECURITY = SecuritySettings()


def role_zk_user(namespace: str, role: str) -> str:
    """`ns.<namespace>.<role>`: the ZooKeeper identity of a namespace role."""
    if role not in NAMESPACE_ZK_ROLES:
        raise ConfigError(f"unknown namespace role {role!r} (known: {', '.join(NAMESPACE_ZK_ROLES)})")
    return f"{NAMESPACE_ZK_USER_PREFIX}{namespace}.{role}"


def parse_role_zk_user(user: str) -> tuple[str, str] | None:
    """(namespace, role) of a role identity's user name, None for any other user."""
    if not user.startswith(NAMESPACE_ZK_USER_PREFIX):
        return None
    namespace, _, role = user[len(NAMESPACE_ZK_USER_PREFIX):].rpartition(".")
    if not namespace or role not in NAMESPACE_ZK_ROLES:
        return None
    return namespace, role


def derive_role_password(cluster_secret: bytes, namespace: str, role: str) -> str:
    digest = hmac.new(cluster_secret, b"dlog-zk-role\x00" + role.encode() + b"\x00" + namespace.encode(),
                      hashlib.sha256)
    return digest.hexdigest()[:ZK_PASSWORD_CHARS]


def derive_namespace_key(cluster_secret: bytes, namespace: str) -> str:
    """The key that seals a namespace's stream passwords (before role identities it was also the
    password of the identity `ns.<namespace>`, so streams sealed then still open)."""
    digest = hmac.new(cluster_secret, b"dlog-zk-namespace\x00" + namespace.encode(), hashlib.sha256)
    return digest.hexdigest()[:ZK_PASSWORD_CHARS]


def namespace_settings(cluster_secret: bytes, namespace: str, roles: list[str] | tuple[str, ...]) -> dict[str, object]:
    """The ZooKeeper part of a namespace principal's settings for its namespace `roles` (produce,
    consume, admin): zk_user/zk_password (the first identity), zk_identities (the rest), namespace_key."""
    wanted = [role for name in roles for role in ZK_ROLES_OF.get(name, ())]
    identities = [(role_zk_user(namespace, role), derive_role_password(cluster_secret, namespace, role))
                  for role in dict.fromkeys(wanted)]
    if not identities:
        raise ConfigError(f"no namespace role among {', '.join(roles) or 'none'}: give produce, consume or admin")
    return {"zk_user": identities[0][0], "zk_password": identities[0][1], "zk_identities": tuple(identities[1:]),
            "namespace_key": derive_namespace_key(cluster_secret, namespace)}


# ------------------------------------------------------------------------------ sealed passwords


def seal_new_password(seal_key: bytes | None) -> tuple[str, str]:
    """(what ZooKeeper stores, the password): sealed when a key is known, else clear (insecure)."""
    if seal_key is None:
        password = secrets.token_hex(16)
        return password, password
    nonce = secrets.token_hex(16)
    stored = SEALED_PREFIX + nonce
    return stored, unseal_password(stored, seal_key)


def unseal_password(stored: str, seal_key: bytes | None) -> str:
    if not stored.startswith(SEALED_PREFIX):
        return stored  # a stream made without security keeps its clear password
    if seal_key is None:
        raise ConfigError("this stream's password is sealed: its namespace's ZooKeeper credentials "
                          "are needed (zk_user/zk_password in client.toml, see --config)")
    nonce = stored[len(SEALED_PREFIX):]
    return hmac.new(seal_key, b"dlog-stream-password\x00" + nonce.encode(), hashlib.sha256).hexdigest()[:32]


# ------------------------------------------------------------------------------ client.toml


def read_toml(path: str | Path) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def config_path(path: str | Path | None = None) -> str | None:
    return str(path) if path else (os.environ.get(CONFIG_ENV) or None)


def load_cluster_table(path: str | Path | None = None) -> dict[str, Any]:
    """The [cluster] table (zk, zk_root) of client.toml, {} without a file."""
    found = config_path(path)
    if found is None:
        return {}
    table = read_toml(found).get("cluster", {})
    if not isinstance(table, dict):
        raise ConfigError(f"[cluster] in {found} must be a table")
    return table


def load_client_settings(path: str | Path | None = None, *, token: str | None = None) -> SecuritySettings:
    """Security settings from the [security] table of `path` (default $DLOG_CONFIG); `token` or
    $DLOG_TOKEN replace the file's token."""
    found = config_path(path)
    table: dict[str, Any] = {}
    if found is not None:
        table = read_toml(found).get("security", {})
        if not isinstance(table, dict):
            raise ConfigError(f"[security] in {found} must be a table")
        unknown = sorted(set(table) - SECURITY_KEYS)
        if unknown:
            raise ConfigError(f"unknown setting {', '.join(unknown)} in [security] of {found}; known: "
                              f"{', '.join(sorted(SECURITY_KEYS))}")
    base = Path(found).parent if found else Path(".")
    token = token or os.environ.get(TOKEN_ENV) or _text(table, "token", found) or None
    if token is None and table.get("token_file"):
        token = _read_secret(_resolve(base, table["token_file"]), "token")
    tls = None
    if table.get("ca_file") or table.get("tls") is True:
        tls = ClientTls(ca_file=_resolve(base, table["ca_file"]) if table.get("ca_file") else None,
                        check_hostname=bool(table.get("check_hostname", True)),
                        cert_file=_resolve(base, table["cert_file"]) if table.get("cert_file") else None,
                        key_file=_resolve(base, table["key_file"]) if table.get("key_file") else None)
    identities = _identities(table.get("zk_identities"), found)
    secret = None
    if table.get("cluster_secret_file"):
        secret = _read_secret(_resolve(base, table["cluster_secret_file"]), "cluster secret").encode()
    return SecuritySettings(
        tls=tls, token=token.strip() if token else None, zk_user=_text(table, "zk_user", found),
        zk_password=_text(table, "zk_password", found), zk_identities=identities,
        namespace_key=_text(table, "namespace_key", found), cluster_secret=secret,
        token_key_file=_resolve(base, table["token_key_file"]) if table.get("token_key_file") else None,
        source=found or "")


def _identities(value: object, path: str | None) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    rule = (f"zk_identities in [security] of {path} must be a list of at most {ZK_IDENTITIES_MAX} "
            "\"user:password\" strings")
    if not isinstance(value, list) or len(value) > ZK_IDENTITIES_MAX:
        raise ConfigError(rule)
    identities = []
    for item in value:
        user, colon, password = item.partition(":") if isinstance(item, str) else ("", "", "")
        if not (user and colon and password):
            raise ConfigError(rule)
        identities.append((user, password))
    return tuple(identities)


def _text(table: dict[str, Any], key: str, path: str | None) -> str | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key} in [security] of {path} must be a non-empty string")
    return value


def _resolve(base: Path, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"a file setting in [security] must be a path, got {value!r}")
    path = Path(value)
    return str(path if path.is_absolute() else base / path)


def _read_secret(path: str, what: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} file {path}: {exc.strerror}") from exc
