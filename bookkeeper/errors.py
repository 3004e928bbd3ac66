"""The one error tree of dlog and its BookKeeper layer.

Every error has a stable ``code`` (the wire status for errors a bookie sends back) and a
``retryable`` flag that tells a caller whether trying the same operation again can succeed.
``error_for_status`` maps a wire status back to its class, so the client raises the same
type the bookie meant.
"""

from __future__ import annotations

from typing import ClassVar


class DlogError(Exception):
    """Root of every error raised on purpose by dlog."""

    code: ClassVar[int] = 1
    retryable: ClassVar[bool] = False


class InvariantError(DlogError):
    """An internal invariant broke: a bug, never swallowed."""

    code = 2


def invariant(condition: bool, message: str) -> None:
    """Always-on assertion: unlike ``assert`` it survives ``python -O``."""
    if not condition:
        raise InvariantError(message)


class ConfigError(DlogError):
    """A setting, option or argument is wrong; the message names it and what would be right."""

    code = 3


class ProtocolError(DlogError):
    """Bytes on the wire do not form a valid frame (the peer is at fault)."""

    code = 4


# --- errors a bookie answers with; the code is the wire status -------------------------------


class BookieError(DlogError):
    """An error status returned by a bookie."""

    code = 101


class NoSuchLedgerError(BookieError):
    code = 1


class NoSuchEntryError(BookieError):
    code = 2


class BadRequestError(BookieError):
    code = 100


class BookieIOError(BookieError):
    """The bookie could not read or write its disk (a corrupt entry log answers this, never
    NO_ENTRY, so recovery does not mistake damage for the end of a ledger)."""

    code = 101
    retryable = True


class UnauthorizedError(BookieError):
    """Wrong ledger password (master key)."""

    code = 102


class UnsupportedVersionError(BookieError):
    code = 103


class LedgerFencedError(BookieError):
    """The ledger is fenced: the outcome of this add is unknown, not 'not written'."""

    code = 104


class BookieReadOnlyError(BookieError):
    code = 105
    retryable = True


class TooManyRequestsError(BookieError):
    code = 106
    retryable = True


class EntryTooLargeError(BookieError):
    code = 107


class EntryExistsError(BookieError):
    """The entry id is already stored with different bytes."""

    code = 108


class LedgerDeletedError(BookieError):
    """The bookie has garbage-collected this ledger."""

    code = 109


class BookieUnavailableError(BookieError):
    """No answer: connection refused, closed or timed out (the outcome of a write is unknown)."""

    code = 110
    retryable = True


class RequestTimeoutError(BookieUnavailableError):
    """A request got no answer in time."""

    code = 111


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
    """Compare-and-set lost: someone else changed the node first."""

    code = 211


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


class CookieMismatchError(DlogError):
    """The data directory and ZooKeeper disagree about this bookie's identity."""

    code = 220


# --- security (codes 500-549; the first three are also wire statuses) ---------------------------


class AuthenticationError(BookieError):
    """Who you are could not be established: no credentials, a bad, expired or tampered token,
    an untrusted certificate, or AUTH skipped where it is required."""

    code = 500


class ForbiddenError(BookieError):
    """The principal is known but may not do this (wrong namespace, missing role)."""

    code = 501


class QuotaExceededError(BookieError):
    """A namespace quota (streams, stored bytes, write bytes/s) would be passed; the message names it."""

    code = 502


class MetadataPermissionError(MetadataError):
    """ZooKeeper refused an operation: the node's ACL does not allow this session's identity."""

    code = 504
    retryable = False


class UntrustedBookieError(DlogError):
    """A bookie registration that cannot be trusted (writable by others, or its TLS identity does
    not match): no entries are sent to it."""

    code = 503


# --- operator tools (codes 400-449) --------------------------------------------------------------


class PortInUseError(DlogError):
    """A server we start could not have its port: another process listens there (named when known)."""

    code = 400


_BY_STATUS: dict[int, type[BookieError]] = {
    cls.code: cls
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
