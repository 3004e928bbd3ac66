"""Stream and segment metadata: what ZooKeeper holds about each stream, as frozen dataclasses.

A stream is a chain of segments, each one ledger. A segment is `in_progress` while its writer
appends, `completed` once sealed (its last entry and record count known), and `truncated` once
marked for removal (its ledger is then deleted and its node removed). A segment may also be
partly truncated: records below (`min_active_entry`, `min_active_slot`) are gone for readers.
JSON with a format version; anything unknown fails closed.

Positions (V4). `first_position` is the stream position of the segment's first record: records
are numbered 0, 1, 2... from the stream's first record, and a record's position is its segment's
`first_position` plus its index within the segment (its entry header's `first_record_index` plus
its slot). Whoever creates a segment assigns it (`dlog.core.changes`); it never changes after.
A node written before positions existed has none (None: unknown) until the next writer assigns it.

Tiered storage. A completed segment may also have a copy on the tier, one Parquet file
(`TierCopy`): `offload_attempt` names the file an offloader is writing (recorded before it
uploads), `tier` the file once committed (with its size and checksum), and `tier.bookie_deleted_ms`
says the ledger was deleted on purpose after the offload (readers then read the file; the segment
is not data loss). A stream's `TierPolicy` says where its tier is and when to offload.

A `SegmentList` is the list as read, with the version a change must be based on; a
`SegmentChange` is one compare-and-set change of it (segments created, updated, deleted, and
maybe a Spark sink's batch id recorded with them). Both are pure values: the segment store port
(`dlog.segments.port`) applies changes, the stream core (`dlog.core`) plans them.
"""

from __future__ import annotations

import builtins
import enum
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bookkeeper.errors import ConfigError, CorruptMetadataError
from bookkeeper.protocol.metadata import check_quorum

FORMAT_VERSION = 1
POSITION_MAX = 2**63 - 1  # positions are signed 64-bit, as Kafka's offsets
ROLL_BYTES_DEFAULT = 256 * 2**20
ROLL_AGE_MS_DEFAULT = 2 * 3600 * 1000
BACKLOG_POLICIES = ("hold", "evict", "none")  # dlog.core.backlog.BacklogPolicy
SCHEMA_COMPATIBILITY_MODES = ("BACKWARD", "FORWARD", "FULL", "NONE")  # dlog.segments.schemas has the rules
DELETE_RETENTION_MS_DEFAULT = 24 * 3600 * 1000  # Kafka's delete.retention.ms default


@dataclass(frozen=True, slots=True)
class TierCopy:
    """A completed segment's copy on the tier: one Parquet file at `uri`, `size_bytes` long with
    crc32c `crc32c` over its bytes, `rows` records, committed at `offloaded_ms`; `bookie_deleted_ms`
    is when the ledger (the bookie copy) was deleted, 0 while it exists."""

    uri: str
    size_bytes: int
    crc32c: int
    rows: int
    offloaded_ms: int
    bookie_deleted_ms: int = 0

    @property
    def on_bookies(self) -> bool:
        return self.bookie_deleted_ms == 0

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, document: Any) -> TierCopy:
        if not isinstance(document, dict):
            raise CorruptMetadataError(f"segment tier copy is {document!r}, not an object")
        try:
            copy = cls(**{name: document[name] for name in cls.__dataclass_fields__ if name in document})
        except TypeError as exc:
            raise CorruptMetadataError(f"segment tier copy is malformed: {exc}") from exc
        numbers = (copy.size_bytes, copy.crc32c, copy.rows, copy.offloaded_ms, copy.bookie_deleted_ms)
        if not isinstance(copy.uri, str) or not copy.uri or any(type(n) is not int or n < 0 for n in numbers):
            raise CorruptMetadataError(f"segment tier copy is malformed: {document!r}")
        return copy


