"""One linger timer for all the stream writers of an event loop, and one Arrow build for their
small batches.

Theory of operation. A writer's buffered records become an entry `linger_ms` after the first of
them, unless the buffer fills first. With many streams written at once (1,000 writers, a record
or two each per linger period) every writer used to arm its own timer and, when it fired, build
its own Arrow arrays for its two records: per-entry Python work that capped a client near 4,000
records/s. Here writers ask for a flush at a deadline rounded up to `RESOLUTION_S`; the writers due
in one round share one timer, and when it fires their records are taken together, turned into ONE
Arrow batch per schema (one `pa.array` call per column for all of them), and each writer gets its
zero-copy slice to encode and append. The rounding delays an entry by at most `RESOLUTION_S`.

A writer that flushed early (full buffer, `flush()`, a roll) simply has nothing to hand over when
its round comes: nothing is cancelled. The writers' own rules (rolling, errors, entry size limits)
stay in the writer: `take_lingering()` returns nothing from a writer that may not send now.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from itertools import chain
from typing import TYPE_CHECKING, Any

from bookkeeper.errors import DlogError
from dlog.segments.codec import records_to_batch

if TYPE_CHECKING:
    from dlog.writer import StreamWriter

RESOLUTION_S = 0.0005


class LingerFlusher:
    """The rounds of one event loop; see the module docstring."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._rounds: dict[int, list[StreamWriter]] = {}
        self.rounds_fired = 0
        self.entries_flushed = 0

    def schedule(self, writer: StreamWriter, delay_s: float) -> int:
        """Flush `writer` at least `delay_s` from now, in the round it lands in; returns the round
        (the writer keeps it: a writer that flushed meanwhile forgets it and is skipped)."""
        round_id = math.ceil((self._loop.time() + delay_s) / RESOLUTION_S)
        writers = self._rounds.get(round_id)
        if writers is None:
            writers = self._rounds[round_id] = []
            self._loop.call_at(round_id * RESOLUTION_S, self._fire, round_id)
        writers.append(writer)
        return round_id

    def _fire(self, round_id: int) -> None:
        self.rounds_fired += 1
        taken: dict[Any, list[tuple[StreamWriter, tuple[list[Any], ...]]]] = {}
        for writer in self._rounds.pop(round_id, ()):
            records = writer.take_lingering(round_id)
            if records is not None:
                taken.setdefault(writer.codec.schema, []).append((writer, records))
        for schema, parts in taken.items():
            self._send_together(schema, parts)

    def _send_together(self, schema: Any, parts: list[tuple[StreamWriter, tuple[list[Any], ...]]]) -> None:
        try:
            batch = records_to_batch(list(chain.from_iterable(part[1][0] for part in parts)),
                                     list(chain.from_iterable(part[1][1] for part in parts)),
                                     list(chain.from_iterable(part[1][2] for part in parts)), schema,
                                     check=False)
        except DlogError:  # one writer's bad key or timestamp must not cost the others their round
            for part in parts:
                self._send_alone(schema, *part)
            return
        start = 0
        for writer, (values, _, timestamps, futures, taken_bytes) in parts:
            count = len(values)
            self.entries_flushed += 1
            writer.send_taken(batch.slice(start, count), timestamps, futures, taken_bytes)
            start += count


    def _send_alone(self, schema: Any, writer: StreamWriter, records: tuple[list[Any], ...]) -> None:
        values, keys, timestamps, futures, taken_bytes = records
        try:
            batch = records_to_batch(values, keys, timestamps, schema, check=False)
        except DlogError as exc:
            writer.reject_taken(futures, exc)
            return
        self.entries_flushed += 1
        writer.send_taken(batch, timestamps, futures, taken_bytes)


_FLUSHERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LingerFlusher] = weakref.WeakKeyDictionary()


def flusher_of(loop: asyncio.AbstractEventLoop) -> LingerFlusher:
    """The flusher of `loop` (one per event loop: writers of every namespace share it)."""
    flusher = _FLUSHERS.get(loop)
    if flusher is None:
        flusher = _FLUSHERS[loop] = LingerFlusher(loop)
    return flusher
