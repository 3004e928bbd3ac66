"""The decisions of auto-recovery, as pure functions of metadata, bookies and times.

Theory of operation. A ledger's fragments (`fragments`) each name E bookies; entry e of a fragment
lives on the write set `write_set(e)` of its ensemble (A1). A bookie that is gone (not registered)
for longer than the recovery delay is *lost* (`BookieWatch`); every ledger with a fragment on it
is *under-replicated* and gets a mark naming the bookie, why, and since when (`Missing`).
A worker turns a mark into steps (`plan_repair`):

  REPLACE     copy the fragment's entries of the bookie's position from the other members of
              each write set to a replacement (`choose_replacement`), then swap it in by
              compare-and-set. Only for fragments that are closed: every fragment of a CLOSED
              ledger, every fragment but the last of an OPEN one (its end is fixed: the next
              fragment starts at the LAC of the ensemble change + 1).
  REPAIR      the bookie is registered but a replica check found entries of it absent or damaged:
              write those entries back to it from a good replica (no metadata change).
  RECOVER     the last fragment of an OPEN ledger, or any fragment of one IN_RECOVERY, names the
              bookie and the open-ledger grace period has passed: fence and close the ledger
              first (its writer is presumed gone), then plan again.
  WAIT        the same before the grace period has passed: the writer may still change ensemble
              by itself.

A replica check compares, entry by entry, what each write-set member answers (`entry_verdict`).
Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import enum
import json
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from bookkeeper.errors import CorruptMetadataError, NotEnoughBookiesError
from bookkeeper.meta.store import BookieInfo
from bookkeeper.protocol.metadata import LedgerMetadata, LedgerState
from bookkeeper.protocol.quorum import write_set

MARK_FORMAT = 1

# ---------------------------------------------------------------------------------- fragments


@dataclass(frozen=True, slots=True)
class Fragment:
    """One ensemble of a ledger and the entries it holds. `last_entry_id` is None for the last
    fragment of a ledger that is not closed (its writer may still add to it)."""

    first_entry_id: int
    last_entry_id: int | None
    bookies: tuple[str, ...]

    @property
    def is_closed(self) -> bool:
        return self.last_entry_id is not None

    @property
    def entry_count(self) -> int:
        if self.last_entry_id is None:
            raise ValueError("an open fragment has no entry count yet")
        return max(0, self.last_entry_id - self.first_entry_id + 1)

    def entries_at(self, position: int, write_quorum: int) -> Iterator[int]:
        """Entry ids of this (closed) fragment stored at ensemble `position`."""
        if self.last_entry_id is None:
            raise ValueError("an open fragment's entries are not fixed yet")
        size = len(self.bookies)
        for entry_id in range(self.first_entry_id, self.last_entry_id + 1):
            if position in write_set(entry_id, size, write_quorum):
                yield entry_id

    def count_at(self, position: int, write_quorum: int) -> int:
        return sum(1 for _ in self.entries_at(position, write_quorum))


def fragments(metadata: LedgerMetadata) -> list[Fragment]:
    """Every fragment with the range of entries it holds (an empty closed ledger keeps its first
    fragment, with no entries, so its bookies still count as named by it)."""
    closed = metadata.state is LedgerState.CLOSED
    result = []
    for index, (first, bookies) in enumerate(metadata.ensembles):
        if index + 1 < len(metadata.ensembles):
            before_next = metadata.ensembles[index + 1][0] - 1
            last: int | None = min(before_next, metadata.last_entry_id) if closed else before_next
        else:
            last = metadata.last_entry_id if closed else None
        if index > 0 and last is not None and last < first:
            continue  # a fragment past a closed ledger's end holds nothing and names no one
        result.append(Fragment(first, last, tuple(bookies)))
    return result


def bookies_named(metadata: LedgerMetadata) -> set[str]:
    return {bookie for fragment in fragments(metadata) for bookie in fragment.bookies}


def neighbour_positions(position: int, ensemble_size: int, write_quorum: int) -> set[int]:
    """Positions that share a write set with `position` (their bookies hold its entries' copies)."""
    return {member for start in range(ensemble_size)
            if position in (members := write_set(start, ensemble_size, write_quorum))
            for member in members} - {position}


# ---------------------------------------------------------------------------------- lost bookies


class BookieWatch:
    """Which bookies are lost: gone (known but not registered) for at least the recovery delay.

    Known bookies are those with a cookie, those seen registered, and those a ledger's metadata
    names. A bookie that registers again is no longer gone, whatever happened before: a bookie
    back within the delay triggers nothing (R1)."""

    def __init__(self) -> None:
        self.registered: set[str] = set()
        self.gone_since_ms: dict[str, int] = {}

    def observe(self, registered: Iterable[str], known: Iterable[str], now_ms: int) -> None:
        self.registered = set(registered)
        for bookie in self.registered:
            self.gone_since_ms.pop(bookie, None)
        for bookie in set(known) - self.registered:
            self.gone_since_ms.setdefault(bookie, now_ms)

    def referenced(self, bookies: Iterable[str], now_ms: int) -> None:
        """A ledger names these bookies: one that is not registered is gone from now on."""
        for bookie in set(bookies) - self.registered:
            self.gone_since_ms.setdefault(bookie, now_ms)

    def forget(self, bookies: Iterable[str]) -> None:
        """Bookies neither registered, nor with a cookie, nor named by any ledger any more."""
        for bookie in bookies:
            self.gone_since_ms.pop(bookie, None)

    def lost(self, now_ms: int, delay_ms: int) -> set[str]:
        return {bookie for bookie, since in self.gone_since_ms.items() if now_ms - since >= delay_ms}

    def next_loss_ms(self, now_ms: int, delay_ms: int) -> int | None:
        """When the next gone bookie becomes lost (None: none is waiting out the delay)."""
        pending = [since + delay_ms for since in self.gone_since_ms.values() if now_ms - since < delay_ms]
        return min(pending) if pending else None


# ---------------------------------------------------------------------------------- marks


class Reason(enum.Enum):
    LOST = "lost"  # gone for longer than the recovery delay: replace it
    DECOMMISSION = "decommission"  # being retired by an operator: replace it (it may still serve)
    DAMAGED = "damaged"  # registered, but a replica check found entries absent or damaged on it


@dataclass(frozen=True, slots=True)
class Missing:
    bookie: str
    reason: Reason
    since_ms: int


@dataclass(frozen=True, slots=True)
class Mark:
    """A ledger's under-replication record. `targets` are replacements a worker chose, kept so a
    worker that dies mid-copy is succeeded by one that reuses them (its copies are not wasted)."""

    ledger_id: int
    missing: tuple[Missing, ...]
    ctime_ms: int
    targets: tuple[tuple[int, str, str], ...] = ()  # (fragment first entry, bookie, replacement)
    error: str = ""  # what stopped the last worker, for operators
    progress: Mapping[str, int] = field(default_factory=dict)  # copied_entries, total_entries

    @property
    def bookies(self) -> list[str]:
        return sorted({item.bookie for item in self.missing})

    def merged(self, more: Iterable[Missing]) -> Mark:
        """Add bookies not already named (a bookie keeps its first reason and time)."""
        known = {item.bookie for item in self.missing}
        added = tuple(item for item in more if item.bookie not in known)
        return replace(self, missing=self.missing + added) if added else self

    def without(self, bookies: Iterable[str]) -> Mark:
        gone = set(bookies)
        return replace(self, missing=tuple(m for m in self.missing if m.bookie not in gone),
                       targets=tuple(t for t in self.targets if t[1] not in gone))

    def target_for(self, first_entry_id: int, bookie: str) -> str | None:
        for first, old, new in self.targets:
            if (first, old) == (first_entry_id, bookie):
                return new
        return None

    def with_target(self, first_entry_id: int, bookie: str, replacement: str) -> Mark:
        kept = tuple(t for t in self.targets if (t[0], t[1]) != (first_entry_id, bookie))
        return replace(self, targets=kept + ((first_entry_id, bookie, replacement),))

    def to_json(self) -> dict[str, object]:
        return {"format": MARK_FORMAT, "ledger": self.ledger_id, "ctime_ms": self.ctime_ms,
                "missing": [{"bookie": m.bookie, "reason": m.reason.value, "since_ms": m.since_ms}
                            for m in self.missing],
                "targets": [list(target) for target in self.targets], "error": self.error,
                "progress": dict(self.progress)}

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Mark:
        try:
            document = json.loads(data)
            if document.get("format") != MARK_FORMAT:
                raise ValueError(f"format {document.get('format')!r} (this code reads {MARK_FORMAT})")
            return cls(int(document["ledger"]),
                       tuple(Missing(str(m["bookie"]), Reason(m["reason"]), int(m["since_ms"]))
                             for m in document["missing"]),
                       int(document["ctime_ms"]),
                       tuple((int(first), str(old), str(new)) for first, old, new in document["targets"]),
                       str(document.get("error", "")),
                       {str(k): int(v) for k, v in dict(document.get("progress", {})).items()})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptMetadataError(f"under-replication mark is malformed: {exc!r}") from exc


def missing_from(metadata: LedgerMetadata, lost: Iterable[str], reason: Reason,
                 now_ms: int) -> list[Missing]:
    """The lost bookies this ledger's fragments name: what a mark for it must say."""
    named = bookies_named(metadata)
    return [Missing(bookie, reason, now_ms) for bookie in sorted(set(lost) & named)]


# ---------------------------------------------------------------------------------- repair plans


class StepKind(enum.Enum):
    REPLACE = "replace"
    REPAIR = "repair"
    RECOVER = "recover"
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    bookie: str = ""
    fragment: Fragment | None = None
    position: int = -1
    until_ms: int = 0  # WAIT: when the grace period ends
    source_too: bool = False  # REPLACE: the old bookie still serves and may be read from


def plan_repair(metadata: LedgerMetadata, mark: Mark, registered: Iterable[str], now_ms: int,
                grace_ms: int) -> list[Step]:
    """What a worker holding the ledger's lock must do next; [] means the mark is resolved.

    RECOVER comes alone (plan again after it); otherwise every REPLACE and REPAIR that can be
    done now, then at most one WAIT for what must wait out the grace period."""
    live = set(registered)
    not_closed = metadata.state is not LedgerState.CLOSED
    steps: list[Step] = []
    wait_until: int | None = None
    for item in mark.missing:
        in_place = item.reason is Reason.DAMAGED and item.bookie in live
        if item.reason is Reason.LOST and item.bookie in live:
            continue  # it came back (with its cookie, so with its data): nothing is missing
        for fragment in fragments(metadata):
            if item.bookie not in fragment.bookies:
                continue
            position = fragment.bookies.index(item.bookie)
            touches_metadata = not in_place
            must_wait = (not fragment.is_closed
                         or (touches_metadata and metadata.state is LedgerState.IN_RECOVERY))
            if must_wait:
                if now_ms - item.since_ms >= grace_ms:
                    return [Step(StepKind.RECOVER, item.bookie)]
                wait_until = min(wait_until or item.since_ms + grace_ms, item.since_ms + grace_ms)
                continue
            kind = StepKind.REPAIR if in_place else StepKind.REPLACE
            steps.append(Step(kind, item.bookie, fragment, position,
                              source_too=item.reason is not Reason.LOST and item.bookie in live))
    if wait_until is not None and not_closed:
        steps.append(Step(StepKind.WAIT, until_ms=wait_until))
    return steps


def resolved_bookies(metadata: LedgerMetadata, mark: Mark, registered: Iterable[str]) -> list[str]:
    """Bookies of the mark that need nothing more: no longer named by the ledger, or (lost) back."""
    named, live = bookies_named(metadata), set(registered)
    return [m.bookie for m in mark.missing
            if m.bookie not in named or (m.reason is Reason.LOST and m.bookie in live)]


def swap_bookie(metadata: LedgerMetadata, first_entry_id: int, old: str,
                new: str) -> LedgerMetadata | None:
    """The metadata with `old` replaced by `new` in the fragment starting at `first_entry_id`;
    None when that fragment no longer names `old` there (someone else repaired it, or it is gone).
    Applied to whatever the store holds now, so a concurrent writer's change is kept."""
    ensembles = list(metadata.ensembles)
    for index, (first, bookies) in enumerate(ensembles):
        if first != first_entry_id:
            continue
        if old not in bookies or new in bookies:
            return None
        ensembles[index] = (first, tuple(new if bookie == old else bookie for bookie in bookies))
        return replace(metadata, ensembles=tuple(ensembles))
    return None


def swap_allowed(metadata: LedgerMetadata, first_entry_id: int) -> bool:
    """A swap may only change a fragment whose entries are fixed: in a CLOSED ledger, or a fragment
    that is not the last of an OPEN one. Never while IN_RECOVERY: recovery's close rewrites the
    ensembles it read and would undo the swap."""
    if metadata.state is LedgerState.CLOSED:
        return True
    if metadata.state is LedgerState.IN_RECOVERY:
        return False
    return any(first > first_entry_id for first, _ in metadata.ensembles)


# ---------------------------------------------------------------------------------- placement


def choose_replacement(candidates: Iterable[BookieInfo], ensemble: Sequence[str], position: int,
                       write_quorum: int, rng: random.Random,
                       exclude: Iterable[str] = ()) -> str:
    """A writable bookie for `ensemble[position]`: never one already in the ensemble (so never one
    of any write set it belongs to). With racks, prefer a bookie on a rack that none of the
    position's write-set neighbours uses, so each write set keeps spanning racks."""
    excluded = set(ensemble) | set(exclude)
    writable = sorted((b for b in candidates if b.writable and b.bookie_id not in excluded),
                      key=lambda b: b.bookie_id)
    if not writable:
        raise NotEnoughBookiesError(
            f"no writable bookie outside the ensemble {', '.join(ensemble)} can replace "
            f"{ensemble[position]}: start another bookie")
    racks = {b.bookie_id: b.rack for b in candidates}
    neighbours = {racks.get(ensemble[p]) for p in neighbour_positions(position, len(ensemble),
                                                                        write_quorum)}
    if any(b.rack for b in writable):
        apart = [b for b in writable if b.rack not in neighbours]
        writable = apart or writable
    return rng.choice(writable).bookie_id


def decommission_refusal(bookie: str, writable: Iterable[str],
                         ensemble_sizes: Iterable[int]) -> str | None:
    """Why retiring `bookie` would break ledgers in use (None: it may go). Every ledger that uses
    an ensemble of E needs E writable bookies to replace a member or change ensemble."""
    others = sorted(set(writable) - {bookie})
    needed = max(ensemble_sizes, default=0)
    if len(others) < needed:
        return (f"decommissioning {bookie} would leave {len(others)} writable bookie"
                f"{'' if len(others) == 1 else 's'} ({', '.join(others) or 'none'}), fewer than the "
                f"ensemble size {needed} that ledgers in use need: start another bookie first")
    return None


# ---------------------------------------------------------------------------------- replica checks


class ReplicaState(enum.Enum):
    OK = "ok"  # present, and its own digest checks out (or cannot be checked without the key)
    ABSENT = "absent"  # the bookie does not hold it
    DAMAGED = "damaged"  # held but unreadable or failing its digest
    UNREACHABLE = "unreachable"  # no answer: says nothing about the replica


@dataclass(frozen=True, slots=True)
class EntryVerdict:
    bad: frozenset[str]  # replicas to write back from a good one
    lost: bool = False  # every member answered and none holds a good copy: nothing to copy from
    unknown: bool = False  # good-looking replicas disagree with no majority: left for an operator


def entry_verdict(observations: Mapping[str, tuple[ReplicaState, int]]) -> EntryVerdict:
    """The verdict on one entry from its write set's answers: (state, crc32c of the stored bytes).
    Every member stores the very bytes the writer packed, so good replicas have one checksum; a
    minority that differs is damaged (an HMAC entry cannot be verified by a bookie); a tie is
    left alone."""
    bad = {bookie for bookie, (state, _) in observations.items()
           if state in (ReplicaState.ABSENT, ReplicaState.DAMAGED)}
    good: dict[int, set[str]] = {}
    for bookie, (state, crc) in observations.items():
        if state is ReplicaState.OK:
            good.setdefault(crc, set()).add(bookie)
    if not good:
        answered = all(state is not ReplicaState.UNREACHABLE for state, _ in observations.values())
        return EntryVerdict(frozenset(bad), lost=bool(bad) and answered)
    if len(good) > 1:
        sizes = sorted((len(members) for members in good.values()), reverse=True)
        if sizes[0] == sizes[1]:
            return EntryVerdict(frozenset(bad), unknown=True)
        majority = max(good.values(), key=len)
        bad |= {bookie for members in good.values() if members is not majority for bookie in members}
    return EntryVerdict(frozenset(bad))
