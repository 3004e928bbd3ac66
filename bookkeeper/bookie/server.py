"""The bookie's TCP server: one asyncio Protocol per connection around the sans-IO codec.

A connection parses the whole frames of what arrived, hands each request to the core (through
the guard when security is on) and queues the answers; everything queued in one loop iteration
goes out in one write. It bounds what one client can make the bookie hold (S4; the limits are
named in limits.py):
- in-flight requests: past `in_flight_max` unanswered requests, or while the journal holds more
  than its maximum of bytes waiting for fsync, it stops reading the socket (TCP pushes back)
  until half of them are answered and the journal caught up;
- unsent answers: past `unsent_bytes_max` bytes of answers the client has not taken (the TLS
  layer's buffers included), it stops parsing and reading until they drain, and closes the
  connection if they have not drained within `unsent_timeout_s` (a client that pipelines reads and
  never reads the answers); over all connections `global_unsent_bytes_max` and
  `unsent_connections_max` bound them too (unsent.py);
- silence: a connection with no whole frame within `first_frame_timeout_s` (its TLS handshake
  included) is closed, and a partial frame that makes no progress for `idle_timeout_s` too;
- partial frames: bytes held in unfinished frames over all connections are capped at
  `partial_bytes_max`; the connection that would pass it is closed. Before AUTH, on a bookie that
  requires it, a connection may hold only `unauthenticated_partial_bytes_max` (an AUTH frame fits),
  counted apart, so unauthenticated peers cannot take the budget of authenticated ones (partial.py);
- connections: at most `connections_max` in all (fewer when the open-file limit minus
  `reserved_open_files` is lower: the bookie's own files must still open) and
  `connections_per_host_max` per client host, counted from accept: the server accepts itself,
  refuses over a cap at once (nothing allocated, no TLS started) and otherwise counts the
  connection before its TLS handshake, which must end within `first_frame_timeout_s`;
- long polls of a connection that closed are dropped at once (the core forgets its waiters).
Refused and closed connections are logged at most once per `REFUSAL_LOG_INTERVAL_S` per reason
(refusals.py).
A frame it cannot accept gets an error answer; if the stream lost its framing, the connection is
closed after that answer, and only that connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import ssl
import struct
from collections.abc import Callable
from typing import Any

from bookkeeper.bookie.bookie import BookieCore
from bookkeeper.bookie.connection import ClientConnection
from bookkeeper.bookie.guard import Guard
from bookkeeper.bookie.limits import ServerLimits
from bookkeeper.bookie.partial import PartialFrames
from bookkeeper.bookie.refusals import RateLimitedLog
from bookkeeper.bookie.unsent import UnsentAnswers
from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.protocol.batch import AddBatchRequest, ReadRangeRequest
from bookkeeper.protocol.wire import (
    AddRequest,
    AuthRequest,
    AuthResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    CheckEntriesRequest,
    ReadLacRequest,
    ReadRequest,
    WriteLacRequest,
    encode_response,
)
from bookkeeper.runtime import start_task
from bookkeeper.security.authz import ANONYMOUS

log = logging.getLogger(__name__)
LISTEN_BACKLOG = 1024
ACCEPT_BATCH = 256  # connections taken per wake-up of the accept loop (the rest wait for the next)
ACCEPT_RETRY_S = 0.1  # after an accept failed for want of files (EMFILE): wait, do not spin


def open_files_limit() -> int | None:
    """The process's open-file limit (None: unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def connections_cap(limits: ServerLimits, open_files_max: int | None) -> int:
    """Connections the bookie admits: `connections_max`, or fewer when the open-file limit leaves
    `reserved_open_files` for its own files (journal, entry logs, index, ZooKeeper, admin endpoint)."""
    if open_files_max is None:
        return limits.connections_max
    return max(1, min(limits.connections_max, open_files_max - limits.reserved_open_files))


