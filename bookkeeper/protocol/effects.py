"""Effects: what the sans-IO state machines ask their driver to do. Frozen, slotted, inert."""

from __future__ import annotations

from dataclasses import dataclass

from bookkeeper.errors import DlogError
from bookkeeper.protocol.metadata import LedgerMetadata


@dataclass(frozen=True, slots=True)
class SendAdd:
    bookie: str
    entry_id: int
    packed_entry: bytes
    recovery: bool = False


@dataclass(frozen=True, slots=True)
class SendWriteLac:
    bookie: str
    lac: int


@dataclass(frozen=True, slots=True)
class LacDueSoon:
    """Call the writer's `on_lac_due` a few event-loop turns from now (LAC_DUE_TURNS): the pipeline
    drained, and the explicit LAC goes only to the bookies the writer's next add, if it comes by
    then, does not reach (that add carries the LAC to the others)."""


@dataclass(frozen=True, slots=True)
class SendRead:
    """Read one entry (entry_id -1: only the LAC). `fence` makes it a fencing read."""

    bookie: str
    entry_id: int
    fence: bool = False


@dataclass(frozen=True, slots=True)
class CompleteAdds:
    """Entries first..last (inclusive) are acknowledged, in order."""

    first_entry_id: int
    last_entry_id: int


@dataclass(frozen=True, slots=True)
class FailAdds:
    """Every entry from first_entry_id on failed; `error` says why (fenced = outcome unknown)."""

    first_entry_id: int
    error: DlogError


@dataclass(frozen=True, slots=True)
class WriteMetadata:
    """Compare-and-set the ledger's metadata from `expected_version`."""

    metadata: LedgerMetadata
    expected_version: int


@dataclass(frozen=True, slots=True)
class CompleteRead:
    entry_id: int
    lac: int
    payload: bytes
    length: int


@dataclass(frozen=True, slots=True)
class FailRead:
    entry_id: int
    error: DlogError


@dataclass(frozen=True, slots=True)
class Finished:
    """A recovery or close ended with this metadata (closed) or this error."""

    metadata: LedgerMetadata | None
    version: int
    error: DlogError | None = None


Effect = (SendAdd | SendWriteLac | LacDueSoon | SendRead | CompleteAdds | FailAdds | WriteMetadata
          | CompleteRead | FailRead | Finished)
