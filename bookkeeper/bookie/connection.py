"""The bookie's end of one client connection: an asyncio Protocol around the sans-IO codec.

How it bounds what one client can make the bookie hold is told in server.py's docstring (S4);
the limits themselves are `ServerLimits`.

Under TLS the answers go to the transport in steps of `TLS_WRITE_STEP_BYTES`, each once the last
left the TLS layer: that layer hands what it is given to the TCP transport beneath, which no API
shows, so what waits there is kept small and the rest stays queued here, where it is counted.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from typing import Any, Protocol

from bookkeeper.bookie.bookie import BookieCore
from bookkeeper.bookie.guard import Guard
from bookkeeper.bookie.limits import ServerLimits
from bookkeeper.bookie.partial import PartialFrames
from bookkeeper.bookie.refusals import RateLimitedLog
from bookkeeper.bookie.unsent import UnsentAnswers
from bookkeeper.clock import Clock
from bookkeeper.protocol.wire import (
    PROTOCOL_VERSION,
    ErrorResponse,
    FrameError,
    RequestDecoder,
    Status,
    encode_response,
    with_version,
)
from bookkeeper.security.authz import Principal

TLS_WRITE_STEP_BYTES = 256 * 2**10


class ConnectionHost(Protocol):
    """What a connection uses of the server that accepted it (server.py's BookieServer): the core,
    the limits and the budgets shared by all connections, and the counters it bumps."""

    core: BookieCore
    limits: ServerLimits
    clock: Clock  # the loop's own time (SYSTEM_CLOCK; a simulator's loop clock): timers are set on both
    tls: ssl.SSLContext | None
    guard: Guard | None
    handlers: dict[type, Callable[[Any, Any], None]]
    requires_auth: bool
    unsent: UnsentAnswers
    partial: PartialFrames
    paused: set[ClientConnection]
    refusals: RateLimitedLog
    unsent_blocks: int
    unsent_closed: int
    idle_closed: int

    def journal_full(self) -> bool: ...

    def release(self, connection: ClientConnection) -> None: ...

    def metrics_backpressure(self) -> None: ...

    def metrics_protocol_error(self) -> None: ...


class ClientConnection(asyncio.Protocol):
    """The bookie's end of one client's TCP connection: parses frames, hands them to the core,
    writes the answers back; paused while too much is in flight or unsent."""

    def __init__(self, server: ConnectionHost, address: Any) -> None:
        """`address`: the peer's, as accept gave it (the connection is admitted before its transport
        exists: under TLS, before the handshake)."""
        self.server = server
        self.core = server.core
        self.limits = server.limits
        self.clock = server.clock
        self.decoder = RequestDecoder(self.limits.frame_bytes_max, self.limits.entry_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.in_flight = 0
        self.closed = False
        self.principal: Principal | None = None
        self.host = str(address[0]) if address else "?"
        self.peer = f"{address[0]}:{address[1]}" if address else "?"
        self._paused = False  # reading paused: in flight or journal
        self._throttled = False  # reading paused: the namespace's write quota (guard)
        self._writes_blocked = False  # parsing and reading stopped: too many unsent answer bytes
        self._transport_full = False  # the transport asked us to stop writing (pause_writing)
        self._out: list[bytes | memoryview] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._partial_since = 0.0
        self._partial_counted = 0  # this connection's share of the server's partial bytes
        self._idle_timer: asyncio.TimerHandle | None = None
        self._first_frame_timer: asyncio.TimerHandle | None = None
        self._unsent_timer: asyncio.TimerHandle | None = None
        self._close_after_flush = False
        self._partial_before_auth = False  # whether `_partial_counted` is in the before-AUTH total
        self._write_step = TLS_WRITE_STEP_BYTES if server.tls is not None else 0  # 0: all at once
        self.unsent_counted = 0  # this connection's share of the server's unsent bytes (unsent.py)
        self.unsent_holding = False  # whether unsent.py counts it among the connections holding some
        self._lost = False
        self._loop = asyncio.get_running_loop()
        self._accepted_s = self.clock.monotonic_s()  # the first frame is due this long after accept

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Plaintext: right after accept; TLS: once the handshake is done."""
        self.transport = transport  # type: ignore[assignment]
        if self.closed:  # the server stopped meanwhile
            transport.abort()  # type: ignore[attr-defined]
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._write_step:  # the next step goes once the TLS layer handed the last one down
            self.transport.set_write_buffer_limits(high=self._write_step, low=0)  # type: ignore[union-attr]
        else:
            self.transport.set_write_buffer_limits(high=self.limits.unsent_bytes_max)  # type: ignore[union-attr]
        self._first_frame_timer = self._loop.call_at(self._accepted_s + self.limits.first_frame_timeout_s,
                                                     self._no_first_frame)

    def open_failed(self) -> None:
        """No transport came (a failed or cancelled TLS handshake): the TLS layer would not report
        the loss, so the connection stops counting here."""
        self.connection_lost(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:  # a failed TLS handshake may report it twice
            return
        self._lost = True
        self.closed = True
        self.server.release(self)
        self._set_partial(0)
        self._note_unsent(gone=True)
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
        self._note_unsent()
        if self._answers_wait():
            self._block_on_writes()

    def resume_writing(self) -> None:
        self._transport_full = False
        if self._out and not self._flush_scheduled:
            self._flush()
        self._maybe_unblock_writes()

    # ------------------------------------------------------------------ parsing

    def _process(self) -> None:
        """Parse and dispatch whole frames while the connection may take more work."""
        decoder = self.decoder
        server = self.server
        guard = server.guard
        handlers = server.handlers
        unsent, unsent_bytes_max = server.unsent, self.limits.unsent_bytes_max
        while not self.closed and not self._close_after_flush and not self._throttled:
            held = self._out_bytes + self._transport_buffered()  # as _answers_wait, inlined: hot
            if held >= unsent_bytes_max or (held and unsent.bytes >= unsent.bytes_max):
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

    def _transport_buffered(self) -> int:
        transport = self.transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def _answers_wait(self) -> bool:
        """Whether the next request must wait for the client to take its answers: its own are at
        their cap, or it holds some while all connections' are at theirs (unsent.py)."""
        held = self._out_bytes + self._transport_buffered()
        return held >= self.limits.unsent_bytes_max or (held > 0 and self.server.unsent.full)

    def _set_partial(self, pending_bytes: int) -> None:
        """Count the bytes of its unfinished frame (partial.py); close when they may not be held."""
        before_auth = self.principal is None and self.server.requires_auth
        if pending_bytes == self._partial_counted and before_auth == self._partial_before_auth:
            return
        refusal = self.server.partial.hold(self.peer, self._partial_counted, self._partial_before_auth,
                                           pending_bytes, before_auth)
        if refusal is None:
            self._partial_counted, self._partial_before_auth = pending_bytes, before_auth
            return
        self._partial_counted = 0
        status, message = refusal
        self.send(encode_response(ErrorResponse(0, 0, status, message)))
        self._flush_and_close()

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
        self._note_unsent()  # a holder now: the sweep lets it go on once its answers were taken

    def _maybe_unblock_writes(self) -> None:
        if not self._writes_blocked or self.closed or self._answers_wait():
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

    def _note_unsent(self, gone: bool = False) -> None:
        """Tell the server's accounting what this connection holds now (unsent.py); `gone`: nothing,
        its transport is aborted or lost (a closing one still holds what it has to send)."""
        held = 0 if gone else self._out_bytes + self._transport_buffered()
        before, self.unsent_counted = self.unsent_counted, held
        if held or self.unsent_holding:
            self.server.unsent.note(self, before, held)
        else:  # the common case: the transport took everything
            self.server.unsent.bytes -= before

    def refresh_unsent(self) -> None:
        """The server's sweep: what the transport sent since, and whether to read again."""
        self._note_unsent()
        self._maybe_unblock_writes()

    # ------------------------------------------------------------------ Reply (used by the core)

    def send(self, frame: bytes) -> None:
        if self.closed:
            return
        if self.decoder.peer_version != PROTOCOL_VERSION:
            frame = with_version(frame, self.decoder.peer_version)  # a version 1 client
        self._queue(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _queue(self, frame: bytes) -> None:
        size = len(frame)
        self._out.append(frame)
        self._out_bytes += size
        self.unsent_counted += size
        self.server.unsent.bytes += size

    def request_done(self) -> None:
        self.in_flight -= 1
        if self._paused:
            self.maybe_resume()

    def _flush(self, everything: bool = False) -> None:
        self._flush_scheduled = False
        if not self._out or self.closed:
            return
        if self._write_step and not everything and not self._close_after_flush:
            if self._transport_full:
                return  # resume_writing hands down the next step
            self.transport.writelines(self._next_step())  # type: ignore[union-attr]
            if self._out and not self._transport_full:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
        else:
            out = self._out
            self._out = []
            self._out_bytes = 0
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))  # type: ignore[union-attr]
        self._note_unsent()
        if self._close_after_flush:
            self._flush_and_close()
            return
        if self._writes_blocked:
            self._maybe_unblock_writes()

    def _next_step(self) -> list[bytes | memoryview]:
        """Up to `TLS_WRITE_STEP_BYTES` from the front of the queue (a larger frame in parts)."""
        out, step = self._out, self._write_step
        count = size = 0
        while count < len(out) and size + len(out[count]) <= step:
            size += len(out[count])
            count += 1
        if count:
            pieces: list[bytes | memoryview] = out[:count]
            del out[:count]
        else:
            frame = memoryview(out[0])
            pieces, out[0] = [frame[:step]], frame[step:]
            size = step
        self._out_bytes -= size
        return pieces

    def _flush_and_close(self) -> None:
        """Hand everything queued to the transport (it sends it, then closes) and close."""
        if self._out and not self.closed:
            self._flush(everything=True)
        self.close()

    def close_after_answer(self) -> None:
        """Close once what is queued has been handed to the transport (it sends it, then closes)."""
        self._close_after_flush = True
        if not self._flush_scheduled:
            self._flush_and_close()

    def peer_certificate(self) -> dict[str, Any] | None:
        if self.transport is None:
            return None
        return self.transport.get_extra_info("peercert")

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
        self._partial_since = self.clock.monotonic_s()
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_later(self.limits.idle_timeout_s, self._check_idle)

    def _check_idle(self) -> None:
        self._idle_timer = None
        if (self.closed or not self.decoder.pending_bytes or self._paused or self._writes_blocked
                or self._throttled):
            return  # a frame we stopped parsing on purpose is not the client's stall
        idle_s = self.clock.monotonic_s() - self._partial_since
        if idle_s >= self.limits.idle_timeout_s:
            self.server.idle_closed += 1
            self.server.refusals.warning("idle", "closing connection from %s: partial frame idle for "
                                         "%.1f s", self.peer, idle_s)
            self.send(encode_response(ErrorResponse(
                0, 0, Status.BAD_REQUEST,
                f"partial frame of {self.decoder.pending_bytes} bytes idle for more than "
                f"{self.limits.idle_timeout_s} s")))
            self._flush_and_close()
            return
        self._idle_timer = self._loop.call_later(self.limits.idle_timeout_s - idle_s,
                                                 self._check_idle)

    # ------------------------------------------------------------------ misc

    def _refuse(self, exc: FrameError) -> bool:
        """Answer a refused frame; returns True when the connection must close."""
        self.server.metrics_protocol_error()
        answer = encode_response(ErrorResponse(exc.request_id, exc.opcode, exc.status, str(exc)))
        if exc.status == Status.BAD_VERSION:
            if not self.closed:  # in the refused version, which the peer can read
                self._queue(with_version(answer, exc.version))
        else:
            self.send(answer)
        if exc.fatal:
            self.server.refusals.warning("frame", "closing connection from %s: %s", self.peer, exc)
            self._flush_and_close()
            return True
        return False

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()  # it sends what it holds first: a client that never reads would
            if self._transport_buffered():  # keep it (and the connection) open for good
                self._loop.call_later(self.limits.unsent_timeout_s, self._abort_if_open)
        self.closed = True

    def _abort_if_open(self) -> None:
        if not self._lost:
            self.abort()

    def abort(self) -> None:
        """Drop the connection now, discarding unsent answers (a client that does not read them)."""
        if self.transport is not None:
            self.transport.abort()
        self.closed = True
        self._out, self._out_bytes = [], 0
        self._note_unsent(gone=True)


