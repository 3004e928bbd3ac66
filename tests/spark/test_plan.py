"""Micro-batch planning without Spark or a cluster: backlogs follow segment order from a resolved
start (dlog.core.snapshot resolves it; tests/core/test_snapshot.py), admission takes whole entries
within the limit and never stalls, and partitions split by entries; options are checked by name,
case-insensitively."""

from __future__ import annotations

import dataclasses

import pytest

from bookkeeper.errors import ConfigError
from dlog.core import snapshot
from dlog.core.snapshot import Cursor, SegmentView, StreamView
from dlog.offsets import Offset
from dlog.segments.metadata import TierCopy
from dlog_spark import plan
from dlog_spark.options import parse_sink_options, parse_source_options
from dlog_spark.plan import Range


def segment(sequence: int, ledger: int, entries: int, *, live: bool = True, completed: bool = True,
            min_active: tuple[int, int] = (0, 0), per_entry: int = 10) -> SegmentView:
    return SegmentView(sequence, ledger, live, completed, 0, entries, min_active[0], min_active[1],
                       entries * per_entry if completed else None)


# Ledger ids deliberately out of order: stream order is segment order.
STREAM = StreamView("s", (segment(1, 40, 5), segment(2, 7, 5), segment(3, 90, 3, completed=False)))


def records_before(span: Range, entry: int) -> int:
    return entry * 10  # every entry holds 10 records


def test_a_backlog_runs_from_the_end_of_a_completed_segment_into_the_next():
    start = snapshot.resolve(STREAM, Offset(40, 5, 0)).cursor
    ranges = plan.spans(STREAM, start, snapshot.latest(STREAM))
    assert [(r.ledger_id, r.first_entry, r.last_entry) for r in ranges] == [(7, 0, 4), (90, 0, 2)]


def test_a_position_past_a_lagging_lac_has_no_backlog():
    start = snapshot.resolve(STREAM, Offset(90, 5, 0)).cursor  # the snapshot ends at entry 3
    assert plan.spans(STREAM, start, snapshot.latest(STREAM)) == []


def test_a_backlog_after_a_removed_segment_and_a_partial_truncation_starts_at_the_truncation_point():
    view = StreamView("s", (segment(1, 40, 5), segment(2, 7, 5, live=False), segment(3, 8, 5, min_active=(2, 3))))
    start = snapshot.resolve(view, Offset(40, 5, 0)).cursor
    assert plan.spans(view, start, snapshot.latest(view)) == [Range("s", 3, 8, 2, 4, 3)]


def test_admission_takes_whole_entries_within_the_limit_and_always_makes_progress():
    backlog = plan.spans(STREAM, Cursor(1, 1), snapshot.latest(STREAM))  # 4 + 5 + 3 entries of 10
    taken = plan.admit({"s": backlog}, 65, records_before)
    assert taken.records == 60 and [(r.ledger_id, r.last_entry) for r in taken.ranges["s"]] == [(40, 4), (7, 1)]
    assert plan.end_cursor(STREAM, Cursor(1, 1), taken.ranges["s"]) == Cursor(2, 2)
    tiny = plan.admit({"s": backlog}, 3, records_before)  # below one entry: still one entry
    assert tiny.records == 10 and tiny.ranges["s"] == [Range("s", 1, 40, 1, 1)]
    assert plan.admit({"s": backlog}, None, records_before).records == 120


def test_admission_shares_the_limit_among_streams_by_backlog():
    other = StreamView("t", (segment(1, 3, 2),))
    backlogs = {"s": plan.spans(STREAM, Cursor(1, 0), snapshot.latest(STREAM)),
                "t": plan.spans(other, Cursor(1, 0), snapshot.latest(other))}
    taken = plan.admit(backlogs, 70, records_before)  # backlogs 130 and 20
    assert sum(r.entries for r in taken.ranges["s"]) == 6 and taken.ranges["t"] == []


def test_partitions_split_large_ranges_by_entries():
    ranges = [Range("s", 1, 40, 0, 9, 2), Range("s", 2, 7, 0, 1)]
    pieces = plan.split(ranges, 4)
    assert sum(p.entries for p in pieces) == 12 and len(pieces) >= 4
    assert pieces[0].first_slot == 2 and all(p.first_slot == 0 for p in pieces[1:])
    assert plan.split(ranges, None) == ranges


def test_a_split_keeps_an_end_inside_the_last_entry_on_the_piece_that_ends_there():
    pieces = plan.split([Range("s", 1, 40, 0, 9, 2, end_slot=5)], 4)
    assert [p.end_slot for p in pieces] == [None] * (len(pieces) - 1) + [5]
    assert pieces[-1].last_entry == 9


TIER = TierCopy("file:///t/ns/s/segment=1/a.parquet", 100, 7, 50, 1_000)


def test_every_range_of_an_offloaded_segment_carries_its_tier_copy_to_the_worker():
    offloaded = dataclasses.replace(segment(1, 40, 5), tier=TIER)
    view = StreamView("s", (offloaded, segment(2, 7, 5)))
    ranges = plan.spans(view, Cursor(1, 0), snapshot.latest(view))
    assert [r.tier for r in ranges] == [TIER, None]
    assert all(p.tier == TIER for p in plan.split(ranges, 6) if p.ledger_id == 40)
    taken, _ = plan.cut(ranges, 25, records_before)  # cut inside the offloaded segment
    assert taken == [Range("s", 1, 40, 0, 1, tier=TIER)]
    one = plan.admit({"s": ranges}, 1, records_before).ranges["s"]
    assert one == [Range("s", 1, 40, 0, 0, tier=TIER)]


def test_the_prefer_option_is_tier_or_bookies():
    assert parse_source_options({"stream": "a"}, batch=True).prefer == "bookies"
    assert parse_source_options({"stream": "a", "PREFER": " Tier "}, batch=False).prefer == "tier"
    with pytest.raises(ConfigError, match=r"^bad prefer 'disk': use tier or bookies"):
        parse_source_options({"stream": "a", "prefer": "disk"}, batch=True)


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


def test_a_start_and_an_end_inside_entries_read_only_the_records_between():
    ranges = plan.spans(STREAM, Cursor(1, 1, 4), Cursor(2, 2, 6))
    assert ranges == [Range("s", 1, 40, 1, 4, 4), Range("s", 2, 7, 0, 2, 0, 6)]
    assert plan.spans(STREAM, Cursor(1, 1, 4), Cursor(1, 1, 4)) == []
    assert snapshot.resolve(STREAM, Offset(40, 1, 4)) == snapshot.Resolved(Cursor(1, 1, 4))


# ------------------------------------------------------------------------------ bytes per trigger


def bytes_before(span: Range, entry: int) -> int:
    return entry * 1000  # every entry is 1000 bytes


def test_admission_by_bytes_takes_whole_entries_and_combines_with_records():
    backlog = plan.spans(STREAM, Cursor(1, 0), snapshot.latest(STREAM))  # 13 entries of 10 records, 1000 bytes
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

    from dlog_spark.options import BATCH_SOURCE_OPTIONS, SINK_OPTIONS

    table = Path(__file__).resolve().parents[2].joinpath("docs", "spark.md").read_text()
    table = table[table.index("## Options"):table.index("## Read schema")]
    missing = [name for name in set(BATCH_SOURCE_OPTIONS + SINK_OPTIONS) - {"path"} if f"`{name}`" not in table]
    assert missing == []
