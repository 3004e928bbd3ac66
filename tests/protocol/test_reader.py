"""ReadOp fails over in the write set, reads speculatively, checks digests (A12), stops at its bound (A4, A5)."""

from __future__ import annotations

from bookkeeper.errors import BookieIOError, NoSuchEntryError, NoSuchLedgerError, RequestTimeoutError
from bookkeeper.protocol.effects import CompleteRead, FailRead, SendRead
from bookkeeper.protocol.entry import Digest, DigestMismatchError, DigestType, pack_entry
from bookkeeper.protocol.metadata import LedgerMetadata
from bookkeeper.protocol.reader import ReadOp

LEDGER_ID = 3
DIGEST = Digest.for_ledger(DigestType.CRC32C, b"pw")
METADATA = LedgerMetadata(3, 3, 2, ((0, ("b0", "b1", "b2")),))


def payload(entry_id: int) -> bytes:
    return f"entry-{entry_id}".encode()


def packed(entry_id: int) -> bytes:
    return pack_entry(DIGEST, LEDGER_ID, entry_id, entry_id - 1, 10 * (entry_id + 1), payload(entry_id))


def completed(entry_id: int) -> CompleteRead:
    return CompleteRead(entry_id, entry_id - 1, payload(entry_id), 10 * (entry_id + 1))


