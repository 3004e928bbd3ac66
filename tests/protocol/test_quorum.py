"""Quorum arithmetic matches A1, A2, A7 and A8, table by table."""

from __future__ import annotations

import itertools

import pytest

from bookkeeper.errors import ConfigError
from bookkeeper.protocol.metadata import check_quorum
from bookkeeper.protocol.quorum import (
    ack_quorum_reached,
    coverage_count,
    entry_missing,
    fencing_covered,
    fencing_impossible,
    write_set,
)


@pytest.mark.parametrize("entry_id, ensemble, write_quorum, expected", [
    (0, 3, 2, (0, 1)), (1, 3, 2, (1, 2)), (2, 3, 2, (2, 0)), (3, 3, 2, (0, 1)),
    (0, 4, 3, (0, 1, 2)), (1, 4, 3, (1, 2, 3)), (2, 4, 3, (2, 3, 0)), (3, 4, 3, (3, 0, 1)),
    (7, 5, 5, (2, 3, 4, 0, 1)), (9, 1, 1, (0,)),
])
def test_write_sets_stripe_across_the_ensemble(entry_id, ensemble, write_quorum, expected):
    assert write_set(entry_id, ensemble, write_quorum) == expected


@pytest.mark.parametrize("ensemble, write_quorum, ack_quorum, ok", [
    (3, 2, 2, True), (3, 3, 2, True), (1, 1, 1, True), (5, 3, 1, True),
    (2, 3, 2, False), (3, 2, 3, False), (3, 2, 0, False), (0, 0, 0, False),
])
def test_only_sane_quorum_shapes_are_accepted(ensemble, write_quorum, ack_quorum, ok):
    if ok:
        check_quorum(ensemble, write_quorum, ack_quorum)
    else:
        with pytest.raises(ConfigError, match="ensemble >= write quorum >= ack quorum >= 1"):
            check_quorum(ensemble, write_quorum, ack_quorum)


@pytest.mark.parametrize("acked, ack_quorum, reached", [(0, 2, False), (1, 2, False), (2, 2, True),
                                                        (3, 2, True), (1, 1, True)])
def test_ack_quorum(acked, ack_quorum, reached):
    assert ack_quorum_reached(acked, ack_quorum) is reached


@pytest.mark.parametrize("ensemble, write_quorum, ack_quorum, answered, covered", [
    (3, 2, 2, {0}, False),  # write set {1,2} has no answer
    (3, 2, 2, {0, 1}, True),  # every pair {0,1},{1,2},{2,0} has one
    (3, 3, 2, {0, 1}, True),  # Qw-Qa+1 = 2 of the one write set {0,1,2}
    (3, 3, 2, {0}, False),
    (4, 3, 2, {0, 1, 2}, True),  # sets {0,1,2},{1,2,3},{2,3,0},{3,0,1} each have >= 2
    (4, 3, 2, {0, 2}, False),  # {1,2,3} has only one answer
    (3, 2, 1, {0, 1}, False),  # Qa=1: need both of every pair
    (3, 2, 1, {0, 1, 2}, True),
])
def test_fencing_coverage(ensemble, write_quorum, ack_quorum, answered, covered):
    assert fencing_covered(answered, ensemble, write_quorum, ack_quorum) is covered


def test_coverage_and_impossibility_are_complementary_when_everyone_has_answered_or_failed():
    for ensemble, write_quorum, ack_quorum in [(3, 2, 2), (4, 3, 2), (5, 3, 1), (3, 3, 3)]:
        positions = range(ensemble)
        for size in range(ensemble + 1):
            for answered in itertools.combinations(positions, size):
                failed = set(positions) - set(answered)
                assert fencing_covered(set(answered), ensemble, write_quorum, ack_quorum) is not \
                    fencing_impossible(failed, ensemble, write_quorum, ack_quorum)


@pytest.mark.parametrize("write_quorum, ack_quorum, no_entry, missing", [
    (2, 2, 1, True), (3, 2, 1, False), (3, 2, 2, True), (3, 1, 2, False), (3, 1, 3, True)])
def test_entry_missing_needs_qw_minus_qa_plus_one_answers(write_quorum, ack_quorum, no_entry, missing):
    assert coverage_count(write_quorum, ack_quorum) == write_quorum - ack_quorum + 1
    assert entry_missing(no_entry, write_quorum, ack_quorum) is missing
