"""Ledgers, modelled: what the stream layer relies on, without bookies.

A ledger stores entries, acknowledges them in order (entry e only once every entry below it is
acknowledged), can be fenced by a recovery (which closes it at its last stored entry, A6) and
after which the old writer's adds fail with LedgerFencedError, is closed by compare-and-set (the
same end: success, A10), deleted (metadata gone: a watch on it fires; bookies go on acknowledging
adds to it until garbage collection drops it, then refuse them), and tailed with a long poll on its
LAC. Faults:
an add whose ledger fails (NotEnoughBookiesError: this and every later add of that handle fail,
and the entry may or may not be stored: outcome unknown), latencies drawn from the seed, a writer
process that dies (its handles stop answering), and garbage collection that drops the entries of
a ledger its lookup says is gone (`bookkeeper.bookie.gc`: after a sync, and past a grace period;
without the sync a lagging view misses a ledger created a moment ago).

`SimLedgerClient` has the part of `bookkeeper.client.BookKeeper`'s interface the stream layer
uses, so the real Namespace, StreamWriter and StreamReader run on it unchanged.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bookkeeper.bookie import gc
from bookkeeper.errors import (
    DlogError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
)

GC_LAG_S = 2.0  # how far behind a lagging ZooKeeper follower's view is
WATCH_DELAY_S = 0.002  # from a ledger's deletion to its watchers' callbacks (fixed: no draw from the seed)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    ledger_id: int
    entry_id: int
    payload: bytes
    length: int = -1  # the ledger's length up to this entry: unknown here, as the real client's may be


@dataclass(frozen=True, slots=True)
class SimMetadata:
    length: int
    state: str
    last_entry_id: int

    @property
    def is_closed(self) -> bool:
        return self.state == "CLOSED"


@dataclass(slots=True)
class SimLedger:
    ledger_id: int
    password: bytes
    created_s: float
    entries: dict[int, bytes] = field(default_factory=dict)
    lac: int = -1  # the acknowledged prefix
    closed: bool = False
    last_entry: int = -1
    fenced: bool = False
    deleted_s: float | None = None
    collected: bool = False
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def stored_end(self) -> int:
        """The last entry of the stored prefix: where a recovery closes the ledger."""
        end = -1
        while end + 1 in self.entries:
            end += 1
        return end

    def length(self, last: int) -> int:
        return sum(len(self.entries[e]) for e in range(last + 1) if e in self.entries)

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class SimLedgers:
    """Every ledger of the simulated cluster, and its faults."""

    def __init__(self, rng: random.Random, loop: asyncio.AbstractEventLoop, *, latency_ms: tuple[int, int] = (1, 6),
                 failure_probability: float = 0.0, on_fault: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.rng = rng
        self.loop = loop
        self.latency_ms = latency_ms
        self.failure_probability = failure_probability
        self.on_fault = on_fault or (lambda kind, detail: None)
        self.ledgers: dict[int, SimLedger] = {}
        self.next_id = 1
        self.first_seen: dict[int, float] = {}  # what a bookie's GC knows: when it first stored each ledger
        self.collected: list[int] = []
        self.deletion_watchers: dict[int, list[tuple[SimLedgerClient, Callable[[], None]]]] = {}

    def latency_s(self) -> float:
        return self.rng.randint(*self.latency_ms) / 1000

    def client(self) -> SimLedgerClient:
        return SimLedgerClient(self)

    def get(self, ledger_id: int) -> SimLedger:
        ledger = self.ledgers.get(ledger_id)
        if ledger is None or ledger.deleted_s is not None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return ledger

    def delete(self, ledger_id: int) -> None:
        """Delete the ledger's metadata now; its watchers hear of it a moment later."""
        self.get(ledger_id).deleted_s = self.loop.time()
        for client, callback in self.deletion_watchers.pop(ledger_id, []):
            self.loop.call_later(WATCH_DELAY_S, lambda client=client, callback=callback:
                                 client.alive and callback())

    # ------------------------------------------------------------------ garbage collection

    def exists(self, ledger_id: int, *, synced: bool) -> bool:
        """A metadata lookup; without a sync, the view of a follower `GC_LAG_S` behind."""
        ledger = self.ledgers.get(ledger_id)
        if ledger is None:
            return False
        now = self.loop.time()
        seen_at = now if synced else now - GC_LAG_S
        return ledger.created_s <= seen_at and (ledger.deleted_s is None or ledger.deleted_s > seen_at)

    def collect_garbage(self, grace_s: float) -> list[int]:
        """One GC run of the bookies: drop the entries of every ledger `gc.may_collect` allows."""
        dropped = []
        now = self.loop.time()
        for ledger_id, ledger in sorted(self.ledgers.items()):
            if ledger.collected or not ledger.entries:
                continue
            exists = self.exists(ledger_id, synced=gc.SYNC_BEFORE_CHECK)
            if gc.may_collect(exists=exists, first_seen_s=self.first_seen.get(ledger_id, now), now_s=now,
                              grace_s=grace_s):
                ledger.collected = True
                ledger.entries.clear()
                dropped.append(ledger_id)
        self.collected += dropped
        return dropped


