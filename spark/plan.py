"""Planning micro-batches over segment lists: positions, data loss, admission, partitions.

Pure functions over a snapshot of each stream (`StreamView`); the driver gathers the snapshot
(segment lists, LACs, entry headers) and this module decides. No I/O, no clock.

A Spark offset for a stream is (ledger, entry): the next entry to read. Stream order is segment
order, never ledger-id order (the sink appends ledgers in commit order), so positions are
resolved through the segment list into a `Cursor` (segment index, entry, first slot).

Data loss (L5/L6): resolving a position can find the records it points at, or records between it
and the next live ones, removed by truncation or retention. `Resolved.losses` says what went
missing; the caller either fails the query or skips forward (option failOnDataLoss). Reading
past the end of a completed segment into the next one is not a loss; skipping a truncated segment
that still had records is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bookkeeper.errors import DlogError, invariant

Position = tuple[int, int]  # (ledger id, next entry id)


class DataLossError(DlogError):
    """Records the query had not read yet were removed (truncation or retention)."""

    code = 350


@dataclass(frozen=True, slots=True)
class SegmentView:
    sequence: int
    ledger_id: int
    live: bool  # False once truncated
    completed: bool
    first_entry: int
    end_entry: int  # one past the last readable entry: last entry + 1, or LAC + 1 in progress
    min_active_entry: int = 0
    min_active_slot: int = 0
    records: int | None = None  # known for completed segments

    @property
    def start_entry(self) -> int:
        return max(self.first_entry, self.min_active_entry)

    @property
    def start_slot(self) -> int:
        return self.min_active_slot if self.min_active_entry >= self.first_entry else 0


@dataclass(frozen=True, slots=True)
class StreamView:
    name: str
    segments: tuple[SegmentView, ...]

    def index_of(self, ledger_id: int) -> int | None:
        return next((i for i, s in enumerate(self.segments) if s.ledger_id == ledger_id), None)


@dataclass(frozen=True, slots=True, order=True)
class Cursor:
    """Next record: entry `entry`, from slot `slot`, of segment `index` (len(segments) = past all)."""

    index: int
    entry: int
    slot: int = 0


@dataclass(frozen=True, slots=True)
class Resolved:
    cursor: Cursor
    losses: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Range:
    """Entries first..last (inclusive) of one segment's ledger; records from `first_slot` of the first."""

    stream: str
    sequence: int
    ledger_id: int
    first_entry: int
    last_entry: int
    first_slot: int = 0

    @property
    def entries(self) -> int:
        return self.last_entry - self.first_entry + 1


# ------------------------------------------------------------------------------ positions


def earliest(view: StreamView) -> Resolved:
    for index, segment in enumerate(view.segments):
        if segment.live:
            return _settle(view, Cursor(index, segment.start_entry, segment.start_slot), [])
    return Resolved(Cursor(len(view.segments), 0))


def latest(view: StreamView) -> Cursor:
    for index in range(len(view.segments) - 1, -1, -1):
        segment = view.segments[index]
        if segment.live:
            return Cursor(index, max(segment.end_entry, segment.start_entry), 0)
    return Cursor(len(view.segments), 0)


def resolve(view: StreamView, position: Position | None) -> Resolved:
    """Where reading continues from `position` (None: the earliest record), and what was lost."""
    if position is None:
        return earliest(view)
    ledger_id, entry_id = position
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
            return _settle(view, Cursor(index + 1, -1), [])  # fully read before it was removed
        return _settle(view, Cursor(index + 1, -1), [f"{where}: the segment of ledger {ledger_id} "
                                                     "was removed by truncation or retention"])
    if (entry_id, 0) < (segment.start_entry, segment.start_slot):
        cursor = Cursor(index, segment.start_entry, segment.start_slot)
        return _settle(view, cursor, [f"{where}: records before {ledger_id}:{segment.start_entry}:"
                                      f"{segment.start_slot} were truncated"])
    return _settle(view, Cursor(index, entry_id, 0), [])


def _moved(resolved: Resolved, loss: str) -> Resolved:
    return Resolved(resolved.cursor, (loss, *resolved.losses))


def _settle(view: StreamView, cursor: Cursor, losses: list[str]) -> Resolved:
    """Move a cursor off the end of completed segments and over removed ones (entry -1 means
    'the start of this segment'), noting records skipped on the way."""
    index, entry, slot = cursor.index, cursor.entry, cursor.slot
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
        return Resolved(Cursor(len(segments), 0), tuple(losses))
    return Resolved(Cursor(index, entry, slot), tuple(losses))


def position_of(view: StreamView, cursor: Cursor) -> Position | None:
    if cursor.index >= len(view.segments):
        return None
    return (view.segments[cursor.index].ledger_id, cursor.entry)


