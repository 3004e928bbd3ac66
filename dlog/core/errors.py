"""Errors of the stream layer that its rules raise: a writer taken over, locked out or closed, a
position truncated away or out of range, a stream whose segment list kept changing."""

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


class StreamBusyError(DlogError):
    """The segment list kept changing under a change that had to be based on it; try again."""

    code = 332
    retryable = True
