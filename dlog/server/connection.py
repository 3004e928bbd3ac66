"""One Kafka client connection: bytes to requests (the codec's `RequestDecoder`), each request
answered by its own task, answers written in request order, as Kafka does.

Bounds. At most `in_flight_per_connection_max` requests are read and not yet answered: the
connection stops reading (TCP pushes back on the client) until the oldest is answered. Answers
queued for a slow reader are bounded by `unsent_bytes_max`: the writer waits for the socket to
drain below it, which holds the answers after it, which stops the reading. A refused frame is
handled as the codec says (answered, or the connection closed), logged at most once per reason
per interval.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from bookkeeper.bookie.refusals import RateLimitedLog
from dlog.serve.kafka import Request, RequestDecoder, RequestRefused, encode_response
from dlog.server.api import ConnectionState, KafkaApi
from dlog.server.settings import ServerSettings

log = logging.getLogger(__name__)
refusals = RateLimitedLog(log)
READ_BYTES = 256 * 1024


class KafkaConnection:
    def __init__(self, api: KafkaApi, settings: ServerSettings, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.api = api
        self.settings = settings
        self.reader = reader
        self.writer = writer
        self.peer = str(writer.get_extra_info("peername"))
        self.state = ConnectionState(settings.readers_per_connection_max)
        self._answers: asyncio.Queue[asyncio.Future[bytes | None] | None] = asyncio.Queue(
            maxsize=settings.in_flight_per_connection_max)
        writer.transport.set_write_buffer_limits(high=settings.unsent_bytes_max)

    async def serve(self) -> None:
        sender = asyncio.get_running_loop().create_task(self._send())
        try:
            await self._receive()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            await self._answers.put(None)  # the sender ends after the answers queued before
            try:
                await sender
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                sender.cancel()
                await self._close()

    async def _receive(self) -> None:
        decoder = RequestDecoder(self.settings.request_bytes_max)
        loop = asyncio.get_running_loop()
        while data := await self.reader.read(READ_BYTES):
            decoder.receive_data(data)
            while (event := decoder.next_event()) is not None:
                if isinstance(event, RequestRefused):
                    refusals.warning(f"refused {event.error.name}", "Kafka client %s (%s): %s", self.peer,
                                     event.client_id, event.reason)
                    if event.response is not None:
                        answered: asyncio.Future[bytes | None] = loop.create_future()
                        answered.set_result(event.response)
                        await self._answers.put(answered)
                    if event.close_connection:
                        return
                    continue
                if isinstance(event, Request):
                    await self._answers.put(loop.create_task(self._answer(event)))
                else:  # a bare SASL token: no SASL handshake is served, so none is expected
                    return

    async def _answer(self, request: Request) -> bytes | None:
        answer = await self.api.handle(request, self.state)
        if answer is None:
            raise ConnectionAbortedError(f"{request.api.name} is not served")
        if not request.expects_response:
            return None
        return encode_response(request.header, answer)

    async def _send(self) -> None:
        writer = self.writer
        while (answered := await self._answers.get()) is not None:
            try:
                data = await answered
            except ConnectionAbortedError:
                self.writer.transport.abort()
                return
            except Exception:
                log.exception("answering a request of Kafka client %s failed: the connection is closed", self.peer)
                self.writer.transport.abort()
                return
            if data is not None:
                writer.write(data)
                await writer.drain()  # waits only while more than unsent_bytes_max is queued

    async def _close(self) -> None:
        while not self._answers.empty():
            pending = self._answers.get_nowait()
            if pending is not None:
                pending.cancel()
        self.writer.close()
        await self.state.close()

    def stats(self) -> dict[str, Any]:
        return {"peer": self.peer, "in_flight": self._answers.qsize(), "readers": len(self.state.readers),
                "unsent_bytes": self.writer.transport.get_write_buffer_size()}
