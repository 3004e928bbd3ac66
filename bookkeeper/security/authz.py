"""Principals, roles and the authorization decisions: pure functions with table tests.

Theory of operation. A connection (or HTTP request) authenticates once and becomes a
`Principal`: a name and a set of roles. A role is `admin` or `bookie` (cluster-wide), or
`produce`, `consume` or `admin` scoped to one namespace (written `produce:orders`). Every
request asks `decide(principal, action, namespace)`; the answer is `None` (allowed) or the
one-line reason it is refused. A ledger's namespace comes from its metadata (`custom`
"namespace"); a ledger without one belongs to no namespace, and only cluster admins (and
bookies, for recovery copies) act on it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from bookkeeper.errors import ConfigError

ROLE_ADMIN = "admin"
ROLE_BOOKIE = "bookie"
NAMESPACE_ROLES = ("produce", "consume", "admin")
ROLE_TEXT_MAX = 200
ROLES_MAX = 64


class Action(enum.Enum):
    ADD = "add"  # ADD, including recovery write-back
    WRITE_LAC = "write_lac"
    FENCE = "fence"  # a fencing READ: the first step of recovery
    CREATE_LEDGER = "create ledgers"  # CREATE_LEDGER: a bookie creates the metadata for a client
    READ = "read"  # READ and READ_LAC, long polls included
    BOOKIE_ADMIN = "bookie_admin"  # bookie state, GC, decommission
    METADATA_ADMIN = "metadata_admin"  # deleting ledgers and streams of any namespace
    REGISTER = "register"  # bookie registration and cookies
    INFO = "info"  # GET_BOOKIE_INFO, read-only admin pages
    SUBSCRIBE = "consume in groups"  # commit a subscription (a Kafka consumer group's offsets)


@dataclass(frozen=True, slots=True, order=True)
class Role:
    name: str  # produce | consume | admin | bookie
    namespace: str | None = None  # None: cluster-wide

    def __str__(self) -> str:
        return self.name if self.namespace is None else f"{self.name}:{self.namespace}"


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    roles: frozenset[Role]
    expires_s: float | None = None  # wall-clock expiry of the credential (token exp), if any

    @property
    def is_admin(self) -> bool:
        return Role(ROLE_ADMIN) in self.roles

    def describe(self) -> str:
        roles = ",".join(sorted(str(role) for role in self.roles)) or "no roles"
        return f"{self.name} ({roles})"


# who may act when a bookie or server runs without authentication (or allows anonymous by name)
ANONYMOUS = Principal("anonymous", frozenset({Role(ROLE_ADMIN)}))


def parse_role(text: str) -> Role:
    """`admin`, `bookie`, or `produce|consume|admin:<namespace>`; anything else is a ConfigError."""
    if not isinstance(text, str) or not text or len(text) > ROLE_TEXT_MAX:
        raise ConfigError(f"bad role {text!r}: write admin, bookie, or produce|consume|admin:NAMESPACE")
    name, separator, namespace = text.partition(":")
    if not separator:
        if name in (ROLE_ADMIN, ROLE_BOOKIE):
            return Role(name)
        raise ConfigError(f"bad role {text!r}: {name!r} needs a namespace (e.g. {name}:orders), "
                          "or use admin or bookie")
    if name not in NAMESPACE_ROLES or not namespace or any(ch in namespace for ch in "/:\0 "):
        raise ConfigError(f"bad role {text!r}: write produce|consume|admin:NAMESPACE")
    return Role(name, namespace)


def parse_roles(items: object) -> frozenset[Role]:
    if not isinstance(items, (list, tuple)) or len(items) > ROLES_MAX:
        raise ConfigError(f"roles must be a list of at most {ROLES_MAX} role strings")
    return frozenset(parse_role(item) for item in items)


# namespace-scoped actions and the namespace roles that grant them
_NAMESPACE_GRANTS: dict[Action, frozenset[str]] = {
    Action.ADD: frozenset({"produce", "admin"}),
    Action.CREATE_LEDGER: frozenset({"produce", "admin"}),
    Action.WRITE_LAC: frozenset({"produce", "admin"}),
    # a new writer recovers (fences) the previous segment; a namespace admin may recover too
    Action.FENCE: frozenset({"produce", "admin"}),
    Action.READ: frozenset({"consume", "produce", "admin"}),
    Action.METADATA_ADMIN: frozenset({"admin"}),
    # subscriptions are the consumers' (docs/security.md: a producer only reads them)
    Action.SUBSCRIBE: frozenset({"consume", "admin"}),
}
# what bookies may do: registration, and copies between bookies for re-replication
# FENCE: auto-recovery closes abandoned ledgers
_BOOKIE_GRANTS = frozenset({Action.REGISTER, Action.READ, Action.ADD, Action.FENCE, Action.INFO})


def decide(principal: Principal, action: Action, namespace: str | None = None) -> str | None:
    """None when `principal` may do `action` (on a ledger of `namespace`); else why not."""
    if principal.is_admin:
        return None
    if action is Action.INFO:
        return None  # any authenticated principal may ask who a bookie is
    if Role(ROLE_BOOKIE) in principal.roles and action in _BOOKIE_GRANTS:
        return None
    grants = _NAMESPACE_GRANTS.get(action)
    if grants is None:
        return f"{principal.describe()} may not {action.value}: it needs the admin role"
    if namespace is None:
        return (f"{principal.describe()} may not {action.value} a ledger that belongs to no "
                "namespace (only admins may)")
    if any(role.namespace == namespace and role.name in grants for role in principal.roles):
        return None
    needed = " or ".join(f"{name}:{namespace}" for name in sorted(grants))
    return f"{principal.describe()} may not {action.value} in namespace {namespace!r}: it needs {needed}"
