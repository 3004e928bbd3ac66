"""RecoveryOp seals a ledger by A6-A8 and A10: mark, fence to coverage, read forward, write back, close by CAS."""

from __future__ import annotations

import random
from dataclasses import replace

from bookkeeper.errors import (
    BookieIOError,
    LedgerClosedError,
    LedgerRecoveryError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bookkeeper.protocol.effects import Finished, SendAdd, SendRead, WriteMetadata
from bookkeeper.protocol.entry import Digest, DigestType, pack_entry
from bookkeeper.protocol.metadata import LedgerMetadata, LedgerState
from bookkeeper.protocol.recovery import Phase, RecoveryOp

LEDGER_ID = 11
DIGEST = Digest.for_ledger(DigestType.CRC32C, b"pw")
ENSEMBLE = ("b0", "b1", "b2")
OPEN = LedgerMetadata(3, 3, 2, ((0, ENSEMBLE),))  # Qw - Qa + 1 = 2
MARKED = replace(OPEN, state=LedgerState.IN_RECOVERY)
NO = NoSuchEntryError("no such entry")


def packed(entry_id: int, lac: int | None = None) -> bytes:
    return pack_entry(DIGEST, LEDGER_ID, entry_id, entry_id - 1 if lac is None else lac,
                      10 * (entry_id + 1), b"p%d" % entry_id)


def recovery(metadata: LedgerMetadata = OPEN, version: int = 5, window: int = 2,
             available: tuple[str, ...] = ("b0", "b1", "b2", "b3")) -> RecoveryOp:
    return RecoveryOp(LEDGER_ID, metadata, version, DIGEST, available_bookies=available,
                      rng=random.Random(0), read_timeout_ms=1000, add_timeout_ms=1000, window=window)


def fence_reads(ensemble: tuple[str, ...] = ENSEMBLE) -> list[SendRead]:
    return [SendRead(bookie, -1, fence=True) for bookie in ensemble]


def entry_reads(entry_id: int, members: tuple[str, ...]) -> list[SendRead]:
    return [SendRead(bookie, entry_id, fence=True) for bookie in members]


def members(entry_id: int) -> tuple[str, ...]:
    start = entry_id % 3
    return tuple(ENSEMBLE[(start + offset) % 3] for offset in range(3))


def fenced(op: RecoveryOp, lacs: dict[str, int], now_ms: int = 1) -> list:
    """Start from IN_RECOVERY metadata and deliver these fence answers."""
    assert op.start(0) == fence_reads(op.metadata.last_ensemble[1])
    effects: list = []
    for bookie, lac in lacs.items():
        effects += op.on_read_ok(bookie, -1, lac, b"", now_ms)
    return effects


def only_finished_with(effects: list, error_type: type) -> Finished:
    assert len(effects) == 1 and isinstance(effects[0], Finished), effects
    assert effects[0].metadata is None and type(effects[0].error) is error_type, effects[0]
    return effects[0]


# ---------------------------------------------------------------------- marking


def test_an_open_ledger_is_first_marked_in_recovery_by_compare_and_set():
    op = recovery(OPEN, version=5)
    assert op.start(0) == [WriteMetadata(MARKED, 5)]
    assert op.on_metadata_written(MARKED, 6, 1) == fence_reads()  # the whole last ensemble
    assert op.phase is Phase.FENCING and op.version == 6


def test_a_ledger_already_in_recovery_is_fenced_without_another_write():
    assert recovery(MARKED).start(0) == fence_reads()


def test_a_closed_ledger_finishes_at_once():
    closed = OPEN.closed(4, 50)
    op = recovery(closed, version=9)
    assert op.start(0) == [Finished(closed, 9)]
    assert op.phase is Phase.DONE


def test_losing_the_mark_to_another_recovery_goes_on_with_fencing():
    op = recovery(OPEN, version=5)
    op.start(0)
    assert op.on_metadata_conflict(MARKED, 6, 1) == fence_reads()


def test_losing_the_mark_to_a_close_finishes_with_that_close():
    op = recovery(OPEN, version=5)
    op.start(0)
    closed = OPEN.closed(3, 40)
    assert op.on_metadata_conflict(closed, 6, 1) == [Finished(closed, 6)]


def test_losing_the_mark_to_an_ensemble_change_marks_the_new_metadata():
    op = recovery(OPEN, version=5)
    op.start(0)
    changed = OPEN.with_ensemble(4, ("b0", "b3", "b2"))
    assert op.on_metadata_conflict(changed, 6, 1) == [
        WriteMetadata(replace(changed, state=LedgerState.IN_RECOVERY), 6)]


# ---------------------------------------------------------------------- fencing (A7)


def test_reading_starts_at_coverage_from_the_highest_lac_without_waiting_for_a_hung_bookie():
    op = recovery(MARKED)
    assert fenced(op, {"b0": 3}) == []  # one answer: another Qa=2 could still ack without b0
    effects = op.on_read_ok("b1", -1, 5, b"", 2)  # Qw - Qa + 1 = 2 answered; b2 never answers
    assert effects == entry_reads(5, members(5)) + entry_reads(6, members(6))  # LAC = max(3, 5)
    assert op.phase is Phase.READING


def test_coverage_is_needed_in_every_write_set():
    ensemble = ("b0", "b1", "b2", "b3")
    metadata = LedgerMetadata(4, 3, 2, ((0, ensemble),), state=LedgerState.IN_RECOVERY)
    op = recovery(metadata, available=ensemble + ("b4",))
    # b0 and b2 leave write set {b1, b2, b3} with one fenced bookie: b1 and b3 could still ack
    assert fenced(op, {"b0": -1, "b2": -1}) == []
    assert op.on_read_ok("b1", -1, -1, b"", 2) != []


def test_the_lac_is_never_below_the_last_fragment_start_minus_one():
    metadata = replace(MARKED.with_ensemble(10, ("b0", "b3", "b2")))
    op = recovery(metadata, window=1)
    assert op.start(0) == fence_reads(("b0", "b3", "b2"))
    op.on_read_ok("b0", -1, 3, b"", 1)
    effects = op.on_read_ok("b3", -1, 4, b"", 2)
    assert effects == entry_reads(9, members(9))  # entry 9 lives in the first fragment


def test_too_many_failed_fences_fail_with_a_retryable_error():
    op = recovery(MARKED)
    op.start(0)
    assert op.on_read_error("b0", -1, BookieIOError("disk"), 1) == []
    finished = only_finished_with(op.on_read_error("b1", -1, BookieIOError("disk"), 2),
                                  LedgerRecoveryError)
    assert type(finished.error).retryable


def test_fence_answers_that_never_come_time_out():
    op = recovery(MARKED)
    op.start(0)
    op.on_read_ok("b0", -1, 0, b"", 1)
    assert op.on_tick(999) == []
    only_finished_with(op.on_tick(1000), LedgerRecoveryError)  # b1 and b2 both silent


def test_a_wrong_password_ends_recovery():
    op = recovery(MARKED)
    op.start(0)
    only_finished_with(op.on_read_error("b0", -1, UnauthorizedError("key"), 1), UnauthorizedError)


# ---------------------------------------------------------------------- reading and write-back (A6, A8)


def test_an_entry_past_the_lac_found_on_one_bookie_is_written_back_then_the_ledger_is_closed():
    op = recovery(MARKED, version=6)
    fenced(op, {"b0": 0})
    assert op.on_read_ok("b1", -1, 0, b"", 1) == entry_reads(0, members(0)) + entry_reads(1, members(1))
    # the LAC entry itself is only read for its length; the next entry is requested
    assert op.on_read_ok("b0", 0, 0, packed(0), 2) == entry_reads(2, members(2))
    # entry 1 is on b1 only (the writer died before anyone else got it): one positive answer is
    # enough; it goes back, byte for byte, to its whole write set with the recovery flag
    assert op.on_read_ok("b1", 1, 0, packed(1), 3) == [
        SendAdd(bookie, 1, packed(1), recovery=True) for bookie in members(1)
    ] + entry_reads(3, members(3))
    # entry 2: Qw - Qa + 1 = 2 bookies have no such entry: it was never acknowledged
    assert op.on_read_error("b2", 2, NO, 4) == []
    assert op.on_read_error("b0", 2, NoSuchLedgerError("no ledger"), 5) == []  # write-back pending
    assert op.on_add_ok("b2", 1, 6) == []
    closed = MARKED.closed(1, 20)
    assert op.on_add_ok("b0", 1, 7) == [WriteMetadata(closed, 6)]
    assert (closed.state, closed.last_entry_id, closed.length) == (LedgerState.CLOSED, 1, 20)
    assert op.on_metadata_written(closed, 7, 8) == [Finished(closed, 7)]


def test_the_first_missing_entry_ends_the_ledger_even_if_a_later_one_exists():
    op = recovery(MARKED, version=6)
    fenced(op, {"b0": -1, "b1": -1})
    op.on_read_ok("b1", 1, 0, packed(1), 2)  # entry 1 on one bookie, but entry 0 ...
    op.on_read_error("b0", 0, NO, 3)
    assert op.on_read_error("b1", 0, NO, 4) == [WriteMetadata(MARKED.closed(-1, 0), 6)]


def test_one_no_entry_answer_is_not_enough_to_end_the_ledger():
    op = recovery(MARKED, window=1)
    fenced(op, {"b0": -1, "b1": -1})
    assert op.on_read_error("b0", 0, NO, 2) == []  # 1 < Qw - Qa + 1
    assert op.on_read_ok("b2", 0, -1, packed(0), 3) == [
        SendAdd(bookie, 0, packed(0), recovery=True) for bookie in members(0)
    ] + entry_reads(1, members(1))


def test_an_entry_nobody_can_vouch_for_fails_recovery_with_a_retryable_error():
    op = recovery(MARKED, window=1)
    fenced(op, {"b0": -1, "b1": -1})
    op.on_read_error("b0", 0, NO, 2)
    op.on_read_error("b1", 0, BookieIOError("disk"), 3)
    finished = only_finished_with(op.on_read_error("b2", 0, BookieIOError("disk"), 4),
                                  LedgerRecoveryError)
    assert type(finished.error).retryable


def test_a_hung_bookie_is_waited_for_only_until_the_read_timeout():
    op = recovery(MARKED, window=1)
    fenced(op, {"b0": -1, "b1": -1})
    op.on_read_error("b0", 0, NO, 2)
    op.on_read_error("b1", 0, BookieIOError("disk"), 3)
    assert op.on_tick(999) == []
    only_finished_with(op.on_tick(1001), LedgerRecoveryError)


def test_an_unknown_entry_past_the_end_does_not_abort_recovery():
    """Regression: recovery used to abort on *any* undecidable entry in its read window, even one
    after an entry already known to be missing (which alone ends the ledger)."""
    op = recovery(MARKED, version=6)
    fenced(op, {"b0": -1, "b1": -1})
    for bookie in members(1):
        assert op.on_read_error(bookie, 1, BookieIOError("disk"), 2) == []  # 1 is unknown, 0 open
    op.on_read_error("b0", 0, NO, 3)
    assert op.on_read_error("b2", 0, NO, 4) == [WriteMetadata(MARKED.closed(-1, 0), 6)]


def test_an_unknown_entry_below_the_end_still_aborts_once_it_is_the_first_undecided():
    op = recovery(MARKED)
    fenced(op, {"b0": -1, "b1": -1})
    op.on_read_error("b1", 1, NO, 2)
    op.on_read_error("b2", 1, NO, 2)  # entry 1 is missing ...
    for bookie in members(0):  # ... but entry 0 cannot be decided
        effects = op.on_read_error(bookie, 0, BookieIOError("disk"), 3)
    only_finished_with(effects, LedgerRecoveryError)


def test_a_corrupt_replica_does_not_count_as_found():
    op = recovery(MARKED, window=1)
    fenced(op, {"b0": -1, "b1": -1})
    broken = packed(0)[:-1] + b"X"
    assert op.on_read_ok("b0", 0, -1, broken, 2) == []
    assert op.on_read_ok("b1", 0, -1, packed(0), 3)[0] == SendAdd("b0", 0, packed(0), recovery=True)


def test_a_bookie_failing_during_write_back_is_replaced_and_the_close_carries_the_new_fragment():
    op = recovery(MARKED, version=6)
    fenced(op, {"b0": 0, "b1": 0})
    op.on_read_ok("b0", 0, 0, packed(0), 2)
    op.on_read_ok("b1", 1, 0, packed(1), 3)
    op.on_read_error("b2", 2, NO, 4)
    op.on_read_error("b0", 2, NO, 4)
    assert op.on_add_error("b2", 1, BookieIOError("disk"), 5) == [SendAdd("b3", 1, packed(1), recovery=True)]
    op.on_add_ok("b1", 1, 6)
    [close] = op.on_add_ok("b3", 1, 7)
    assert close == WriteMetadata(MARKED.with_ensemble(1, ("b0", "b1", "b3")).closed(1, 20), 6)


# ---------------------------------------------------------------------- concurrent recoveries (A10)


def recovered_to(last_entry_id: int) -> tuple[RecoveryOp, WriteMetadata]:
    """A recovery that found entries 0..last_entry_id (LAC = last) and is about to close."""
    op = recovery(MARKED, version=6, window=1)
    fenced(op, {"b0": last_entry_id, "b1": last_entry_id})
    if last_entry_id >= 0:
        op.on_read_ok("b0", last_entry_id, 0, packed(last_entry_id), 2)
    op.on_read_error(members(last_entry_id + 1)[0], last_entry_id + 1, NO, 3)
    [close] = op.on_read_error(members(last_entry_id + 1)[1], last_entry_id + 1, NO, 3)
    assert isinstance(close, WriteMetadata)
    return op, close


def test_two_recoveries_agreeing_on_the_end_both_succeed():
    first, first_close = recovered_to(4)
    second, second_close = recovered_to(4)
    assert first.on_metadata_written(first_close.metadata, 7, 5) == [Finished(first_close.metadata, 7)]
    # the second one's compare-and-set loses to the first close, at the same last entry
    assert second.on_metadata_conflict(first_close.metadata, 7, 6) == [Finished(first_close.metadata, 7)]


def test_a_recovery_that_saw_another_end_fails_when_it_loses_the_close():
    _, theirs = recovered_to(4)
    mine, _ = recovered_to(3)
    only_finished_with(mine.on_metadata_conflict(theirs.metadata, 7, 6), LedgerClosedError)


def test_a_close_conflict_with_no_close_retries_on_the_new_version():
    op, close = recovered_to(2)
    current = replace(MARKED, custom=(("who", "else"),))
    assert op.on_metadata_conflict(current, 9, 6) == [
        WriteMetadata(replace(close.metadata, custom=current.custom), 9)]