class SimLedgerClient:
    """One process's ledger client (what `Namespace.client` is)."""

    def __init__(self, ledgers: SimLedgers) -> None:
        self.ledgers = ledgers
        self.alive = True
        self.handles: list[SimWriteHandle] = []
        self.store = SimMetadataStore(self)

    def kill(self) -> None:
        """The process died: nothing it started will answer it."""
        self.alive = False
        for handle in self.handles:
            handle.alive = False

    async def create_ledger(self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2, *,
                            password: bytes = b"", custom: dict[str, str] | None = None) -> SimWriteHandle:
        await asyncio.sleep(self.ledgers.latency_s())
        ledgers = self.ledgers
        ledger = SimLedger(ledgers.next_id, password, ledgers.loop.time())
        ledgers.next_id += 1
        ledgers.ledgers[ledger.ledger_id] = ledger
        handle = SimWriteHandle(self, ledger)
        self.handles.append(handle)
        return handle

    async def open_ledger(self, ledger_id: int, *, password: bytes = b"", recovery: bool = True) -> SimReadHandle:
        await asyncio.sleep(self.ledgers.latency_s())
        ledger = self.ledgers.get(ledger_id)
        if recovery and not ledger.closed:
            ledger.fenced = True  # from now on the old writer's adds fail
            await asyncio.sleep(self.ledgers.latency_s() * 3)
            ledger = self.ledgers.get(ledger_id)
            if not ledger.closed:
                ledger.closed, ledger.last_entry = True, ledger.stored_end()
                ledger.lac = max(ledger.lac, ledger.last_entry)
                ledger.wake()
        return SimReadHandle(self, ledger)

    async def delete_ledger(self, ledger_id: int) -> None:
        await asyncio.sleep(self.ledgers.latency_s())
        self.ledgers.delete(ledger_id)

    async def ledger_metadata(self, ledger_id: int) -> tuple[SimMetadata, int]:
        ledger = self.ledgers.get(ledger_id)
        return SimMetadata(ledger.length(ledger.last_entry), "CLOSED" if ledger.closed else "OPEN",
                           ledger.last_entry), 0

    async def close(self) -> None:
        return None


class SimMetadataStore:
    """The part of the metadata store port the stream layer uses beside the client: deletion watches."""

    def __init__(self, client: SimLedgerClient) -> None:
        self.client = client

    def watch_ledger_deleted(self, ledger_id: int, callback: Callable[[], None]) -> Callable[[], None]:
        ledgers = self.client.ledgers
        ledger = ledgers.ledgers.get(ledger_id)
        if ledger is None or ledger.deleted_s is not None:
            ledgers.loop.call_later(WATCH_DELAY_S, callback)
            return lambda: None
        watcher = (self.client, callback)
        watchers = ledgers.deletion_watchers.setdefault(ledger_id, [])
        watchers.append(watcher)

        def unwatch() -> None:
            if watcher in watchers:
                watchers.remove(watcher)

        return unwatch


