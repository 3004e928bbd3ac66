"""The one bridge between kazoo (thread-based) and asyncio.

kazoo runs its own threads: a connection thread and callback workers. Those threads do exactly
one thing here: hand results and events to the event loop with ``call_soon_threadsafe``. Every
kazoo call is made from the loop thread with a ``*_async`` method, which never blocks, and every
await is bounded by ``timeout_s`` so an unreachable ZooKeeper becomes a MetadataError, not a hang.

A MetadataError from a timed-out or disconnected write means the outcome is unknown: the
operation may still have been applied.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import EventType, KazooState, WatchedEvent
from kazoo.retry import KazooRetry

from bookkeeper.errors import (
    ConfigError,
    MetadataClientClosedError,
    MetadataError,
    MetadataExistsError,
    MetadataNotFoundError,
    MetadataPermissionError,
    MetadataVersionError,
)

log = logging.getLogger(__name__)

# Reconnect backoff: kazoo's default grows to an hour, which would leave a client offline long
# after ZooKeeper is back (and make stop() wait out that sleep).
RECONNECT_DELAY_S = 0.1
RECONNECT_DELAY_MAX_S = 1.0

STATE_NAMES = {KazooState.CONNECTED: "connected", KazooState.SUSPENDED: "suspended", KazooState.LOST: "lost"}


# ---------------------------------------------------------------------------------- multi operations


@dataclass(frozen=True)
class CreateOp:
    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequence: bool = False


@dataclass(frozen=True)
class SetOp:
    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True)
class DeleteOp:
    path: str
    version: int = -1


@dataclass(frozen=True)
class CheckOp:
    path: str
    version: int


Op = CreateOp | SetOp | DeleteOp | CheckOp


# ---------------------------------------------------------------------------------- errors


def metadata_error(exc: BaseException, action: str) -> MetadataError:
    """The dlog error for a kazoo failure; ``action`` says what was tried (e.g. 'set /a')."""
    if isinstance(exc, NoNodeError):
        return MetadataNotFoundError(f"{action}: no such node")
    if isinstance(exc, NodeExistsError):
        return MetadataExistsError(f"{action}: node already exists")
    if isinstance(exc, BadVersionError):
        return MetadataVersionError(f"{action}: version mismatch (someone else changed the node)")
    if isinstance(exc, NotEmptyError):
        return MetadataError(f"{action}: node has children")
    if isinstance(exc, NoAuthError):
        return MetadataPermissionError(f"{action}: not allowed by the node's ACL (ZooKeeper "
                                       "credentials: zk_user/zk_password in client.toml)")
    # Connection loss, session expiry, closed client and any other server error: retryable.
    return MetadataError(f"{action}: {type(exc).__name__} {exc}".rstrip())


def _first_multi_failure(results: list[Any]) -> BaseException | None:
    """The error of the op that made a multi fail; the others only say 'rolled back'."""
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, (RolledBackError, RuntimeInconsistency)):
            return result
    for result in results:
        if isinstance(result, BaseException):
            return result
    return None


# ---------------------------------------------------------------------------------- addresses

ZK_PORT_DEFAULT = 2181
PROBE_TIMEOUT_S = 2.0
_ADDRESS_RULE = "write host:port[,host:port...], e.g. 127.0.0.1:2181 (pass --zk HOST:PORT or set DLOG_ZK)"


def parse_hosts(hosts: str) -> list[tuple[str, int]]:
    """(host, port) of each server of a connect string `host[:port][,host[:port]...][/chroot]`;
    ConfigError naming what is wrong (kazoo would raise a bare ValueError, or fail much later)."""
    if not isinstance(hosts, str) or not hosts.strip():
        raise ConfigError(f"the ZooKeeper address is empty; {_ADDRESS_RULE}")
    servers = []
    for part in hosts.strip().split("/", 1)[0].split(","):
        part = part.strip()
        host, port_text = part, ""
        if part.startswith("["):  # [IPv6]:port
            host, _, rest = part[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else rest
        elif part.count(":") == 1:
            host, port_text = part.split(":")
        if not host:
            raise ConfigError(f"bad ZooKeeper address {hosts!r}: {part!r} has no host; {_ADDRESS_RULE}")
        if port_text and not (port_text.isascii() and port_text.isdigit() and 1 <= int(port_text) <= 65535):
            raise ConfigError(f"bad ZooKeeper address {hosts!r}: port {port_text!r} is not a number in "
                              f"1..65535; {_ADDRESS_RULE}")
        servers.append((host, int(port_text) if port_text else ZK_PORT_DEFAULT))
    return servers


async def refuse_unreachable(hosts: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """MetadataError at once when no server of `hosts` accepts a TCP connection (refused, or a name
    that does not resolve), instead of after the whole session timeout. A server that does not
    answer within `timeout_s` is left to the session's own wait."""
    servers = parse_hosts(hosts)

    async def probe(host: str, port: int) -> str | None:
        try:
            async with asyncio.timeout(timeout_s):
                _, writer = await asyncio.open_connection(host, port)
        except TimeoutError:
            return None
        except socket.gaierror as exc:
            return f"cannot resolve host {host!r} ({exc.strerror})"
        except OSError as exc:
            why = "refused the connection" if isinstance(exc, ConnectionRefusedError) else exc.strerror
            return f"{host}:{port} {why}"
        writer.close()
        return None

    failures = await asyncio.gather(*(probe(host, port) for host, port in servers))
    if all(failures):
        raise MetadataError(f"cannot reach ZooKeeper at {hosts}: {'; '.join(f for f in failures if f)}; "
                            "is it running there? (pass --zk HOST:PORT or set DLOG_ZK)")


