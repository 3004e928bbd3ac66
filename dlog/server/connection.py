"""One Kafka client connection: bytes to requests (the codec's `RequestDecoder`), each request
answered by its own task, answers written in request order, as Kafka does.

Bounds. At most `in_flight_per_connection_max` requests are read and not yet answered: the
connection stops reading (TCP pushes back on the client) until the oldest is answered. Answers
queued for a slow reader are bounded by `unsent_bytes_max`: the writer waits for the socket to
drain below it, which holds the answers after it, which stops the reading. A refused frame is
handled as the codec says (answered, or the connection closed), logged at most once per reason
per interval.

Security (docs/serving.md, "Security"). With TLS configured the connection's first act is the TLS
handshake (counted against `connections_max` from accept). With a token key (and not
`allow_anonymous`) the client must authenticate with SASL before anything but ApiVersions is
answered: SaslHandshake (v0: the next frame is a bare SASL token; v1: SaslAuthenticate requests)
with PLAIN or OAUTHBEARER carrying a dlog token (`dlog.serve.kafka.sasl`), verified with the
cluster's one verifier (`bookkeeper.security.tokens`). Until then requests are handled one at a
time, frames are limited to `request_bytes_before_auth_max`, and the whole of it, TLS handshake
included, must end within `auth_timeout_s`; any other request, a refused token or a malformed SASL
message closes the connection with one rate-limited line (refused credentials are answered
SASL_AUTHENTICATION_FAILED first, as Kafka does). A token that expires ends the connection at its
next request.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from bookkeeper.bookie.refusals import RateLimitedLog
from bookkeeper.clock import monotonic_s, wall_ms
from bookkeeper.errors import AuthenticationError
from bookkeeper.security.authz import ANONYMOUS
from bookkeeper.security.tokens import TokenVerifier
from dlog.serve.kafka import (
    ErrorCode,
    Request,
    RequestDecoder,
    RequestRefused,
    SaslToken,
    encode_response,
    encode_sasl_token,
)
from dlog.serve.kafka.apis import API_VERSIONS, SASL_AUTHENTICATE, SASL_HANDSHAKE
from dlog.serve.kafka.sasl import MECHANISMS, SaslRefused, client_credentials
from dlog.server.api import ConnectionState, KafkaApi
from dlog.server.settings import ServerSettings

log = logging.getLogger(__name__)
refusals = RateLimitedLog(log)
READ_BYTES = 256 * 1024


class KafkaConnection:
    def __init__(self, api: KafkaApi, settings: ServerSettings, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, tls: ssl.SSLContext | None = None,
                 verifier: TokenVerifier | None = None, accepted_s: float | None = None) -> None:
        self.api = api
        self.settings = settings
        self.reader = reader
        self.writer = writer
        self.tls = tls
        self.verifier = verifier
        self.peer = str(writer.get_extra_info("peername"))
        authenticating = settings.requires_auth and verifier is not None
        self.state = ConnectionState(settings.readers_per_connection_max, api.ns.name,
                                     None if authenticating else ANONYMOUS)
        self._auth_deadline_s = (monotonic_s() if accepted_s is None else accepted_s) + settings.auth_timeout_s
        self._mechanism: str | None = None
        self._sasl_open = verifier is not None  # a SASL exchange may still come (with allow_anonymous too)
        self._answers: asyncio.Queue[asyncio.Future[bytes | None] | None] = asyncio.Queue(
            maxsize=settings.in_flight_per_connection_max)

    async def serve(self) -> None:
        if self.tls is not None and not await self._start_tls():
            return
        self.writer.transport.set_write_buffer_limits(high=self.settings.unsent_bytes_max)
        sender = asyncio.get_running_loop().create_task(self._send())
        try:
            await self._receive()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
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

    async def _start_tls(self) -> bool:
        assert self.tls is not None
        remaining = max(self._auth_deadline_s - monotonic_s(), 0.001)
        try:
            async with asyncio.timeout(remaining):
                await self.writer.start_tls(self.tls, ssl_handshake_timeout=remaining)
        except (TimeoutError, ssl.SSLError, ConnectionError, OSError) as exc:
            refusals.warning("tls", "TLS handshake with Kafka client %s failed (a plaintext client on the TLS "
                             "port?): %s", self.peer, exc or type(exc).__name__)
            self.writer.transport.abort()
            return False
        return True

    @property
    def authenticated(self) -> bool:
        return self.state.principal is not None

    async def _receive(self) -> None:
        settings = self.settings
        decoder = RequestDecoder(settings.request_bytes_max if self.authenticated
                                 else settings.request_bytes_before_auth_max)
        loop = asyncio.get_running_loop()
        while True:
            if self.authenticated:
                data = await self.reader.read(READ_BYTES)
            else:
                try:
                    async with asyncio.timeout(self._auth_deadline_s - monotonic_s()):
                        data = await self.reader.read(READ_BYTES)
                except TimeoutError:
                    refusals.warning("sasl timeout", "closed Kafka client %s: it did not authenticate within "
                                     "%.1f s (auth_timeout_s)", self.peer, settings.auth_timeout_s)
                    return
            if not data:
                return
            decoder.receive_data(data)
            while (event := decoder.next_event()) is not None:
                if isinstance(event, RequestRefused):
                    refusals.warning(f"refused {event.error.name}", "Kafka client %s (%s): %s", self.peer,
                                     event.client_id, event.reason)
                    if event.response is not None:
                        await self._queue(event.response)
                    if event.close_connection:
                        return
                    continue
                if not self.authenticated or (self._sasl_open and _is_sasl(event)):
                    if not await self._authenticate(event, decoder):
                        return
                    if self.authenticated:
                        decoder.request_bytes_max = settings.request_bytes_max
                    continue
                if isinstance(event, Request):
                    if self._expired():
                        return
                    await self._answers.put(loop.create_task(self._answer(event)))
                else:  # a bare SASL token after authentication: nothing expects one
                    refusals.warning("sasl state", "closed Kafka client %s: a SASL token after it authenticated",
                                     self.peer)
                    return

    def _expired(self) -> bool:
        principal = self.state.principal
        if principal is None or principal.expires_s is None or wall_ms() / 1000 < principal.expires_s:
            return False
        refusals.warning("sasl expired", "closed Kafka client %s: the token of %s expired", self.peer,
                         principal.name)
        return True

    async def _queue(self, data: bytes | None) -> None:
        answered: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        answered.set_result(data)
        await self._answers.put(answered)

    # ------------------------------------------------------------------ SASL

    async def _authenticate(self, event: Request | SaslToken, decoder: RequestDecoder) -> bool:
        """One event before authentication, handled in order; False: close the connection."""
        if isinstance(event, SaslToken):  # after SaslHandshake v0: the bare client message
            decoder.raw_sasl_tokens = False
            if self._verify(event.payload) is not None:
                return False  # Kafka closes a v0 exchange without an answer
            await self._queue(encode_sasl_token(b""))
            return True
        key = event.api.key
        if key == API_VERSIONS:
            await self._queue(await self._answer(event))
            return True
        if key == SASL_HANDSHAKE:
            mechanism = event.body.mechanism
            offered = mechanism in MECHANISMS
            self._mechanism = mechanism if offered else None
            if not offered:
                refusals.warning("sasl mechanism", "Kafka client %s asked for SASL mechanism %r (offered: %s)",
                                 self.peer, mechanism, ", ".join(MECHANISMS))
            elif event.header.api_version == 0:
                decoder.raw_sasl_tokens = True
            answer = event.response(error_code=ErrorCode.NONE if offered else ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                                    mechanisms=list(MECHANISMS))
            await self._queue(encode_response(event.header, answer))
            return offered
        if key == SASL_AUTHENTICATE:
            if self._mechanism is None:
                refusals.warning("sasl state", "closed Kafka client %s: SaslAuthenticate before SaslHandshake",
                                 self.peer)
                answer = event.response(error_code=ErrorCode.ILLEGAL_SASL_STATE,
                                        error_message="SaslHandshake first", auth_bytes=b"", session_lifetime_ms=0)
                await self._queue(encode_response(event.header, answer))
                return False
            problem = self._verify(bytes(event.body.auth_bytes))
            answer = event.response(error_code=ErrorCode.NONE if problem is None
                                    else ErrorCode.SASL_AUTHENTICATION_FAILED,
                                    error_message=problem, auth_bytes=b"", session_lifetime_ms=0)
            await self._queue(encode_response(event.header, answer))
            return problem is None  # refused: answered, then closed, as Kafka does
        refusals.warning("sasl first", "closed Kafka client %s (%s): %s before it authenticated with SASL "
                         "(SASL_SSL with PLAIN or OAUTHBEARER and a dlog token)", self.peer,
                         event.header.client_id, event.api.name)
        return False

    def _verify(self, message: bytes) -> str | None:
        """Authenticate with a client's SASL message: None when it succeeded, else why not (logged)."""
        assert self.verifier is not None
        mechanism = self._mechanism or "PLAIN"
        credentials = client_credentials(mechanism, message)
        if isinstance(credentials, SaslRefused):
            problem = credentials.reason
        else:
            try:
                principal = self.verifier.verify(credentials.token)
            except AuthenticationError as exc:
                problem = str(exc)
            else:
                self.state.principal = principal
                self._sasl_open = False
                self.api.authentications += 1
                log.debug("Kafka client %s authenticated as %s with %s", self.peer, principal.describe(), mechanism)
                return None
        self.api.authentications_failed += 1
        refusals.warning("sasl refused", "Kafka client %s: SASL %s authentication failed: %s", self.peer,
                         mechanism, problem)
        return f"authentication failed: {problem}"

    # ------------------------------------------------------------------ answers

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


def _is_sasl(event: Request | SaslToken) -> bool:
    return isinstance(event, SaslToken) or event.api.key in (SASL_HANDSHAKE, SASL_AUTHENTICATE)
