"""Where a stream's readable records start and end: the one set of rules the reader machine,
Spark's planner and catalog, `dlog stream info` and the status page follow.

Theory of operation. A stream is read through its segment list. A completed segment's readable
entries end at its last entry; an in-progress one's at the LAC its ledger reports (A4). A
`StreamView` is one snapshot: the list as read plus that LAC (`dlog.snapshot` gathers both, with
one list read and one LAC fan-out). Everything here is a pure function of such values.

Positions. An `Offset` (ledger, entry, slot) is the one position type a stream shows outside
(`dlog.offsets`): offsets are not orderable, because stream order is segment order and ledger ids
need not follow it. Resolved against a list, a position is a `Cursor` (segment sequence, entry,
slot), which orders as the stream does; a cursor whose sequence is past every listed segment
means "the next segment, when there is one".

Truncation (L5). Records below a segment's truncation point (`min_active_entry`,
`min_active_slot`) and every record of a truncated segment are gone for readers:
`readable_start`, `below_truncation` and `readable_slot` say where readable data begins.

Data loss. `resolve` moves a position forward over removed data and says what was lost: records
removed (by truncation or retention) before they were read. Running off the end of a completed
segment into the next is not a loss; nor is skipping a removed segment the position had read to
its end. What a caller does about a loss is its own policy (the reader raises TruncatedError
unless `skip_truncated`; Spark fails the query unless failOnDataLoss=false).

In-progress counts. A completed segment's metadata holds its records; an in-progress one's do not,
so they come from the header of the entry at its LAC (`tail_count`: `first_record_index +
record_count`, and bytes estimated from that entry's size per record).

Stream positions (V4). A record's position is its segment's `first_position` plus its index in the
segment (`first_record_index` of its entry's header plus its slot). To find a position:
`lookup_position` picks the segment by binary search on the segments' first positions (from the
list alone), then `RecordSearch` finds the entry by binary search on its entries'
`first_record_index`, asking for one entry header at a time (sans-IO: the driver reads them
through the one header cache), O(log entries) headers; `located` turns the entry found into a
cursor, or says the position was removed (truncation, retention), is the stream's end (the next
record's position), past it, or unknown (a stream written before positions existed, until its
next writer opens it).
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bookkeeper.errors import invariant
from dlog.offsets import Offset
from dlog.segments.metadata import Segment, SegmentList, TierCopy

if TYPE_CHECKING:
    from dlog.segments.codec import RecordSetHeader


@dataclass(frozen=True, slots=True, order=True)
class Cursor:
    """The next record to read: entry `entry_id` of the segment numbered `sequence`, from `slot`."""

    sequence: int
    entry_id: int
    slot: int = 0


# ------------------------------------------------------------------------------ one segment


def first_readable(first_entry: int, min_active_entry: int, min_active_slot: int) -> tuple[int, int]:
    """(entry, slot) of the first record truncation left in a segment (L5), from its fields."""
    if min_active_entry < first_entry:
        return first_entry, 0
    return min_active_entry, min_active_slot


def readable_start(segment: Segment | SegmentView) -> tuple[int, int]:
    return first_readable(segment.first_entry, segment.min_active_entry, segment.min_active_slot)


def start_cursor(segment: Segment | SegmentView) -> Cursor:
    return Cursor(segment.sequence, *readable_start(segment))


def below_truncation(segment: Segment | SegmentView, entry_id: int, slot: int) -> bool:
    """Whether a position lies in removed data (a truncated segment, or below its truncation point)."""
    return segment.is_truncated or (entry_id, slot) < readable_start(segment)


def readable_slot(segment: Segment | None, entry_id: int, slot: int) -> int | None:
    """The first slot of an entry a reader may hand out when it enters it at `slot`; None when the
    whole entry is gone (its segment truncated or no longer listed, or below the truncation point)."""
    if segment is None or segment.is_truncated or entry_id < segment.min_active_entry:
        return None
    return segment.first_readable_slot(entry_id, slot)


def end_entry(segment: Segment, lac: int | None) -> int:
    """One past the last readable entry: the last entry + 1 of a completed segment, the LAC + 1 of
    an in-progress one (`lac` None: not known yet, nothing readable)."""
    if not segment.is_in_progress:
        end = segment.last_entry + 1
    else:
        end = lac + 1 if lac is not None else segment.first_entry
    return max(end, segment.first_entry)


def may_hold_at_or_after(segment: Segment | SegmentView, timestamp_ms: int) -> bool:
    """Whether a segment may hold a record stamped at or after `timestamp_ms`: its metadata knows
    its latest timestamp only once it is completed."""
    last_ms = segment.last_timestamp_ms
    return segment.is_in_progress or last_ms is None or last_ms >= timestamp_ms


def removed_by_truncation(listed: Segment | None, entry_id: int, slot: int) -> bool:
    """A segment's ledger is gone: was that truncation or retention (the list no longer has the
    segment, marks it truncated, or the position is below its truncation point)? If not, its
    records were removed behind the stream's back: data loss (L5)."""
    return listed is None or below_truncation(listed, entry_id, slot)


