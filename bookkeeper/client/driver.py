"""The base of every ledger driver: executes a sans-IO machine's effects over the bookie pool.

Theory of operation. A driver owns one machine (LedgerWriter, RecoveryOp or ReadOp) and carries
out what it returns: adds go to each bookie's batcher (one ADD_BATCH frame per bookie per loop
iteration, whatever the ledger) and come back in bulk through `on_adds_answered`; the reads one
`run()` asks of one bookie leave together at its end as READ_RANGE requests where they form a
range (`batcher.plan_range_reads`), and each entry's answer is fed to the machine as if it had
been read alone; compare-and-set writes go through the metadata store with bounded retries; clock
ticks drive timeouts. The driver decides nothing about replication itself.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import weakref
from typing import TYPE_CHECKING, Any

from bookkeeper.client.batcher import plan_range_reads
from bookkeeper.clock import loop_s
from bookkeeper.errors import (
    BookieIOError,
    DlogError,
    MetadataError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from bookkeeper.protocol.batch import ReadRangeRequest, ReadRangeResponse
from bookkeeper.protocol.effects import Effect, LacDueSoon, SendAdd, SendRead, SendWriteLac, WriteMetadata
from bookkeeper.protocol.metadata import LedgerMetadata
from bookkeeper.protocol.ticks import STALL_MS
from bookkeeper.protocol.wire import ReadRequest, WriteLacRequest
from bookkeeper.retry import Backoff, retry

if TYPE_CHECKING:
    from bookkeeper.client.settings import DriverContext

log = logging.getLogger(__name__)
# Event-loop turns between a drained pipeline and its explicit LAC (LacDueSoon): a stream writer's
# caller that awaits each write has sent its next add by then (its acknowledgement reaches the
# caller and the caller's next write() reaches the ledger within two turns), which carries the LAC
# to two of three bookies; an idle writer's LAC goes out after these few turns (microseconds).
LAC_DUE_TURNS = 3
# while the store is unreachable: 9 attempts, 0.05 s doubling to 2 s between them (~8 s in all)
METADATA_WRITE_RETRY = Backoff(attempts_max=9, delay_s_first=0.05, delay_s_max=2.0, deadline_s=12.0)
READ_RANGE_BYTES_MAX = 4 * 2**20  # asked of a bookie per READ_RANGE answer


class EffectDriver:
    """Runs effects for one machine; subclasses route outcomes (`on_outcome`) to their callers."""

    machine: Any

    def __init__(self, context: DriverContext, ledger_id: int, master_key: bytes) -> None:
        self.context = context
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.loop = asyncio.get_running_loop()
        self._ticker: _Ticker | None = None
        self._metadata_tasks: set[asyncio.Task[None]] = set()
        self._reads: dict[tuple[str, bool], list[int]] = {}  # asked in this run(), per bookie

    def now_ms(self) -> int:
        return int(self.context.clock.monotonic_s() * 1000)

    def start_ticking(self, interval_s: float) -> None:
        """Feed the machine `on_tick` every `interval_s` (shared with every driver of the loop that
        ticks at that interval: one timer for 1,000 open ledgers, not 1,000 tasks)."""
        self._ticker = _Ticker.of(self.loop, interval_s)
        self._ticker.add(self)

    def stop_ticking(self) -> None:
        if self._ticker is not None:
            self._ticker.drivers.pop(self, None)
            self._ticker = None

    def tick(self, stall_ms: int = 0) -> None:
        """`stall_ms`: how long the loop did not run before this tick (0: it ran; ticks.py)."""
        now_ms = self.now_ms()
        self.run(self.machine.on_tick(now_ms, now_ms - stall_ms if stall_ms else None))

    def run(self, effects: list[Effect]) -> None:
        pool = self.context.pool
        for effect in effects:
            kind = type(effect)
            if kind is SendAdd:
                pool.queue_add(effect.bookie, self, self.ledger_id, self.master_key,  # type: ignore[union-attr]
                               effect.recovery, effect.entry_id, effect.packed_entry)  # type: ignore[union-attr]
            elif kind is SendRead:
                self._reads.setdefault((effect.bookie, effect.fence), []).append(effect.entry_id)  # type: ignore[union-attr]
            elif kind is SendWriteLac:
                self._send_write_lac(effect)  # type: ignore[arg-type]
            elif kind is LacDueSoon:
                _LacDueTurns.of(self.loop).add(self)
            elif kind is WriteMetadata:
                task = self.loop.create_task(self._write_metadata(effect))  # type: ignore[arg-type]
                self._metadata_tasks.add(task)
                task.add_done_callback(self._metadata_tasks.discard)
            else:
                self.on_outcome(effect)
        if self._reads:
            reads, self._reads = self._reads, {}
            for (bookie, fence), entry_ids in reads.items():
                self._send_reads(bookie, fence, entry_ids)

    def on_outcome(self, effect: Effect) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ adds

    def on_adds_answered(self, bookie: str, ok_entry_ids: list[int],
                         failures: list[tuple[int, DlogError]]) -> None:
        """An ADD_BATCH answer for this driver's entries in it (batcher.py), in bulk."""
        machine, now_ms = self.machine, self.now_ms()
        effects = machine.on_adds_ok(bookie, ok_entry_ids, now_ms) if ok_entry_ids else []
        for entry_id, error in failures:
            effects += machine.on_add_error(bookie, entry_id, error, now_ms)
        self.run(effects)

    # ------------------------------------------------------------------ reads

    def _send_reads(self, bookie: str, fence: bool, entry_ids: list[int]) -> None:
        ranges, singles = plan_range_reads([entry_id for entry_id in entry_ids if entry_id >= 0])
        for first, last, stride in ranges:
            wanted = [entry_id for entry_id in entry_ids if first <= entry_id <= last]
            self._send_range(bookie, fence, first, last, stride, wanted)
        for entry_id in [*singles, *(entry_id for entry_id in entry_ids if entry_id < 0)]:
            self._send_read(bookie, fence, entry_id)

    def _send_read(self, bookie: str, fence: bool, entry_id: int) -> None:
        pool = self.context.pool
        request = ReadRequest(pool.next_request_id(), self.ledger_id, entry_id, fence,
                              self.master_key if fence else b"")

        def done(answer: asyncio.Future[Any]) -> None:
            error = answer.exception()
            if error is None:
                response = answer.result()
                self.run(self.read_ok(bookie, entry_id, response.lac, response.packed_entry))
            else:
                self.run(self.machine.on_read_error(bookie, entry_id, as_dlog_error(error),
                                                    self.now_ms()))

        pool.send(bookie, request).add_done_callback(done)

    def _send_range(self, bookie: str, fence: bool, first: int, last: int, stride: int,
                    wanted: list[int]) -> None:
        pool = self.context.pool
        request = ReadRangeRequest(pool.next_request_id(), self.ledger_id, first, last, stride,
                                   READ_RANGE_BYTES_MAX, fence, self.master_key if fence else b"")

        def done(answer: asyncio.Future[Any]) -> None:
            error = answer.exception()
            if error is None:
                self._range_answered(bookie, fence, wanted, answer.result())
            else:
                self._range_failed(bookie, fence, wanted, as_dlog_error(error))

        pool.send(bookie, request).add_done_callback(done)

    def _range_answered(self, bookie: str, fence: bool, wanted: list[int],
                        response: ReadRangeResponse) -> None:
        """Each wanted entry's answer as a plain read would have given it; entries past what the
        answer covered (its byte limit) are asked again."""
        got = dict(response.entries)
        covered, now_ms = response.covered_last_entry_id, self.now_ms()
        effects: list[Effect] = []
        again: list[int] = []
        for entry_id in wanted:
            packed_entry = got.get(entry_id)
            if packed_entry is not None:
                effects += self.read_ok(bookie, entry_id, response.lac, packed_entry)
            elif entry_id <= covered:
                effects += self.machine.on_read_error(bookie, entry_id, NoSuchEntryError(
                    f"{bookie}: no entry {self.ledger_id}:{entry_id} on this bookie"), now_ms)
            else:
                again.append(entry_id)
        if again:
            self._reads.setdefault((bookie, fence), []).extend(again)
        self.run(effects)

    def _range_failed(self, bookie: str, fence: bool, wanted: list[int], error: DlogError) -> None:
        """IO_ERROR is about the range's first entry (the bookie stops before later damage): the
        others are asked again; any other error is every wanted entry's."""
        now_ms = self.now_ms()
        if isinstance(error, BookieIOError) and len(wanted) > 1:
            self._reads.setdefault((bookie, fence), []).extend(wanted[1:])
            self.run(self.machine.on_read_error(bookie, wanted[0], error, now_ms))
            return
        effects: list[Effect] = []
        for entry_id in wanted:
            effects += self.machine.on_read_error(bookie, entry_id, error, now_ms)
        self.run(effects)

    def read_ok(self, bookie: str, entry_id: int, lac: int, packed_entry: bytes) -> list[Effect]:
        return self.machine.on_read_ok(bookie, entry_id, packed_entry, self.now_ms())

    # ------------------------------------------------------------------ explicit LAC

    def lac_due(self) -> None:
        """LacDueSoon's turns passed (only a writer asks for it)."""
        self.run(self.machine.on_lac_due(self.now_ms()))

    def _send_write_lac(self, effect: SendWriteLac) -> None:
        pool = self.context.pool
        bookie, lac = effect.bookie, effect.lac
        future = pool.send(bookie, WriteLacRequest(pool.next_request_id(), self.ledger_id, self.master_key, lac))

        def done(answer: asyncio.Future[Any]) -> None:
            if answer.cancelled():
                return
            error = answer.exception()
            if error is None:
                self.machine.on_write_lac_answered(bookie, lac)  # only a writer sends WRITE_LACs
            else:  # left unconfirmed: the ticker sends it again while repeats are left
                log.debug("explicit LAC %d of ledger %d to %s failed: %s", lac, self.ledger_id, bookie, error)

        future.add_done_callback(done)

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
                                           what=f"ledger {self.ledger_id} metadata write",
                                           rng=self.context.jitter, clock=self.context.clock)
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


