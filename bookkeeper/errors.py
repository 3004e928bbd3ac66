"""The one error tree of dlog and its BookKeeper layer, and the one registry of error codes.

Every error class has a stable ``code``, unique across the whole project (bookkeeper, dlog, spark,
tools), and a ``retryable`` flag that tells a caller whether trying the same operation again can
succeed: retry decisions read that flag (``bookkeeper.retry.is_retryable``), never a list of
classes. Every class joins `ERRORS` when it is defined; a class that does not declare its own code,
or takes one already taken, fails at import time. Errors a bookie sends back also carry their wire
``status``; ``error_for_status`` maps a status back to its class, so the client raises the same
type the bookie meant.

Code ranges: 1-9 generic, 100-199 bookie answers, 200-299 client and metadata, 300-399 streams
(dlog, the Spark data source, tools outside the CLI), 400-449 CLI, 500-549 security, 550-599
auto-recovery, 600-649 Spark, 650-699 the Kafka serving tier (dlog.serve).

`InvariantError` (a bug) is deliberately NOT a `DlogError`: an ``except DlogError`` that handles
expected failures can never swallow a broken invariant.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

T = TypeVar("T")

ERRORS: dict[int, type[BaseException]] = {}  # code -> class: the one registry


def register_code(cls: type[BaseException]) -> None:
    """Add an error class to `ERRORS`; its code must be its own (declared in the class) and unused."""
    code = cls.__dict__.get("code")
    if not isinstance(code, int) or isinstance(code, bool):
        raise TypeError(f"error class {cls.__module__}.{cls.__qualname__} must declare its own integer "
                        "`code` (see the ranges in bookkeeper/errors.py)")
    taken = ERRORS.get(code)
    if taken is not None and taken is not cls:
        raise TypeError(f"error code {code} of {cls.__module__}.{cls.__qualname__} is already taken by "
                        f"{taken.__module__}.{taken.__qualname__}")
    ERRORS[code] = cls


class DlogError(Exception):
    """Root of every error raised on purpose by dlog."""

    code: ClassVar[int] = 1
    retryable: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register_code(cls)


register_code(DlogError)


class InvariantError(Exception):
    """An internal invariant broke: a bug, never swallowed (and never a DlogError)."""

    code: ClassVar[int] = 2
    retryable: ClassVar[bool] = False


register_code(InvariantError)


def invariant(condition: bool, message: str) -> None:
    """Always-on assertion: unlike ``assert`` it survives ``python -O``."""
    if not condition:
        raise InvariantError(message)


def known(value: T | None, message: str) -> T:
    """`invariant(value is not None, message)` that returns the value, so that a type checker
    knows it is set from there on."""
    if value is None:
        raise InvariantError(message)
    return value


class ConfigError(DlogError):
    """A setting, option or argument is wrong; the message names it and what would be right."""

    code = 3


class ProtocolError(DlogError):
    """Bytes on the wire do not form a valid frame (the peer is at fault)."""

    code = 4


# --- errors a bookie answers with; the code is the wire status -------------------------------


class BookieError(DlogError):
    """An error status returned by a bookie (`status`: its wire status; none for the generic class)."""

    code = 100
    status: ClassVar[int | None] = None


class NoSuchLedgerError(BookieError):
    code = 101
    status = 1


class NoSuchEntryError(BookieError):
    code = 102
    status = 2


class BadRequestError(BookieError):
    code = 110
    status = 100


class BookieIOError(BookieError):
    """The bookie could not read or write its disk (a corrupt entry log answers this, never
    NO_ENTRY, so recovery does not mistake damage for the end of a ledger)."""

    code = 111
    status = 101
    retryable = True


class UnauthorizedError(BookieError):
    """Wrong ledger password (master key)."""

    code = 112
    status = 102


class UnsupportedVersionError(BookieError):
    code = 113
    status = 103


class LedgerFencedError(BookieError):
    """The ledger is fenced: the outcome of this add is unknown, not 'not written'."""

    code = 114
    status = 104


class BookieReadOnlyError(BookieError):
    code = 115
    status = 105
    retryable = True


class TooManyRequestsError(BookieError):
    code = 116
    status = 106
    retryable = True


class EntryTooLargeError(BookieError):
    code = 117
    status = 107


class EntryExistsError(BookieError):
    """The entry id is already stored with different bytes."""

    code = 118
    status = 108


class LedgerDeletedError(BookieError):
    """The bookie has garbage-collected this ledger."""

    code = 119
    status = 109


class BookieUnavailableError(BookieError):
    """No answer: connection refused, closed or timed out (the outcome of a write is unknown)."""

    code = 120
    retryable = True


class RequestTimeoutError(BookieUnavailableError):
    """A request got no answer in time."""

    code = 121


# --- client and metadata errors -----------------------------------------------------------------


class LedgerClosedError(DlogError):
    code = 201


class NotEnoughBookiesError(DlogError):
    code = 202
    retryable = True


class LedgerRecoveryError(DlogError):
    """Recovery could not decide where the ledger ends (too many bookies unreachable); retry."""

    code = 203
    retryable = True


class MetadataError(DlogError):
    """Metadata store failure (ZooKeeper unreachable, corrupt or unknown-version data)."""

    code = 210
    retryable = True


class MetadataVersionError(MetadataError):
    """Compare-and-set lost: someone else changed the node first. The same compare-and-set can
    never succeed; re-read, decide again (see MetadataContentionError)."""

    code = 211
    retryable = False


class MetadataNotFoundError(MetadataError):
    code = 212
    retryable = False


class MetadataExistsError(MetadataError):
    code = 213
    retryable = False


class CorruptMetadataError(MetadataError):
    """Metadata that cannot be parsed or has an unknown format version: fail closed."""

    code = 214
    retryable = False


class LedgerIdsExhaustedError(MetadataError):
    """Every 63-bit ledger id was allocated."""

    code = 215
    retryable = False


class MetadataContentionError(MetadataError):
    """A read-modify-write lost to a concurrent change; doing it again from a fresh read can succeed."""

    code = 216
    retryable = True


class MetadataClientClosedError(MetadataError):
    """The metadata client was closed (or never started): no retry can help."""

    code = 217
    retryable = False


class CookieMismatchError(DlogError):
    """The data directory and ZooKeeper disagree about this bookie's identity."""

    code = 220


