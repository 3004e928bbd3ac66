"""A bookie answers an ADD_BATCH once, after the fsync covering every accepted entry, refuses entries
one by one with the rules of a single add (a ledger garbage collection dropped, an id repeated in a
group), replays its journal record entry by entry, and reads ranges by stride, byte limit and fence
as docs/protocol.md says."""

from __future__ import annotations

import pytest

from bookkeeper.bookie.adds import group_record, replay_group_record
from bookkeeper.bookie.bookie import BookieCore
from bookkeeper.bookie.storage import LedgerStorage
from bookkeeper.protocol.batch import AddBatchRequest, AddBatchResponse, AddGroup, ReadRangeRequest
from bookkeeper.protocol.entry import Digest, DigestType, master_key, pack_entry
from bookkeeper.protocol.wire import AddRequest, ErrorResponse, ReadRequest, RequestDecoder, Status, encode_request
from tests.unit.test_bookie_core import Collector

KEY = master_key(b"pw")
DIGEST = Digest.for_ledger(DigestType.CRC32C, b"pw")


class RecordingJournal:
    """Keeps records; 'fsync' runs the callbacks when the test says so."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.pending: list[tuple[object, object]] = []

    def append(self, record: bytes, callback, argument) -> None:  # type: ignore[no-untyped-def]
        self.records.append(record)
        self.pending.append((callback, argument))

    def fsync(self) -> None:
        pending, self.pending = self.pending, []
        for callback, argument in pending:
            callback(argument)  # type: ignore[operator]


@pytest.fixture
def core(tmp_path):  # type: ignore[no-untyped-def]
    storage = LedgerStorage(tmp_path / "ledgers")
    storage.open()
    yield BookieCore(RecordingJournal(), storage)  # type: ignore[arg-type]
    storage.close()


def entry(ledger_id: int, entry_id: int, payload: bytes = b"data") -> bytes:
    return pack_entry(DIGEST, ledger_id, entry_id, entry_id - 1, 0, payload)


def wire_batch(*groups: AddGroup) -> AddBatchRequest:
    """As the bookie gets it: decoded from its frame (so each group carries its framed section)."""
    decoder = RequestDecoder()
    decoder.receive_data(encode_request(AddBatchRequest(7, groups)))
    return decoder.next_message()  # type: ignore[return-value]


def test_a_batch_of_two_ledgers_is_answered_once_after_its_fsync(core):
    reply = Collector()
    core.on_add_batch(wire_batch(AddGroup(1, KEY, (entry(1, 0), entry(1, 1))),
                                 AddGroup(2, KEY, (entry(2, 0),))), reply)
    assert reply.answers == []  # nothing is acknowledged before the journal is durable
    assert core.storage.get_entry(2, 0) == entry(2, 0)  # but readable at once
    core.journal.fsync()
    assert reply.answers == [AddBatchResponse(7, 3, ())]
    assert core.ledger_summary(1)["lac"] == 0  # the piggybacked LAC of entry 1


def test_refused_entries_are_listed_by_position_and_the_rest_is_stored(core):
    reply = Collector()
    core.on_add_batch(wire_batch(AddGroup(1, KEY, (entry(1, 0),))), reply)
    core.journal.fsync()
    core.on_read(ReadRequest(8, 1, -1, fence=True, master_key=KEY), reply)  # fence ledger 1
    core.journal.fsync()
    bad_header = entry(9, 0)  # says ledger 9 inside a group of ledger 3
    core.on_add_batch(wire_batch(AddGroup(1, KEY, (entry(1, 1),)),
                                 AddGroup(3, KEY, (entry(3, 0), bad_header, entry(3, 1))),
                                 AddGroup(4, b"x" * 32, (entry(4, 0),))), reply)
    core.journal.fsync()
    answer = reply.answers[-1]
    assert isinstance(answer, AddBatchResponse) and answer.entry_count == 5
    assert [(failure.index, failure.status) for failure in answer.failures] == [
        (0, Status.FENCED), (2, Status.BAD_REQUEST)]
    assert core.storage.get_entry(3, 1) == entry(3, 1) and core.storage.get_entry(1, 1) is None
    assert core.storage.get_entry(4, 0) == entry(4, 0)  # a new ledger takes the group's key


def test_a_wrong_key_refuses_the_whole_group_at_once(core):
    reply = Collector()
    core.on_add_batch(wire_batch(AddGroup(1, KEY, (entry(1, 0),))), reply)
    core.journal.fsync()
    core.on_add_batch(wire_batch(AddGroup(1, b"y" * 32, (entry(1, 1), entry(1, 2)))), reply)
    answer = reply.answers[-1]  # answered without waiting: nothing was accepted
    assert [failure.status for failure in answer.failures] == [Status.UNAUTHORIZED] * 2


def test_the_journal_record_is_the_framed_group_and_replays_entry_by_entry(core):
    batch = wire_batch(AddGroup(5, KEY, (entry(5, 0, b"a"), entry(5, 1, b"bb"))))
    core.on_add_batch(batch, Collector())
    record = core.journal.records[-1]
    assert record == group_record(5, [entry(5, 0, b"a"), entry(5, 1, b"bb")])
    assert record.endswith(batch.groups[0].section)  # journaled as it came off the wire
    assert replay_group_record(record) == (5, [(0, entry(5, 0, b"a")), (1, entry(5, 1, b"bb"))])


def test_a_read_range_follows_its_stride_and_says_how_far_it_covered(core):
    reply = Collector()
    core.on_add_batch(wire_batch(AddGroup(1, KEY, tuple(entry(1, i) for i in (0, 2, 3, 5, 6)))), reply)
    core.journal.fsync()
    core.on_read_range(ReadRangeRequest(9, 1, 0, 8, stride=3), reply)
    answer = reply.answers[-1]
    assert [entry_id for entry_id, _ in answer.entries] == [0, 3, 6]
    assert answer.covered_last_entry_id == 8
    core.on_read_range(ReadRangeRequest(10, 1, 0, 6, stride=1), reply)
    assert [entry_id for entry_id, _ in reply.answers[-1].entries] == [0, 2, 3, 5, 6]  # 1 and 4 absent


def test_a_read_range_stops_at_its_byte_limit_but_returns_at_least_one_entry(core):
    reply = Collector()
    core.on_add_batch(wire_batch(AddGroup(1, KEY, tuple(entry(1, i, b"x" * 100) for i in range(5)))), reply)
    core.journal.fsync()
    core.on_read_range(ReadRangeRequest(9, 1, 0, 4, bytes_max=10), reply)
    answer = reply.answers[-1]
    assert [entry_id for entry_id, _ in answer.entries] == [0] and answer.covered_last_entry_id == 0
    core.on_read_range(ReadRangeRequest(9, 1, 1, 4, bytes_max=300), reply)
    answer = reply.answers[-1]
    assert [entry_id for entry_id, _ in answer.entries] == [1, 2] and answer.covered_last_entry_id == 2


def test_a_fencing_read_range_is_answered_after_the_fence_is_durable(core):
    reply = Collector()
    core.on_add_batch(wire_batch(AddGroup(1, KEY, (entry(1, 0), entry(1, 1)))), reply)
    core.journal.fsync()
    core.on_read_range(ReadRangeRequest(9, 1, 0, 1, fence=True, master_key=KEY), reply)
    assert not isinstance(reply.answers[-1], ErrorResponse) and len(reply.answers) == 1
    core.journal.fsync()
    assert [entry_id for entry_id, _ in reply.answers[-1].entries] == [0, 1]
    core.on_add_batch(wire_batch(AddGroup(1, KEY, (entry(1, 2),))), reply)
    assert reply.answers[-1].failures[0].status == Status.FENCED
    core.on_read_range(ReadRangeRequest(10, 7, 0, 1), reply)
    assert reply.answers[-1].status == Status.NO_LEDGER


def test_a_batch_for_a_ledger_garbage_collection_dropped_is_refused_and_recreates_nothing(core):
    reply = Collector()
    core.on_add_batch(wire_batch(AddGroup(1, KEY, (entry(1, 0),))), reply)
    core.journal.fsync()
    core.storage.delete_ledger(1)
    core.forget_ledger(1)
    core.on_add_batch(wire_batch(AddGroup(1, KEY, (entry(1, 1),)), AddGroup(2, KEY, (entry(2, 0),))), reply)
    core.journal.fsync()
    answer = reply.answers[-1]
    assert isinstance(answer, AddBatchResponse) and [f.status for f in answer.failures] == [Status.NO_LEDGER]
    assert not core.has_ledger(1) and core.has_ledger(2)


def test_a_group_follows_the_rules_of_single_adds_entry_by_entry(core):
    """One ADD route: an id repeated in one group with other bytes is ENTRY_EXISTS, as a second
    single ADD is; a group (or single ADD) with nothing accepted creates no ledger."""
    reply = Collector()
    core.on_add_batch(wire_batch(AddGroup(1, KEY, (entry(1, 0), entry(1, 0, b"other"), entry(1, 1)))), reply)
    core.journal.fsync()
    answer = reply.answers[-1]
    assert [(failure.index, failure.status) for failure in answer.failures] == [(1, Status.ENTRY_EXISTS)]
    assert core.storage.get_entry(1, 0) == entry(1, 0)
    core.on_add_batch(wire_batch(AddGroup(2, KEY, (entry(9, 0),))), reply)
    core.on_add(AddRequest(8, 3, 0, KEY, entry(3, 1)), reply)
    assert reply.answers[-2].failures[0].status == Status.BAD_REQUEST
    assert reply.answers[-1].status == Status.BAD_REQUEST
    assert not core.has_ledger(2) and not core.has_ledger(3)
