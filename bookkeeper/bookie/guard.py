"""Who is on each bookie connection, and what it may do: the AUTH exchange and the per-request
authorization (S1, S2).

Theory of operation. A bookie with security on requires AUTH (opcode 6) as the first request of
every connection: a signed token, or the connection's verified TLS client certificate. Until then
any other request is answered UNAUTHENTICATED and the connection is closed (a client that does not
know AUTH learns why in one line). Every later request is checked by `dispatch`: READ and READ_LAC
need consume (or produce) rights on the ledger's namespace, ADD and WRITE_LAC produce rights, a
fencing READ produce rights; the namespace is the `namespace` of the ledger's metadata in
ZooKeeper, looked up once and cached (bounded). A request for a ledger without metadata is refused:
a bookie never creates a ledger because a peer asked (the fencing READ or ADD that used to do so
let anyone squat a ledger id under their own key). While a ledger's lookup runs, its requests wait
in arrival order; lookups are bounded in number.

`authenticate` and `authorize` are separate so a batched frame can run them once per frame.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from bookkeeper.bookie.config import ServerSecurity
from bookkeeper.bookie.refusals import RateLimitedLog
from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.errors import AuthenticationError, CorruptMetadataError, DlogError, ForbiddenError, NoSuchLedgerError
from bookkeeper.protocol.batch import AddBatchRequest, ReadRangeRequest
from bookkeeper.protocol.create import CreateLedgerRequest
from bookkeeper.protocol.metadata import LedgerMetadata
from bookkeeper.protocol.wire import (
    AddRequest,
    AuthMechanism,
    AuthRequest,
    AuthResponse,
    BookieInfoRequest,
    CheckEntriesRequest,
    ErrorResponse,
    OpCode,
    ReadLacRequest,
    ReadRequest,
    Status,
    WriteLacRequest,
    encode_response,
)
from bookkeeper.security.authz import ANONYMOUS, ROLE_ADMIN, ROLE_BOOKIE, Action, Principal, Role, decide
from bookkeeper.security.quota import UNLIMITED, Quota, StreamSlots, TokenBucket
from bookkeeper.security.settings import parse_role_zk_user
from bookkeeper.security.tokens import TokenVerifier, certificate_principal

log = logging.getLogger(__name__)
NAMESPACE_CACHE_MAX = 100_000
LOOKUPS_PENDING_MAX = 10_000  # requests waiting for a ledger's metadata, over all connections
QUOTA_REFRESH_S = 10.0  # a namespace's quota is read again this long after it was read
QUOTAS_CACHED_MAX = 10_000
_MISSING = object()


class Connection(Protocol):
    principal: Principal | None
    closed: bool

    def send(self, frame: bytes) -> None: ...

    def request_done(self) -> None: ...

    def close_after_answer(self) -> None: ...

    def peer_certificate(self) -> dict[str, Any] | None: ...

    def throttle(self, delay_s: float) -> None: ...

    @property
    def peer(self) -> str: ...


def action_of(request: Any) -> Action:
    kind = type(request)
    if kind is AddRequest or kind is AddBatchRequest:
        return Action.ADD
    if kind is ReadRequest or kind is ReadRangeRequest:
        return Action.FENCE if request.fence else Action.READ
    if kind is ReadLacRequest or kind is CheckEntriesRequest:
        return Action.READ  # a replica check reveals what a read would
    if kind is WriteLacRequest:
        return Action.WRITE_LAC
    if kind is CreateLedgerRequest:
        return Action.CREATE_LEDGER
    return Action.INFO


class Guard:
    def __init__(self, security: ServerSecurity, handlers: dict[type, Callable[[Any, Any], None]],
                 lookup: Callable[[int], Awaitable[str | None]] | None,
                 knows_ledger: Callable[[int], bool],
                 cache_max: int = NAMESPACE_CACHE_MAX, pending_max: int = LOOKUPS_PENDING_MAX,
                 quota_lookup: Callable[[str], Awaitable[Quota]] | None = None,
                 stream_of: Callable[[int], str | None] | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        """`stream_of`: the stream a ledger's metadata names, once `lookup` read it (None: unknown).
        `clock`: what token expiry, quota refreshes and write-rate buckets are measured on."""
        self.security = security
        self.clock = clock
        self.handlers = handlers
        self._lookup = lookup
        self._knows_ledger = knows_ledger
        self._verifier = TokenVerifier(security.token_key) if security.token_key else None
        self.cache_max = cache_max
        self.pending_max = pending_max
        self._namespaces: dict[int, str | None] = {}
        self._waiting: dict[int, list[tuple[Any, Connection]]] = {}
        self._waiting_count = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._quota_lookup = quota_lookup
        # namespace -> (quota, when read, its write bucket); refreshed in the background
        self._quotas: dict[str, tuple[Quota, float, TokenBucket | None]] = {}
        self._quota_reads: set[str] = set()
        self.auth_failures = 0
        self.forbidden = 0
        self.lookups = 0
        self.throttled = 0
        self.stored_usage: dict[str, int] = {}  # namespace -> bytes on all bookies (set_stored_usage)
        self.stream_slots = StreamSlots()
        self._stream_of = stream_of
        self.quota_refusals = 0
        self.refusals = RateLimitedLog(log, clock=clock)  # at most one line per reason per 10 s (S4)

    # ------------------------------------------------------------------ authentication

    def authenticate(self, request: AuthRequest, connection: Connection) -> None:
        try:
            principal = self._principal_of(request, connection)
        except AuthenticationError as exc:
            self.auth_failures += 1
            self.refusals.warning("auth", "AUTH from %s refused: %s", connection.peer, exc)
            self._refuse(connection, request.request_id, OpCode.AUTH, Status.UNAUTHENTICATED, str(exc),
                         close=True)
            return
        connection.principal = principal
        connection.send(encode_response(AuthResponse(request.request_id, principal.name)))
        connection.request_done()

    def _principal_of(self, request: AuthRequest, connection: Connection) -> Principal:
        if request.mechanism == AuthMechanism.TOKEN:
            if self._verifier is None:
                raise AuthenticationError("this bookie takes no tokens (it authenticates TLS client "
                                          "certificates: use mechanism CERTIFICATE)")
            return self._verifier.verify(request.credentials)
        if request.mechanism == AuthMechanism.CERTIFICATE:
            return certificate_principal(connection.peer_certificate())
        raise AuthenticationError(f"unknown AUTH mechanism {request.mechanism} (known: 1 token, "
                                  "2 certificate)")

    # ------------------------------------------------------------------ every request

    def dispatch(self, request: Any, connection: Connection) -> None:
        if type(request) is AuthRequest:
            self.authenticate(request, connection)
            return
        principal = connection.principal
        if principal is None:
            if self.security.requires_auth:
                self.auth_failures += 1
                self._refuse(connection, request.request_id, _opcode(request), Status.UNAUTHENTICATED,
                             "this bookie requires AUTH (opcode 6, protocol.md) before any other "
                             "request: configure a token or client certificate (client.toml)", close=True)
                return
            principal = connection.principal = ANONYMOUS
        if principal.expires_s is not None and self.clock.wall_ms() / 1000 > principal.expires_s:
            self.auth_failures += 1
            self._refuse(connection, request.request_id, _opcode(request), Status.UNAUTHENTICATED,
                         "token expired during the connection: reconnect with a new one", close=True)
            return
        action = action_of(request)
        if action is Action.INFO:
            self.handlers[type(request)](request, connection)
            return
        if type(request) is AddBatchRequest:
            self._dispatch_batch(request, connection, principal)
            return
        if type(request) is CreateLedgerRequest:
            self._dispatch_create(request, connection, principal)
            return
        ledger_id = request.ledger_id
        if principal.is_admin and (self._knows_ledger(ledger_id)
                                   or action not in (Action.ADD, Action.FENCE)):
            self.handlers[type(request)](request, connection)
            return
        namespace = self._namespaces.get(ledger_id, _MISSING)
        if namespace is _MISSING:
            self._wait_for_lookup(ledger_id, request, connection)
            return
        self.authorize(request, connection, action, namespace)  # type: ignore[arg-type]

    def authorize(self, request: Any, connection: Connection, action: Action, namespace: str | None) -> None:
        """Run the request if the connection's principal may act on `namespace`; else refuse it."""
        reason = decide(connection.principal or ANONYMOUS, action, namespace)
        if reason is not None:
            self.forbidden += 1
            self._refuse(connection, request.request_id, _opcode(request), Status.FORBIDDEN,
                         f"ledger {request.ledger_id}: {reason}")
            return
        if action is Action.ADD and namespace is not None and self._quota_lookup is not None:
            exempt = request.recovery and _copies_for_the_cluster(connection.principal)
            over = None if exempt else self.over_quota(namespace, request.ledger_id)
            if over is not None:
                self._refuse(connection, request.request_id, _opcode(request), Status.QUOTA_EXCEEDED, over)
                return
            self._pace(namespace, len(request.packed_entry), connection)
        self.handlers[type(request)](request, connection)

    # ------------------------------------------------------------------ ADD_BATCH

    def _dispatch_batch(self, request: AddBatchRequest, connection: Connection, principal: Principal) -> None:
        """Authorize an ADD_BATCH once per ledger of the frame (not per entry): the groups of a
        ledger the principal may not write are refused in the batch's one answer, the rest run.
        Ledgers whose namespace is not known yet are looked up first; the frame waits for all."""
        missing = {group.ledger_id for group in request.groups
                   if group.ledger_id >= 0 and group.ledger_id not in self._namespaces
                   and not (principal.is_admin and self._knows_ledger(group.ledger_id))}
        if not missing:
            self._authorize_batch(request, connection, {})
            return
        if self._lookup is None or self._waiting_count + len(missing) > self.pending_max:
            why = ("this bookie cannot check ledger metadata" if self._lookup is None else
                   f"{self._waiting_count} requests already wait for ledger metadata (maximum "
                   f"{self.pending_max})")
            self._refuse(connection, request.request_id, OpCode.ADD_BATCH,
                         Status.NO_LEDGER if self._lookup is None else Status.TOO_MANY_REQUESTS, why)
            return
        wait = _BatchWait(request, connection, missing)
        for ledger_id in sorted(missing):
            self._wait_for_lookup(ledger_id, wait, connection)

    def _batch_lookup_done(self, wait: _BatchWait, ledger_id: int, outcome: Any) -> None:
        wait.outcomes[ledger_id] = outcome
        if len(wait.outcomes) == len(wait.missing) and not wait.connection.closed:
            self._authorize_batch(wait.request, wait.connection, wait.outcomes)

    def _authorize_batch(self, request: AddBatchRequest, connection: Connection,
                         looked_up: dict[int, Any]) -> None:
        principal = connection.principal or ANONYMOUS
        refusals: dict[int, tuple[Status, str]] = {}
        decided: dict[int, tuple[Status, str] | None] = {}
        paced: dict[str, int] = {}
        for index, group in enumerate(request.groups):
            ledger_id = group.ledger_id
            if ledger_id not in decided:
                decided[ledger_id] = self._batch_verdict(principal, ledger_id, looked_up)
            verdict = decided[ledger_id]
            if verdict is not None:
                refusals[index] = verdict
                continue
            namespace = self._namespaces.get(ledger_id)
            exempt = group.recovery and _copies_for_the_cluster(principal)
            if namespace is not None and self._quota_lookup is not None and not exempt:
                over = self.over_quota(namespace, ledger_id)
                if over is not None:
                    refusals[index] = (Status.QUOTA_EXCEEDED, over)
                    continue
            if namespace is not None:
                paced[namespace] = paced.get(namespace, 0) + sum(map(len, group.entries))
        if self._quota_lookup is not None:
            for namespace, size_bytes in paced.items():
                self._pace(namespace, size_bytes, connection)
        self.handlers[AddBatchRequest](request, connection, refusals)  # type: ignore[call-arg]

    def _batch_verdict(self, principal: Principal, ledger_id: int,
                       looked_up: dict[int, Any]) -> tuple[Status, str] | None:
        """None when the principal may add to the ledger; else the status and reason."""
        if ledger_id < 0 or (principal.is_admin and self._knows_ledger(ledger_id)):
            return None  # a bad id is the core's to refuse (BAD_REQUEST), as for one ADD
        outcome = looked_up.get(ledger_id, self._namespaces.get(ledger_id, _MISSING))
        if isinstance(outcome, NoSuchLedgerError) or outcome is _MISSING:
            return Status.NO_LEDGER, (f"ledger {ledger_id} has no metadata: a bookie never creates a "
                                      "ledger for a request (create it through the client first)")
        if isinstance(outcome, ForbiddenError):
            self.forbidden += 1
            return Status.FORBIDDEN, str(outcome)
        if isinstance(outcome, BaseException):
            return Status.TOO_MANY_REQUESTS, f"cannot check ledger {ledger_id}'s metadata now: {outcome}"
        reason = decide(principal, Action.ADD, outcome)
        if reason is not None:
            self.forbidden += 1
            return Status.FORBIDDEN, f"ledger {ledger_id}: {reason}"
        return None

    # ------------------------------------------------------------------ CREATE_LEDGER

    def _dispatch_create(self, request: CreateLedgerRequest, connection: Connection, principal: Principal) -> None:
        """A principal may have a ledger created in a namespace it may produce in, writable by that
        namespace's producer and admin identities only (bookkeeper/protocol/create.py)."""
        try:
            namespace = dict(LedgerMetadata.from_bytes(request.metadata).custom).get("namespace")
        except CorruptMetadataError as exc:
            self._refuse(connection, request.request_id, OpCode.CREATE_LEDGER, Status.BAD_REQUEST,
                         f"the ledger metadata is not valid: {exc}")
            return
        reason = decide(principal, Action.CREATE_LEDGER, namespace)
        if reason is None:
            reason = _writers_refusal(request.writers, namespace)
        if reason is not None:
            self.forbidden += 1
            self._refuse(connection, request.request_id, OpCode.CREATE_LEDGER, Status.FORBIDDEN, reason)
            return
        self.handlers[CreateLedgerRequest](request, connection)

    # ------------------------------------------------------------------ quotas

    def set_stored_usage(self, usage: dict[str, int]) -> None:
        """The cluster's stored bytes per namespace, as the bookies last published them."""
        self.stored_usage = usage

    def over_quota(self, namespace: str, ledger_id: int) -> str | None:
        """Why the namespace may not add to this ledger (its stored_bytes_max is reached, or the
        ledger's stream is beyond its streams_max), or None. Recovery adds (a writer's recovery,
        auto-recovery's copies) are never asked: they write entries again, not new data."""
        cached = self._quotas.get(namespace)
        if cached is None or self.clock.monotonic_s() - cached[1] > QUOTA_REFRESH_S:
            self._refresh_quota(namespace)  # a raised quota lets a refused namespace in again
        if cached is None:
            return None
        quota = cached[0]
        reason = None
        stored_bytes = self.stored_usage.get(namespace, 0)
        if 0 < quota.stored_bytes_max <= stored_bytes:
            reason = (f"namespace {namespace!r} stores {stored_bytes} bytes on the bookies (every copy), at or "
                      f"over its quota stored_bytes_max {quota.stored_bytes_max}: truncate or delete streams, "
                      "or raise it with `dlog quota set --stored-bytes`")
        elif quota.streams_max > 0 and self._stream_of is not None:
            stream = self._stream_of(ledger_id)
            if stream is not None:
                reason = self.stream_slots.refusal(namespace, stream, ledger_id, quota.streams_max)
        if reason is not None:
            self.quota_refusals += 1
        return reason

    def _pace(self, namespace: str, size_bytes: int, connection: Connection) -> None:
        """Charge the namespace's write bucket; a connection over it is slowed, not refused."""
        now_s = self.clock.monotonic_s()
        cached = self._quotas.get(namespace)
        if cached is None or now_s - cached[1] > QUOTA_REFRESH_S:
            self._refresh_quota(namespace)
        if cached is None or cached[2] is None:
            return
        delay_s = cached[2].charge(size_bytes, now_s)
        if delay_s > 0:
            self.throttled += 1
            connection.throttle(delay_s)

    def _refresh_quota(self, namespace: str) -> None:
        if namespace in self._quota_reads:
            return
        self._quota_reads.add(namespace)
        task = asyncio.get_running_loop().create_task(self._read_quota(namespace))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read_quota(self, namespace: str) -> None:
        try:
            quota = await self._quota_lookup(namespace)  # type: ignore[misc]
        except (DlogError, OSError) as exc:
            log.warning("cannot read the quota of namespace %s: %s", namespace, exc)
            quota = self._quotas.get(namespace, (UNLIMITED,))[0]
        finally:
            self._quota_reads.discard(namespace)
        previous = self._quotas.get(namespace)
        bucket = previous[2] if previous is not None else None
        if quota.write_bytes_per_s <= 0:
            bucket = None
        elif bucket is None or bucket.rate_per_s != quota.write_bytes_per_s:
            bucket = TokenBucket(quota.write_bytes_per_s, self.clock.monotonic_s())
        if namespace not in self._quotas and len(self._quotas) >= QUOTAS_CACHED_MAX:
            self._quotas.pop(next(iter(self._quotas)))
        self._quotas[namespace] = (quota, self.clock.monotonic_s(), bucket)

    # ------------------------------------------------------------------ ledger namespaces

    def _wait_for_lookup(self, ledger_id: int, request: Any, connection: Connection) -> None:
        if self._lookup is None or ledger_id < 0:
            self._refuse(connection, request.request_id, _opcode(request), Status.NO_LEDGER,
                         f"ledger {ledger_id} has no metadata this bookie can check")
            return
        if self._waiting_count >= self.pending_max:
            self._refuse(connection, request.request_id, _opcode(request), Status.TOO_MANY_REQUESTS,
                         f"{self._waiting_count} requests already wait for ledger metadata "
                         f"(maximum {self.pending_max})")
            return
        waiting = self._waiting.get(ledger_id)
        self._waiting_count += 1
        if waiting is not None:
            waiting.append((request, connection))
            return
        self._waiting[ledger_id] = [(request, connection)]
        task = asyncio.get_running_loop().create_task(self._look_up(ledger_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _look_up(self, ledger_id: int) -> None:
        self.lookups += 1
        outcome: str | None | BaseException
        try:
            outcome = await self._lookup(ledger_id)  # type: ignore[misc]
        except (DlogError, OSError) as exc:
            outcome = exc
        waiting = self._waiting.pop(ledger_id, [])
        self._waiting_count -= len(waiting)
        if not isinstance(outcome, BaseException):
            if len(self._namespaces) >= self.cache_max:
                self._namespaces.pop(next(iter(self._namespaces)))
            self._namespaces[ledger_id] = outcome
        for request, connection in waiting:
            if connection.closed:
                continue
            if type(request) is _BatchWait:
                self._batch_lookup_done(request, ledger_id, outcome)
                continue
            if isinstance(outcome, NoSuchLedgerError):
                self._refuse(connection, request.request_id, _opcode(request), Status.NO_LEDGER,
                             f"ledger {ledger_id} has no metadata: a bookie never creates a ledger "
                             "for a request (create it through the client first)")
            elif isinstance(outcome, ForbiddenError):
                self.forbidden += 1
                self._refuse(connection, request.request_id, _opcode(request), Status.FORBIDDEN, str(outcome))
            elif isinstance(outcome, BaseException):
                self._refuse(connection, request.request_id, _opcode(request), Status.TOO_MANY_REQUESTS,
                             f"cannot check ledger {ledger_id}'s metadata now: {outcome}")
            else:
                self.authorize(request, connection, action_of(request), outcome)

    def forget(self, ledger_id: int) -> None:
        """The ledger was deleted: its cached namespace goes too."""
        self._namespaces.pop(ledger_id, None)

    @property
    def cached_namespaces(self) -> int:
        return len(self._namespaces)

    @property
    def waiting(self) -> int:
        return self._waiting_count

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _refuse(connection: Connection, request_id: int, opcode: int, status: Status, message: str,
                *, close: bool = False) -> None:
        connection.send(encode_response(ErrorResponse(request_id, opcode, status, message)))
        connection.request_done()
        if close:
            connection.close_after_answer()


def _copies_for_the_cluster(principal: Principal | None) -> bool:
    """Recovery adds of bookies (re-replication) and admins copy entries again and are never
    counted against a quota; anyone else's are, since a RECOVERY_ADD can carry new entries too."""
    roles = (principal or ANONYMOUS).roles
    return Role(ROLE_ADMIN) in roles or Role(ROLE_BOOKIE) in roles


def _writers_refusal(writers: tuple[str, ...], namespace: str | None) -> str | None:
    """Why these ZooKeeper ids may not be a new ledger's writers: each must be the producer or
    admin identity of the ledger's own namespace (anything else could relabel it, acl.py)."""
    for writer in writers:
        parsed = parse_role_zk_user(writer.split(":", 1)[0])
        if parsed is None or parsed[0] != namespace or parsed[1] not in ("produce", "admin"):
            return (f"writer id {writer.split(':', 1)[0]!r} is not a producer or admin identity of namespace "
                    f"{namespace!r} (ns.{namespace}.produce or ns.{namespace}.admin)")
    return None


_OPCODES: dict[type, int] = {AddRequest: OpCode.ADD, ReadRequest: OpCode.READ,
                             ReadLacRequest: OpCode.READ_LAC, WriteLacRequest: OpCode.WRITE_LAC,
                             BookieInfoRequest: OpCode.GET_BOOKIE_INFO, AuthRequest: OpCode.AUTH,
                             AddBatchRequest: OpCode.ADD_BATCH, ReadRangeRequest: OpCode.READ_RANGE,
                             CheckEntriesRequest: OpCode.CHECK_ENTRIES, CreateLedgerRequest: OpCode.CREATE_LEDGER}


class _BatchWait:
    """An ADD_BATCH waiting for the namespaces of some of its ledgers (one lookup per ledger)."""

    __slots__ = ("request", "connection", "missing", "outcomes")

    def __init__(self, request: AddBatchRequest, connection: Connection, missing: set[int]) -> None:
        self.request = request
        self.connection = connection
        self.missing = missing
        self.outcomes: dict[int, Any] = {}

    @property
    def request_id(self) -> int:
        return self.request.request_id


def _opcode(request: Any) -> int:
    return _OPCODES.get(type(request), 0)
