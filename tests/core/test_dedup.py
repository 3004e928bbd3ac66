"""The dedup table answers each producer's batch as Kafka and Pulsar would (new, duplicate with its
offsets, in flight, out of order, fenced), under both sequence rules, within its named limits, and
a new owner rebuilt from a snapshot and the entries after it answers exactly as the old one."""

from __future__ import annotations

import json

import pytest

from bookkeeper.errors import ConfigError, CorruptMetadataError, InvariantError
from dlog.core.dedup import (
    Accepted,
    DedupLimits,
    DedupTable,
    Duplicate,
    Fenced,
    InFlight,
    OutOfOrder,
    Refused,
    kafka_producer,
    native_producer,
)
from dlog.core.sequences import KAFKA_SEQUENCE_MAX, SequenceRule, position, sequence_rule

KAFKA = kafka_producer(7)
NATIVE = native_producer("billing-importer")
NOW = 1_700_000_000_000


def written(table: DedupTable, producer: str, first: int, last: int, offset: int, epoch: int = 0) -> int:
    """Offer a batch, make it durable at `offset`; the next free offset."""
    assert table.offer(producer, first, last, NOW, epoch) == Accepted()
    end = offset + (last - first if last >= first else last - first + KAFKA_SEQUENCE_MAX + 1)
    table.on_durable(producer, first, last, offset, end, NOW, epoch)
    return end + 1


def kafka_table(batches: int = 3) -> DedupTable:
    """Producer 7 has written sequences 0..(10*batches-1) in batches of ten at offsets 100 on."""
    table = DedupTable()
    offset = 100
    for index in range(batches):
        offset = written(table, KAFKA, index * 10, index * 10 + 9, offset)
    return table


# ---------------------------------------------------------------------------- the Kafka rule


@pytest.mark.parametrize("first, last, epoch, verdict", [
    (30, 39, 0, Accepted()),                                         # the next batch
    (31, 39, 0, OutOfOrder(30, "")),                                 # skips one sequence
    (45, 49, 0, OutOfOrder(30, "")),                                 # skips more
    (20, 29, 0, Duplicate(120, 129)),                                # the last batch again
    (0, 9, 0, Duplicate(100, 109)),                                  # an older remembered one
    (25, 29, 0, Duplicate(125, 129)),                                # part of one: offsets computed
    (25, 35, 0, OutOfOrder(30, "")),                                 # overlaps what was written
    (30, 39, 1, OutOfOrder(0, "")),                                  # a new epoch must start at 0
    (0, 4, 1, Accepted()),                                           # ... and may
    (-1, 3, 0, OutOfOrder(None, "")),                                # not a sequence
    (0, 0, 2**15, OutOfOrder(None, "")),                             # not an int16 epoch
])
def test_kafka_batches_are_judged_like_kafkas_broker(first, last, epoch, verdict):
    table = kafka_table()
    answer = table.offer(KAFKA, first, last, NOW, epoch)
    if isinstance(verdict, OutOfOrder):
        assert isinstance(answer, OutOfOrder) and answer.expected == verdict.expected
        assert KAFKA in answer.message and "\n" not in answer.message
    else:
        assert answer == verdict


def test_only_the_last_five_batches_keep_their_offsets_older_resends_are_still_duplicates():
    table = kafka_table(batches=7)
    assert table.offer(KAFKA, 20, 29, NOW) == Duplicate(120, 129)  # batch 3 of 7: remembered
    assert table.offer(KAFKA, 10, 19, NOW) == Duplicate(None, None)  # batch 2: beyond the five
    assert table.offer(KAFKA, 0, 9, NOW) == Duplicate(None, None)
    assert len(table.producer(KAFKA).batches) == 5
    assert table.duplicate_batches == 3


def test_a_lower_epoch_is_fenced_after_a_new_epoch_starts():
    table = kafka_table()
    assert table.offer(KAFKA, 0, 9, NOW, epoch=1) == Accepted()
    fenced = table.offer(KAFKA, 20, 29, NOW, epoch=0)  # a resend of the old epoch's batch
    assert isinstance(fenced, Fenced) and fenced.epoch == 1
    assert table.fenced_batches == 1
    table.on_durable(KAFKA, 0, 9, 130, 139, NOW, epoch=1)
    assert table.offer(KAFKA, 0, 9, NOW, epoch=1) == Duplicate(130, 139)
    assert table.offer(KAFKA, 10, 10, NOW, epoch=1) == Accepted()