# ------------------------------------------------------------------------------ a snapshot


@dataclass(frozen=True, slots=True)
class SegmentView:
    """A segment as one snapshot saw it: where its readable entries end (`end_entry`) is known."""

    sequence: int
    ledger_id: int
    live: bool  # False once truncated
    completed: bool
    first_entry: int
    end_entry: int  # one past the last readable entry: last entry + 1, or LAC + 1 in progress
    min_active_entry: int = 0
    min_active_slot: int = 0
    records: int | None = None  # known for completed segments
    last_timestamp_ms: int | None = None  # the latest record timestamp, known for completed segments
    first_position: int | None = None  # the stream position of its first record (None: not assigned)
    tier: TierCopy | None = None  # its copy on the tier, if offloaded (a reader elsewhere reads it by this)
    schema_version: int = 0  # the schema version its records were written with (typed streams)

    @classmethod
    def of(cls, segment: Segment, lac: int | None) -> SegmentView:
        completed = not segment.is_in_progress
        return cls(segment.sequence, segment.ledger_id, live=not segment.is_truncated, completed=completed,
                   first_entry=segment.first_entry, end_entry=end_entry(segment, lac),
                   min_active_entry=segment.min_active_entry, min_active_slot=segment.min_active_slot,
                   records=segment.records if completed else None,
                   last_timestamp_ms=segment.last_timestamp_ms if completed else None,
                   first_position=segment.first_position, tier=segment.tier, schema_version=segment.schema_version)

    @property
    def is_truncated(self) -> bool:
        return not self.live

    @property
    def is_in_progress(self) -> bool:
        return not self.completed

    @property
    def start_entry(self) -> int:
        return readable_start(self)[0]

    @property
    def start_slot(self) -> int:
        return readable_start(self)[1]


@dataclass(frozen=True, slots=True)
class StreamView:
    """One snapshot of a stream: its segments in order, each with where its readable data ends."""

    name: str
    segments: tuple[SegmentView, ...]

    @classmethod
    def of(cls, name: str, listing: SegmentList, lac: int | None) -> StreamView:
        """The view of `listing` when its in-progress segment's LAC is `lac`."""
        return cls(name, tuple(SegmentView.of(segment, lac if segment.is_in_progress else None)
                               for segment in listing.segments))

    @property
    def end(self) -> Cursor:
        """The cursor past every segment of the view."""
        return Cursor(self.segments[-1].sequence + 1 if self.segments else 1, 0)

    def index_of(self, ledger_id: int) -> int | None:
        return next((i for i, s in enumerate(self.segments) if s.ledger_id == ledger_id), None)

    def index_at(self, cursor: Cursor) -> int:
        """The index of the cursor's segment (len(segments) for a cursor past them all)."""
        return next((i for i, s in enumerate(self.segments) if s.sequence >= cursor.sequence), len(self.segments))

    def cursor_at(self, index: int, entry_id: int, slot: int = 0) -> Cursor:
        if index >= len(self.segments):
            return self.end
        return Cursor(self.segments[index].sequence, entry_id, slot)


