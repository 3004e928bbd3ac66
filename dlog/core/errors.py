"""Errors of the stream layer that its rules raise: a writer taken over, locked out or closed, a
position truncated away, out of range or not assigned yet, a stream whose segment list kept
changing."""

from __future__ import annotations

from bookkeeper.errors import DlogError


class WriterFencedError(DlogError):
    """Another writer took the stream over; pending records have an unknown outcome."""

    code = 320


class WriterLockedError(DlogError):
    """The stream has a live writer (its lock stayed taken); open with takeover to fence it."""

    code = 321
    retryable = True


class WriterClosedError(DlogError):
    """The writer was closed; nothing more can be written with it."""

    code = 322


class TruncatedError(DlogError):
    """The position asked for was removed by truncation or retention."""

    code = 330


class OffsetOutOfRangeError(DlogError):
    """An offset that is in no segment of the stream, or past its end."""

    code = 331


class PositionsUnknownError(DlogError):
    """The stream's segments have no record positions yet: it was written before positions
    existed, and the next writer to open it assigns them (V4)."""

    code = 333


class StreamBusyError(DlogError):
    """The segment list kept changing under a change that had to be based on it; try again."""

    code = 332
    retryable = True


class LedgerDeletedError(DlogError):
    """A ledger of a live writer lost its metadata (`dlog ledger delete --force`): the records the
    writer had acknowledged into it are gone, and the writer stops. `ledger_id` names it;
    `pending_lost` says whether the writer's unacknowledged records went only to that ledger (so
    they are certainly not in the stream) rather than to another one (outcome unknown)."""

    code = 323

    def __init__(self, message: str, ledger_id: int = -1, pending_lost: bool = False) -> None:
        super().__init__(message)
        self.ledger_id = ledger_id
        self.pending_lost = pending_lost


class WriterAbortedError(DlogError):
    """The writer was stopped without waiting (`abort()`, a second Ctrl-C): its records not yet
    acknowledged have an unknown outcome (a later writer's recovery keeps whichever reached an
    ack quorum of bookies)."""

    code = 324


class BacklogExceededError(DlogError):
    """A write refused: a subscription of the stream is over its backlog limit and the stream's
    backlog policy is hold (`dlog.core.backlog`). It clears once the subscription commits past."""

    code = 336


class SubscriptionEvictedError(DlogError):
    """A read at a subscription that was evicted (its backlog passed the stream's limit under the
    evict policy): records it had not read may be gone. Read with skip_evicted to go on."""

    code = 337


class SequenceError(DlogError):
    """A named producer's write with a bad sequence (below or overlapping what the stream holds or
    the writer buffered, not increasing inside a batch, out of range): refused, nothing written.
    `expected` is the least sequence the producer may send next (None when the write itself is
    malformed)."""

    code = 328

    def __init__(self, message: str, expected: int | None = None) -> None:
        super().__init__(message)
        self.expected = expected


class ProducersFullError(DlogError):
    """A new named producer was refused by a limit of the stream's producer table
    (`producers_max`, `snapshot_bytes_max`): open again once idle producers expired."""

    code = 329
    retryable = True