def test_kafka_sequences_wrap_from_the_int32_maximum_to_zero():
    table = DedupTable()
    offset = written(table, KAFKA, KAFKA_SEQUENCE_MAX - 9, KAFKA_SEQUENCE_MAX - 2, 0)
    # a batch of four that wraps: MAX-1, MAX, 0, 1
    assert table.offer(KAFKA, KAFKA_SEQUENCE_MAX - 1, 1, NOW) == Accepted()
    table.on_durable(KAFKA, KAFKA_SEQUENCE_MAX - 1, 1, offset, offset + 3, NOW)
    assert table.offer(KAFKA, KAFKA_SEQUENCE_MAX - 1, 1, NOW) == Duplicate(offset, offset + 3)
    assert table.offer(KAFKA, 0, 1, NOW) == Duplicate(offset + 2, offset + 3)
    assert table.offer(KAFKA, KAFKA_SEQUENCE_MAX - 9, KAFKA_SEQUENCE_MAX - 2, NOW) == Duplicate(0, 7)
    assert isinstance(table.offer(KAFKA, 3, 5, NOW), OutOfOrder)
    assert table.offer(KAFKA, 2, 5, NOW) == Accepted()


@pytest.mark.parametrize("sequence, anchor, expected", [
    (5, 4, 1), (4, 5, -1), (0, KAFKA_SEQUENCE_MAX, 1), (KAFKA_SEQUENCE_MAX, 0, -1), (2**30 - 1, 0, 2**30 - 1),
])
def test_positions_on_kafkas_ring_are_signed_distances_within_half_of_it(sequence, anchor, expected):
    assert position(SequenceRule.CONSECUTIVE, sequence, anchor) == expected


def test_an_unknown_producer_may_start_anywhere_as_after_its_state_expired():
    table = DedupTable()
    assert table.offer(KAFKA, 4711, 4720, NOW) == Accepted()


def test_the_key_chooses_the_rule_and_a_native_name_can_never_pass_for_a_kafka_producer():
    assert sequence_rule(KAFKA) is SequenceRule.CONSECUTIVE and sequence_rule(NATIVE) is SequenceRule.INCREASING
    for bad in ("kafka:7", "", "x" * 201, "a b", 7):
        with pytest.raises(ConfigError, match="bad producer id") as caught:
            native_producer(bad)
        assert "\n" not in str(caught.value)


# ---------------------------------------------------------------------------- pushed but not durable


def test_a_resend_of_a_batch_in_flight_waits_and_then_is_a_duplicate():
    table = kafka_table()
    assert table.offer(KAFKA, 30, 39, NOW) == Accepted()
    assert table.offer(KAFKA, 40, 49, NOW) == Accepted()  # pipelined
    assert table.offer(KAFKA, 30, 39, NOW) == InFlight(49)  # Pulsar's "between the two maps"
    assert table.offer(KAFKA, 40, 49, NOW) == InFlight(49)
    table.on_durable(KAFKA, 30, 39, 130, 139, NOW)
    assert table.offer(KAFKA, 30, 39, NOW) == Duplicate(130, 139)
    assert table.offer(KAFKA, 40, 49, NOW) == InFlight(49)
    assert table.in_flight_batches == 3


def test_a_batch_certainly_not_written_is_forgotten_with_those_after_it_so_the_retry_is_accepted():
    table = kafka_table()
    for first in (30, 40, 50):
        assert table.offer(KAFKA, first, first + 9, NOW) == Accepted()
    table.on_durable(KAFKA, 30, 39, 130, 139, NOW)
    table.on_failed(KAFKA, 40)  # 40..49 and 50..59 never reached a bookie
    assert table.producer(KAFKA).pushed_sequence == 39
    assert isinstance(table.offer(KAFKA, 50, 59, NOW), OutOfOrder)
    assert table.offer(KAFKA, 40, 49, NOW) == Accepted()


def test_a_new_producer_whose_first_batch_failed_is_unknown_again():
    table = DedupTable()
    assert table.offer(KAFKA, 500, 509, NOW) == Accepted()
    table.on_failed(KAFKA, 500)
    assert table.producer(KAFKA) is None and table.producer_count == 0
    assert table.offer(KAFKA, 500, 509, NOW) == Accepted()