@dataclass(frozen=True, slots=True)
class CompactedCopy:
    """A completed segment's compacted records (key compaction, `dlog.core.compaction`): the
    entries `first_entry`..`last_entry` of ledger `ledger_id` (none when `last_entry` <
    `first_entry`) hold the `records` records of the segment compaction kept, each with its
    original entry, slot and index in the segment, `tombstones` of them deletion markers (null
    values); `compacted_ms` is when the segment was FIRST compacted (a later compaction keeps it:
    delete retention counts from it). One compaction writes one ledger for all the segments it
    covers."""

    ledger_id: int
    first_entry: int
    last_entry: int
    records: int
    compacted_ms: int
    tombstones: int = 0

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, document: Any) -> CompactedCopy:
        if not isinstance(document, dict):
            raise CorruptMetadataError(f"segment compacted copy is {document!r}, not an object")
        try:
            copy = cls(**{name: document[name] for name in cls.__dataclass_fields__ if name in document})
        except TypeError as exc:
            raise CorruptMetadataError(f"segment compacted copy is malformed: {exc}") from exc
        if any(type(getattr(copy, name)) is not int or getattr(copy, name) < 0
               for name in cls.__dataclass_fields__ if name != "last_entry") or type(copy.last_entry) is not int:
            raise CorruptMetadataError(f"segment compacted copy is malformed: {document!r}")
        return copy


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
    first_position: int | None = None  # stream position of its first record; None: not assigned yet
    tier: TierCopy | None = None  # its committed copy on the tier (completed segments only)
    offload_attempt: str = ""  # the URI of the file an offloader is writing now ("" none)
    schema_version: int = 0  # the stream's schema version its records were written with (0: before versions: 1)
    compacted: CompactedCopy | None = None  # its records after key compaction (its ledger then deleted)

    @property
    def on_bookies(self) -> bool:
        """Whether its ledger holds its records (not deleted after an offload)."""
        return self.tier is None or self.tier.bookie_deleted_ms == 0

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
        # field by field: dataclasses.asdict deep-copies, ten times slower on this hot path
        document = {name: getattr(self, name) for name in self.__dataclass_fields__}
        document["state"] = self.state.value
        document["format"] = FORMAT_VERSION
        if self.tier is not None:
            document["tier"] = self.tier.to_json()
        if self.compacted is not None:
            document["compacted"] = self.compacted.to_json()
        return document

    def to_bytes(self) -> builtins.bytes:  # builtins: `bytes` is also a field of Segment
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: builtins.bytes) -> Segment:
        document = _load(data, "segment")
        document.setdefault("first_position", None)  # a node written before positions existed
        document.setdefault("offload_attempt", "")  # nodes written before tiered storage
        document.setdefault("schema_version", 0)  # nodes written before schema versions
        tier = document.get("tier")
        document["tier"] = None if tier is None else TierCopy.from_json(tier)
        compacted = document.get("compacted")  # absent: never compacted (and nodes written before it)
        document["compacted"] = None if compacted is None else CompactedCopy.from_json(compacted)
        try:
            document["state"] = SegmentState(document["state"])
            fields = {name: document[name] for name in cls.__dataclass_fields__}
            segment = cls(**fields)
        except (KeyError, ValueError, TypeError) as exc:
            raise CorruptMetadataError(f"segment metadata is malformed: {exc!r}") from exc
        if segment.sequence < 1 or segment.ledger_id < 0:
            raise CorruptMetadataError(f"segment metadata has sequence {segment.sequence}, "
                                       f"ledger {segment.ledger_id}")
        position = segment.first_position
        if position is not None and (type(position) is not int or not 0 <= position <= POSITION_MAX):
            raise CorruptMetadataError(f"segment {segment.sequence} has first position {position!r}; "
                                       f"expected an integer in 0..{POSITION_MAX}")
        return segment


HOUR_MS = 3600 * 1000


@dataclass(frozen=True, slots=True)
class TierPolicy:
    """Where a stream's tier is and when its segments go there. A field left None inherits: a
    stream's policy over its namespace's default over `TIER_DEFAULTS` (`over`).

    - `uri`: a pyarrow.fs URI (`file:///...`, `s3://bucket/prefix`); "" = no tier;
    - `offload_after_ms`: a completed segment is offloaded this long after it completed (-1: only
      by `dlog offload`; 0: at once);
    - `keep_bytes`: the newest completed segments up to this many bytes are not offloaded;
    - `delete_lag_ms`: the bookie copy is deleted this long after the offload (-1: never);
    - `retention_age_ms`, `retention_bytes`: the tier's retention (0: no limit), apart from the
      bookies' (the stream's `retention_*`, which on a tiered stream only drops bookie copies).
    """

    uri: str | None = None
    offload_after_ms: int | None = None
    keep_bytes: int | None = None
    delete_lag_ms: int | None = None
    retention_age_ms: int | None = None
    retention_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.uri is not None and not isinstance(self.uri, str):
            raise ConfigError(f"tier uri must be text, got {self.uri!r}")
        for name, low in (("offload_after_ms", -1), ("keep_bytes", 0), ("delete_lag_ms", -1),
                          ("retention_age_ms", 0), ("retention_bytes", 0)):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < low):
                raise ConfigError(f"tier {name.replace('_', ' ')} must be an integer >= {low}, got {value!r}")

    @property
    def enabled(self) -> bool:
        return bool(self.uri)

    def over(self, base: TierPolicy) -> TierPolicy:
        """This policy, with what it leaves None taken from `base`."""
        return TierPolicy(**{name: getattr(base, name) if getattr(self, name) is None else getattr(self, name)
                             for name in self.__dataclass_fields__})

    def set_fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__ if getattr(self, name) is not None}

    def to_bytes(self) -> bytes:
        return json.dumps({**self.set_fields(), "format": FORMAT_VERSION}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, document: Any) -> TierPolicy:
        if not isinstance(document, dict):
            raise CorruptMetadataError(f"tier policy is {document!r}, not an object")
        try:
            return cls(**{name: document[name] for name in cls.__dataclass_fields__ if name in document})
        except (TypeError, ConfigError) as exc:
            raise CorruptMetadataError(f"tier policy is malformed: {exc}") from exc

    @classmethod
    def from_bytes(cls, data: bytes) -> TierPolicy:
        return cls.from_json(_load(data, "tier policy"))


