"""How a bookie's auto-recovery reaches its peers (`bookkeeper.bookie.service.peer_security`): with
what its own security allows, never with less than its peers require."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bookkeeper.bookie.guard import ServerSecurity
from bookkeeper.bookie.service import peer_security
from bookkeeper.security.authz import Role
from bookkeeper.security.tls import ServerTls
from bookkeeper.security.tokens import TokenKey, TokenVerifier

TLS = ServerTls("bookie.pem", "bookie.key", "ca.pem")
HS256 = TokenKey("HS256", b"s" * 32)


def test_an_hs256_bookie_signs_itself_a_bookie_token_and_keeps_its_certificate_home():
    settings = peer_security(ServerSecurity(tls=TLS, token_key=HS256), "b1")
    assert settings.token is not None
    principal = TokenVerifier(HS256).verify(settings.token)
    assert principal.roles == frozenset({Role("bookie")})
    assert settings.tls is not None and settings.tls.ca_file == "ca.pem" and settings.tls.cert_file is None


def test_mutual_tls_peers_get_the_certificate_too():
    required = ServerTls("bookie.pem", "bookie.key", "ca.pem", require_client_cert=True)
    settings = peer_security(ServerSecurity(tls=required, token_key=HS256), "b1")
    assert settings.token is not None and settings.tls is not None
    assert (settings.tls.cert_file, settings.tls.key_file) == ("bookie.pem", "bookie.key")


def test_a_public_key_bookie_cannot_sign_so_its_certificate_authenticates():
    public = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    settings = peer_security(ServerSecurity(tls=TLS, token_key=TokenKey("ES256", public)), "b1")
    assert settings.token is None
    assert settings.tls is not None and settings.tls.cert_file == "bookie.pem"


def test_an_open_bookie_reaches_open_peers():
    settings = peer_security(ServerSecurity(), "b1")
    assert settings.token is None and settings.tls is None and not settings.enabled
