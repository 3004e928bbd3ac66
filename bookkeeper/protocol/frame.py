"""The vocabulary every frame of the bookie wire protocol shares: versions, the header, opcodes,
flags, statuses, the small enums frames carry, and `FrameError`.

It is its own module so that the codecs of single messages (wire.py) and of the batched and
create-ledger messages of version 2 (batch.py, create.py) build on it without importing each
other: wire.py dispatches to batch.py and create.py, which need only these names. Everyone else
imports them from wire.py, the codec's one public face.
"""

from __future__ import annotations

import enum
import struct

from bookkeeper.errors import ProtocolError

PROTOCOL_VERSION = 2
# versions a bookie serves: version 1 clients (no batched opcodes) keep working, answered in version 1
SUPPORTED_VERSIONS = (1, 2)
LENGTH = struct.Struct(">I")
# after the length: version u8, opcode u8, flags (requests) or status (responses) u16, request id u64
HEADER = struct.Struct(">BBHQ")
HEADER_BYTES = HEADER.size  # 12
MASTER_KEY_BYTES = 32
ENTRY_BYTES_MAX_DEFAULT = 4 * 2**20
FRAME_BYTES_MAX_DEFAULT = ENTRY_BYTES_MAX_DEFAULT + 1024
ERROR_MESSAGE_BYTES_MAX = 1024
CHECK_ENTRIES_MAX = 256  # entries one CHECK_ENTRIES may ask about


class OpCode(enum.IntEnum):
    ADD = 1
    READ = 2
    READ_LAC = 3
    WRITE_LAC = 4
    GET_BOOKIE_INFO = 5
    AUTH = 6
    ADD_BATCH = 7  # version 2 (bookkeeper.protocol.batch)
    READ_RANGE = 8  # version 2
    CHECK_ENTRIES = 9  # version 2 (auto-recovery replica checks)
    CREATE_LEDGER = 10  # version 2 (bookkeeper.protocol.create: ledgers on a cluster with ZooKeeper ACLs)


V1_OPCODE_MAX = OpCode.AUTH


class Flag(enum.IntFlag):
    NONE = 0
    FENCE = 0x1  # READ: fence the ledger (carries the master key)
    RECOVERY_ADD = 0x2  # ADD: accepted by a fenced ledger (recovery write-back)
    LONG_POLL = 0x4  # READ / READ_LAC: hold until LAC > previous_lac or timeout


KNOWN_FLAGS = int(Flag.FENCE | Flag.RECOVERY_ADD | Flag.LONG_POLL)


class Status(enum.IntEnum):
    """Wire status codes; the non-OK ones equal the `status` of the error class they map to."""

    OK = 0
    NO_LEDGER = 1
    NO_ENTRY = 2
    BAD_REQUEST = 100
    IO_ERROR = 101
    UNAUTHORIZED = 102
    BAD_VERSION = 103
    FENCED = 104
    READ_ONLY = 105
    TOO_MANY_REQUESTS = 106
    TOO_LARGE = 107
    ENTRY_EXISTS = 108
    LEDGER_DELETED = 109
    UNAUTHENTICATED = 500
    FORBIDDEN = 501
    QUOTA_EXCEEDED = 502


class AuthMechanism(enum.IntEnum):
    TOKEN = 1  # credentials: a signed token (JWT), ASCII
    CERTIFICATE = 2  # credentials: empty; the verified TLS client certificate names the principal


AUTH_CREDENTIALS_BYTES_MAX = 8192


class EntryCheck(enum.IntEnum):
    """What CHECK_ENTRIES says of one entry on one bookie."""

    PRESENT = 0  # stored and readable (and its CRC32C digest, if it has one, checks out)
    ABSENT = 1
    DAMAGED = 2  # stored but unreadable, or failing its CRC32C digest


class BookieState(enum.IntEnum):
    WRITABLE = 0
    READ_ONLY = 1


class FrameError(ProtocolError):
    """A frame the decoder refuses. See the module docstring for `fatal`."""

    code = 5

    def __init__(self, message: str, *, fatal: bool, request_id: int = 0, opcode: int = 0,
                 status: Status = Status.BAD_REQUEST, version: int = PROTOCOL_VERSION) -> None:
        super().__init__(message)
        self.fatal = fatal
        self.request_id = request_id
        self.opcode = opcode
        self.status = status
        self.version = version  # of the refused frame: its answer goes out in it, so the peer reads it