class _Ticker:
    """One repeating timer per event loop and interval, ticking every driver registered with it."""

    _tickers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, _Ticker]] = (
        weakref.WeakKeyDictionary())

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float) -> None:
        self.loop = loop
        self.interval_s = interval_s
        self.drivers: dict[EffectDriver, None] = {}  # in the order they started ticking
        self._timer: asyncio.TimerHandle | None = None
        self._armed_s = 0.0  # the loop's time when the timer was last armed: the loop ran then

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop, interval_s: float) -> _Ticker:
        tickers = cls._tickers.setdefault(loop, {})
        ticker = tickers.get(interval_s)
        if ticker is None:
            ticker = tickers[interval_s] = cls(loop, interval_s)
        return ticker

    def add(self, driver: EffectDriver) -> None:
        self.drivers[driver] = None
        if self._timer is None:
            self._arm()

    def _arm(self) -> None:
        self._armed_s = loop_s(self.loop)
        self._timer = self.loop.call_later(self.interval_s, self._tick)

    def _tick(self) -> None:
        """Tick every driver; a tick STALL_MS late says since when the loop did not run (ticks.py)."""
        self._timer = None
        since_armed_s = loop_s(self.loop) - self._armed_s
        stall_ms = round(since_armed_s * 1000) if (since_armed_s - self.interval_s) * 1000 >= STALL_MS else 0
        for driver in list(self.drivers):
            if driver in self.drivers:  # an earlier tick may have stopped it
                try:
                    driver.tick(stall_ms)
                except Exception:  # one driver's failure must not stop the others' clocks
                    log.exception("tick of ledger %d failed", driver.ledger_id)
        if self.drivers:
            self._arm()


