"""What the parts of the bookie's request core share: the ports it drives (the journal, ledger
storage, the reply of a request), the state it keeps per ledger, and `CoreParts`, the face of
`BookieCore` (bookie.py) that the request handlers mixed into it (adds.py, batching.py) build on.

The handlers subclass `CoreParts` instead of importing the core, so the core imports its handlers
and nothing imports the core back (no import circle): each handler module names exactly what it
uses of the core, and `BookieCore` must provide it (a type checker says so when it does not).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from bookkeeper.bookie.storage import LedgerData
from bookkeeper.protocol.batch import ReadRangeRequest
from bookkeeper.protocol.wire import OpCode, ReadRequest, Status


class Reply(Protocol):
    def send(self, frame: bytes) -> None: ...

    def request_done(self) -> None: ...


class JournalPort(Protocol):
    """What the core needs of the journal (journal.py; the simulator's in-memory one): `callback`
    runs with `argument` once the record is durable, callbacks in append order."""

    def append(self, record: bytes, callback: Callable[[object], None], argument: object) -> None: ...

    def append_lazy(self, record: bytes) -> None:
        """A record nobody waits for: durable with a later group (within journal.LAZY_FLUSH_S)."""


class StoragePort(Protocol):
    """What the core needs of ledger storage (storage.py; the simulator's in-memory one)."""

    def add_entries(self, ledger_id: int, entries: list[tuple[int, bytes]]) -> None: ...

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        """None when absent; BookieIOError when stored but unreadable (damaged)."""

    def last_entry_id(self, ledger_id: int) -> int: ...

    def get_state(self, ledger_id: int) -> LedgerData | None: ...

    def put_state(self, ledger_id: int, state: LedgerData) -> None: ...


@dataclass(slots=True)
class LedgerState:
    """What the bookie keeps in memory about one ledger it stores."""

    master_key: bytes
    fenced: bool
    explicit_lac: int
    lac: int
    waiters: list[Waiter] = field(default_factory=list)
    # fencing reads that found the fence set but not yet fsynced: answered when it is (A11)
    fence_pending: list[tuple[ReadRequest | ReadRangeRequest, Reply]] | None = None


@dataclass(slots=True, eq=False)
class Waiter:
    """A parked long poll."""

    previous_lac: int
    entry_id: int  # -1: READ_LAC long poll (no entry wanted)
    request_id: int
    opcode: int
    reply: Reply
    timer: asyncio.TimerHandle | None = None


class CoreParts(Protocol):
    """What the handlers mixed into BookieCore use of it; bookie.py defines each."""

    journal: JournalPort
    storage: StoragePort
    read_only: bool
    read_only_reason: str
    add_count: int
    add_bytes: int
    read_count: int
    read_bytes: int

    def _ledger(self, ledger_id: int) -> LedgerState | None: ...

    def _create_ledger(self, ledger_id: int, master_key: bytes) -> LedgerState: ...

    def _advance_lac(self, ledger_id: int, ledger: LedgerState, lac: int) -> None: ...

    def deleted_refusal(self, ledger_id: int) -> tuple[Status, str] | None: ...

    def _ledger_to_read(self, request: ReadRequest | ReadRangeRequest, opcode: OpCode,
                        reply: Reply) -> LedgerState | None: ...

    def _read_entry(self, ledger_id: int, entry_id: int) -> bytes | None: ...

    @staticmethod
    def _fail(reply: Reply, request_id: int, opcode: int, status: Status, message: str) -> None: ...
