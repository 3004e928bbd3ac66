"""One connection per bookie, opened lazily, shared by every ledger of a client.

`send` never blocks: with no open connection it queues the request, connects in the background
and sends once connected, or fails every queued request with `BookieUnavailableError`. After a
failed connect the bookie is refused at once for `reconnect_backoff_s`, so a dead bookie costs one
connect attempt per back-off period instead of one per request. At most `queued_requests_max`
requests wait for one bookie's connection; beyond that a request fails at once with
TooManyRequestsError (retryable) instead of growing the queue without bound.

The back-off is measured on the injected clock (`bookkeeper.clock`) and connections are opened
through the injected `dial` (TCP by default): the ledger simulator runs the pool on simulated time
over its simulated network.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from bookkeeper.client.batcher import AddBatcher, AddSink
from bookkeeper.client.connection import (
    NO_CONNECT_SECURITY,
    BookieConnection,
    ConnectSecurity,
    Dial,
    EncodedRequest,
    next_request_id,
)
from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.errors import BookieUnavailableError, DlogError, TooManyRequestsError
from bookkeeper.protocol.wire import Request


class BookiePool:
    def __init__(self, resolve: Callable[[str], str] | None = None, *, timeout_s: float = 5.0,
                 connect_timeout_s: float = 3.0, reconnect_backoff_s: float = 0.2,
                 in_flight_max: int = 10_000, queued_requests_max: int = 10_000,
                 security: ConnectSecurity = NO_CONNECT_SECURITY, clock: Clock = SYSTEM_CLOCK,
                 dial: Dial | None = None) -> None:
        self.security = security
        self.clock = clock
        self.dial = dial
        self._resolve = resolve or (lambda bookie_id: bookie_id)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.reconnect_backoff_s = reconnect_backoff_s
        self.in_flight_max = in_flight_max
        self.queued_requests_max = queued_requests_max
        self._connections: dict[str, BookieConnection] = {}
        self._connecting: dict[str, asyncio.Task[None]] = {}
        self._queued: dict[str, list[tuple[Request, float, asyncio.Future[Any]]]] = {}
        self._failed_at: dict[str, float] = {}
        self._closed = False
        self._batchers: dict[str, AddBatcher] = {}

    @staticmethod
    def next_request_id() -> int:
        return next_request_id()

    def send(self, bookie_id: str, request: Request, *, wait_s: float = 0.0) -> asyncio.Future[Any]:
        connection = self._connections.get(bookie_id)
        if connection is not None and connection.is_open:
            return connection.send(request, wait_s=wait_s)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._closed:
            future.set_exception(BookieUnavailableError("the client is closed"))
            return future
        failed_at = self._failed_at.get(bookie_id)
        if failed_at is not None and self.clock.monotonic_s() - failed_at < self.reconnect_backoff_s:
            future.set_exception(BookieUnavailableError(f"bookie {bookie_id} is unreachable "
                                                        "(connect failed moments ago)"))
            return future
        queued = self._queued.setdefault(bookie_id, [])
        if len(queued) >= self.queued_requests_max:
            future.set_exception(TooManyRequestsError(
                f"{len(queued)} requests already wait for the connection to bookie {bookie_id} "
                f"(queued_requests_max {self.queued_requests_max})"))
            return future
        queued.append((request, wait_s, future))
        if bookie_id not in self._connecting:
            self._connecting[bookie_id] = loop.create_task(self._connect(bookie_id))
        return future

    def send_callback(self, bookie_id: str, request_id: int, frame: bytes,
                      callback: Callable[[Any], None], *, wait_s: float = 0.0) -> None:
        """Like `send` for an encoded frame, answering through `callback` (no future per request)."""
        connection = self._connections.get(bookie_id)
        if connection is not None and connection.is_open:
            connection.send_callback(request_id, frame, callback, wait_s=wait_s)
            return
        future = self.send(bookie_id, EncodedRequest(request_id, frame), wait_s=wait_s)  # type: ignore[arg-type]
        future.add_done_callback(lambda done: callback(done.exception() or done.result()))

    def queue_add(self, bookie_id: str, sink: AddSink, ledger_id: int, master_key: bytes,
                  recovery: bool, entry_id: int, packed_entry: bytes) -> None:
        """Queue an add for the bookie's next ADD_BATCH frame (batcher.py); the answer reaches
        `sink.on_adds_answered` together with those of the other entries of the frame."""
        batcher = self._batchers.get(bookie_id)
        if batcher is None:
            batcher = self._batchers[bookie_id] = AddBatcher(bookie_id, self.send_callback,
                                                             next_request_id)
        batcher.add(sink, ledger_id, master_key, recovery, entry_id, packed_entry)

    @property
    def add_frames_sent(self) -> int:
        """ADD_BATCH frames sent so far, to every bookie."""
        return sum(batcher.frames_sent for batcher in self._batchers.values())

    async def _connect(self, bookie_id: str) -> None:
        try:
            connection = await BookieConnection.open(
                self._resolve(bookie_id), connect_timeout_s=self.connect_timeout_s,
                timeout_s=self.timeout_s, in_flight_max=self.in_flight_max, security=self.security,
                dial=self.dial, clock=self.clock)
        except DlogError as exc:  # unreachable, or refused our TLS or credentials
            self._failed_at[bookie_id] = self.clock.monotonic_s()
            for _, _, future in self._queued.pop(bookie_id, []):
                if not future.done():
                    future.set_exception(exc)
            return
        finally:
            self._connecting.pop(bookie_id, None)
        self._failed_at.pop(bookie_id, None)
        old = self._connections.get(bookie_id)
        if old is not None:
            await old.close()
        self._connections[bookie_id] = connection
        for request, wait_s, future in self._queued.pop(bookie_id, []):
            _chain(connection.send(request, wait_s=wait_s), future)

    async def close(self) -> None:
        self._closed = True
        for batcher in self._batchers.values():
            batcher.flush()  # its answers are the "client is closed" errors below
        for task in list(self._connecting.values()):
            task.cancel()
        for connection in list(self._connections.values()):
            await connection.close()
        self._connections.clear()
        for queued in self._queued.values():
            for _, _, future in queued:
                if not future.done():
                    future.set_exception(BookieUnavailableError("the client is closed"))
        self._queued.clear()


def _chain(source: asyncio.Future[Any], target: asyncio.Future[Any]) -> None:
    def copy(done: asyncio.Future[Any]) -> None:
        if target.done():
            return
        if done.cancelled():
            target.cancel()
        elif done.exception() is not None:
            target.set_exception(done.exception())  # type: ignore[arg-type]
        else:
            target.set_result(done.result())

    source.add_done_callback(copy)