class _LacDueTurns:
    """Per event loop: the drivers whose explicit LAC is due LAC_DUE_TURNS turns after they asked
    (LacDueSoon), served by one callback a turn for all of them, not a chain of callbacks each. At
    most one entry per drained pipeline; each is served once."""

    _of: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LacDueTurns] = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.turns: collections.deque[list[EffectDriver]] = collections.deque()  # [0]: the next turn's
        self._scheduled = False

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _LacDueTurns:
        due = cls._of.get(loop)
        if due is None:
            due = cls._of[loop] = cls(loop)
        return due

    def add(self, driver: EffectDriver) -> None:
        turns = self.turns
        while len(turns) < LAC_DUE_TURNS:
            turns.append([])
        turns[LAC_DUE_TURNS - 1].append(driver)
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._turn)

    def _turn(self) -> None:
        due = self.turns.popleft()
        if any(self.turns):
            self.loop.call_soon(self._turn)
        else:
            self.turns.clear()
            self._scheduled = False
        for driver in due:
            try:
                driver.lac_due()
            except Exception:  # one driver's failure must not keep the others' LACs back
                log.exception("explicit LAC of ledger %d failed", driver.ledger_id)


def as_dlog_error(error: BaseException) -> DlogError:
    if isinstance(error, DlogError):
        return error
    return DlogError(f"unexpected {type(error).__name__}: {error}")
