"""Auto-recovery's decisions (R1-R3), table by table: which bookies are lost, which fragments a mark
asks to repair and how, which replacement is chosen, what a replica check concludes."""

from __future__ import annotations

import random

import pytest

from bookkeeper.autorecovery.policy import (
    BookieWatch,
    Fragment,
    Mark,
    Missing,
    Reason,
    ReplicaState,
    StepKind,
    choose_replacement,
    decommission_refusal,
    entry_verdict,
    fragments,
    missing_from,
    neighbour_positions,
    plan_repair,
    resolved_bookies,
    swap_allowed,
    swap_bookie,
)
from bookkeeper.errors import CorruptMetadataError, NotEnoughBookiesError
from bookkeeper.meta.store import BookieInfo
from bookkeeper.protocol.metadata import LedgerMetadata, LedgerState

GRACE_MS = 30_000


def ledger(ensembles, state=LedgerState.CLOSED, last=99, e=3, qw=2, qa=2) -> LedgerMetadata:
    return LedgerMetadata(e, qw, qa, tuple((first, tuple(b)) for first, b in ensembles), state=state,
                          last_entry_id=last if state is LedgerState.CLOSED else -1)


TWO_FRAGMENTS = [(0, "abc"), (50, "abd")]


# ---------------------------------------------------------------------------------- fragments


@pytest.mark.parametrize("ensembles, state, last, expected", [
    ([(0, "abc")], LedgerState.CLOSED, 99, [(0, 99, "abc")]),
    ([(0, "abc")], LedgerState.CLOSED, -1, [(0, -1, "abc")]),  # empty: still names its bookies
    (TWO_FRAGMENTS, LedgerState.CLOSED, 99, [(0, 49, "abc"), (50, 99, "abd")]),
    (TWO_FRAGMENTS, LedgerState.OPEN, None, [(0, 49, "abc"), (50, None, "abd")]),
    (TWO_FRAGMENTS, LedgerState.IN_RECOVERY, None, [(0, 49, "abc"), (50, None, "abd")]),
    ([(0, "abc"), (50, "abd"), (80, "dbc")], LedgerState.CLOSED, 60,  # one past the end: named by none
     [(0, 49, "abc"), (50, 60, "abd")]),
])
def test_fragments_hold_the_entries_up_to_the_next_one_or_the_end(ensembles, state, last, expected):
    got = fragments(ledger(ensembles, state, last if last is not None else -1))
    assert [(f.first_entry_id, f.last_entry_id, "".join(f.bookies)) for f in got] == expected


@pytest.mark.parametrize("first, last, position, e, qw, expected", [
    (0, 5, 0, 3, 2, [0, 2, 3, 5]),  # write sets (0,1) (1,2) (2,0): position 0 has e%3 in {0, 2}
    (0, 5, 1, 3, 2, [0, 1, 3, 4]),
    (0, 5, 2, 3, 3, [0, 1, 2, 3, 4, 5]),  # Qw = E: every bookie holds every entry
    (4, 7, 3, 4, 2, [6, 7]),  # absolute entry ids choose the write set, not offsets in the fragment
    (3, 2, 0, 3, 2, []),  # empty fragment
    (0, 0, 1, 3, 2, [0]),  # one entry, ending at entry 0 (0 is not "no end")
    (0, 0, 2, 3, 2, []),
])
def test_entries_at_a_position_follow_the_write_sets(first, last, position, e, qw, expected):
    fragment = Fragment(first, last, tuple("abcd"[:e]))
    assert list(fragment.entries_at(position, qw)) == expected
    assert fragment.count_at(position, qw) == len(expected)


@pytest.mark.parametrize("position, e, qw, expected", [
    (0, 3, 2, {1, 2}), (1, 4, 2, {0, 2}), (0, 5, 3, {1, 2, 3, 4}), (2, 3, 1, set()), (0, 3, 3, {1, 2}),
])
def test_neighbours_are_the_positions_sharing_a_write_set(position, e, qw, expected):
    assert neighbour_positions(position, e, qw) == expected


# ---------------------------------------------------------------------------------- lost bookies


