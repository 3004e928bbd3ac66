"""What a stream's drivers run with: the namespace hands a `StreamContext` to the writer, the
reader and the describing of one stream, and none of them reaches back into the `Namespace` (as
the ledger client's drivers get a `DriverContext` and never the `BookKeeper` that made them). So
the namespace imports its drivers and nothing imports the namespace."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from bookkeeper.clock import Clock
from dlog.segments.metadata import StreamConfig
from dlog.segments.port import SegmentStore
from dlog.snapshot import SegmentReads


@dataclass(frozen=True, slots=True)
class StreamContext:
    namespace: str  # its name, written into the metadata of the ledgers a writer creates
    config: StreamConfig
    store: SegmentStore  # the namespace's, retrying
    client: Any  # the ledger client: bookkeeper.client.BookKeeper, or the stream simulator's
    password: bytes  # the stream's ledger password, unsealed
    schema: pa.Schema
    clock: Clock
    reads: SegmentReads  # the namespace's one bounded cache of read handles and entry headers
    delete_ledger: Callable[[int], Awaitable[bool]]  # quietly: False when it was gone already
    apply_retention: Callable[[], Awaitable[Any]]  # the stream's retention policy, now

    @property
    def stream(self) -> str:
        return self.config.name

    def watch_ledger_deleted(self, ledger_id: int, callback: Callable[[], None]) -> Callable[[], None]:
        """Call back once when a ledger's metadata is gone (the ledger client's metadata store
        port); returns a function that ends the watch."""
        return self.client.store.watch_ledger_deleted(ledger_id, callback)
