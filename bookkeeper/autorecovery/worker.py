"""The replication worker: takes a marked ledger's lock, carries out `policy.plan_repair`, unmarks.

Theory of operation. A worker waits for marks (a data watch on the marks' parent wakes it; it also
looks every `marks_poll_interval_s`), tries each marked ledger's lock in random order (so the
workers of many bookies spread out) and repairs the first it gets, one at a time:

  1. read the mark and the ledger's metadata (a deleted ledger only needs its mark removed);
  2. drop bookies the mark no longer needs (`resolved_bookies`), then plan;
  3. RECOVER: fence and close the ledger (its writer is presumed gone), then plan again;
  4. REPLACE: choose a replacement (or reuse the one a previous worker recorded in the mark), record
     it, copy the position's entries, then swap it in by compare-and-set on whatever the store holds
     now (re-read and re-applied on conflict, so a writer's concurrent ensemble change or close is
     kept); REPAIR: ask the write sets again and write absent or damaged replicas back in place;
  5. delete the mark only if it is still the version repaired (the auditor may have added a bookie
     meanwhile: then go round again).

A WAIT (an open ledger's last fragment, inside the grace period) or a failure leaves the mark; the
ledger is not tried again before its time (failures back off, doubling). Killed at any point, a
worker leaves metadata consistent: nothing changes it but the compare-and-set swap, and its lock
goes with its ZooKeeper session, so another worker finishes the job.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

from bookkeeper.autorecovery.copier import EntryCopier, verifier_for
from bookkeeper.autorecovery.metrics import RecoveryMetrics
from bookkeeper.autorecovery.policy import (
    Fragment,
    Mark,
    Step,
    StepKind,
    choose_replacement,
    plan_repair,
    resolved_bookies,
    swap_allowed,
    swap_bookie,
)
from bookkeeper.autorecovery.replicas import check_chunk, chunks
from bookkeeper.autorecovery.settings import RecoverySettings
from bookkeeper.autorecovery.store import RecoveryStore
from bookkeeper.autorecovery.throttle import CopyWindow, Pacer
from bookkeeper.client.bookkeeper import BookKeeper
from bookkeeper.client.ledger import RecoveryDriver
from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.errors import (
    DlogError,
    LedgerRecoveryError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from bookkeeper.meta.store import BookieInfo
from bookkeeper.protocol.metadata import LedgerMetadata
from bookkeeper.protocol.quorum import write_set
from bookkeeper.protocol.recovery import RecoveryOp

log = logging.getLogger(__name__)
ROUNDS_MAX = 5  # plan-act rounds for one ledger before giving it back (recovery, new marks)
SWAP_ATTEMPTS_MAX = 20  # compare-and-set conflicts tolerated in one swap
PROGRESS_INTERVAL_S = 2.0  # the mark's progress is written at most this often


class RepairDeferred(DlogError):
    """The ledger cannot be repaired now (its writer's grace period, a recovery under way)."""

    code = 552
    retryable = True


class MissingMasterKeyError(DlogError):
    """The ledger's metadata has no master key (created before auto-recovery kept one)."""

    code = 553


class ReplicationWorker:
    def __init__(self, client: BookKeeper, store: RecoveryStore, settings: RecoverySettings,
                 identity: str, metrics: RecoveryMetrics, *, clock: Clock = SYSTEM_CLOCK,
                 rng: random.Random | None = None) -> None:
        self.client = client
        self.store = store
        self.settings = settings
        self.identity = identity
        self.metrics = metrics
        self.clock = clock
        self.rng = rng or random.Random()
        self.pacer = Pacer(settings.limits)  # shared by every repair of this process
        self.current: int | None = None  # the ledger being repaired
        self._wake = asyncio.Event()
        self._not_before_s: dict[int, float] = {}
        self._failures: dict[int, int] = {}

    def wake(self) -> None:
        self._wake.set()

    # ------------------------------------------------------------------ the loop

    async def run(self, enabled: asyncio.Event) -> None:
        """Repair marked ledgers until cancelled (only while `enabled` is set)."""
        while True:
            await enabled.wait()
            self._wake.clear()
            try:
                worked = await self.repair_next()
            except DlogError as exc:  # ZooKeeper unreachable: look again later
                log.info("replication worker %s: %s", self.identity, exc)
                worked = False
            if worked:
                continue
            try:
                async with asyncio.timeout(self.settings.marks_poll_interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def repair_next(self) -> bool:
        """Lock and repair one marked ledger; False when none could be taken."""
        self._forget_old_failures()
        after = -1
        while page := await self.store.marked_page(after):
            after = page[-1]
            now_s = self.clock.monotonic_s()
            candidates = [ledger_id for ledger_id in page if self._not_before_s.get(ledger_id, 0.0) <= now_s]
            self.rng.shuffle(candidates)  # the workers of many bookies spread over the marks
            for ledger_id in candidates:
                if not await self.store.try_lock(ledger_id, self.identity):
                    continue
                if not await self.store.enabled():  # the switch's watch may not have told us yet
                    await self.store.unlock(ledger_id)
                    return False
                self.current = ledger_id
                try:
                    await self.repair(ledger_id)
                finally:
                    self.current = None
                    await self.store.unlock(ledger_id)
                return True
        return False

    def _forget_old_failures(self) -> None:
        """Back-off state of ledgers long due again (others may have repaired them): bounded."""
        horizon_s = self.clock.monotonic_s() - self.settings.retry_delay_s_max
        for ledger_id in [k for k, due_s in self._not_before_s.items() if due_s < horizon_s]:
            del self._not_before_s[ledger_id]
            self._failures.pop(ledger_id, None)

    async def repair(self, ledger_id: int) -> None:
        """Repair one ledger whose lock this worker holds; failures are recorded, not raised."""
        try:
            for _ in range(ROUNDS_MAX):
                if await self._round(ledger_id):
                    self._failures.pop(ledger_id, None)
                    self._not_before_s.pop(ledger_id, None)
                    return
        except RepairDeferred as exc:
            log.info("ledger %d: %s", ledger_id, exc)
            self._not_before_s.setdefault(ledger_id, self.clock.monotonic_s() + self.settings.retry_delay_s)
            return
        except DlogError as exc:
            await self._failed(ledger_id, exc)
            return
        self._not_before_s[ledger_id] = self.clock.monotonic_s() + self.settings.retry_delay_s

    async def _failed(self, ledger_id: int, error: DlogError) -> None:
        self.metrics.repair_failures += 1
        failures = self._failures[ledger_id] = self._failures.get(ledger_id, 0) + 1
        delay_s = min(self.settings.retry_delay_s * 2 ** (failures - 1), self.settings.retry_delay_s_max)
        self._not_before_s[ledger_id] = self.clock.monotonic_s() + delay_s
        text = f"{type(error).__name__}: {error}"[:500]
        log.warning("ledger %d: repair failed (retry in %.0f s): %s", ledger_id, delay_s, text)
        try:
            found = await self.store.read_mark(ledger_id)
            if found is not None and found[0].error != text:
                await self.store.write_mark(_replace_mark(found[0], error=text), found[1])
        except DlogError as exc:  # best effort: the next attempt records it again
            log.debug("could not record the failure of ledger %d: %s", ledger_id, exc)

    async def _round(self, ledger_id: int) -> bool:
        """One plan-act round; True when the mark is gone."""
        found = await self.store.read_mark(ledger_id)
        if found is None:
            return True
        mark, mark_version = found
        try:
            metadata, _ = await self.client.ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            await self.store.unmark(ledger_id, mark_version)
            return True
        bookies = await self.client.store.bookies()
        registered = {info.bookie_id for info in bookies}
        resolved = resolved_bookies(metadata, mark, registered)
        if resolved:
            mark = mark.without(resolved)
        steps = plan_repair(metadata, mark, registered, self.clock.wall_ms(), self.settings.grace_ms)
        if not steps:
            return await self._unmark(mark, mark_version)
        if steps[0].kind is StepKind.RECOVER:
            await self._recover(ledger_id, metadata, steps[0].bookie)
            return False
        rewritten: set[str] = set()
        for step in steps:
            if step.kind is StepKind.REPLACE:
                mark, mark_version = await self._replace(ledger_id, metadata, mark, mark_version, step,
                                                         bookies)
            elif step.kind is StepKind.REPAIR:
                await self._repair_in_place(ledger_id, metadata, step, registered)
                rewritten.add(step.bookie)
            elif step.kind is StepKind.WAIT:
                self._not_before_s[ledger_id] = (self.clock.monotonic_s()
                                                 + max(0.0, (step.until_ms - self.clock.wall_ms()) / 1000))
                raise RepairDeferred(f"the last fragment is its writer's until the open-ledger grace "
                                     f"period ends (in {(step.until_ms - self.clock.wall_ms()) / 1000:.1f} s)")
        if rewritten:  # written back in place: those bookies hold good replicas again
            found = await self.store.read_mark(ledger_id)
            if found is not None:
                await self.store.write_mark(found[0].without(rewritten), found[1])
        return False  # plan again: the next round sees the swaps and unmarks

    async def _unmark(self, mark: Mark, version: int) -> bool:
        try:
            await self.store.unmark(mark.ledger_id, version)
        except MetadataVersionError:
            return False  # the auditor added to the mark: another round
        self.metrics.ledgers_repaired += 1
        self.metrics.repair_seconds.observe(max(0.0, (self.clock.wall_ms() - mark.ctime_ms) / 1000))
        log.info("ledger %d: fully replicated again", mark.ledger_id)
        return True

    # ------------------------------------------------------------------ recovery

    async def _recover(self, ledger_id: int, metadata: LedgerMetadata, bookie: str) -> None:
        """Fence and close an abandoned open ledger, as `open_ledger(recovery=True)` would."""
        key = _master_key(ledger_id, metadata)
        digest = verifier_for(metadata.digest_type)
        if digest is None:
            raise LedgerRecoveryError(f"ledger {ledger_id} uses HMAC digests, which only its password "
                                      f"can check: recover it with `dlog ledger recover {ledger_id}`")
        log.info("ledger %d: open past its grace period with %s lost: fencing and recovering it",
                 ledger_id, bookie)
        metadata, version = await self.client.ledger_metadata(ledger_id)
        settings = self.client.settings
        op = RecoveryOp(ledger_id, metadata, version, digest,
                        available_bookies=self.client.writable_bookies(), rng=self.rng,
                        read_timeout_ms=settings.read_timeout_ms, add_timeout_ms=settings.add_timeout_ms)
        finished = await RecoveryDriver(self.client.context, ledger_id, op, key).recover()
        if finished.error is not None:
            raise finished.error

    # ------------------------------------------------------------------ replace

    async def _replace(self, ledger_id: int, metadata: LedgerMetadata, mark: Mark, mark_version: int,
                       step: Step, bookies: list[BookieInfo]) -> tuple[Mark, int]:
        fragment = step.fragment
        assert fragment is not None
        first = fragment.first_entry_id
        target = mark.target_for(first, step.bookie)
        usable = {b.bookie_id for b in bookies if b.writable} - set(fragment.bookies)
        if target not in usable:
            target = choose_replacement(bookies, fragment.bookies, step.position,
                                        metadata.write_quorum, self.rng)
            mark = mark.with_target(first, step.bookie, target)
            mark_version = await self.store.write_mark(mark, mark_version)
        total = fragment.count_at(step.position, metadata.write_quorum)
        log.info("ledger %d: copying %d entries of fragment %d from %s's position to %s", ledger_id,
                 total, first, step.bookie, target)
        copier = self._copier(ledger_id, metadata)
        jobs = ((entry_id, self._sources(metadata, fragment, step, entry_id))
                for entry_id in fragment.entries_at(step.position, metadata.write_quorum))
        progress = _Progress(self, mark, total)
        result = await copier.copy(jobs, target, progress.update)
        mark_version = await progress.flush(mark_version)
        self.metrics.entries_copied += result.entries
        self.metrics.bytes_copied += result.size_bytes
        await self._swap(ledger_id, first, step.bookie, target)
        return (await self.store.read_mark(ledger_id) or (mark, mark_version))

    def _sources(self, metadata: LedgerMetadata, fragment: Fragment, step: Step, entry_id: int) -> list[str]:
        positions = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
        sources = [fragment.bookies[p] for p in positions if p != step.position]
        return sources + [step.bookie] if step.source_too else sources

    def _copier(self, ledger_id: int, metadata: LedgerMetadata) -> EntryCopier:
        window = CopyWindow(self.settings.copy_latency_target_ms, self.settings.copy_window_max)
        return EntryCopier(self.client.pool, ledger_id, _master_key(ledger_id, metadata),
                           metadata.digest_type, self.pacer, window, self.metrics,
                           timeout_s=self.client.settings.read_timeout_s + 5, clock=self.clock)

    async def _swap(self, ledger_id: int, first: int, old: str, new: str) -> None:
        """Replace `old` by `new` in the fragment starting at `first`, by compare-and-set on what
        the store holds now (a concurrent ensemble change or close is re-read and kept)."""
        for _ in range(SWAP_ATTEMPTS_MAX):
            if await self.store.lock_version(ledger_id) is None:
                raise RepairDeferred(f"lost the lock of ledger {ledger_id} (ZooKeeper session ended)")
            current, version = await self.client.ledger_metadata(ledger_id)
            if not swap_allowed(current, first):
                raise RepairDeferred(f"ledger {ledger_id} is {current.state.value}: fragment {first} "
                                     "cannot change now")
            swapped = swap_bookie(current, first, old, new)
            if swapped is None:
                return  # already swapped, or the fragment is gone
            try:
                await self.client.store.write_ledger(ledger_id, swapped, version)
            except MetadataVersionError:
                continue
            log.info("ledger %d: fragment %d now on %s instead of %s (ensembles %s, %s, last entry %d)",
                     ledger_id, first, new, old, swapped.ensembles, swapped.state.value,
                     swapped.last_entry_id)
            return
        raise MetadataVersionError(f"ledger {ledger_id}: {SWAP_ATTEMPTS_MAX} conflicting metadata "
                                   "writes in a row while swapping a bookie")

    # ------------------------------------------------------------------ repair in place

    async def _repair_in_place(self, ledger_id: int, metadata: LedgerMetadata, step: Step,
                               registered: set[str]) -> None:
        """Write back the entries the replica check finds absent or damaged on `step.bookie`."""
        fragment = step.fragment
        assert fragment is not None
        copier = self._copier(ledger_id, metadata)
        timeout_s = self.client.settings.read_timeout_s + 5
        for first, count in chunks(fragment):
            found = await check_chunk(self.client.pool, ledger_id, fragment, metadata.write_quorum,
                                      first, count, registered, timeout_s)
            jobs = [(entry_id, found.good[entry_id]) for entry_id, verdict in found.verdicts.items()
                    if step.bookie in verdict.bad and found.good[entry_id]]
            if jobs:
                result = await copier.copy(jobs, step.bookie)
                self.metrics.entries_rewritten += result.entries
                log.info("ledger %d: wrote %d damaged or absent entries back to %s", ledger_id,
                         result.entries, step.bookie)


class _Progress:
    """The copy's progress, written into the mark at most every PROGRESS_INTERVAL_S."""

    def __init__(self, worker: ReplicationWorker, mark: Mark, total: int) -> None:
        self.worker, self.mark, self.total = worker, mark, total
        self.copied = 0
        self._written_s = 0.0
        self._task: asyncio.Task[Any] | None = None

    def update(self, copied: int) -> None:
        self.copied = copied
        now_s = self.worker.clock.monotonic_s()
        if now_s - self._written_s >= PROGRESS_INTERVAL_S and (self._task is None or self._task.done()):
            self._written_s = now_s
            self._task = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        store = self.worker.store
        try:
            found = await store.read_mark(self.mark.ledger_id)
            if found is not None:
                updated = _replace_mark(found[0], progress={"copied_entries": self.copied,
                                                            "total_entries": self.total})
                await store.write_mark(updated, found[1])
        except DlogError as exc:  # progress is for people; a lost race costs nothing
            log.debug("progress of ledger %d not recorded: %s", self.mark.ledger_id, exc)

    async def flush(self, version: int) -> int:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        found = await self.worker.store.read_mark(self.mark.ledger_id)
        return found[1] if found is not None else version


def _replace_mark(mark: Mark, **changes: Any) -> Mark:
    from dataclasses import replace

    return replace(mark, **changes)


def _master_key(ledger_id: int, metadata: LedgerMetadata) -> bytes:
    if not metadata.master_key:
        raise MissingMasterKeyError(
            f"ledger {ledger_id} has no master key in its metadata (it was created before "
            "auto-recovery kept one): its entries cannot be copied automatically")
    return bytes.fromhex(metadata.master_key)
