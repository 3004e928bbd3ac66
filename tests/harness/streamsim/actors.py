"""The clients of a stream simulation: writer families, tailing readers, truncation, retention, a
sink, a monitor. Each records into the run's history exactly as the real-process workload does
(tests/harness/faults/clients.py), so the one stream checker judges both.

Writer families open sessions `w1.1`, `w1.2`... and write in three ways, drawn from the seed:
pipelined `write_nowait` (bounded by `wait_writable`), one awaited `write` at a time, and
`write_batch` (sometimes without the nullable `key` or the `timestamp` column). A session that
breaks records `writer_died`, is closed, and the next one takes the stream over; a write whose
future is still pending after its writer failed or closed, or a caller parked in
`wait_writable` that is never woken, is a liveness failure (every future ends, L7). A killed
family is a process that died: nothing of it answers any more, and its session expires later.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from bookkeeper.errors import ConfigError, DlogError
from dlog import Namespace, Offset, TruncatedError
from dlog.segments.codec import RecordSetCodec, default_schema, records_to_batch, split_batch
from dlog_spark.segments import SinkLockedError, commit_batch, delete_ledgers
from tests.harness.history import History, offset_list

if TYPE_CHECKING:
    from .simulation import StreamSimulation

STUCK_S = 20.0  # a caller parked in wait_writable longer than this after its writer ended is stuck
ORPHAN_WAIT_S = 5.0  # how long a closed writer's write futures may take to settle
CLOSE_TIMEOUT_S = 30.0
PROBE_WRITES = 10  # sequential writes after the heal, each within PROBE_BOUND_S
PROBE_BOUND_S = 0.025
LINGERS_MS = (0.0,) * 5 + (1.0, 3.0, 10.0)  # most sessions send at once; some linger (a roll meets a timer)


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


@dataclass(slots=True)
class Process:
    """One client process: a namespace on its own store session and ledger client."""

    namespace: Namespace
    session: Any
    client: Any
    alive: bool = True

    def kill(self) -> None:
        self.alive = False
        self.session.kill()
        self.client.kill()


class WriterFamily:
    def __init__(self, sim: StreamSimulation, family: str, rng: random.Random) -> None:
        self.sim, self.family, self.rng = sim, family, rng
        # lingers come from a generator of their own, so the scenario's other draws (and with them
        # the seeds that show each planted bug) stay as they were before writers lingered
        self.linger_rng = random.Random(f"linger {family} {sim.seed}")
        self.crash: BaseException | None = None  # what crashed this session's writer (a bug)
        self.history: History = sim.history
        self.process: Process | None = None
        self.sessions = 0
        self.count = 0
        self.acked: list[tuple[str, float, Any]] = []  # (value, invoked at, offset)
        self.stop = asyncio.Event()
        self.killed = asyncio.Event()
        self.probing = False
        self.writer: Any = None
        self._futures: dict[asyncio.Future[Any], tuple[str, str]] = {}

    async def run(self) -> None:
        sim = self.sim
        while not self.stop.is_set():
            if self.killed.is_set():  # the process is dead: nothing to close; a new one takes over
                self.killed.clear()
                self.process = None
            if self.process is None or not self.process.alive:
                self.process = await sim.new_process()
            writer = await self._open()
            if writer is None:
                await self._pause(0.2)
                continue
            self.writer = writer
            died = await self._write(writer)
            if self.killed.is_set():
                continue
            await self._close(writer, died)
            await self._pause(self.rng.uniform(0.0, 0.3))

    async def _pause(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except TimeoutError:
            pass

    async def _open(self, **overrides: Any) -> Any:
        assert self.process is not None
        self.sessions += 1
        self.session_name = name = f"{self.family}.{self.sessions}"
        self.crash = None
        sim = self.sim
        takeover = self.sessions > 1 or self.rng.random() < 0.5
        op = self.history.invoke(name, "open_writer", takeover=takeover)
        try:
            options = {"flush_records": self.rng.choice([5, 20, 200, 1000]),
                       "buffer_bytes_max": self.rng.choice([4096, 16384, 1 << 20]),
                       "retention_on_roll": sim.scenario.retention_on_roll,
                       "linger_ms": self.linger_rng.choice(LINGERS_MS), **overrides}
            writer = await self._unless_killed(self.process.namespace.open_writer(
                sim.stream, takeover=takeover, lock_timeout_s=0.3, **options))
        except DlogError as exc:
            self.history.complete(op, name, "open_writer", "fail", error=error_text(exc))
            return None
        self.history.complete(op, name, "open_writer", "ok", ledger=writer.segment.ledger_id)
        return writer

    async def _unless_killed(self, awaitable: Any) -> Any:
        """What `awaitable` gives, unless this process is killed first (DlogError: it never answers)."""
        work = asyncio.ensure_future(awaitable)
        killed = asyncio.ensure_future(self.killed.wait())
        await asyncio.wait({work, killed}, return_when=asyncio.FIRST_COMPLETED)
        killed.cancel()
        if not work.done():
            work.cancel()
            raise DlogError("the process was killed")
        return work.result()

    async def _write(self, writer: Any) -> bool:
        """Write until stopped, killed, the session's budget is spent, or the writer breaks; True
        when it broke (died)."""
        budget = self.rng.randint(20, 400)
        while not self.stop.is_set() and not self.killed.is_set() and budget > 0:
            if writer.error is not None:
                return True
            mode = self.rng.random()
            scenario = self.sim.scenario
            try:
                if mode < scenario.sequential_share or self.probing:
                    await self._sequential(writer)
                    budget -= 1
                elif mode < scenario.sequential_share + scenario.batch_share:
                    await self._batch(writer)
                    budget -= 5
                else:
                    budget -= await self._burst(writer)
            except DlogError:
                if writer.error is not None or self.crash is not None:
                    return True
            await asyncio.sleep(self.rng.uniform(0, scenario.write_gap_s))
        return writer.error is not None

    def _bug(self, error: BaseException) -> DlogError:
        """A write ended with an exception that is not one of dlog's errors: a crash in the library.
        Recorded for the checker; the session goes on as if its writer had died."""
        self.history.record(self.session_name, "bug", error=error_text(error))
        self.crash = self.crash or error
        return DlogError(f"the writer crashed: {error_text(error)}")

    def _value(self) -> str:
        self.count += 1
        padding = self.rng.getrandbits(8 * self.sim.scenario.padding_bytes).to_bytes(
            self.sim.scenario.padding_bytes, "big").hex()
        return f"{self.family}-{self.count:06d}-{padding}"

    async def _room(self, writer: Any) -> None:
        """wait_writable, bounded: a caller that is never woken after its writer ended is stuck."""
        if writer.writable and writer.error is None:
            return
        try:
            await asyncio.wait_for(self._unless_killed(writer.wait_writable()), STUCK_S)
        except (DlogError, asyncio.CancelledError):
            raise
        except TimeoutError:
            if writer.error is not None and not self.killed.is_set():
                self.history.record(self.session_name, "liveness", "fail",
                                    what=f"a caller of wait_writable of {self.session_name} was never woken after "
                                         f"its writer failed ({writer.error!r})")
            raise DlogError("stuck in wait_writable") from None
        except Exception as exc:
            raise self._bug(exc) from exc

    async def _sequential(self, writer: Any) -> None:
        await self._room(writer)
        value = self._value()
        name = self.session_name
        op = self.history.invoke(name, "write", value=value, probe=self.probing, bound_s=PROBE_BOUND_S)
        invoked = self.history.clock()
        try:
            offset = await self._unless_killed(writer.write(value.encode(), key=value[:6].encode()))
        except DlogError as exc:
            kind = "fail" if isinstance(exc, ConfigError) else "unknown"
            self.history.complete(op, name, "write", kind, value=value, error=error_text(exc))
            raise
        except Exception as exc:
            self.history.complete(op, name, "write", "unknown", value=value, error=error_text(exc))
            raise self._bug(exc) from exc
        self.history.complete(op, name, "write", "ok", value=value, offset=offset_list(offset), probe=self.probing,
                              position=offset.position)
        self.acked.append((value, invoked, offset))

    async def _burst(self, writer: Any, count: int | None = None) -> int:
        count = self.rng.randint(1, self.sim.scenario.burst_max) if count is None else count
        name = self.session_name
        for _ in range(count):
            await self._room(writer)
            value = self._value()
            op = self.history.invoke(name, "write", value=value)
            invoked = self.history.clock()
            try:
                future = writer.write_nowait(value.encode())
            except Exception as exc:
                self.history.complete(op, name, "write", "fail", value=value, error=error_text(exc))
                if not isinstance(exc, DlogError):
                    raise self._bug(exc) from exc
                raise
            self._futures[future] = (op, value)
            future.add_done_callback(lambda done, op=op, value=value, invoked=invoked, name=name:
                                     self._done(op, name, value, invoked, done))
        return count

    def _done(self, op: str, name: str, value: str, invoked: float, future: asyncio.Future[Any]) -> None:
        if self._futures.pop(future, None) is None:
            return
        if future.cancelled() or future.exception() is not None:
            error = "cancelled" if future.cancelled() else error_text(future.exception())
            if not future.cancelled() and not isinstance(future.exception(), DlogError):
                self._bug(future.exception())
            self.history.complete(op, name, "write", "unknown", value=value, error=error)
            return
        self.history.complete(op, name, "write", "ok", value=value, offset=offset_list(future.result()),
                              position=future.result().position)
        self.acked.append((value, invoked, future.result()))

    async def _batch(self, writer: Any) -> None:
        await self._room(writer)
        count = self.rng.randint(1, 5)
        values = [self._value() for _ in range(count)]
        columns: dict[str, Any] = {"value": pa.array([v.encode() for v in values], pa.binary())}
        if self.rng.random() < 0.5:
            columns["key"] = pa.array([v[:6].encode() for v in values], pa.binary())
        if self.rng.random() < 0.5:
            now = self.sim.clock.wall_ms()
            columns["timestamp"] = pa.array([now] * count, pa.timestamp("ms"))
        batch = pa.RecordBatch.from_pydict(columns)
        name = self.session_name
        ops = [self.history.invoke(name, "write", value=value) for value in values]
        try:
            written = await self._unless_killed(writer.write_batch(batch))
        except Exception as exc:
            kind = "fail" if isinstance(exc, ConfigError) else "unknown"
            for op, value in zip(ops, values):
                self.history.complete(op, name, "write", kind, value=value, error=error_text(exc))
            if not isinstance(exc, DlogError):
                raise self._bug(exc) from exc
            raise
        for op, value, offset in zip(ops, values, written):
            self.history.complete(op, name, "write", "ok", value=value, offset=offset_list(offset),
                                  position=offset.position)
            self.acked.append((value, self.history.clock(), offset))

    async def _close(self, writer: Any, died: bool) -> None:
        name = self.session_name
        if died:
            self.history.record(name, "writer_died", error=error_text(writer.error or self.crash))
        op = self.history.invoke(name, "close_writer")
        try:
            await asyncio.wait_for(self._unless_killed(writer.close()), CLOSE_TIMEOUT_S)
            self.history.complete(op, name, "close_writer", "ok")
        except Exception as exc:  # DlogError, TimeoutError, or the crash again
            self.history.complete(op, name, "close_writer", "fail", error=error_text(exc))
        deadline = self.history.clock() + ORPHAN_WAIT_S
        while self._futures and self.history.clock() < deadline:
            await asyncio.sleep(0.01)
        if self._futures:
            self.history.record(name, "liveness", "fail",
                                what=f"{len(self._futures)} writes of {name} never completed after the writer "
                                     f"was closed (error: {writer.error!r}); their callers would hang")
            for op, value in list(self._futures.values()):
                self.history.complete(op, name, "write", "unknown", value=value, error="orphaned")
            self._futures.clear()

    def kill(self) -> None:
        """kill -9: its writes in flight stay without an answer (unknown)."""
        if self.process is not None and self.process.alive:
            self.process.kill()
            self.killed.set()
            self._futures.clear()
            self.sim.graveyard.append(self.writer)  # its tasks stay pending: keep them referenced


class ReaderFamily:
    def __init__(self, sim: StreamSimulation, family: str, rng: random.Random, *, read_ahead_entries: int,
                 lag_s: float) -> None:
        self.sim, self.family, self.rng = sim, family, rng
        self.read_ahead_entries, self.lag_s = read_ahead_entries, lag_s
        self.history: History = sim.history
        self.values: set[str] = set()
        self.stop = asyncio.Event()
        self.position: Offset | None = None  # after the last record handed out

    async def run(self) -> None:
        process = await self.sim.new_process()
        start: Any = "earliest"
        skip, sessions = False, 1
        name = f"{self.family}#{sessions}"
        while not self.stop.is_set():
            self.history.record(name, "open_reader", start=str(start), skip_truncated=skip, lagging=self.lag_s > 0)
            try:
                reader = await process.namespace.open_reader(
                    self.sim.stream, start, follow=True, skip_truncated=skip, poll_timeout_ms=500,
                    read_ahead_entries=self.read_ahead_entries, read_ahead_bytes=self.rng.choice([2000, 1 << 20]))
            except TruncatedError as exc:
                sessions, start, skip = sessions + 1, "earliest", True
                self.history.record(name, "reader_error", error=error_text(exc))
                name = f"{self.family}#{sessions}"
                continue
            except DlogError as exc:
                self.history.record(name, "reader_error", error=error_text(exc))
                await asyncio.sleep(0.2)
                continue
            try:
                await self._follow(reader, name)
            except TruncatedError as exc:
                sessions, start, skip = sessions + 1, "earliest", True
                self.history.record(name, "reader_error", error=error_text(exc))
                name = f"{self.family}#{sessions}"
            except DlogError as exc:
                self.history.record(name, "reader_error", error=error_text(exc))
                start = self.position or start
                await asyncio.sleep(0.2)
            finally:
                await reader.close()

    async def _follow(self, reader: Any, name: str) -> None:
        stopped = asyncio.ensure_future(self.stop.wait())
        try:
            while not self.stop.is_set():
                entry = await self._next(reader, stopped)
                if entry is None:
                    return
                await self._consume(entry, name)
        finally:
            stopped.cancel()

    @staticmethod
    async def _next(reader: Any, stopped: asyncio.Future[Any]) -> Any:
        """The next entry, or None once stopped. The consumer waits on the reader alone, as a user's
        `async for` does, not in short polls: a reader that queues an entry without waking its
        consumer stalls here for good, and the catch-up check reports it (reader_behind)."""
        waiting = asyncio.ensure_future(reader.next_entry())
        await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done():
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            return None
        return waiting.result()

    async def _consume(self, entry: Any, name: str) -> None:
        for slot, value in enumerate(entry.batch.column("value").to_pylist()):
            text = value.decode()
            position = None if entry.first_position is None else entry.first_position + slot
            self.history.read(name, (entry.ledger_id, entry.entry_id, entry.first_slot + slot), text,
                              position=position)
            self.values.add(text)
            if self.lag_s:
                await asyncio.sleep(self.lag_s)
        self.position = Offset(entry.ledger_id, entry.entry_id, entry.first_slot + entry.batch.num_rows)


@dataclass
class Sink:
    """Spark-sink-style commits: task ledgers written directly, appended by commit_batch."""

    sim: StreamSimulation
    rng: random.Random
    batch_id: int = 0
    count: int = 0
    codec: RecordSetCodec = field(default_factory=lambda: RecordSetCodec(default_schema()))

    async def commit_one(self, process: Process) -> str:
        history, namespace = self.sim.history, process.namespace
        self.batch_id += 1 if self.rng.random() < 0.8 else 0  # sometimes Spark replays a batch
        name = f"sink.{self.batch_id}"
        messages, ops = [], []
        config = await namespace.config(self.sim.stream)
        for _ in range(self.rng.randint(1, 2)):
            values = []
            for _ in range(self.rng.randint(1, 8)):
                self.count += 1
                values.append(f"sink-{self.count:06d}")
            ops += [(history.invoke(name, "write", value=value), value) for value in values]
            messages.append(await self._task_ledger(namespace, config, values))
        written = [m.ledger_id for m in messages]
        history.record("nemesis", "fault", kind="sink_commit", ledgers=written)
        commit = history.invoke(name, "sink_commit", ledgers=written)
        try:
            appended = await commit_batch(namespace, self.sim.stream, messages, self.batch_id, "simsink")
            history.complete(commit, name, "sink_commit", "ok")
        except DlogError as exc:
            history.complete(commit, name, "sink_commit", "fail", error=error_text(exc))
            return await self._failed(namespace, name, ops, written, exc)
        if not appended:
            for op, value in ops:
                history.complete(op, name, "write", "fail", value=value, error="a replayed batch")
            return "replay"
        index = 0
        listing = self.sim.metadata.stream(self.sim.stream).listing  # read as is: no await, no draw
        for message in messages:
            segment = listing.by_ledger(message.ledger_id)
            position = None if segment is None else segment.first_position  # its records follow on from it
            for entry_id, count in message.entries:
                for slot in range(count):
                    op, value = ops[index]
                    history.complete(op, name, "write", "ok", value=value,
                                     offset=[message.ledger_id, entry_id, slot], position=position)
                    position = None if position is None else position + 1
                    index += 1
        history.record(name, "sink_ledgers", ledgers=written)
        return f"appended {written}"

    async def _failed(self, namespace: Namespace, name: str, ops: list[tuple[str, str]], written: list[int],
                      exc: DlogError) -> str:
        history = self.sim.history
        if isinstance(exc, SinkLockedError):
            await delete_ledgers(namespace, written, stream=self.sim.stream)  # Spark's abort
            for op, value in ops:
                history.complete(op, name, "write", "fail", value=value, error=error_text(exc))
            return "locked out"
        for op, value in ops:
            history.complete(op, name, "write", "unknown", value=value, error=error_text(exc))
        return f"failed: {exc}"

    async def _task_ledger(self, namespace: Namespace, config: Any, values: list[str]) -> Any:
        handle = await namespace.client.create_ledger(config.ensemble, config.write_quorum, config.ack_quorum,
                                                      password=namespace.password_of(config),
                                                      custom={"stream": self.sim.stream, "writer": "sim-sink"})
        batch = records_to_batch([v.encode() for v in values], timestamps_ms=[self.sim.clock.wall_ms()] * len(values))
        message = SinkMessage(handle.ledger_id, created_ms=self.sim.clock.wall_ms())
        for piece in split_batch(batch, 1 << 20):
            payload = self.codec.encode(piece, message.records)
            header = self.codec.peek_header(payload)
            if message.records == 0:
                message.first_timestamp_ms = header.min_timestamp_ms
            message.last_timestamp_ms = max(message.last_timestamp_ms, header.max_timestamp_ms)
            entry_id = await handle.append_async(payload)
            message.entries.append((entry_id, piece.num_rows))
            message.records += piece.num_rows
            message.bytes += len(payload)
        await handle.close()
        message.last_entry = handle.last_add_confirmed
        return message


@dataclass
class SinkMessage:
    """What dlog_spark.sink's DlogCommitMessage carries (commit_batch reads only these)."""

    ledger_id: int
    last_entry: int = -1
    records: int = 0
    bytes: int = 0
    first_timestamp_ms: int = 0
    last_timestamp_ms: int = 0
    created_ms: int = 0
    entries: list[tuple[int, int]] = field(default_factory=list)

    @property
    def ledger(self) -> int:
        return self.ledger_id
