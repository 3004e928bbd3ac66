"""Ledger recovery: seal a ledger whose writer may be gone (A6, A7, A8, A10).

Theory of operation, in phases:
  MARKING    compare-and-set the metadata OPEN -> IN_RECOVERY (already IN_RECOVERY: go on; another
             recoverer may be running, and both converge; CLOSED: nothing to do).
  FENCING    a fencing read of the LAC to every bookie of the last fragment. Once every write set
             has Qw - Qa + 1 fenced answers (A7) the old writer can no longer complete an add; the
             highest LAC reported (never below the fragment's first entry - 1) is confirmed.
             Answers still missing then are not waited for: one hung bookie never blocks recovery.
  READING    fencing reads of entries LAC, LAC+1, ... to their whole write set, `window` at a time.
             One valid answer makes an entry recoverable; Qw - Qa + 1 "no such entry" answers prove
             it was never acknowledged and end the ledger just before it; every bookie answering
             otherwise is "unknown" and aborts with a retryable error (A8) - once every entry below
             it is known to exist (an unknown entry past the end does not matter).
  WRITING    every recovered entry past the LAC is written back, byte for byte, to its full write
             set with the recovery flag (a LedgerWriter in recovery mode, which replaces failed
             bookies locally).
  CLOSING    compare-and-set CLOSED with the last entry id, length and any new fragments. If
             another recoverer closed first with the same last entry, that is success; with a
             different one it is an error (A10).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from bookkeeper.errors import (
    DlogError,
    LedgerClosedError,
    LedgerRecoveryError,
    NoSuchEntryError,
    NoSuchLedgerError,
    RequestTimeoutError,
    UnauthorizedError,
    invariant,
    known,
)
from bookkeeper.protocol.effects import (
    Effect,
    Finished,
    SendAdd,
    SendRead,
    WriteMetadata,
)
from bookkeeper.protocol.entry import Digest, DigestMismatchError, unpack_entry
from bookkeeper.protocol.metadata import LedgerMetadata, LedgerState
from bookkeeper.protocol.quorum import (
    entry_missing,
    fencing_covered,
    fencing_impossible,
    write_set,
)
from bookkeeper.protocol.ticks import discount_stall
from bookkeeper.protocol.writer import LedgerWriter, WriterState


class Phase(enum.Enum):
    MARKING = "marking"
    FENCING = "fencing"
    READING = "reading"
    CLOSING = "closing"
    DONE = "done"


@dataclass(slots=True, eq=False)
class _Verdict:
    entry_id: int
    members: list[str]
    outstanding: dict[str, int] = field(default_factory=dict)
    no_entry: int = 0
    failed: int = 0
    packed_entry: bytes | None = None
    length: int = 0
    missing: bool = False
    unknown: bool = False  # every bookie answered, none positively, too few said "no such entry"


class RecoveryOp:
    def __init__(self, ledger_id: int, metadata: LedgerMetadata, version: int, digest: Digest, *,
                 available_bookies: Iterable[str], rng: random.Random, read_timeout_ms: int = 5000,
                 add_timeout_ms: int = 5000, window: int = 64) -> None:
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.version = version
        self.digest = digest
        self.available = list(available_bookies)
        self.rng = rng
        self.read_timeout_ms = read_timeout_ms
        self.add_timeout_ms = add_timeout_ms
        self.window = window
        self.phase = Phase.MARKING
        self.result: Finished | None = None
        self._fence_outstanding: dict[str, int] = {}
        self._fence_answered: set[int] = set()
        self._fence_failed: set[int] = set()
        self._fence_lacs: list[int] = []
        self._verdicts: dict[int, _Verdict] = {}
        self._next_read = 0
        self._end: int | None = None  # last entry id, once the first missing entry is known
        self._lac = -1
        self._writer: LedgerWriter | None = None
        self._closing_metadata: LedgerMetadata | None = None

    # ------------------------------------------------------------------ start and marking

    def start(self, now_ms: int) -> list[Effect]:
        if self.metadata.state is LedgerState.CLOSED:
            return self._finish(Finished(self.metadata, self.version))
        if self.metadata.state is LedgerState.IN_RECOVERY:
            return self._start_fencing(now_ms)
        return [WriteMetadata(replace(self.metadata, state=LedgerState.IN_RECOVERY), self.version)]

    def on_metadata_written(self, metadata: LedgerMetadata, version: int, now_ms: int) -> list[Effect]:
        self.metadata, self.version = metadata, version
        if self.phase is Phase.MARKING:
            return self._start_fencing(now_ms)
        invariant(self.phase is Phase.CLOSING, f"metadata written during {self.phase.value}")
        return self._finish(Finished(metadata, version))

    def on_metadata_conflict(self, current: LedgerMetadata, version: int, now_ms: int) -> list[Effect]:
        if self.phase is Phase.MARKING:
            self.metadata, self.version = current, version
            return self.start(now_ms)  # closed meanwhile, or in recovery by someone else, or retry
        invariant(self.phase is Phase.CLOSING, f"metadata conflict during {self.phase.value}")
        closing = known(self._closing_metadata, f"metadata conflict during {self.phase.value}")
        if current.state is LedgerState.CLOSED:
            if current.last_entry_id == closing.last_entry_id:
                return self._finish(Finished(current, version))
            return self._finish(Finished(None, version, LedgerClosedError(
                f"ledger {self.ledger_id} was closed at entry {current.last_entry_id} by another "
                f"recovery, which this recovery saw end at {closing.last_entry_id}")))
        self._closing_metadata = replace(closing, custom=current.custom)
        return [WriteMetadata(self._closing_metadata, version)]

    def on_metadata_failed(self, error: DlogError) -> list[Effect]:
        return self._finish(Finished(None, self.version, error))

    def _finish(self, finished: Finished) -> list[Effect]:
        self.phase = Phase.DONE
        self.result = finished
        return [finished]

    def _fail(self, error: DlogError) -> list[Effect]:
        return self._finish(Finished(None, self.version, error))

    # ------------------------------------------------------------------ fencing

    def _start_fencing(self, now_ms: int) -> list[Effect]:
        self.phase = Phase.FENCING
        ensemble = self.metadata.last_ensemble[1]
        self._fence_outstanding = {bookie: now_ms for bookie in ensemble}
        return [SendRead(bookie, -1, fence=True) for bookie in ensemble]

    def _fence_position(self, bookie: str) -> int:
        return self.metadata.last_ensemble[1].index(bookie)

    def _on_fence_answer(self, bookie: str, lac: int | None, error: DlogError | None,
                         now_ms: int) -> list[Effect]:
        if self._fence_outstanding.pop(bookie, None) is None:
            return []
        if isinstance(error, UnauthorizedError):
            return self._fail(error)
        position = self._fence_position(bookie)
        if error is None:
            self._fence_answered.add(position)
            self._fence_lacs.append(lac if lac is not None else -1)
        else:
            self._fence_failed.add(position)
        shape = (self.metadata.ensemble_size, self.metadata.write_quorum, self.metadata.ack_quorum)
        if fencing_covered(self._fence_answered, *shape):
            first_of_fragment = self.metadata.last_ensemble[0]
            self._lac = max([first_of_fragment - 1, *self._fence_lacs])
            self._fence_outstanding.clear()
            return self._start_reading(now_ms)
        if fencing_impossible(self._fence_failed, *shape):
            return self._fail(LedgerRecoveryError(
                f"ledger {self.ledger_id}: too many bookies of {', '.join(self.metadata.last_ensemble[1])} "
                "failed to answer the fence; retry when they are back"))
        return []

    # ------------------------------------------------------------------ reading

    def _start_reading(self, now_ms: int) -> list[Effect]:
        self.phase = Phase.READING
        self._next_read = max(self._lac, 0)
        self._writer = LedgerWriter(
            self.ledger_id, self.metadata, self.version, self.digest,
            available_bookies=self.available, rng=self.rng, add_timeout_ms=self.add_timeout_ms,
            recovery=True, lac=self._lac, length=0)
        if self._lac < 0:
            self._writer.lac_length = self._writer.length = 0
        return self._read_more(now_ms)

    def _read_more(self, now_ms: int) -> list[Effect]:
        effects: list[Effect] = []
        while self._end is None and len(self._verdicts) < self.window:
            entry_id = self._next_read
            self._next_read += 1
            ensemble = self.metadata.ensemble_for(entry_id)
            members = [ensemble[p] for p in write_set(entry_id, self.metadata.ensemble_size,
                                                       self.metadata.write_quorum)]
            verdict = _Verdict(entry_id, members, {bookie: now_ms for bookie in members})
            self._verdicts[entry_id] = verdict
            effects += [SendRead(bookie, entry_id, fence=True) for bookie in members]
        return effects

    def _on_entry_answer(self, bookie: str, entry_id: int, packed_entry: bytes | None,
                         error: DlogError | None, now_ms: int) -> list[Effect]:
        verdict = self._verdicts.get(entry_id)
        if verdict is None or verdict.outstanding.pop(bookie, None) is None:
            return []
        if verdict.packed_entry is not None or verdict.missing or verdict.unknown:
            return []
        if packed_entry is not None:
            try:
                entry = unpack_entry(self.digest, packed_entry, self.ledger_id, entry_id)
                verdict.packed_entry, verdict.length = packed_entry, entry.length
            except DigestMismatchError:
                verdict.failed += 1
        elif isinstance(error, (NoSuchEntryError, NoSuchLedgerError)):
            verdict.no_entry += 1
            if entry_missing(verdict.no_entry, self.metadata.write_quorum, self.metadata.ack_quorum):
                verdict.missing = True
        elif isinstance(error, UnauthorizedError):
            return self._fail(error)
        else:
            verdict.failed += 1
        if verdict.packed_entry is None and not verdict.missing and not verdict.outstanding:
            verdict.unknown = True  # decisive only if no earlier entry turns out missing
        return self._advance(now_ms)

    def _advance(self, now_ms: int) -> list[Effect]:
        """Consume verdicts in entry order: write recovered entries back, stop at the first gap."""
        effects: list[Effect] = []
        writer = self._writer
        assert writer is not None
        while self._verdicts:
            first = min(self._verdicts)
            verdict = self._verdicts[first]
            if verdict.missing:
                self._end = first - 1
                self._verdicts.clear()
                break
            if verdict.unknown:
                return self._fail(LedgerRecoveryError(
                    f"ledger {self.ledger_id}: cannot tell whether entry {first} exists "
                    f"({verdict.no_entry} said no, {verdict.failed} failed); retry recovery"))
            if verdict.packed_entry is None:
                break
            del self._verdicts[first]
            if first <= self._lac:  # the LAC entry itself: only its length is needed
                writer.lac_length = writer.length = verdict.length
                continue
            effects += writer.append_packed(first, verdict.packed_entry, verdict.length, now_ms)
        effects += self._read_more(now_ms)
        return effects + self._maybe_close()

    # ------------------------------------------------------------------ answers and time

    def on_read_ok(self, bookie: str, entry_id: int, lac: int, packed_entry: bytes, now_ms: int) -> list[Effect]:
        if self.phase is Phase.FENCING and entry_id == -1:
            return self._on_fence_answer(bookie, lac, None, now_ms)
        if self.phase is Phase.READING and entry_id >= 0:
            return self._on_entry_answer(bookie, entry_id, packed_entry, None, now_ms)
        return []

    def on_read_error(self, bookie: str, entry_id: int, error: DlogError, now_ms: int) -> list[Effect]:
        if self.phase is Phase.FENCING and entry_id == -1:
            return self._on_fence_answer(bookie, None, error, now_ms)
        if self.phase is Phase.READING and entry_id >= 0:
            return self._on_entry_answer(bookie, entry_id, None, error, now_ms)
        return []

    def on_add_ok(self, bookie: str, entry_id: int, now_ms: int) -> list[Effect]:
        if self._writer is None or self.phase is Phase.DONE:
            return []
        return self._writer_effects(self._writer.on_add_ok(bookie, entry_id, now_ms))

    def on_adds_ok(self, bookie: str, entry_ids: list[int], now_ms: int) -> list[Effect]:
        if self._writer is None or self.phase is Phase.DONE:
            return []
        return self._writer_effects(self._writer.on_adds_ok(bookie, entry_ids, now_ms))

    def on_add_error(self, bookie: str, entry_id: int, error: DlogError, now_ms: int) -> list[Effect]:
        if self._writer is None or self.phase is Phase.DONE:
            return []
        return self._writer_effects(self._writer.on_add_error(bookie, entry_id, error, now_ms))

    def _writer_effects(self, effects: list[Effect]) -> list[Effect]:
        writer = self._writer
        assert writer is not None
        if writer.state is WriterState.FAILED:
            return self._fail(LedgerRecoveryError(
                f"ledger {self.ledger_id}: writing recovered entries back failed: {writer.error}"))
        # completions and failures of write-back are internal; only sends go out
        return [e for e in effects if isinstance(e, SendAdd)] + self._maybe_close()

    def on_tick(self, now_ms: int, stalled_since_ms: int | None = None) -> list[Effect]:
        late = RequestTimeoutError(f"no answer within {self.read_timeout_ms} ms")
        effects: list[Effect] = []
        if stalled_since_ms is not None:  # this process did not run: its stall is not the bookies' (ticks.py)
            discount_stall(self._fence_outstanding, stalled_since_ms, now_ms)
            for verdict in self._verdicts.values():
                discount_stall(verdict.outstanding, stalled_since_ms, now_ms)
        if self.phase is Phase.FENCING:
            for bookie, sent_ms in list(self._fence_outstanding.items()):
                if now_ms - sent_ms >= self.read_timeout_ms and self.phase is Phase.FENCING:
                    effects += self._on_fence_answer(bookie, None, late, now_ms)
        elif self.phase is Phase.READING:
            for verdict in list(self._verdicts.values()):
                for bookie, sent_ms in list(verdict.outstanding.items()):
                    if now_ms - sent_ms >= self.read_timeout_ms and self.phase is Phase.READING:
                        effects += self._on_entry_answer(bookie, verdict.entry_id, None, late, now_ms)
            if self._writer is not None and self.phase is Phase.READING:
                effects += self._writer_effects(self._writer.on_tick(now_ms, stalled_since_ms))
        return effects

    def _maybe_close(self) -> list[Effect]:
        writer = self._writer
        if (self.phase is not Phase.READING or self._end is None or writer is None
                or writer.pending_count or writer.state is not WriterState.OPEN):
            return []
        invariant(writer.lac == max(self._end, self._lac),
                  f"recovery of ledger {self.ledger_id} wrote back to {writer.lac}, end is {self._end}")
        self.phase = Phase.CLOSING
        self._closing_metadata = writer.metadata.closed(writer.lac, writer.lac_length)
        return [WriteMetadata(self._closing_metadata, self.version)]
