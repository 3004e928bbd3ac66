"""Ledger handles: asyncio drivers that execute the effects of the sans-IO state machines.

A handle owns one machine (LedgerWriter, RecoveryOp or ReadOp), feeds it bookie answers, metadata
outcomes and clock ticks, and carries out what it returns: requests through the shared bookie
pool, compare-and-set writes through the metadata store (bounded retries with back-off while the
store is unreachable), completions into the futures its callers await. The handles decide nothing
about replication themselves.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bookkeeper.client.driver import EffectDriver
from bookkeeper.errors import (
    DlogError,
    LedgerClosedError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from bookkeeper.protocol.effects import (
    CompleteAdds,
    CompleteRead,
    Effect,
    FailAdds,
    FailRead,
    Finished,
)
from bookkeeper.protocol.entry import Digest, DigestMismatchError, unpack_entry
from bookkeeper.protocol.metadata import LedgerMetadata
from bookkeeper.protocol.reader import ReadOp
from bookkeeper.protocol.recovery import RecoveryOp
from bookkeeper.protocol.wire import ReadRequest
from bookkeeper.protocol.writer import LedgerWriter, WriterState
from bookkeeper.retry import Backoff

if TYPE_CHECKING:
    from bookkeeper.client.settings import DriverContext

log = logging.getLogger(__name__)
# The waits after failed long polls of a tailing ReadHandle (each then asks the ensemble's next
# bookie): 1 ms doubling to 50 ms, which stays the wait while they keep failing. The common failure
# is a new ledger's NO_LEDGER, from a bookie no add of it reached yet; its first add comes within
# milliseconds, and a fixed 50 ms wait once cost a reader's first entries 50 ms each (the tail
# p99 at 1,000 entries/s).
LONG_POLL_RETRY = Backoff(attempts_max=7, delay_s_first=0.001, delay_s_max=0.05)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    ledger_id: int
    entry_id: int
    payload: bytes
    length: int = -1  # the ledger's length in bytes up to and including this entry (-1: unknown)


class LedgerHandle(EffectDriver):
    """The writer of one open ledger."""

    def __init__(self, context: DriverContext, ledger_id: int, writer: LedgerWriter,
                 master_key: bytes) -> None:
        super().__init__(context, ledger_id, master_key)
        self.machine: LedgerWriter = writer
        self.pending_max = context.settings.pending_adds_max
        # (last entry id, future) in entry order: one future per append, or per append_batch
        self._futures: collections.deque[tuple[int, asyncio.Future[int]]] = collections.deque()
        self._room = asyncio.Event()
        self._room.set()
        self._closed: asyncio.Future[Finished] | None = None
        self.start_ticking(context.settings.tick_interval_s)
        self._unwatch = context.watch_writable(writer.on_bookies_changed)

    @property
    def last_add_confirmed(self) -> int:
        return self.machine.lac

    @property
    def metadata(self) -> LedgerMetadata:
        return self.machine.metadata

    @property
    def length(self) -> int:
        return self.machine.lac_length

    async def append(self, payload: bytes) -> int:
        """Append one entry; returns its entry id once an ack quorum has it durable."""
        while self.machine.pending_count >= self.pending_max:
            self._room.clear()
            await self._room.wait()
        return await self.append_async(payload)

    def append_async(self, payload: bytes) -> asyncio.Future[int]:
        """Append without waiting (the caller bounds how many are in flight)."""
        entry_id, effects = self.machine.append(payload, self.now_ms())
        future: asyncio.Future[int] = self.loop.create_future()
        self._futures.append((entry_id, future))
        self.run(effects)
        return future

    def append_batch(self, payloads: Sequence[bytes]) -> asyncio.Future[int]:
        """Append several entries with one future, which resolves to the last one's entry id once
        all of them are durable on an ack quorum (the caller bounds how many are in flight)."""
        last_entry_id, effects = self.machine.append_many(payloads, self.now_ms())
        future: asyncio.Future[int] = self.loop.create_future()
        self._futures.append((last_entry_id, future))
        self.run(effects)
        return future

    def on_outcome(self, effect: Effect) -> None:
        futures = self._futures
        if isinstance(effect, CompleteAdds):
            last = effect.last_entry_id
            while futures and futures[0][0] <= last:
                entry_id, future = futures.popleft()
                if not future.done():
                    future.set_result(entry_id)
        elif isinstance(effect, FailAdds):
            while futures and futures[-1][0] >= effect.first_entry_id:
                _, future = futures.pop()
                if not future.done():
                    future.set_exception(effect.error)
        elif isinstance(effect, Finished) and self._closed is not None and not self._closed.done():
            self._closed.set_result(effect)
        if not self._room.is_set() and self.machine.pending_count < self.pending_max:
            self._room.set()

    async def close(self) -> None:
        """Wait for pending appends, then seal the ledger at its LAC (compare-and-set)."""
        if self._futures:
            await asyncio.gather(*(future for _, future in self._futures), return_exceptions=True)
        while self.machine.state is WriterState.CHANGING_ENSEMBLE:
            await asyncio.sleep(0.01)
        try:
            if self.machine.state is WriterState.FAILED:
                raise self.machine.error or LedgerClosedError(f"ledger {self.ledger_id} failed")
            self._closed = self.loop.create_future()
            self.run(self.machine.close())
            finished = await self._closed
            if finished.error is not None:
                raise finished.error
        finally:
            self.stop_ticking()
            self._unwatch()


class _RangeRead(EffectDriver):
    """One read of a range: its own machine, results and clock, so reads of one handle may run
    at the same time."""

    def __init__(self, handle: ReadHandle, first: int, last: int) -> None:
        super().__init__(handle.context, handle.ledger_id, handle.master_key)
        settings = handle.context.settings
        self.machine = ReadOp(handle.ledger_id, handle.metadata, handle.digest, first, last,
                              speculative_ms=settings.speculative_read_ms,
                              read_timeout_ms=settings.read_timeout_ms)
        self.count = last - first + 1
        self.results: asyncio.Queue[Effect] = asyncio.Queue()

    def on_outcome(self, effect: Effect) -> None:
        if isinstance(effect, (CompleteRead, FailRead)):
            self.results.put_nowait(effect)

    async def entries(self) -> AsyncIterator[LedgerEntry]:
        self.start_ticking(self.context.settings.tick_interval_s)
        try:
            self.run(self.machine.start(self.now_ms()))
            for _ in range(self.count):
                result = await self.results.get()
                if isinstance(result, FailRead):
                    raise result.error
                assert isinstance(result, CompleteRead)
                yield LedgerEntry(self.ledger_id, result.entry_id, result.payload, result.length)
        finally:
            self.stop_ticking()


class ReadHandle:
    """Reads of one ledger: a range up to the LAC, or tailing an open ledger. Safe to share:
    each read runs its own state machine."""

    def __init__(self, context: DriverContext, ledger_id: int, metadata: LedgerMetadata, version: int,
                 digest: Digest, master_key: bytes) -> None:
        self.context = context
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.metadata = metadata
        self.version = version
        self.digest = digest
        self.last_add_confirmed = metadata.last_entry_id if metadata.is_closed else -1
        self._poll_index = 0
        self._poll_delays: Iterator[float] | None = None  # after failed long polls, the next waits

    @property
    def is_closed(self) -> bool:
        return self.metadata.is_closed

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        """Entries first..last; never past the LAC (A4) or a closed ledger's end (A5)."""
        limit = self.last_add_confirmed
        if first_entry_id < 0 or last_entry_id < first_entry_id:
            raise NoSuchEntryError(f"bad entry range {first_entry_id}..{last_entry_id}: need "
                                   "0 <= first <= last")
        if last_entry_id > limit:
            state = "last entry" if self.is_closed else "last add confirmed"
            raise NoSuchEntryError(f"entry {last_entry_id} of ledger {self.ledger_id} is past its "
                                   f"{state} ({limit})")
        return [entry async for entry in self._read_range(first_entry_id, last_entry_id)]

    async def _read_range(self, first: int, last: int) -> AsyncIterator[LedgerEntry]:
        """Entries first..last. A handle of an open ledger may hold metadata from before later
        ensemble changes, and would then ask bookies that never had the newer entries: when a read
        fails, re-read the metadata once and, if it moved, read the rest with the new ensembles."""
        next_entry_id = first
        refreshed = False
        while True:
            try:
                async for entry in _RangeRead(self, next_entry_id, last).entries():
                    yield entry
                    next_entry_id = entry.entry_id + 1
                return
            except DlogError:
                if refreshed or self.metadata.is_closed:
                    raise
                version = self.version
                await self.refresh_metadata()
                refreshed = True
                if self.version == version:
                    raise
                log.info("ledger %d: metadata moved to version %d during a read; reading entries %d..%d "
                         "again with its ensembles", self.ledger_id, self.version, next_entry_id, last)

    async def read_lac(self) -> int:
        """Ask every bookie of the last fragment; any bookie's LAC is a confirmed one, take the max."""
        if self.is_closed:
            return self.last_add_confirmed
        pool = self.context.pool
        futures = [pool.send(bookie, ReadRequest(pool.next_request_id(), self.ledger_id, -1))
                   for bookie in self.metadata.last_ensemble[1]]
        answers = await asyncio.gather(*futures, return_exceptions=True)
        # NO_LEDGER from a bookie of a ledger that exists in metadata: no add reached it yet
        lacs = [-1 if isinstance(answer, NoSuchLedgerError) else answer.lac for answer in answers
                if not isinstance(answer, BaseException) or isinstance(answer, NoSuchLedgerError)]
        if not lacs:
            raise next(a for a in answers if isinstance(a, BaseException))
        self.last_add_confirmed = max(self.last_add_confirmed, *lacs)
        return self.last_add_confirmed

    def advance_lac(self, entry_id: int) -> None:
        """Another authority (a committed stream segment) says entries up to `entry_id` were
        acknowledged: allow reads up to it before the bookies' LAC catches up."""
        if not self.is_closed:
            self.last_add_confirmed = max(self.last_add_confirmed, entry_id)

    async def refresh_metadata(self) -> None:
        self.metadata, self.version = await self.context.store.read_ledger(self.ledger_id)
        if self.metadata.is_closed:
            self.last_add_confirmed = self.metadata.last_entry_id

    async def tail(self, from_entry_id: int = 0, *, poll_timeout_ms: int = 1000,
                   batch_entries: int = 256) -> AsyncIterator[LedgerEntry]:
        """Every entry from `from_entry_id` on, following the writer; ends when the ledger is closed
        and its last entry was yielded."""
        next_entry_id = from_entry_id
        while True:
            if self.is_closed and next_entry_id > self.last_add_confirmed:
                return
            if next_entry_id <= self.last_add_confirmed:
                last = min(self.last_add_confirmed, next_entry_id + batch_entries - 1)
                async for entry in self._read_range(next_entry_id, last):
                    yield entry
                next_entry_id = last + 1
                continue
            polled = await self.wait_for_entry(next_entry_id, poll_timeout_ms)
            if polled is not None:
                yield polled
                next_entry_id += 1

    async def wait_for_entry(self, entry_id: int, timeout_ms: int) -> LedgerEntry | None:
        """Long-poll one bookie of the last fragment until the LAC reaches `entry_id` (at most
        `timeout_ms`). Returns the entry when the bookie piggybacked it, else None: then read it
        normally if `last_add_confirmed` moved past it, or wait again. A timeout re-reads the
        metadata, so a close is noticed (`is_closed`)."""
        # the first bookie of the entry's write set (then the next, after each failure): the one the
        # writer sends a drained pipeline's LAC to at once (LedgerWriter), which holds the entry,
        # so its answer carries the entry and the reader needs no second round trip to read it
        ensemble = self.metadata.last_ensemble[1]
        bookie = ensemble[(entry_id + self._poll_index) % len(ensemble)]
        pool = self.context.pool
        request = ReadRequest(pool.next_request_id(), self.ledger_id, entry_id, long_poll=True,
                              previous_lac=self.last_add_confirmed, timeout_ms=timeout_ms)
        try:
            answer = await pool.send(bookie, request, wait_s=timeout_ms / 1000)
        except DlogError as exc:
            log.debug("long poll to %s failed: %s", bookie, exc)
            self._poll_index += 1
            await self.refresh_metadata()
            if self._poll_delays is None:
                self._poll_delays = LONG_POLL_RETRY.delays_s(self.context.jitter)
            await asyncio.sleep(min(next(self._poll_delays, LONG_POLL_RETRY.delay_s_max), timeout_ms / 1000))
            return None
        self._poll_delays = None
        if answer.lac <= self.last_add_confirmed:
            await self.refresh_metadata()  # no progress: the writer may have closed or gone
            return None
        self.last_add_confirmed = answer.lac
        if not answer.packed_entry:
            return None  # this bookie is not in the entry's write set; read it normally
        try:
            entry = unpack_entry(self.digest, answer.packed_entry, self.ledger_id, entry_id)
        except DigestMismatchError:
            return None
        return LedgerEntry(self.ledger_id, entry_id, entry.payload, entry.length)


class RecoveryDriver(EffectDriver):
    def __init__(self, context: DriverContext, ledger_id: int, op: RecoveryOp, master_key: bytes) -> None:
        super().__init__(context, ledger_id, master_key)
        self.machine: RecoveryOp = op
        self._finished: asyncio.Future[Finished] = self.loop.create_future()

    def read_ok(self, bookie: str, entry_id: int, lac: int, packed_entry: bytes) -> list[Effect]:
        return self.machine.on_read_ok(bookie, entry_id, lac, packed_entry, self.now_ms())

    def on_outcome(self, effect: Effect) -> None:
        if isinstance(effect, Finished) and not self._finished.done():
            self._finished.set_result(effect)

    async def recover(self) -> Finished:
        self.start_ticking(self.context.settings.tick_interval_s)
        try:
            self.run(self.machine.start(self.now_ms()))
            return await self._finished
        finally:
            self.stop_ticking()


__all__ = ["LedgerEntry", "LedgerHandle", "ReadHandle", "RecoveryDriver"]