def test_a_bookie_is_lost_only_after_the_delay_and_one_back_in_time_triggers_nothing():
    watch = BookieWatch()
    watch.observe(registered={"a", "b", "c"}, known={"a", "b", "c"}, now_ms=0)
    assert watch.lost(0, 60_000) == set() and watch.next_loss_ms(0, 60_000) is None
    watch.observe(registered={"a", "b"}, known={"a", "b", "c"}, now_ms=1_000)  # c goes
    assert watch.lost(60_999, 60_000) == set()
    assert watch.next_loss_ms(2_000, 60_000) == 61_000
    watch.observe(registered={"a", "b"}, known={"a", "b", "c"}, now_ms=30_000)  # still gone: same since
    assert watch.lost(61_000, 60_000) == {"c"}
    watch.observe(registered={"a", "b", "c"}, known={"a", "b", "c"}, now_ms=61_500)  # back
    assert watch.lost(200_000, 60_000) == set()


@pytest.mark.parametrize("delay_ms, at_ms, lost", [(0, 1_000, {"c"}), (5_000, 5_999, set()),
                                                    (5_000, 6_000, {"c"})])
def test_a_delay_of_zero_means_at_once(delay_ms, at_ms, lost):
    watch = BookieWatch()
    watch.observe(registered={"a"}, known={"a", "c"}, now_ms=1_000)
    assert watch.lost(at_ms, delay_ms) == lost


def test_bookies_only_named_by_ledgers_count_as_gone_and_can_be_forgotten():
    watch = BookieWatch()
    watch.observe(registered={"a"}, known={"a"}, now_ms=0)
    watch.referenced({"a", "x"}, now_ms=10)
    assert watch.lost(10, 0) == {"x"}
    watch.forget({"x"})
    assert watch.lost(10, 0) == set()


def test_a_mark_names_the_lost_bookies_its_ledger_uses():
    metadata = ledger(TWO_FRAGMENTS)
    assert missing_from(metadata, {"d", "z"}, Reason.LOST, 5) == [Missing("d", Reason.LOST, 5)]
    assert missing_from(metadata, {"z"}, Reason.LOST, 5) == []


# ---------------------------------------------------------------------------------- marks


def test_marks_round_trip_merge_and_refuse_garbage():
    mark = Mark(7, (Missing("b", Reason.LOST, 1),), 1).with_target(0, "b", "e")
    assert Mark.from_bytes(mark.to_bytes()) == mark
    merged = mark.merged([Missing("b", Reason.DAMAGED, 9), Missing("c", Reason.DECOMMISSION, 9)])
    assert [(m.bookie, m.reason) for m in merged.missing] == [("b", Reason.LOST), ("c", Reason.DECOMMISSION)]
    assert merged.target_for(0, "b") == "e" and merged.target_for(50, "b") is None
    assert merged.without(["b"]).bookies == ["c"] and merged.without(["b"]).targets == ()
    for garbage in (b"", b"[]", b'{"format": 2}', b'{"format": 1, "ledger": 1}'):
        with pytest.raises(CorruptMetadataError, match="mark is malformed"):
            Mark.from_bytes(garbage)


# ---------------------------------------------------------------------------------- repair plans


def mark_of(*missing: tuple[str, Reason, int]) -> Mark:
    return Mark(1, tuple(Missing(*item) for item in missing), 0)


def kinds(steps):
    return [(s.kind, s.bookie, s.fragment.first_entry_id if s.fragment else None, s.position) for s in steps]


