"""Micro-batch planning without Spark or a cluster: offsets resolve through segment order, data
loss is told apart from reading past a removed but fully read segment (L5), admission takes
whole entries within the limit and never stalls, and partitions split by entries; options are
checked by name, case-insensitively."""

from __future__ import annotations

import pytest

from bookkeeper.errors import ConfigError
from spark import plan
from spark.options import parse_sink_options, parse_source_options
from spark.plan import Cursor, Range, SegmentView, StreamView


def segment(sequence: int, ledger: int, entries: int, *, live: bool = True, completed: bool = True,
            min_active: tuple[int, int] = (0, 0), per_entry: int = 10) -> SegmentView:
    return SegmentView(sequence, ledger, live, completed, 0, entries, min_active[0], min_active[1],
                       entries * per_entry if completed else None)


# Ledger ids deliberately out of order: stream order is segment order.
STREAM = StreamView("s", (segment(1, 40, 5), segment(2, 7, 5), segment(3, 90, 3, completed=False)))


def records_before(span: Range, entry: int) -> int:
    return entry * 10  # every entry holds 10 records


def test_earliest_and_latest_follow_segment_order_not_ledger_ids():
    assert plan.earliest(STREAM).cursor == Cursor(0, 0)
    assert plan.latest(STREAM) == Cursor(2, 3)
    assert plan.position_of(STREAM, plan.latest(STREAM)) == (90, 3, 0)


def test_the_end_of_a_completed_segment_continues_in_the_next_without_loss():
    resolved = plan.resolve(STREAM, (40, 5, 0))
    assert resolved == plan.Resolved(Cursor(1, 0))
    ranges = plan.spans(STREAM, resolved.cursor, plan.latest(STREAM))
    assert [(r.ledger_id, r.first_entry, r.last_entry) for r in ranges] == [(7, 0, 4), (90, 0, 2)]


def test_a_position_past_a_lagging_lac_waits_instead_of_reporting_loss():
    resolved = plan.resolve(STREAM, (90, 5, 0))  # the in-progress segment's snapshot ends at entry 3
    assert resolved == plan.Resolved(Cursor(2, 5)) and plan.spans(STREAM, resolved.cursor, plan.latest(STREAM)) == []


def test_a_removed_segment_that_was_fully_read_is_not_data_loss():
    view = StreamView("s", (segment(1, 40, 5, live=False), segment(2, 7, 5)))
    assert plan.resolve(view, (40, 5, 0)) == plan.Resolved(Cursor(1, 0))


@pytest.mark.parametrize("position, lost", [
    ((40, 2, 0), "segment of ledger 40 was removed"),  # inside a removed segment
    ((99, 0, 0), "ledger 99 is no longer in the stream"),  # unknown ledger
    ((40, 9, 0), "past the end"),  # beyond a segment's end
])
def test_positions_in_removed_data_report_the_loss_and_move_to_the_earliest(position, lost):
    view = StreamView("s", (segment(1, 40, 5, live=False), segment(2, 7, 5)))
    resolved = plan.resolve(view, position)
    assert resolved.cursor == Cursor(1, 0) and lost in resolved.losses[0]


def test_skipping_over_a_removed_unread_segment_and_a_partial_truncation_is_loss():
    view = StreamView("s", (segment(1, 40, 5), segment(2, 7, 5, live=False), segment(3, 8, 5, min_active=(2, 3))))
    resolved = plan.resolve(view, (40, 5, 0))
    assert resolved.cursor == Cursor(2, 2, 3)
    assert len(resolved.losses) == 2 and "segment 2 (ledger 7)" in resolved.losses[0]
    ranges = plan.spans(view, resolved.cursor, plan.latest(view))
    assert ranges == [Range("s", 3, 8, 2, 4, 3)]


def test_admission_takes_whole_entries_within_the_limit_and_always_makes_progress():
    backlog = plan.spans(STREAM, Cursor(0, 1), plan.latest(STREAM))  # 4 + 5 + 3 entries of 10
    taken = plan.admit({"s": backlog}, 65, records_before)
    assert taken.records == 60 and [(r.ledger_id, r.last_entry) for r in taken.ranges["s"]] == [(40, 4), (7, 1)]
    assert plan.end_cursor(STREAM, Cursor(0, 1), taken.ranges["s"]) == Cursor(1, 2)
    tiny = plan.admit({"s": backlog}, 3, records_before)  # below one entry: still one entry
    assert tiny.records == 10 and tiny.ranges["s"] == [Range("s", 1, 40, 1, 1)]
    assert plan.admit({"s": backlog}, None, records_before).records == 120


