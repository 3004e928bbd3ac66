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

Position = tuple[int, int, int]  # (ledger id, next entry id, first slot of that entry)


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
    last_timestamp_ms: int | None = None  # the latest record timestamp, known for completed segments

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
    """Entries first..last (inclusive) of one segment's ledger; records from `first_slot` of the
    first and, when `end_slot` is set, only those before it of the last (an end inside an entry:
    batch reads up to an ending timestamp)."""

    stream: str
    sequence: int
    ledger_id: int
    first_entry: int
    last_entry: int
    first_slot: int = 0
    end_slot: int | None = None

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
    ledger_id, entry_id, slot = position
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
    if (entry_id, slot) < (segment.start_entry, segment.start_slot):
        cursor = Cursor(index, segment.start_entry, segment.start_slot)
        return _settle(view, cursor, [f"{where}: records before {ledger_id}:{segment.start_entry}:"
                                      f"{segment.start_slot} were truncated"])
    return _settle(view, Cursor(index, entry_id, slot), [])


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
    return (view.segments[cursor.index].ledger_id, cursor.entry, cursor.slot)


def after_entry(view: StreamView, cursor: Cursor) -> Cursor:
    """The start of the entry after the cursor's (into the next segment past a completed one's end)."""
    return _settle(view, Cursor(cursor.index, cursor.entry + 1, 0), []).cursor


# ------------------------------------------------------------------------------ timestamps

EntryMaxTimestamp = Callable[[int, int], int]  # (segment index, entry id) -> the entry's max timestamp, ms


def first_entry_at_or_after(view: StreamView, timestamp_ms: int, entry_max_ms: EntryMaxTimestamp) -> Cursor | None:
    """The first entry, in stream order, holding a record stamped at or after `timestamp_ms`
    (Kafka's offsetsForTimes), or None when no record is. Completed segments whose latest
    timestamp is earlier are skipped from their metadata; inside a segment a binary search over
    the entries' max timestamps reads O(log entries) entry headers. Exact when timestamps do not
    go backwards from one entry to the next (the writers' wall clock); otherwise an entry that
    holds such a record, not necessarily the first."""
    for index, segment in enumerate(view.segments):
        first, end = segment.start_entry, segment.end_entry
        if not segment.live or end <= first:
            continue
        known_last_ms = segment.last_timestamp_ms if segment.completed else None
        if known_last_ms is not None and known_last_ms < timestamp_ms:
            continue  # the segment's metadata says every record is earlier
        low, high = first, end
        while low < high:
            middle = (low + high) // 2
            if entry_max_ms(index, middle) >= timestamp_ms:
                high = middle
            else:
                low = middle + 1
        if low < end:
            return Cursor(index, low, segment.start_slot if low == segment.start_entry else 0)
    return None


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
        end_slot = None
        if index == end.index and end.slot > 0 and end.entry < segment.end_entry:
            stop, end_slot = end.entry + 1, end.slot  # the end is inside entry end.entry
        first = max(first, 0)
        if stop > first and not (end_slot is not None and stop - 1 == first and end_slot <= slot):
            ranges.append(Range(view.name, segment.sequence, segment.ledger_id, first, stop - 1, slot, end_slot))
    return ranges


Measure = Callable[[Range, int], int]
RecordsBefore = Measure  # records of the range's segment before an entry (from entry headers)
BytesBefore = Measure  # bytes of the range's ledger before an entry (the entries' cumulative length)
Budget = tuple[int, Measure]  # at most this much of what the measure counts


def _within(span: Range, entry_id: int, budgets: Sequence[Budget], used: Sequence[int]) -> bool:
    return all(measure(span, entry_id) - measure(span, span.first_entry) <= limit - spent
               for (limit, measure), spent in zip(budgets, used))


def cut(ranges: Sequence[Range], budget: int | Sequence[Budget],
        records_before: RecordsBefore | None = None) -> tuple[list[Range], int]:
    """The longest prefix of `ranges`, in whole entries, within every budget, and the amount of
    the first budget's measure it holds. A budget is (limit, measure); `measure(range, entry)`
    counts something of the range's segment before `entry` (monotone: the caller reads entry
    headers for it). `cut(ranges, 65, records_before)` is the one-budget form."""
    if isinstance(budget, int):
        invariant(records_before is not None, "a one-budget cut needs records_before")
        budgets: list[Budget] = [(budget, records_before)]  # type: ignore[list-item]
    else:
        budgets = list(budget)
    taken: list[Range] = []
    used = [0] * len(budgets)
    for span in ranges:
        whole = [measure(span, span.last_entry + 1) - measure(span, span.first_entry) for _, measure in budgets]
        if all(spent + amount <= limit for (limit, _), spent, amount in zip(budgets, used, whole)):
            taken.append(span)
            used = [spent + amount for spent, amount in zip(used, whole)]
            continue
        low, high = span.first_entry, span.last_entry + 1  # largest end within every budget
        while high - low > 1:
            middle = (low + high) // 2
            if _within(span, middle, budgets, used):
                low = middle
            else:
                high = middle
        if low > span.first_entry:
            taken.append(Range(span.stream, span.sequence, span.ledger_id, span.first_entry, low - 1,
                               span.first_slot))
            used = [spent + measure(span, low) - measure(span, span.first_entry)
                    for spent, (_, measure) in zip(used, budgets)]
        break
    return taken, used[0] if used else 0


def count(ranges: Sequence[Range], measure: Measure) -> int:
    return sum(measure(span, span.last_entry + 1) - measure(span, span.first_entry) for span in ranges)


@dataclass(frozen=True, slots=True)
class Admission:
    """How much of each stream's backlog one micro-batch takes."""

    ranges: dict[str, list[Range]] = field(default_factory=dict)
    records: int = 0


def admit(backlogs: Mapping[str, list[Range]], max_records: int | None, records_before: RecordsBefore,
          max_bytes: int | None = None, bytes_before: BytesBefore | None = None) -> Admission:
    """Share `max_records` and `max_bytes` (either may be None) among streams in proportion to
    their backlogs, whole entries each; at least one entry is always taken when anything is
    waiting, so a batch never stalls on an entry larger than a limit."""
    limits: list[tuple[int, Measure]] = []
    if max_records is not None:
        limits.append((max_records, records_before))
    if max_bytes is not None:
        invariant(bytes_before is not None, "max_bytes needs bytes_before")
        limits.append((max_bytes, bytes_before))  # type: ignore[arg-type]
    record_sizes = {name: count(ranges, records_before) for name, ranges in backlogs.items()}
    if not limits:
        return Admission({name: list(ranges) for name, ranges in backlogs.items()}, sum(record_sizes.values()))
    sizes = [{name: count(ranges, measure) for name, ranges in backlogs.items()} for _, measure in limits]
    totals = [sum(size.values()) for size in sizes]
    if all(total <= limit for total, (limit, _) in zip(totals, limits)):
        return Admission({name: list(ranges) for name, ranges in backlogs.items()}, sum(record_sizes.values()))
    taken: dict[str, list[Range]] = {}
    admitted = 0
    for name in sorted(backlogs):
        shares = [(limit * size[name] // total if total else 0, measure)
                  for (limit, measure), size, total in zip(limits, sizes, totals)]
        ranges, _ = cut(backlogs[name], shares)
        taken[name] = ranges
        admitted += count(ranges, records_before)
    if not any(taken.values()) and any(backlogs.values()):
        name = max((n for n in backlogs if backlogs[n]), key=lambda item: (record_sizes[item], item))
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