# ------------------------------------------------------------------------------ spans and admission


def spans(view: StreamView, start: Cursor, end: Cursor) -> list[Range]:
    """The readable entry ranges from `start` up to (not including) `end`, in stream order."""
    ranges = []
    for index in range(start.index, min(end.index, len(view.segments) - 1) + 1):
        segment = view.segments[index]
        if not segment.live:
            continue
        first = start.entry if index == start.index else segment.start_entry
        slot = start.slot if index == start.index else segment.start_slot
        stop = end.entry if index == end.index else segment.end_entry
        first = max(first, 0)
        if stop > first:
            ranges.append(Range(view.name, segment.sequence, segment.ledger_id, first, stop - 1, slot))
    return ranges


RecordsBefore = Callable[[Range, int], int]


def cut(ranges: Sequence[Range], budget: int, records_before: RecordsBefore) -> tuple[list[Range], int]:
    """The longest prefix of `ranges`, in whole entries, holding at most `budget` records, and
    its record count. `records_before(range, entry)` is the count of the range's segment's
    records before `entry` (a monotone function; the caller reads entry headers for it)."""
    taken: list[Range] = []
    total = 0
    for span in ranges:
        start_records = records_before(span, span.first_entry)
        whole = records_before(span, span.last_entry + 1) - start_records
        if total + whole <= budget:
            taken.append(span)
            total += whole
            continue
        low, high = span.first_entry, span.last_entry + 1  # largest end with count <= room
        room = budget - total
        while high - low > 1:
            middle = (low + high) // 2
            if records_before(span, middle) - start_records <= room:
                low = middle
            else:
                high = middle
        if low > span.first_entry:
            taken.append(Range(span.stream, span.sequence, span.ledger_id, span.first_entry, low - 1,
                               span.first_slot))
            total += records_before(span, low) - start_records
        break
    return taken, total


def count(ranges: Sequence[Range], records_before: RecordsBefore) -> int:
    return sum(records_before(span, span.last_entry + 1) - records_before(span, span.first_entry)
               for span in ranges)


@dataclass(frozen=True, slots=True)
class Admission:
    """How much of each stream's backlog one micro-batch takes."""

    ranges: dict[str, list[Range]] = field(default_factory=dict)
    records: int = 0


def admit(backlogs: Mapping[str, list[Range]], max_records: int | None,
          records_before: RecordsBefore) -> Admission:
    """Share `max_records` among streams in proportion to their backlogs (whole entries each);
    at least one entry is always taken when anything is waiting, so a batch never stalls on an
    entry larger than the limit."""
    if max_records is None:
        return Admission({name: list(ranges) for name, ranges in backlogs.items()},
                         sum(count(r, records_before) for r in backlogs.values()))
    sizes = {name: count(ranges, records_before) for name, ranges in backlogs.items()}
    total = sum(sizes.values())
    if total <= max_records:
        return Admission({name: list(ranges) for name, ranges in backlogs.items()}, total)
    taken: dict[str, list[Range]] = {}
    admitted = 0
    for name in sorted(backlogs):
        share = max_records * sizes[name] // total if total else 0
        ranges, records = cut(backlogs[name], share, records_before)
        taken[name] = ranges
        admitted += records
    if admitted == 0 and total > 0:
        name = max(sizes, key=lambda item: (sizes[item], item))
        first = backlogs[name][0]
        one = Range(first.stream, first.sequence, first.ledger_id, first.first_entry, first.first_entry,
                    first.first_slot)
        taken[name] = [one]
        admitted = count([one], records_before)
    return Admission(taken, admitted)


def end_cursor(view: StreamView, start: Cursor, ranges: Sequence[Range]) -> Cursor:
    """The cursor just past the last of `ranges` (or `start` when there are none)."""
    if not ranges:
        return start
    last = ranges[-1]
    index = view.index_of(last.ledger_id)
    invariant(index is not None, f"range of ledger {last.ledger_id} is not in stream {view.name!r}")
    return Cursor(index, last.last_entry + 1, 0)


# ------------------------------------------------------------------------------ partitions


def split(ranges: Sequence[Range], min_partitions: int | None) -> list[Range]:
    """Ranges cut into at least `min_partitions` pieces (by entries, largest ranges cut most)."""
    ranges = list(ranges)
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(span.entries for span in ranges)
    result = []
    for span in ranges:
        pieces = max(1, min(span.entries, round(min_partitions * span.entries / total)))
        step, extra = divmod(span.entries, pieces)
        first = span.first_entry
        for piece in range(pieces):
            size = step + (1 if piece < extra else 0)
            slot = span.first_slot if first == span.first_entry else 0
            result.append(Range(span.stream, span.sequence, span.ledger_id, first, first + size - 1, slot))
            first += size
    return result