TIER_DEFAULTS = TierPolicy(uri="", offload_after_ms=-1, keep_bytes=0, delete_lag_ms=4 * HOUR_MS,
                           retention_age_ms=0, retention_bytes=0)


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
    tier: TierPolicy = field(default_factory=TierPolicy)  # its own tier settings (None fields inherit)
    # the Iceberg table its tier files are registered in ("" none): a SQL catalog URL, a warehouse
    iceberg_catalog: str = ""
    iceberg_warehouse: str = ""
    # backlog limits of a subscription (0: none), what happens over one, and subscription expiry
    # after inactivity (0: never); see dlog.core.backlog
    backlog_bytes: int = 0
    backlog_age_ms: int = 0
    backlog_policy: str = "hold"  # hold | evict | none
    subscription_expiry_ms: int = 0
    # the schema's earlier versions (schema_to_text each, version 1 first; `schema` is the latest)
    schema_history: tuple[str, ...] = ()
    schema_compatibility: str = "BACKWARD"  # what a new schema version must keep (SCHEMA_COMPATIBILITY_MODES)
    # key compaction (dlog.core.compaction): run by the policy runner when on; a segment is
    # compacted once its newest record is `min_compaction_lag_ms` old; a deletion marker (a record
    # with a null value) is dropped once its segment was first compacted `delete_retention_ms` ago
    compaction: bool = False
    min_compaction_lag_ms: int = 0
    delete_retention_ms: int = DELETE_RETENTION_MS_DEFAULT

    def __post_init__(self) -> None:
        check_quorum(self.ensemble, self.write_quorum, self.ack_quorum)
        if not isinstance(self.schema_history, tuple):
            object.__setattr__(self, "schema_history", tuple(self.schema_history))
        if self.schema_compatibility not in SCHEMA_COMPATIBILITY_MODES:
            raise ConfigError(f"bad schema compatibility {self.schema_compatibility!r}: use one of "
                              f"{', '.join(SCHEMA_COMPATIBILITY_MODES)}")
        for name in ("roll_bytes", "roll_age_ms", "roll_records", "retention_age_ms", "retention_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name.replace('_', ' ')} must be >= 0, got {getattr(self, name)}")
        for name in ("backlog_bytes", "backlog_age_ms", "subscription_expiry_ms"):
            if type(getattr(self, name)) is not int or getattr(self, name) < 0:
                raise ConfigError(f"{name.replace('_', ' ')} must be an integer >= 0, got {getattr(self, name)!r}")
        if self.backlog_policy not in BACKLOG_POLICIES:
            raise ConfigError(f"backlog policy must be one of {', '.join(BACKLOG_POLICIES)}, "
                              f"got {self.backlog_policy!r}")
        for name in ("min_compaction_lag_ms", "delete_retention_ms"):
            if type(getattr(self, name)) is not int or getattr(self, name) < 0:
                raise ConfigError(f"{name.replace('_', ' ')} must be an integer >= 0, got {getattr(self, name)!r}")
        if type(self.compaction) is not bool:
            raise ConfigError(f"compaction must be true or false, got {self.compaction!r}")

    def to_bytes(self) -> bytes:
        document = asdict(self)
        document["tier"] = self.tier.set_fields()
        document["format"] = FORMAT_VERSION
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> StreamConfig:
        document = _load(data, "stream config")
        document["tier"] = TierPolicy.from_json(document.get("tier") or {})
        try:
            return cls(**{name: document[name] for name in cls.__dataclass_fields__ if name in document})
        except (TypeError, ConfigError) as exc:
            raise CorruptMetadataError(f"stream config is malformed: {exc}") from exc

    def public_json(self) -> dict[str, Any]:
        """What `dlog stream info` shows (never the password)."""
        document = asdict(self)
        document.pop("password")
        document["tier"] = self.tier.set_fields()
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


