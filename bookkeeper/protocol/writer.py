"""The ledger writer: pipelined appends, ordered acknowledgement, ensemble change, close.

Theory of operation. `append` packs an entry and asks for it to be sent to its write set (A1).
Each bookie answer comes back through `on_add_ok` / `on_add_error`; entry e completes when Qa
bookies of its *current* write set acknowledged it and every entry below it completed (A2), so
completions are always a contiguous run from LAC + 1.

A failed bookie (error answer, or no answer within `add_timeout_ms`, seen on `on_tick`) starts
an ensemble change: a replacement is chosen from the writable bookies, a new fragment starting at
LAC + 1 is proposed, and *no entry completes until that metadata is committed* by compare-and-set
(A9: an acknowledgement never rests on metadata only this client has seen). After the commit,
every pending entry is re-sent to the members of its write set that have not acknowledged it.
A conflict means someone else wrote the metadata: if the ledger is being recovered or is closed,
every pending add fails (fenced: outcome unknown); otherwise the change is rebased and retried.

In recovery mode (the write-back of ledger recovery) adds carry the recovery flag and an ensemble
change only updates the local metadata: it is persisted by the close that ends recovery.

No I/O, no clock, no global random: time comes in as `now_ms`, randomness from the `rng` given.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bookkeeper.errors import (
    AuthenticationError,
    ConfigError,
    DlogError,
    ForbiddenError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataError,
    NotEnoughBookiesError,
    QuotaExceededError,
    UnauthorizedError,
    invariant,
    known,
)
from bookkeeper.protocol.effects import (
    CompleteAdds,
    Effect,
    FailAdds,
    Finished,
    LacDueSoon,
    SendAdd,
    SendWriteLac,
    WriteMetadata,
)
from bookkeeper.protocol.entry import Digest, pack_entry
from bookkeeper.protocol.metadata import LedgerMetadata, LedgerState
from bookkeeper.protocol.quorum import ack_quorum_reached, write_set
from bookkeeper.protocol.ticks import discount_stall


class WriterState(enum.Enum):
    OPEN = "open"
    CHANGING_ENSEMBLE = "changing_ensemble"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"


@dataclass(slots=True, eq=False)
class _PendingAdd:
    entry_id: int
    packed_entry: bytes
    length: int  # cumulative ledger length including this entry
    acked: set[str] = field(default_factory=set)
    sent: dict[str, int] = field(default_factory=dict)  # bookie -> when sent (ms), unanswered


class LedgerWriter:
    def __init__(self, ledger_id: int, metadata: LedgerMetadata, version: int, digest: Digest, *,
                 available_bookies: Iterable[str], rng: random.Random, add_timeout_ms: int = 5000,
                 explicit_lac_interval_ms: int = 100, explicit_lac_repeats: int = 3,
                 eager_lac: bool = False,
                 failed_bookie_quarantine_ms: int = 30_000, metadata_retries_max: int = 20,
                 recovery: bool = False, lac: int = -1, length: int = 0) -> None:
        invariant(metadata.state is LedgerState.OPEN or recovery,
                  f"ledger {ledger_id} is {metadata.state.value}: only an open ledger is written")
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.version = version
        self.digest = digest
        self.rng = rng
        self.add_timeout_ms = add_timeout_ms
        self.explicit_lac_interval_ms = explicit_lac_interval_ms
        self.explicit_lac_repeats = explicit_lac_repeats
        self.eager_lac = eager_lac
        self._lac_repeats_left = 0
        self.metadata_retries_max = metadata_retries_max
        self.recovery = recovery
        self.state = WriterState.OPEN
        self.error: DlogError | None = None
        self.lac = lac
        self.lac_length = length
        self.length = length  # of everything appended, acknowledged or not
        self.next_entry_id = lac + 1
        self._pending: dict[int, _PendingAdd] = {}
        self._write_sets: list[list[str]] = []
        self._write_sets_of: tuple[str, ...] | None = None
        self._available = set(available_bookies)
        # bookies replaced (or being replaced), with when they failed: not chosen again as a
        # replacement until `failed_bookie_quarantine_ms` has passed, so a bookie that restarted
        # can serve again and a small cluster is not used up by transient failures
        self._failed: dict[str, int] = {}
        self.failed_bookie_quarantine_ms = failed_bookie_quarantine_ms
        self._queued_failures: set[str] = set()
        self._proposed: LedgerMetadata | None = None
        self._conflicts = 0
        self._lac_sent = lac
        self._last_send_ms = 0
        self._lac_due = False  # the pipeline drained; on_lac_due sends the LAC where no add took it
        self._lac_carried: set[str] = set()  # bookies an add sent since then carried the LAC to
        # bookies that answered a WRITE_LAC of `_lac_confirmed_of`: the ticker repeats an idle
        # writer's LAC only to the others (a lost or failed WRITE_LAC), not to every bookie
        self._lac_confirmed: set[str] = set()
        self._lac_confirmed_of = lac

    # ------------------------------------------------------------------ queries

    @property
    def ensemble(self) -> tuple[str, ...]:
        return self.metadata.last_ensemble[1]

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def _write_set(self, entry_id: int) -> list[str]:
        """Bookies of entry `entry_id`: E distinct write sets per ensemble, computed once each."""
        ensemble = self.metadata.last_ensemble[1]
        if ensemble is not self._write_sets_of:
            size, quorum = self.metadata.ensemble_size, self.metadata.write_quorum
            self._write_sets = [[ensemble[position] for position in write_set(start, size, quorum)]
                                for start in range(size)]
            self._write_sets_of = ensemble
        return self._write_sets[entry_id % len(ensemble)]

    # ------------------------------------------------------------------ appends

    def append(self, payload: bytes, now_ms: int) -> tuple[int, list[Effect]]:
        entry_id = self.next_entry_id
        packed_entry = pack_entry(self.digest, self.ledger_id, entry_id, self.lac,
                            self.length + len(payload), payload)
        return entry_id, self.append_packed(entry_id, packed_entry, self.length + len(payload), now_ms)

    def append_many(self, payloads: Sequence[bytes], now_ms: int) -> tuple[int, list[Effect]]:
        """Append several entries at once; returns the last one's entry id (entry ids follow on)."""
        if not payloads:
            raise ConfigError("append_many needs at least one payload")
        effects: list[Effect] = []
        digest, ledger_id = self.digest, self.ledger_id
        for payload in payloads:
            entry_id, length = self.next_entry_id, self.length + len(payload)
            effects += self.append_packed(entry_id, pack_entry(digest, ledger_id, entry_id, self.lac,
                                                               length, payload), length, now_ms)
        return self.next_entry_id - 1, effects

    def append_packed(self, entry_id: int, packed_entry: bytes, length: int, now_ms: int) -> list[Effect]:
        """Add an already packed_entry entry (recovery write-back re-sends the bytes it read)."""
        if self.state not in (WriterState.OPEN, WriterState.CHANGING_ENSEMBLE):
            raise self.error or LedgerClosedError(f"ledger {self.ledger_id} is {self.state.value}")
        invariant(entry_id == self.next_entry_id,
                  f"entry {entry_id} appended out of order (next is {self.next_entry_id})")
        self.next_entry_id = entry_id + 1
        self.length = length
        pending = _PendingAdd(entry_id, packed_entry, length)
        self._pending[entry_id] = pending
        self._lac_sent = max(self._lac_sent, self.lac)
        self._last_send_ms = now_ms
        effects: list[Effect] = []
        for bookie in self._write_set(entry_id):
            if bookie not in self._failed:
                pending.sent[bookie] = now_ms
                effects.append(SendAdd(bookie, entry_id, packed_entry, self.recovery))
        if self._lac_due:  # this entry carries the LAC (packed above): these bookies need no WRITE_LAC
            self._lac_carried.update(pending.sent)
        return effects

    # ------------------------------------------------------------------ answers

    def on_add_ok(self, bookie: str, entry_id: int, now_ms: int) -> list[Effect]:
        pending = self._pending.get(entry_id)
        if pending is None or pending.sent.pop(bookie, None) is None:
            return []  # already completed or failed, or an answer from a replaced bookie
        pending.acked.add(bookie)
        if (entry_id != self.lac + 1
                or not ack_quorum_reached(len(pending.acked), self.metadata.ack_quorum)):
            return []
        return self._complete(now_ms)

    def on_adds_ok(self, bookie: str, entry_ids: Iterable[int], now_ms: int) -> list[Effect]:
        """`bookie` acknowledged all of `entry_ids` (one ADD_BATCH answer): the same as one
        `on_add_ok` per entry, with one completion step at the end."""
        pending_adds = self._pending
        for entry_id in entry_ids:
            pending = pending_adds.get(entry_id)
            if pending is not None and pending.sent.pop(bookie, None) is not None:
                pending.acked.add(bookie)
        first = pending_adds.get(self.lac + 1)
        if first is None or not ack_quorum_reached(len(first.acked), self.metadata.ack_quorum):
            return []
        return self._complete(now_ms)

    def on_add_error(self, bookie: str, entry_id: int, error: DlogError, now_ms: int) -> list[Effect]:
        pending = self._pending.get(entry_id)
        if pending is None or pending.sent.pop(bookie, None) is None:
            return []
        if isinstance(error, LedgerFencedError) and not self.recovery:
            return self._fail_all(LedgerFencedError(
                f"ledger {self.ledger_id} was fenced by a recovery: the outcome of entries from "
                f"{self.lac + 1} on is unknown"))
        if isinstance(error, REFUSALS_OF_THE_WRITER):
            return self._fail_all(error)  # another bookie would refuse it too: stop writing
        return self._bookie_failed([bookie], now_ms)

    def on_tick(self, now_ms: int, stalled_since_ms: int | None = None) -> list[Effect]:
        if not self._pending and not self._lac_repeats_left and self.lac <= self._lac_sent:
            return []  # the common idle tick of one of many open ledgers: nothing to time or send
        if stalled_since_ms is not None:  # this process did not run: its stall is not the bookies' (ticks.py)
            for pending in self._pending.values():
                discount_stall(pending.sent, stalled_since_ms, now_ms)
        late = {bookie for pending in self._pending.values()
                for bookie, sent_ms in pending.sent.items()
                if now_ms - sent_ms >= self.add_timeout_ms}
        effects = self._bookie_failed(sorted(late), now_ms) if late else []
        if (self.state is WriterState.OPEN and not self._pending
                and now_ms - self._last_send_ms >= self.explicit_lac_interval_ms):
            if self.lac > self._lac_sent:
                effects += self._explicit_lac(now_ms, self.explicit_lac_repeats - 1, self.ensemble)
            elif self._lac_repeats_left > 0:
                # repeated a few times (not forever) to the bookies that did not answer it: one
                # lost message must not hide the idle writer's last entry from tailing readers (A4)
                unanswered = [bookie for bookie in self.ensemble if bookie not in self._lac_confirmed]
                if unanswered:
                    effects += self._explicit_lac(now_ms, self._lac_repeats_left - 1, unanswered)
                else:
                    self._lac_repeats_left = 0
        return effects

    def on_write_lac_answered(self, bookie: str, lac: int) -> None:
        """`bookie` answered OK to a WRITE_LAC of `lac`: it knows it, no repeat goes to it."""
        if lac == self._lac_confirmed_of:
            self._lac_confirmed.add(bookie)

    def on_bookies_changed(self, available: Iterable[str]) -> None:
        self._available = set(available)

    # ------------------------------------------------------------------ completion and failure

    def _complete(self, now_ms: int) -> list[Effect]:
        if self.state is WriterState.CHANGING_ENSEMBLE:
            return []  # A9: wait until the new fragment is committed
        first = self.lac + 1
        ack_quorum = self.metadata.ack_quorum
        while True:
            pending = self._pending.get(self.lac + 1)
            if pending is None or not ack_quorum_reached(len(pending.acked), ack_quorum):
                break
            del self._pending[pending.entry_id]
            self.lac = pending.entry_id
            self.lac_length = pending.length
        if self.lac < first:
            return []
        effects: list[Effect] = [CompleteAdds(first, self.lac)]
        if self.eager_lac and not self._pending and not self.recovery:
            # the pipeline drained: send the LAC now (as DistributedLog advances the LAC after each
            # flush) instead of after the idle interval, but only to the bookies the next entry will
            # not reach (one at E3/Qw2: the first of the last entry's write set, the bookie a tailing
            # reader long-polls for that entry, ReadHandle.wait_for_entry; that bookie alone when
            # the next entry reaches all): so a bookie knows it before the write's caller resumes, even one that
            # then blocks its loop or exits. The rest get it a few loop turns later (LacDueSoon),
            # unless the writer's next add (a caller awaiting each write sends it by then) carried it.
            next_set = set(self._write_set(self.next_entry_id))
            ensemble = self.ensemble
            now = ([bookie for bookie in ensemble if bookie not in next_set]
                   or [ensemble[self.lac % len(ensemble)]])
            self._lac_due, self._lac_carried = True, set(now)
            effects += self._explicit_lac(now_ms, self.explicit_lac_repeats - 1, now)
            effects.append(LacDueSoon())
        return effects

    def on_lac_due(self, now_ms: int) -> list[Effect]:
        """LacDueSoon's turns passed: send the LAC to the ensemble's bookies that neither got it at
        the drain nor from an add sent since (the next entry's write set, when the writer stayed idle)."""
        if not self._lac_due:
            return []
        self._lac_due = False
        if self.state is not WriterState.OPEN:
            return []
        return self._explicit_lac(now_ms, self.explicit_lac_repeats - 1,
                                  [bookie for bookie in self.ensemble if bookie not in self._lac_carried])

    def _explicit_lac(self, now_ms: int, repeats_left: int, bookies: Iterable[str]) -> list[Effect]:
        """WRITE_LACs of the current LAC to `bookies` (ensemble order); `repeats_left`: how many
        times more the ticker may send it to those that do not answer."""
        lac = self.lac
        if lac != self._lac_confirmed_of:
            self._lac_confirmed, self._lac_confirmed_of = set(), lac
        self._lac_sent = lac
        self._lac_repeats_left = repeats_left
        self._last_send_ms = now_ms
        return [SendWriteLac(bookie, lac) for bookie in bookies]

    def _fail_all(self, error: DlogError) -> list[Effect]:
        effects: list[Effect] = [FailAdds(self.lac + 1, error)] if self._pending else []
        self._pending.clear()
        self.state = WriterState.FAILED
        self.error = error
        return effects

    # ------------------------------------------------------------------ ensemble change

    def _bookie_failed(self, bookies: list[str], now_ms: int) -> list[Effect]:
        if self.state not in (WriterState.OPEN, WriterState.CHANGING_ENSEMBLE):
            return []
        failed = [bookie for bookie in bookies if bookie in self.ensemble and bookie not in self._failed]
        if not failed:
            return []
        if self.state is WriterState.CHANGING_ENSEMBLE:
            self._queued_failures.update(failed)
            return []
        for bookie, failed_ms in list(self._failed.items()):
            if bookie not in self.ensemble and now_ms - failed_ms >= self.failed_bookie_quarantine_ms:
                del self._failed[bookie]
        self._failed.update(dict.fromkeys(failed, now_ms))
        for pending in self._pending.values():
            for bookie in failed:
                pending.sent.pop(bookie, None)
                pending.acked.discard(bookie)
        candidates = sorted(self._available - set(self.ensemble) - self._failed.keys())
        if len(candidates) < len(failed):
            return self._fail_all(NotEnoughBookiesError(
                f"ledger {self.ledger_id}: bookies {', '.join(failed)} failed and only "
                f"{len(candidates)} writable bookies are left to replace them"))
        replacements = dict(zip(failed, self.rng.sample(candidates, len(failed)), strict=True))
        ensemble = tuple(replacements.get(bookie, bookie) for bookie in self.ensemble)
        proposed = self.metadata.with_ensemble(self.lac + 1, ensemble)
        if self.recovery:
            self.metadata = proposed  # persisted by the close that ends recovery
            return self._resend(now_ms)
        self._proposed = proposed
        self.state = WriterState.CHANGING_ENSEMBLE
        return [WriteMetadata(proposed, self.version)]

    def _resend(self, now_ms: int) -> list[Effect]:
        effects: list[Effect] = []
        for entry_id in sorted(self._pending):
            pending = self._pending[entry_id]
            members = self._write_set(entry_id)
            pending.acked.intersection_update(members)
            for bookie in list(pending.sent):
                if bookie not in members:
                    del pending.sent[bookie]
            for bookie in members:
                if (bookie not in pending.acked and bookie not in pending.sent
                        and bookie not in self._failed):
                    pending.sent[bookie] = now_ms
                    effects.append(SendAdd(bookie, entry_id, pending.packed_entry, self.recovery))
        return effects

    # ------------------------------------------------------------------ metadata answers

    def on_metadata_written(self, metadata: LedgerMetadata, version: int, now_ms: int) -> list[Effect]:
        if self.state is WriterState.FAILED:
            # the answer to a change proposed before a fenced add (or an unauthorized one) failed
            # the writer: every pending add is already reported unknown, nothing is left to do
            return []
        self._conflicts = 0
        if self.state is WriterState.CLOSING:
            self.metadata, self.version, self.state = metadata, version, WriterState.CLOSED
            return [Finished(metadata, version)]
        invariant(self.state is WriterState.CHANGING_ENSEMBLE,
                  f"metadata written while {self.state.value}")
        self.metadata, self.version, self.state = metadata, version, WriterState.OPEN
        self._proposed = None
        # bookies that failed during the change are replaced first, so the re-send below never
        # goes to one of them
        queued, self._queued_failures = sorted(self._queued_failures), set()
        effects = self._bookie_failed(queued, now_ms)
        return effects + self._resend(now_ms) + self._complete(now_ms)

    def on_metadata_conflict(self, current: LedgerMetadata, version: int, now_ms: int) -> list[Effect]:
        """The compare-and-set lost; `current` is what the store holds now."""
        if self.state is WriterState.FAILED:
            return []
        self._conflicts += 1
        if current.state is LedgerState.IN_RECOVERY or (
                current.state is LedgerState.CLOSED and self.state is not WriterState.CLOSING):
            error = (LedgerFencedError if current.state is LedgerState.IN_RECOVERY else LedgerClosedError)(
                f"ledger {self.ledger_id} is {current.state.value} by another client")
            return self._finish_with_error(error, version)
        if self.state is WriterState.CLOSING:
            if current.state is LedgerState.CLOSED:
                if current.last_entry_id == self.lac:  # A10: the same close already happened
                    return self.on_metadata_written(current, version, now_ms)
                return self._finish_with_error(LedgerClosedError(
                    f"ledger {self.ledger_id} was closed at entry {current.last_entry_id} by another "
                    f"client; this writer's last entry is {self.lac}"), version)
            return self._retry(WriteMetadata(current.closed(self.lac, self.lac_length), version), version)
        invariant(self.state is WriterState.CHANGING_ENSEMBLE, f"metadata conflict while {self.state.value}")
        proposed = known(self._proposed, f"metadata conflict while {self.state.value}")
        proposed_first, proposed_ensemble = proposed.last_ensemble
        if current.last_ensemble == (proposed_first, proposed_ensemble):
            return self.on_metadata_written(current, version, now_ms)  # our earlier write landed
        self._proposed = current.with_ensemble(proposed_first, proposed_ensemble)
        return self._retry(WriteMetadata(self._proposed, version), version)

    def _retry(self, effect: WriteMetadata, version: int) -> list[Effect]:
        if self._conflicts > self.metadata_retries_max:
            return self._finish_with_error(MetadataError(
                f"ledger {self.ledger_id}: gave up after {self._conflicts} metadata conflicts"), version)
        self.version = version
        return [effect]

    def on_metadata_failed(self, error: DlogError) -> list[Effect]:
        """The store could not be written (after the driver's bounded retries)."""
        return self._finish_with_error(error, self.version)

    def _finish_with_error(self, error: DlogError, version: int) -> list[Effect]:
        closing = self.state is WriterState.CLOSING
        effects = self._fail_all(error)
        if closing:
            effects.append(Finished(None, version, error))
        return effects

    # ------------------------------------------------------------------ close

    def close(self) -> list[Effect]:
        """Seal the ledger at its LAC. Call with nothing pending and no ensemble change running."""
        if self.state is WriterState.CLOSED:
            return [Finished(self.metadata, self.version)]
        if self.state is WriterState.FAILED:
            raise self.error or LedgerClosedError(f"ledger {self.ledger_id} failed")
        invariant(self.state is WriterState.OPEN and not self._pending,
                  f"close needs an idle open writer (state {self.state.value}, "
                  f"{len(self._pending)} pending)")
        self.state = WriterState.CLOSING
        return [WriteMetadata(self.metadata.closed(self.lac, self.lac_length), self.version)]


# refusals about the writer (its key, its principal, its namespace's quota), not about the bookie
REFUSALS_OF_THE_WRITER = (UnauthorizedError, AuthenticationError, ForbiddenError, QuotaExceededError)
