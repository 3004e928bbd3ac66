"""dlog: named, replicated streams of Arrow record batches on BookKeeper ledgers."""

from dlog.blocking import connect
from dlog.core.errors import ProducersFullError, SequenceError
from dlog.namespace import Namespace
from dlog.offload import Offloader, OffloadReport
from dlog.offsets import Offset
from dlog.reader import OffsetOutOfRangeError, PositionsUnknownError, Record, StreamReader, TruncatedError
from dlog.segments.metadata import TierPolicy
from dlog.writer import (
    DuplicateWrite,
    LedgerDeletedError,
    StreamWriter,
    WriterAbortedError,
    WriterFencedError,
    WriterLockedError,
    WrittenBatch,
)

__all__ = ["Namespace", "Offset", "Record", "StreamReader", "StreamWriter", "WrittenBatch",
           "TruncatedError", "OffsetOutOfRangeError", "PositionsUnknownError", "WriterFencedError",
           "WriterLockedError", "LedgerDeletedError", "WriterAbortedError", "connect", "Offloader",
           "OffloadReport", "TierPolicy", "DuplicateWrite", "SequenceError", "ProducersFullError"]