def test_reporting_a_batch_that_was_not_the_oldest_pushed_is_a_driver_bug():
    table = kafka_table()
    table.offer(KAFKA, 30, 39, NOW)
    table.offer(KAFKA, 40, 49, NOW)
    with pytest.raises(InvariantError):
        table.on_durable(KAFKA, 40, 49, 130, 139, NOW)
    with pytest.raises(InvariantError):
        table.on_failed(KAFKA, 60)


# ---------------------------------------------------------------------------- the native rule


def test_native_sequences_may_skip_ahead_but_never_go_back():
    table = DedupTable()
    offset = written(table, NATIVE, 1000, 1002, 0)  # sequences are the source's positions
    assert table.offer(NATIVE, 5000, 5000, NOW) == Accepted()  # a gap: fine
    assert table.offer(NATIVE, 1001, 1001, NOW) == Duplicate(1, 1)  # one record of a durable batch
    assert table.offer(NATIVE, 999, 999, NOW) == Duplicate(None, None)  # below durable, never seen
    assert table.offer(NATIVE, 3000, 3000, NOW) == InFlight(5000)  # between durable and pushed
    refused = table.offer(NATIVE, 4000, 6000, NOW)
    assert isinstance(refused, OutOfOrder) and refused.expected == 5001 and "or more" in refused.message
    malformed = table.offer(NATIVE, 7000, 6999, NOW)
    assert isinstance(malformed, OutOfOrder) and malformed.expected is None
    table.on_durable(NATIVE, 5000, 5000, offset, offset, NOW)
    assert table.last_sequence(NATIVE) == 5000  # where a restarted writer resumes


def test_part_of_a_native_batch_with_gaps_is_a_duplicate_without_offsets():
    table = DedupTable()
    written(table, NATIVE, 10, 20, 0)  # eleven records numbered 10..20 at offsets 0..10
    assert table.offer(NATIVE, 15, 15, NOW) == Duplicate(5, 5)
    sparse = DedupTable()
    assert sparse.offer(NATIVE, 10, 20, NOW) == Accepted()
    sparse.on_durable(NATIVE, 10, 20, 0, 2, NOW)  # three records numbered 10, 15, 20
    assert sparse.offer(NATIVE, 15, 15, NOW) == Duplicate(None, None)
    assert sparse.offer(NATIVE, 10, 20, NOW) == Duplicate(0, 2)


# ---------------------------------------------------------------------------- limits


def test_a_full_table_refuses_new_producers_and_never_evicts_a_live_one():
    table = DedupTable(DedupLimits(producers_max=2))
    written(table, "a", 0, 0, 0)
    written(table, "b", 0, 0, 1)
    refused = table.offer("c", 0, 0, NOW)
    assert isinstance(refused, Refused) and refused.limit == "producers_max"
    assert table.offer("a", 0, 0, NOW) == Duplicate(0, 0)  # the known ones keep their state
    assert table.refused_batches == 1


def test_producers_expire_after_idle_time_but_not_while_in_flight():
    limits = DedupLimits(producers_max=2, producer_idle_ms_max=60_000)
    table = DedupTable(limits)
    written(table, "a", 0, 0, 0)
    assert table.offer("b", 0, 0, NOW) == Accepted()  # in flight for a long time
    assert table.expire(NOW + 59_999) == ()
    assert table.expire(NOW + 60_000) == ("a",)
    assert table.producer("b") is not None and table.expired_producers == 1
    assert table.offer("c", 0, 0, NOW + 60_000) == Accepted()  # room again


def test_the_snapshot_bound_refuses_a_producer_it_could_not_name():
    table = DedupTable(DedupLimits(snapshot_bytes_max=120))
    written(table, "a" * 20, 0, 0, 0)
    refused = table.offer("b" * 20, 0, 0, NOW)
    assert isinstance(refused, Refused) and refused.limit == "snapshot_bytes_max"


def test_batches_in_flight_per_producer_are_bounded():
    table = DedupTable(DedupLimits(batches_in_flight_max=2))
    assert table.offer(KAFKA, 0, 0, NOW) == Accepted()
    assert table.offer(KAFKA, 1, 1, NOW) == Accepted()
    refused = table.offer(KAFKA, 2, 2, NOW)
    assert isinstance(refused, Refused) and refused.limit == "batches_in_flight_max"
    table.on_durable(KAFKA, 0, 0, 0, 0, NOW)
    assert table.offer(KAFKA, 2, 2, NOW) == Accepted()


@pytest.mark.parametrize("bad", [{"producers_max": 0}, {"batches_remembered_max": -1},
                                 {"batches_remembered_max": 65}, {"snapshot_bytes_max": 0}])
