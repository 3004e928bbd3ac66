"""Which ACL each ZooKeeper node dlog creates gets (S3), and which ACLs a reader may trust.

Identities: the cluster admin (a ZooKeeper super user: no ACL binds it), the bookies (one digest
identity each, listed in `<bk>/security`), and per namespace one identity per role,
`ns.<ns>.produce`, `ns.<ns>.consume` and `ns.<ns>.admin` (P, C and A below; a namespace admin
also holds P and C). Nobody else may create, change or delete anything: the root and
`/zookeeper/quota` are locked too (`lock_down`, run by an admin once).

    /, /zookeeper/quota                 anyone: read (admins only may create)
    <bk> and the nodes below it         the bookies: all; anyone: read (registrations, cookies,
                                        ledger directories, the id counter, auto-recovery's marks)
    <bk>/quotas/<ns>                    the admin: all; anyone: read
    <bk>/ledgers/.../L<id>              the bookies: all; the namespace's P and A: read, write;
                                        anyone: read. Created by bookies only (CREATE_LEDGER), after
                                        checking that the asking principal may produce there
    /dlog                               the admin: all; anyone: read
    /dlog/<ns>                          the admin: all; P, C, A: read. Its data names the three
                                        identities' digest ids, so clients holding one role can
                                        give the others their rights on nodes they create
    /dlog/<ns>/streams[/<stream>]       A: all; P: read, create; C: read
      .../segments                      A: all; P: read, write, create, delete; C: read
      .../segments/<seq>, lock/<node>, sink/<id>   A: all; P: read, write; C: read
      .../lock                          A: all; P: read, create, delete; C: read
      .../sink                          A: all; P: read, create; C: read
      .../subscribers                   A: all; C: read, create; P: read
      .../subscribers/<name>            A: all; C: read, write; P: read

So a consumer can commit its subscriptions and nothing else; a producer can create streams and
write their segment lists, but neither delete a stream, change its config, delete a subscription
nor touch another namespace; ledger directories and the id counter belong to the cluster.

ZooKeeper checks a delete against the PARENT's ACL: whoever may delete under a ledger directory may
delete any ledger there, so only bookies and admins may. A ledger's writer deletes it by writing a
tombstone into its node (`TOMBSTONE`), and bookies' garbage collection removes the node.

Trust. ZooKeeper records no author, so what a node says is believed only as far as its ACL shows
who could have written it: bookie registrations must not be writable by anyone
(`world_writable`), and a ledger's namespace is believed only from a node whose ACL gives write
to bookies and to role identities of that one namespace, and the right to change the ACL to bookies
alone (`ledger_namespace_refusal`): a tenant can neither make a ledger claim another namespace nor
relabel its own.
"""

from __future__ import annotations

import json
from typing import Any

from kazoo.security import ACL, ANYONE_ID_UNSAFE, Id, Permissions, make_digest_acl_credential

from bookkeeper.meta import layout
from bookkeeper.security.settings import NAMESPACE_ZK_ROLES, SecuritySettings, parse_role_zk_user, role_zk_user

TOMBSTONE = b'{"deleted": true}'
READ, WRITE, CREATE, DELETE, ADMIN = (Permissions.READ, Permissions.WRITE, Permissions.CREATE,
                                      Permissions.DELETE, Permissions.ADMIN)
ALL = Permissions.ALL
WORLD_READ = ACL(READ, ANYONE_ID_UNSAFE)
NAMESPACE_ROOT_DEFAULT = "/dlog"
# the role -> permissions tables of a namespace's nodes, by the node's place below `<ns>/streams/<s>`
_STREAM_DIRECTORY = {"admin": ALL, "produce": READ | CREATE, "consume": READ}
_OWNED_BY = {
    "segments": ({"admin": ALL, "produce": READ | WRITE | CREATE | DELETE, "consume": READ},
                 {"admin": ALL, "produce": READ | WRITE, "consume": READ}),
    "lock": ({"admin": ALL, "produce": READ | CREATE | DELETE, "consume": READ},
             {"admin": ALL, "produce": READ | WRITE, "consume": READ}),
    "sink": ({"admin": ALL, "produce": READ | CREATE, "consume": READ},
             {"admin": ALL, "produce": READ | WRITE, "consume": READ}),
    "subscribers": ({"admin": ALL, "consume": READ | CREATE, "produce": READ},
                    {"admin": ALL, "consume": READ | WRITE, "produce": READ}),
}
_READ_ONLY = {"admin": ALL, "produce": READ, "consume": READ}
_NAMESPACE_NODE = {"admin": READ, "produce": READ, "consume": READ}
LEDGER_WRITER_ROLES = ("produce", "admin")