@pytest.mark.parametrize("ensembles, state, mark, registered, now_ms, expected", [
    # a closed ledger: every fragment naming the lost bookie is replaced
    (TWO_FRAGMENTS, LedgerState.CLOSED, mark_of(("b", Reason.LOST, 0)), "acd", 0,
     [(StepKind.REPLACE, "b", 0, 1), (StepKind.REPLACE, "b", 50, 1)]),
    (TWO_FRAGMENTS, LedgerState.CLOSED, mark_of(("d", Reason.LOST, 0)), "abc", 0,
     [(StepKind.REPLACE, "d", 50, 2)]),
    # a lost bookie that registered again has its data (its cookie matched): nothing to do
    (TWO_FRAGMENTS, LedgerState.CLOSED, mark_of(("b", Reason.LOST, 0)), "abcd", 0, []),
    # an open ledger: closed fragments at once, its last one waits for the writer, then recovery
    (TWO_FRAGMENTS, LedgerState.OPEN, mark_of(("c", Reason.LOST, 0)), "abd", 0,
     [(StepKind.REPLACE, "c", 0, 2)]),
    (TWO_FRAGMENTS, LedgerState.OPEN, mark_of(("d", Reason.LOST, 1_000)), "abc", 1_000 + GRACE_MS - 1,
     [(StepKind.WAIT, "", None, -1)]),
    (TWO_FRAGMENTS, LedgerState.OPEN, mark_of(("d", Reason.LOST, 1_000)), "abc", 1_000 + GRACE_MS,
     [(StepKind.RECOVER, "d", None, -1)]),
    (TWO_FRAGMENTS, LedgerState.OPEN, mark_of(("b", Reason.LOST, 0)), "acd", 5,
     [(StepKind.REPLACE, "b", 0, 1), (StepKind.WAIT, "", None, -1)]),
    # in recovery: no swap may race recovery's close; wait, then recover it ourselves
    (TWO_FRAGMENTS, LedgerState.IN_RECOVERY, mark_of(("c", Reason.LOST, 0)), "abd", 5,
     [(StepKind.WAIT, "", None, -1)]),
    (TWO_FRAGMENTS, LedgerState.IN_RECOVERY, mark_of(("c", Reason.LOST, 0)), "abd", GRACE_MS,
     [(StepKind.RECOVER, "c", None, -1)]),
    # damaged replicas of a registered bookie are written back in place, even in recovery
    (TWO_FRAGMENTS, LedgerState.IN_RECOVERY, mark_of(("a", Reason.DAMAGED, 0)), "abcd", 5,
     [(StepKind.REPAIR, "a", 0, 0), (StepKind.WAIT, "", None, -1)]),
    (TWO_FRAGMENTS, LedgerState.CLOSED, mark_of(("a", Reason.DAMAGED, 0)), "abcd", 5,
     [(StepKind.REPAIR, "a", 0, 0), (StepKind.REPAIR, "a", 50, 0)]),
    # ... and replaced when it is gone too
    (TWO_FRAGMENTS, LedgerState.CLOSED, mark_of(("a", Reason.DAMAGED, 0)), "bcd", 5,
     [(StepKind.REPLACE, "a", 0, 0), (StepKind.REPLACE, "a", 50, 0)]),
    # a bookie being decommissioned is replaced although it is registered
    (TWO_FRAGMENTS, LedgerState.CLOSED, mark_of(("d", Reason.DECOMMISSION, 0)), "abcde", 5,
     [(StepKind.REPLACE, "d", 50, 2)]),
])
def test_plans(ensembles, state, mark, registered, now_ms, expected):
    steps = plan_repair(ledger(ensembles, state), mark, set(registered), now_ms, GRACE_MS)
    assert kinds(steps) == expected


def test_a_decommissioned_bookie_may_be_read_from_and_a_lost_one_not():
    metadata = ledger(TWO_FRAGMENTS)
    (step,) = plan_repair(metadata, mark_of(("d", Reason.DECOMMISSION, 0)), "abcde", 0, GRACE_MS)
    assert step.source_too
    (step,) = plan_repair(metadata, mark_of(("d", Reason.LOST, 0)), "abce", 0, GRACE_MS)
    assert not step.source_too


def test_resolved_bookies_are_no_longer_named_or_came_back():
    metadata = ledger([(0, "aec"), (50, "abd")])
    mark = mark_of(("c", Reason.LOST, 0), ("d", Reason.LOST, 0), ("z", Reason.DAMAGED, 0))
    assert resolved_bookies(metadata, mark, {"a", "b", "d", "e"}) == ["d", "z"]


@pytest.mark.parametrize("first, old, new, expected", [
    (50, "d", "e", [(0, "abc"), (50, "abe")]),
    (0, "b", "e", [(0, "aec"), (50, "abd")]),
    (50, "c", "e", None),  # not in that fragment (someone else swapped it already)
    (50, "d", "a", None),  # the replacement is already a member
    (70, "d", "e", None),  # no such fragment
])
def test_a_swap_changes_one_fragment_of_what_the_store_holds(first, old, new, expected):
    swapped = swap_bookie(ledger(TWO_FRAGMENTS), first, old, new)
    if expected is None:
        assert swapped is None
    else:
        assert swapped is not None
        assert [(f, "".join(b)) for f, b in swapped.ensembles] == expected