def test_bad_limits_are_refused_with_one_line_naming_them(bad):
    with pytest.raises(ConfigError, match=next(iter(bad))):
        DedupLimits(**bad)


# ---------------------------------------------------------------------------- snapshot, restore, replay


def probes(table: DedupTable) -> list:
    """The verdicts a table gives for a spread of resends and new batches (on a copy)."""
    copy = DedupTable.restore(table.snapshot(), table.limits)
    return [copy.offer(KAFKA, first, first + 9, NOW) for first in range(0, 80, 10)] + \
        [copy.offer(KAFKA, 0, 9, NOW, epoch=0), copy.offer(NATIVE, 55, 55, NOW), copy.offer(NATIVE, 99, 99, NOW)]


def test_a_new_owner_rebuilt_from_a_snapshot_and_the_entries_after_it_answers_as_the_old_one():
    old = kafka_table(batches=4)  # 0..39
    written(old, NATIVE, 50, 60, 140)
    snapshot = old.snapshot()  # stored as the segment completes
    later = [(KAFKA, 40, 49, 151), (KAFKA, 50, 59, 161), (NATIVE, 70, 70, 171)]
    for producer, first, last, offset in later:  # the in-progress segment
        written(old, producer, first, last, offset)
    assert old.offer(KAFKA, 60, 69, NOW) == Accepted()  # pending: not in any segment yet
    new = DedupTable.restore(snapshot)
    for producer, first, last, offset in later:
        new.on_replayed(producer, first, last, offset, offset + last - first, NOW)
    new.on_replayed(KAFKA, 30, 39, 130, 139, NOW)  # replaying from too early changes nothing
    old.on_failed(KAFKA, 60)
    assert new.snapshot() == old.snapshot()
    assert probes(new) == probes(old)
    assert new.offer(KAFKA, 50, 59, NOW) == Duplicate(161, 170)
    assert new.last_sequence(NATIVE) == 70


def test_the_snapshot_alone_keeps_a_producer_after_all_its_records_are_gone():
    """KAFKA-7190: retention removed every record; the producer is still known by its snapshot."""
    table = DedupTable.restore(kafka_table().snapshot())
    assert table.offer(KAFKA, 20, 29, NOW) == Duplicate(120, 129)
    assert table.offer(KAFKA, 30, 39, NOW) == Accepted()
    assert isinstance(table.offer(KAFKA, 35, 39, NOW), InFlight)


def test_a_snapshot_keeps_the_epoch_fence_and_leaves_out_what_is_not_durable():
    table = kafka_table()
    assert table.offer(KAFKA, 0, 9, NOW, epoch=3) == Accepted()  # a new epoch, not yet durable
    assert table.offer("fresh", 0, 0, NOW) == Accepted()  # a new producer, nothing durable
    restored = DedupTable.restore(table.snapshot())
    assert restored.producer("fresh") is None
    assert isinstance(restored.offer(KAFKA, 30, 39, NOW, epoch=0), Fenced)
    assert restored.offer(KAFKA, 0, 9, NOW, epoch=3) == Accepted()


def test_a_snapshot_over_its_bound_keeps_fewer_batches_then_fewer_producers():
    table = kafka_table(batches=5)
    full = len(table.snapshot())
    small = DedupTable.restore(table.snapshot(), DedupLimits(snapshot_bytes_max=full - 1))
    data = small.snapshot()
    assert len(data) < full and small.snapshot_batches_dropped == 1
    kept = DedupTable.restore(data)
    assert kept.offer(KAFKA, 40, 49, NOW) == Duplicate(140, 149)  # the newest batches stay
    assert kept.offer(KAFKA, 0, 9, NOW) == Duplicate(None, None)
    crowded = DedupTable()
    for index in range(10):
        written(crowded, f"p{index}", 0, 0, index)
    tiny = DedupTable.restore(crowded.snapshot(), DedupLimits(snapshot_bytes_max=100))
    assert len(tiny.snapshot()) <= 100 and tiny.snapshot_producers_dropped > 0


