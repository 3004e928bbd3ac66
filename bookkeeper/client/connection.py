"""One TCP connection to one bookie, with a table of pending requests keyed by request id.

Requests queued in one loop iteration are written with one system call. Every pending request
has a deadline; a sweeper fails the late ones with `RequestTimeoutError` (outcome unknown). When
the connection closes, every pending future fails with `BookieUnavailableError`, the cause
chained. At most `in_flight_max` requests are pending; `request()` waits for room beyond that.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.errors import (
    AuthenticationError,
    BookieUnavailableError,
    DlogError,
    ProtocolError,
    RequestTimeoutError,
    error_for_status,
)
from bookkeeper.protocol import wire
from bookkeeper.protocol.ticks import STALL_MS
from bookkeeper.protocol.wire import (
    AddRequest,
    AddResponse,
    AuthMechanism,
    AuthRequest,
    AuthResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    ErrorResponse,
    FrameError,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    ResponseDecoder,
    WriteLacRequest,
    WriteLacResponse,
    encode_request,
)
from bookkeeper.security.tls import host_of, looks_like_tls

_REQUEST_IDS = itertools.count(1)


@dataclass(frozen=True, slots=True)
class ConnectSecurity:
    """How a client reaches bookies: TLS (a context; the bookie's host is checked against its
    certificate when the context says so) and the credentials of the AUTH exchange."""

    tls: ssl.SSLContext | None = None
    token: str | None = None
    certificate_auth: bool = False  # authenticate with the TLS client certificate instead

    @property
    def authenticates(self) -> bool:
        return self.token is not None or self.certificate_auth


NO_CONNECT_SECURITY = ConnectSecurity()


# How a connection reaches a bookie: (protocol factory, host, port, TLS options) -> (transport,
# protocol), as `loop.create_connection` does over TCP (the default); the ledger simulator dials
# through its simulated network instead.
Dial = Callable[..., Awaitable[tuple[asyncio.BaseTransport, asyncio.BaseProtocol]]]


def next_request_id() -> int:
    """The one source of request ids in a process: every pool and connection draws from it, so an
    id is never pending twice on any connection (they are 64-bit: no wrap in practice)."""
    return next(_REQUEST_IDS)


class EncodedRequest:
    """A request already encoded to its frame (the hot path builds frames directly)."""

    __slots__ = ("request_id", "frame")

    def __init__(self, request_id: int, frame: bytes) -> None:
        self.request_id = request_id
        self.frame = frame


class BookieConnection(asyncio.Protocol):
    def __init__(self, address: str, *, timeout_s: float = 5.0, in_flight_max: int = 10_000,
                 frame_bytes_max: int = wire.FRAME_BYTES_MAX_DEFAULT, clock: Clock = SYSTEM_CLOCK) -> None:
        """`clock`: what request deadlines are measured on (the pool's)."""
        self.address = address
        self.timeout_s = timeout_s
        self.clock = clock
        self.in_flight_max = in_flight_max
        self._decoder = ResponseDecoder(frame_bytes_max)
        # request id -> (callback of its outcome, deadline): one kind, whether a caller awaits a
        # future (`send` settles it from its callback) or takes the outcome directly
        self._pending: dict[int, tuple[Callable[[Any], None], float]] = {}
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._closed_error: BaseException | None = None
        self._room = asyncio.Event()
        self._room.set()
        self._sweeper: asyncio.Task[None] | None = None
        self._heard_from = False
        self._loop = asyncio.get_running_loop()

    @classmethod
    async def open(cls, address: str, *, connect_timeout_s: float = 5.0,
                   security: ConnectSecurity = NO_CONNECT_SECURITY, dial: Dial | None = None,
                   **options: Any) -> BookieConnection:
        """Connect (with TLS if configured) and authenticate (AUTH) before any request."""
        host, _, port = address.rpartition(":")
        dial = dial or asyncio.get_running_loop().create_connection
        connection = cls(address, **options)
        tls: dict[str, Any] = {}
        if security.tls is not None:
            tls = {"ssl": security.tls, "server_hostname": host_of(address),
                   "ssl_handshake_timeout": connect_timeout_s}
        try:
            async with asyncio.timeout(connect_timeout_s):
                await dial(lambda: connection, host_of(address), int(port), **tls)
        except ssl.SSLCertVerificationError as exc:
            raise AuthenticationError(f"bookie {address} is not trusted: {exc.verify_message} (its "
                                      "certificate must be signed by the CA in ca_file and name its "
                                      "host)") from exc
        except ssl.SSLError as exc:
            raise BookieUnavailableError(f"TLS with bookie {address} failed: {exc.reason or exc} (does "
                                         "it serve TLS?)") from exc
        except (TimeoutError, OSError) as exc:
            raise BookieUnavailableError(f"cannot connect to bookie {address}: {exc!r}") from exc
        if security.authenticates:
            await connection.authenticate(security)
        return connection

    async def authenticate(self, security: ConnectSecurity) -> str:
        """The AUTH exchange; returns the principal the bookie knows us by."""
        if security.token is not None:
            request = AuthRequest(self.next_request_id(), AuthMechanism.TOKEN, security.token.encode())
        else:
            request = AuthRequest(self.next_request_id(), AuthMechanism.CERTIFICATE)
        try:
            response = await self.request(request)
        except DlogError:
            await self.close()
            raise
        if not isinstance(response, AuthResponse):
            await self.close()
            raise AuthenticationError(f"bookie {self.address} answered AUTH with {response!r}")
        return response.principal

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sweeper = self._loop.create_task(self._sweep())

    def data_received(self, data: bytes) -> None:
        if not self._heard_from and looks_like_tls(data[:2]):
            self._fail_all(ProtocolError(f"bookie {self.address} speaks TLS: set ca_file in the "
                                         "[security] table of client.toml (--config / $DLOG_CONFIG)"))
            return
        self._heard_from = True
        self._decoder.receive_data(data)
        while True:
            try:
                response = self._decoder.next_message()
            except FrameError as exc:
                if exc.fatal:
                    self._fail_all(exc)
                    return
                self._complete(exc.request_id, exc)
                continue
            if response is None:
                return
            if isinstance(response, ErrorResponse):
                message = f"{self.address}: {response.message}"
                if response.status == wire.Status.BAD_VERSION:  # an older bookie
                    message += (f" (this client speaks protocol version {wire.PROTOCOL_VERSION}: run "
                                "bookies and clients of one release, bookies upgraded first)")
                self._complete(response.request_id, error_for_status(response.status, message))
            else:
                self._complete(response.request_id, response)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None and not self._heard_from:
            exc = ConnectionResetError(f"bookie {self.address} closed the connection before answering "
                                       "(a TLS bookie does that to a plaintext client: set ca_file in "
                                       "client.toml)")
        self._fail_all(exc or ConnectionResetError(f"bookie {self.address} closed the connection"))

    # ------------------------------------------------------------------ requests

    @property
    def is_open(self) -> bool:
        return self._closed_error is None and self._transport is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @staticmethod
    def next_request_id() -> int:
        return next_request_id()

    async def request(self, request: Request, *, wait_s: float = 0.0) -> Any:
        """Send one request, return its response object or raise its error. `wait_s` extends the
        deadline for requests the bookie may hold on purpose (long polls)."""
        while len(self._pending) >= self.in_flight_max:
            self._room.clear()
            await self._room.wait()
        return await self.send(request, wait_s=wait_s)

    def send(self, request: Request, *, wait_s: float = 0.0) -> asyncio.Future[Any]:
        """Queue a request without waiting for room (callers bound their own in-flight count)."""
        future: asyncio.Future[Any] = self._loop.create_future()
        if self._closed_error is not None:
            future.set_exception(BookieUnavailableError(f"connection to {self.address} is closed"))
            return future
        frame = request.frame if type(request) is EncodedRequest else encode_request(request)
        self.send_callback(request.request_id, frame, lambda outcome: _settle(future, outcome), wait_s=wait_s)
        return future

    def send_callback(self, request_id: int, frame: bytes, callback: Callable[[Any], None], *,
                      wait_s: float = 0.0) -> None:
        """Send an encoded frame; `callback(response or error)` runs when it is answered, times
        out or the connection fails (never before this method returns)."""
        if self._closed_error is not None:
            self._loop.call_soon(callback, BookieUnavailableError(f"connection to {self.address} is closed"))
            return
        self._pending[request_id] = (callback, self.clock.monotonic_s() + self.timeout_s + wait_s)
        self._out.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self._transport is not None and self._closed_error is None:
            out = self._out
            self._out = []
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _complete(self, request_id: int, outcome: Any) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is None:
            return  # already timed out, or an answer to a request we never sent
        pending[0](outcome)
        if not self._room.is_set() and len(self._pending) < self.in_flight_max:
            self._room.set()

    async def _sweep(self) -> None:
        interval_s = max(0.01, min(1.0, self.timeout_s / 4))
        previous = self.clock.monotonic_s()
        while self._closed_error is None:
            await asyncio.sleep(interval_s)
            now = self.clock.monotonic_s()
            stall_s, previous = now - previous - interval_s, now
            if stall_s * 1000 >= STALL_MS:  # this process did not run: the stall is not the bookie's (ticks.py)
                self._pending = {request_id: (callback, deadline + stall_s)
                                 for request_id, (callback, deadline) in self._pending.items()}
                continue
            late = [request_id for request_id, (_, deadline) in self._pending.items()
                    if deadline <= now]
            for request_id in late:
                self._complete(request_id, RequestTimeoutError(
                    f"bookie {self.address} did not answer within {self.timeout_s} s"))

    def _fail_all(self, cause: BaseException) -> None:
        if self._closed_error is None:
            self._closed_error = cause
        pending, self._pending = self._pending, {}
        for callback, _ in pending.values():
            if isinstance(cause, DlogError) and not isinstance(cause, ProtocolError):
                error: BaseException = cause  # e.g. UNAUTHENTICATED: the bookie said why
            else:
                error = BookieUnavailableError(f"connection to bookie {self.address} lost: {cause}")
                error.__cause__ = cause
            callback(error)
        self._room.set()
        if self._sweeper is not None and self._sweeper is not asyncio.current_task():
            self._sweeper.cancel()
        if isinstance(cause, ProtocolError) and self._transport is not None:
            self._transport.close()

    async def close(self) -> None:
        self._fail_all(ConnectionAbortedError("closed by the client"))
        if self._transport is not None:
            self._transport.close()

    # ------------------------------------------------------------------ typed helpers

    async def add(self, ledger_id: int, entry_id: int, master_key: bytes, entry: bytes, *,
                  recovery: bool = False) -> AddResponse:
        return await self.request(AddRequest(self.next_request_id(), ledger_id, entry_id,
                                             master_key, entry, recovery))

    async def read(self, ledger_id: int, entry_id: int, *, fence_key: bytes | None = None,
                   previous_lac: int | None = None, timeout_ms: int = 0) -> ReadResponse:
        long_poll = previous_lac is not None
        return await self.request(ReadRequest(
            self.next_request_id(), ledger_id, entry_id, fence_key is not None, fence_key or b"",
            long_poll, previous_lac if previous_lac is not None else -1, timeout_ms), wait_s=timeout_ms / 1000)

    async def read_lac(self, ledger_id: int, *, previous_lac: int | None = None,
                       timeout_ms: int = 0) -> ReadLacResponse:
        long_poll = previous_lac is not None
        return await self.request(ReadLacRequest(self.next_request_id(), ledger_id, long_poll,
                                                 previous_lac if previous_lac is not None else -1, timeout_ms),
                                  wait_s=timeout_ms / 1000)

    async def write_lac(self, ledger_id: int, master_key: bytes, lac: int) -> WriteLacResponse:
        return await self.request(WriteLacRequest(self.next_request_id(), ledger_id, master_key,
                                                  lac))

    async def info(self) -> BookieInfoResponse:
        return await self.request(BookieInfoRequest(self.next_request_id()))


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    """A pending request's callback for a caller that awaits a future."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