def digest_id(user: str, password: str) -> str:
    """The `user:base64(sha1(user:password))` id ZooKeeper's digest scheme compares."""
    return make_digest_acl_credential(user, password)


def digest_acl(identity: str, perms: int) -> ACL:
    return ACL(perms, Id("digest", identity))


def world_writable(acls: list[Any]) -> bool:
    """Whether anyone at all may change, create under or delete under a node with these ACLs."""
    risky = WRITE | CREATE | DELETE | ADMIN
    return any(acl.id.scheme == "world" and acl.perms & risky for acl in acls)


def user_of(identity: str) -> str:
    return identity.split(":", 1)[0]


class AclPolicy:
    """The ACL of every node a client with ZooKeeper credentials creates (see the table above)."""

    def __init__(self, user: str, password: str, bookkeeper_root: str = layout.DEFAULT_ROOT,
                 namespace_root: str = NAMESPACE_ROOT_DEFAULT,
                 namespace_roles: dict[str, dict[str, str]] | None = None) -> None:
        self.user = user
        self.own_id = digest_id(user, password)
        self.own = digest_acl(self.own_id, ALL)
        self.bookkeeper_root = bookkeeper_root
        self.namespace_root = namespace_root
        # namespace -> role -> digest id of that role's identity
        self.namespace_roles = {namespace: dict(roles) for namespace, roles in (namespace_roles or {}).items()}
        # the bookies' digest ids, learned from <bk>/security (which only bookies may write)
        self.bookie_ids: tuple[str, ...] = ()

    @classmethod
    def for_identity(cls, user: str, password: str, bookkeeper_root: str = layout.DEFAULT_ROOT) -> AclPolicy:
        return cls(user, password, bookkeeper_root)

    def learn_bookies(self, bookie_ids: list[str]) -> None:
        self.bookie_ids = tuple(sorted(set(bookie_ids)))

    def learn_namespace(self, namespace: str, published: dict[str, str]) -> None:
        """The role identities `/dlog/<ns>` names; those we hold ourselves are kept as they are."""
        known = self.namespace_roles.setdefault(namespace, {})
        for role, identity in published.items():
            if role in NAMESPACE_ZK_ROLES and user_of(identity) == role_zk_user(namespace, role):
                known.setdefault(role, identity)

    def ledger_writers(self, namespace: str | None) -> list[str]:
        """The digest ids a new ledger of `namespace` gives write to: its producers and admins."""
        if namespace is None:
            return []
        roles = self.namespace_roles.get(namespace, {})
        return [roles[role] for role in LEDGER_WRITER_ROLES if role in roles]

    def _bookies(self, perms: int = ALL) -> list[ACL]:
        return [digest_acl(bookie_id, perms) for bookie_id in self.bookie_ids]

    def cluster_owned(self) -> list[ACL]:
        """The bookies all, plus ourselves when we are not one of them (an admin), anyone read."""
        owners = self._bookies()
        if self.own_id not in self.bookie_ids:
            owners.insert(0, self.own)
        return [*owners, WORLD_READ]

    def acl_for(self, path: str, writers: list[str] | None = None) -> list[Any]:
        """`writers`: for a ledger node, the digest ids that may write it (`ledger_writers`)."""
        bk = self.bookkeeper_root
        if path == self.namespace_root:
            return [self.own, WORLD_READ]
        if path.startswith(self.namespace_root + "/"):
            return self._namespace_acl(path[len(self.namespace_root) + 1:].split("/"))
        ledgers = layout.ledgers_path(bk)
        if path.startswith(ledgers + "/") and path.rsplit("/", 1)[1].startswith("L"):
            writable = [digest_acl(identity, READ | WRITE) for identity in writers or ()
                        if identity not in self.bookie_ids]
            owners = self._bookies() or [self.own]
            return [*owners, *writable, WORLD_READ]
        if (path == bk or path.startswith(bk + "/")) and not path.startswith(layout.quotas_path(bk)):
            return self.cluster_owned()
        return [self.own, WORLD_READ]

    def _namespace_acl(self, parts: list[str]) -> list[Any]:
        namespace, below = parts[0], parts[1:]
        if not below:
            table = _NAMESPACE_NODE
        elif below == ["streams"] or len(below) == 2:
            table = _STREAM_DIRECTORY
        elif len(below) in (3, 4) and below[2] in _OWNED_BY:
            table = _OWNED_BY[below[2]][len(below) - 3]
        else:
            table = _READ_ONLY
        roles = self.namespace_roles.get(namespace, {})
        acls = [digest_acl(roles[role], perms) for role, perms in table.items() if role in roles]
        if not below or "admin" not in roles:
            # the namespace node is the admin's; and a node nobody else could ever change again
            # (its admin identity unknown here: a namespace made before role identities) stays ours
            acls.insert(0, self.own)
        return _merge(acls)


