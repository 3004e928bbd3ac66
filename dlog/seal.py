"""The one "seal an in-progress segment" recipe, shared by a writer that opens a stream and by the
Spark sink's commit: recover the segment's ledger (which fences its writer, A6/L1), then summarize
it from the headers of its first and last entries: last entry, record count (the one formula:
`RecordSetHeader.next_record_index` of the last entry), bytes, timestamps.
"""

from __future__ import annotations

from typing import Any

from bookkeeper.errors import NoSuchLedgerError
from dlog.core.changes import sealed_segment
from dlog.segments.codec import RecordSetCodec, default_schema
from dlog.segments.metadata import Segment

_HEADERS = RecordSetCodec(default_schema())  # headers only: the schema does not matter


async def seal_in_progress(client: Any, password: bytes, segment: Segment,
                           now_ms: int) -> tuple[Segment | None, bool]:
    """(the completed segment, or None when its ledger holds no entry of it or is gone; whether
    the ledger exists). `password` is the stream's ledger password (`Namespace.password_of`)."""
    try:
        handle = await client.open_ledger(segment.ledger_id, password=password, recovery=True)
    except NoSuchLedgerError:
        return None, False
    last = handle.last_add_confirmed
    if last < segment.first_entry:
        return None, True
    first_entry = (await handle.read(segment.first_entry, segment.first_entry))[0]
    last_entry = first_entry if last == segment.first_entry else (await handle.read(last, last))[0]
    first_header = _HEADERS.peek_header(first_entry.payload)
    last_header = _HEADERS.peek_header(last_entry.payload)
    sealed = sealed_segment(segment, last_entry=last, records=last_header.next_record_index,
                            size_bytes=handle.metadata.length, first_timestamp_ms=first_header.min_timestamp_ms,
                            last_timestamp_ms=last_header.max_timestamp_ms, now_ms=now_ms)
    return sealed, True
