"""Ledger handles: asyncio drivers that execute the effects of the sans-IO state machines.

A handle owns one machine (LedgerWriter, RecoveryOp or ReadOp), feeds it bookie answers, metadata
outcomes and clock ticks, and carries out what it returns: requests through the shared bookie
pool, compare-and-set writes through the metadata store (bounded retries with back-off while the
store is unreachable), completions into the futures its callers await. The handles decide nothing
about replication themselves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from bookkeeper.errors import (
    DlogError,
    LedgerClosedError,
    MetadataError,
    MetadataVersionError,
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
    SendAdd,
    SendRead,
    SendWriteLac,
    WriteMetadata,
)
from bookkeeper.protocol.entry import Digest, DigestMismatchError, unpack_entry
from bookkeeper.protocol.metadata import LedgerMetadata
from bookkeeper.protocol.reader import ReadOp
from bookkeeper.protocol.recovery import RecoveryOp
from bookkeeper.protocol.wire import ReadRequest, WriteLacRequest, encode_add_request
from bookkeeper.protocol.writer import LedgerWriter, WriterState
from bookkeeper.retry import Backoff, retry

if TYPE_CHECKING:
    from bookkeeper.client.settings import DriverContext

log = logging.getLogger(__name__)
# while the store is unreachable: 9 attempts, 0.05 s doubling to 2 s between them (~8 s in all)
METADATA_WRITE_RETRY = Backoff(attempts_max=9, delay_s_first=0.05, delay_s_max=2.0, deadline_s=12.0)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    ledger_id: int
    entry_id: int
    payload: bytes
    length: int = -1  # the ledger's length in bytes up to and including this entry (-1: unknown)


class _Driver:
    """Runs effects for one machine; subclasses route answers to their machine."""

    machine: Any

    def __init__(self, context: DriverContext, ledger_id: int, master_key: bytes) -> None:
        self.context = context
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.loop = asyncio.get_running_loop()
        self._tick_task: asyncio.Task[None] | None = None
        self._metadata_tasks: set[asyncio.Task[None]] = set()

    def now_ms(self) -> int:
        return int(self.loop.time() * 1000)

    def start_ticking(self, interval_s: float) -> None:
        async def tick() -> None:
            while True:
                await asyncio.sleep(interval_s)
                self.run(self.machine.on_tick(self.now_ms()))

        self._tick_task = self.loop.create_task(tick())

    def stop_ticking(self) -> None:
        if self._tick_task is not None:
            self._tick_task.cancel()
            self._tick_task = None

    def run(self, effects: list[Effect]) -> None:
        for effect in effects:
            kind = type(effect)
            if kind is SendAdd:
                self._send_add(effect)  # type: ignore[arg-type]
            elif kind is SendRead:
                self._send_read(effect)  # type: ignore[arg-type]
            elif kind is SendWriteLac:
                self._send_write_lac(effect)  # type: ignore[arg-type]
            elif kind is WriteMetadata:
                task = self.loop.create_task(self._write_metadata(effect))  # type: ignore[arg-type]
                self._metadata_tasks.add(task)
                task.add_done_callback(self._metadata_tasks.discard)
            else:
                self.on_outcome(effect)

    def on_outcome(self, effect: Effect) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ bookie requests

    def _send_add(self, effect: SendAdd) -> None:
        pool = self.context.pool
        request_id = pool.next_request_id()
        frame = encode_add_request(request_id, self.ledger_id, effect.entry_id, self.master_key,
                                   effect.packed_entry, effect.recovery)
        bookie, entry_id, machine = effect.bookie, effect.entry_id, self.machine

        def answered(outcome: Any) -> None:
            if isinstance(outcome, BaseException):
                self.run(machine.on_add_error(bookie, entry_id, _as_dlog_error(outcome), self.now_ms()))
            else:
                self.run(machine.on_add_ok(bookie, entry_id, self.now_ms()))

        pool.send_callback(bookie, request_id, frame, answered)

    def _send_read(self, effect: SendRead) -> None:
        pool = self.context.pool
        request = ReadRequest(pool.next_request_id(), self.ledger_id, effect.entry_id, effect.fence,
                              self.master_key if effect.fence else b"")
        future = pool.send(effect.bookie, request)
        bookie, entry_id = effect.bookie, effect.entry_id

        def done(answer: asyncio.Future[Any]) -> None:
            error = answer.exception()
            if error is None:
                self.on_read_ok(bookie, entry_id, answer.result())
            else:
                self.run(self.machine.on_read_error(bookie, entry_id, _as_dlog_error(error),
                                                    self.now_ms()))

        future.add_done_callback(done)

    def on_read_ok(self, bookie: str, entry_id: int, response: Any) -> None:
        self.run(self.machine.on_read_ok(bookie, entry_id, response.packed_entry, self.now_ms()))

    def _send_write_lac(self, effect: SendWriteLac) -> None:
        pool = self.context.pool
        future = pool.send(effect.bookie, WriteLacRequest(pool.next_request_id(), self.ledger_id,
                                                          self.master_key, effect.lac))
        future.add_done_callback(_log_failure(f"explicit LAC of ledger {self.ledger_id} to {effect.bookie}"))

    # ------------------------------------------------------------------ metadata

    async def _write_metadata(self, effect: WriteMetadata) -> None:
        """Compare-and-set the metadata, retrying while the store is unreachable (bounded by
        METADATA_WRITE_RETRY); a lost compare-and-set or a deleted ledger goes to the machine."""
        store = self.context.store

        async def attempt() -> tuple[LedgerMetadata | None, int]:
            try:
                return None, await store.write_ledger(self.ledger_id, effect.metadata,
                                                      effect.expected_version)
            except MetadataVersionError:
                return await store.read_ledger(self.ledger_id)  # what won, to rebase on

        try:
            current, version = await retry(attempt, METADATA_WRITE_RETRY,
                                           what=f"ledger {self.ledger_id} metadata write")
        except NoSuchLedgerError as exc:  # deleted under the writer: nothing to retry
            self.run(self.machine.on_metadata_failed(exc))
            return
        except MetadataError as exc:
            self.run(self.machine.on_metadata_failed(MetadataError(
                f"ledger {self.ledger_id}: the metadata store stayed unreachable "
                f"(gave up after {METADATA_WRITE_RETRY.attempts_max} attempts): {exc}")))
            return
        if current is not None:
            self.run(self.machine.on_metadata_conflict(current, version, self.now_ms()))
        else:
            self.run(self.machine.on_metadata_written(effect.metadata, version, self.now_ms()))


class LedgerHandle(_Driver):
    """The writer of one open ledger."""

    def __init__(self, context: DriverContext, ledger_id: int, writer: LedgerWriter,
                 master_key: bytes) -> None:
        super().__init__(context, ledger_id, master_key)
        self.machine: LedgerWriter = writer
        self.pending_max = context.settings.pending_adds_max
        self._futures: dict[int, asyncio.Future[int]] = {}
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
        while len(self._futures) >= self.pending_max:
            self._room.clear()
            await self._room.wait()
        return await self.append_async(payload)

    def append_async(self, payload: bytes) -> asyncio.Future[int]:
        """Append without waiting (the caller bounds how many are in flight)."""
        entry_id, effects = self.machine.append(payload, self.now_ms())
        future: asyncio.Future[int] = self.loop.create_future()
        self._futures[entry_id] = future
        self.run(effects)
        return future

    def on_outcome(self, effect: Effect) -> None:
        if isinstance(effect, CompleteAdds):
            for entry_id in range(effect.first_entry_id, effect.last_entry_id + 1):
                future = self._futures.pop(entry_id, None)
                if future is not None and not future.done():
                    future.set_result(entry_id)
        elif isinstance(effect, FailAdds):
            for entry_id in [e for e in self._futures if e >= effect.first_entry_id]:
                future = self._futures.pop(entry_id)
                if not future.done():
                    future.set_exception(effect.error)
        elif isinstance(effect, Finished):
            if self._closed is not None and not self._closed.done():
                self._closed.set_result(effect)
        if len(self._futures) < self.pending_max and not self._room.is_set():
            self._room.set()

    async def close(self) -> None:
        """Wait for pending appends, then seal the ledger at its LAC (compare-and-set)."""
        if self._futures:
            await asyncio.gather(*self._futures.values(), return_exceptions=True)
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


class _RangeRead(_Driver):
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
            entry = await self.wait_for_entry(next_entry_id, poll_timeout_ms)
            if entry is not None:
                yield entry
                next_entry_id += 1

    async def wait_for_entry(self, entry_id: int, timeout_ms: int) -> LedgerEntry | None:
        """Long-poll one bookie of the last fragment until the LAC reaches `entry_id` (at most
        `timeout_ms`). Returns the entry when the bookie piggybacked it, else None: then read it
        normally if `last_add_confirmed` moved past it, or wait again. A timeout re-reads the
        metadata, so a close is noticed (`is_closed`)."""
        ensemble = self.metadata.last_ensemble[1]
        bookie = ensemble[self._poll_index % len(ensemble)]
        pool = self.context.pool
        request = ReadRequest(pool.next_request_id(), self.ledger_id, entry_id, long_poll=True,
                              previous_lac=self.last_add_confirmed, timeout_ms=timeout_ms)
        try:
            answer = await pool.send(bookie, request, wait_s=timeout_ms / 1000)
        except DlogError as exc:
            log.debug("long poll to %s failed: %s", bookie, exc)
            self._poll_index += 1
            await self.refresh_metadata()
            await asyncio.sleep(min(0.05, timeout_ms / 1000))
            return None
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


class RecoveryDriver(_Driver):
    def __init__(self, context: DriverContext, ledger_id: int, op: RecoveryOp, master_key: bytes) -> None:
        super().__init__(context, ledger_id, master_key)
        self.machine: RecoveryOp = op
        self._finished: asyncio.Future[Finished] = self.loop.create_future()

    def on_read_ok(self, bookie: str, entry_id: int, response: Any) -> None:
        self.run(self.machine.on_read_ok(bookie, entry_id, response.lac, response.packed_entry,
                                         self.now_ms()))

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


def _as_dlog_error(error: BaseException) -> DlogError:
    if isinstance(error, DlogError):
        return error
    return DlogError(f"unexpected {type(error).__name__}: {error}")


def _log_failure(what: str) -> Callable[[asyncio.Future[Any]], None]:
    def done(future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.debug("%s failed: %s", what, future.exception())

    return done


__all__ = ["LedgerEntry", "LedgerHandle", "ReadHandle", "RecoveryDriver"]