@dataclass(frozen=True, slots=True)
class Resolved:
    cursor: Cursor
    losses: tuple[str, ...] = ()


# ------------------------------------------------------------------------------ positions


def earliest(view: StreamView) -> Resolved:
    for index, segment in enumerate(view.segments):
        if segment.live:
            return _settle(view, index, segment.start_entry, segment.start_slot, [])
    return Resolved(view.end)


def latest(view: StreamView) -> Cursor:
    for segment in reversed(view.segments):
        if segment.live:
            return Cursor(segment.sequence, max(segment.end_entry, segment.start_entry), 0)
    return view.end


def resolve(view: StreamView, offset: Offset | None) -> Resolved:
    """Where reading continues from `offset` (None: the earliest record), and what was lost."""
    if offset is None:
        return earliest(view)
    ledger_id, entry_id, slot = offset.ledger_id, offset.entry_id, offset.slot
    index = view.index_of(ledger_id)
    where = f"stream {view.name!r} offset {ledger_id}:{entry_id}"
    if index is None:
        return _moved(earliest(view), f"{where}: ledger {ledger_id} is no longer in the stream")
    segment = view.segments[index]
    if entry_id > segment.end_entry and segment.completed:
        # (An in-progress segment's end is the LAC this snapshot saw, which may lag the one an
        # earlier snapshot saw on another bookie: nothing to read yet, not a loss.)
        return _moved(earliest(view), f"{where} is past the end of its segment (it ends before entry "
                                      f"{segment.end_entry}): was the stream deleted and created again?")
    if not segment.live:
        if segment.completed and entry_id >= segment.end_entry:
            return _settle(view, index + 1, -1, 0, [])  # fully read before it was removed
        return _settle(view, index + 1, -1, 0, [f"{where}: the segment of ledger {ledger_id} "
                                                "was removed by truncation or retention"])
    if below_truncation(segment, entry_id, slot):
        return _settle(view, index, segment.start_entry, segment.start_slot,
                       [f"{where}: records before {ledger_id}:{segment.start_entry}:"
                        f"{segment.start_slot} were truncated"])
    return _settle(view, index, entry_id, slot, [])


def _moved(resolved: Resolved, loss: str) -> Resolved:
    return Resolved(resolved.cursor, (loss, *resolved.losses))


def _settle(view: StreamView, index: int, entry: int, slot: int, losses: list[str]) -> Resolved:
    """Move a position off the end of completed segments and over removed ones (entry -1 means
    'the start of this segment'), noting records skipped on the way."""
    segments = view.segments
    while index < len(segments):
        segment = segments[index]
        if entry < 0:  # entering this segment from the previous one
            if not segment.live:
                if segment.records != 0:
                    losses.append(f"stream {view.name!r}: segment {segment.sequence} (ledger "
                                  f"{segment.ledger_id}) was removed by truncation or retention before "
                                  "it was read")
                index += 1
                continue
            entry, slot = segment.start_entry, segment.start_slot
            if (entry, slot) > (segment.first_entry, 0):
                losses.append(f"stream {view.name!r}: records of ledger {segment.ledger_id} before "
                              f"{entry}:{slot} were truncated before they were read")
        if segment.completed and entry >= segment.end_entry and index + 1 < len(segments):
            index, entry, slot = index + 1, -1, 0
            continue
        break
    if index >= len(segments):
        return Resolved(view.end, tuple(losses))
    return Resolved(view.cursor_at(index, entry, slot), tuple(losses))


def offset_of(view: StreamView, cursor: Cursor) -> Offset | None:
    """The offset a cursor of the view stands for (None past every segment)."""
    index = view.index_at(cursor)
    if index >= len(view.segments):
        return None
    segment = view.segments[index]
    invariant(segment.sequence == cursor.sequence, f"cursor {cursor} is in no segment of {view.name!r}")
    return Offset(segment.ledger_id, cursor.entry_id, cursor.slot)


def after_entry(view: StreamView, cursor: Cursor) -> Cursor:
    """The start of the entry after the cursor's (into the next segment past a completed one's end)."""
    return _settle(view, view.index_at(cursor), cursor.entry_id + 1, 0, []).cursor