@pytest.mark.parametrize("data", [
    b"not json", b"[]", b'{"version": 2, "producers": []}', b'{"version": 1, "producers": [["a"]]}',
    b'{"version": 1, "producers": [["a", -1, 0, 0, []]]}',
    b'{"version": 1, "producers": [["a", 0, 0, 0, [[0, 1, 5, 4]]]]}',
    b'{"version": 1, "producers": [["a", 0, 9, 0, [[0, 1, 0, 1]]]]}',
    b'{"version": 1, "producers": [["a", 0, 0, 0, []], ["a", 0, 0, 0, []]]}',
    json.dumps({"version": 1, "producers": [["kafka:1", 0, 2**31, 0, []]]}).encode(),
])
def test_a_corrupt_snapshot_is_refused_with_one_line(data):
    with pytest.raises(CorruptMetadataError) as caught:
        DedupTable.restore(data)
    assert "\n" not in str(caught.value)


def test_replay_is_refused_once_writes_were_accepted_and_a_bad_entry_is_corrupt():
    table = kafka_table()
    with pytest.raises(CorruptMetadataError):
        table.on_replayed(KAFKA, 40, 39, 0, 0, NOW)  # 40..39 wraps over half the ring
    table.offer(KAFKA, 30, 39, NOW)
    with pytest.raises(InvariantError):
        table.on_replayed(KAFKA, 40, 49, 140, 149, NOW)


def test_rebuild_restores_the_stored_snapshot_replays_what_came_after_and_expires_the_idle():
    from dlog.core.dedup import ReplayedBatch, encode_stored, rebuild
    old = kafka_table(batches=2)  # 0..19 at 100..119
    written(old, "idle", 0, 0, 50)
    stored = encode_stored(120, old.snapshot())
    later = [ReplayedBatch(KAFKA, 0, 20, 29, 120, 129), ReplayedBatch(KAFKA, 0, 30, 39, 130, 139)]
    limits = DedupLimits(producer_idle_ms_max=1_000)
    new = rebuild(stored, [ReplayedBatch(KAFKA, 0, 10, 19, 110, 119), *later], NOW + 500, limits)
    assert new.offer(KAFKA, 30, 39, NOW + 500) == Duplicate(130, 139)  # made durable, never acknowledged
    assert new.offer(KAFKA, 10, 19, NOW + 500) == Duplicate(110, 119)
    assert new.offer(KAFKA, 40, 49, NOW + 500) == Accepted()
    assert new.producer("idle") is not None
    assert rebuild(stored, later, NOW + 5_000, limits).producer("idle") is None  # idle past the limit
    assert rebuild(None, [], NOW).producer_count == 0  # never owned: nothing to rebuild
    # without the replay the resend would be taken as new: the fault the simulator plants
    assert DedupTable.restore(old.snapshot()).offer(KAFKA, 20, 29, NOW) == Accepted()


@pytest.mark.parametrize("data", [b"", b"12", b"x\n{}", b"-1\n{}", b"1" * 21 + b"\n{}"])
def test_a_corrupt_stored_snapshot_is_refused_with_one_line(data):
    from dlog.core.dedup import decode_stored, rebuild
    with pytest.raises(CorruptMetadataError):
        decode_stored(data)
    with pytest.raises(CorruptMetadataError):
        rebuild(data, [], NOW)


def test_a_named_writers_durable_batches_answer_its_resends_and_survive_a_snapshot():
    """A named native writer (the stream's only writer for its producer) pushes nothing: its durable
    batches are recorded with on_written, and a rebuilt table answers its resends as the live one."""
    table = DedupTable()
    table.on_written(NATIVE, 10, 19, 0, 9, NOW)
    table.on_written(NATIVE, 30, 40, 10, 12, NOW)  # gaps: sequences are not dense in this batch
    assert table.last_sequence(NATIVE) == 40 and table.accepted_batches == 2
    assert table.offer(NATIVE, 12, 13, NOW) == Duplicate(2, 3)  # dense batch: offsets computed
    assert table.offer(NATIVE, 30, 40, NOW) == Duplicate(10, 12)
    assert table.offer(NATIVE, 35, 35, NOW) == Duplicate(None, None)  # inside a gapped batch: unknown
    assert isinstance(table.offer(NATIVE, 40, 41, NOW), OutOfOrder)
    restored = DedupTable.restore(table.snapshot())
    assert restored.offer(NATIVE, 30, 40, NOW) == Duplicate(10, 12) and restored.last_sequence(NATIVE) == 40


def test_room_for_names_the_limit_a_new_producer_would_pass():
    table = DedupTable(DedupLimits(producers_max=1))
    assert table.room_for("a") is None
    table.on_written("a", 0, 0, 0, 0, NOW)
    assert table.room_for("a") is None  # known producers always have room
    refused = table.room_for("b")
    assert isinstance(refused, Refused) and refused.limit == "producers_max"
