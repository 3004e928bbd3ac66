"""Planning micro-batches: data loss, admission control, partitions.

Pure functions over a snapshot of each stream (`dlog.core.snapshot.StreamView`, which also holds
the rules for where reading starts, where it ends and what data loss is); the driver gathers the
snapshot (`dlog_spark.catalog`) and this module decides how much of each backlog one micro-batch takes
and how it is cut into partitions. No I/O, no clock.

A Spark offset for a stream is an `Offset`: the next entry to read (`dlog_spark.offsets` holds its
JSON). Stream order is segment order, never ledger-id order (the sink appends ledgers in commit
order), so offsets are resolved through the segment list into a `Cursor` (segment sequence,
entry, first slot) before anything is measured.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from bookkeeper.errors import DlogError, invariant
from dlog.core.snapshot import Cursor, StreamView
from dlog.segments.metadata import TierCopy


class DataLossError(DlogError):
    """Records the query had not read yet were removed (truncation or retention)."""

    code = 350


@dataclass(frozen=True, slots=True)
class Range:
    """Entries first..last (inclusive) of one segment's ledger; records from `first_slot` of the
    first and, when `end_slot` is set, only those before it of the last (an end inside an entry:
    batch reads up to an ending timestamp). `tier` is the segment's copy on the tier as the plan
    saw it: the worker that reads the range has never seen the segment list, and reads the file
    by it (when the bookie copy is gone, or the query prefers the tier)."""

    stream: str
    sequence: int
    ledger_id: int
    first_entry: int
    last_entry: int
    first_slot: int = 0
    end_slot: int | None = None
    tier: TierCopy | None = None
    schema_version: int = 0  # its segment's (a typed stream's records are projected from it)

    @property
    def entries(self) -> int:
        return self.last_entry - self.first_entry + 1


# ------------------------------------------------------------------------------ spans and admission


def spans(view: StreamView, start: Cursor, end: Cursor) -> list[Range]:
    """The readable entry ranges from `start` up to (not including) `end`, in stream order."""
    ranges = []
    for segment in view.segments:
        if not segment.live or not start.sequence <= segment.sequence <= end.sequence:
            continue
        at_start, at_end = segment.sequence == start.sequence, segment.sequence == end.sequence
        first = start.entry_id if at_start else segment.start_entry
        slot = start.slot if at_start else segment.start_slot
        stop = end.entry_id if at_end else segment.end_entry
        end_slot = None
        if at_end and end.slot > 0 and end.entry_id < segment.end_entry:
            stop, end_slot = end.entry_id + 1, end.slot  # the end is inside entry end.entry_id
        first = max(first, 0)
        if stop > first and not (end_slot is not None and stop - 1 == first and end_slot <= slot):
            ranges.append(Range(view.name, segment.sequence, segment.ledger_id, first, stop - 1, slot, end_slot,
                                segment.tier, segment.schema_version))
    return ranges


Measure = Callable[[Range, int], int]
RecordsBefore = Measure  # records of the range's segment before an entry (from entry headers)
BytesBefore = Measure  # bytes of the range's ledger before an entry (the entries' cumulative length)
Budget = tuple[int, Measure]  # at most this much of what the measure counts


def _within(span: Range, entry_id: int, budgets: Sequence[Budget], used: Sequence[int]) -> bool:
    return all(measure(span, entry_id) - measure(span, span.first_entry) <= limit - spent
               for (limit, measure), spent in zip(budgets, used, strict=True))


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
        if all(spent + amount <= limit for (limit, _), spent, amount in zip(budgets, used, whole, strict=True)):
            taken.append(span)
            used = [spent + amount for spent, amount in zip(used, whole, strict=True)]
            continue
        low, high = span.first_entry, span.last_entry + 1  # largest end within every budget
        while high - low > 1:
            middle = (low + high) // 2
            if _within(span, middle, budgets, used):
                low = middle
            else:
                high = middle
        if low > span.first_entry:
            taken.append(replace(span, last_entry=low - 1, end_slot=None))
            used = [spent + measure(span, low) - measure(span, span.first_entry)
                    for spent, (_, measure) in zip(used, budgets, strict=True)]
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
    if all(total <= limit for total, (limit, _) in zip(totals, limits, strict=True)):
        return Admission({name: list(ranges) for name, ranges in backlogs.items()}, sum(record_sizes.values()))
    taken: dict[str, list[Range]] = {}
    admitted = 0
    for name in sorted(backlogs):
        shares = [(limit * size[name] // total if total else 0, measure)
                  for (limit, measure), size, total in zip(limits, sizes, totals, strict=True)]
        ranges, _ = cut(backlogs[name], shares)
        taken[name] = ranges
        admitted += count(ranges, records_before)
    if not any(taken.values()) and any(backlogs.values()):
        name = max((n for n in backlogs if backlogs[n]), key=lambda item: (record_sizes[item], item))
        first = backlogs[name][0]
        one = replace(first, last_entry=first.first_entry,
                      end_slot=first.end_slot if first.last_entry == first.first_entry else None)
        taken[name] = [one]
        admitted = count([one], records_before)
    return Admission(taken, admitted)


def end_cursor(view: StreamView, start: Cursor, ranges: Sequence[Range]) -> Cursor:
    """The cursor just past the last of `ranges` (or `start` when there are none)."""
    if not ranges:
        return start
    last = ranges[-1]
    invariant(view.index_of(last.ledger_id) is not None,
              f"range of ledger {last.ledger_id} is not in stream {view.name!r}")
    return Cursor(last.sequence, last.last_entry + 1, 0)


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
            last = first + size - 1  # an end inside the last entry stays with the piece that ends there
            result.append(replace(span, first_entry=first, last_entry=last, first_slot=slot,
                                  end_slot=span.end_slot if last == span.last_entry else None))
            first += size
    return result
