"""The bookie core answers nothing that rests on an unsynced journal record: adds, fences (A2,
A11), and a second fencing read that arrives while the first fence is not yet durable; and a ledger
garbage collection dropped is never created again by a late add or fence."""

from __future__ import annotations

import pytest

from bookkeeper.bookie.bookie import BookieCore
from bookkeeper.bookie.storage import LedgerStorage
from bookkeeper.protocol.entry import Digest, DigestType, master_key, pack_entry
from bookkeeper.protocol.wire import AddRequest, ErrorResponse, ReadRequest, ResponseDecoder, Status

KEY = master_key(b"pw")
DIGEST = Digest.for_ledger(DigestType.CRC32C, b"pw")


class HeldJournal:
    """A journal whose 'fsync' happens only when the test says so."""

    def __init__(self) -> None:
        self.pending: list[tuple[object, object]] = []

    def append(self, record: bytes, callback, argument) -> None:
        self.pending.append((callback, argument))

    def fsync(self) -> None:
        pending, self.pending = self.pending, []
        for callback, argument in pending:
            callback(argument)


class Collector:
    def __init__(self) -> None:
        self.decoder = ResponseDecoder()
        self.answers: list = []

    def send(self, frame: bytes) -> None:
        self.decoder.receive_data(frame)
        while (message := self.decoder.next_message()) is not None:
            self.answers.append(message)

    def request_done(self) -> None:
        pass


@pytest.fixture
def core(tmp_path):
    storage = LedgerStorage(tmp_path / "ledgers")
    storage.open()
    yield BookieCore(HeldJournal(), storage)  # type: ignore[arg-type]
    storage.close()


def add(core: BookieCore, reply: Collector, entry_id: int, recovery: bool = False) -> None:
    packed = pack_entry(DIGEST, 1, entry_id, entry_id - 1, 0, b"data")
    core.on_add(AddRequest(entry_id + 100, 1, entry_id, KEY, packed, recovery), reply)


def test_an_add_is_answered_only_after_its_fsync(core):
    reply = Collector()
    add(core, reply, 0)
    assert reply.answers == []
    core.journal.fsync()
    assert [answer.entry_id for answer in reply.answers] == [0]


def test_a_second_fencing_read_waits_for_the_first_fence_to_be_durable(core):
    writer, first, second = Collector(), Collector(), Collector()
    add(core, writer, 0)
    core.journal.fsync()
    core.on_read(ReadRequest(1, 1, -1, fence=True, master_key=KEY), first)
    core.on_read(ReadRequest(2, 1, -1, fence=True, master_key=KEY), second)
    assert first.answers == [] and second.answers == []  # the fence is not on disk yet
    add(core, writer, 1)  # adds are refused as soon as the fence is set, durable or not
    assert isinstance(writer.answers[-1], ErrorResponse) and writer.answers[-1].status == Status.FENCED
    core.journal.fsync()
    assert [a.request_id for a in first.answers] == [1] and [a.request_id for a in second.answers] == [2]
    third = Collector()
    core.on_read(ReadRequest(3, 1, -1, fence=True, master_key=KEY), third)
    assert [a.request_id for a in third.answers] == [3]  # durable by now: answered at once


def test_recovery_adds_pass_a_fence(core):
    reply = Collector()
    add(core, reply, 0)
    core.on_read(ReadRequest(1, 1, -1, fence=True, master_key=KEY), reply)
    core.journal.fsync()
    add(core, reply, 1, recovery=True)
    core.journal.fsync()
    assert reply.answers[-1].entry_id == 1


def test_a_ledger_garbage_collection_dropped_refuses_adds_instead_of_coming_back(core):
    """Issue 20: bookies went on acknowledging adds to a ledger deleted under its writer, even after
    garbage collection, which recreated it, so the writer never learned."""
    reply = Collector()
    add(core, reply, 0)
    core.journal.fsync()
    core.storage.delete_ledger(1)  # what BookieService.collect_garbage does once the metadata is gone
    core.forget_ledger(1)
    add(core, reply, 1)
    core.on_read(ReadRequest(9, 1, -1, fence=True, master_key=KEY), reply)  # a recovery's fence
    core.journal.fsync()
    assert [(answer.status, "was deleted" in answer.message) for answer in reply.answers[1:]] == [
        (Status.NO_LEDGER, True), (Status.NO_LEDGER, False)]
    assert not core.has_ledger(1) and core.deleted_refusals == 1