def test_admission_shares_the_limit_among_streams_by_backlog():
    other = StreamView("t", (segment(1, 3, 2),))
    backlogs = {"s": plan.spans(STREAM, Cursor(0, 0), plan.latest(STREAM)),
                "t": plan.spans(other, Cursor(0, 0), plan.latest(other))}
    taken = plan.admit(backlogs, 70, records_before)  # backlogs 130 and 20
    assert sum(r.entries for r in taken.ranges["s"]) == 6 and taken.ranges["t"] == []


def test_partitions_split_large_ranges_by_entries():
    ranges = [Range("s", 1, 40, 0, 9, 2), Range("s", 2, 7, 0, 1)]
    pieces = plan.split(ranges, 4)
    assert sum(p.entries for p in pieces) == 12 and len(pieces) >= 4
    assert pieces[0].first_slot == 2 and all(p.first_slot == 0 for p in pieces[1:])
    assert plan.split(ranges, None) == ranges


def test_options_are_case_insensitive_and_unknown_ones_are_named():
    options = parse_source_options({"STREAM": "a", "maxrecordspertrigger": "5", "FailOnDataLoss": "false"},
                                   batch=False)
    assert options.streams == ("a",) and options.max_records_per_trigger == 5 and not options.fail_on_data_loss
    with pytest.raises(ConfigError, match=r"unknown option 'endingoffsets' for a streaming read"):
        parse_source_options({"stream": "a", "endingoffsets": "latest"}, batch=False)
    with pytest.raises(ConfigError, match="exactly one of the options stream, streams or streamPattern"):
        parse_source_options({"stream": "a", "streampattern": "a.*"}, batch=False)
    with pytest.raises(ConfigError, match="bad maxTriggerDelay"):
        parse_source_options({"stream": "a", "maxtriggerdelay": "soon"}, batch=False)


def test_the_sink_id_defaults_to_a_digest_of_the_checkpoint_location():
    first = parse_sink_options({"stream": "a", "checkpointlocation": "/tmp/q1"}, streaming=True)
    again = parse_sink_options({"stream": "a", "checkpointlocation": "/tmp/q1/"}, streaming=True)
    other = parse_sink_options({"stream": "a", "checkpointlocation": "/tmp/q2"}, streaming=True)
    assert first.sink_id == again.sink_id != other.sink_id
    assert parse_sink_options({"path": "a", "sinkid": "job-1"}, streaming=True).sink_id == "job-1"
    with pytest.raises(ConfigError, match="needs option 'sinkId' or option 'checkpointLocation'"):
        parse_sink_options({"stream": "a"}, streaming=True)


# ------------------------------------------------------------------------------ timestamps

# Three segments of 5 entries; entry e of segment i holds records stamped 1000*i + 100*e .. +90.
TIMED = StreamView("t", tuple(SegmentView(i + 1, 10 + i, True, i < 2, 0, 5, records=50 if i < 2 else None,
                                          last_timestamp_ms=1000 * i + 490 if i < 2 else None)
                              for i in range(3)))


def timed_max_ms(reads: list[tuple[int, int]]):
    def entry_max_ms(index: int, entry: int) -> int:
        reads.append((index, entry))
        return 1000 * index + 100 * entry + 90
    return entry_max_ms


@pytest.mark.parametrize("timestamp_ms, cursor", [
    (1195, Cursor(1, 2)),  # between entries 1 (..1190) and 2 (1200..) of the second segment
    (1150, Cursor(1, 1)),  # inside entry 1: that entry (the caller finds the slot)
    (0, Cursor(0, 0)),  # before the earliest record: the first entry
    (2490, Cursor(2, 4)),  # the last record of the in-progress segment
    (2491, None),  # after the latest record
])
def test_a_timestamp_resolves_to_the_first_entry_holding_a_record_at_or_after_it(timestamp_ms, cursor):
    reads: list[tuple[int, int]] = []
    assert plan.first_entry_at_or_after(TIMED, timestamp_ms, timed_max_ms(reads)) == cursor
    assert len(reads) <= 2 * 3  # segment metadata skips the early segments; log2(5) headers in one
    assert all(index >= (cursor.index if cursor else 2) for index, _ in reads)


