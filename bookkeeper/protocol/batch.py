"""Sans-IO codec of the batched requests of protocol version 2: ADD_BATCH and READ_RANGE.

Theory of operation. Per-entry Python work (a frame, a parse, a dispatch, an answer, a callback
per entry) is what limits small entries, so version 2 carries many entries per frame:
- ADD_BATCH: entries of one or of many ledgers for one bookie, grouped by ledger (one master key
  and one recovery flag per group), answered once, after the fsync that covers every accepted
  entry. The answer lists only the entries that failed (by their position in the request), so
  the common answer is 8 bytes for any number of entries.
- READ_RANGE: entries `first, first + stride, ... <= last` of one ledger, as many as fit in a byte
  limit (always at least one), as BookKeeper's batched read (BP-62). `stride` lets a reader ask
  one bookie for exactly the entries it reads there (entry e of an ensemble of E is first asked
  of position e mod E). The answer says how far it covered: an entry id of the stride up to
  `covered_last_entry_id` that is not in the answer is not held by this bookie.
`docs/protocol.md` gives every byte. The frame around the bodies is `wire.py`'s (its vocabulary in
`frame.py`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from bookkeeper.protocol.frame import (
    HEADER_BYTES,
    MASTER_KEY_BYTES,
    PROTOCOL_VERSION,
    Flag,
    FrameError,
    OpCode,
    Status,
)

ADD_BATCH_ENTRIES_MAX = 4096  # entries in one ADD_BATCH frame (bounds its answer's failure list)
READ_RANGE_ENTRIES_MAX = 4096  # entry ids one READ_RANGE answer looks at
BATCH_MESSAGE_BYTES_MAX = 256  # of each failure's message in an ADD_BATCH answer

_FULL_HEADER = struct.Struct(">IBBHQ")  # length, version, opcode, flags/status, request id
_COUNT = struct.Struct(">H")
_GROUP = struct.Struct(f">q{MASTER_KEY_BYTES}sHI")  # ledger id, master key, flags, entry count
_LENGTH = struct.Struct(">I")
_ANSWER_HEAD = struct.Struct(">II")  # entries, failures
_FAILURE = struct.Struct(">IHH")  # index, status, message bytes
_RANGE = struct.Struct(">qqqHI")  # ledger id, first, last, stride, bytes max
_RANGE_ANSWER_HEAD = struct.Struct(">qqqI")  # ledger id, lac, covered last, entries
_RANGE_ENTRY = struct.Struct(">qI")  # entry id, length


@dataclass(frozen=True, slots=True)
class AddGroup:
    """Entries of one ledger in an ADD_BATCH. `section` is the group's entries exactly as they
    were framed (`length u32 | packed entry` each): the bookie journals it as it is."""

    ledger_id: int
    master_key: bytes
    entries: tuple[bytes, ...]
    recovery: bool = False
    section: bytes = field(default=b"", compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class AddBatchRequest:
    request_id: int
    groups: tuple[AddGroup, ...]

    @property
    def entry_count(self) -> int:
        return sum(len(group.entries) for group in self.groups)


@dataclass(frozen=True, slots=True)
class AddFailure:
    index: int  # position of the entry in the request, counting across groups
    status: Status
    message: str = ""


@dataclass(frozen=True, slots=True)
class AddBatchResponse:
    """Every entry of the request not listed in `failures` is durable on this bookie."""

    request_id: int
    entry_count: int
    failures: tuple[AddFailure, ...] = ()


@dataclass(frozen=True, slots=True)
class ReadRangeRequest:
    request_id: int
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    stride: int = 1
    bytes_max: int = 0  # 0: the bookie's maximum
    fence: bool = False
    master_key: bytes = b""


@dataclass(frozen=True, slots=True)
class ReadRangeResponse:
    request_id: int
    ledger_id: int
    lac: int
    covered_last_entry_id: int
    entries: tuple[tuple[int, bytes], ...] = ()  # (entry id, packed entry), ascending


# ---------------------------------------------------------------- encoding


def encode_add_batch(request_id: int, groups: list[tuple[int, bytes, bool, list[bytes]]]) -> bytes:
    """The client's hot path: one ADD_BATCH frame from (ledger id, master key, recovery, packed
    entries) groups, without building request objects."""
    parts: list[bytes] = [b"", _COUNT.pack(len(groups))]
    append, pack_length = parts.append, _LENGTH.pack
    for ledger_id, master_key, recovery, entries in groups:
        append(_GROUP.pack(ledger_id, master_key, Flag.RECOVERY_ADD if recovery else 0, len(entries)))
        for packed_entry in entries:
            append(pack_length(len(packed_entry)))
            append(packed_entry)
    body_bytes = sum(map(len, parts))
    parts[0] = _FULL_HEADER.pack(HEADER_BYTES + body_bytes, PROTOCOL_VERSION, OpCode.ADD_BATCH, 0,
                                 request_id)
    return b"".join(parts)


def encode_add_batch_request(request: AddBatchRequest) -> bytes:
    return encode_add_batch(request.request_id, [
        (group.ledger_id, group.master_key, group.recovery, list(group.entries))
        for group in request.groups])


def encode_add_batch_response(request_id: int, entry_count: int,
                              failures: list[AddFailure] | tuple[AddFailure, ...] = ()) -> bytes:
    parts = [_ANSWER_HEAD.pack(entry_count, len(failures))]
    for failure in failures:
        message = failure.message.encode("utf-8", "replace")[:BATCH_MESSAGE_BYTES_MAX]
        parts.append(_FAILURE.pack(failure.index, failure.status, len(message)))
        parts.append(message)
    body = b"".join(parts)
    return _FULL_HEADER.pack(HEADER_BYTES + len(body), PROTOCOL_VERSION, OpCode.ADD_BATCH, Status.OK,
                             request_id) + body


def encode_read_range_request(request: ReadRangeRequest) -> bytes:
    body = _RANGE.pack(request.ledger_id, request.first_entry_id, request.last_entry_id,
                       request.stride, request.bytes_max)
    flags = 0
    if request.fence:
        flags = Flag.FENCE
        body += request.master_key
    return _FULL_HEADER.pack(HEADER_BYTES + len(body), PROTOCOL_VERSION, OpCode.READ_RANGE, flags,
                             request.request_id) + body


def encode_read_range_response(request_id: int, ledger_id: int, lac: int, covered_last_entry_id: int,
                               entries: list[tuple[int, bytes]] | tuple[tuple[int, bytes], ...]) -> bytes:
    parts = [b"", _RANGE_ANSWER_HEAD.pack(ledger_id, lac, covered_last_entry_id, len(entries))]
    pack_entry = _RANGE_ENTRY.pack
    for entry_id, packed_entry in entries:
        parts.append(pack_entry(entry_id, len(packed_entry)))
        parts.append(packed_entry)
    body_bytes = sum(map(len, parts))
    parts[0] = _FULL_HEADER.pack(HEADER_BYTES + body_bytes, PROTOCOL_VERSION, OpCode.READ_RANGE,
                                 Status.OK, request_id)
    return b"".join(parts)


# ---------------------------------------------------------------- decoding (bodies)


def parse_add_batch(request_id: int, flags: int, body: bytes, entry_bytes_max: int) -> AddBatchRequest:
    """Raises FrameError (not fatal) for a malformed body; struct.error for a short one."""

    def refuse(message: str, status: Status = Status.BAD_REQUEST) -> FrameError:
        return FrameError(message, fatal=False, request_id=request_id, opcode=OpCode.ADD_BATCH,
                          status=status)

    if flags:
        raise refuse(f"ADD_BATCH takes no frame flags (got 0x{flags:x}); recovery is per group")
    (group_count,) = _COUNT.unpack_from(body)
    if group_count == 0:
        raise refuse("ADD_BATCH carries no group")
    offset, total, groups = _COUNT.size, 0, []
    unpack_length, size = _LENGTH.unpack_from, len(body)
    for _ in range(group_count):
        ledger_id, master_key, group_flags, entry_count = _GROUP.unpack_from(body, offset)
        offset += _GROUP.size
        if group_flags & ~Flag.RECOVERY_ADD:
            raise refuse(f"unknown group flags 0x{group_flags:x} (known: 0x{int(Flag.RECOVERY_ADD):x})")
        total += entry_count
        if entry_count == 0 or total > ADD_BATCH_ENTRIES_MAX:
            raise refuse(f"an ADD_BATCH group holds 1..{ADD_BATCH_ENTRIES_MAX} entries and a frame "
                         f"at most {ADD_BATCH_ENTRIES_MAX} in all (group of {entry_count})")
        start, entries = offset, []
        for _ in range(entry_count):
            (length,) = unpack_length(body, offset)
            offset += 4
            end = offset + length
            if end > size:
                raise refuse(f"entry of {length} bytes runs past the end of the frame")
            if length > entry_bytes_max:
                raise refuse(f"entry of {length} bytes is over the maximum {entry_bytes_max}",
                             Status.TOO_LARGE)
            entries.append(body[offset:end])
            offset = end
        groups.append(AddGroup(ledger_id, master_key, tuple(entries),
                               bool(group_flags & Flag.RECOVERY_ADD), body[start:offset]))
    if offset != size:
        raise refuse(f"body is {size} bytes, expected {offset} (trailing bytes)")
    return AddBatchRequest(request_id, tuple(groups))


def parse_read_range(request_id: int, flags: int, body: bytes) -> ReadRangeRequest:
    def refuse(message: str) -> FrameError:
        return FrameError(message, fatal=False, request_id=request_id, opcode=OpCode.READ_RANGE)

    if flags & ~Flag.FENCE:
        raise refuse(f"READ_RANGE takes only the FENCE flag (got 0x{flags:x})")
    ledger_id, first, last, stride, bytes_max = _RANGE.unpack_from(body)
    master_key = b""
    expected = _RANGE.size
    if flags & Flag.FENCE:
        master_key = body[expected: expected + MASTER_KEY_BYTES]
        if len(master_key) != MASTER_KEY_BYTES:
            raise refuse(f"a fencing READ_RANGE carries a {MASTER_KEY_BYTES}-byte master key")
        expected += MASTER_KEY_BYTES
    if len(body) != expected:
        raise refuse(f"body is {len(body)} bytes, expected {expected} (trailing or missing bytes)")
    if not 0 <= first <= last or stride < 1:
        raise refuse(f"READ_RANGE needs 0 <= first <= last and stride >= 1, got {first}..{last} "
                     f"stride {stride}")
    return ReadRangeRequest(request_id, ledger_id, first, last, stride, bytes_max,
                            bool(flags & Flag.FENCE), master_key)


def parse_add_batch_response(request_id: int, body: bytes) -> AddBatchResponse:
    entry_count, failure_count = _ANSWER_HEAD.unpack_from(body)
    offset, failures = _ANSWER_HEAD.size, []
    for _ in range(failure_count):
        index, status, message_bytes = _FAILURE.unpack_from(body, offset)
        offset += _FAILURE.size
        message = body[offset: offset + message_bytes]
        if len(message) != message_bytes or index >= entry_count:
            raise ValueError(f"failure {index} of {entry_count} entries is malformed")
        offset += message_bytes
        failures.append(AddFailure(index, _status(status), message.decode("utf-8", "replace")))
    if offset != len(body):
        raise ValueError(f"{len(body) - offset} trailing bytes")
    return AddBatchResponse(request_id, entry_count, tuple(failures))


def parse_read_range_response(request_id: int, body: bytes) -> ReadRangeResponse:
    ledger_id, lac, covered_last, count = _RANGE_ANSWER_HEAD.unpack_from(body)
    offset, entries, unpack_entry = _RANGE_ANSWER_HEAD.size, [], _RANGE_ENTRY.unpack_from
    for _ in range(count):
        entry_id, length = unpack_entry(body, offset)
        offset += _RANGE_ENTRY.size
        packed_entry = body[offset: offset + length]
        if len(packed_entry) != length:
            raise ValueError(f"entry {entry_id} of {length} bytes runs past the end of the frame")
        offset += length
        entries.append((entry_id, packed_entry))
    if offset != len(body):
        raise ValueError(f"{len(body) - offset} trailing bytes")
    return ReadRangeResponse(request_id, ledger_id, lac, covered_last, tuple(entries))


def _status(value: int) -> Status:
    try:
        return Status(value)
    except ValueError:
        return Status.BAD_REQUEST
