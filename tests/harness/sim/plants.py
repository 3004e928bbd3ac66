"""Bugs planted on purpose, to prove the checker can fail: a checker that never fails proves nothing.

Each plant swaps one pure quorum function the state machines import (the same seam a real
off-by-one would sit in) or turns on a simulation option that breaks an assumption the real system
enforces elsewhere. `planted(name)` applies one for the duration of a `with` block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bookkeeper.protocol import recovery, writer

# name -> (module, attribute, replacement, what it breaks)
PATCHES: dict[str, tuple[Any, str, Any, str]] = {
    "ack-quorum-minus-one": (
        writer, "ack_quorum_reached", lambda acked, ack_quorum: acked >= max(1, ack_quorum - 1),
        "the writer acknowledges an entry one ack short of the ack quorum (A2)"),
    "fencing-after-one-answer": (
        recovery, "fencing_covered", lambda answered, *shape: len(answered) >= 1,
        "recovery counts the ledger fenced after one bookie answered (A7)"),
    "missing-after-one-no-entry": (
        recovery, "entry_missing", lambda no_entry, write_quorum, ack_quorum: no_entry >= 1,
        "recovery ends the ledger at the first 'no such entry' answer (A8)"),
}
# name -> (simulation options, what it breaks)
OPTIONS: dict[str, tuple[dict[str, bool], str]] = {
    "wiped-bookie-rejoins": (
        {"wiped_bookies_rejoin": True},
        "a wiped bookie restarts empty under its old id, as if there were no cookie check (A3)"),
}
NAMES = tuple(PATCHES) + tuple(OPTIONS)


@contextmanager
def planted(name: str | None) -> Iterator[dict[str, bool]]:
    """Apply the plant `name` (None: nothing); yields the simulation options it needs."""
    if name is None:
        yield {}
        return
    if name in OPTIONS:
        yield dict(OPTIONS[name][0])
        return
    module, attribute, replacement, _ = PATCHES[name]
    original = getattr(module, attribute)
    setattr(module, attribute, replacement)
    try:
        yield {}
    finally:
        setattr(module, attribute, original)


def describe(name: str) -> str:
    return PATCHES[name][3] if name in PATCHES else OPTIONS[name][1]
