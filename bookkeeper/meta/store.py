"""The metadata store port, and its in-memory implementation for unit and simulation tests.

Ledger metadata is versioned: every write is a compare-and-set from the version read, so two
clients can never both believe their change won. Ledger ids are unique, 63-bit, and increase in
allocation order (a compare-and-set counter, not a batch per client).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

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
