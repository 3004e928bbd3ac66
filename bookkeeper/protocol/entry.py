"""The packed_entry entry: what a writer sends, a bookie stores and a reader verifies (A12).

    ledger_id i64 | entry_id i64 | lac i64 | length i64 | digest_type u8 | digest | payload

`lac` is the writer's last add confirmed when it sent the entry (readers learn the LAC from it),
`length` the cumulative ledger length including this payload. The digest covers the 33 header
bytes and the payload: CRC32C (4 bytes) by default, HMAC-SHA256 keyed by the ledger password
(32 bytes) when the ledger asks for authentication, or nothing (DUMMY, for benchmarks only).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from dataclasses import dataclass

import crc32c

from bookkeeper.errors import DlogError

ENTRY_HEADER = struct.Struct(">qqqqB")
ENTRY_HEADER_BYTES = ENTRY_HEADER.size  # 33
_CRC = struct.Struct(">I")


class DigestType(enum.IntEnum):
    CRC32C = 1
    HMAC_SHA256 = 2
    DUMMY = 3


DIGEST_BYTES = {DigestType.CRC32C: 4, DigestType.HMAC_SHA256: 32, DigestType.DUMMY: 0}


class DigestMismatchError(DlogError):
    """An entry's bytes do not match its digest: corruption or a wrong password."""

    code = 230


def master_key(password: bytes) -> bytes:
    """What bookies store and compare for a ledger (never the password itself)."""
    return hashlib.sha256(b"dlog-ledger\x00" + password).digest()


@dataclass(frozen=True, slots=True)
class Digest:
    """Computes and checks the digest of one ledger's entries."""

    type: DigestType
    mac_key: bytes = b""

    @classmethod
    def for_ledger(cls, digest_type: DigestType, password: bytes) -> Digest:
        if digest_type is DigestType.HMAC_SHA256:
            return cls(digest_type, hashlib.sha256(b"dlog-mac\x00" + password).digest())
        return cls(digest_type)

    def compute(self, header: bytes, payload: bytes) -> bytes:
        if self.type is DigestType.CRC32C:
            return _CRC.pack(crc32c.crc32c(payload, crc32c.crc32c(header)))
        if self.type is DigestType.HMAC_SHA256:
            mac = hmac.new(self.mac_key, header, hashlib.sha256)
            mac.update(payload)
            return mac.digest()
        return b""


@dataclass(frozen=True, slots=True)
class Entry:
    ledger_id: int
    entry_id: int
    lac: int
    length: int
    payload: bytes  # the application's bytes (the packed entry is header + digest + payload)


def pack_entry(digest: Digest, ledger_id: int, entry_id: int, lac: int, length: int,
               payload: bytes) -> bytes:
    header = ENTRY_HEADER.pack(ledger_id, entry_id, lac, length, digest.type)
    return header + digest.compute(header, payload) + payload


def peek_header(packed_entry: bytes) -> tuple[int, int, int, int, int]:
    """(ledger_id, entry_id, lac, length, digest_type) without checking the digest (bookie side)."""
    return ENTRY_HEADER.unpack_from(packed_entry)


def unpack_entry(digest: Digest, packed_entry: bytes, ledger_id: int, entry_id: int) -> Entry:
    """Verify and open an entry; the ids must be the ones that were asked for."""
    if len(packed_entry) < ENTRY_HEADER_BYTES:
        raise DigestMismatchError(f"entry {ledger_id}:{entry_id} is {len(packed_entry)} bytes, shorter "
                                  f"than its {ENTRY_HEADER_BYTES}-byte header")
    got_ledger, got_entry, lac, length, digest_type = ENTRY_HEADER.unpack_from(packed_entry)
    if (got_ledger, got_entry) != (ledger_id, entry_id):
        raise DigestMismatchError(f"asked for entry {ledger_id}:{entry_id}, the bookie returned "
                                  f"{got_ledger}:{got_entry}")
    if digest_type != digest.type:
        raise DigestMismatchError(f"entry {ledger_id}:{entry_id} has digest type {digest_type}, "
                                  f"the ledger uses {digest.type.name}")
    digest_bytes = DIGEST_BYTES[digest.type]
    start = ENTRY_HEADER_BYTES + digest_bytes
    header = packed_entry[:ENTRY_HEADER_BYTES]
    payload = packed_entry[start:]
    if not hmac.compare_digest(packed_entry[ENTRY_HEADER_BYTES:start], digest.compute(header, payload)):
        raise DigestMismatchError(f"entry {ledger_id}:{entry_id} fails its {digest.type.name} "
                                  "digest check (corrupt replica or wrong password)")
    return Entry(ledger_id, entry_id, lac, length, payload)
