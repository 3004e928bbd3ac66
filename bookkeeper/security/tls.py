"""TLS contexts for the bookie protocol and the HTTP servers, from Python's `ssl`.

A server context carries the server's certificate and key and, when client certificates are
required (mutual TLS), the CA that must have signed them. A client context trusts the cluster CA
(or the system store), checks the server's host name or IP address against its certificate unless
told not to, and may present a client certificate. TLS 1.2 is the floor.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from bookkeeper.errors import ConfigError

TLS_RECORD_CONTENT_TYPES = frozenset({0x14, 0x15, 0x16, 0x17})  # first byte of a TLS record


@dataclass(frozen=True, slots=True)
class ServerTls:
    cert_file: str
    key_file: str
    ca_file: str | None = None  # CA of client certificates
    require_client_cert: bool = False

    def context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        _load_chain(context, self.cert_file, self.key_file)
        if self.ca_file:
            _load_ca(context, self.ca_file)
        if self.require_client_cert:
            if not self.ca_file:
                raise ConfigError("requiring client certificates needs the CA that signs them "
                                  "(--tls-ca FILE)")
            context.verify_mode = ssl.CERT_REQUIRED
        elif self.ca_file:
            context.verify_mode = ssl.CERT_OPTIONAL
        return context


@dataclass(frozen=True, slots=True)
class ClientTls:
    ca_file: str | None = None  # None: the system's trust store
    check_hostname: bool = True
    cert_file: str | None = None  # client certificate (mutual TLS)
    key_file: str | None = None

    def context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.ca_file:
            _load_ca(context, self.ca_file)
        else:
            context.load_default_certs()
        context.check_hostname = self.check_hostname
        context.verify_mode = ssl.CERT_REQUIRED
        if self.cert_file or self.key_file:
            if not (self.cert_file and self.key_file):
                raise ConfigError("a client certificate needs both cert_file and key_file")
            _load_chain(context, self.cert_file, self.key_file)
        return context


def _load_chain(context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    for what, path in (("certificate", cert_file), ("key", key_file)):
        if not Path(path).is_file():
            raise ConfigError(f"TLS {what} file {path} does not exist")
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"cannot load TLS certificate {cert_file} with key {key_file}: {exc}") from exc


def _load_ca(context: ssl.SSLContext, ca_file: str) -> None:
    if not Path(ca_file).is_file():
        raise ConfigError(f"TLS CA file {ca_file} does not exist")
    try:
        context.load_verify_locations(cafile=ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"cannot load TLS CA file {ca_file}: {exc}") from exc


def looks_like_tls(first_bytes: bytes) -> bool:
    """Whether a peer's first bytes are a TLS record (handshake or alert, version 3.x): what a
    plaintext client sees when it reached a TLS server, or a plaintext server from a TLS client."""
    return len(first_bytes) >= 2 and first_bytes[0] in TLS_RECORD_CONTENT_TYPES and first_bytes[1] == 3


def host_of(address: str) -> str:
    """The host part of `host:port` (IPv6 in brackets allowed)."""
    host = address.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or "localhost") only reaches this machine."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
