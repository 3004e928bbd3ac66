"""Which ACL each ZooKeeper node dlog creates gets (S3), for a session with digest credentials.

    <bk>, <bk>/available/*, <bk>/cookies/*, <bk>/INSTANCEID   creator (the bookie identity): all;
                                                             anyone: read
    <bk>/ledgers and its split directories                   the bookies: all; anyone: read, create
    <bk>/ledgers/.../L<id> (ledger metadata)                 creator: all; bookies: read, write
                                                             (re-replication); anyone: read
    <bk>/security                                            the bookies' digest ids (JSON)
    <bk>/idgen, <bk>/idgen/*                                 anyone: read, create, write (the id
                                                             counter; see docs/security.md)
    /dlog                                                    creator (an admin): all; anyone: read
    /dlog/<namespace>/...                                    the namespace's identity: all

ZooKeeper checks a delete against the PARENT's ACL, and the ledger split directories must let
every namespace create, so they cannot let anyone delete: a client without the bookie or admin
identity deletes a ledger by writing a tombstone into its node (`TOMBSTONE`, which its own ACL
allows), and bookies' garbage collection treats a tombstone as deleted metadata and removes the
node. Admins are ZooKeeper super users (`zookeeper.DigestAuthenticationProvider.superDigest`).
"""

from __future__ import annotations

from typing import Any

from kazoo.security import ACL, ANYONE_ID_UNSAFE, Permissions, make_acl, make_digest_acl, make_digest_acl_credential

from bookkeeper.meta import layout
from bookkeeper.security.settings import SecuritySettings

TOMBSTONE = b'{"deleted": true}'
WORLD_READ = ACL(Permissions.READ, ANYONE_ID_UNSAFE)
WORLD_READ_CREATE = ACL(Permissions.READ | Permissions.CREATE, ANYONE_ID_UNSAFE)
WORLD_COUNTER = ACL(Permissions.READ | Permissions.CREATE | Permissions.WRITE, ANYONE_ID_UNSAFE)


def digest_id(user: str, password: str) -> str:
    """The `user:base64(sha1(user:password))` id ZooKeeper's digest scheme compares."""
    return make_digest_acl_credential(user, password)


def world_writable(acls: list[Any]) -> bool:
    """Whether anyone at all may change, create under or delete under a node with these ACLs."""
    risky = Permissions.WRITE | Permissions.CREATE | Permissions.DELETE | Permissions.ADMIN
    return any(acl.id.scheme == "world" and acl.perms & risky for acl in acls)


class AclPolicy:
    def __init__(self, user: str, password: str, bookkeeper_root: str = layout.DEFAULT_ROOT,
                 namespace_root: str = "/dlog", namespace_identities: dict[str, tuple[str, str]] | None = None) -> None:
        self.user = user
        self.own = make_digest_acl(user, password, all=True)
        self.bookkeeper_root = bookkeeper_root
        self.namespace_root = namespace_root
        self.namespace_identities = dict(namespace_identities or {})
        # the bookies' digest ids, learned from <bk>/security (which only bookies may write):
        # they own the ledger directories (garbage collection deletes there) and may write
        # ledger metadata (re-replication)
        self.bookie_ids: tuple[str, ...] = ()

    @classmethod
    def for_identity(cls, user: str, password: str, bookkeeper_root: str = layout.DEFAULT_ROOT) -> AclPolicy:
        return cls(user, password, bookkeeper_root)

    def learn_bookies(self, bookie_ids: list[str]) -> None:
        self.bookie_ids = tuple(sorted(set(bookie_ids)))

    def _bookie_acls(self, **perms: bool) -> list[Any]:
        return [make_acl("digest", bookie_id, **perms) for bookie_id in self.bookie_ids]

    def acl_for(self, path: str) -> list[Any]:
        bk = self.bookkeeper_root
        if path == self.namespace_root:
            return [self.own, WORLD_READ]
        if path.startswith(self.namespace_root + "/"):
            namespace = path[len(self.namespace_root) + 1:].split("/", 1)[0]
            identity = self.namespace_identities.get(namespace)
            return [make_digest_acl(*identity, all=True)] if identity else [self.own]
        ledgers = layout.ledgers_path(bk)
        if path == ledgers or (path.startswith(ledgers + "/") and not path.rsplit("/", 1)[1].startswith("L")):
            # never the creator's own ALL: whoever may delete here may delete any ledger under it
            owners = [self.own] if path == ledgers else self._bookie_acls(all=True)
            return [*owners, WORLD_READ_CREATE]
        if path.startswith(ledgers + "/"):
            owners = [make_digest_acl(*identity, all=True) for identity in self.namespace_identities.values()]
            owners = [acl for acl in owners if acl.id != self.own.id]
            bookies = [acl for acl in self._bookie_acls(read=True, write=True) if acl.id != self.own.id]
            return [self.own, *owners, *bookies, WORLD_READ]
        if path == layout.idgen_path(bk) or path.startswith(layout.idgen_path(bk) + "/"):
            return [self.own, WORLD_COUNTER]
        return [self.own, WORLD_READ]


def zk_options(settings: SecuritySettings, bookkeeper_root: str = layout.DEFAULT_ROOT,
               namespace: str | None = None, namespace_root: str = "/dlog") -> dict[str, Any]:
    """AsyncZooKeeper keyword arguments (auth, acl_policy) for a client with these settings; {}
    without ZooKeeper credentials (an open cluster)."""
    if not (settings.zk_user and settings.zk_password):
        return {}
    identities = {}
    if namespace is not None:
        credentials = settings.namespace_credentials(namespace)
        if credentials is not None:
            identities[namespace] = credentials
    policy = AclPolicy(settings.zk_user, settings.zk_password, bookkeeper_root, namespace_root, identities)
    return {"auth": settings.zk_auth(namespace), "acl_policy": policy}


SECURITY_NODE = "security"


def security_path(bookkeeper_root: str) -> str:
    return f"{bookkeeper_root}/{SECURITY_NODE}"


def parse_bookie_ids(data: bytes) -> list[str]:
    import json

    try:
        found = json.loads(data).get("bookie_ids", [])
    except (ValueError, AttributeError):
        return []
    return [item for item in found if isinstance(item, str) and ":" in item]
