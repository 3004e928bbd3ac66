"""The ledger writer keeps A1, A2, A9 and A10: write sets, ordered acks, committed ensemble changes, CAS close."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from bookkeeper.errors import (
    AuthenticationError,
    BookieIOError,
    BookieUnavailableError,
    ForbiddenError,
    InvariantError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataError,
    NotEnoughBookiesError,
    QuotaExceededError,
    RequestTimeoutError,
    UnauthorizedError,
)
from bookkeeper.protocol.effects import (
    CompleteAdds,
    FailAdds,
    Finished,
    LacDueSoon,
    SendAdd,
    SendWriteLac,
    WriteMetadata,
)
from bookkeeper.protocol.entry import Digest, DigestType, pack_entry
from bookkeeper.protocol.metadata import LedgerMetadata, LedgerState
from bookkeeper.protocol.writer import LedgerWriter, WriterState

LEDGER_ID = 7
DIGEST = Digest.for_ledger(DigestType.CRC32C, b"secret")


def ledger_metadata(ensemble: tuple[str, ...] = ("b0", "b1", "b2"), write_quorum: int = 3,
                    ack_quorum: int = 2) -> LedgerMetadata:
    return LedgerMetadata(len(ensemble), write_quorum, ack_quorum, ((0, ensemble),))


def new_writer(ensemble: tuple[str, ...] = ("b0", "b1", "b2"), write_quorum: int = 3,
               ack_quorum: int = 2, available: tuple[str, ...] = ("b0", "b1", "b2", "b3"),
               **options: object) -> LedgerWriter:
    metadata = ledger_metadata(ensemble, write_quorum, ack_quorum)
    return LedgerWriter(LEDGER_ID, metadata, 0, DIGEST, available_bookies=available,
                        rng=random.Random(1), **options)  # type: ignore[arg-type]


def packed(entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
    return pack_entry(DIGEST, LEDGER_ID, entry_id, lac, length, payload)


def ack_all(writer: LedgerWriter, entry_id: int, bookies: tuple[str, ...], now_ms: int = 0) -> list:
    effects: list = []
    for bookie in bookies:
        effects += writer.on_add_ok(bookie, entry_id, now_ms)
    return effects


def only_fail(effects: list, first_entry_id: int, error_type: type) -> None:
    """Exactly one FailAdds from first_entry_id with an error of error_type (errors compare by identity)."""
    assert len(effects) == 1, effects
    assert isinstance(effects[0], FailAdds), effects
    assert effects[0].first_entry_id == first_entry_id
    assert type(effects[0].error) is error_type, effects[0].error


# ---------------------------------------------------------------------- A1: write sets, pipelining


def test_pipelined_appends_each_go_to_their_own_write_set():
    writer = new_writer(write_quorum=2, ack_quorum=2)
    sent = [writer.append(payload, now_ms=0) for payload in (b"a", b"bb", b"ccc")]
    # nothing is acknowledged yet, so every entry carries LAC -1; lengths accumulate
    assert sent == [
        (0, [SendAdd("b0", 0, packed(0, -1, 1, b"a")), SendAdd("b1", 0, packed(0, -1, 1, b"a"))]),
        (1, [SendAdd("b1", 1, packed(1, -1, 3, b"bb")), SendAdd("b2", 1, packed(1, -1, 3, b"bb"))]),
        (2, [SendAdd("b2", 2, packed(2, -1, 6, b"ccc")), SendAdd("b0", 2, packed(2, -1, 6, b"ccc"))]),
    ]
    assert writer.pending_count == 3


def test_a_later_entry_carries_the_lac_known_when_it_was_appended():
    writer = new_writer()
    writer.append(b"a", 0)
    assert ack_all(writer, 0, ("b0", "b1")) == [CompleteAdds(0, 0)]
    _, effects = writer.append(b"b", 1)
    assert effects[0] == SendAdd("b1", 1, packed(1, 0, 2, b"b"))


# ---------------------------------------------------------------------- A2: ack quorum, ordered acks


def test_an_entry_completes_at_ack_quorum_of_its_write_set_and_later_acks_are_ignored():
    writer = new_writer(write_quorum=3, ack_quorum=2)
    writer.append(b"x", 0)
    assert writer.on_add_ok("b0", 0, 1) == []  # 1 of Qa=2
    assert writer.on_add_ok("b2", 0, 2) == [CompleteAdds(0, 0)]
    assert writer.on_add_ok("b1", 0, 3) == []  # third ack of an entry already completed
    assert writer.lac == 0


@pytest.mark.parametrize("ack_quorum", [1, 2, 3])
def test_completion_needs_exactly_ack_quorum_acks(ack_quorum):
    writer = new_writer(write_quorum=3, ack_quorum=ack_quorum)
    writer.append(b"x", 0)
    for bookie in ("b0", "b1", "b2")[:ack_quorum - 1]:
        assert writer.on_add_ok(bookie, 0, 1) == []
    assert writer.on_add_ok(("b0", "b1", "b2")[ack_quorum - 1], 0, 1) == [CompleteAdds(0, 0)]


def test_entry_one_at_quorum_before_entry_zero_completes_nothing_until_zero_does():
    writer = new_writer()
    writer.append(b"0", 0)
    writer.append(b"1", 0)
    assert writer.on_add_ok("b1", 1, 1) == []
    assert writer.on_add_ok("b2", 1, 2) == []  # entry 1 has Qa=2, entry 0 has nothing: no ack (A2)
    assert writer.lac == -1
    assert writer.on_add_ok("b0", 0, 3) == []
    assert writer.on_add_ok("b2", 0, 4) == [CompleteAdds(0, 1)]


def test_a_later_entry_at_quorum_waits_for_every_entry_below_it():
    writer = new_writer()
    for payload in (b"0", b"1", b"2"):
        writer.append(payload, 0)
    assert ack_all(writer, 1, ("b1", "b2")) == []  # entry 1 has its quorum, entry 0 not yet
    assert ack_all(writer, 2, ("b2", "b0")) == []
    assert writer.on_add_ok("b0", 0, 5) == []
    assert writer.on_add_ok("b1", 0, 6) == [CompleteAdds(0, 2)]  # one run, in order
    assert writer.lac == 2 and writer.pending_count == 0


def test_an_answer_for_an_unknown_entry_or_a_duplicate_ack_changes_nothing():
    writer = new_writer(ack_quorum=2)
    writer.append(b"x", 0)
    assert writer.on_add_ok("b0", 0, 1) == []
    assert writer.on_add_ok("b0", 0, 2) == []  # duplicated answer: still one ack
    assert writer.on_add_ok("b0", 9, 2) == []  # never appended
    assert writer.lac == -1


# ---------------------------------------------------------------------- A9: ensemble change


def started_change(available: tuple[str, ...] = ("b0", "b1", "b2", "b3")) -> LedgerWriter:
    """Entry 0 completed; entries 1 and 2 pending; b1 failed on entry 1 -> proposal pending."""
    writer = new_writer(available=available)
    for payload in (b"0", b"1", b"2"):
        writer.append(payload, 0)
    assert ack_all(writer, 0, ("b0", "b1")) == [CompleteAdds(0, 0)]
    return writer


def test_a_bookie_error_proposes_a_fragment_from_lac_plus_one_with_a_replacement():
    writer = started_change()
    effects = writer.on_add_error("b1", 1, BookieIOError("disk"), 10)
    expected = ledger_metadata().with_ensemble(1, ("b0", "b3", "b2"))  # b3: the only spare bookie
    assert effects == [WriteMetadata(expected, 0)]
    assert expected.ensembles == ((0, ("b0", "b1", "b2")), (1, ("b0", "b3", "b2")))
    assert writer.state is WriterState.CHANGING_ENSEMBLE


def test_the_replacement_is_drawn_from_available_bookies_outside_the_ensemble():
    for seed in range(20):
        writer = LedgerWriter(LEDGER_ID, ledger_metadata(), 0, DIGEST,
                              available_bookies=["b0", "b1", "b2", "b3", "b4", "b5"],
                              rng=random.Random(seed))
        writer.append(b"x", 0)
        [effect] = writer.on_add_error("b2", 0, BookieIOError("disk"), 1)
        assert isinstance(effect, WriteMetadata)
        first, ensemble = effect.metadata.last_ensemble
        assert first == 0 and ensemble[:2] == ("b0", "b1") and ensemble[2] in {"b3", "b4", "b5"}


def test_acks_during_an_ensemble_change_complete_nothing_until_the_metadata_is_committed():
    writer = started_change()
    [proposal] = writer.on_add_error("b1", 1, BookieIOError("disk"), 10)
    # entry 1 reaches Qa=2 on b0 and b2 while the store has not confirmed the new fragment
    assert ack_all(writer, 1, ("b2", "b0"), now_ms=11) == []
    assert ack_all(writer, 2, ("b2", "b0"), now_ms=12) == []
    assert writer.lac == 0
    # committed: pending entries go to the replacement only, then the held entries complete
    effects = writer.on_metadata_written(proposal.metadata, 1, 20)
    assert effects == [SendAdd("b3", 1, packed(1, -1, 2, b"1")),
                       SendAdd("b3", 2, packed(2, -1, 3, b"2")),
                       CompleteAdds(1, 2)]
    assert writer.state is WriterState.OPEN and writer.version == 1


def test_after_the_change_only_the_replacement_receives_pending_entries():
    writer = started_change()
    [proposal] = writer.on_add_error("b1", 1, BookieIOError("disk"), 10)
    assert writer.on_add_ok("b0", 1, 11) == []
    effects = writer.on_metadata_written(proposal.metadata, 1, 20)
    assert effects == [SendAdd("b3", 1, packed(1, -1, 2, b"1")),
                       SendAdd("b3", 2, packed(2, -1, 3, b"2"))]
    # the replaced bookie's late answers are ignored; the replacement's count
    assert writer.on_add_ok("b1", 1, 21) == []
    assert writer.on_add_ok("b3", 1, 22) == [CompleteAdds(1, 1)]
    # new appends use the new fragment
    _, sends = writer.append(b"3", 23)
    assert [send.bookie for send in sends] == ["b0", "b3", "b2"]


def test_an_append_during_the_change_skips_the_failed_bookie_and_reaches_the_replacement_after():
    writer = started_change()
    [proposal] = writer.on_add_error("b1", 1, BookieIOError("disk"), 10)
    entry_id, sends = writer.append(b"3", 11)
    assert entry_id == 3 and [send.bookie for send in sends] == ["b0", "b2"]  # b1 is being replaced
    effects = writer.on_metadata_written(proposal.metadata, 1, 20)
    assert SendAdd("b3", 3, packed(3, 0, 4, b"3")) in effects


def test_an_add_timeout_seen_on_tick_starts_the_same_ensemble_change():
    writer = new_writer(ack_quorum=3, add_timeout_ms=500)
    writer.append(b"x", now_ms=0)
    assert ack_all(writer, 0, ("b0", "b2"), now_ms=5) == []  # b1 never answers
    assert writer.on_tick(499) == []
    assert writer.on_tick(500) == [WriteMetadata(ledger_metadata(ack_quorum=3).with_ensemble(
        0, ("b0", "b3", "b2")), 0)]


def test_a_stall_of_this_process_is_not_a_bookie_timeout_but_a_silent_bookie_still_is():
    """A late tick says since when the loop did not run (ticks.py: a long GC, a loop held by
    application code; answers wait unread in the sockets): that time is not timed out. A bookie
    that still does not answer is replaced one timeout later. Even a ledger's first tick may be late
    (a writer opened just before the stall)."""
    writer = new_writer(ack_quorum=3, add_timeout_ms=5_000)
    writer.append(b"x", now_ms=0)
    assert writer.on_tick(8_050, stalled_since_ms=50) == []  # 8 s over the timeout, but not the bookies'
    assert ack_all(writer, 0, ("b0", "b2"), now_ms=8_060) == []  # the answers read after the stall
    assert writer.on_tick(8_100) == []
    # b1 never answers: 50 ms were used before the stall, 4,950 after it
    assert all(writer.on_tick(now_ms) == [] for now_ms in range(8_200, 13_000, 100))
    assert writer.on_tick(13_000) == [WriteMetadata(ledger_metadata(ack_quorum=3).with_ensemble(
        0, ("b0", "b3", "b2")), 0)]


def test_a_second_failure_during_a_change_is_replaced_right_after_the_commit():
    writer = new_writer(available=("b0", "b1", "b2", "b3", "b4"))
    writer.append(b"x", 0)
    [proposal] = writer.on_add_error("b1", 0, BookieIOError("disk"), 1)
    assert writer.on_add_error("b2", 0, BookieIOError("disk"), 2) == []  # queued
    replacement = proposal.metadata.last_ensemble[1][1]
    spare = ({"b3", "b4"} - {replacement}).pop()
    effects = writer.on_metadata_written(proposal.metadata, 1, 3)
    # the next change starts at once, and the re-send goes to the first replacement, never to the
    # bookie that failed during the change (regression: it used to get the entry again)
    assert effects == [
        WriteMetadata(proposal.metadata.with_ensemble(0, ("b0", replacement, spare)), 1),
        SendAdd(replacement, 0, packed(0, -1, 1, b"x"))]
    assert writer.state is WriterState.CHANGING_ENSEMBLE


def test_no_spare_bookie_fails_every_pending_add_with_not_enough_bookies():
    writer = new_writer(available=("b0", "b1", "b2"))
    writer.append(b"x", 0)
    writer.append(b"y", 0)
    only_fail(writer.on_add_error("b2", 0, BookieIOError("disk"), 1), 0, NotEnoughBookiesError)
    assert writer.state is WriterState.FAILED
    with pytest.raises(NotEnoughBookiesError):
        writer.append(b"z", 2)


def test_a_conflict_showing_our_own_proposal_counts_as_written():
    writer = started_change()
    [proposal] = writer.on_add_error("b1", 1, BookieIOError("disk"), 10)
    ack_all(writer, 1, ("b0", "b2"))
    effects = writer.on_metadata_conflict(proposal.metadata, 1, 20)  # the reply was lost, retried
    assert CompleteAdds(1, 1) in effects and writer.version == 1


def test_a_conflict_with_an_unrelated_open_change_is_rebased_and_retried():
    writer = started_change()
    [proposal] = writer.on_add_error("b1", 1, BookieIOError("disk"), 10)
    current = replace(ledger_metadata(), custom=(("owner", "someone"),))
    effects = writer.on_metadata_conflict(current, 4, 11)
    assert effects == [WriteMetadata(current.with_ensemble(1, ("b0", "b3", "b2")), 4)]
    assert ack_all(writer, 1, ("b0", "b2")) == []  # still held (A9)


def test_a_conflict_showing_in_recovery_fails_pending_adds_as_fenced():
    writer = started_change()
    writer.on_add_error("b1", 1, BookieIOError("disk"), 10)
    current = replace(ledger_metadata(), state=LedgerState.IN_RECOVERY)
    only_fail(writer.on_metadata_conflict(current, 1, 11), 1, LedgerFencedError)
    with pytest.raises(LedgerFencedError):
        writer.append(b"late", 12)


def test_a_conflict_showing_closed_fails_pending_adds():
    writer = started_change()
    writer.on_add_error("b1", 1, BookieIOError("disk"), 10)
    only_fail(writer.on_metadata_conflict(ledger_metadata().closed(0, 1), 1, 11), 1,
              LedgerClosedError)


def test_endless_conflicts_give_up_with_a_metadata_error():
    writer = started_change()
    writer.metadata_retries_max = 2
    writer.on_add_error("b1", 1, BookieIOError("disk"), 10)
    other = replace(ledger_metadata(), custom=(("k", "v"),))
    assert len(writer.on_metadata_conflict(other, 1, 11)) == 1
    assert len(writer.on_metadata_conflict(other, 2, 12)) == 1
    only_fail(writer.on_metadata_conflict(other, 3, 13), 1, MetadataError)


# ---------------------------------------------------------------------- fencing and other fatal answers


def test_a_fenced_answer_fails_every_pending_add_and_later_appends_raise():
    writer = new_writer()
    for payload in (b"0", b"1", b"2"):
        writer.append(payload, 0)
    ack_all(writer, 0, ("b0", "b1"))
    only_fail(writer.on_add_error("b2", 1, LedgerFencedError("fenced"), 5), 1, LedgerFencedError)
    assert writer.pending_count == 0 and writer.state is WriterState.FAILED
    assert ack_all(writer, 1, ("b1", "b2")) == []  # outcome stays unknown: nothing completes
    with pytest.raises(LedgerFencedError):
        writer.append(b"3", 6)


@pytest.mark.parametrize("refusal", [UnauthorizedError, AuthenticationError, ForbiddenError, QuotaExceededError])
def test_a_refusal_of_the_writer_fails_every_pending_add_without_an_ensemble_change(refusal):
    """A wrong password, principal or namespace quota: every other bookie would refuse too."""
    writer = new_writer()
    writer.append(b"0", 0)
    only_fail(writer.on_add_error("b0", 0, refusal("refused"), 1), 0, refusal)


def test_a_metadata_answer_arriving_after_the_writer_failed_is_ignored():
    """Regression: the CAS of an ensemble change can land just before a recovery marks the ledger,
    and its (slow) answer then arrives after a fenced add failed the writer. It used to trip an
    invariant (`metadata written while failed`) and crash the driver."""
    writer = started_change()
    [proposal] = writer.on_add_error("b1", 1, BookieIOError("disk"), 10)
    only_fail(writer.on_add_error("b0", 2, LedgerFencedError("fenced"), 11), 1, LedgerFencedError)
    assert writer.on_metadata_written(proposal.metadata, 1, 12) == []
    assert writer.on_metadata_conflict(replace(ledger_metadata(), custom=(("k", "v"),)), 2, 13) == []
    assert writer.state is WriterState.FAILED and writer.lac == 0


# ---------------------------------------------------------------------- A4: explicit LAC


def test_an_idle_writer_sends_its_lac_explicitly_a_bounded_number_of_times():
    writer = new_writer(explicit_lac_interval_ms=100, explicit_lac_repeats=2)
    writer.append(b"x", now_ms=0)
    assert ack_all(writer, 0, ("b0", "b1"), now_ms=5) == [CompleteAdds(0, 0)]
    assert writer.on_tick(99) == []  # nobody has seen LAC 0 yet, but the interval has not passed
    lac_0 = [SendWriteLac("b0", 0), SendWriteLac("b1", 0), SendWriteLac("b2", 0)]
    assert writer.on_tick(100) == lac_0
    assert writer.on_tick(150) == []  # not again within the interval
    assert writer.on_tick(200) == lac_0  # repeated once, in case the first was lost
    assert writer.on_tick(300) == [] and writer.on_tick(10_000) == []  # then quiet


def test_an_explicit_lac_is_repeated_only_to_the_bookies_that_did_not_answer_it():
    """At 1,000 idle-between-entries streams the repeats to every bookie were most of the bookies'
    work: a bookie that answered the WRITE_LAC knows the LAC, only a lost or failed one is sent again."""
    writer = new_writer(explicit_lac_interval_ms=100, explicit_lac_repeats=3)
    writer.append(b"x", now_ms=0)
    ack_all(writer, 0, ("b0", "b1"), now_ms=5)
    assert writer.on_tick(100) == [SendWriteLac(b, 0) for b in ("b0", "b1", "b2")]
    writer.on_write_lac_answered("b0", 0)
    writer.on_write_lac_answered("b2", 0)
    writer.on_write_lac_answered("b1", -1)  # an older LAC's answer says nothing of LAC 0
    assert writer.on_tick(200) == [SendWriteLac("b1", 0)]  # b1's was lost: only b1 again
    writer.on_write_lac_answered("b1", 0)
    assert writer.on_tick(300) == [] and writer.on_tick(400) == []  # everyone knows it: quiet
    # a new LAC starts over: nobody has answered it yet
    writer.append(b"y", now_ms=500)
    ack_all(writer, 1, ("b1", "b2"), now_ms=505)
    assert writer.on_tick(600) == [SendWriteLac(b, 1) for b in ("b0", "b1", "b2")]
    writer.on_write_lac_answered("b0", 0)  # late answer of the old LAC
    assert writer.on_tick(700) == [SendWriteLac(b, 1) for b in ("b0", "b1", "b2")]
    assert writer.on_tick(800) == [SendWriteLac(b, 1) for b in ("b0", "b1", "b2")]
    assert writer.on_tick(900) == []  # repeats stay bounded when nobody answers


def test_an_eager_lac_goes_only_to_the_bookie_the_next_add_does_not_reach():
    """A writer that awaits each write sends its next add before the drained pipeline's LAC is due:
    that add carries the LAC to its write set, so one WRITE_LAC (not three) goes out per write."""
    writer = new_writer(write_quorum=2, eager_lac=True)
    writer.append(b"x", now_ms=0)
    # entry 1 will go to b1 and b2: b0 gets LAC 0 at once, before the caller resumes
    assert ack_all(writer, 0, ("b0", "b1"), now_ms=1) == [CompleteAdds(0, 0), SendWriteLac("b0", 0), LacDueSoon()]
    _, effects = writer.append(b"y", now_ms=1)  # entry 1: b1 and b2, carrying LAC 0
    assert [effect.bookie for effect in effects] == ["b1", "b2"]
    assert writer.on_lac_due(1) == []  # everyone has LAC 0: one WRITE_LAC for this write, not three
    # entry 2 will go to b2 and b0: b1 gets LAC 1 at once; the writer stays idle: b2 and b0 later
    assert ack_all(writer, 1, ("b1", "b2"), now_ms=2) == [CompleteAdds(1, 1), SendWriteLac("b1", 1), LacDueSoon()]
    assert writer.on_lac_due(3) == [SendWriteLac(b, 1) for b in ("b0", "b2")]


def test_an_explicit_lac_is_sent_only_for_a_lac_that_no_add_carried():
    writer = new_writer(explicit_lac_interval_ms=100)
    writer.append(b"x", 0)
    ack_all(writer, 0, ("b0", "b1"))
    writer.append(b"y", 50)  # carries LAC 0 to the bookies: no explicit LAC 0 is needed
    assert writer.on_tick(200) == []
    ack_all(writer, 1, ("b1", "b2"), now_ms=201)
    assert writer.on_tick(251) == [SendWriteLac(b, 1) for b in ("b0", "b1", "b2")]


# ---------------------------------------------------------------------- A10: close


def written_two() -> LedgerWriter:
    writer = new_writer()
    writer.append(b"ab", 0)
    writer.append(b"cde", 0)
    ack_all(writer, 0, ("b0", "b1"))
    ack_all(writer, 1, ("b1", "b2"))
    return writer


def test_close_writes_closed_metadata_with_the_last_entry_and_length():
    writer = written_two()
    closed = ledger_metadata().closed(1, 5)
    assert writer.close() == [WriteMetadata(closed, 0)]
    assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 1 and closed.length == 5
    assert writer.on_metadata_written(closed, 1, 10) == [Finished(closed, 1)]
    with pytest.raises(LedgerClosedError):
        writer.append(b"more", 11)


def test_close_conflicting_with_a_close_at_the_same_entry_succeeds():
    writer = written_two()
    writer.close()
    theirs = ledger_metadata().closed(1, 5)
    assert writer.on_metadata_conflict(theirs, 3, 10) == [Finished(theirs, 3)]


def test_close_conflicting_with_a_close_at_another_entry_fails():
    writer = written_two()
    writer.close()
    effects = writer.on_metadata_conflict(ledger_metadata().closed(4, 20), 3, 10)
    assert len(effects) == 1 and isinstance(effects[0], Finished)
    assert effects[0].metadata is None and isinstance(effects[0].error, LedgerClosedError)


def test_close_conflicting_with_recovery_fails_as_fenced():
    writer = written_two()
    writer.close()
    [finished] = writer.on_metadata_conflict(replace(ledger_metadata(), state=LedgerState.IN_RECOVERY), 1, 10)
    assert isinstance(finished, Finished) and isinstance(finished.error, LedgerFencedError)


def test_close_needs_an_idle_writer():
    writer = new_writer()
    writer.append(b"x", 0)
    with pytest.raises(InvariantError):
        writer.close()


def test_timeouts_are_bookie_failures_not_fatal():
    writer = new_writer()
    writer.append(b"x", 0)
    [effect] = writer.on_add_error("b0", 0, RequestTimeoutError("slow"), 1)
    assert isinstance(effect, WriteMetadata)


def _fail_and_commit(writer: LedgerWriter, bookie: str, entry_id: int, now_ms: int) -> list:
    effects = writer.on_add_error(bookie, entry_id, BookieUnavailableError("down"), now_ms)
    proposals = [e for e in effects if isinstance(e, WriteMetadata)]
    if proposals:
        writer.on_metadata_written(proposals[0].metadata, writer.version + 1, now_ms)
    return effects


@pytest.mark.parametrize("quarantine_ms, second_replacement", [(500, "b0"), (60_000, None)])
def test_a_replaced_bookie_may_serve_again_after_its_quarantine(quarantine_ms, second_replacement):
    writer = new_writer(failed_bookie_quarantine_ms=quarantine_ms)
    writer.append(b"x", now_ms=0)
    _fail_and_commit(writer, "b0", 0, now_ms=0)
    assert writer.ensemble == ("b3", "b1", "b2")  # b3 was the only candidate
    _fail_and_commit(writer, "b1", 0, now_ms=1000)
    if second_replacement is None:  # b0 still quarantined: nobody is left
        assert writer.state is WriterState.FAILED
        assert isinstance(writer.error, NotEnoughBookiesError)
    else:
        assert writer.ensemble == ("b3", "b0", "b2")


def test_an_eager_writer_sends_its_lac_as_soon_as_the_pipeline_drains():
    writer = new_writer(explicit_lac_interval_ms=100, eager_lac=True, explicit_lac_repeats=2)
    writer.append(b"x", now_ms=0)
    writer.append(b"y", now_ms=0)
    assert ack_all(writer, 0, ("b0", "b1"), now_ms=1) == [CompleteAdds(0, 0)]  # entry 1 still pending
    effects = ack_all(writer, 1, ("b1", "b2"), now_ms=2)
    # Qw3: the next entry reaches every bookie, so only the first of entry 1's write set (b1, which
    # a tailing reader long-polls for entry 1) gets it at once ...
    assert effects == [CompleteAdds(1, 1), SendWriteLac("b1", 1), LacDueSoon()]
    assert writer.on_lac_due(2) == [SendWriteLac(b, 1) for b in ("b0", "b2")]  # ... the rest: it stayed idle
    assert writer.on_lac_due(3) == []  # once
    assert writer.on_tick(50) == []  # the repeat waits for the interval
    assert writer.on_tick(102) == [SendWriteLac(b, 1) for b in ("b0", "b1", "b2")]
    assert writer.on_tick(500) == []  # repeats are bounded
