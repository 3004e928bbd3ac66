"""Stream and segment metadata: what ZooKeeper holds about each stream, as frozen dataclasses.

A stream is a chain of segments, each one ledger. A segment is `in_progress` while its writer
appends, `completed` once sealed (its last entry and record count known), and `truncated` once
marked for removal (its ledger is then deleted and its node removed). A segment may also be
partly truncated: records below (`min_active_entry`, `min_active_slot`) are gone for readers.
JSON with a format version; anything unknown fails closed.
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from bookkeeper.errors import ConfigError, CorruptMetadataError
from bookkeeper.protocol.metadata import check_quorum

FORMAT_VERSION = 1
ROLL_BYTES_DEFAULT = 256 * 2**20
ROLL_AGE_MS_DEFAULT = 2 * 3600 * 1000


class SegmentState(enum.Enum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    TRUNCATED = "truncated"


@dataclass(frozen=True, slots=True)
class Segment:
    sequence: int
    ledger_id: int
    state: SegmentState = SegmentState.IN_PROGRESS
    first_entry: int = 0
    last_entry: int = -1  # known once completed
    records: int = 0
    bytes: int = 0
    first_timestamp_ms: int = 0
    last_timestamp_ms: int = 0
    created_ms: int = 0
    completed_ms: int = 0
    min_active_entry: int = 0  # partial truncation point
    min_active_slot: int = 0

    @property
    def is_in_progress(self) -> bool:
        return self.state is SegmentState.IN_PROGRESS

    @property
    def is_truncated(self) -> bool:
        return self.state is SegmentState.TRUNCATED

    def first_readable_slot(self, entry_id: int, slot: int) -> int:
        """The first slot a reader may hand out of entry `entry_id` when it enters at `slot`: never
        below a truncation point inside that entry (L5)."""
        if entry_id == self.min_active_entry and slot < self.min_active_slot:
            return self.min_active_slot
        return slot

    def completed(self, last_entry: int, records: int, size_bytes: int, first_timestamp_ms: int,
                  last_timestamp_ms: int, now_ms: int) -> Segment:
        return replace(self, state=SegmentState.COMPLETED, last_entry=last_entry, records=records,
                       bytes=size_bytes, first_timestamp_ms=first_timestamp_ms,
                       last_timestamp_ms=last_timestamp_ms, completed_ms=now_ms)

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["state"] = self.state.value
        document["format"] = FORMAT_VERSION
        return document

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Segment:
        document = _load(data, "segment")
        try:
            document["state"] = SegmentState(document["state"])
            fields = {name: document[name] for name in cls.__dataclass_fields__}
            segment = cls(**fields)
        except (KeyError, ValueError, TypeError) as exc:
            raise CorruptMetadataError(f"segment metadata is malformed: {exc!r}") from exc
        if segment.sequence < 1 or segment.ledger_id < 0:
            raise CorruptMetadataError(f"segment metadata has sequence {segment.sequence}, "
                                       f"ledger {segment.ledger_id}")
        return segment


@dataclass(frozen=True, slots=True)
class StreamConfig:
    name: str
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    roll_bytes: int = ROLL_BYTES_DEFAULT
    roll_age_ms: int = ROLL_AGE_MS_DEFAULT
    roll_records: int = 0  # 0: no record-count limit
    retention_age_ms: int = 0  # 0: keep forever
    retention_bytes: int = 0  # 0: no size limit
    retention_keeps_unconsumed: bool = True  # retention keeps what a subscriber has not consumed
    schema: str = ""  # "" = the default schema; else schema_to_text() of an Arrow schema
    password: str = ""  # ledger password of this stream's segments (random, per stream)
    created_ms: int = 0

    def __post_init__(self) -> None:
        check_quorum(self.ensemble, self.write_quorum, self.ack_quorum)
        for name in ("roll_bytes", "roll_age_ms", "roll_records", "retention_age_ms", "retention_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name.replace('_', ' ')} must be >= 0, got {getattr(self, name)}")

    def to_bytes(self) -> bytes:
        document = asdict(self)
        document["format"] = FORMAT_VERSION
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> StreamConfig:
        document = _load(data, "stream config")
        try:
            return cls(**{name: document[name] for name in cls.__dataclass_fields__ if name in document})
        except (TypeError, ConfigError) as exc:
            raise CorruptMetadataError(f"stream config is malformed: {exc}") from exc

    def public_json(self) -> dict[str, Any]:
        """What `dlog stream info` shows (never the password)."""
        document = asdict(self)
        document.pop("password")
        return document


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptMetadataError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT_VERSION:
        found = document.get("format") if isinstance(document, dict) else None
        raise CorruptMetadataError(f"{what} format {found!r} is not supported (this client reads "
                                   f"format {FORMAT_VERSION})")
    return document


def check_segment_list(segments: list[Segment]) -> None:
    """L3/L4 as data: sequences strictly increase, at most one segment in progress (the last)."""
    sequences = [segment.sequence for segment in segments]
    if sequences != sorted(set(sequences)):
        raise CorruptMetadataError(f"segment sequence numbers {sequences} do not strictly increase")
    in_progress = [segment.sequence for segment in segments if segment.is_in_progress]
    if len(in_progress) > 1:
        raise CorruptMetadataError(f"segments {in_progress} are all in progress; at most one may be")
    if in_progress and in_progress[0] != sequences[-1]:
        raise CorruptMetadataError(f"in-progress segment {in_progress[0]} is not the last one")