@dataclass(frozen=True, slots=True)
class SegmentList:
    """A stream's segments in sequence order, as read, with the version a change must be based on."""

    segments: tuple[Segment, ...]
    version: int
    max_sequence: int

    def __post_init__(self) -> None:
        if not isinstance(self.segments, tuple):
            object.__setattr__(self, "segments", tuple(self.segments))

    @property
    def in_progress(self) -> Segment | None:
        return self.segments[-1] if self.segments and self.segments[-1].is_in_progress else None

    @property
    def live(self) -> list[Segment]:
        return [segment for segment in self.segments if not segment.is_truncated]

    def by_ledger(self, ledger_id: int) -> Segment | None:
        return next((s for s in self.segments if s.ledger_id == ledger_id), None)

    def by_sequence(self, sequence: int) -> Segment | None:
        return next((s for s in self.segments if s.sequence == sequence), None)

    def after(self, sequence: int) -> Segment | None:
        """The first segment with a sequence >= `sequence`."""
        return next((s for s in self.segments if s.sequence >= sequence), None)


@dataclass(frozen=True, slots=True)
class SinkBatch:
    """What a Spark sink recorded: its last committed batch id, that batch's ledgers, and the
    store's version of the record (the compare-and-set token of the next commit)."""

    batch_id: int
    ledgers: tuple[int, ...]
    version: int


@dataclass(frozen=True, slots=True)
class SinkCommit:
    """Record `batch_id` (and its ledgers) for `sink_id` with a segment change, or not at all;
    `previous` is what was recorded before (None: the sink's first commit)."""

    sink_id: str
    batch_id: int
    ledgers: tuple[int, ...]
    previous: SinkBatch | None


@dataclass(frozen=True, slots=True)
class SegmentChange:
    """One compare-and-set change of a segment list: all of it lands, or none."""

    create: tuple[Segment, ...] = ()
    update: tuple[Segment, ...] = ()
    delete: tuple[Segment, ...] = ()
    sink: SinkCommit | None = field(default=None)
    dedup: bytes | None = None  # the producer table's stored snapshot, set in the same multi (named writers)

    def __post_init__(self) -> None:
        for name in ("create", "update", "delete"):
            value = getattr(self, name)
            if not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete or self.sink)

    def applied_to(self, listing: SegmentList) -> SegmentList:
        """The list this change makes of `listing` (the version the store will give it: +1)."""
        touched = {s.sequence for s in self.update} | {s.sequence for s in self.delete}
        kept = [s for s in listing.segments if s.sequence not in touched]
        segments = sorted([*kept, *self.update, *self.create], key=lambda s: s.sequence)
        top = max([listing.max_sequence, *(s.sequence for s in self.create)])
        return SegmentList(tuple(segments), listing.version + 1, top)

    def landed_in(self, listing: SegmentList, sink: SinkBatch | None = None) -> bool:
        """Whether `listing` (read after an attempt whose answer was lost) already holds this
        change: its new segments (by sequence and ledger), its updates' own fields, its deletes
        gone, and its sink batch recorded. Only then may a caller count the attempt as done."""
        for segment in self.create:
            found = listing.by_sequence(segment.sequence)
            if found is None or found.ledger_id != segment.ledger_id:
                return False
        for segment in self.update:
            found = listing.by_sequence(segment.sequence)
            if found is None or not same_progress(found, segment):
                return False
        if any(listing.by_sequence(s.sequence) is not None for s in self.delete):
            return False
        return self.sink is None or (sink is not None and sink.batch_id >= self.sink.batch_id)


PROGRESS_FIELDS = ("state", "ledger_id", "first_entry", "last_entry", "records", "bytes",
                   "first_timestamp_ms", "last_timestamp_ms", "completed_ms", "first_position")


def same_progress(a: Segment, b: Segment) -> bool:
    """Equal in what a writer owns (state and progress), whatever truncation did meanwhile."""
    return all(getattr(a, name) == getattr(b, name) for name in PROGRESS_FIELDS)


def sequences(segments: Iterable[Segment]) -> list[int]:
    return [segment.sequence for segment in segments]
