"""Ledger metadata: the versioned record in the metadata store that says where entries live.

Pure data and its serialization. `ensembles` maps the first entry id of each fragment to the
bookies of that fragment; the fragment of entry `e` is the last one whose first entry id <= e.
Serialized as JSON with a format version; anything unknown or malformed fails closed with
`CorruptMetadataError`, because guessing at a ledger's shape could lose acknowledged entries.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any

from bookkeeper.errors import ConfigError, CorruptMetadataError
from bookkeeper.protocol.entry import DigestType

FORMAT_VERSION = 1


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


def check_quorum(ensemble: int, write_quorum: int, ack_quorum: int) -> None:
    """A1: ensemble >= write quorum >= ack quorum >= 1."""
    if not ensemble >= write_quorum >= ack_quorum >= 1:
        raise ConfigError(f"quorum sizes must satisfy ensemble >= write quorum >= ack quorum >= 1; "
                          f"got ensemble={ensemble}, write quorum={write_quorum}, "
                          f"ack quorum={ack_quorum}")


def password_hash(password: bytes) -> str:
    """What metadata keeps of a password: enough to refuse a wrong one early, never the password."""
    return hashlib.sha256(b"dlog-password-check\x00" + password).hexdigest()


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ensembles: tuple[tuple[int, tuple[str, ...]], ...]  # (first entry id, bookie ids), increasing
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1
    length: int = 0
    digest_type: DigestType = DigestType.CRC32C
    password_hash: str = ""
    ctime_ms: int = 0
    custom: tuple[tuple[str, str], ...] = field(default=())
    # hex of the key bookies check adds and fences against (derived from the password, never the
    # password): lets auto-recovery write copies and fence an abandoned ledger. "" for ledgers
    # created before it was kept; those cannot be re-replicated automatically.
    master_key: str = ""

    def __post_init__(self) -> None:
        check_quorum(self.ensemble_size, self.write_quorum, self.ack_quorum)

    # ------------------------------------------------------------------ fragments

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        firsts = [first for first, _ in self.ensembles]
        index = bisect.bisect_right(firsts, max(entry_id, 0)) - 1
        return self.ensembles[max(index, 0)][1]

    @property
    def last_ensemble(self) -> tuple[int, tuple[str, ...]]:
        return self.ensembles[-1]

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def with_ensemble(self, first_entry_id: int, bookies: tuple[str, ...]) -> LedgerMetadata:
        """A new fragment from first_entry_id (replacing a last fragment that starts there too)."""
        kept = tuple(item for item in self.ensembles if item[0] < first_entry_id)
        return replace(self, ensembles=kept + ((first_entry_id, tuple(bookies)),))

    def closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        # fragments that start past the end hold nothing; drop them so readers never look there
        kept = tuple(item for index, item in enumerate(self.ensembles)
                     if index == 0 or item[0] <= max(last_entry_id, 0))
        return replace(self, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length,
                       ensembles=kept)

    # ------------------------------------------------------------------ serialization

    def to_bytes(self) -> bytes:
        document = {
            "format": FORMAT_VERSION, "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum, "ack_quorum": self.ack_quorum,
            "ensembles": [[first, list(bookies)] for first, bookies in self.ensembles],
            "state": self.state.value, "last_entry_id": self.last_entry_id, "length": self.length,
            "digest_type": self.digest_type.name, "password_hash": self.password_hash,
            "ctime_ms": self.ctime_ms, "custom": dict(self.custom), "master_key": self.master_key,
        }
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LedgerMetadata:
        try:
            document: dict[str, Any] = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptMetadataError(f"ledger metadata is not valid JSON: {exc}") from exc
        if not isinstance(document, dict) or document.get("format") != FORMAT_VERSION:
            version = document.get("format") if isinstance(document, dict) else None
            raise CorruptMetadataError(f"ledger metadata format {version!r} is not supported "
                                       f"(this client reads format {FORMAT_VERSION})")
        try:
            ensembles = tuple((int(first), tuple(str(bookie) for bookie in bookies))
                              for first, bookies in document["ensembles"])
            metadata = cls(
                ensemble_size=int(document["ensemble_size"]),
                write_quorum=int(document["write_quorum"]), ack_quorum=int(document["ack_quorum"]),
                ensembles=ensembles, state=LedgerState(document["state"]),
                last_entry_id=int(document["last_entry_id"]), length=int(document["length"]),
                digest_type=DigestType[document["digest_type"]],
                password_hash=str(document["password_hash"]), ctime_ms=int(document["ctime_ms"]),
                custom=tuple(sorted((str(k), str(v)) for k, v in document["custom"].items())),
                master_key=str(document.get("master_key", "")))
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            raise CorruptMetadataError(f"ledger metadata is malformed: {exc!r}") from exc
        _check_shape(metadata)
        return metadata


def _check_shape(metadata: LedgerMetadata) -> None:
    if metadata.master_key and (len(metadata.master_key) != 64
                                or any(c not in "0123456789abcdef" for c in metadata.master_key)):
        raise CorruptMetadataError("ledger metadata's master_key must be 64 lowercase hex digits")
    if not metadata.ensembles or metadata.ensembles[0][0] != 0:
        raise CorruptMetadataError("ledger metadata must have a first fragment starting at entry 0")
    firsts = [first for first, _ in metadata.ensembles]
    if firsts != sorted(set(firsts)):
        raise CorruptMetadataError(f"fragment first entry ids {firsts} do not strictly increase")
    for _, bookies in metadata.ensembles:
        if len(bookies) != metadata.ensemble_size or len(set(bookies)) != len(bookies):
            raise CorruptMetadataError(f"fragment {list(bookies)} does not have "
                                       f"{metadata.ensemble_size} distinct bookies")
