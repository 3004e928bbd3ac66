"""Key compaction's rules: which segments a compaction covers (its horizon), which records it
keeps (the latest per key, deletion markers dropped after the delete retention), and the one
segment-list change that swaps the compacted records in.

What a compaction does (the driver is `dlog.compaction`). It covers a run of completed segments
from the stream's first live one: never the in-progress segment, never one whose newest record is
younger than the stream's `min_compaction_lag_ms`, never past `--until OFFSET` (the segments that
end before it), never a segment with a tier copy (a tiered stream is not compacted). Every
segment compacted before is covered again (the compacted prefix only grows), so one compaction
ledger holds the whole compacted view and a new one replaces it whole.

Which records stay. A record stays when it is the LATEST record of its key among all the covered
records (Kafka's log cleaner, whose offset map is `LatestPerKey`). A record with a null value (in
an untyped stream, whose value column holds no nulls, an empty value: what a Kafka client's null
value becomes in the serving tier) is a deletion marker (a tombstone): it stays, as the latest of
its key, so readers of the compacted view learn that the key is gone, until its segment was first
compacted `delete_retention_ms` ago; then it goes too. Records without a key cannot be superseded
and are not kept: a compacted stream is a table by key (Kafka refuses keyless records on
compacted topics).

Offsets never change. A kept record keeps its offset (ledger, entry, slot) and its position: the
compaction ledger stores each kept record with its original entry, slot and index in the segment,
and the segment keeps its ledger id, entries and counts in the list; only its `compacted` copy
(`CompactedCopy`) says where its records are now. Readers read a segment with a compacted copy
from there, handing out the original offsets.

The swap. The compactor writes the kept records of every covered segment into one new ledger,
then commits `swap_change`: ONE compare-and-set that gives each covered segment its compacted
copy, planned against the list the compaction read (it fails, and the compaction gives up and
deletes its ledger, if any covered segment was truncated, offloaded or compacted by someone else
meanwhile). Only after it lands are the replaced ledgers deleted (`replaced_ledgers`): the
originals of the newly compacted segments and the previous compaction ledger.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace

from bookkeeper.errors import ConfigError, invariant
from dlog.core.errors import OffsetOutOfRangeError
from dlog.core.snapshot import Cursor, Located, PositionAt, PositionLookup, StreamView, below_truncation
from dlog.offsets import Offset
from dlog.segments.metadata import CompactedCopy, Segment, SegmentChange, SegmentList, SegmentState, StreamConfig


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """The segments a compaction covers (as listed when it was planned, in stream order) and
    those whose deletion markers it drops (by sequence)."""

    segments: tuple[Segment, ...]
    drops_tombstones: frozenset[int]

    @property
    def horizon(self) -> Segment:
        """The last segment covered: nothing after it is compacted."""
        return self.segments[-1]

    @property
    def records(self) -> int:
        """The records the compaction reads: the originals of new segments, the kept ones of the
        segments compacted before."""
        return sum(s.records if s.compacted is None else s.compacted.records for s in self.segments)


def compaction_plan(listing: SegmentList, config: StreamConfig, now_ms: int, stream: str,
                    until: Offset | None = None) -> CompactionPlan | None:
    """What a compaction of the stream covers now (see the module doc), or None when it would
    change nothing (every covered segment is compacted already and no deletion marker is due).
    OffsetOutOfRangeError for an `until` in no live segment or beyond the horizon."""
    eligible: list[Segment] = []
    for segment in listing.segments:
        if segment.is_truncated:
            continue
        if segment.is_in_progress or segment.tier is not None:
            break
        if segment.compacted is None and segment.last_timestamp_ms > now_ms - config.min_compaction_lag_ms:
            break
        eligible.append(segment)
    covered = eligible
    if until is not None:
        target = listing.by_ledger(until.ledger_id)
        if target is None or target.is_truncated:
            raise OffsetOutOfRangeError(f"cannot compact stream {stream!r} until {until}: no live segment has "
                                        f"ledger {until.ledger_id}")
        at_start = (until.entry_id, until.slot) <= (target.first_entry, 0)
        if target not in eligible and not at_start:
            last = eligible[-1].sequence if eligible else None
            horizon = (f"the end of segment {last} (ledger {eligible[-1].ledger_id})" if last is not None
                       else "the stream's start: no segment can be compacted yet")
            raise OffsetOutOfRangeError(
                f"cannot compact stream {stream!r} until {until}: that is beyond the compaction horizon, "
                f"{horizon}; the in-progress segment, a segment on the tier and a segment whose newest record "
                "is younger than the min compaction lag are never compacted")
        covered = [s for s in eligible if s.sequence < target.sequence or s.compacted is not None]
    if not covered:
        return None
    due = frozenset(s.sequence for s in covered if tombstones_due(s, config, now_ms))
    if all(s.compacted is not None for s in covered) and not due:
        return None
    return CompactionPlan(tuple(covered), due)


def tombstones_due(segment: Segment, config: StreamConfig, now_ms: int) -> bool:
    """Whether a compaction now drops the segment's deletion markers: it was first compacted at
    least `delete_retention_ms` ago (a segment compacted for the first time counts from now, so a
    delete retention of 0 drops them at once)."""
    first_ms = segment.compacted.compacted_ms if segment.compacted is not None else now_ms
    if segment.compacted is not None and segment.compacted.tombstones == 0:
        return False
    return first_ms <= now_ms - config.delete_retention_ms


def check_compactable(config: StreamConfig, tier_enabled: bool, key_column: bool) -> None:
    """ConfigError (one line) for a stream compaction cannot run on."""
    if tier_enabled:
        raise ConfigError(f"stream {config.name!r} has a tier: compaction and tiered storage do not combine "
                          "(turn one of them off)")
    if not key_column:
        raise ConfigError(f"stream {config.name!r} has no `key` column: compaction keeps the latest record "
                          "per key")
    if config.schema_history:
        raise ConfigError(f"stream {config.name!r} has {len(config.schema_history) + 1} schema versions: compaction "
                          "reads every segment in one schema, so it runs on typed streams of one version only")


class LatestPerKey:
    """Kafka's offset map: the place (segment sequence, entry, slot) of each key's latest record,
    from the covered records fed in stream order (`add`); then `kept` says which records stay.
    Memory: one item per distinct key."""

    def __init__(self) -> None:
        self.latest: dict[Hashable, tuple[int, int, int]] = {}

    def add(self, keys: Sequence[Hashable | None], sequence: int, entry_id: int, slots: Sequence[int]) -> None:
        latest = self.latest
        for key, slot in zip(keys, slots, strict=True):
            if key is not None:
                latest[key] = (sequence, entry_id, slot)

    def kept(self, keys: Sequence[Hashable | None], tombstones: Sequence[bool], sequence: int, entry_id: int,
             slots: Sequence[int], drop_tombstones: bool) -> list[int]:
        """The rows (indexes into `keys`) of one entry's records that stay: each the latest of its
        key, a deletion marker only while `drop_tombstones` is false."""
        latest = self.latest
        return [row for row, (key, tombstone, slot) in enumerate(zip(keys, tombstones, slots, strict=True))
                if key is not None and latest.get(key) == (sequence, entry_id, slot)
                and not (tombstone and drop_tombstones)]

    def __len__(self) -> int:
        return len(self.latest)


def compacted_copy(planned: Segment, ledger_id: int, first_entry: int, last_entry: int, records: int,
                   tombstones: int, now_ms: int) -> CompactedCopy:
    """The copy a covered segment gets: its first compaction's time kept (delete retention counts
    from it)."""
    first_ms = planned.compacted.compacted_ms if planned.compacted is not None else now_ms
    return CompactedCopy(ledger_id, first_entry, last_entry, records, first_ms, tombstones)


def swap_change(listing: SegmentList, plan: CompactionPlan,
                copies: Mapping[int, CompactedCopy]) -> SegmentChange | None:
    """The ONE change that swaps the compacted copies in, planned on a fresh `listing`; None when a
    covered segment changed since the plan (truncated, offloaded, compacted by another run): the
    compaction is then void."""
    invariant(set(copies) == {s.sequence for s in plan.segments}, "a compacted copy for each covered segment")
    updates = []
    for planned in plan.segments:
        current = listing.by_sequence(planned.sequence)
        if (current is None or current.ledger_id != planned.ledger_id or current.state is not SegmentState.COMPLETED
                or current.compacted != planned.compacted or current.tier is not None):
            return None
        updates.append(replace(current, compacted=copies[planned.sequence]))
    return SegmentChange(update=tuple(updates))


def replaced_ledgers(plan: CompactionPlan) -> list[int]:
    """The ledgers a landed swap leaves unreferenced: the originals of the segments compacted for
    the first time, and the compaction ledger(s) of those compacted before."""
    originals = [s.ledger_id for s in plan.segments if s.compacted is None]
    previous = sorted({s.compacted.ledger_id for s in plan.segments if s.compacted is not None})
    return [*originals, *previous]


def located_kept(view: StreamView, lookup: PositionLookup, kept: tuple[int, int, int] | None) -> Located:
    """Where a read of stream position `lookup` starts in a compacted segment: at `kept`, the
    first record compaction kept at or after it (entry, slot, index in the segment), as Kafka
    fetches a compacted-away offset from the next record there is; past the segment when none is."""
    segment = view.segments[lookup.index]
    if kept is None:
        return Located(PositionAt.RECORD, Cursor(segment.sequence + 1, 0, 0), None, lookup.end_position)
    entry_id, slot, index = kept
    if below_truncation(segment, entry_id, slot):
        return Located(PositionAt.REMOVED, end_position=lookup.end_position)
    position = index + (segment.first_position or 0)
    return Located(PositionAt.RECORD, Cursor(segment.sequence, entry_id, slot),
                   Offset(segment.ledger_id, entry_id, slot, position), lookup.end_position)
