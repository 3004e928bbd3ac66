"""Sans-IO codec of the bookie wire protocol: bytes <-> frozen dataclasses.

Theory of operation. Every message is one frame: a 4-byte big-endian length (the bytes that
follow it), then a 12-byte header, then an opcode-specific body. `docs/protocol.md` gives every
byte. A decoder is fed whatever bytes arrived (`receive_data`) and hands back whole messages
(`next_message`) until it needs more data. It owns no socket and no clock: the server decides what
an idle partial frame means, the client decides what a timeout means.

A frame the decoder cannot accept raises `FrameError`. `fatal=True` means the byte stream lost its
framing (bad length, wrong version): the peer must be told and the connection closed. `fatal=False`
means the frame was well delimited but its content was wrong (unknown opcode, short body): the
frame is consumed, an error goes back for its request id, and the connection carries on.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from bookkeeper.protocol import batch as _batch  # the batched messages of version 2
from bookkeeper.protocol import create as _create
from bookkeeper.protocol.frame import (
    AUTH_CREDENTIALS_BYTES_MAX,
    CHECK_ENTRIES_MAX,
    ENTRY_BYTES_MAX_DEFAULT,
    ERROR_MESSAGE_BYTES_MAX,
    FRAME_BYTES_MAX_DEFAULT,
    HEADER,
    HEADER_BYTES,
    KNOWN_FLAGS,
    LENGTH,
    MASTER_KEY_BYTES,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    V1_OPCODE_MAX,
    AuthMechanism,
    BookieState,
    EntryCheck,
    Flag,
    FrameError,
    OpCode,
    Status,
)

# the frame vocabulary (frame.py) is part of this codec's public face: importers take it from here
__all__ = [
    "AUTH_CREDENTIALS_BYTES_MAX", "CHECK_ENTRIES_MAX", "ENTRY_BYTES_MAX_DEFAULT",
    "ERROR_MESSAGE_BYTES_MAX", "FRAME_BYTES_MAX_DEFAULT", "HEADER", "HEADER_BYTES", "KNOWN_FLAGS",
    "LENGTH", "MASTER_KEY_BYTES", "PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "V1_OPCODE_MAX",
    "AuthMechanism", "BookieState", "EntryCheck", "Flag", "FrameError", "OpCode", "Status",
]

# ---------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class AddRequest:
    request_id: int
    ledger_id: int
    entry_id: int
    master_key: bytes
    packed_entry: bytes  # bookkeeper.protocol.entry: header, digest, payload
    recovery: bool = False


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """Read one entry; entry_id -1 asks only for the LAC (with FENCE: the fencing read)."""

    request_id: int
    ledger_id: int
    entry_id: int
    fence: bool = False
    master_key: bytes = b""
    long_poll: bool = False
    previous_lac: int = -1
    timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class ReadLacRequest:
    request_id: int
    ledger_id: int
    long_poll: bool = False
    previous_lac: int = -1
    timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class WriteLacRequest:
    request_id: int
    ledger_id: int
    master_key: bytes
    lac: int


@dataclass(frozen=True, slots=True)
class BookieInfoRequest:
    request_id: int


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """Who the client is: sent first on a connection to a bookie that requires authentication."""

    request_id: int
    mechanism: int  # AuthMechanism; unknown ones are refused with UNAUTHENTICATED
    credentials: bytes = b""

    def __repr__(self) -> str:  # never print a token
        return (f"AuthRequest(request_id={self.request_id}, mechanism={self.mechanism}, "
                f"credentials=<{len(self.credentials)} bytes>)")


@dataclass(frozen=True, slots=True)
class CheckEntriesRequest:
    """Presence and checksum of entries first..first+count-1 (a replica check, R2)."""

    request_id: int
    ledger_id: int
    first_entry_id: int
    count: int


Request = (AddRequest | ReadRequest | ReadLacRequest | WriteLacRequest | BookieInfoRequest | AuthRequest
           | CheckEntriesRequest | _batch.AddBatchRequest | _batch.ReadRangeRequest | _create.CreateLedgerRequest)

# ---------------------------------------------------------------- responses


@dataclass(frozen=True, slots=True)
class AddResponse:
    request_id: int
    ledger_id: int
    entry_id: int


@dataclass(frozen=True, slots=True)
class ReadResponse:
    """`entry` is empty when none was asked for (entry_id -1) or a long poll timed out."""

    request_id: int
    ledger_id: int
    entry_id: int
    lac: int
    packed_entry: bytes = b""


@dataclass(frozen=True, slots=True)
class ReadLacResponse:
    request_id: int
    ledger_id: int
    lac: int


@dataclass(frozen=True, slots=True)
class WriteLacResponse:
    request_id: int
    ledger_id: int


@dataclass(frozen=True, slots=True)
class BookieInfoResponse:
    request_id: int
    free_bytes: int
    total_bytes: int
    state: BookieState
    bookie_id: str


@dataclass(frozen=True, slots=True)
class CheckEntriesResponse:
    """Per entry from `first_entry_id` on: (EntryCheck, CRC32C of the stored bytes, 0 unless
    PRESENT)."""

    request_id: int
    ledger_id: int
    first_entry_id: int
    entries: tuple[tuple[EntryCheck, int], ...]


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """Any non-OK answer: the status says what, the message says why (UTF-8, at most 1 KiB)."""

    request_id: int
    opcode: int
    status: Status
    message: str = ""


@dataclass(frozen=True, slots=True)
class AuthResponse:
    request_id: int
    principal: str  # the name the bookie knows the connection by


Response = (AddResponse | ReadResponse | ReadLacResponse | WriteLacResponse | BookieInfoResponse
            | AuthResponse | CheckEntriesResponse | ErrorResponse | _batch.AddBatchResponse | _batch.ReadRangeResponse
            | _create.CreateLedgerResponse)

# ---------------------------------------------------------------- body layouts

_IDS = struct.Struct(">qq")  # ledger id, entry id
_ADD_HEAD = struct.Struct(f">qq{MASTER_KEY_BYTES}s")
_LONG_POLL = struct.Struct(">qI")  # previous lac, timeout ms
_LEDGER = struct.Struct(">q")
_WRITE_LAC = struct.Struct(f">q{MASTER_KEY_BYTES}sq")
_READ_RESPONSE_HEAD = struct.Struct(">qqq")
_INFO = struct.Struct(">qqB")
_FULL_HEADER = struct.Struct(">IBBHQ")  # length + header, for encoding in one pack
_AUTH_HEAD = struct.Struct(">B")


def with_version(frame: bytes, version: int) -> bytes:
    """`frame` with another version byte (the header's layout is the same in every version): a
    bookie answers a version 1 client in version 1, and refuses any version in the peer's own."""
    return frame[:4] + bytes((version,)) + frame[5:]
_CHECK = struct.Struct(">qqI")  # ledger id, first entry id, count
_CHECKED = struct.Struct(">BI")  # state, crc32c


def _frame(opcode: int, flags_or_status: int, request_id: int, body: bytes) -> bytes:
    return _FULL_HEADER.pack(HEADER_BYTES + len(body), PROTOCOL_VERSION, opcode, flags_or_status,
                             request_id) + body


def encode_add_request(request_id: int, ledger_id: int, entry_id: int, master_key: bytes,
                       packed_entry: bytes, recovery: bool = False) -> bytes:
    """The client's hot path: an ADD frame without building an AddRequest first."""
    return (_FULL_HEADER.pack(HEADER_BYTES + _ADD_HEAD.size + len(packed_entry), PROTOCOL_VERSION,
                              OpCode.ADD, Flag.RECOVERY_ADD if recovery else 0, request_id)
            + _ADD_HEAD.pack(ledger_id, entry_id, master_key) + packed_entry)


def encode_request(request: Request) -> bytes:
    if isinstance(request, AddRequest):
        return encode_add_request(request.request_id, request.ledger_id, request.entry_id,
                                  request.master_key, request.packed_entry, request.recovery)
    if isinstance(request, ReadRequest):
        flags = 0
        body = _IDS.pack(request.ledger_id, request.entry_id)
        if request.fence:
            flags |= Flag.FENCE
            body += request.master_key
        if request.long_poll:
            flags |= Flag.LONG_POLL
            body += _LONG_POLL.pack(request.previous_lac, request.timeout_ms)
        return _frame(OpCode.READ, flags, request.request_id, body)
    if isinstance(request, ReadLacRequest):
        body = _LEDGER.pack(request.ledger_id)
        flags = 0
        if request.long_poll:
            flags = Flag.LONG_POLL
            body += _LONG_POLL.pack(request.previous_lac, request.timeout_ms)
        return _frame(OpCode.READ_LAC, flags, request.request_id, body)
    if isinstance(request, WriteLacRequest):
        body = _WRITE_LAC.pack(request.ledger_id, request.master_key, request.lac)
        return _frame(OpCode.WRITE_LAC, 0, request.request_id, body)
    if isinstance(request, BookieInfoRequest):
        return _frame(OpCode.GET_BOOKIE_INFO, 0, request.request_id, b"")
    if isinstance(request, AuthRequest):
        return _frame(OpCode.AUTH, 0, request.request_id,
                      _AUTH_HEAD.pack(request.mechanism) + request.credentials)
    if isinstance(request, _batch.AddBatchRequest):
        return _batch.encode_add_batch_request(request)
    if isinstance(request, _create.CreateLedgerRequest):
        return _create.encode_create_ledger_request(request)
    if isinstance(request, _batch.ReadRangeRequest):
        return _batch.encode_read_range_request(request)
    if isinstance(request, CheckEntriesRequest):
        body = _CHECK.pack(request.ledger_id, request.first_entry_id, request.count)
        return _frame(OpCode.CHECK_ENTRIES, 0, request.request_id, body)
    raise TypeError(f"not a request: {request!r}")


def encode_add_response(request_id: int, ledger_id: int, entry_id: int) -> bytes:
    """The hot path's encoder, kept separate so the server need not build an object per add."""
    return _FULL_HEADER.pack(HEADER_BYTES + 16, PROTOCOL_VERSION, OpCode.ADD, Status.OK,
                             request_id) + _IDS.pack(ledger_id, entry_id)


def encode_response(response: Response) -> bytes:
    if isinstance(response, AddResponse):
        return encode_add_response(response.request_id, response.ledger_id, response.entry_id)
    if isinstance(response, ReadResponse):
        body = _READ_RESPONSE_HEAD.pack(response.ledger_id, response.entry_id, response.lac)
        return _frame(OpCode.READ, Status.OK, response.request_id, body + response.packed_entry)
    if isinstance(response, ReadLacResponse):
        body = _IDS.pack(response.ledger_id, response.lac)
        return _frame(OpCode.READ_LAC, Status.OK, response.request_id, body)
    if isinstance(response, WriteLacResponse):
        return _frame(OpCode.WRITE_LAC, Status.OK, response.request_id,
                      _LEDGER.pack(response.ledger_id))
    if isinstance(response, BookieInfoResponse):
        body = _INFO.pack(response.free_bytes, response.total_bytes, response.state)
        return _frame(OpCode.GET_BOOKIE_INFO, Status.OK, response.request_id,
                      body + response.bookie_id.encode())
    if isinstance(response, AuthResponse):
        return _frame(OpCode.AUTH, Status.OK, response.request_id, response.principal.encode())
    if isinstance(response, CheckEntriesResponse):
        body = _CHECK.pack(response.ledger_id, response.first_entry_id, len(response.entries))
        body += b"".join(_CHECKED.pack(state, crc) for state, crc in response.entries)
        return _frame(OpCode.CHECK_ENTRIES, Status.OK, response.request_id, body)
    if isinstance(response, ErrorResponse):
        message = response.message.encode("utf-8", "replace")[:ERROR_MESSAGE_BYTES_MAX]
        return _frame(response.opcode, response.status, response.request_id, message)
    if isinstance(response, _create.CreateLedgerResponse):
        return _create.encode_create_ledger_response(response)
    if isinstance(response, _batch.AddBatchResponse):
        return _batch.encode_add_batch_response(response.request_id, response.entry_count,
                                                response.failures)
    if isinstance(response, _batch.ReadRangeResponse):
        return _batch.encode_read_range_response(response.request_id, response.ledger_id,
                                                 response.lac, response.covered_last_entry_id,
                                                 response.entries)
    raise TypeError(f"not a response: {response!r}")


# ---------------------------------------------------------------- decoding


class _FrameReader:
    """Splits a byte stream into (version, opcode, flags/status, request id, body) frames."""

    def __init__(self, frame_bytes_max: int) -> None:
        if frame_bytes_max < HEADER_BYTES:
            raise ValueError(f"frame_bytes_max must be >= {HEADER_BYTES}")
        self.frame_bytes_max = frame_bytes_max
        self._buffer = bytearray()
        self._position = 0
        self._broken: FrameError | None = None
        self.peer_version = PROTOCOL_VERSION  # of the last frame returned
        self._versions: tuple[int, ...] = (PROTOCOL_VERSION,)

    def receive_data(self, data: bytes) -> None:
        if self._position > 65536 and self._position * 2 > len(self._buffer):
            del self._buffer[: self._position]
            self._position = 0
        self._buffer += data

    @property
    def pending_bytes(self) -> int:
        """Bytes received but not yet returned as frames: non-zero means a partial frame."""
        return len(self._buffer) - self._position

    def _next_frame(self) -> tuple[int, int, int, bytes] | None:
        if self._broken is not None:
            raise self._broken
        buffer, position = self._buffer, self._position
        if len(buffer) - position < 4:
            return None
        (length,) = LENGTH.unpack_from(buffer, position)
        if length < HEADER_BYTES or length > self.frame_bytes_max:
            self._fail(f"frame length {length} is outside {HEADER_BYTES}..{self.frame_bytes_max}")
        if len(buffer) - position - 4 < length:
            return None
        version, opcode, flags, request_id = HEADER.unpack_from(buffer, position + 4)
        if version != PROTOCOL_VERSION:
            if version not in self._versions:
                self._refuse_version(version, opcode, flags, request_id,
                                     bytes(buffer[position + 4 + HEADER_BYTES: position + 4 + length]))
            self.peer_version = version
        start = position + 4 + HEADER_BYTES
        self._position = position + 4 + length
        return opcode, flags, request_id, bytes(buffer[start: position + 4 + length])

    def _refuse_version(self, version: int, opcode: int, flags: int, request_id: int, body: bytes) -> None:
        expected = " or ".join(str(known) for known in self._versions)
        self._fail(f"protocol version {version} is not supported (expected {expected})",
                   request_id=request_id, opcode=opcode, status=Status.BAD_VERSION, version=version)

    def _fail(self, message: str, **details: object) -> None:
        self._broken = FrameError(message, fatal=True, **details)  # type: ignore[arg-type]
        raise self._broken


class RequestDecoder(_FrameReader):
    """Server side: bytes in, requests out."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT,
                 entry_bytes_max: int = ENTRY_BYTES_MAX_DEFAULT) -> None:
        super().__init__(frame_bytes_max)
        self.entry_bytes_max = entry_bytes_max
        self._versions = SUPPORTED_VERSIONS

    def next_message(self) -> Request | None:
        frame = self._next_frame()
        if frame is None:
            return None
        opcode, flags, request_id, body = frame
        try:
            return self._parse(opcode, flags, request_id, body)
        except struct.error as exc:
            raise FrameError(f"{_opcode_name(opcode)} body of {len(body)} bytes is malformed: {exc}",
                             fatal=False, request_id=request_id, opcode=opcode) from exc

    def _parse(self, opcode: int, flags: int, request_id: int, body: bytes) -> Request:
        def refuse(message: str, status: Status = Status.BAD_REQUEST) -> FrameError:
            return FrameError(message, fatal=False, request_id=request_id, opcode=opcode,
                              status=status)

        if opcode > V1_OPCODE_MAX and self.peer_version == 1:
            raise refuse(f"unknown opcode {opcode} in protocol version 1 (ADD_BATCH, READ_RANGE, "
                         "CHECK_ENTRIES and CREATE_LEDGER need version 2)")
        if opcode == OpCode.ADD_BATCH:
            return _batch.parse_add_batch(request_id, flags, body, self.entry_bytes_max)
        if opcode == OpCode.READ_RANGE:
            return _batch.parse_read_range(request_id, flags, body)
        if opcode == OpCode.CREATE_LEDGER:
            return _create.parse_create_ledger(request_id, flags, body)
        if flags & ~KNOWN_FLAGS:
            raise refuse(f"unknown flags 0x{flags:x} (known: 0x{KNOWN_FLAGS:x})")
        if opcode == OpCode.ADD:
            ledger_id, entry_id, master_key = _ADD_HEAD.unpack_from(body)
            packed_entry = body[_ADD_HEAD.size:]
            if len(packed_entry) > self.entry_bytes_max:
                raise refuse(f"entry of {len(packed_entry)} bytes is over the maximum "
                             f"{self.entry_bytes_max}", Status.TOO_LARGE)
            return AddRequest(request_id, ledger_id, entry_id, master_key, packed_entry,
                              bool(flags & Flag.RECOVERY_ADD))
        if opcode == OpCode.READ:
            return _parse_read(request_id, flags, body, refuse)
        if opcode == OpCode.READ_LAC:
            (ledger_id,) = _LEDGER.unpack_from(body)
            if flags & Flag.LONG_POLL:
                previous_lac, timeout_ms = _LONG_POLL.unpack_from(body, _LEDGER.size)
                _expect_size(body, _LEDGER.size + _LONG_POLL.size, refuse)
                return ReadLacRequest(request_id, ledger_id, True, previous_lac, timeout_ms)
            _expect_size(body, _LEDGER.size, refuse)
            return ReadLacRequest(request_id, ledger_id)
        if opcode == OpCode.WRITE_LAC:
            _expect_size(body, _WRITE_LAC.size, refuse)
            ledger_id, master_key, lac = _WRITE_LAC.unpack(body)
            return WriteLacRequest(request_id, ledger_id, master_key, lac)
        if opcode == OpCode.GET_BOOKIE_INFO:
            _expect_size(body, 0, refuse)
            return BookieInfoRequest(request_id)
        if opcode == OpCode.AUTH:
            (mechanism,) = _AUTH_HEAD.unpack_from(body)
            credentials = body[_AUTH_HEAD.size:]
            if len(credentials) > AUTH_CREDENTIALS_BYTES_MAX:
                raise refuse(f"AUTH credentials of {len(credentials)} bytes are over the maximum "
                             f"{AUTH_CREDENTIALS_BYTES_MAX}", Status.UNAUTHENTICATED)
            return AuthRequest(request_id, mechanism, credentials)
        if opcode == OpCode.CHECK_ENTRIES:
            _expect_size(body, _CHECK.size, refuse)
            ledger_id, first_entry_id, count = _CHECK.unpack(body)
            if not 1 <= count <= CHECK_ENTRIES_MAX:
                raise refuse(f"CHECK_ENTRIES count {count} is outside 1..{CHECK_ENTRIES_MAX}")
            return CheckEntriesRequest(request_id, ledger_id, first_entry_id, count)
        raise refuse(f"unknown opcode {opcode} (known: "
                     f"{', '.join(f'{op.name}={op.value}' for op in OpCode)})")


def _parse_read(request_id: int, flags: int, body: bytes, refuse) -> ReadRequest:  # type: ignore[no-untyped-def]
    ledger_id, entry_id = _IDS.unpack_from(body)
    offset = _IDS.size
    master_key = b""
    if flags & Flag.FENCE:
        master_key = body[offset: offset + MASTER_KEY_BYTES]
        if len(master_key) != MASTER_KEY_BYTES:
            raise refuse(f"a fencing READ carries a {MASTER_KEY_BYTES}-byte master key")
        offset += MASTER_KEY_BYTES
    previous_lac, timeout_ms = -1, 0
    if flags & Flag.LONG_POLL:
        previous_lac, timeout_ms = _LONG_POLL.unpack_from(body, offset)
        offset += _LONG_POLL.size
    _expect_size(body, offset, refuse)
    return ReadRequest(request_id, ledger_id, entry_id, bool(flags & Flag.FENCE), master_key,
                       bool(flags & Flag.LONG_POLL), previous_lac, timeout_ms)


def _expect_size(body: bytes, size: int, refuse) -> None:  # type: ignore[no-untyped-def]
    if len(body) != size:
        raise refuse(f"body is {len(body)} bytes, expected {size} (trailing or missing bytes)")


class ResponseDecoder(_FrameReader):
    """Client side: bytes in, responses out."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> None:
        super().__init__(frame_bytes_max)
        self._versions = SUPPORTED_VERSIONS

    def _refuse_version(self, version: int, opcode: int, flags: int, request_id: int, body: bytes) -> None:
        if flags == Status.BAD_VERSION:  # a bookie of another version refused ours, in its version
            said = body.decode("utf-8", "replace")[:200]
            self._fail(f"the bookie speaks protocol version {version} and refused this client's "
                       f"version {PROTOCOL_VERSION} ({said}): run bookies and clients of one release",
                       request_id=request_id, opcode=opcode, status=Status.BAD_VERSION, version=version)
        super()._refuse_version(version, opcode, flags, request_id, body)

    def next_message(self) -> Response | None:
        frame = self._next_frame()
        if frame is None:
            return None
        opcode, status, request_id, body = frame
        try:
            return _parse_response(opcode, status, request_id, body)
        except (struct.error, ValueError) as exc:
            raise FrameError(f"{_opcode_name(opcode)} response of {len(body)} bytes is malformed: "
                             f"{exc}", fatal=False, request_id=request_id, opcode=opcode) from exc


def _parse_response(opcode: int, status: int, request_id: int, body: bytes) -> Response:
    if status != Status.OK:
        try:
            known_status = Status(status)
        except ValueError:
            known_status = Status.BAD_REQUEST
        return ErrorResponse(request_id, opcode, known_status, body.decode("utf-8", "replace"))
    if opcode == OpCode.ADD:
        ledger_id, entry_id = _IDS.unpack(body)
        return AddResponse(request_id, ledger_id, entry_id)
    if opcode == OpCode.READ:
        ledger_id, entry_id, lac = _READ_RESPONSE_HEAD.unpack_from(body)
        return ReadResponse(request_id, ledger_id, entry_id, lac, body[_READ_RESPONSE_HEAD.size:])
    if opcode == OpCode.READ_LAC:
        ledger_id, lac = _IDS.unpack(body)
        return ReadLacResponse(request_id, ledger_id, lac)
    if opcode == OpCode.WRITE_LAC:
        (ledger_id,) = _LEDGER.unpack(body)
        return WriteLacResponse(request_id, ledger_id)
    if opcode == OpCode.AUTH:
        return AuthResponse(request_id, body.decode("utf-8", "replace"))
    if opcode == OpCode.GET_BOOKIE_INFO:
        free_bytes, total_bytes, state = _INFO.unpack_from(body)
        return BookieInfoResponse(request_id, free_bytes, total_bytes, BookieState(state),
                                  body[_INFO.size:].decode())
    if opcode == OpCode.ADD_BATCH:
        return _batch.parse_add_batch_response(request_id, body)
    if opcode == OpCode.READ_RANGE:
        return _batch.parse_read_range_response(request_id, body)
    if opcode == OpCode.CREATE_LEDGER:
        return _create.parse_create_ledger_response(request_id, body)
    if opcode == OpCode.CHECK_ENTRIES:
        ledger_id, first_entry_id, count = _CHECK.unpack_from(body)
        if len(body) != _CHECK.size + count * _CHECKED.size:
            raise ValueError(f"{count} entries need {_CHECK.size + count * _CHECKED.size} bytes")
        entries = tuple((EntryCheck(state), crc) for state, crc in
                        _CHECKED.iter_unpack(body[_CHECK.size:]))
        return CheckEntriesResponse(request_id, ledger_id, first_entry_id, entries)
    raise ValueError(f"unknown opcode {opcode}")


def _opcode_name(opcode: int) -> str:
    try:
        return OpCode(opcode).name
    except ValueError:
        return f"opcode {opcode}"
