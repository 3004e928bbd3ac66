"""The bookie's TCP server: one asyncio Protocol per connection around the sans-IO codec.

A connection parses the whole frames of what arrived, hands each request to the core (through
the guard when security is on) and queues the answers; everything queued in one loop iteration
goes out in one write. It bounds what one client can make the bookie hold (S4):
- in-flight requests: past `in_flight_max` unanswered requests, or while the journal holds more
  than its maximum of bytes waiting for fsync, it stops reading the socket (TCP pushes back)
  until half of them are answered and the journal caught up;
- unsent answers: past `unsent_bytes_max` bytes of answers the client has not taken, it stops
  parsing and reading until they drain, and closes the connection if they have not drained
  within `unsent_timeout_s` (a client that pipelines reads and never reads the answers);
- silence: a connection with no whole frame within `first_frame_timeout_s` is closed, and a
  partial frame that makes no progress for `idle_timeout_s` too;
- partial frames: bytes held in unfinished frames over all connections are capped at
  `partial_bytes_max`; the connection that would pass it is closed;
- connections: at most `connections_max` in all and `connections_per_host_max` per client host;
- long polls of a connection that closed are dropped at once (the core forgets its waiters).
Refused and closed connections are logged at most once per `REFUSAL_LOG_INTERVAL_S` per reason
(refusals.py).
A frame it cannot accept gets an error answer; if the stream lost its framing, the connection is
closed after that answer, and only that connection.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from bookkeeper.bookie.bookie import BookieCore
from bookkeeper.bookie.guard import Guard
from bookkeeper.bookie.refusals import RateLimitedLog
from bookkeeper.protocol import wire
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
from bookkeeper.security.authz import ANONYMOUS

if TYPE_CHECKING:
    from bookkeeper.bookie.connection import ClientConnection

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerLimits:
    frame_bytes_max: int = wire.FRAME_BYTES_MAX_DEFAULT
    entry_bytes_max: int = wire.ENTRY_BYTES_MAX_DEFAULT
    in_flight_max: int = 10_000
    idle_timeout_s: float = 30.0
    connections_max: int = 4096
    connections_per_host_max: int = 1024
    unsent_bytes_max: int = 16 * 2**20
    unsent_timeout_s: float = 30.0
    first_frame_timeout_s: float = 10.0
    partial_bytes_max: int = 256 * 2**20


class BookieServer:
    """Listens, owns the connections, routes requests to the core."""

    def __init__(self, core: BookieCore, limits: ServerLimits, info: Callable[[], BookieInfoResponse],
                 journal_full: Callable[[], bool] = lambda: False, guard: Guard | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.core = core
        self.limits = limits
        self._info = info
        self.journal_full = journal_full
        self.tls = tls
        self.connections: set[ClientConnection] = set()
        self.per_host: dict[str, int] = {}
        self.paused: set[ClientConnection] = set()  # not read until the journal or answers catch up
        self._server: asyncio.Server | None = None
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
        self.refusals = RateLimitedLog(log)
        self.protocol_errors = 0
        self.backpressure_pauses = 0
        self.partial_bytes = 0
        self.refused_connections: dict[str, int] = {"total": 0, "per_host": 0}
        self.idle_closed = 0
        self.unsent_blocks = 0
        self.unsent_closed = 0
        self.partial_closed = 0

    def admit(self, connection: ClientConnection) -> tuple[str, str] | None:
        """Count a new connection in, or say why it is refused: (the cap, one line)."""
        if len(self.connections) >= self.limits.connections_max:
            self.refused_connections["total"] += 1
            return "total", (f"{len(self.connections)} connections open (maximum "
                             f"{self.limits.connections_max})")
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
        return sum(connection.unsent_bytes for connection in self.connections)

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        options: dict[str, Any] = {}
        if self.tls is not None:
            options = {"ssl": self.tls, "ssl_handshake_timeout": self.limits.first_frame_timeout_s}
        from bookkeeper.bookie.connection import ClientConnection

        self._server = await loop.create_server(lambda: ClientConnection(self), host, port,
                                                reuse_address=True, backlog=1024, **options)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close()
        if self.guard is not None:
            await self.guard.stop()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