class SimWriteHandle:
    def __init__(self, client: SimLedgerClient, ledger: SimLedger) -> None:
        self.client = client
        self.ledger = ledger
        self.ledger_id = ledger.ledger_id
        self.alive = True
        self.error: DlogError | None = None
        self.next_entry_id = 0
        self.last_add_confirmed = -1
        self._pending: dict[int, asyncio.Future[int]] = {}
        self._stored: set[int] = set()

    @property
    def metadata(self) -> SimMetadata:
        return SimMetadata(self.ledger.length(self.last_add_confirmed), "OPEN", -1)

    def append_async(self, payload: bytes) -> asyncio.Future[int]:
        if self.error is not None:
            raise self.error
        ledgers = self.client.ledgers
        entry_id = self.next_entry_id
        self.next_entry_id += 1
        future: asyncio.Future[int] = ledgers.loop.create_future()
        self._pending[entry_id] = future
        ledgers.loop.call_later(ledgers.latency_s(), self._arrive, entry_id, payload)
        return future

    def _arrive(self, entry_id: int, payload: bytes) -> None:
        ledger, ledgers = self.ledger, self.client.ledgers
        if self.error is not None or ledger.collected:  # bookies refuse adds once GC dropped the ledger
            return self._fail_from(entry_id, self.error or NoSuchLedgerError(f"ledger {self.ledger_id} was deleted"))
        if ledger.fenced or ledger.closed:
            return self._fail_from(entry_id, LedgerFencedError(f"ledger {self.ledger_id} is fenced"))
        if ledgers.failure_probability and ledgers.rng.random() < ledgers.failure_probability:
            if ledgers.rng.random() < 0.5:
                ledger.entries[entry_id] = payload  # stored all the same: the outcome is unknown
            ledgers.on_fault("ledger_failure", {"ledger": self.ledger_id, "entry": entry_id})
            return self._fail_from(entry_id, NotEnoughBookiesError(f"ledger {self.ledger_id}: bookies failed"))
        ledger.entries[entry_id] = payload
        ledgers.first_seen.setdefault(self.ledger_id, ledgers.loop.time())
        self._stored.add(entry_id)
        while self.last_add_confirmed + 1 in self._stored:
            self.last_add_confirmed += 1
            self._stored.discard(self.last_add_confirmed)
            ledger.lac = max(ledger.lac, self.last_add_confirmed)
            future = self._pending.pop(self.last_add_confirmed, None)
            if self.alive and future is not None and not future.done():
                future.set_result(self.last_add_confirmed)
        ledger.wake()
        return None

    def _fail_from(self, entry_id: int, error: DlogError) -> None:
        """The ledger writer failed: every add still pending fails with its error (as FailAdds)."""
        self.error = self.error or error
        pending, self._pending = self._pending, {}
        for pending_id in sorted(pending):
            if self.alive and not pending[pending_id].done():
                pending[pending_id].set_exception(self.error)

    async def close(self) -> None:
        while self._pending and self.error is None:
            await asyncio.sleep(0.001)
        await asyncio.sleep(self.client.ledgers.latency_s())
        if self.error is not None:
            raise self.error
        ledger = self.ledger
        if ledger.deleted_s is not None:
            raise NoSuchLedgerError(f"ledger {self.ledger_id} was deleted")
        if ledger.closed:
            if ledger.last_entry != self.last_add_confirmed:
                raise LedgerClosedError(f"ledger {self.ledger_id} was closed at {ledger.last_entry} by another "
                                        f"client; this writer's last entry is {self.last_add_confirmed}")
            return
        if ledger.fenced:
            raise LedgerFencedError(f"ledger {self.ledger_id} is in recovery")
        ledger.closed, ledger.last_entry = True, self.last_add_confirmed
        ledger.wake()


class SimReadHandle:
    def __init__(self, client: SimLedgerClient, ledger: SimLedger) -> None:
        self.client = client
        self.ledger = ledger
        self.ledger_id = ledger.ledger_id
        self.last_add_confirmed = ledger.last_entry if ledger.closed else ledger.lac

    @property
    def is_closed(self) -> bool:
        return self.ledger.closed

    @property
    def metadata(self) -> SimMetadata:
        ledger = self.ledger
        return SimMetadata(ledger.length(ledger.last_entry if ledger.closed else ledger.lac),
                           "CLOSED" if ledger.closed else "OPEN", ledger.last_entry)

    def _check(self) -> SimLedger:
        return self.client.ledgers.get(self.ledger_id)

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        await asyncio.sleep(self.client.ledgers.latency_s())
        ledger = self._check()
        if last_entry_id > self.last_add_confirmed:
            raise NoSuchEntryError(f"entry {last_entry_id} of ledger {self.ledger_id} is past its LAC "
                                   f"({self.last_add_confirmed})")
        missing = [e for e in range(first_entry_id, last_entry_id + 1) if e not in ledger.entries]
        if missing:
            raise NoSuchEntryError(f"ledger {self.ledger_id} has no entry {missing[0]} (garbage-collected?)")
        return [LedgerEntry(self.ledger_id, e, ledger.entries[e]) for e in range(first_entry_id, last_entry_id + 1)]

    async def read_lac(self) -> int:
        await asyncio.sleep(self.client.ledgers.latency_s())
        ledger = self._check()
        self.last_add_confirmed = max(self.last_add_confirmed, ledger.last_entry if ledger.closed else ledger.lac)
        return self.last_add_confirmed

    def advance_lac(self, entry_id: int) -> None:
        if not self.ledger.closed:
            self.last_add_confirmed = max(self.last_add_confirmed, entry_id)
        else:
            self.last_add_confirmed = max(self.last_add_confirmed, min(entry_id, self.ledger.last_entry))

    async def wait_for_entry(self, entry_id: int, timeout_ms: int) -> LedgerEntry | None:
        ledger = self._check()
        if ledger.lac < entry_id and not ledger.closed:
            waiter: asyncio.Future[None] = self.client.ledgers.loop.create_future()
            ledger.waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, timeout_ms / 1000)
            except TimeoutError:
                pass
        await asyncio.sleep(self.client.ledgers.latency_s())
        ledger = self._check()
        self.last_add_confirmed = max(self.last_add_confirmed, ledger.last_entry if ledger.closed else ledger.lac)
        if self.last_add_confirmed >= entry_id and entry_id in ledger.entries:
            return LedgerEntry(self.ledger_id, entry_id, ledger.entries[entry_id])
        return None

    async def refresh_metadata(self) -> None:
        self._check()