class BookieServer:
    """Listens, owns the connections, routes requests to the core."""

    def __init__(self, core: BookieCore, limits: ServerLimits, info: Callable[[], BookieInfoResponse],
                 journal_full: Callable[[], bool] = lambda: False, guard: Guard | None = None,
                 tls: ssl.SSLContext | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        """`clock`: what connections measure silence and stalls on, and the refusal log its
        intervals; the event loop's own time (SYSTEM_CLOCK, or a simulator's loop clock)."""
        self.core = core
        self.limits = limits
        self.clock = clock
        self._info = info
        self.journal_full = journal_full
        self.tls = tls
        self.connections: set[ClientConnection] = set()
        self.per_host: dict[str, int] = {}
        self.paused: set[ClientConnection] = set()  # not read until the journal or answers catch up
        self.connections_max = connections_cap(limits, open_files_limit())
        self.handlers: dict[type, Callable[[Any, Any], None]] = {
            AddRequest: core.on_add,
            ReadRequest: core.on_read,
            ReadLacRequest: core.on_read_lac,
            WriteLacRequest: core.on_write_lac,
            AddBatchRequest: core.on_add_batch,
            ReadRangeRequest: core.on_read_range,
            BookieInfoRequest: self._on_info,
            AuthRequest: self._on_auth_unneeded,
            CheckEntriesRequest: core.on_check_entries,
        }
        self.guard = guard
        if guard is not None:
            guard.handlers = self.handlers
        self.requires_auth = guard is not None and guard.security.requires_auth
        self.refusals = RateLimitedLog(log, clock=clock)
        self.unsent = UnsentAnswers(limits.global_unsent_bytes_max, limits.unsent_connections_max,
                                    self.refusals, clock=clock)
        self.partial = PartialFrames(limits.partial_bytes_max, limits.unauthenticated_partial_bytes_max,
                                     self.refusals)
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._opening: dict[asyncio.Task[Any], None] = {}  # accepted connections getting a transport
        self._unopened: dict[socket.socket, None] = {}  # accepted sockets no transport took yet
        self.protocol_errors = 0
        self.backpressure_pauses = 0
        self.refused_connections: dict[str, int] = {"total": 0, "per_host": 0}
        self.idle_closed = 0
        self.unsent_blocks = 0
        self.unsent_closed = 0
        self.handshakes = 0  # TLS handshakes running (their connections count as open)
        self.handshake_failures = 0
        self.accept_failures = 0

    def admit(self, connection: ClientConnection) -> tuple[str, str] | None:
        """Count a new connection in, or say why it is refused: (the cap, one line)."""
        if len(self.connections) >= self.connections_max:
            self.refused_connections["total"] += 1
            return "total", (f"{len(self.connections)} connections open (maximum "
                             f"{self.connections_max})")
        count = self.per_host.get(connection.host, 0)
        if count >= self.limits.connections_per_host_max:
            self.refused_connections["per_host"] += 1
            return "per_host", (f"{count} connections open from {connection.host} (maximum "
                                f"{self.limits.connections_per_host_max} per host)")
        self.connections.add(connection)
        self.per_host[connection.host] = count + 1
        return None

    def release(self, connection: ClientConnection) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            left = self.per_host.get(connection.host, 1) - 1
            if left > 0:
                self.per_host[connection.host] = left
            else:
                self.per_host.pop(connection.host, None)
        self.paused.discard(connection)

    # ------------------------------------------------------------------ accepting

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, address = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: no file for a new connection now
                self.accept_failures += 1
                self.refusals.warning("accept", "cannot accept connections: %s", exc)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            self._accepted(client, address)
            for _ in range(ACCEPT_BATCH - 1):  # what else waits, without a wake-up each
                try:
                    client, address = listener.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    self.accept_failures += 1
                    self.refusals.warning("accept", "cannot accept connections: %s", exc)
                    break
                self._accepted(client, address)

    def _accepted(self, client: socket.socket, address: Any) -> None:
        """Admit a new connection or refuse it at once; an admitted one counts from here on, its
        TLS handshake included."""
        connection = ClientConnection(self, address)
        refusal = self.admit(connection)
        if refusal is not None:
            cap, reason = refusal
            self.refusals.warning(cap, "refusing connection from %s: %s", connection.host, reason)
            with contextlib.suppress(OSError):  # a reset, as an abort would send
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            return
        try:
            client.setblocking(False)
        except OSError:  # gone already
            self.release(connection)
            client.close()
            return
        self._unopened[client] = None
        opening = self._open(connection, client)
        start_task(asyncio.get_running_loop(), self._opening, opening, opening)

    async def _open(self, connection: ClientConnection, client: socket.socket) -> None:
        """Give the accepted socket its transport (TLS: once the handshake is done, bounded by
        `first_frame_timeout_s`); the connection learns of a failure, the TLS layer would not say."""
        del self._unopened[client]  # the transport owns it from here on
        loop = asyncio.get_running_loop()
        options: dict[str, Any] = {}
        if self.tls is not None:
            options = {"ssl": self.tls, "ssl_handshake_timeout": self.limits.first_frame_timeout_s}
            self.handshakes += 1
        try:
            await loop.connect_accepted_socket(lambda: connection, client, **options)
        except asyncio.CancelledError:
            connection.open_failed()
            raise
        except Exception as exc:  # OSError, ssl.SSLError, TimeoutError: the peer's doing
            self.handshake_failures += 1
            self.refusals.warning("handshake", "%s with %s failed: %s",
                                  "TLS handshake" if self.tls is not None else "opening a connection",
                                  connection.peer, str(exc) or type(exc).__name__)
            connection.open_failed()
        finally:
            if self.tls is not None:
                self.handshakes -= 1

    def _on_info(self, request: BookieInfoRequest, reply: ClientConnection) -> None:
        info = self._info()
        reply.send(encode_response(BookieInfoResponse(request.request_id, info.free_bytes,
                                                      info.total_bytes, info.state,
                                                      info.bookie_id)))
        reply.request_done()

    def _on_auth_unneeded(self, request: AuthRequest, reply: ClientConnection) -> None:
        """A bookie without security accepts AUTH and names everyone anonymous."""
        reply.principal = ANONYMOUS
        reply.send(encode_response(AuthResponse(request.request_id, ANONYMOUS.name)))
        reply.request_done()

    def metrics_protocol_error(self) -> None:
        self.protocol_errors += 1

    def metrics_backpressure(self) -> None:
        self.backpressure_pauses += 1

    def resume_paused(self) -> None:
        """Called after each journal commit: connections paused for a full journal may go on."""
        for connection in list(self.paused):
            connection.maybe_resume()

    @property
    def in_flight(self) -> int:
        return sum(connection.in_flight for connection in self.connections)

    @property
    def unsent_bytes(self) -> int:
        return self.unsent.bytes

    async def start(self, host: str, port: int) -> int:
        if self.connections_max < self.limits.connections_max:
            log.warning("the open-file limit (%s) leaves room for %d client connections, not %d: the "
                        "bookie keeps %d files for itself (raise the limit, e.g. LimitNOFILE or "
                        "ulimit -n, for more)", open_files_limit(), self.connections_max,
                        self.limits.connections_max, self.limits.reserved_open_files)
        self._listener = listening_socket(host, port)
        accepting = self._accept(self._listener)
        self._accepting = start_task(asyncio.get_running_loop(), {}, accepting, accepting)
        return int(self._listener.getsockname()[1])

    async def stop(self) -> None:
        if self._accepting is not None:  # before the socket closes: the loop watches it
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for connection in list(self.connections):
            connection.close()
        for task in list(self._opening):
            task.cancel()
        await asyncio.gather(*self._opening, return_exceptions=True)
        for client in list(self._unopened):  # accepted, but cancelled before its transport took it
            client.close()
        self._unopened.clear()
        self.unsent.stop()
        if self.guard is not None:
            await self.guard.stop()


def listening_socket(host: str, port: int) -> socket.socket:
    """The bookie's listening socket (non-blocking), bound as asyncio's create_server would."""
    family, kind, protocol, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                            flags=socket.AI_PASSIVE)[0]
    listener = socket.socket(family, kind, protocol)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(address)
        except OSError as exc:
            raise OSError(exc.errno, f"error while attempting to bind on address {address!r}: "
                                     f"{(exc.strerror or str(exc)).lower()}") from None
        listener.listen(LISTEN_BACKLOG)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    return listener