# --- security (codes 500-549; the first three are also wire statuses) ---------------------------


class AuthenticationError(BookieError):
    """Who you are could not be established: no credentials, a bad, expired or tampered token,
    an untrusted certificate, or AUTH skipped where it is required."""

    code = 500
    status = 500  # also its wire status


class ForbiddenError(BookieError):
    """The principal is known but may not do this (wrong namespace, missing role)."""

    code = 501
    status = 501  # also its wire status


class QuotaExceededError(BookieError):
    """A namespace quota (streams, stored bytes, write bytes/s) would be passed; the message names it."""

    code = 502
    status = 502  # also its wire status


class MetadataPermissionError(MetadataError):
    """ZooKeeper refused an operation: the node's ACL does not allow this session's identity."""

    code = 504
    retryable = False


# --- operator tools (codes 400-449) --------------------------------------------------------------


class PortInUseError(DlogError):
    """A server we start could not have its port: another process listens there (named when known)."""

    code = 400


_BY_STATUS: dict[int, type[BookieError]] = {
    cls.status: cls
    for cls in (
        NoSuchLedgerError,
        NoSuchEntryError,
        BadRequestError,
        BookieIOError,
        UnauthorizedError,
        UnsupportedVersionError,
        LedgerFencedError,
        BookieReadOnlyError,
        TooManyRequestsError,
        EntryTooLargeError,
        EntryExistsError,
        LedgerDeletedError,
        AuthenticationError,
        ForbiddenError,
        QuotaExceededError,
    )
}


def error_for_status(status: int, message: str = "") -> BookieError:
    """The exception a client raises for a non-OK wire status."""
    cls = _BY_STATUS.get(status, BookieError)
    return cls(message or f"bookie answered status {status} ({cls.__name__})")
