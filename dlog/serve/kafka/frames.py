"""Framing and dispatch of the Kafka protocol, server side: bytes in, requests or refusals out;
responses in, bytes out. No sockets, no clock, no asyncio.

Theory of operation. A connection feeds every byte it reads to `RequestDecoder.receive_data` and
then takes events from `next_event` until it returns None. A request frame is a 4-byte big-endian
size and that many bytes: a request header (version 1 for every version dlog decodes: api key,
api version, correlation id, nullable client id) and the body, decoded with kafka-python's class
for that API at that version. An event is one of:

- `Request`: answer it (unless `expects_response` is False: Produce with acks=0) by encoding a
  response message with `encode_response`. Kafka answers the requests of one connection in the
  order they came; the server must too.
- `RequestRefused`: what Kafka does with a frame it cannot serve, as a value. `response`, when set,
  is written first (only ApiVersions at an unknown version gets one: a v0 answer with
  UNSUPPORTED_VERSION and the supported list, and the connection stays open, so that the client
  retries with a version it now knows). When `close_connection` is set the server closes the
  connection without answering, as Kafka does for a frame over the size limit or with a negative
  size, an unknown api key, an unsupported version of any other API, and a body that does not parse
  (INVALID_REQUEST); the decoder itself stops producing events then.
- `SaslToken`: after a SaslHandshake v0 the client sends bare SASL tokens in size-prefixed frames
  without a request header; the server sets `raw_sasl_tokens` while it expects them.

Refusals carry whatever of the header was readable, so the server can log which request of which
client it refused.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from kafka.protocol.api_message import ApiMessage

from bookkeeper.errors import invariant
from dlog.serve.kafka.apis import API_VERSIONS, SUPPORTED_APIS, Api, api_name, api_versions_response
from dlog.serve.kafka.errors import ErrorCode

# Kafka's socket.request.max.bytes: the largest request frame read; a larger one closes the
# connection before its body is read. A server may lower it before authentication (Kafka allows
# 512 KiB then: sasl.server.max.receive.size).
REQUEST_BYTES_MAX_DEFAULT = 100 * 1024 * 1024

_SIZE = struct.Struct(">i")
_HEADER_FIXED = struct.Struct(">hhih")  # api key, api version, correlation id, client id length
_CORRELATION = struct.Struct(">hhi")
_COMPACT_AT = 65536  # consumed bytes after which the receive buffer drops them


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@dataclass(frozen=True, slots=True)
class Request:
    header: RequestHeader
    api: Api
    body: Any  # the kafka-python request message, decoded at header.api_version
    size_bytes: int  # of the frame, without its size prefix

    @property
    def expects_response(self) -> bool:
        """False for Produce with acks=0: Kafka sends nothing back (and closes the connection when
        such a produce fails, the only way the client can learn of it)."""
        return bool(self.body.expect_response())

    def response(self, **fields: Any) -> ApiMessage:
        """A response message of this request's API and version, with `fields` set."""
        return self.api.response(version=self.header.api_version, **fields)


@dataclass(frozen=True, slots=True)
class RequestRefused:
    error: ErrorCode
    reason: str  # one line: what was wrong and what would be right
    close_connection: bool
    correlation_id: int | None = None
    api_key: int | None = None
    api_version: int | None = None
    client_id: str | None = None
    response: bytes | None = None  # a framed answer to write before anything else


@dataclass(frozen=True, slots=True)
class SaslToken:
    payload: bytes


Event = Request | RequestRefused | SaslToken


class RequestDecoder:
    """Splits one connection's bytes into events; see the module docstring."""

    def __init__(self, request_bytes_max: int = REQUEST_BYTES_MAX_DEFAULT) -> None:
        if request_bytes_max < _HEADER_FIXED.size:
            raise ValueError(f"request_bytes_max must be at least {_HEADER_FIXED.size}")
        self.request_bytes_max = request_bytes_max
        self.raw_sasl_tokens = False
        self.closed = False  # after a refusal that closes the connection: no more events
        self._buffer = bytearray()
        self._position = 0

    def receive_data(self, data: bytes) -> None:
        if self.closed:
            return
        if self._position > _COMPACT_AT and self._position * 2 > len(self._buffer):
            del self._buffer[: self._position]
            self._position = 0
        self._buffer += data

    @property
    def pending_bytes(self) -> int:
        """Bytes received and not yet returned as events (a partial frame, or whole frames not yet
        taken): a server stops reading while this is high."""
        return len(self._buffer) - self._position

    def next_event(self) -> Event | None:
        if self.closed:
            return None
        buffer, position = self._buffer, self._position
        if len(buffer) - position < _SIZE.size:
            return None
        (size,) = _SIZE.unpack_from(buffer, position)
        if size < 0 or size > self.request_bytes_max:
            return self._close(_oversized(size, self.request_bytes_max,
                                          bytes(buffer[position + 4: position + 4 + _CORRELATION.size])))
        if len(buffer) - position - _SIZE.size < size:
            return None
        start = position + _SIZE.size
        frame = bytes(buffer[start: start + size])
        self._position = start + size
        if self.raw_sasl_tokens:
            return SaslToken(frame)
        event = decode_request(frame)
        if isinstance(event, RequestRefused) and event.close_connection:
            return self._close(event)
        return event

    def _close(self, refusal: RequestRefused) -> RequestRefused:
        self.closed = True
        self._buffer = bytearray()
        self._position = 0
        return refusal