@pytest.mark.parametrize("state, first, allowed", [
    (LedgerState.CLOSED, 50, True), (LedgerState.OPEN, 0, True), (LedgerState.OPEN, 50, False),
    (LedgerState.IN_RECOVERY, 0, False),
])
def test_swaps_only_touch_fragments_whose_entries_are_fixed(state, first, allowed):
    assert swap_allowed(ledger(TWO_FRAGMENTS, state), first) is allowed


# ---------------------------------------------------------------------------------- placement


def infos(spec: str) -> list[BookieInfo]:
    """'a:r1 b:r2 c:ro' -> bookies with racks ('ro': read-only, no rack)."""
    result = []
    for item in spec.split():
        name, _, rack = item.partition(":")
        result.append(BookieInfo(name, name, state="read_only" if rack == "ro" else "writable",
                                 rack=rack if rack and rack != "ro" else None))
    return result


@pytest.mark.parametrize("spec, ensemble, position, qw, allowed", [
    ("a b c d e", "abc", 1, 2, {"d", "e"}),  # never a member of the ensemble
    ("a b c d e:ro", "abc", 1, 2, {"d"}),  # never a read-only bookie
    # racks: b's neighbours a (r1) and c (r2); prefer a rack neither uses
    ("a:r1 b:r3 c:r2 d:r1 e:r2 f:r3", "abc", 1, 2, {"f"}),
    # no bookie on another rack: any writable one will do
    ("a:r1 b:r2 c:r2 d:r1 e:r2", "abc", 1, 2, {"d", "e"}),
])
def test_the_replacement_is_writable_outside_the_ensemble_and_rack_aware(spec, ensemble, position, qw, allowed):
    chosen = {choose_replacement(infos(spec), tuple(ensemble), position, qw, random.Random(seed))
              for seed in range(40)}
    assert chosen == allowed


def test_no_replacement_is_a_clear_error():
    with pytest.raises(NotEnoughBookiesError, match="no writable bookie outside the ensemble a, b, c"):
        choose_replacement(infos("a b c d:ro"), ("a", "b", "c"), 0, 2, random.Random(1))


@pytest.mark.parametrize("writable, sizes, refused", [
    ("abcd", [3, 3], False), ("abc", [3], True), ("abcd", [4], True), ("abc", [], False),
    ("abcd", [2, 3], False),
])
def test_decommission_refuses_to_go_below_an_ensemble_in_use(writable, sizes, refused):
    reason = decommission_refusal("a", set(writable), sizes)
    assert (reason is not None) is refused
    if refused:
        listed = reason.split("(")[1].split(")")[0].split(", ")
        assert "fewer than the ensemble size" in reason and "a" not in listed


# ---------------------------------------------------------------------------------- replica checks

OK, ABSENT, DAMAGED, GONE = (ReplicaState.OK, ReplicaState.ABSENT, ReplicaState.DAMAGED,
                             ReplicaState.UNREACHABLE)


@pytest.mark.parametrize("observations, bad, lost, unknown", [
    ({"a": (OK, 1), "b": (OK, 1)}, set(), False, False),
    ({"a": (OK, 1), "b": (ABSENT, 0)}, {"b"}, False, False),
    ({"a": (DAMAGED, 0), "b": (OK, 1), "c": (OK, 1)}, {"a"}, False, False),
    ({"a": (OK, 1), "b": (OK, 2), "c": (OK, 1)}, {"b"}, False, False),  # minority checksum
    ({"a": (OK, 1), "b": (OK, 2)}, set(), False, True),  # a tie: no majority to trust
    ({"a": (ABSENT, 0), "b": (DAMAGED, 0)}, {"a", "b"}, True, False),  # nothing good left
    ({"a": (GONE, 0), "b": (OK, 1)}, set(), False, False),  # no answer says nothing
    ({"a": (GONE, 0), "b": (DAMAGED, 0)}, {"b"}, False, False),  # a's copy may be good: not lost
    ({"a": (GONE, 0), "b": (GONE, 0)}, set(), False, False),
])
def test_replica_check_verdicts(observations, bad, lost, unknown):
    verdict = entry_verdict(observations)
    assert (set(verdict.bad), verdict.lost, verdict.unknown) == (bad, lost, unknown)