# ---------------------------------------------------------------------------------- the client


class AsyncZooKeeper:
    """An asyncio ZooKeeper client; create and use it on one event loop."""

    def __init__(self, hosts: str, *, timeout_s: float = 10.0, session_timeout_s: float = 10.0,
                 auth: list[tuple[str, str]] | None = None, default_acl: list[Any] | None = None,
                 acl_policy: Any = None) -> None:
        """`auth`: kazoo auth_data, e.g. [("digest", "user:password")]; `acl_policy` (an
        `bookkeeper.meta.acl.AclPolicy`) chooses the ACL of every node this client creates."""
        parse_hosts(hosts)  # a bad address is one clear error now, not kazoo's ValueError
        self.hosts = hosts
        self.acl_policy = acl_policy
        self.timeout_s = timeout_s
        self.session_timeout_s = session_timeout_s
        # Read from kazoo's threads: tells the reconnect backoff to give up at once.
        self._closing = threading.Event()
        reconnect = KazooRetry(max_tries=-1, delay=RECONNECT_DELAY_S, max_delay=RECONNECT_DELAY_MAX_S,
                               interrupt=self._closing.is_set)
        self._client = KazooClient(hosts=hosts, timeout=session_timeout_s, auth_data=auth,
                                   default_acl=default_acl, connection_retry=reconnect)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._closed = False
        self._connect_waiter: asyncio.Future[None] | None = None
        self._state_listeners: list[Callable[[str], None]] = []
        self._watches: set[_Watch] = set()

    # ------------------------------------------------------------------------------ lifecycle

    @property
    def connected(self) -> bool:
        return bool(self._client.connected)

    async def start(self) -> None:
        """Connect; MetadataError if no session is established within ``timeout_s``."""
        if self._started:
            return
        if self._closed:
            raise MetadataError(f"ZooKeeper client for {self.hosts} is closed")
        self._loop = asyncio.get_running_loop()
        self._started = True
        self._connect_waiter = self._loop.create_future()
        self._client.add_listener(self._on_kazoo_state)
        self._client.start_async()
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._connect_waiter
        except (TimeoutError, MetadataError) as exc:
            await self.close()
            raise MetadataError(f"cannot reach ZooKeeper at {self.hosts} within {self.timeout_s}s: is it "
                                "running there? (pass --zk HOST:PORT or set DLOG_ZK)") from exc
        except asyncio.CancelledError:
            await self.close()  # do not leave kazoo's threads reconnecting for nobody
            raise
        finally:
            self._connect_waiter = None

    async def close(self) -> None:
        """End the session (its ephemeral nodes go with it) and stop kazoo's threads."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        for watch in list(self._watches):
            watch.cancel()
        if self._started:
            # stop() joins kazoo's threads, so keep it off the loop.
            await asyncio.to_thread(self._stop_kazoo)

    def _stop_kazoo(self) -> None:
        self._client.stop()
        self._client.close()

    def add_state_listener(self, callback: Callable[[str], None]) -> None:
        """Call ``callback("connected" | "suspended" | "lost")`` on the loop at each transition."""
        self._state_listeners.append(callback)

    # ------------------------------------------------------------------------------ operations

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False, sequence: bool = False,
                     makepath: bool = False, acl: list[Any] | None = None) -> str:
        """Create a node and return its path (with the counter appended when ``sequence``); its
        ACL is `acl`, else the ACL policy's choice."""
        if self.acl_policy is None and acl is None:
            created = await self._call(f"create {path}", self._client.create_async, path, data,
                                       ephemeral=ephemeral, sequence=sequence, makepath=makepath)
            return str(created)
        if acl is None:
            acl = self.acl_policy.acl_for(path)
        try:
            created = await self._call(f"create {path}", self._client.create_async, path, data, acl=acl,
                                       ephemeral=ephemeral, sequence=sequence)
        except MetadataNotFoundError:
            if not makepath:
                raise
            await self.ensure_path(path.rsplit("/", 1)[0])
            created = await self._call(f"create {path}", self._client.create_async, path, data, acl=acl,
                                       ephemeral=ephemeral, sequence=sequence)
        return str(created)

    async def get(self, path: str) -> tuple[bytes, int]:
        data, stat = await self._call(f"get {path}", self._client.get_async, path)
        return data or b"", stat.version

    async def get_or_none(self, path: str) -> tuple[bytes, int] | None:
        try:
            return await self.get(path)
        except MetadataNotFoundError:
            return None

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        """Compare-and-set when ``version`` >= 0; returns the node's new version."""
        stat = await self._call(f"set {path}", self._client.set_async, path, data, version)
        return int(stat.version)

    async def delete(self, path: str, version: int = -1, recursive: bool = False) -> None:
        """Delete a node; ``recursive`` deletes its subtree first (``version`` checks the top only)."""
        if recursive:
            await self._delete_children(path)
        await self._call(f"delete {path}", self._client.delete_async, path, version)

    async def _delete_children(self, path: str) -> None:
        for child in await self.children(path):
            try:
                await self.delete(_join(path, child), recursive=True)
            except MetadataNotFoundError:
                continue  # someone else deleted it meanwhile: that is what we wanted

    async def exists(self, path: str) -> bool:
        stat = await self._call(f"exists {path}", self._client.exists_async, path)
        return stat is not None

    async def children(self, path: str) -> list[str]:
        """The children's names, sorted (so sequence nodes come in creation order)."""
        names = await self._call(f"children {path}", self._client.get_children_async, path)
        return sorted(names)

    async def sync(self, path: str) -> None:
        """Bring the server this client talks to up to date with the leader for `path`, so the
        next read there sees every write committed before this call (a follower may lag)."""
        await self._call(f"sync {path}", self._client.sync_async, path)

    async def ensure_path(self, path: str) -> None:
        if self.acl_policy is None:
            await self._call(f"ensure_path {path}", self._client.ensure_path_async, path)
            return
        # each level gets its own ACL (kazoo's ensure_path would give every level the same one)
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            prefix = "/" + "/".join(parts[:depth])
            if await self.exists(prefix):
                continue
            try:
                await self._call(f"create {prefix}", self._client.create_async, prefix, b"",
                                 acl=self.acl_policy.acl_for(prefix))
            except MetadataExistsError:
                continue

    async def get_acls(self, path: str) -> list[Any]:
        """The node's ACL entries (kazoo ACL tuples: perms, id.scheme, id.id)."""
        acls, _stat = await self._call(f"get_acls {path}", self._client.get_acls_async, path)
        return list(acls)

    async def set_acls(self, path: str, acls: list[Any], version: int = -1) -> None:
        """Replace the node's ACL (needs the ADMIN permission on it, or a super user)."""
        await self._call(f"set_acls {path}", self._client.set_acls_async, path, acls, version)

    async def multi(self, ops: list[Op]) -> None:
        """Apply every op atomically or none; raise the error of the first op that failed."""
        if not ops:
            return
        transaction = self._client.transaction()
        for op in ops:
            _add_to_transaction(transaction, op, self.acl_policy)
        action = f"multi of {len(ops)} ops starting with {ops[0]}"
        results = await self._call(action, transaction.commit_async)
        failure = _first_multi_failure(results)
        if failure is not None:
            raise metadata_error(failure, action) from failure

    # ------------------------------------------------------------------------------ watches

    def watch_children(self, path: str, callback: Callable[[list[str]], None]) -> Callable[[], None]:
        """Call ``callback(sorted children)`` on the loop now and whenever they change.

        A missing node counts as no children; the watch survives the node being deleted and
        created again, and reconnections. Returns a function that ends the watch.
        """
        return self._add_watch(_ChildrenWatch(self, path, callback))

    def watch_data(self, path: str, callback: Callable[[bytes | None, int], None]) -> Callable[[], None]:
        """Call ``callback(data, version)`` on the loop now and whenever the node changes;
        ``(None, -1)`` while it does not exist. Returns a function that ends the watch."""
        return self._add_watch(_DataWatch(self, path, callback))

    def _add_watch(self, watch: _Watch) -> Callable[[], None]:
        if not self._started or self._closed:
            raise MetadataError(f"cannot watch {watch.path}: the ZooKeeper client is not running")
        self._watches.add(watch)
        watch.arm()
        return watch.cancel

    # ------------------------------------------------------------------------------ the bridge

    async def _call(self, action: str, method: Callable[..., IAsyncResult], *args: Any, **kwargs: Any) -> Any:
        """Run a kazoo ``*_async`` method; its result, or a mapped MetadataError within timeout_s."""
        if not self._started or self._closed:
            raise MetadataClientClosedError(f"{action}: the ZooKeeper client for {self.hosts} is not running")
        future = self._bridge(method(*args, **kwargs))
        try:
            async with asyncio.timeout(self.timeout_s):
                return await future
        except TimeoutError as exc:
            raise MetadataError(f"{action}: no answer from ZooKeeper at {self.hosts} within {self.timeout_s}s "
                                "(the outcome is unknown)") from exc
        except KazooException as exc:
            raise metadata_error(exc, action) from exc

    def _bridge(self, async_result: IAsyncResult) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = self._loop_or_fail().create_future()

        def completed(result: IAsyncResult) -> None:  # on a kazoo thread
            if result.successful():
                self._post(_settle, future, result.value, None)
            else:
                self._post(_settle, future, None, result.exception)

        async_result.rawlink(completed)
        return future

    def _post(self, function: Callable[..., None], *args: Any) -> None:
        """Hand work from a kazoo thread to the loop: the only thing kazoo threads do here."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(function, *args)
        except RuntimeError:
            # The loop closed between the check and the call; nobody is left to tell.
            log.debug("dropped a ZooKeeper callback for a closed event loop")

    def _loop_or_fail(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise MetadataError(f"the ZooKeeper client for {self.hosts} was never started")
        return self._loop

    def _on_kazoo_state(self, state: str) -> None:  # on kazoo's connection thread
        self._post(self._deliver_state, STATE_NAMES.get(state, str(state).lower()))

    def _deliver_state(self, state: str) -> None:
        if self._closed:
            return  # a deliberate close is not news to anyone
        self._resolve_connect_waiter(state)
        if state == "connected":
            # kazoo drops every watch when the connection breaks: set them again.
            for watch in list(self._watches):
                watch.arm()
        for listener in list(self._state_listeners):
            listener(state)

    def _resolve_connect_waiter(self, state: str) -> None:
        waiter = self._connect_waiter
        if waiter is None or waiter.done():
            return
        if state == "connected":
            waiter.set_result(None)
        elif state == "lost":  # e.g. authentication failed: waiting longer will not help
            waiter.set_exception(MetadataError(f"ZooKeeper at {self.hosts} refused the session"))


def _settle(future: asyncio.Future[Any], value: Any, exception: BaseException | None) -> None:
    if future.done():
        return  # the caller timed out or was cancelled; a late answer has no one to go to
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(value)


def _add_to_transaction(transaction: Any, op: Op, acl_policy: Any = None) -> None:
    if isinstance(op, CreateOp):
        acl = acl_policy.acl_for(op.path) if acl_policy is not None else None
        transaction.create(op.path, op.data, acl=acl, ephemeral=op.ephemeral, sequence=op.sequence)
    elif isinstance(op, SetOp):
        transaction.set_data(op.path, op.data, op.version)
    elif isinstance(op, DeleteOp):
        transaction.delete(op.path, op.version)
    elif isinstance(op, CheckOp):
        transaction.check(op.path, op.version)
    else:
        raise TypeError(f"not a ZooKeeper op: {op!r}")


def _join(parent: str, child: str) -> str:
    return f"{parent.rstrip('/')}/{child}"


# ---------------------------------------------------------------------------------- watch machinery


class _Watch:
    """A self-renewing ZooKeeper watch whose callback runs on the loop.

    ZooKeeper watches fire once. On each event we read again with a new watch. Reads start on
    the loop; kazoo threads only post events and results back. Repeated identical values (from
    re-arming after a reconnect) are not delivered twice.
    """

    def __init__(self, zk: AsyncZooKeeper, path: str) -> None:
        self.zk = zk
        self.path = path
        self.active = True
        self._last_delivered: object = _NOTHING

    def arm(self) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        # kazoo cannot remove a watch; the one outstanding fires once more and is ignored.
        self.active = False
        self.zk._watches.discard(self)

    def _on_event(self, event: WatchedEvent) -> None:  # on a kazoo thread
        # NONE events mean the connection broke; re-arming waits for "connected".
        if event.type != EventType.NONE:
            self.zk._post(self._rearm)

    def _rearm(self) -> None:
        if self.active and not self.zk._closed:
            self.arm()

    def _read(self, method: Callable[..., IAsyncResult], on_result: Callable[[IAsyncResult], None]) -> None:
        if not self.active or self.zk._closed:
            return
        method(self.path, watch=self._on_event).rawlink(lambda result: self.zk._post(on_result, result))

    def _deliver(self, value: object, callback: Callable[..., None], *args: Any) -> None:
        if not self.active or value == self._last_delivered:
            return
        self._last_delivered = value
        callback(*args)

    def _failed(self, result: IAsyncResult) -> bool:
        """True if the read failed for a reason other than a missing node (it will be re-armed
        on reconnect)."""
        exception = result.exception
        if exception is None or isinstance(exception, NoNodeError):
            return False
        log.debug("watch read of %s failed (re-armed on reconnect): %r", self.path, exception)
        return True


_NOTHING = object()


class _ChildrenWatch(_Watch):
    def __init__(self, zk: AsyncZooKeeper, path: str, callback: Callable[[list[str]], None]) -> None:
        super().__init__(zk, path)
        self.callback = callback

    def arm(self) -> None:
        self._read(self.zk._client.get_children_async, self._on_children)

    def _on_children(self, result: IAsyncResult) -> None:
        if self._failed(result):
            return
        if isinstance(result.exception, NoNodeError):
            # Wait for the node to appear: an exists() watch fires on its creation.
            self._read(self.zk._client.exists_async, self._on_exists)
            self._deliver_children([])
            return
        self._deliver_children(sorted(result.value))

    def _on_exists(self, result: IAsyncResult) -> None:
        if self._failed(result):
            return
        if result.value is not None:  # created between our two reads
            self.arm()

    def _deliver_children(self, children: list[str]) -> None:
        self._deliver(tuple(children), self.callback, children)


class _DataWatch(_Watch):
    def __init__(self, zk: AsyncZooKeeper, path: str, callback: Callable[[bytes | None, int], None]) -> None:
        super().__init__(zk, path)
        self.callback = callback

    def arm(self) -> None:
        self._read(self.zk._client.get_async, self._on_data)

    def _on_data(self, result: IAsyncResult) -> None:
        if self._failed(result):
            return
        if isinstance(result.exception, NoNodeError):
            self._read(self.zk._client.exists_async, self._on_exists)
            self._deliver_data(None, -1)
            return
        data, stat = result.value
        self._deliver_data(data or b"", stat.version)

    def _on_exists(self, result: IAsyncResult) -> None:
        if self._failed(result):
            return
        if result.value is not None:
            self.arm()

    def _deliver_data(self, data: bytes | None, version: int) -> None:
        self._deliver((data, version), self.callback, data, version)


# ---------------------------------------------------------------------------------- leader election


class Election:
    """Leadership among the contenders of `path`, by kazoo's Lock recipe (which its Election
    recipe wraps): each contender holds an ephemeral sequential node, the lowest is the leader, the
    others watch their predecessor.

    The recipe's calls block, so waiting for leadership runs on a thread of its own, which only
    posts the outcome to the loop; every other call goes through `asyncio.to_thread` and is bounded
    by the client's timeout. Leadership ends with the session: a contender must stop leading as soon
    as the client reports "suspended" or "lost" and, once "connected" again, lead only if
    `still_held()` (then contend again with a new Election).
    """

    def __init__(self, zk: AsyncZooKeeper, path: str, identifier: str) -> None:
        self.zk = zk
        self.path = path
        self.identifier = identifier
        if zk.acl_policy is not None:
            # the recipe creates its nodes (the path, the contenders) with the kazoo client's
            # default ACL; every other create of this client passes the policy's ACL explicitly
            zk._client.default_acl = zk.acl_policy.acl_for(f"{path}/contender")
        self._lock = zk._client.Lock(path, identifier)
        self._thread: threading.Thread | None = None
        self._won: asyncio.Future[None] | None = None

    async def wait_elected(self) -> None:
        """Return once this contender leads; MetadataError if the attempt failed."""
        if self._won is None:
            self._won = self.zk._loop_or_fail().create_future()
            # a cancelled candidate's failure is expected; nobody need be waiting to hear it
            self._won.add_done_callback(lambda won: won.cancelled() or won.exception())
            self._thread = threading.Thread(target=self._acquire, name=f"election {self.path}",
                                            daemon=True)
            self._thread.start()
        await asyncio.shield(self._won)

    def _acquire(self) -> None:  # on the election's own thread
        try:
            self._lock.acquire()
        except KazooException as exc:  # kazoo's CancelledError too: cancel() was called
            self.zk._post(_settle, self._won, None, metadata_error(exc, f"election at {self.path}"))
            return
        self.zk._post(_settle, self._won, None, None)

    async def still_held(self) -> bool:
        """Whether we were elected and our node still exists (after a reconnection): no later
        contender can get a lower sequence number, so while it exists we lead."""
        if self._won is None or not self._won.done() or self._won.exception() is not None:
            return False
        node = self._lock.node
        return node is not None and await self.zk.exists(f"{self.path}/{node}")

    async def contenders(self) -> list[str]:
        """Identifiers of every contender, the leader first."""
        return await self._blocking(f"contenders of {self.path}", self._lock.contenders)

    async def cancel(self) -> None:
        """Stop contending or leading and delete our node. MetadataError if ZooKeeper could not be
        told: then the node stays while the session lives, and a new contender of this session
        would queue behind it forever, so try again (or go on leading: `still_held`)."""
        self._lock.cancel()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, self.zk.timeout_s)
        node = self._lock.node
        if node is not None:
            try:
                await self.zk.delete(f"{self.path}/{node}")
            except MetadataNotFoundError:
                pass  # gone with an expired session, or never created

    async def _blocking(self, action: str, function: Callable[[], Any]) -> Any:
        if not self.zk._started or self.zk._closed:
            raise MetadataError(f"{action}: the ZooKeeper client for {self.zk.hosts} is not running")
        try:
            async with asyncio.timeout(self.zk.timeout_s):
                return await asyncio.to_thread(function)
        except TimeoutError as exc:
            raise MetadataError(f"{action}: no answer from ZooKeeper within {self.zk.timeout_s}s") from exc
        except KazooException as exc:
            raise metadata_error(exc, action) from exc


async def lock_contenders(zk: AsyncZooKeeper, path: str) -> list[str]:
    """The contenders of a kazoo Lock at `path` (the holder first), read by a non-contender."""
    election = Election(zk, path, "")
    try:
        return await election.contenders()
    except MetadataNotFoundError:
        return []
