"""Sans-IO codec of CREATE_LEDGER (protocol version 2): a bookie creates a ledger's metadata for
a client.

Theory of operation. On a cluster with ZooKeeper ACLs only the cluster's own identities (bookies
and admins) create ledger directories, write the id counter and create ledger nodes, so no
tenant can squat ids, plant directories or make a ledger claim another namespace
(bookkeeper/meta/acl.py). A client sends the metadata it wants and the ZooKeeper digest ids that
may write the node after (its namespace's producers and admins: closing, ensemble changes); the
bookie checks that the authenticated principal may produce in the namespace the metadata names
and that each writer id is a role identity of that namespace, allocates the id, creates the node
and answers the id. `docs/protocol.md` gives every byte.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from bookkeeper.protocol.frame import HEADER_BYTES, PROTOCOL_VERSION, FrameError, OpCode, Status

CREATE_METADATA_BYTES_MAX = 64 * 1024
CREATE_WRITERS_MAX = 8
CREATE_WRITER_BYTES_MAX = 512

_FULL_HEADER = struct.Struct(">IBBHQ")  # length, version, opcode, flags/status, request id
_METADATA_LENGTH = struct.Struct(">I")
_WRITER_COUNT = struct.Struct(">B")
_WRITER_LENGTH = struct.Struct(">H")
_LEDGER = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class CreateLedgerRequest:
    request_id: int
    metadata: bytes  # LedgerMetadata.to_bytes()
    writers: tuple[str, ...] = ()  # ZooKeeper digest ids `user:hash` that may write the node


@dataclass(frozen=True, slots=True)
class CreateLedgerResponse:
    request_id: int
    ledger_id: int


def _frame(status_or_flags: int, request_id: int, body: bytes) -> bytes:
    return _FULL_HEADER.pack(HEADER_BYTES + len(body), PROTOCOL_VERSION, OpCode.CREATE_LEDGER, status_or_flags,
                             request_id) + body


def encode_create_ledger_request(request: CreateLedgerRequest) -> bytes:
    body = _METADATA_LENGTH.pack(len(request.metadata)) + request.metadata
    body += _WRITER_COUNT.pack(len(request.writers))
    for writer in request.writers:
        data = writer.encode()
        body += _WRITER_LENGTH.pack(len(data)) + data
    return _frame(0, request.request_id, body)


def parse_create_ledger(request_id: int, flags: int, body: bytes) -> CreateLedgerRequest:
    def refuse(message: str) -> FrameError:
        return FrameError(message, fatal=False, request_id=request_id, opcode=OpCode.CREATE_LEDGER,
                          status=Status.BAD_REQUEST)

    if flags:
        raise refuse(f"CREATE_LEDGER takes no flags, got 0x{flags:x}")
    (size,) = _METADATA_LENGTH.unpack_from(body)
    if size > CREATE_METADATA_BYTES_MAX:
        raise refuse(f"CREATE_LEDGER metadata of {size} bytes is over the maximum {CREATE_METADATA_BYTES_MAX}")
    offset = _METADATA_LENGTH.size
    metadata = body[offset:offset + size]
    offset += size
    if len(metadata) != size:
        raise refuse(f"CREATE_LEDGER metadata is {len(metadata)} bytes, its length says {size}")
    (count,) = _WRITER_COUNT.unpack_from(body, offset)
    offset += _WRITER_COUNT.size
    if count > CREATE_WRITERS_MAX:
        raise refuse(f"CREATE_LEDGER names {count} writers (at most {CREATE_WRITERS_MAX})")
    writers = []
    for _ in range(count):
        (length,) = _WRITER_LENGTH.unpack_from(body, offset)
        offset += _WRITER_LENGTH.size
        data = body[offset:offset + length]
        offset += length
        if len(data) != length or length > CREATE_WRITER_BYTES_MAX:
            raise refuse(f"a CREATE_LEDGER writer id of {length} bytes is cut short or too long "
                         f"(at most {CREATE_WRITER_BYTES_MAX})")
        try:
            writers.append(data.decode())
        except UnicodeDecodeError as exc:
            raise refuse(f"a CREATE_LEDGER writer id is not UTF-8: {exc}") from exc
    if offset != len(body):
        raise refuse(f"CREATE_LEDGER has {len(body) - offset} bytes after its writer ids")
    return CreateLedgerRequest(request_id, metadata, tuple(writers))


def encode_create_ledger_response(response: CreateLedgerResponse) -> bytes:
    return _frame(Status.OK, response.request_id, _LEDGER.pack(response.ledger_id))


def parse_create_ledger_response(request_id: int, body: bytes) -> CreateLedgerResponse:
    (ledger_id,) = _LEDGER.unpack(body)
    return CreateLedgerResponse(request_id, ledger_id)
