"""The metadata store port, and its in-memory implementation for unit and simulation tests.

Ledger metadata is versioned: every write is a compare-and-set from the version read, so two
clients can never both believe their change won. Ledger ids are unique, 63-bit, and increase in
allocation order (a compare-and-set counter, not a batch per client).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from bookkeeper.errors import MetadataVersionError, NoSuchLedgerError
from bookkeeper.protocol.metadata import LedgerMetadata


@dataclass(frozen=True, slots=True)
class BookieInfo:
    bookie_id: str
    address: str
    state: str = "writable"  # or "read_only"
    rack: str | None = None
    http: str | None = None

    @property
    def writable(self) -> bool:
        return self.state == "writable"


class MetadataStore(Protocol):
    async def create_ledger(self, metadata: LedgerMetadata) -> tuple[int, int]:
        """Allocate a ledger id and store its metadata; returns (ledger id, version)."""

    def ledger_writers(self, namespace: str | None) -> list[str] | None:
        """None when this client creates ledgers itself; else a bookie creates them (a cluster
        with ZooKeeper ACLs), giving write to these ids (bookkeeper.protocol.create)."""

    async def read_ledger(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """(metadata, version); NoSuchLedgerError when absent, CorruptMetadataError when unreadable."""

    async def write_ledger(self, ledger_id: int, metadata: LedgerMetadata, expected_version: int) -> int:
        """Compare-and-set; returns the new version; MetadataVersionError when it lost."""

    async def delete_ledger(self, ledger_id: int) -> None:
        """Remove the metadata (bookies reclaim the data by garbage collection)."""

    async def list_ledgers(self) -> list[int]:
        """Every ledger id, sorted."""

    async def list_ledgers_page(self, after: int, limit: int) -> list[int]:
        """Up to `limit` ledger ids above `after`, sorted (scans in bounded pieces)."""

    async def bookies(self) -> list[BookieInfo]:
        """Registered bookies."""

    def watch_bookies(self, callback: Callable[[list[BookieInfo]], None]) -> Callable[[], None]:
        """Call back (on the event loop) whenever the registered bookies change."""

    def watch_ledger_deleted(self, ledger_id: int, callback: Callable[[], None]) -> Callable[[], None]:
        """Call back once (on the event loop) when the ledger's metadata is gone, at once if it is
        already; returns a function that ends the watch."""

    async def close(self) -> None: ...


class MemoryMetadataStore:
    """Everything in a dict; the same semantics as the ZooKeeper store."""

    def __init__(self, bookies: list[BookieInfo] | None = None) -> None:
        self._ledgers: dict[int, tuple[LedgerMetadata, int]] = {}
        self._next_id = 1
        self._bookies = list(bookies or [])
        self._watchers: list[Callable[[list[BookieInfo]], None]] = []
        self._deletion_watchers: dict[int, list[Callable[[], None]]] = {}

    def ledger_writers(self, namespace: str | None) -> list[str] | None:
        return None

    async def create_ledger(self, metadata: LedgerMetadata) -> tuple[int, int]:
        ledger_id = self._next_id
        self._next_id += 1
        self._ledgers[ledger_id] = (metadata, 0)
        return ledger_id, 0

    async def read_ledger(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        try:
            return self._ledgers[ledger_id]
        except KeyError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None

    async def write_ledger(self, ledger_id: int, metadata: LedgerMetadata, expected_version: int) -> int:
        current = self._ledgers.get(ledger_id)
        if current is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        if current[1] != expected_version:
            raise MetadataVersionError(f"ledger {ledger_id} is at version {current[1]}, "
                                       f"not {expected_version}")
        self._ledgers[ledger_id] = (metadata, expected_version + 1)
        return expected_version + 1

    async def delete_ledger(self, ledger_id: int) -> None:
        if self._ledgers.pop(ledger_id, None) is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        loop = asyncio.get_running_loop()
        for callback in self._deletion_watchers.pop(ledger_id, []):
            loop.call_soon(callback)

    async def list_ledgers(self) -> list[int]:
        return sorted(self._ledgers)

    async def list_ledgers_page(self, after: int, limit: int) -> list[int]:
        return [ledger_id for ledger_id in sorted(self._ledgers) if ledger_id > after][:limit]

    async def bookies(self) -> list[BookieInfo]:
        return list(self._bookies)

    def set_bookies(self, bookies: list[BookieInfo]) -> None:
        self._bookies = list(bookies)
        loop = asyncio.get_running_loop()
        for watcher in list(self._watchers):
            loop.call_soon(watcher, list(bookies))

    def watch_bookies(self, callback: Callable[[list[BookieInfo]], None]) -> Callable[[], None]:
        self._watchers.append(callback)
        return lambda: self._watchers.remove(callback)

    def watch_ledger_deleted(self, ledger_id: int, callback: Callable[[], None]) -> Callable[[], None]:
        if ledger_id not in self._ledgers:
            asyncio.get_running_loop().call_soon(callback)
            return lambda: None
        watchers = self._deletion_watchers.setdefault(ledger_id, [])
        watchers.append(callback)

        def unwatch() -> None:
            if callback in watchers:
                watchers.remove(callback)

        return unwatch

    async def close(self) -> None:
        self._watchers.clear()
        self._deletion_watchers.clear()
