"""An in-memory metadata store for the simulated ledger: versioned compare-and-set, stalls and lost
replies, and each client process's view of it (the `bookkeeper.meta.store.MetadataStore` port).

The metadata is kept serialized (`to_bytes`) and parsed on every read, so the format round trip is
part of every run. A request and its reply each take a latency; a stall delays every request and
reply while it lasts (ZooKeeper paused during an ensemble change); a lost reply applies the write
but the client only sees a connection loss (a retryable MetadataError), so its driver retries the
same compare-and-set and meets its own write as a conflict. Every accepted write is checked
against the allowed state transitions and reported to the history. A dead client process's
requests never return.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from bookkeeper.errors import MetadataError, MetadataVersionError, NoSuchLedgerError
from bookkeeper.meta.store import BookieInfo
from bookkeeper.protocol.metadata import LedgerMetadata, LedgerState

if TYPE_CHECKING:
    from .world import World

STORE_LATENCY_MS_MIN = 1
STORE_LATENCY_MS_MAX = 6
STORE_SPIKE_PROBABILITY = 0.05
STORE_SPIKE_MS_MAX = 300

_ALLOWED = {
    (LedgerState.OPEN, LedgerState.OPEN),  # ensemble change
    (LedgerState.OPEN, LedgerState.IN_RECOVERY),
    (LedgerState.OPEN, LedgerState.CLOSED),
    (LedgerState.IN_RECOVERY, LedgerState.CLOSED),
}


class SimMetadataStore:
    """The one ledger's metadata and the registered bookies."""

    def __init__(self, world: World, on_write: Callable[[str, LedgerMetadata, LedgerMetadata], None]) -> None:
        self.world = world
        self.ledger_id = 1
        self._data: bytes | None = None
        self.version = 0
        self.stalled_until_ms = 0.0
        self.replies_to_lose = 0
        self.on_write = on_write  # (client, old, new): the history checks transitions and A9
        self.bookies: list[BookieInfo] = []
        self.watchers: list[Callable[[list[BookieInfo]], None]] = []

    @property
    def current(self) -> LedgerMetadata:
        assert self._data is not None, "the ledger was never created"
        return LedgerMetadata.from_bytes(self._data)

    def delay_ms(self) -> float:
        rng = self.world.rng
        delay: float = rng.randint(STORE_LATENCY_MS_MIN, STORE_LATENCY_MS_MAX)
        if rng.random() < STORE_SPIKE_PROBABILITY:  # one slow request or reply, not a stall
            delay += rng.randint(0, STORE_SPIKE_MS_MAX)
        return delay + max(0.0, self.stalled_until_ms - self.world.now_ms)

    def stall(self, duration_ms: int) -> None:
        self.stalled_until_ms = max(self.stalled_until_ms, self.world.now_ms + duration_ms)

    def heal(self) -> None:
        self.stalled_until_ms = 0.0
        self.replies_to_lose = 0

    def set_bookies(self, bookies: list[BookieInfo]) -> None:
        if bookies == self.bookies:
            return
        self.bookies = bookies
        for watcher in list(self.watchers):
            self.world.loop.call_soon(watcher, list(bookies))

    def create(self, metadata: LedgerMetadata) -> int:
        self._data = metadata.to_bytes()
        self.world.log("store", "v0 created", [bookies for _, bookies in metadata.ensembles])
        return self.ledger_id

    def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        if ledger_id != self.ledger_id or self._data is None:
            raise NoSuchLedgerError(f"no ledger {ledger_id}")
        return self.current, self.version

    def write(self, client: str, metadata: LedgerMetadata, expected_version: int) -> int:
        """Apply a compare-and-set; returns the new version, -1 when the reply is lost."""
        if expected_version != self.version:
            self.world.log("store", "conflict", client, f"expected v{expected_version}, at v{self.version}")
            self.world.stats["metadata conflicts"] += 1
            raise MetadataVersionError(f"expected version {expected_version}, at {self.version}")
        old = self.current
        self._data = metadata.to_bytes()
        self.version += 1
        self.world.log("store", f"v{self.version}", client, metadata.state.value,
                       f"last={metadata.last_entry_id}", [first for first, _ in metadata.ensembles])
        self.on_write(client, old, LedgerMetadata.from_bytes(self._data))
        change = "ensemble changes" if old.state is metadata.state else f"to {metadata.state.value}"
        self.world.stats[f"metadata {change}"] += 1
        if self.replies_to_lose > 0:
            self.replies_to_lose -= 1
            self.world.fault("zk_reply_lost", client, f"v{self.version}")
            return -1
        return self.version


class ClientStore:
    """One client process's session with the store (the MetadataStore port its BookKeeper uses)."""

    def __init__(self, store: SimMetadataStore, client: str) -> None:
        self.store = store
        self.client = client
        self.alive = True

    async def _travel(self) -> None:
        await asyncio.sleep(self.store.delay_ms() / 1000)
        if not self.alive:  # a dead process hears nothing more
            await asyncio.get_running_loop().create_future()

    def ledger_writers(self, namespace: str | None) -> list[str] | None:
        return None

    async def create_ledger(self, metadata: LedgerMetadata) -> tuple[int, int]:
        await self._travel()
        ledger_id = self.store.create(metadata)
        await self._travel()
        return ledger_id, 0

    async def read_ledger(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        await self._travel()
        try:
            found = self.store.read(ledger_id)
        finally:
            await self._travel()
        return found

    async def write_ledger(self, ledger_id: int, metadata: LedgerMetadata, expected_version: int) -> int:
        await self._travel()
        try:
            version = self.store.write(self.client, metadata, expected_version)
        finally:
            await self._travel()
        if version < 0:
            raise MetadataError(f"connection to the metadata store lost (the write of v{expected_version + 1} "
                                "may have been applied)")
        return version

    async def bookies(self) -> list[BookieInfo]:
        return list(self.store.bookies)

    def watch_bookies(self, callback: Callable[[list[BookieInfo]], None]) -> Callable[[], None]:
        def changed(bookies: list[BookieInfo]) -> None:
            if self.alive:
                callback(bookies)

        self.store.watchers.append(changed)
        return lambda: self.store.watchers.remove(changed)

    async def close(self) -> None:
        return None


def transition_problem(old: LedgerMetadata, new: LedgerMetadata) -> str | None:
    """Why this write should never have been accepted, or None."""
    if (old.state, new.state) not in _ALLOWED:
        return f"metadata went from {old.state.value} to {new.state.value}"
    if (old.ensemble_size, old.write_quorum, old.ack_quorum) != (
            new.ensemble_size, new.write_quorum, new.ack_quorum):
        return "quorum sizes changed"
    if old.password_hash != new.password_hash or old.digest_type != new.digest_type:
        return "password or digest type changed"
    if new.state is LedgerState.CLOSED:
        return None  # the close may add fragments made during recovery write-back
    if new.state is LedgerState.IN_RECOVERY and new.ensembles != old.ensembles:
        return "marking IN_RECOVERY changed the fragments"
    # an ensemble change keeps every fragment before the new one (it may replace the last one
    # if that starts at the same entry)
    if new.ensembles[:-1] != old.ensembles[:len(new.ensembles) - 1]:
        return f"fragments rewritten: {old.ensembles} -> {new.ensembles}"
    return None
