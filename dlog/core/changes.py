"""Pure planners of segment-list changes: sealing, merging with concurrent changes, truncation,
retention and tombstone trimming.

Who owns what in a segment (so concurrent changes MERGE instead of one undoing another):
- the writer of a segment owns its progress: state in progress -> completed, last entry, record
  count, bytes, timestamps (`metadata.PROGRESS_FIELDS`);
- truncation owns the truncation point inside a segment (`min_active_entry`, `min_active_slot`)
  and the TRUNCATED state of whole segments below it; retention owns TRUNCATED too.
A writer whose compare-and-set lost re-reads the list and rebases its change on it
(`rebase_progress`): only its in-progress segment gone, completed by someone else, or followed by
another segment means a takeover. Truncation and retention simply plan again from the new list.

The record count of a sealed segment has one formula: the header of its last entry says the
index of its first record within the segment and how many it holds
(`RecordSetHeader.next_record_index`); `sealed_segment` takes that number.

Positions (V4). Whoever creates a segment gives it its `first_position`: the position after the
segment before it (that one's `first_position + records`), so a stream's records are numbered
densely across segments whatever wrote them. A writer's open and a Spark sink's commit create
segments after a list whose last segment is completed (they seal an in-progress one first):
`append_change`, cumulatively for several. A roll creates the next segment once every entry of
the current one is acknowledged: `roll_change`, from the records the writer sent into it. Once
assigned, a segment's position never changes; truncation and retention keep it (a truncated
segment stays listed as a tombstone with its counts), so positions are never reused.

Streams written before positions existed have segments without one. The first writer open (or
sink commit) assigns them in the same compare-and-set that creates its segment
(`positioned`): each unknown position is derived from the nearest segment whose position is
known, forward (`previous.first_position + previous.records`) or backward
(`next.first_position - records`); when none is known the earliest listed segment gets 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from bookkeeper.errors import CorruptMetadataError, invariant
from dlog.core import backlog
from dlog.core.errors import OffsetOutOfRangeError
from dlog.offsets import Offset
from dlog.segments.metadata import (
    Segment,
    SegmentChange,
    SegmentList,
    SegmentState,
    SinkCommit,
    StreamConfig,
)

TOMBSTONES_MAX = 1000  # truncated segments remembered, so old offsets read as truncated


# ---------------------------------------------------------------------------------- positions


def positioned(segments: Sequence[Segment]) -> list[Segment]:
    """The segments (in list order) each with its first position: those known are kept, the others
    derived from the nearest known neighbour (see the module doc). Every segment but the last must
    be completed (or truncated): its record count is final."""
    filled = list(segments)
    known = [index for index, segment in enumerate(filled) if segment.first_position is not None]
    if not filled or len(known) == len(filled):
        return filled
    anchor = known[0] if known else 0
    if not known:
        filled[0] = replace(filled[0], first_position=0)
    for index in range(anchor + 1, len(filled)):  # forward from the first known
        if filled[index].first_position is None:
            filled[index] = replace(filled[index], first_position=_end_of(filled[index - 1]))
    for index in range(anchor - 1, -1, -1):  # backward, before it
        start = filled[index + 1].first_position
        assert start is not None
        invariant(not filled[index].is_in_progress, f"segment {filled[index].sequence} is in progress but not last")
        if start < filled[index].records:
            raise CorruptMetadataError(
                f"segment {filled[index + 1].sequence} starts at position {start}, but the {filled[index].records} "
                f"records of segment {filled[index].sequence} before it would then start below 0")
        filled[index] = replace(filled[index], first_position=start - filled[index].records)
    return filled


def next_position(segments: Sequence[Segment]) -> int:
    """The position of the first record of a segment created after these (all positioned, the last
    one completed): 0 for a stream with no segment listed."""
    return _end_of(segments[-1]) if segments else 0


def _end_of(segment: Segment) -> int:
    invariant(not segment.is_in_progress and segment.first_position is not None,
              f"segment {segment.sequence} has no final end position ({segment.state.value}, first position "
              f"{segment.first_position})")
    assert segment.first_position is not None
    return segment.first_position + segment.records


def append_change(listing: SegmentList, created: Sequence[Segment], sink: SinkCommit | None = None) -> SegmentChange:
    """Create `created` after every segment of `listing` (none of which is in progress), positioned
    one after the other, and assign positions to listed segments that have none, all in ONE change
    (a writer's open, a sink's commit)."""
    invariant(listing.in_progress is None, "segments are appended only after the in-progress one is sealed")
    filled = positioned(listing.segments)
    migrated = tuple(new for new, old in zip(filled, listing.segments, strict=True)
                     if new.first_position != old.first_position)
    position = next_position(filled)
    placed = []
    for segment in created:
        invariant(segment.first_position is None and not segment.is_truncated,
                  f"segment {segment.sequence} to create is already positioned or truncated")
        placed.append(replace(segment, first_position=position))
        position += segment.records  # completed ones (a sink's) hold records; a writer's new one none yet
    return SegmentChange(create=tuple(placed), update=migrated, sink=sink)


def roll_change(completed: Segment, created: Segment) -> SegmentChange:
    """Complete the writer's segment and create the next one, positioned right after it."""
    return SegmentChange(update=(completed,), create=(replace(created, first_position=_end_of(completed)),))