def test_a_timestamp_search_starts_at_the_truncation_point():
    view = StreamView("t", (segment(1, 40, 5, min_active=(2, 3)),))
    found = plan.first_entry_at_or_after(view, 0, lambda index, entry: 100 * entry)
    assert found == Cursor(0, 2, 3)


def test_a_start_and_an_end_inside_entries_read_only_the_records_between():
    ranges = plan.spans(STREAM, Cursor(0, 1, 4), Cursor(1, 2, 6))
    assert ranges == [Range("s", 1, 40, 1, 4, 4), Range("s", 2, 7, 0, 2, 0, 6)]
    assert plan.spans(STREAM, Cursor(0, 1, 4), Cursor(0, 1, 4)) == []
    assert plan.resolve(STREAM, (40, 1, 4)) == plan.Resolved(Cursor(0, 1, 4))


# ------------------------------------------------------------------------------ bytes per trigger


def bytes_before(span: Range, entry: int) -> int:
    return entry * 1000  # every entry is 1000 bytes


def test_admission_by_bytes_takes_whole_entries_and_combines_with_records():
    backlog = plan.spans(STREAM, Cursor(0, 0), plan.latest(STREAM))  # 13 entries of 10 records, 1000 bytes
    by_bytes = plan.admit({"s": backlog}, None, records_before, 3500, bytes_before)
    assert by_bytes.records == 30 and [(r.ledger_id, r.last_entry) for r in by_bytes.ranges["s"]] == [(40, 2)]
    both = plan.admit({"s": backlog}, 25, records_before, 3500, bytes_before)  # records bind first
    assert both.records == 20
    looser = plan.admit({"s": backlog}, 1000, records_before, 6500, bytes_before)  # bytes bind first
    assert looser.records == 60 and [(r.ledger_id, r.last_entry) for r in looser.ranges["s"]] == [(40, 4), (7, 0)]
    tiny = plan.admit({"s": backlog}, None, records_before, 10, bytes_before)  # below one entry
    assert tiny.records == 10


def test_timestamp_and_byte_options_are_checked():
    options = parse_source_options({"streams": "a,b", "startingoffsetsbytimestamp": '{"a": 5}',
                                    "endingTimestamp": "9", "maxBytesPerTrigger": "4096",
                                    "startingOffsetsByTimestampStrategy": "LATEST"}, batch=True)
    assert options.starting_timestamp_of("a") == 5 and options.starting_timestamp_of("b") is None
    assert options.ending_timestamp_of("b") == 9 and options.max_bytes_per_trigger == 4096
    assert options.timestamp_strategy == "latest"
    both = parse_source_options({"stream": "a", "startingTimestamp": "7", "startingOffsetsByTimestamp": '{"a": 5}'},
                                batch=False)
    assert both.starting_timestamp_of("a") == 7  # Kafka's precedence: startingTimestamp wins
    with pytest.raises(ConfigError, match="bad startingTimestamp '2024-01-01'.*milliseconds since the epoch"):
        parse_source_options({"stream": "a", "startingTimestamp": "2024-01-01"}, batch=False)
    with pytest.raises(ConfigError, match="names stream 'c', which this query does not read"):
        parse_source_options({"stream": "a", "startingOffsetsByTimestamp": '{"c": 5}'}, batch=False)
    with pytest.raises(ConfigError, match="bad startingOffsetsByTimestampStrategy 'first'"):
        parse_source_options({"stream": "a", "startingOffsetsByTimestampStrategy": "first"}, batch=False)
    with pytest.raises(ConfigError, match="unknown option 'endingtimestamp' for a streaming read"):
        parse_source_options({"stream": "a", "endingtimestamp": "5"}, batch=False)


def test_docs_spark_md_lists_every_option():
    from pathlib import Path

    from spark.options import BATCH_SOURCE_OPTIONS, SINK_OPTIONS

    table = Path(__file__).resolve().parents[2].joinpath("docs", "spark.md").read_text()
    table = table[table.index("## Options"):table.index("## Read schema")]
    missing = [name for name in set(BATCH_SOURCE_OPTIONS + SINK_OPTIONS) - {"path"} if f"`{name}`" not in table]
    assert missing == []