# ------------------------------------------------------------------------------ timestamps

EntryMaxTimestamp = Callable[[int, int], int]  # (segment index in the view, entry id) -> max timestamp, ms


def first_entry_at_or_after(view: StreamView, timestamp_ms: int, entry_max_ms: EntryMaxTimestamp) -> Cursor | None:
    """The first entry, in stream order, holding a record stamped at or after `timestamp_ms`
    (Kafka's offsetsForTimes), or None when no record is. Completed segments whose latest
    timestamp is earlier are skipped from their metadata; inside a segment a binary search over
    the entries' max timestamps reads O(log entries) entry headers. Exact when timestamps do not
    go backwards from one entry to the next (the writers' wall clock); otherwise an entry that
    holds such a record, not necessarily the first."""
    for index, segment in enumerate(view.segments):
        first, end = segment.start_entry, segment.end_entry
        if not segment.live or end <= first or not may_hold_at_or_after(segment, timestamp_ms):
            continue
        low, high = first, end
        while low < high:
            middle = (low + high) // 2
            if entry_max_ms(index, middle) >= timestamp_ms:
                high = middle
            else:
                low = middle + 1
        if low < end:
            return Cursor(segment.sequence, low, segment.start_slot if low == segment.start_entry else 0)
    return None


# ------------------------------------------------------------------------------ in-progress counts


@dataclass(frozen=True, slots=True)
class TailCount:
    """An in-progress segment as its LAC shows it."""

    last_entry: int  # the LAC
    records: int
    bytes_estimated: int  # the LAC entry's bytes per record, times the records
    last_timestamp_ms: int | None  # the LAC entry's latest record timestamp


def tail_count(first_entry: int, lac: int, header: RecordSetHeader | None, entry_bytes: int) -> TailCount:
    """The records of an in-progress segment whose LAC is `lac`, from the header of entry `lac`
    (None when the segment has no confirmed entry yet)."""
    if lac < first_entry or header is None:
        return TailCount(lac, 0, 0, None)
    records = header.next_record_index
    size_bytes = round(entry_bytes / header.record_count * records) if header.record_count else 0
    return TailCount(lac, records, size_bytes, header.max_timestamp_ms)


def records_before_slot(header: RecordSetHeader, slot: int) -> int:
    """Records of a segment before slot `slot` of the entry whose header this is."""
    return header.first_record_index + slot


# ------------------------------------------------------------------------------ stream positions (V4)


class PositionAt(enum.Enum):
    """What a stream position is, in one snapshot."""

    RECORD = "record"  # a readable record
    END = "end"  # the stream's end: the position the next record written gets
    REMOVED = "removed"  # a record removed by truncation or retention
    FUTURE = "future"  # past the end
    UNKNOWN = "unknown"  # the stream's segments have no positions yet


@dataclass(frozen=True, slots=True)
class PositionLookup:
    """Where a position falls by the segment list: segment `index` of the view and the index of the
    record within it (RECORD); the stream's next position (`end_position`, when known)."""

    at: PositionAt
    index: int = -1
    record_index: int = 0
    end_position: int | None = None


def end_position(view: StreamView, tail_records: int | None) -> int | None:
    """The position the next record written gets: past the last segment (its records, or for an
    in-progress one `tail_records`, counted at its LAC); None when the stream has no positions."""
    if not view.segments:
        return 0
    last = view.segments[-1]
    if last.first_position is None:
        return None
    if last.completed:
        return last.first_position + (last.records or 0)
    invariant(tail_records is not None, f"the in-progress segment {last.sequence} of {view.name!r} was not counted")
    assert tail_records is not None
    return last.first_position + tail_records


