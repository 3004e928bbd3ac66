"""Kafka's timestamp options and maxBytesPerTrigger on real Spark and real bookies: a start or an
end at a timestamp is the first record stamped at or after it (between two entries, inside an
entry, before the earliest record, after the latest under each strategy), per stream or for all;
a byte budget per trigger takes whole entries and combines with a record budget."""

from __future__ import annotations

import json

import pytest

from dlog.segments.codec import records_to_batch
from tests.spark.conftest import Dlog, input_rows, run_available_now, values

pytestmark = pytest.mark.spark
BASE_MS = 1_700_000_000_000


def write_timed(space: Dlog, stream: str, entries: int = 5, per_entry: int = 100) -> list[bytes]:
    """Entry e holds records stamped BASE + 1000 e + slot: a gap of 900 ms between entries."""
    space.ns.create_stream(stream, roll_records=300)  # entries 0-2 in one segment, the rest in the next
    written = values(entries * per_entry)
    with space.ns.open_writer(stream) as writer:
        for entry in range(entries):
            stamps = [BASE_MS + 1000 * entry + slot for slot in range(per_entry)]
            writer.write_batch(records_to_batch(written[entry * per_entry:(entry + 1) * per_entry],
                                                timestamps_ms=stamps))
    return written


def batch_values(spark, space: Dlog, **options: str) -> list[bytes]:
    frame = spark.read.format("dlog").options(**space.options).options(**options).load()
    return sorted(row.value for row in frame.select("value").collect())


@pytest.fixture
def timed(dlog_ns) -> tuple[Dlog, list[bytes]]:
    return dlog_ns, write_timed(dlog_ns, "timed")


def test_a_starting_timestamp_between_two_entries_inside_one_and_before_the_earliest(spark, timed):
    space, written = timed
    between = batch_values(spark, space, stream="timed", startingTimestamp=str(BASE_MS + 1500))
    assert between == written[200:]  # entry 1 ends at +1099, entry 2 starts at +2000
    inside = batch_values(spark, space, stream="timed", startingTimestamp=str(BASE_MS + 3050))
    assert inside == written[350:]  # from slot 50 of entry 3 (in the second segment)
    assert batch_values(spark, space, stream="timed", startingTimestamp="0") == written


def test_a_starting_timestamp_after_the_latest_record_fails_or_starts_at_the_latest(spark, timed):
    space, _ = timed
    late = str(BASE_MS + 10_000)
    with pytest.raises(Exception, match=r"stream 'timed' has no record at or after timestamp .*"
                                        r"startingOffsetsByTimestampStrategy=latest"):
        batch_values(spark, space, stream="timed", startingTimestamp=late)
    assert batch_values(spark, space, stream="timed", startingTimestamp=late,
                        startingOffsetsByTimestampStrategy="latest") == []


def test_ending_timestamps_end_before_the_first_record_at_or_after_them(spark, timed):
    space, written = timed
    assert batch_values(spark, space, stream="timed", endingTimestamp=str(BASE_MS + 3050)) == written[:350]
    window = batch_values(spark, space, stream="timed", startingTimestamp=str(BASE_MS + 1050),
                          endingOffsetsByTimestamp=json.dumps({"timed": BASE_MS + 1060}))
    assert window == written[150:160]  # both ends inside entry 1
    assert batch_values(spark, space, stream="timed", endingTimestamp=str(BASE_MS + 10_000)) == written


def test_streaming_starts_per_stream_by_timestamp_then_reads_new_records(spark, dlog_ns, tmp_path):
    written = write_timed(dlog_ns, "timed")
    dlog_ns.ns.create_stream("other")
    dlog_ns.write("other", values(100, prefix="other"))
    reader = (spark.readStream.format("dlog").options(**dlog_ns.options).option("streams", "timed,other")
              .option("startingOffsetsByTimestamp", json.dumps({"timed": BASE_MS + 2050}))
              .option("startingOffsets", "latest").load())
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query = run_available_now(reader.select("stream", "value"), "parquet", checkpoint, path=str(out))
    assert query.exception() is None
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(row.value for row in rows) == written[250:]  # "other" starts at its latest: nothing

    with dlog_ns.ns.open_writer("other") as writer:
        writer.write_batch(records_to_batch(values(10, prefix="new")))
    query = run_available_now(reader.select("stream", "value"), "parquet", checkpoint, path=str(out))
    assert sum(input_rows(query)) == 10


def test_max_bytes_per_trigger_takes_whole_entries_and_combines_with_max_records(spark, dlog_ns, tmp_path):
    dlog_ns.ns.create_stream("sized")
    dlog_ns.write("sized", values(1000), entry_records=100)  # ten entries of about equal size
    entry_bytes = max(s["bytes"] for s in dlog_ns.ns.stream_info("sized")["segments"]) // 10

    def run(name: str, **limits: str):
        reader = (spark.readStream.format("dlog").options(**dlog_ns.options).option("stream", "sized")
                  .option("startingOffsets", "earliest").options(**limits).load())
        return run_available_now(reader, "noop", tmp_path / name)

    assert input_rows(run("bytes", maxBytesPerTrigger=str(int(entry_bytes * 3.5)))) == [300, 300, 300, 100]
    combined = run("both", maxBytesPerTrigger=str(int(entry_bytes * 3.5)), maxRecordsPerTrigger="250")
    assert input_rows(combined) == [200] * 5  # the record budget binds first
    assert input_rows(run("tiny", maxBytesPerTrigger="1")) == [100] * 10  # one entry at least