def _merge(acls: list[ACL]) -> list[ACL]:
    """One entry per id (ZooKeeper keeps duplicates): the union of their permissions."""
    merged: dict[tuple[str, str], int] = {}
    for acl in acls:
        key = (acl.id.scheme, acl.id.id)
        merged[key] = merged.get(key, 0) | acl.perms
    return [ACL(perms, Id(scheme, identity)) for (scheme, identity), perms in merged.items()]


def zk_options(settings: SecuritySettings, bookkeeper_root: str = layout.DEFAULT_ROOT,
               namespace: str | None = None, namespace_root: str = NAMESPACE_ROOT_DEFAULT) -> dict[str, Any]:
    """AsyncZooKeeper keyword arguments (auth, acl_policy) for a client with these settings; {}
    without ZooKeeper credentials (an open cluster)."""
    credentials = settings.zk_credentials()
    if not credentials:
        return {}
    roles = {}
    if namespace is not None:
        held = settings.role_identities(namespace)
        roles[namespace] = {role: digest_id(*identity) for role, identity in held.items()}
    policy = AclPolicy(*credentials[0], bookkeeper_root, namespace_root, roles)
    return {"auth": settings.zk_auth(), "acl_policy": policy}


def namespace_node_data(identities: dict[str, str]) -> bytes:
    """What `/dlog/<ns>` holds: the digest ids of the namespace's role identities."""
    return json.dumps({"identities": dict(sorted(identities.items()))}, sort_keys=True).encode()


def parse_namespace_node(data: bytes) -> dict[str, str]:
    try:
        found = json.loads(data).get("identities", {})
    except (ValueError, AttributeError):
        return {}
    return {role: identity for role, identity in found.items()
            if isinstance(role, str) and isinstance(identity, str)} if isinstance(found, dict) else {}


# ------------------------------------------------------------------------------ trust


def ledger_namespace_refusal(acls: list[Any], claimed: str | None, bookie_ids: tuple[str, ...]) -> str | None:
    """Why a ledger node with these ACLs cannot vouch that it belongs to namespace `claimed` (None
    when it can): only bookies may change its ACL, and besides bookies only role identities of one
    namespace may write it, the namespace it claims. A node only bookies can write is believed as
    it is: a bookie created it after checking the creator's role (CREATE_LEDGER)."""
    writers: set[str] = set()
    for acl in acls:
        scheme, identity = acl.id.scheme, acl.id.id
        if scheme == "world":
            if acl.perms & ~READ:
                return "anyone may change its metadata"
            continue
        if scheme == "digest" and identity in bookie_ids:
            continue
        if acl.perms & (ADMIN | DELETE | CREATE):
            return f"{user_of(identity)} may change its ACL"
        if not acl.perms & WRITE:
            continue
        parsed = parse_role_zk_user(user_of(identity)) if scheme == "digest" else None
        if parsed is None or parsed[1] not in LEDGER_WRITER_ROLES:
            return f"{scheme}:{user_of(identity)} may rewrite it"
        writers.add(parsed[0])
    if len(writers) > 1:
        return f"identities of {len(writers)} namespaces may write it"
    if writers and claimed not in writers:
        return f"it claims namespace {claimed!r} but only namespace {next(iter(writers))!r} may write it"
    return None


def directory_refusal(acls: list[Any], trusted_ids: tuple[str, ...]) -> str | None:
    """Why a ledger directory cannot hold a new ledger (None when it can): nobody but the cluster
    (bookies, and the admin who may have made it) may create, delete or change anything there."""
    for acl in acls:
        if acl.id.scheme == "world":
            if acl.perms & ~READ:
                return "anyone may create or delete there"
        elif not (acl.id.scheme == "digest" and acl.id.id in trusted_ids) and acl.perms & ~READ:
            return f"{acl.id.scheme}:{user_of(acl.id.id)} may create or delete there"
    return None


SECURITY_NODE = "security"


def security_path(bookkeeper_root: str) -> str:
    return f"{bookkeeper_root}/{SECURITY_NODE}"


def parse_bookie_ids(data: bytes) -> list[str]:
    try:
        found = json.loads(data).get("bookie_ids", [])
    except (ValueError, AttributeError):
        return []
    return [item for item in found if isinstance(item, str) and ":" in item]
