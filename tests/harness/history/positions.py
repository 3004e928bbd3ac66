"""The stream check of V4: every record has one stream position, dense, never reused, never changed.

    position    where the clients recorded positions (acknowledgements, reads, the final read)
                and the monitor recorded the segment lists with their first positions:
                - a record seen at two positions, or two records at one position;
                - an acknowledged or read record without a position;
                - a segment whose first position changed from one snapshot of the list to the
                  next, or that does not start where the segment before it in the list ends
                  (first position + records): positions with a gap or an overlap;
                - two records one after the other in the final read (in one segment, or in two
                  adjacent segments where nothing was removed) whose positions are not consecutive;
                - a record whose position lies outside its segment's range in the final list.

Records in a ledger deleted by hand under its live writer (fault `delete_ledger`) are left out:
they are lost, their writer failed saying so, and since their count went with the ledger, the
next writer gives their positions to the records it writes (a documented limit). Histories
that carry no position (the real-process fault workload records none) are not checked.
Each finding is reported once, at most REPORTS_MAX times per rule.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

POSITION = "position"
REPORTS_MAX = 5  # findings reported per rule; the rest are counted in one line


class _Reporter:
    def __init__(self, checker: Any) -> None:
        self.checker = checker
        self.seen: set[str] = set()
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, rule: str, message: str) -> None:
        if message in self.seen:
            return
        self.seen.add(message)
        self.counts[rule] += 1
        if self.counts[rule] <= REPORTS_MAX:
            self.checker.add(POSITION, message)

    def close(self) -> None:
        for rule, count in sorted(self.counts.items()):
            if count > REPORTS_MAX:
                self.checker.add(POSITION, f"... and {count - REPORTS_MAX} more findings of the rule {rule!r}")


def check_positions(c: Any, writes: list[Any]) -> None:
    """`c` is the parsed history (`stream._Checker`); `writes` its write operations."""
    observations = [seen for seen in _observations(c, writes)
                    if seen[3] is None or seen[3][0] not in c.deleted_under_writer]
    if not observations:
        return
    reporter = _Reporter(c)
    _check_one_position_per_record(reporter, observations)
    _check_snapshots(reporter, c.snapshots)
    final_segments = c.snapshots[-1].get("segments", []) if c.snapshots else []
    _check_final_read(reporter, c, final_segments)
    _check_within_segments(reporter, observations, final_segments)
    reporter.close()


def _observations(c: Any, writes: list[Any]) -> list[tuple[str, int | None, str, tuple[int, ...] | None]]:
    """(value, position, who saw it, offset) of every record whose position a client recorded."""
    found: list[tuple[str, int | None, str, tuple[int, ...] | None]] = [
        (op.value, op.fields["position"], f"{op.process} ack", op.offset)
        for op in writes if op.type == "ok" and "position" in op.fields]
    found += [(value, position, process, offset) for process, offset, value, position in c.read_positions]
    if c.final is not None and c.final_positions is not None:
        found += [(value, position, "final read", offset)
                  for (offset, value), position in zip(c.final, c.final_positions)]
    return found


def _check_one_position_per_record(reporter: _Reporter, observations: list[Any]) -> None:
    positions_of: dict[str, dict[int, str]] = defaultdict(dict)
    values_at: dict[int, dict[str, str]] = defaultdict(dict)
    for value, position, source, offset in observations:
        if position is None:
            reporter.add("missing", f"{source} has no position for {value!r} at {_show(offset)}")
            continue
        positions_of[value].setdefault(position, source)
        values_at[position].setdefault(value, source)
    for value, seen in positions_of.items():
        if len(seen) > 1:
            reporter.add("changed", f"record {value!r} was seen at {len(seen)} positions: "
                                    + ", ".join(f"{p} ({who})" for p, who in sorted(seen.items())[:4]))
    for position, seen in values_at.items():
        if len(seen) > 1:
            reporter.add("reused", f"position {position} holds {len(seen)} records: "
                                   + ", ".join(f"{v!r} ({who})" for v, who in sorted(seen.items())[:4]))


def _check_snapshots(reporter: _Reporter, snapshots: list[dict[str, Any]]) -> None:
    first_of: dict[int, int] = {}
    for snapshot in snapshots:
        segments = [s for s in snapshot.get("segments", []) if isinstance(s.get("sequence"), int)]
        for segment in segments:
            position = segment.get("first_position")
            if position is None:
                continue
            known = first_of.setdefault(segment["sequence"], position)
            if known != position:
                reporter.add("segment changed", f"segment {segment['sequence']} (ledger {segment.get('ledger_id')}) "
                                                f"started at position {known}, later at {position}")
        for before, after in zip(segments, segments[1:]):
            start, end = after.get("first_position"), _end(before)
            if start is not None and end is not None and start != end:
                gap = "skips" if start > end else "overlaps"
                reporter.add("not dense", f"segment {after['sequence']} starts at position {start} but segment "
                                          f"{before['sequence']} before it ends at {end} ({before.get('records')} "
                                          f"records from {before.get('first_position')}): positions {gap} "
                                          f"{abs(start - end)}")


def _check_final_read(reporter: _Reporter, c: Any, final_segments: list[dict[str, Any]]) -> None:
    """Consecutive records of the final read have consecutive positions, unless records were
    removed between them (another segment, truncated or lost, lies between theirs)."""
    if c.final is None or c.final_positions is None:
        return
    index_of = {segment.get("ledger_id"): index for index, segment in enumerate(final_segments)}
    records = list(zip(c.final, c.final_positions))
    for ((offset_a, value_a), position_a), ((offset_b, value_b), position_b) in zip(records, records[1:]):
        if position_a is None or position_b is None:
            continue
        if offset_a[0] != offset_b[0]:
            index_a, index_b = index_of.get(offset_a[0]), index_of.get(offset_b[0])
            if index_a is None or index_b is None or index_b != index_a + 1:
                continue  # segments between them were removed, or the list does not say
            entered = final_segments[index_b]
            if entered.get("min_active_entry", 0) > entered.get("first_entry", 0) or entered.get("min_active_slot", 0):
                continue  # the reader entered the next segment at its truncation point
        if position_b != position_a + 1:
            reporter.add("final gap", f"the final read has {value_a!r} at position {position_a} ({_show(offset_a)}) "
                                      f"then {value_b!r} at {position_b} ({_show(offset_b)}), with nothing removed "
                                      "between them")


def _check_within_segments(reporter: _Reporter, observations: list[Any], final_segments: list[dict[str, Any]]) -> None:
    ranges = {segment.get("ledger_id"): (segment.get("first_position"), _end(segment)) for segment in final_segments}
    for value, position, source, offset in observations:
        if position is None or offset is None:
            continue
        first, end = ranges.get(offset[0], (None, None))
        if first is not None and end is not None and not first <= position < end:
            reporter.add("outside", f"{source} has {value!r} at position {position} ({_show(offset)}), outside its "
                                    f"segment's positions {first}..{end - 1}")


def _end(segment: dict[str, Any]) -> int | None:
    """Where a completed (or truncated) segment's positions end; None when not final or unknown."""
    first, records = segment.get("first_position"), segment.get("records")
    if segment.get("state") == "in_progress" or first is None or not isinstance(records, int):
        return None
    return int(first) + records


def _show(offset: Any) -> str:
    return "?" if offset is None else ":".join(str(part) for part in offset)
