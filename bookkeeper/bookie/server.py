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
Refused and closed connections are logged at most once per `REFUSAL_LOG_INTERVAL_S` per reason.
A frame it cannot accept gets an error answer; if the stream lost its framing, the connection is
closed after that answer, and only that connection.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, Callable

from bookkeeper.bookie.bookie import BookieCore
from bookkeeper.bookie.guard import Guard
from bookkeeper.protocol import wire
from bookkeeper.protocol.wire import (
    AddRequest,
    AuthRequest,
    AuthResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    ErrorResponse,
    FrameError,
    ReadLacRequest,
    ReadRequest,
    RequestDecoder,
    Status,
    WriteLacRequest,
    encode_response,
)
from bookkeeper.security.authz import ANONYMOUS, Principal

log = logging.getLogger(__name__)
REFUSAL_LOG_INTERVAL_S = 10.0


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


class RateLimitedLog:
    """At most one line per reason per interval; the next one says how many were not logged."""

    def __init__(self, interval_s: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._last: dict[str, tuple[float, int]] = {}

    def warning(self, reason: str, message: str, *args: object) -> None:
        now = time.monotonic()
        last, suppressed = self._last.get(reason, (-1e18, 0))
        if now - last < self.interval_s:
            self._last[reason] = (last, suppressed + 1)
            return
        self._last[reason] = (now, 0)
        if suppressed:
            message += f" ({suppressed} more like it in the last {self.interval_s:.0f} s not logged)"
        log.warning(message, *args)


class ClientConnection(asyncio.Protocol):
    """The bookie's end of one client's TCP connection: parses frames, hands them to the core,
    writes the answers back; paused while too much is in flight or unsent."""

    def __init__(self, server: BookieServer) -> None:
        self.server = server
        self.core = server.core
        self.limits = server.limits
        self.decoder = RequestDecoder(self.limits.frame_bytes_max, self.limits.entry_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.in_flight = 0
        self.closed = False
        self.principal: Principal | None = None
        self.host = "?"
        self._paused = False  # reading paused: in flight or journal
        self._throttled = False  # reading paused: the namespace's write quota (guard)
        self._writes_blocked = False  # parsing and reading stopped: too many unsent answer bytes
        self._transport_full = False  # the transport asked us to stop writing (pause_writing)
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._partial_since = 0.0
        self._partial_counted = 0  # this connection's share of the server's partial bytes
        self._idle_timer: asyncio.TimerHandle | None = None
        self._first_frame_timer: asyncio.TimerHandle | None = None
        self._unsent_timer: asyncio.TimerHandle | None = None
        self._close_after_flush = False
        self._loop = asyncio.get_running_loop()

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.host = str(peer[0]) if peer else "?"
        refusal = self.server.admit(self)
        if refusal is not None:
            self.server.refusals.warning(refusal, "refusing connection from %s: %s", self.host, refusal)
            transport.abort()  # type: ignore[attr-defined]
            self.closed = True
            return
        self.transport.set_write_buffer_limits(high=self.limits.unsent_bytes_max)  # type: ignore[union-attr]
        self._first_frame_timer = self._loop.call_later(self.limits.first_frame_timeout_s,
                                                        self._no_first_frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.release(self)
        self._set_partial(0)
        self.core.drop_waiters(self)
        for timer in (self._idle_timer, self._first_frame_timer, self._unsent_timer):
            if timer is not None:
                timer.cancel()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.decoder.receive_data(data)
        self._process()

    def pause_writing(self) -> None:
        self._transport_full = True
        self._block_on_writes()

    def resume_writing(self) -> None:
        self._transport_full = False
        self._maybe_unblock_writes()

    # ------------------------------------------------------------------ parsing

    def _process(self) -> None:
        """Parse and dispatch whole frames while the connection may take more work."""
        decoder = self.decoder
        server = self.server
        guard = server.guard
        handlers = server.handlers
        unsent_bytes_max = self.limits.unsent_bytes_max
        while not self.closed and not self._close_after_flush and not self._throttled:
            if self._out_bytes + self._transport_buffered() >= unsent_bytes_max:
                self._block_on_writes()
                break
            try:
                request = decoder.next_message()
            except FrameError as exc:
                if self._refuse(exc):
                    return
                continue
            if request is None:
                break
            if self._first_frame_timer is not None:
                self._first_frame_timer.cancel()
                self._first_frame_timer = None
            self.in_flight += 1
            if guard is None:
                handlers[type(request)](request, self)
            else:
                guard.dispatch(request, self)
            if self.in_flight >= self.limits.in_flight_max:
                break
        if self.closed:
            return
        self._set_partial(decoder.pending_bytes)
        if self.closed:
            return
        if decoder.pending_bytes:
            self._watch_partial_frame()
        if not self._paused and (self.in_flight >= self.limits.in_flight_max or server.journal_full()):
            self._pause()

    @property
    def unsent_bytes(self) -> int:
        """Answers queued or buffered in the transport that the client has not taken yet."""
        return self._out_bytes + self._transport_buffered()

    def _transport_buffered(self) -> int:
        transport = self.transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def _set_partial(self, pending_bytes: int) -> None:
        """Keep the server's total of bytes held in unfinished frames; close this connection if it
        would pass the global cap."""
        delta = pending_bytes - self._partial_counted
        if delta == 0:
            return
        self._partial_counted = pending_bytes
        self.server.partial_bytes += delta
        if delta > 0 and self.server.partial_bytes > self.limits.partial_bytes_max:
            self.server.partial_closed += 1
            self.server.refusals.warning("partial", "closing connection from %s: partial frames hold "
                                         "%d bytes over all connections (maximum %d)", self.peer,
                                         self.server.partial_bytes, self.limits.partial_bytes_max)
            self.send(encode_response(ErrorResponse(0, 0, Status.TOO_MANY_REQUESTS,
                                                    "the bookie holds too many partial frames; "
                                                    "send whole frames promptly")))
            self._flush()
            self.close()
            self._set_partial(0)

    def _pause(self) -> None:
        self._paused = True
        self.transport.pause_reading()  # type: ignore[union-attr]
        self.server.paused.add(self)
        self.server.metrics_backpressure()

    def maybe_resume(self) -> None:
        if (self._paused and not self.closed and self.in_flight <= self.limits.in_flight_max // 2
                and not self.server.journal_full()):
            self._paused = False
            self.server.paused.discard(self)
            if not self._writes_blocked and not self._throttled:
                self.transport.resume_reading()  # type: ignore[union-attr]
            if self.decoder.pending_bytes:
                self._loop.call_soon(self._process_if_open)

    def _process_if_open(self) -> None:
        if not self.closed and not self._paused and not self._writes_blocked and not self._throttled:
            self._process()

    def throttle(self, delay_s: float) -> None:
        """Stop reading this connection for `delay_s` (a namespace over its write quota)."""
        if self._throttled or self.closed:
            return
        self._throttled = True
        self.transport.pause_reading()  # type: ignore[union-attr]
        self._loop.call_later(delay_s, self._unthrottle)

    def _unthrottle(self) -> None:
        self._throttled = False
        if self.closed:
            return
        if not self._paused and not self._writes_blocked:
            self.transport.resume_reading()  # type: ignore[union-attr]
        self._loop.call_soon(self._process_if_open)

    # ------------------------------------------------------------------ unsent answers (S4)

    def _block_on_writes(self) -> None:
        if self._writes_blocked or self.closed:
            return
        self._writes_blocked = True
        self.server.unsent_blocks += 1
        self.transport.pause_reading()  # type: ignore[union-attr]
        self._unsent_timer = self._loop.call_later(self.limits.unsent_timeout_s, self._unsent_expired)

    def _maybe_unblock_writes(self) -> None:
        if (not self._writes_blocked or self.closed or self._transport_full
                or self._out_bytes + self._transport_buffered() >= self.limits.unsent_bytes_max):
            return
        self._writes_blocked = False
        if self._unsent_timer is not None:
            self._unsent_timer.cancel()
            self._unsent_timer = None
        if not self._paused and not self._throttled:
            self.transport.resume_reading()  # type: ignore[union-attr]
        self._loop.call_soon(self._process_if_open)

    def _unsent_expired(self) -> None:
        self._unsent_timer = None
        if self.closed or not self._writes_blocked:
            return
        self.server.unsent_closed += 1
        self.server.refusals.warning("unsent", "closing connection from %s: %d bytes of answers not "
                                     "taken for %.0f s (maximum %d)", self.peer,
                                     self._out_bytes + self._transport_buffered(),
                                     self.limits.unsent_timeout_s, self.limits.unsent_bytes_max)
        self.abort()

    # ------------------------------------------------------------------ Reply (used by the core)

    def send(self, frame: bytes) -> None:
        if self.closed:
            return
        self._out.append(frame)
        self._out_bytes += len(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def request_done(self) -> None:
        self.in_flight -= 1
        if self._paused:
            self.maybe_resume()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and not self.closed:
            out = self._out
            self._out = []
            self._out_bytes = 0
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))  # type: ignore[union-attr]
            if self._close_after_flush:
                self.close()
                return
            if self._writes_blocked:
                self._maybe_unblock_writes()

    def close_after_answer(self) -> None:
        """Close once what is queued has been handed to the transport (it sends it, then closes)."""
        self._close_after_flush = True
        if not self._flush_scheduled:
            self._flush()
            self.close()

    def peer_certificate(self) -> dict[str, Any] | None:
        if self.transport is None:
            return None
        return self.transport.get_extra_info("peercert")  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ silent and idle partial frames

    def _no_first_frame(self) -> None:
        self._first_frame_timer = None
        if self.closed:
            return
        self.server.idle_closed += 1
        self.server.refusals.warning("silent", "closing connection from %s: no whole frame within "
                                     "%.1f s of connecting", self.peer, self.limits.first_frame_timeout_s)
        self.abort()

    def _watch_partial_frame(self) -> None:
        self._partial_since = self._loop.time()
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_later(self.limits.idle_timeout_s, self._check_idle)

    def _check_idle(self) -> None:
        self._idle_timer = None
        if (self.closed or not self.decoder.pending_bytes or self._paused or self._writes_blocked
                or self._throttled):
            return  # a frame we stopped parsing on purpose is not the client's stall
        idle_s = self._loop.time() - self._partial_since
        if idle_s >= self.limits.idle_timeout_s:
            self.server.idle_closed += 1
            log.info("closing connection from %s: partial frame idle for %.1f s", self.peer, idle_s)
            self.send(encode_response(ErrorResponse(
                0, 0, Status.BAD_REQUEST,
                f"partial frame of {self.decoder.pending_bytes} bytes idle for more than "
                f"{self.limits.idle_timeout_s} s")))
            self._flush()
            self.close()
            return
        self._idle_timer = self._loop.call_later(self.limits.idle_timeout_s - idle_s,
                                                 self._check_idle)

    # ------------------------------------------------------------------ misc

    def _refuse(self, exc: FrameError) -> bool:
        """Answer a refused frame; returns True when the connection must close."""
        self.server.metrics_protocol_error()
        self.send(encode_response(ErrorResponse(exc.request_id, exc.opcode, exc.status, str(exc))))
        if exc.fatal:
            log.info("closing connection from %s: %s", self.peer, exc)
            self._flush()
            self.close()
            return True
        return False

    @property
    def peer(self) -> str:
        if self.transport is None:
            return "?"
        address = self.transport.get_extra_info("peername")
        return f"{address[0]}:{address[1]}" if address else "?"

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.closed = True

    def abort(self) -> None:
        """Drop the connection now, discarding unsent answers (a client that does not read them)."""
        if self.transport is not None:
            self.transport.abort()  # type: ignore[attr-defined]
        self.closed = True


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
            BookieInfoRequest: self._on_info,
            AuthRequest: self._on_auth_unneeded,
        }
        self.guard = guard
        if guard is not None:
            guard.handlers = self.handlers
        self.refusals = RateLimitedLog()
        self.protocol_errors = 0
        self.backpressure_pauses = 0
        self.partial_bytes = 0
        self.refused_connections: dict[str, int] = {"total": 0, "per_host": 0}
        self.idle_closed = 0
        self.unsent_blocks = 0
        self.unsent_closed = 0
        self.partial_closed = 0

    def admit(self, connection: ClientConnection) -> str | None:
        """Count a new connection in, or say why it is refused."""
        if len(self.connections) >= self.limits.connections_max:
            self.refused_connections["total"] += 1
            return f"{len(self.connections)} connections open (maximum {self.limits.connections_max})"
        count = self.per_host.get(connection.host, 0)
        if count >= self.limits.connections_per_host_max:
            self.refused_connections["per_host"] += 1
            return (f"{count} connections open from {connection.host} (maximum "
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
