"""Bugs planted on purpose, to prove the checker can fail: a checker that never fails proves nothing.

Each plant swaps one function of the shipped code (the same seam a real bug would sit in): a pure
quorum function the state machines import, or the bookie's step that journals accepted adds and
answers after the fsync; or it turns on a simulation option that breaks an assumption the real
system enforces elsewhere. `planted(name)` applies one for the duration of a `with` block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bookkeeper.bookie.adds import AddHandlers
from bookkeeper.protocol import recovery, writer
from bookkeeper.protocol.wire import Status


def _answer_before_the_fsync(core: Any, records: list[bytes], reply: Any, answer: bytes) -> None:
    reply.send(answer)
    reply.request_done()
    for record in records:
        core.journal.append(record, lambda _: None, None)


def _stored_refusal_uncaught(core: Any, group: Any, entry_id: int, packed_entry: bytes,
                             accepted: dict[int, bytes]) -> Any:
    earlier = accepted.get(entry_id)
    if earlier is None:
        earlier = core.storage.get_entry(group.ledger_id, entry_id)  # BookieIOError escapes
    if earlier is not None and earlier != packed_entry:
        return Status.ENTRY_EXISTS, f"entry {group.ledger_id}:{entry_id} is stored with different bytes"
    return None


# name -> (module or class, attribute, replacement, what it breaks)
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
    "ack-before-fsync": (
        AddHandlers, "journal_adds", _answer_before_the_fsync,
        "the bookie acknowledges an add before the journal's fsync covers it (A2)"),
    "damaged-entry-uncaught": (
        AddHandlers, "_stored_refusal", _stored_refusal_uncaught,
        "an add of an entry stored damaged lets the read error out of the bookie's handler, as "
        "ADD_BATCH did before the one ADD route (issue 21)"),
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