def corrupt(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


def read_op(first: int = 0, last: int = 0, metadata: LedgerMetadata = METADATA, **options) -> ReadOp:
    options.setdefault("speculative_ms", 100)
    options.setdefault("read_timeout_ms", 1000)
    return ReadOp(LEDGER_ID, metadata, DIGEST, first, last, **options)


def only_failure(effects: list, entry_id: int, error_type: type) -> None:
    assert len(effects) == 1 and isinstance(effects[0], FailRead), effects
    assert effects[0].entry_id == entry_id and type(effects[0].error) is error_type, effects[0]


def test_an_entry_is_asked_of_the_first_bookie_of_its_write_set():
    op = read_op(0, 2, window=3)
    assert op.start(0) == [SendRead("b0", 0), SendRead("b1", 1), SendRead("b2", 2)]


def test_an_error_fails_over_to_the_next_bookie_of_the_write_set():
    op = read_op()
    assert op.start(0) == [SendRead("b0", 0)]
    assert op.on_read_error("b0", 0, BookieIOError("disk"), 1) == [SendRead("b1", 0)]
    assert op.on_read_ok("b1", 0, packed(0), 2) == [completed(0)]
    assert op.done


def test_a_digest_mismatch_fails_over_to_the_next_bookie():
    op = read_op()
    op.start(0)
    assert op.on_read_ok("b0", 0, corrupt(packed(0)), 1) == [SendRead("b1", 0)]
    assert op.on_read_ok("b1", 0, packed(0), 2) == [completed(0)]


def test_an_entry_with_other_ids_is_refused_like_a_digest_mismatch():
    op = read_op()
    op.start(0)
    assert op.on_read_ok("b0", 0, packed(1), 1) == [SendRead("b1", 0)]


def test_a_slow_bookie_gets_a_speculative_read_and_the_first_valid_answer_wins():
    op = read_op()
    assert op.start(0) == [SendRead("b0", 0)]
    assert op.on_tick(99) == []
    assert op.on_tick(100) == [SendRead("b1", 0)]  # b0 is still asked: nothing was given up
    assert op.on_read_ok("b0", 0, packed(0), 110) == [completed(0)]  # the first request answers first
    assert op.on_read_ok("b1", 0, packed(0), 120) == []  # the speculative answer is dropped


def test_the_speculative_answer_may_win():
    op = read_op()
    op.start(0)
    op.on_tick(100)
    assert op.on_read_ok("b1", 0, packed(0), 105) == [completed(0)]
    assert op.on_read_ok("b0", 0, packed(0), 120) == []


def test_an_invalid_speculative_answer_does_not_win():
    op = read_op()
    op.start(0)
    op.on_tick(100)
    assert op.on_read_ok("b1", 0, corrupt(packed(0)), 105) == [SendRead("b2", 0)]
    assert op.on_read_ok("b0", 0, packed(0), 106) == [completed(0)]


def test_a_read_timeout_moves_on():
    op = read_op(speculative_ms=10_000, read_timeout_ms=500)
    op.start(0)
    assert op.on_tick(499) == []
    assert op.on_tick(500) == [SendRead("b1", 0)]
    assert op.on_read_error("b1", 0, NoSuchEntryError("no"), 600) == [SendRead("b2", 0)]
    # b0 never answered, so this is not "no such entry" even though the last answer says so
    # (regression: the last error used to be reported, whatever the others were)
    only_failure(op.on_read_error("b2", 0, NoSuchEntryError("no"), 601), 0, RequestTimeoutError)


def test_a_stall_of_this_process_is_not_a_read_timeout():
    op = read_op(speculative_ms=10_000, read_timeout_ms=500)
    op.start(0)
    assert op.on_tick(3_100, stalled_since_ms=100) == []  # the process stalled 3 s (ticks.py)
    assert op.on_read_ok("b0", 0, packed(0), 3_101) == [completed(0)]
    silent = read_op(speculative_ms=10_000, read_timeout_ms=500)
    silent.start(0)
    assert silent.on_tick(3_100, stalled_since_ms=100) == []
    assert silent.on_tick(3_499) == [] and silent.on_tick(3_500) == [SendRead("b1", 0)]  # 100 + 400 ms


def test_a_late_answer_after_a_timeout_is_ignored():
    op = read_op(speculative_ms=10_000, read_timeout_ms=500)
    op.start(0)
    op.on_tick(500)
    assert op.on_read_ok("b0", 0, packed(0), 501) == []  # b0 was given up on
    assert op.on_read_ok("b1", 0, packed(0), 502) == [completed(0)]


def test_no_such_entry_from_every_bookie_fails_the_read_with_no_such_entry():
    op = read_op()
    op.start(0)
    assert op.on_read_error("b0", 0, NoSuchEntryError("no"), 1) == [SendRead("b1", 0)]
    assert op.on_read_error("b1", 0, NoSuchLedgerError("no"), 2) == [SendRead("b2", 0)]
    only_failure(op.on_read_error("b2", 0, NoSuchEntryError("no"), 3), 0, NoSuchEntryError)
    assert op.done


def test_an_entry_corrupt_on_every_replica_is_not_reported_as_missing():
    """Regression: it used to fail with NoSuchEntryError, which a caller may read as "the ledger ends
    here"; it is a digest mismatch."""
    op = read_op()
    op.start(0)
    op.on_read_ok("b0", 0, corrupt(packed(0)), 1)
    op.on_read_error("b1", 0, NoSuchEntryError("no"), 2)
    only_failure(op.on_read_ok("b2", 0, corrupt(packed(0)), 3), 0, DigestMismatchError)


def test_results_are_delivered_in_entry_order():
    op = read_op(0, 2, window=3)
    op.start(0)
    assert op.on_read_ok("b2", 2, packed(2), 1) == []
    assert op.on_read_ok("b1", 1, packed(1), 2) == []
    assert op.on_read_ok("b0", 0, packed(0), 3) == [completed(0), completed(1), completed(2)]


def test_a_failed_entry_ends_the_range_and_later_results_are_not_delivered():
    op = read_op(0, 2, window=3)
    op.start(0)
    op.on_read_ok("b2", 2, packed(2), 1)
    op.on_read_error("b0", 0, NoSuchEntryError("no"), 2)
    op.on_read_error("b1", 0, NoSuchEntryError("no"), 3)
    only_failure(op.on_read_error("b2", 0, NoSuchEntryError("no"), 4), 0, NoSuchEntryError)
    assert op.done and op.on_read_ok("b1", 1, packed(1), 5) == []


def test_no_more_than_the_window_is_in_flight():
    op = read_op(0, 4, window=2)
    assert op.start(0) == [SendRead("b0", 0), SendRead("b1", 1)]
    assert op.on_read_ok("b1", 1, packed(1), 1) == []  # entry 0 still undelivered: window full
    assert op.on_read_ok("b0", 0, packed(0), 2) == [completed(0), completed(1),
                                                    SendRead("b2", 2), SendRead("b0", 3)]
    assert op.on_read_ok("b2", 2, packed(2), 3) == [completed(2), SendRead("b1", 4)]
    assert op.on_read_ok("b1", 4, packed(4), 4) == []
    assert op.on_read_ok("b0", 3, packed(3), 5) == [completed(3), completed(4)]
    assert op.done


def test_nothing_past_the_last_entry_is_read():
    closed = METADATA.closed(1, 20)
    op = read_op(0, closed.last_entry_id, metadata=closed, window=10)
    assert op.start(0) == [SendRead("b0", 0), SendRead("b1", 1)]


def test_each_entry_is_read_from_the_fragment_that_holds_it():
    metadata = METADATA.with_ensemble(2, ("b0", "b3", "b2"))
    op = read_op(1, 2, metadata=metadata, window=2)
    assert op.start(0) == [SendRead("b1", 1), SendRead("b2", 2)]
    assert op.on_read_error("b2", 2, BookieIOError("disk"), 1) == [SendRead("b0", 2)]
    assert op.on_read_error("b0", 2, BookieIOError("disk"), 2) == [SendRead("b3", 2)]


def test_bookies_known_to_be_down_are_tried_last():
    op = read_op(down=frozenset({"b0"}))
    assert op.start(0) == [SendRead("b1", 0)]
    assert op.on_read_error("b1", 0, BookieIOError("disk"), 1) == [SendRead("b2", 0)]
    assert op.on_read_error("b2", 0, BookieIOError("disk"), 2) == [SendRead("b0", 0)]