# ---------------------------------------------------------------------------------- sealing


def sealed_segment(segment: Segment, *, last_entry: int, records: int, size_bytes: int,
                   first_timestamp_ms: int, last_timestamp_ms: int, now_ms: int) -> Segment:
    """The completed form of an in-progress segment whose ledger ends at `last_entry`."""
    invariant(segment.is_in_progress, f"segment {segment.sequence} is {segment.state.value}, not in progress")
    invariant(last_entry >= segment.first_entry and records >= 0,
              f"segment {segment.sequence}: sealed at entry {last_entry} with {records} records")
    return segment.completed(last_entry, records, size_bytes, first_timestamp_ms, last_timestamp_ms, now_ms)


def seal_change(segment: Segment, sealed: Segment | None) -> SegmentChange:
    """Complete a previous writer's in-progress segment, or drop it when it holds nothing (L4)."""
    return SegmentChange(update=(sealed,)) if sealed is not None else SegmentChange(delete=(segment,))


def deletion_lost_records(listing: SegmentList, ledger_id: int) -> bool:
    """Whether a ledger whose metadata is gone took records with it: the list still names it as a
    live segment. Truncation and retention mark a segment truncated before they delete its ledger,
    and an empty segment is dropped from the list before its ledger is deleted."""
    segment = listing.by_ledger(ledger_id)
    return segment is not None and not segment.is_truncated


# ---------------------------------------------------------------------------------- merging


def rebase_progress(ours: Segment, stored: Segment) -> Segment:
    """A writer's new version of its segment on top of the stored one: its progress fields, the
    stored truncation point (which truncation may have moved since the writer last read)."""
    invariant(ours.sequence == stored.sequence and ours.ledger_id == stored.ledger_id,
              f"segment {ours.sequence}/{ours.ledger_id} rebased on {stored.sequence}/{stored.ledger_id}")
    return replace(ours, min_active_entry=stored.min_active_entry, min_active_slot=stored.min_active_slot,
                   tier=stored.tier, offload_attempt=stored.offload_attempt, compacted=stored.compacted)


def still_owned(segment: Segment, current: SegmentList) -> Segment | None:
    """The stored form of a writer's in-progress segment if the writer still owns the stream:
    the segment is still in progress and still the last one. None means a takeover."""
    stored = current.by_ledger(segment.ledger_id)
    if stored is None or not stored.is_in_progress or current.segments[-1] is not stored:
        return None
    return stored


# ---------------------------------------------------------------------------------- truncation


