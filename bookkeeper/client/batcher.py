"""Coalescing adds for one bookie into ADD_BATCH frames, and reads into READ_RANGE requests.

Theory of operation. Every add a ledger handle (or a recovery's write-back) sends to a bookie is
queued in that bookie's `AddBatcher`, grouped by the handle that sent it. Once per event-loop
iteration (or at once when `entries_max` entries or `bytes_max` bytes are queued) the queue
becomes ONE frame with one request id, one pending-table slot and one answer, however many
ledgers (streams) its entries belong to. The answer is handed to each handle in bulk:
`on_adds_answered(bookie, ok_entry_ids, failures)`, one call per handle per frame, where before
every entry cost its own frame, answer, callback and state-machine step.

`plan_range_reads` turns the entries one read state machine asks of one bookie into READ_RANGE
requests: an arithmetic run (entry e of an ensemble of E is first asked of position e mod E, so a
bookie is usually asked every E-th entry) becomes one range with that stride; a dense set one
range with stride 1 whose extra entries are ignored; anything sparser stays plain reads.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any, Protocol

from bookkeeper.errors import DlogError, error_for_status
from bookkeeper.protocol.batch import ADD_BATCH_ENTRIES_MAX, AddBatchResponse, encode_add_batch

ADD_BATCH_BYTES_MAX = 1 << 20  # queued entry bytes that send a batch at once, before the loop turns
READ_RANGE_STRIDE_MAX = 2**16 - 1


class AddSink(Protocol):
    def on_adds_answered(self, bookie: str, ok_entry_ids: list[int],
                         failures: list[tuple[int, DlogError]]) -> None: ...


class _Group:
    __slots__ = ("sink", "ledger_id", "master_key", "recovery", "entry_ids", "entries")

    def __init__(self, sink: AddSink, ledger_id: int, master_key: bytes, recovery: bool) -> None:
        self.sink = sink
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.recovery = recovery
        self.entry_ids: list[int] = []
        self.entries: list[bytes] = []


SendFrame = Callable[[str, int, bytes, Callable[[Any], None]], None]


class AddBatcher:
    """The adds queued for one bookie; see the module docstring."""

    def __init__(self, bookie: str, send_frame: SendFrame, next_request_id: Callable[[], int], *,
                 entries_max: int = ADD_BATCH_ENTRIES_MAX, bytes_max: int = ADD_BATCH_BYTES_MAX) -> None:
        self.bookie = bookie
        self._send_frame = send_frame
        self._next_request_id = next_request_id
        self.entries_max = min(entries_max, ADD_BATCH_ENTRIES_MAX)
        self.bytes_max = bytes_max
        self._groups: dict[tuple[AddSink, bool], _Group] = {}
        self._entry_count = 0
        self._bytes = 0
        self._scheduled = False
        self._loop = asyncio.get_running_loop()
        self.frames_sent = 0

    def add(self, sink: AddSink, ledger_id: int, master_key: bytes, recovery: bool, entry_id: int,
            packed_entry: bytes) -> None:
        key = (sink, recovery)  # a handle is one ledger; its adds are all recovery adds or none
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(sink, ledger_id, master_key, recovery)
        group.entry_ids.append(entry_id)
        group.entries.append(packed_entry)
        self._entry_count += 1
        self._bytes += len(packed_entry)
        if self._entry_count >= self.entries_max or self._bytes >= self.bytes_max:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if not self._groups:
            return
        groups = list(self._groups.values())
        self._groups, self._entry_count, self._bytes = {}, 0, 0
        request_id = self._next_request_id()
        frame = encode_add_batch(request_id, [(group.ledger_id, group.master_key, group.recovery,
                                               group.entries) for group in groups])
        self.frames_sent += 1
        bookie = self.bookie

        def answered(outcome: Any) -> None:
            deliver_add_answer(bookie, groups, outcome)

        self._send_frame(bookie, request_id, frame, answered)


def deliver_add_answer(bookie: str, groups: list[_Group], outcome: Any) -> None:
    """One call per group (handle): the entries the bookie made durable, and those it refused."""
    if isinstance(outcome, AddBatchResponse) and not outcome.failures:
        for group in groups:
            group.sink.on_adds_answered(bookie, group.entry_ids, [])
        return
    if not isinstance(outcome, AddBatchResponse):
        error = outcome if isinstance(outcome, DlogError) else DlogError(
            f"unexpected answer to an ADD_BATCH from {bookie}: {outcome!r}")
        for group in groups:
            group.sink.on_adds_answered(bookie, [], [(entry_id, error) for entry_id in group.entry_ids])
        return
    failed = {failure.index: failure for failure in outcome.failures}
    index = 0
    for group in groups:
        ok: list[int] = []
        failures: list[tuple[int, DlogError]] = []
        for entry_id in group.entry_ids:
            failure = failed.get(index)
            if failure is None:
                ok.append(entry_id)
            else:
                failures.append((entry_id, error_for_status(failure.status, f"{bookie}: {failure.message}")))
            index += 1
        group.sink.on_adds_answered(bookie, ok, failures)


def plan_range_reads(entry_ids: list[int]) -> tuple[list[tuple[int, int, int]], list[int]]:
    """READ_RANGE requests (first, last, stride) and plain reads for the entries asked of one
    bookie; see the module docstring."""
    if len(entry_ids) < 2:
        return [], list(entry_ids)
    ordered = sorted(set(entry_ids))
    first, last = ordered[0], ordered[-1]
    stride = ordered[1] - first
    if stride <= READ_RANGE_STRIDE_MAX and all(
            later - earlier == stride for earlier, later in itertools.pairwise(ordered)):
        return [(first, last, stride)], []
    if last - first + 1 <= 2 * len(ordered):
        return [(first, last, 1)], []
    return [], ordered
