"""A simulated bookie's disk: the journal and ledger storage ports of the real `BookieCore`, in memory.

`MemoryJournal` keeps the journal's rules (bookkeeper/bookie/journal.py): group commit with one
fsync in flight, records that arrive meanwhile forming the next group, callbacks in append order
only after the fsync that covers their record. What a power loss leaves: every fsynced record, and
of the group being fsynced when the power went a random prefix (a torn tail, never acknowledged);
records not yet handed to the disk are gone. A restart replays the durable records into a fresh
`MemoryStorage` through the core's own `replay_record`, as a bookie replays its journal.

`MemoryStorage` is the write cache only (so nothing but the journal survives a crash, which is the
worst a checkpoint can leave); an entry can be damaged, after which reading it raises BookieIOError
as a flipped byte in an entry log does, until an add writes it again.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from bookkeeper.bookie.journal import LAZY_FLUSH_S
from bookkeeper.bookie.storage import LedgerData
from bookkeeper.errors import BookieIOError

FSYNC_MS_MIN = 1
FSYNC_MS_MAX = 4

Pending = tuple[bytes, Callable[[object], None], object]


def _nothing(_: object) -> None:
    pass


class MemoryJournal:
    """The journal port (`bookkeeper.bookie.ports.JournalPort`) on simulated time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, rng: random.Random,
                 on_durable: Callable[[list[bytes]], None]) -> None:
        self.loop = loop
        self.rng = rng
        self.on_durable = on_durable  # called with each group's records as its fsync returns
        self.durable: list[bytes] = []  # what replay reads after a restart
        self._buffered: list[Pending] = []
        self._syncing: list[Pending] = []
        self._flush_scheduled = False
        self._lazy: asyncio.TimerHandle | None = None  # a flush of lazy records alone, not yet due
        self._paused = False  # a hung process: its fsyncs neither start nor return
        self._synced_late = False  # an fsync returned while paused: run it on resume
        self._generation = 0  # fsyncs begun before a crash never return

    def append(self, record: bytes, callback: Callable[[object], None], argument: object) -> None:
        self._buffered.append((record, callback, argument))
        if self._lazy is not None:  # a record someone waits for: the lazy ones go with it, now
            self._lazy.cancel()
            self._lazy, self._flush_scheduled = None, False
        if not self._syncing and not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush, self._generation)

    def append_lazy(self, record: bytes) -> None:
        """As the journal's: carried by the next group, or flushed on its own after LAZY_FLUSH_S."""
        self._buffered.append((record, _nothing, None))
        if not self._syncing and not self._flush_scheduled:
            self._flush_scheduled = True
            self._lazy = self.loop.call_later(LAZY_FLUSH_S, self._flush, self._generation)

    def _flush(self, generation: int) -> None:
        self._flush_scheduled, self._lazy = False, None
        if generation != self._generation or self._syncing or not self._buffered:
            return
        self._syncing, self._buffered = self._buffered, []
        delay_s = self.rng.randint(FSYNC_MS_MIN, FSYNC_MS_MAX) / 1000
        self.loop.call_later(delay_s, self._synced, generation)

    def _synced(self, generation: int) -> None:
        if generation != self._generation:
            return
        if self._paused:
            self._synced_late = True
            return
        group, self._syncing = self._syncing, []
        records = [record for record, _, _ in group]
        self.durable += records
        self.on_durable(records)
        for _, callback, argument in group:
            callback(argument)
        if self._buffered:  # the next group starts the moment this fsync returned
            self._flush(generation)

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        if self._synced_late:
            self._synced_late = False
            self._synced(self._generation)
        elif self._buffered and not self._syncing:
            self._flush(self._generation)

    def power_loss(self, kept: int | None = None) -> tuple[int, int]:
        """Keep a prefix of the group being fsynced (`kept` records, or a random number), lose the
        rest; no callback of a lost or kept record runs. Returns (kept, unsynced records)."""
        unsynced = len(self._syncing) + len(self._buffered)
        if kept is None:
            kept = self.rng.randint(0, len(self._syncing))
        kept = min(kept, len(self._syncing))
        self.durable += [record for record, _, _ in self._syncing[:kept]]
        self._syncing, self._buffered = [], []
        self._flush_scheduled = False
        self._synced_late = False
        self._paused = False
        self._generation += 1
        return kept, unsynced

    def wipe(self) -> None:
        self.power_loss(0)
        self.durable = []


class MemoryStorage:
    """The ledger storage port (`bookkeeper.bookie.ports.StoragePort`): volatile, damageable."""

    def __init__(self, on_added: Callable[[int, list[tuple[int, bytes]]], None] | None = None) -> None:
        self.on_added = on_added  # every add_entries call (the simulation records acceptances)
        self._entries: dict[int, dict[int, bytes]] = {}
        self._last: dict[int, int] = {}
        self._states: dict[int, LedgerData] = {}
        self._damaged: set[tuple[int, int]] = set()

    def add_entries(self, ledger_id: int, entries: list[tuple[int, bytes]]) -> None:
        stored = self._entries.setdefault(ledger_id, {})
        for entry_id, packed_entry in entries:
            stored[entry_id] = packed_entry
            self._damaged.discard((ledger_id, entry_id))
        highest = max(entry_id for entry_id, _ in entries)
        if highest > self._last.get(ledger_id, -1):
            self._last[ledger_id] = highest
        if self.on_added is not None:
            self.on_added(ledger_id, entries)

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        if (ledger_id, entry_id) in self._damaged:
            raise BookieIOError(f"entry {ledger_id}:{entry_id} failed its checksum (simulated damage)")
        return self._entries.get(ledger_id, {}).get(entry_id)

    def last_entry_id(self, ledger_id: int) -> int:
        return self._last.get(ledger_id, -1)

    def get_state(self, ledger_id: int) -> LedgerData | None:
        return self._states.get(ledger_id)

    def put_state(self, ledger_id: int, state: LedgerData) -> None:
        self._states[ledger_id] = state

    def damage(self, ledger_id: int, entry_id: int) -> None:
        """Make a stored entry unreadable (a flipped bit on disk)."""
        if entry_id in self._entries.get(ledger_id, {}):
            self._damaged.add((ledger_id, entry_id))

    def entry_ids(self, ledger_id: int) -> list[int]:
        return sorted(self._entries.get(ledger_id, {}))
