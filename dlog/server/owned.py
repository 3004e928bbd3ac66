"""A stream this server owns: its one writer, into which every producer's records go (so one
fsynced quorum write serves many producers, and each producer's records keep their order: a
produced batch is buffered whole, without a pause, in the order the requests came), the stream
positions known durable, the recent tail kept in memory for fetches, and the producer table.

Durable first: a record enters the tail (and the end position moves past it) only once its entry
is acknowledged by an ack quorum of bookies, so a fetch never returns what could still be lost.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Sequence
from typing import Any

from dlog.core.dedup import DedupTable
from dlog.core.settings import RECORD_OVERHEAD_BYTES
from dlog.segments.codec import schema_with_headers
from dlog.serve.kafka import Record
from dlog.writer import StreamWriter

TAIL_BATCHES_MAX = 65_536  # per stream, whatever their size: bounds the index of the tail
TAIL_RECORD_BYTES = 64  # what the tail counts for a record beyond its key and value


class RecordRefused(Exception):
    """A record the stream cannot take (too large for an entry, or headers on a typed stream)."""


class OwnedStream:
    def __init__(self, name: str, writer: StreamWriter, start_position: int, end_position: int,
                 tail_bytes_max: int) -> None:
        self.name = name
        self.writer = writer
        self.start_position = start_position  # the first readable record (Kafka's log start offset)
        self.end_position = end_position  # the position the next durable record gets (high watermark)
        self.tail_bytes_max = tail_bytes_max
        self.dedup = DedupTable()  # in memory: rebuilt empty by a new owner (docs/serving.md)
        self.typed = schema_with_headers(writer.codec.schema) is None
        # the tail: durable batches in position order (first positions, records, bytes)
        self._firsts: list[int] = []
        self._batches: list[tuple[Record, ...]] = []
        self._sizes: list[int] = []
        self._head = 0  # batches before it were dropped
        self._tail_bytes = 0
        self._grown = asyncio.Event()
        self._durable_waiters: dict[str, asyncio.Event] = {}  # producer -> set at its next durable batch
        self.records_written = 0

    # ------------------------------------------------------------------ writing

    def check(self, records: Sequence[Record]) -> str | None:
        """Why these records cannot be written (None: they can), before any of them is buffered."""
        if self.typed:
            return f"stream {self.name!r} has a typed schema: Kafka producers write untyped streams only"
        batcher = self.writer.machine.batcher
        for record in records:
            size = (len(record.value or b"") + len(record.key or b"") + RECORD_OVERHEAD_BYTES
                    + sum(len(key) + len(value or b"") + RECORD_OVERHEAD_BYTES for key, value in record.headers))
            problem = batcher.check_record(size)
            if problem is not None:
                return problem
        return None

    def append(self, records: Sequence[Record]) -> asyncio.Future[int]:
        """Buffer `records` (checked) into the writer at once, in order; the future resolves to the
        first record's position once all are durable (they get consecutive positions: nothing else
        is buffered between them). One bulk call: the writer builds their Arrow columns at once
        (`StreamWriter.offer_records`), with no per-record call into it."""
        values = [record.value or b"" for record in records]
        keys = [record.key for record in records]
        headers = [record.headers for record in records]
        written = self.writer.offer_records(values, keys, [record.timestamp_ms for record in records],
                                            [list(pairs) or None for pairs in headers] if any(headers) else None)
        result: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        kept = tuple(records)
        size = sum(map(len, values)) + sum(map(len, filter(None, keys))) + TAIL_RECORD_BYTES * len(kept)

        def durable(done: asyncio.Future[int | None]) -> None:
            if result.done():
                return
            if done.cancelled():
                result.set_exception(asyncio.CancelledError())
            elif (error := done.exception()) is not None:
                result.set_exception(error)
            elif (position := done.result()) is None:  # an open writer always assigns positions (V4)
                result.set_exception(RuntimeError(f"stream {self.name!r} gave no position"))
            else:
                self._durable(position, kept, size)
                result.set_result(position)

        written.add_done_callback(durable)
        return result

    def _durable(self, first_position: int, records: tuple[Record, ...], size: int) -> None:
        self._firsts.append(first_position)
        self._batches.append(records)
        self._sizes.append(size)
        self._tail_bytes += size
        self.end_position = max(self.end_position, first_position + len(records))
        self.records_written += len(records)
        while (self._tail_bytes > self.tail_bytes_max or len(self._firsts) - self._head > TAIL_BATCHES_MAX) \
                and len(self._firsts) - self._head > 1:
            self._tail_bytes -= self._sizes[self._head]
            self._head += 1
        if self._head > 1024 and self._head * 2 > len(self._firsts):
            del self._firsts[: self._head], self._batches[: self._head], self._sizes[: self._head]
            self._head = 0
        grown, self._grown = self._grown, asyncio.Event()
        grown.set()

    # ------------------------------------------------------------------ producers

    def durable_event(self, producer: str) -> asyncio.Event:
        """Set once the producer's next batch is durable or failed (an in-flight resend waits on it)."""
        event = self._durable_waiters.get(producer)
        if event is None:
            event = self._durable_waiters[producer] = asyncio.Event()
        return event

    def producer_settled(self, producer: str) -> None:
        event = self._durable_waiters.pop(producer, None)
        if event is not None:
            event.set()

    # ------------------------------------------------------------------ reading

    @property
    def tail_bytes(self) -> int:
        """Bytes of durable records the in-memory tail holds (bounded by tail_bytes_max)."""
        return self._tail_bytes

    @property
    def tail_start(self) -> int:
        """The first position the in-memory tail holds (end_position when it holds none)."""
        return self._firsts[self._head] if self._head < len(self._firsts) else self.end_position

    def read_tail(self, position: int, bytes_max: int) -> list[tuple[int, Sequence[Record]]] | None:
        """(first position, records) runs from `position` on, about `bytes_max` at most (at least one
        run when there is one); None when `position` is before the tail."""
        if position < self.tail_start:
            return None
        index = bisect.bisect_right(self._firsts, position, lo=self._head) - 1
        runs: list[tuple[int, Sequence[Record]]] = []
        taken = 0
        while 0 <= index < len(self._firsts) and (not runs or taken < bytes_max):
            first, records = self._firsts[index], self._batches[index]
            skip = position - first if position > first else 0
            if skip < len(records):
                runs.append((first + skip, records[skip:] if skip else records))
                taken += self._sizes[index]
            index += 1
        return runs

    async def wait_growth(self, timeout_s: float) -> None:
        """Return when a record becomes durable, or after `timeout_s`."""
        grown = self._grown
        try:
            async with asyncio.timeout(timeout_s):
                await grown.wait()
        except TimeoutError:
            pass

    def grown_event(self) -> asyncio.Event:
        return self._grown

    def stats(self) -> dict[str, Any]:
        return {"stream": self.name, "start_position": self.start_position, "end_position": self.end_position,
                "tail_records": sum(len(b) for b in self._batches[self._head:]), "tail_bytes": self._tail_bytes,
                "producers": self.dedup.producer_count, "records_written": self.records_written}