def truncation_change(listing: SegmentList, offset: Offset, target_end_entry: int,
                      stream: str) -> tuple[SegmentChange, list[Segment]]:
    """Remove every record strictly below `offset` (L5): segments wholly below it are marked
    truncated; the one it falls in records it as its truncation point (never lowered).
    `target_end_entry` is the last entry of that segment (its LAC while in progress). Returns the
    change and the segments it marks; OffsetOutOfRangeError for an offset in no live segment or
    past the end."""
    target = listing.by_ledger(offset.ledger_id)
    if target is None or target.is_truncated:
        raise OffsetOutOfRangeError(f"cannot truncate stream {stream!r} before {offset}: no live "
                                    f"segment has ledger {offset.ledger_id}")
    end = target_end_entry
    if offset.entry_id > end + 1 or (offset.entry_id == end + 1 and offset.slot > 0):
        raise OffsetOutOfRangeError(f"cannot truncate stream {stream!r} before {offset}: that is past "
                                    f"its end (ledger {target.ledger_id} ends at entry {end})")
    marked = [replace(s, state=SegmentState.TRUNCATED) for s in listing.segments
              if s.sequence < target.sequence and not s.is_truncated]
    updates = list(marked)
    if (offset.entry_id, offset.slot) > (target.min_active_entry, target.min_active_slot):
        updates.append(replace(target, min_active_entry=offset.entry_id, min_active_slot=offset.slot))
    return SegmentChange(update=tuple(updates)), marked


def tombstone_trim(listing: SegmentList, tombstones_max: int = TOMBSTONES_MAX) -> SegmentChange | None:
    """Truncated segments stay listed as tombstones (an offset in them reads as truncated, not as
    unknown); only the oldest beyond `tombstones_max` are deleted."""
    tombstones = [s for s in listing.segments if s.is_truncated]
    excess = tombstones[: max(0, len(tombstones) - tombstones_max)]
    return SegmentChange(delete=tuple(excess)) if excess else None


# ---------------------------------------------------------------------------------- retention


def retention_plan(listing: SegmentList, config: StreamConfig, subscriptions: Mapping[str, Mapping[str, int]],
                   now_ms: int) -> list[Segment]:
    """Completed segments the policy removes: older than the age limit, or oldest first while the
    stream is over its size limit. Never the in-progress segment, never the last completed one
    (so an idle stream keeps its latest records readable, and a stream whose in-progress segment
    has just started is never emptied), never what a subscriber has not consumed (when
    `retention_keeps_unconsumed`, or the stream holds writers for its backlog: `backlog.keeps_unconsumed`)."""
    completed = [s for s in listing.segments if s.state is SegmentState.COMPLETED]
    candidates = completed[:-1]
    if backlog.keeps_unconsumed(config):
        floor = subscriber_floor(listing, subscriptions.values())
        candidates = [s for s in candidates if floor is None or s.sequence < floor]
    plan: list[Segment] = []
    if config.retention_age_ms:
        plan = [s for s in candidates if s.last_timestamp_ms < now_ms - config.retention_age_ms]
    if config.retention_bytes:
        total = sum(s.bytes for s in listing.live) - sum(s.bytes for s in plan)
        for segment in candidates:
            if total <= config.retention_bytes:
                break
            if segment not in plan:
                plan.append(segment)
                total -= segment.bytes
    return sorted(plan, key=lambda s: s.sequence)


def subscriber_floor(listing: SegmentList, offsets: Iterable[Mapping[str, int]]) -> int | None:
    """The lowest segment sequence some subscriber still has to read."""
    floors = []
    for offset_json in offsets:
        segment = listing.by_ledger(int(offset_json["ledger"]))
        if segment is not None:
            floors.append(segment.sequence)
    return min(floors) if floors else None


def retention_change(plan: list[Segment]) -> SegmentChange:
    return SegmentChange(update=tuple(replace(s, state=SegmentState.TRUNCATED) for s in plan))
