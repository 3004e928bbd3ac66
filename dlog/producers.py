"""A stream's stored producer dedup state (`dlog.core.dedup`), read back for whoever writes the
stream next: the serving tier's new owner (`dlog.server.owned.rebuild_dedup`) and a named native
writer (`Namespace.open_writer(name, producer_id=...)`). One recipe for both: the snapshot stored
in the stream's `dedup` node (which retention never touches), restored, then the producer sections
of the entries from its position to the stream's end replayed, idle producers expired.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bookkeeper.errors import DlogError
from dlog.core.dedup import DedupLimits, DedupTable, ReplayedBatch, decode_stored, rebuild


async def rebuild_producers(store: Any, open_reader: Callable[[int], Any], stream: str, end: int, now_ms: int,
                            limits: DedupLimits | None = None) -> tuple[DedupTable, int | None, int, int | None]:
    """(the table, the stored node's version or None when there is none, batches replayed, the
    position replay started at). `open_reader(position)` opens a non-following reader there that
    skips what truncation removed; `end` is where the stream ends (the open writer's first position)."""
    found = await store.dedup_snapshot(stream)
    replayed: list[ReplayedBatch] = []
    position = None if found is None else decode_stored(found[0])[0]
    if position is not None and position < end:  # no snapshot: no writer ever wrote a producer section
        async with open_reader(position) as reader:
            while (entry := await reader.next_entry()) is not None:
                if entry.first_position is None:
                    raise DlogError(f"stream {stream!r} has entries without positions after the dedup snapshot")
                entry_position = entry.first_position - entry.first_slot  # of the entry's slot 0
                for run in entry.producers:
                    first = entry_position + run.first_slot
                    replayed.append(ReplayedBatch(run.producer, run.epoch, run.first_sequence, run.last_sequence,
                                                  first, first + run.records - 1))
                if entry.first_position + entry.batch.num_rows >= end:
                    break
    table = rebuild(None if found is None else found[0], replayed, now_ms, limits)
    return table, None if found is None else found[1], len(replayed), position
