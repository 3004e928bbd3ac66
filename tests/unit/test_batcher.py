"""The client's batcher: adds of many ledgers to one bookie leave in one ADD_BATCH per loop turn (or at
its bounds) and each handle hears its own entries' outcome in one call; reads asked of one bookie
become the READ_RANGE requests that fetch exactly them."""

from __future__ import annotations

import asyncio

import pytest

from bookkeeper.client.batcher import AddBatcher, plan_range_reads
from bookkeeper.errors import LedgerFencedError, RequestTimeoutError
from bookkeeper.protocol.batch import AddBatchResponse, AddFailure
from bookkeeper.protocol.wire import RequestDecoder, Status


class Sink:
    def __init__(self) -> None:
        self.answers: list[tuple[str, list[int], list[tuple[int, str]]]] = []

    def on_adds_answered(self, bookie, ok_entry_ids, failures) -> None:  # type: ignore[no-untyped-def]
        self.answers.append((bookie, list(ok_entry_ids), [(e, type(error).__name__) for e, error in failures]))


async def test_adds_of_two_ledgers_share_one_frame_and_answer_each_handle_once():
    sent = []
    batcher = AddBatcher("b1", lambda *args: sent.append(args), iter(range(100, 200)).__next__)
    first, second = Sink(), Sink()
    batcher.add(first, 1, b"k" * 32, False, 0, b"e0" * 20)
    batcher.add(second, 2, b"j" * 32, True, 5, b"f5" * 20)
    batcher.add(first, 1, b"k" * 32, False, 1, b"e1" * 20)
    assert sent == []  # leaves when the loop turns
    await asyncio.sleep(0)
    assert len(sent) == 1
    bookie, request_id, frame, answered = sent[0]
    decoder = RequestDecoder()
    decoder.receive_data(frame)
    request = decoder.next_message()
    assert (bookie, request_id, request.entry_count) == ("b1", 100, 3)
    assert [(g.ledger_id, g.recovery, len(g.entries)) for g in request.groups] == [(1, False, 2), (2, True, 1)]
    answered(AddBatchResponse(100, 3, (AddFailure(1, Status.FENCED, "fenced"),)))  # frame order
    assert first.answers == [("b1", [0], [(1, "LedgerFencedError")])]
    assert second.answers == [("b1", [5], [])]
    answered(RequestTimeoutError("late"))  # a failed frame fails each of its entries
    assert first.answers[-1] == ("b1", [], [(0, "RequestTimeoutError"), (1, "RequestTimeoutError")])


async def test_a_full_batch_leaves_at_once():
    sent = []
    batcher = AddBatcher("b1", lambda *args: sent.append(args), iter(range(100)).__next__,
                         entries_max=2, bytes_max=1000)
    sink = Sink()
    batcher.add(sink, 1, b"k" * 32, False, 0, b"x")
    batcher.add(sink, 1, b"k" * 32, False, 1, b"x")
    assert len(sent) == 1  # at the entry bound
    batcher.add(sink, 1, b"k" * 32, False, 2, b"x" * 1000)
    assert len(sent) == 2  # at the byte bound
    await asyncio.sleep(0)
    assert len(sent) == 2


@pytest.mark.parametrize("asked, ranges, singles", [
    ([4], [], [4]),
    ([0, 3, 6, 9], [(0, 9, 3)], []),  # first reads of E=3: every third entry
    ([9, 3, 6, 0], [(0, 9, 3)], []),
    ([0, 1, 3, 4, 6], [(0, 6, 1)], []),  # a write set's share: dense, ask the span
    ([0, 50, 51, 200], [], [0, 50, 51, 200]),  # scattered: plain reads
])
def test_plan_range_reads(asked, ranges, singles):
    assert plan_range_reads(asked) == (ranges, singles)


def test_error_status_of_a_failure_maps_to_the_error_class():
    assert LedgerFencedError.status == Status.FENCED