def lookup_position(view: StreamView, position: int, tail_records: int | None) -> PositionLookup:
    """The segment holding `position`, by binary search on first positions (segments are dense:
    each starts where the one before it ends, so the last one starting at or before `position`
    holds it; an empty one shares its first position with the next and is passed over).
    `tail_records`: the in-progress segment's records at its LAC (`tail_count`), if there is one."""
    segments = view.segments
    if any(segment.first_position is None for segment in segments):
        return PositionLookup(PositionAt.UNKNOWN)
    end = end_position(view, tail_records)
    assert end is not None
    if position >= end:
        return PositionLookup(PositionAt.END if position == end else PositionAt.FUTURE, end_position=end)
    index = bisect.bisect_right(segments, position, key=lambda segment: segment.first_position or 0) - 1
    if index < 0 or not segments[index].live:
        return PositionLookup(PositionAt.REMOVED, index, end_position=end)
    first_position = segments[index].first_position
    assert first_position is not None
    return PositionLookup(PositionAt.RECORD, index, position - first_position, end)


class RecordSearch:
    """Binary search of a segment's entries [first_entry, end_entry) for the one holding the
    segment's record number `record_index`: the last entry whose header's `first_record_index` is
    at or below it. Sans-IO: `probe` is the entry whose header it needs next (None once found),
    `answer` gives that header's `first_record_index`; `entry_id` is the entry found."""

    __slots__ = ("low", "high", "record_index", "probes")

    def __init__(self, first_entry: int, end_entry: int, record_index: int) -> None:
        invariant(first_entry < end_entry, f"no entry to search in {first_entry}..{end_entry - 1}")
        self.low, self.high, self.record_index = first_entry, end_entry - 1, record_index
        self.probes = 0

    @property
    def probe(self) -> int | None:
        return None if self.low >= self.high else (self.low + self.high + 1) // 2

    def answer(self, first_record_index: int) -> None:
        middle = self.probe
        invariant(middle is not None, "an entry header answered a search that had ended")
        assert middle is not None
        self.probes += 1
        if first_record_index <= self.record_index:
            self.low = middle
        else:
            self.high = middle - 1

    @property
    def entry_id(self) -> int:
        invariant(self.probe is None, "the search has not ended")
        return self.low


@dataclass(frozen=True, slots=True)
class Located:
    """A position resolved in one snapshot: where reading it starts (`cursor`: RECORD and END),
    its record's offset (RECORD), and the stream's next position (when known)."""

    at: PositionAt
    cursor: Cursor | None = None
    offset: Offset | None = None
    end_position: int | None = None


def located(view: StreamView, lookup: PositionLookup, entry_id: int, header: RecordSetHeader) -> Located:
    """The record found by a RecordSearch for `lookup` (its entry and that entry's header): its
    cursor, or REMOVED when it lies below the segment's truncation point."""
    segment = view.segments[lookup.index]
    slot = lookup.record_index - header.first_record_index
    invariant(0 <= slot < header.record_count,
              f"record {lookup.record_index} of segment {segment.sequence} is not in entry {entry_id} "
              f"(records {header.first_record_index}..{header.next_record_index - 1})")
    if below_truncation(segment, entry_id, slot):
        return Located(PositionAt.REMOVED, end_position=lookup.end_position)
    position = lookup.record_index + (segment.first_position or 0)
    return Located(PositionAt.RECORD, Cursor(segment.sequence, entry_id, slot),
                   Offset(segment.ledger_id, entry_id, slot, position), lookup.end_position)


def located_end(view: StreamView, lookup: PositionLookup) -> Located:
    """Where a reader of the stream's end starts: the in-progress segment's next entry, or the
    start of the segment after the last completed one."""
    last = view.segments[-1] if view.segments else None
    if last is not None and last.is_in_progress:
        cursor = Cursor(last.sequence, max(last.end_entry, last.start_entry), 0)
    else:
        cursor = view.end
    return Located(PositionAt.END, cursor, end_position=lookup.end_position)


def readable_position(segment: SegmentView, start_header: RecordSetHeader | None) -> int | None:
    """The position of a live segment's first readable record (after its truncation point), given
    the header of its readable start entry (None when that is its first entry, slot 0)."""
    if segment.first_position is None:
        return None
    if start_header is None:
        return segment.first_position
    return segment.first_position + records_before_slot(start_header, segment.start_slot)
