"""Quorum arithmetic: pure functions of ensemble size E, write quorum Qw and ack quorum Qa.

Entry e of a fragment is stored on the Qw bookies at positions (e + i) mod E, i < Qw (A1), so a
fragment has E distinct write sets. An entry is acknowledged by Qa of its write set (A2). To be sure
no writer can still complete an add, enough bookies of *every* write set must be fenced that fewer
than Qa unfenced ones remain: Qw - Qa + 1 of them (A7). The same count of "no such entry" answers
proves an entry was never acknowledged (A8).
"""

from __future__ import annotations

from collections.abc import Collection


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """Ensemble positions that store entry `entry_id`, in the order a reader should try them."""
    start = entry_id % ensemble_size
    return tuple((start + offset) % ensemble_size for offset in range(write_quorum))


def ack_quorum_reached(acknowledged: int, ack_quorum: int) -> bool:
    return acknowledged >= ack_quorum


def coverage_count(write_quorum: int, ack_quorum: int) -> int:
    """Answers needed from one write set to rule out an ack quorum among the rest: Qw - Qa + 1."""
    return write_quorum - ack_quorum + 1


def fencing_covered(answered: Collection[int], ensemble_size: int, write_quorum: int,
                    ack_quorum: int) -> bool:
    """True once every write set has at least Qw - Qa + 1 answered positions (A7)."""
    needed = coverage_count(write_quorum, ack_quorum)
    return all(
        sum(1 for position in write_set(start, ensemble_size, write_quorum) if position in answered)
        >= needed
        for start in range(ensemble_size))


def fencing_impossible(failed: Collection[int], ensemble_size: int, write_quorum: int,
                       ack_quorum: int) -> bool:
    """True when some write set has too many failed positions for fencing ever to be covered."""
    needed = coverage_count(write_quorum, ack_quorum)
    return any(
        sum(1 for position in write_set(start, ensemble_size, write_quorum) if position not in failed)
        < needed
        for start in range(ensemble_size))


def entry_missing(no_entry_answers: int, write_quorum: int, ack_quorum: int) -> bool:
    """A8: this many 'no such entry' answers from one write set prove it was never acknowledged."""
    return no_entry_answers >= coverage_count(write_quorum, ack_quorum)
