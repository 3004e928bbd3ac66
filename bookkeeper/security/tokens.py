"""Signed tokens (JWT through PyJWT): HS256 with a shared secret, RS256 / ES256 with key pairs.

A token's claims: `sub` (the principal's name), `roles` (see authz.py), `iss` "dlog", `iat` and,
unless made without expiry, `exp`. Verification checks the signature with the one configured
algorithm (never the algorithm the token names: no "none", no HS256 with a public key), the
issuer, expiry and the roles; any failure is one AuthenticationError line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bookkeeper.clock import wall_ms
from bookkeeper.errors import AuthenticationError, ConfigError
from bookkeeper.security.authz import Principal, Role, parse_roles

ISSUER = "dlog"
ALGORITHMS = ("HS256", "RS256", "ES256")
HS256_SECRET_BYTES_MIN = 32
TOKEN_BYTES_MAX = 8192
LEEWAY_S = 5


@dataclass(frozen=True, slots=True)
class TokenKey:
    """The key that signs or verifies tokens: an HS256 secret, or a PEM key for RS256/ES256
    (private to sign, public or private to verify)."""

    algorithm: str
    key: bytes

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"token algorithm {self.algorithm!r} is not supported (use one of "
                              f"{', '.join(ALGORITHMS)})")
        if self.algorithm == "HS256" and len(self.key) < HS256_SECRET_BYTES_MIN:
            raise ConfigError(f"an HS256 token secret needs at least {HS256_SECRET_BYTES_MIN} bytes, "
                              f"got {len(self.key)}")

    @classmethod
    def from_file(cls, path: str | Path, algorithm: str | None = None) -> TokenKey:
        """A key file: PEM (algorithm from the key type unless given) or a raw HS256 secret."""
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read token key file {path}: {exc.strerror}") from exc
        if algorithm is None:
            if b"-----BEGIN" not in data:
                algorithm = "HS256"
            else:
                algorithm = "ES256" if b"EC " in data or _is_ec(data) else "RS256"
        return cls(algorithm, data.strip() if algorithm == "HS256" else data)

    def verifying_key(self) -> bytes | object:
        if self.algorithm == "HS256":
            return self.key
        from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key
        if b"PRIVATE KEY" in self.key:
            return load_pem_private_key(self.key, None).public_key()
        return load_pem_public_key(self.key)


def _is_ec(pem: bytes) -> bool:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key

    try:
        key = load_pem_private_key(pem, None) if b"PRIVATE KEY" in pem else load_pem_public_key(pem)
    except ValueError as exc:
        raise ConfigError(f"token key is not a valid PEM key: {exc}") from exc
    return isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey))


def create_token(key: TokenKey, subject: str, roles: list[str], *, ttl_s: float | None = None,
                 now_s: float | None = None) -> str:
    """A signed token for `subject` with `roles` (checked), valid `ttl_s` (None: no expiry)."""
    if not subject or len(subject) > 200:
        raise ConfigError(f"bad token subject {subject!r}: 1..200 characters")
    parse_roles(roles)
    issued_s = wall_ms() // 1000 if now_s is None else int(now_s)
    claims: dict[str, object] = {"sub": subject, "roles": sorted(roles), "iss": ISSUER, "iat": issued_s}
    if ttl_s is not None:
        if ttl_s <= 0:
            raise ConfigError(f"token lifetime must be > 0 s, got {ttl_s}")
        claims["exp"] = issued_s + int(ttl_s)
    import jwt  # here, not at the top: PyJWT loads cryptography, which a bookie without tokens never needs

    return jwt.encode(claims, key.key, algorithm=key.algorithm)


class TokenVerifier:
    def __init__(self, key: TokenKey) -> None:
        self.key = key
        self._verifying = key.verifying_key()

    def verify(self, token: str | bytes) -> Principal:
        """The principal a valid token names; AuthenticationError says why one is refused."""
        if isinstance(token, bytes):
            try:
                token = token.decode("ascii")
            except UnicodeDecodeError:
                raise AuthenticationError("token is not ASCII text") from None
        if not token or len(token) > TOKEN_BYTES_MAX:
            raise AuthenticationError(f"token is empty or longer than {TOKEN_BYTES_MAX} bytes")
        import jwt  # loaded with the first token (see create_token)

        try:
            claims = jwt.decode(token, self._verifying, algorithms=[self.key.algorithm],  # type: ignore[arg-type]
                                issuer=ISSUER, leeway=LEEWAY_S,
                                options={"require": ["sub", "iss", "iat"]})
        except jwt.ExpiredSignatureError:
            raise AuthenticationError("token expired: ask for a new one (dlog token create)") from None
        except jwt.InvalidSignatureError:
            raise AuthenticationError("token signature is invalid (tampered, or signed by another "
                                      "key)") from None
        except jwt.PyJWTError as exc:
            raise AuthenticationError(f"token refused: {exc}") from None
        try:
            roles = parse_roles(claims.get("roles", []))
        except ConfigError as exc:
            raise AuthenticationError(f"token refused: {exc}") from None
        subject = claims["sub"]
        if not isinstance(subject, str) or not subject:
            raise AuthenticationError("token refused: its subject is not a name")
        expires = claims.get("exp")
        return Principal(subject, roles, float(expires) if isinstance(expires, (int, float)) else None)


def certificate_principal(peer_certificate: dict[str, Any] | None) -> Principal:
    """The principal of a verified TLS client certificate: its subject's common name, and roles
    from its organizational unit entries written `dlog-role=<role>` (as BookKeeper's certificate
    roles come from the OU)."""
    if not peer_certificate:
        raise AuthenticationError("no verified client certificate on this connection (the bookie "
                                  "must require client certificates for certificate authentication)")
    name = ""
    roles: list[str] = []
    for rdn in peer_certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                name = value
            elif key == "organizationalUnitName" and value.startswith("dlog-role="):
                roles.append(value.split("=", 1)[1])
    if not name:
        raise AuthenticationError("client certificate has no common name")
    try:
        parsed: frozenset[Role] = parse_roles(roles)
    except ConfigError as exc:
        raise AuthenticationError(f"client certificate refused: {exc}") from None
    return Principal(f"cert:{name}", parsed)
