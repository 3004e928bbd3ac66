"""What a bookie reads and writes in ledger metadata for its clients: which namespace a ledger
belongs to (as far as ZooKeeper's ACLs let anyone tell), and CREATE_LEDGER.

Theory of operation. On a cluster with ZooKeeper ACLs only bookies and admins create ledger
nodes (bookkeeper/meta/acl.py), so a bookie creates them for its clients: the guard has checked
that the principal may produce in the namespace the metadata names and that the writer ids are
that namespace's; here the id is allocated and the node created with the bookies owning it and
the writers allowed to write. At most `creates_pending_max` creations run at once; beyond that a
request is refused with TOO_MANY_REQUESTS (the client tries another bookie or again later).

A ledger's namespace decides who may read and write it, so it is believed only from a node whose
ACL proves who could have written it (`acl.ledger_namespace_refusal`): a tenant that could
rewrite its own ledger's namespace could count its bytes against another namespace's quota or read
another's data. The bookies' digest ids come from `<bk>/security`, watched.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from bookkeeper.errors import CorruptMetadataError, DlogError, ForbiddenError, MetadataError, NoSuchLedgerError
from bookkeeper.meta import layout
from bookkeeper.meta.acl import TOMBSTONE, ledger_namespace_refusal, parse_bookie_ids, security_path
from bookkeeper.protocol.create import CreateLedgerRequest, CreateLedgerResponse
from bookkeeper.protocol.metadata import LedgerMetadata
from bookkeeper.protocol.wire import ErrorResponse, OpCode, Status, encode_response

if TYPE_CHECKING:
    from bookkeeper.meta.zk import AsyncZooKeeper

log = logging.getLogger(__name__)
CREATES_PENDING_MAX = 64


class LedgerMetadataAccess:
    def __init__(self, zk: AsyncZooKeeper | None, root: str, creates_pending_max: int = CREATES_PENDING_MAX) -> None:
        self.zk = zk
        self.root = root
        self.creates_pending_max = creates_pending_max
        self.creates_pending = 0
        self.created = 0
        self.untrusted = 0  # ledger nodes whose ACL could not vouch for their namespace
        self._store: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._unwatch: Any = None

    async def start(self) -> None:
        if self.zk is None:
            return
        from bookkeeper.meta.zkstore import ZooKeeperMetadataStore

        self._store = ZooKeeperMetadataStore(self.zk, self.root)
        if self.zk.acl_policy is not None:
            policy = self.zk.acl_policy
            self._unwatch = self.zk.watch_data(
                security_path(self.root),
                lambda data, version: policy.learn_bookies(parse_bookie_ids(data) if data else []))

    async def stop(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def bookie_ids(self) -> tuple[str, ...]:
        policy = self.zk.acl_policy if self.zk is not None else None
        return policy.bookie_ids if policy is not None else ()

    # ------------------------------------------------------------------ namespaces

    async def namespace_and_stream(self, ledger_id: int) -> tuple[str | None, str | None]:
        """(namespace, stream) the ledger's metadata names; NoSuchLedgerError without metadata,
        ForbiddenError when its ACL cannot vouch for the namespace it claims."""
        if self.zk is None:
            raise NoSuchLedgerError(f"ledger {ledger_id}: this bookie has no ZooKeeper to look it up")
        path = layout.ledger_path(self.root, ledger_id)
        found = await self.zk.get_or_none(path)
        if found is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} has no metadata")
        if found[0] == TOMBSTONE:
            raise NoSuchLedgerError(f"ledger {ledger_id} was deleted")
        custom = dict(LedgerMetadata.from_bytes(found[0]).custom)
        namespace = custom.get("namespace")
        if self.zk.acl_policy is not None:
            refusal = ledger_namespace_refusal(await self.zk.get_acls(path), namespace, self.bookie_ids)
            if refusal is not None:
                self.untrusted += 1
                raise ForbiddenError(f"ledger {ledger_id}'s metadata cannot vouch for its namespace "
                                     f"{namespace!r}: {refusal} (a ledger is believed only as created by "
                                     "a bookie; see docs/security.md)")
        return namespace, custom.get("stream")

    # ------------------------------------------------------------------ CREATE_LEDGER

    def on_create_ledger(self, request: CreateLedgerRequest, connection: Any) -> None:
        """Run an authorized CREATE_LEDGER (the guard checked the principal and writer ids)."""
        if self._store is None:
            _refuse(connection, request, Status.BAD_REQUEST,
                    "this bookie has no ZooKeeper (--zk): it cannot create ledgers")
            return
        if self.creates_pending >= self.creates_pending_max:
            _refuse(connection, request, Status.TOO_MANY_REQUESTS,
                    f"{self.creates_pending} ledger creations already run here (creates_pending_max "
                    f"{self.creates_pending_max}): try another bookie or again later")
            return
        self.creates_pending += 1
        task = asyncio.get_running_loop().create_task(self._create(request, connection))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _create(self, request: CreateLedgerRequest, connection: Any) -> None:
        try:
            metadata = LedgerMetadata.from_bytes(request.metadata)
            ledger_id, _version = await self._store.create_ledger(metadata, list(request.writers))
        except CorruptMetadataError as exc:
            _refuse(connection, request, Status.BAD_REQUEST, f"the ledger metadata is not valid: {exc}")
            return
        except (MetadataError, DlogError) as exc:
            log.warning("CREATE_LEDGER for %s failed: %s", connection.peer, exc)
            _refuse(connection, request, Status.TOO_MANY_REQUESTS, f"cannot create the ledger now: {exc}")
            return
        finally:
            self.creates_pending -= 1
        self.created += 1
        if not connection.closed:
            connection.send(encode_response(CreateLedgerResponse(request.request_id, ledger_id)))
            connection.request_done()


def _refuse(connection: Any, request: CreateLedgerRequest, status: Status, message: str) -> None:
    if connection.closed:
        return
    connection.send(encode_response(ErrorResponse(request.request_id, OpCode.CREATE_LEDGER, status, message)))
    connection.request_done()
