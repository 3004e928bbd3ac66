"""SASL on the Kafka port, sans-IO: which mechanisms a server offers, and the dlog token a client's
first (and only) SASL message carries. No sockets, no clock, no token verification here: the
server verifies the token with the cluster's one verifier (`bookkeeper.security.tokens`).

- PLAIN (RFC 4616): `authzid NUL authcid NUL passwd`; the password is a dlog token, the user name
  anything (a client usually writes the token's subject). An authorization identity other than
  empty or the user name is refused (dlog does not act on behalf of another principal).
- OAUTHBEARER (RFC 7628): the GS2 header `n,` (with an optional `a=<authzid>,`), then
  `\\x01`-separated `key=value` pairs ending in `\\x01\\x01`; `auth=Bearer <token>` carries the
  token. What clients send: `n,,\\x01auth=Bearer <token>\\x01\\x01`.

A message that is not one of these is a `SaslRefused` with one line saying what was wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

PLAIN, OAUTHBEARER = "PLAIN", "OAUTHBEARER"
MECHANISMS = (PLAIN, OAUTHBEARER)
SASL_BYTES_MAX = 16 * 1024  # one client message: a token (8 KiB at most) and its framing
_BEARER = "Bearer "


@dataclass(frozen=True, slots=True)
class SaslRefused:
    reason: str


@dataclass(frozen=True, slots=True)
class SaslCredentials:
    token: str
    user: str | None  # PLAIN's user name (what the client called itself), None for OAUTHBEARER


def client_credentials(mechanism: str, message: bytes) -> SaslCredentials | SaslRefused:
    """The token in a client's SASL message for `mechanism` (one of MECHANISMS), or why not."""
    if len(message) > SASL_BYTES_MAX:
        return SaslRefused(f"{mechanism} message of {len(message)} bytes is over {SASL_BYTES_MAX} bytes")
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        return SaslRefused(f"{mechanism} message is not UTF-8")
    if mechanism == PLAIN:
        return _plain(text)
    if mechanism == OAUTHBEARER:
        return _oauthbearer(text)
    return SaslRefused(f"mechanism {mechanism!r} is not offered (offered: {', '.join(MECHANISMS)})")


def _plain(text: str) -> SaslCredentials | SaslRefused:
    parts = text.split("\0")
    if len(parts) != 3:
        return SaslRefused("PLAIN message is not authzid NUL user NUL password")
    authzid, user, password = parts
    if not user or not password:
        return SaslRefused("PLAIN message has an empty user name or password (the password is a dlog token)")
    if authzid and authzid != user:
        return SaslRefused(f"PLAIN authorization identity {authzid!r} differs from the user name: refused")
    return SaslCredentials(password, user)


def _oauthbearer(text: str) -> SaslCredentials | SaslRefused:
    header, separator, rest = text.partition("\x01")
    if not separator or not rest.endswith("\x01\x01"):
        return SaslRefused("OAUTHBEARER message is not a GS2 header and \\x01-separated pairs ending in \\x01\\x01")
    gs2 = header.split(",")
    if len(gs2) != 3 or gs2[0] not in ("n", "y") or (gs2[1] and not gs2[1].startswith("a=")) or gs2[2]:
        return SaslRefused("OAUTHBEARER message's GS2 header is not 'n,,' or 'n,a=<authzid>,'")
    token = None
    for pair in rest[:-2].split("\x01"):
        key, equals, value = pair.partition("=")
        if not equals:
            return SaslRefused("OAUTHBEARER message has a pair without '='")
        if key == "auth":
            if not value.startswith(_BEARER) or not value[len(_BEARER):].strip():
                return SaslRefused("OAUTHBEARER auth value is not 'Bearer <token>'")
            token = value[len(_BEARER):].strip()
    if token is None:
        return SaslRefused("OAUTHBEARER message has no auth=Bearer <token> pair")
    return SaslCredentials(token, None)
