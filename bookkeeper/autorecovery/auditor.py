"""The auditor: one per cluster, elected; it finds under-replicated ledgers and marks them.

Theory of operation. Every auto-recovery process contends (`RecoveryStore.election`, kazoo's Lock
recipe); the leader runs `_lead` until its ZooKeeper session is suspended or lost (then it checks,
once reconnected, that its election node survived, or contends again). While leading it:

  - watches bookie registrations and reads the cookies (`BookieWatch`): a bookie gone for the
    recovery delay is lost. Whenever the set of lost bookies grows, an *ensemble scan* starts over;
    it also runs at election and every `audit_interval_s`. The scan reads every ledger's metadata,
    paged (bounded listings) and paced (`scan_reads_per_s`), and marks each ledger whose fragments
    name a lost bookie. Bookies only metadata names are learnt by the scan; bookies that nothing
    names any more are forgotten after a full pass.
  - runs a *replica check* every `replica_check_interval_s` (and on request): every closed fragment
    of every ledger, CHECK_ENTRIES to each registered member, paced by `replica_check_entries_per_s`;
    a bookie with absent or damaged replicas gets its ledger marked DAMAGED. The cursor (the last
    ledger done) is kept in ZooKeeper, so a new auditor resumes the check where the last one stopped.
  - answers `trigger-audit` (a data watch) and the enable switch (disabled: nothing is marked).

Marks are idempotent (a merge by compare-and-set), so a deposed auditor that marks once more is
harmless; what must be exclusive, the repair of a ledger, is guarded by the ledger's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from bookkeeper.autorecovery.metrics import RecoveryMetrics
from bookkeeper.autorecovery.policy import (
    BookieWatch,
    Missing,
    Reason,
    bookies_named,
    fragments,
    missing_from,
)
from bookkeeper.autorecovery.replicas import check_chunk, chunks
from bookkeeper.autorecovery.settings import RecoverySettings
from bookkeeper.autorecovery.store import RecoveryStore
from bookkeeper.autorecovery.throttle import TokenBucket
from bookkeeper.client.bookkeeper import BookKeeper
from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.errors import CorruptMetadataError, DlogError, NoSuchLedgerError
from bookkeeper.meta.store import BookieInfo
from bookkeeper.protocol.metadata import LedgerMetadata

log = logging.getLogger(__name__)
SCAN_PAGE = 100  # ledger ids per listing of a scan
COUNT_REFRESH_S = 5.0  # how often the leader recounts the marks for its metric
CURSOR_SAVE_EVERY = 20  # ledgers between two saves of the replica check's cursor
CONTEND_RETRY_S = 1.0
SCAN_RETRY_S = 5.0  # a scan stopped by an error (ZooKeeper unreachable) runs again after this


class Auditor:
    def __init__(self, client: BookKeeper, store: RecoveryStore, settings: RecoverySettings,
                 identity: str, metrics: RecoveryMetrics, enabled: asyncio.Event, *,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.client = client
        self.store = store
        self.settings = settings
        self.identity = identity
        self.metrics = metrics
        self.enabled = enabled
        self.clock = clock
        self.watch = BookieWatch()
        self.leading = False
        self._kick = asyncio.Event()
        self._connected = asyncio.Event()
        self._connected.set()
        self._session_lost = False
        self._bookies: list[BookieInfo] = []
        self._lost_audited: set[str] = set()
        self._trigger: dict[str, Any] | None = None
        self._trigger_handled_ms = 0  # requests at or before this were answered (kept in ZooKeeper)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._failed_scans: set[str] = set()  # to run again (the replica check resumes at its cursor)
        self._state_lock = asyncio.Lock()  # the loop and the scans update one JSON node
        store.zk.add_state_listener(self._on_session)

    def kick(self) -> None:
        self._kick.set()

    def _on_session(self, state: str) -> None:
        if state == "connected":
            self._connected.set()
        else:
            self._connected.clear()
            self._session_lost = self._session_lost or state == "lost"
        self._kick.set()

    # ------------------------------------------------------------------ election

    async def run(self) -> None:
        """Contend, lead while elected, contend again; until cancelled. A candidate whose node
        survived a disconnection goes on with it: contending anew in the same session would queue
        behind its own node."""
        election: Any = None
        try:
            while True:
                try:
                    if election is None or not await election.still_held():
                        if election is not None:
                            await election.cancel()  # MetadataError: its node stays, retried below
                            election = None
                        self._session_lost = False
                        election = self.store.election(self.identity)
                        await election.wait_elected()
                    log.info("%s is the auditor", self.identity)
                    self.leading = self.metrics.is_auditor = True
                    await self._lead(election)
                except DlogError as exc:
                    log.info("auditor candidate %s: %s", self.identity, exc)
                finally:
                    self.leading = self.metrics.is_auditor = False
                    await self._stop_tasks()
                await asyncio.sleep(CONTEND_RETRY_S)
                await self._connected.wait()
        finally:
            if election is not None:
                with contextlib.suppress(DlogError):
                    await election.cancel()

    async def _lead(self, election: Any) -> None:
        state = await self.store.audit_state()
        # before the trigger's watch delivers what it holds: a request answered before is not news
        self._trigger_handled_ms = max(self._trigger_handled_ms, int(state.get("trigger_handled_ms", 0)))
        stops = [self.client.store.watch_bookies(self._on_bookies),
                 self.store.watch_trigger(self._on_trigger)]
        try:
            self._bookies = await self.client.store.bookies()
            now_s = self.clock.monotonic_s()
            self._start("ensembles", self._scan_ensembles("elected"))
            next_ensembles_s = now_s + (self.settings.audit_interval_s or float("inf"))
            next_replicas_s = now_s + self._replica_delay_s(state)
            next_count_s = now_s
            replicas_from_start = False
            while True:
                self._kick.clear()  # before looking: a kick during the awaits below is kept
                if self._session_lost:
                    return
                if not self._connected.is_set():
                    await self._connected.wait()
                    if self._session_lost or not await election.still_held():
                        return
                try:
                    now_s = self.clock.monotonic_s()
                    await self._observe()
                except DlogError as exc:  # ZooKeeper unreachable for a moment: still the auditor
                    log.info("auditor: %s", exc)
                    with contextlib.suppress(asyncio.TimeoutError):
                        async with asyncio.timeout(CONTEND_RETRY_S):
                            await self._kick.wait()
                    continue
                if self._trigger is not None:
                    request, self._trigger = self._trigger, None
                    self._trigger_handled_ms = int(request.get("requested_ms", 0))
                    await self._save_state("trigger_handled_ms", self._trigger_handled_ms)
                    next_ensembles_s = 0.0
                    if request.get("replica_check"):
                        next_replicas_s = 0.0
                        replicas_from_start = True
                        await self._stop_task("replicas")  # a requested check starts over
                if "ensembles" in self._failed_scans:
                    self._failed_scans.discard("ensembles")
                    next_ensembles_s = 0.0
                if "replicas" in self._failed_scans:
                    self._failed_scans.discard("replicas")
                    next_replicas_s = 0.0
                if now_s >= next_ensembles_s:
                    self._start("ensembles", self._scan_ensembles("periodic check"), restart=True)
                    next_ensembles_s = now_s + (self.settings.audit_interval_s or float("inf"))
                if now_s >= next_replicas_s and "replicas" not in self._tasks:
                    self._start("replicas", self._replica_check(replicas_from_start))
                    replicas_from_start = False
                    next_replicas_s = now_s + (self.settings.replica_check_interval_s or float("inf"))
                if now_s >= next_count_s:
                    self.metrics.underreplicated = await self.store.count_marks()
                    next_count_s = now_s + COUNT_REFRESH_S
                loss_s = self._next_loss_s()
                wake_s = min(next_ensembles_s, next_replicas_s, next_count_s, loss_s) - self.clock.monotonic_s()
                with contextlib.suppress(asyncio.TimeoutError):
                    async with asyncio.timeout(max(0.01, wake_s)):
                        await self._kick.wait()
        finally:
            for stop in stops:
                stop()

    def _replica_delay_s(self, state: dict[str, Any]) -> float:
        if not self.settings.replica_check_interval_s:
            return float("inf")
        replica = state.get("replicas", {})
        if replica.get("cursor", -1) >= 0:
            return 0.0  # an unfinished check: resume it now
        finished_ms = replica.get("finished_ms")
        if finished_ms is None:
            return self.settings.replica_check_interval_s
        due_ms = finished_ms + self.settings.replica_check_interval_s * 1000
        return max(0.0, (due_ms - self.clock.wall_ms()) / 1000)

    def _next_loss_s(self) -> float:
        at_ms = self.watch.next_loss_ms(self.clock.wall_ms(), self.settings.delay_ms)
        if at_ms is None:
            return float("inf")
        return self.clock.monotonic_s() + max(0.0, (at_ms - self.clock.wall_ms()) / 1000)

    def _on_bookies(self, bookies: list[BookieInfo]) -> None:
        self._bookies = bookies
        self._kick.set()

    def _on_trigger(self, request: dict[str, Any] | None) -> None:
        if request is not None and int(request.get("requested_ms", 0)) > self._trigger_handled_ms:
            self._trigger = request
            self._kick.set()

    async def _observe(self) -> None:
        """Update which bookies are gone; a growing set of lost bookies restarts the scan."""
        now_ms = self.clock.wall_ms()
        registered = {b.bookie_id for b in self._bookies}
        self.watch.observe(registered, await self.store.cookie_bookies(), now_ms)
        lost = self.watch.lost(now_ms, self.settings.delay_ms)
        self.metrics.lost_bookies = len(lost)
        if not self.enabled.is_set():
            return
        if lost - self._lost_audited:
            log.info("bookies lost (gone for %.0f s or more): %s", self.settings.lost_bookie_recovery_delay_s,
                     ", ".join(sorted(lost - self._lost_audited)))
            self._start("ensembles", self._scan_ensembles(f"lost {', '.join(sorted(lost))}"), restart=True)
        self._lost_audited = lost

    # ------------------------------------------------------------------ background scans

    def _start(self, name: str, coroutine: Any, restart: bool = False) -> None:
        running = self._tasks.get(name)
        if running is not None and not running.done():
            if not restart:
                coroutine.close()
                return
            running.cancel()
        task = asyncio.ensure_future(self._guarded(name, coroutine))
        self._tasks[name] = task
        task.add_done_callback(lambda done: self._tasks.pop(name, None) if self._tasks.get(name) is done else None)

    async def _guarded(self, name: str, coroutine: Any) -> None:
        try:
            await coroutine
        except DlogError as exc:  # ZooKeeper or bookies unreachable: run it again soon
            log.warning("auditor %s scan stopped (again in %.0f s): %s", name, SCAN_RETRY_S, exc)
            self._failed_scans.add(name)
            asyncio.get_running_loop().call_later(SCAN_RETRY_S, self._kick.set)

    async def _stop_task(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

    async def _stop_tasks(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._tasks.clear()

    async def _ledgers(self, after: int, bucket: TokenBucket):
        """(ledger id, metadata) of every ledger above `after`, paged and paced."""
        while page := await self.client.store.list_ledgers_page(after, SCAN_PAGE):
            for ledger_id in page:
                wait_s = bucket.take(1, self.clock.monotonic_s())
                if wait_s:
                    await asyncio.sleep(wait_s)
                try:
                    metadata, _ = await self.client.ledger_metadata(ledger_id)
                except NoSuchLedgerError:
                    continue
                except CorruptMetadataError as exc:
                    log.error("ledger %d: unreadable metadata, not audited: %s", ledger_id, exc)
                    continue
                self.metrics.scan_metadata_reads += 1
                yield ledger_id, metadata
            after = page[-1]

    async def _scan_ensembles(self, why: str) -> None:
        if not self.enabled.is_set():
            return
        started_ms = self.clock.wall_ms()
        log.info("ensemble scan (%s)", why)
        bucket = TokenBucket(self.settings.scan_reads_per_s)
        named: set[str] = set()
        marked = scanned = 0
        async for ledger_id, metadata in self._ledgers(-1, bucket):
            scanned += 1
            bookies = bookies_named(metadata)
            named |= bookies
            self.watch.referenced(bookies, self.clock.wall_ms())
            if await self._mark_lost(ledger_id, metadata):
                marked += 1
        cookies = await self.store.cookie_bookies()
        self.watch.forget(set(self.watch.gone_since_ms) - named - cookies)
        await self._save_state("ensembles", {"started_ms": started_ms, "finished_ms": self.clock.wall_ms(),
                                             "ledgers": scanned, "marked": marked})
        log.info("ensemble scan (%s) done: %d ledgers, %d marked", why, scanned, marked)
        self._kick.set()

    async def _mark_lost(self, ledger_id: int, metadata: LedgerMetadata) -> bool:
        now_ms = self.clock.wall_ms()
        lost = self.watch.lost(now_ms, self.settings.delay_ms)
        missing = missing_from(metadata, lost, Reason.LOST, now_ms)
        if not missing or not self.enabled.is_set():
            return False
        changed = await self.store.mark(ledger_id, missing, now_ms)
        if changed:
            self.metrics.ledgers_marked += 1
            log.info("ledger %d under-replicated: %s lost", ledger_id, ", ".join(m.bookie for m in missing))
        return changed

    async def _replica_check(self, from_start: bool) -> None:
        state = (await self.store.audit_state()).get("replicas", {})
        after = -1 if from_start else state.get("cursor", -1)
        started_ms = state.get("started_ms") if after >= 0 else self.clock.wall_ms()
        log.info("replica check %s", f"resumed after ledger {after}" if after >= 0 else "started")
        bucket = TokenBucket(self.settings.replica_check_entries_per_s)
        done = 0
        async for ledger_id, metadata in self._ledgers(after, TokenBucket(self.settings.scan_reads_per_s)):
            if not self.enabled.is_set():
                return
            await self._check_ledger(ledger_id, metadata, bucket)
            done += 1
            if done % CURSOR_SAVE_EVERY == 0:
                await self._save_state("replicas", {"cursor": ledger_id, "started_ms": started_ms})
        await self._save_state("replicas", {"cursor": -1, "started_ms": started_ms,
                                            "finished_ms": self.clock.wall_ms()})
        log.info("replica check done")

    async def _check_ledger(self, ledger_id: int, metadata: LedgerMetadata, bucket: TokenBucket) -> None:
        live = {b.bookie_id for b in self._bookies}
        timeout_s = self.client.settings.read_timeout_s
        for fragment in fragments(metadata):
            if not fragment.is_closed or not fragment.entry_count:
                continue
            for first, count in chunks(fragment):
                wait_s = bucket.take(count * metadata.write_quorum, self.clock.monotonic_s())
                if wait_s:
                    await asyncio.sleep(wait_s)
                found = await check_chunk(self.client.pool, ledger_id, fragment, metadata.write_quorum,
                                          first, count, live, timeout_s)
                self.metrics.replica_check_entries += found.asked
                bad: set[str] = set()
                for entry_id, verdict in found.verdicts.items():
                    bad |= verdict.bad
                    self.metrics.replica_check_bad += len(verdict.bad)
                    if verdict.lost:
                        self.metrics.replica_check_lost += 1
                        log.error("entry %d:%d has no good replica left on %s", ledger_id, entry_id,
                                  ", ".join(sorted(verdict.bad)))
                    elif verdict.unknown:
                        log.warning("entry %d:%d: its replicas disagree and no majority says which is "
                                    "right; left alone", ledger_id, entry_id)
                damaged = sorted(bad & live)
                if damaged and self.enabled.is_set():
                    now_ms = self.clock.wall_ms()
                    if await self.store.mark(ledger_id, [Missing(b, Reason.DAMAGED, now_ms) for b in damaged],
                                             now_ms):
                        self.metrics.ledgers_marked += 1
                        log.warning("ledger %d: replica check found absent or damaged entries on %s",
                                    ledger_id, ", ".join(damaged))

    async def _save_state(self, key: str, value: Any) -> None:
        async with self._state_lock:
            state = await self.store.audit_state()
            state[key] = value
            await self.store.write_audit_state(state)