def _oversized(size: int, request_bytes_max: int, head: bytes) -> RequestRefused:
    known: dict[str, Any] = {}
    if len(head) == _CORRELATION.size:  # the header was already here: name the request
        api_key, api_version, correlation_id = _CORRELATION.unpack(head)
        known = {"api_key": api_key, "api_version": api_version, "correlation_id": correlation_id}
    what = "negative" if size < 0 else f"over the limit of {request_bytes_max} bytes"
    return RequestRefused(ErrorCode.INVALID_REQUEST,
                          f"request frame size {size} is {what} (request_bytes_max); the "
                          "connection is closed before its body is read", True, **known)


def decode_request(frame: bytes) -> Request | RequestRefused:
    """One request frame (without its size prefix) -> the request, or what Kafka does instead."""
    if len(frame) < _HEADER_FIXED.size:
        known = {}
        if len(frame) >= _CORRELATION.size:
            api_key, api_version, correlation_id = _CORRELATION.unpack_from(frame)
            known = {"api_key": api_key, "api_version": api_version, "correlation_id": correlation_id}
        return RequestRefused(ErrorCode.INVALID_REQUEST,
                              f"request frame of {len(frame)} bytes is shorter than a request "
                              f"header ({_HEADER_FIXED.size} bytes at least)", True, **known)
    api_key, api_version, correlation_id, client_id_length = _HEADER_FIXED.unpack_from(frame)
    known = {"api_key": api_key, "api_version": api_version, "correlation_id": correlation_id}
    body_start = _HEADER_FIXED.size + max(client_id_length, 0)
    if body_start > len(frame):
        return RequestRefused(ErrorCode.INVALID_REQUEST,
                              f"{api_name(api_key)} v{api_version} request header's client id of "
                              f"{client_id_length} bytes runs past the {len(frame)}-byte frame",
                              True, **known)
    known["client_id"] = (None if client_id_length < 0 else
                          frame[_HEADER_FIXED.size: body_start].decode("utf-8", "replace"))
    api = SUPPORTED_APIS.get(api_key)
    if api is None:
        return RequestRefused(ErrorCode.INVALID_REQUEST,
                              f"unknown api key {api_key} (supported: "
                              f"{', '.join(str(key) for key in sorted(SUPPORTED_APIS))})", True, **known)
    if not api.supports(api_version):
        return _unsupported_version(api, api_version, correlation_id, known)
    header = RequestHeader(api_key, api_version, correlation_id, known["client_id"])
    return _decode_body(api, header, frame, body_start)


def _unsupported_version(api: Api, api_version: int, correlation_id: int,
                         known: dict[str, Any]) -> RequestRefused:
    supported = f"{api.name} supports v{api.min_version}-v{api.max_version}"
    if api.key == API_VERSIONS:
        answer = api_versions_response(0, ErrorCode.UNSUPPORTED_VERSION)
        header = RequestHeader(API_VERSIONS, 0, correlation_id, None)
        return RequestRefused(ErrorCode.UNSUPPORTED_VERSION,
                              f"ApiVersions v{api_version} is not supported ({supported}); "
                              "answered with the supported list at v0", False,
                              response=encode_response(header, answer), **known)
    return RequestRefused(ErrorCode.UNSUPPORTED_VERSION,
                          f"{api.name} v{api_version} is not supported ({supported}; a client "
                          "picks its version from ApiVersions)", True, **known)


def _decode_body(api: Api, header: RequestHeader, frame: bytes, body_start: int) -> Request | RequestRefused:
    # ApiMessage.decode does not say where the body ended, and its generated decoder slices a
    # bytes or string field short instead of failing when the frame ends inside it: the one
    # place the codec reaches into kafka-python (pinned below 3.1) is this call to the same
    # generated decoder, which returns the end position too.
    version = header.api_version
    decode = api.request._struct.compiled_decode_from(
        version, compact=False, tagged=False, data_class=api.request)
    try:
        body, end = decode(memoryview(frame), body_start)
    except (struct.error, ValueError, IndexError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
        return _malformed(api, header, len(frame) - body_start, f"does not parse ({exc})")
    if end != len(frame):
        problem = ("ends inside a field" if end > len(frame)
                   else f"has {len(frame) - end} bytes after its last field")
        return _malformed(api, header, len(frame) - body_start, problem)
    return Request(header, api, body, len(frame))


def _malformed(api: Api, header: RequestHeader, body_bytes: int, problem: str) -> RequestRefused:
    return RequestRefused(ErrorCode.INVALID_REQUEST,
                          f"{api.name} v{header.api_version} request body of {body_bytes} bytes "
                          f"{problem}; the connection is closed as Kafka does",
                          True, header.correlation_id, header.api_key, header.api_version,
                          header.client_id)


def encode_response(header: RequestHeader, response: ApiMessage) -> bytes:
    """The framed answer to the request with `header`: size, response header v0 (its correlation
    id), and `response` encoded at the request's version."""
    invariant(header.api_key == response.API_KEY,
              f"a {api_name(response.API_KEY)} response cannot answer a {api_name(header.api_key)} request")
    body = response.encode(version=header.api_version)
    return _SIZE.pack(len(body) + 4) + struct.pack(">i", header.correlation_id) + bytes(body)


def encode_sasl_token(payload: bytes) -> bytes:
    """A bare SASL token frame, the answer to a `SaslToken` (after SaslHandshake v0)."""
    return _SIZE.pack(len(payload)) + payload
