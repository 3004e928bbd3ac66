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
    cluster_secret_file = "..."         # admins only: derives namespaces' ZooKeeper credentials
    token_key_file = "..."              # admins only: signs tokens (dlog token create)

Shipped libraries read it themselves (`load_client_settings`), so `Namespace(...)` honours
`$DLOG_CONFIG` without the command-line tools. Stream passwords are sealed with a key derived from
the namespace's ZooKeeper credentials: what ZooKeeper stores ("sealed:v1:<nonce>") is useless
without them.
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

from bookkeeper.errors import ConfigError
from bookkeeper.security.tls import ClientTls

CONFIG_ENV = "DLOG_CONFIG"
TOKEN_ENV = "DLOG_TOKEN"
SECURITY_KEYS = frozenset({"ca_file", "check_hostname", "cert_file", "key_file", "token", "token_file",
                           "zk_user", "zk_password", "cluster_secret_file", "token_key_file", "tls"})
SEALED_PREFIX = "sealed:v1:"
NAMESPACE_ZK_USER_PREFIX = "ns."
ZK_PASSWORD_CHARS = 32


@dataclass(frozen=True, slots=True)
class SecuritySettings:
    tls: ClientTls | None = None
    token: str | None = None
    zk_user: str | None = None
    zk_password: str | None = None
    cluster_secret: bytes | None = None  # admins: derive any namespace's ZooKeeper credentials
    token_key_file: str | None = None  # admins: sign tokens
    source: str = ""  # where these came from, for messages

    @property
    def enabled(self) -> bool:
        return self.tls is not None or self.token is not None or self.zk_user is not None

    def zk_auth(self, namespace: str | None = None) -> list[tuple[str, str]]:
        """kazoo auth_data: our own credentials, plus the namespace's when we can derive them."""
        auth = []
        if self.zk_user and self.zk_password:
            auth.append(("digest", f"{self.zk_user}:{self.zk_password}"))
        credentials = self.namespace_credentials(namespace) if namespace else None
        if credentials is not None and credentials[0] != self.zk_user:
            auth.append(("digest", f"{credentials[0]}:{credentials[1]}"))
        return auth

    def namespace_credentials(self, namespace: str) -> tuple[str, str] | None:
        """(user, password) of a namespace's ZooKeeper identity, if we hold or can derive it."""
        user = namespace_zk_user(namespace)
        if self.zk_user == user and self.zk_password:
            return user, self.zk_password
        if self.cluster_secret is not None:
            return user, derive_namespace_password(self.cluster_secret, namespace)
        return None

    def seal_key(self, namespace: str) -> bytes | None:
        credentials = self.namespace_credentials(namespace)
        if credentials is None:
            return None
        return hmac.new(credentials[1].encode(), b"dlog-seal\x00" + namespace.encode(),
                        hashlib.sha256).digest()


NO_SECURITY = SecuritySettings()


def namespace_zk_user(namespace: str) -> str:
    return NAMESPACE_ZK_USER_PREFIX + namespace


def derive_namespace_password(cluster_secret: bytes, namespace: str) -> str:
    digest = hmac.new(cluster_secret, b"dlog-zk-namespace\x00" + namespace.encode(), hashlib.sha256)
    return digest.hexdigest()[:ZK_PASSWORD_CHARS]


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
    secret = None
    if table.get("cluster_secret_file"):
        secret = _read_secret(_resolve(base, table["cluster_secret_file"]), "cluster secret").encode()
    return SecuritySettings(
        tls=tls, token=token.strip() if token else None, zk_user=_text(table, "zk_user", found),
        zk_password=_text(table, "zk_password", found), cluster_secret=secret,
        token_key_file=_resolve(base, table["token_key_file"]) if table.get("token_key_file") else None,
        source=found or "")


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
