"""The bookie's TCP server: one asyncio Protocol per connection around the sans-IO codec.

A connection parses every whole frame in what arrived, hands each request to the core and
queues the answers; everything queued in one loop iteration goes out in one write. It bounds its
own memory: past `in_flight_max` unanswered requests, or while the journal holds more than its
maximum of bytes waiting for fsync, it stops reading the socket (TCP pushes back on the client)
until half of them are answered and the journal caught up, and a partial frame that makes no progress for
`idle_timeout_s` closes the connection. A frame it cannot accept gets an error answer; if the
stream lost its framing, the connection is closed after that answer, and only that connection.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from typing import Callable

from bookkeeper.bookie.bookie import BookieCore
from bookkeeper.protocol import wire
from bookkeeper.protocol.wire import (
    AddRequest,
    BookieInfoRequest,
    BookieInfoResponse,
    CheckEntriesRequest,
    ErrorResponse,
    FrameError,
    ReadLacRequest,
    ReadRequest,
    RequestDecoder,
    Status,
    WriteLacRequest,
    encode_response,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerLimits:
    frame_bytes_max: int = wire.FRAME_BYTES_MAX_DEFAULT
    entry_bytes_max: int = wire.ENTRY_BYTES_MAX_DEFAULT
    in_flight_max: int = 10_000
    idle_timeout_s: float = 30.0
    connections_max: int = 4096


class ClientConnection(asyncio.Protocol):
    """The bookie's end of one client's TCP connection: parses frames, hands them to the core,
    writes the answers back; paused while too much is in flight or unanswered."""

    def __init__(self, server: BookieServer) -> None:
        self.server = server
        self.core = server.core
        self.limits = server.limits
        self.decoder = RequestDecoder(self.limits.frame_bytes_max, self.limits.entry_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.in_flight = 0
        self.closed = False
        self._paused = False
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._partial_since = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if len(self.server.connections) >= self.limits.connections_max:
            log.warning("refusing connection: %d connections open (maximum %d)",
                        len(self.server.connections), self.limits.connections_max)
            transport.close()
            self.closed = True
            return
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self.server.paused.discard(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        decoder = self.decoder
        decoder.receive_data(data)
        handlers = self.server.handlers
        while True:
            try:
                request = decoder.next_message()
            except FrameError as exc:
                if self._refuse(exc):
                    return
                continue
            if request is None:
                break
            self.in_flight += 1
            handlers[type(request)](request, self)
        if decoder.pending_bytes:
            self._watch_partial_frame()
        if not self._paused and (self.in_flight >= self.limits.in_flight_max
                                 or self.server.journal_full()):
            self._pause()

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
            self.transport.resume_reading()  # type: ignore[union-attr]

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

    # ------------------------------------------------------------------ Reply (used by the core)

    def send(self, frame: bytes) -> None:
        if self.closed:
            return
        self._out.append(frame)
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
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))  # type: ignore[union-attr]

    # ------------------------------------------------------------------ idle partial frames

    def _watch_partial_frame(self) -> None:
        self._partial_since = self._loop.time()
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_later(self.limits.idle_timeout_s, self._check_idle)

    def _check_idle(self) -> None:
        self._idle_timer = None
        if self.closed or not self.decoder.pending_bytes:
            return
        idle_s = self._loop.time() - self._partial_since
        if idle_s >= self.limits.idle_timeout_s:
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


class BookieServer:
    """Listens, owns the connections, routes requests to the core."""

    def __init__(self, core: BookieCore, limits: ServerLimits, info: Callable[[], BookieInfoResponse],
                 journal_full: Callable[[], bool] = lambda: False) -> None:
        self.core = core
        self.limits = limits
        self._info = info
        self.journal_full = journal_full
        self.connections: set[ClientConnection] = set()
        self.paused: set[ClientConnection] = set()  # not read until the journal or answers catch up
        self._server: asyncio.Server | None = None
        self.handlers = {
            AddRequest: core.on_add,
            ReadRequest: core.on_read,
            ReadLacRequest: core.on_read_lac,
            WriteLacRequest: core.on_write_lac,
            BookieInfoRequest: self._on_info,
            CheckEntriesRequest: core.on_check_entries,
        }
        self.protocol_errors = 0
        self.backpressure_pauses = 0

    def _on_info(self, request: BookieInfoRequest, reply: ClientConnection) -> None:
        info = self._info()
        reply.send(encode_response(BookieInfoResponse(request.request_id, info.free_bytes,
                                                      info.total_bytes, info.state,
                                                      info.bookie_id)))
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

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: ClientConnection(self), host, port,
                                                reuse_address=True, backlog=1024)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
