"""The clients of the fault workload: writer families, tailing readers, writer processes.

Writers are named by family and session: writer family `w1` opens session `w1.1`; when that
session breaks (fenced, out of bookies, ZooKeeper gone) it is closed and `w1.2` opens with
takeover, as an application would. A write whose `write_nowait` raises was certainly not
written (`fail`); any error of its future leaves the outcome `unknown`. Reader sessions are named
`r1#1`; a reader that fails reopens at its position under the same name (so the checker also sees
that resuming skips and repeats nothing), and starts a new session only when it must skip
truncated records. `WriterProcess` runs a writer family as its own process (writer_process.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bookkeeper.errors import DlogError
from dlog import Namespace, TruncatedError, WriterFencedError
from dlog.writer import StreamWriter
from tests.harness.history import History, offset_list

POLL_S = 0.02
STOP_TIMEOUT_S = 20.0
ORPHAN_WAIT_S = 4.0  # how long a closed writer's unresolved write futures may take to settle
STUCK_ERRORS_MAX = 10  # reader errors in a row at one position before its namespace is renewed


class ClusterLike(Protocol):
    zk_address: str
    zk_root: str


@dataclass(frozen=True)
class Settings:
    stream: str = "faults"
    namespace: str = "faults"
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    roll_records: int = 300
    flush_records: int = 20
    linger_ms: float = 2.0
    write_interval_s: float = 0.002
    in_flight_max: int = 100
    writes_max: int = 4000  # per writer family
    readers: int = 2
    poll_timeout_ms: int = 500
    add_timeout_s: float = 2.0
    read_timeout_s: float = 2.0
    reopen_delay_s: float = 0.2
    lock_timeout_s: float = 0.3
    resume_bound_s: float = 25.0
    zk_session_timeout_s: float | None = None  # None: the namespace's default
    replication_timeout_s: float | None = None  # wait this long for full replication, then check it


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def namespace_for(cluster: ClusterLike, settings: Settings) -> Namespace:
    """A namespace of the cluster's streams, as every client of one run opens it."""
    return Namespace(cluster.zk_address, settings.namespace, bookkeeper_root=cluster.zk_root,
                     root=f"{cluster.zk_root}-dlog", add_timeout_s=settings.add_timeout_s,
                     read_timeout_s=settings.read_timeout_s)


async def start_namespace(cluster: ClusterLike, settings: Settings, deadline_s: float = 30.0) -> Namespace:
    """Start a namespace, retrying while ZooKeeper is unreachable (a fault may be on)."""
    deadline = time.monotonic() + deadline_s
    while True:
        namespace = namespace_for(cluster, settings)
        try:
            return await namespace.start()
        except DlogError:
            with contextlib.suppress(DlogError):
                await namespace.close()
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.2)


# ---------------------------------------------------------------------------------- writers


class WriterLoop:
    """One writer family: sessions of a StreamWriter, reopened with takeover when one breaks."""

    def __init__(self, cluster: ClusterLike, settings: Settings, history: History, family: str, *,
                 takeover: bool = True, reopen_on_fence: bool = True, reopen: bool = True,
                 writes_max: int | None = None) -> None:
        self.cluster = cluster
        self.settings = settings
        self.history = history
        self.family = family
        self.takeover = takeover
        self.reopen_on_fence = reopen_on_fence
        self.reopen = reopen  # False: the family ends with its first session, whatever broke it
        self.writes_max = settings.writes_max if writes_max is None else writes_max
        self.namespace: Namespace | None = None
        self.writer: StreamWriter | None = None
        self.session_name = ""
        self.sessions = 0
        self.count = 0
        self.acked: list[tuple[str, float, float]] = []  # (value, invoked at, acknowledged at)
        self.offsets: list[Any] = []  # of acknowledged writes, in acknowledgement order
        self.opened = asyncio.Event()  # set whenever a session is open
        self.may_reopen = asyncio.Event()  # cleared: a broken session is not replaced until set
        self.may_reopen.set()
        self._in_flight: dict[str, dict[asyncio.Future[Any], tuple[str, str]]] = {}  # -> (op, value)
        self.orphaned = 0
        self._room = asyncio.Event()
        self.stop = asyncio.Event()

    @property
    def in_flight(self) -> int:
        return sum(len(futures) for futures in self._in_flight.values())

    async def run(self) -> None:
        self.namespace = await start_namespace(self.cluster, self.settings)
        try:
            while not self.stop.is_set() and self.count < self.writes_max:
                if not self.may_reopen.is_set():
                    await self._pause(0.05)
                    continue
                writer = await self._open_session()
                if writer is None:
                    await self._pause(self.settings.reopen_delay_s)
                    continue
                fenced = await self._write_until_broken(writer)
                if writer.error is not None:  # the checker asks what explains it (writer_death)
                    self.history.record(self.session_name, "writer_died", error=error_text(writer.error))
                await self._close_session(writer)
                if (fenced and not self.reopen_on_fence) or not self.reopen:
                    return
                await self._pause(self.settings.reopen_delay_s)
            await self.stop.wait()  # writes_max reached: stay idle until stopped
        finally:
            with contextlib.suppress(DlogError):
                await self.namespace.close()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    async def _open_session(self) -> StreamWriter | None:
        assert self.namespace is not None
        self.sessions += 1
        name = self.session_name = f"{self.family}.{self.sessions}"
        op = self.history.invoke(name, "open_writer", takeover=self.takeover)
        try:
            writer = await self.namespace.open_writer(
                self.settings.stream, takeover=self.takeover, lock_timeout_s=self.settings.lock_timeout_s,
                flush_records=self.settings.flush_records, linger_ms=self.settings.linger_ms)
        except DlogError as exc:
            self.history.complete(op, name, "open_writer", "fail", error=error_text(exc))
            return None
        segment = writer.segment
        self.history.complete(op, name, "open_writer", "ok",
                              ledger=segment.ledger_id if segment is not None else None)
        self.writer = writer
        self.opened.set()
        return writer

    async def _write_until_broken(self, writer: StreamWriter) -> bool:
        """Write until stopped, `writes_max`, or the writer breaks; True when it was fenced."""
        name = self.session_name
        futures = self._in_flight.setdefault(name, {})
        interval_s = self.settings.write_interval_s
        while not self.stop.is_set() and self.count < self.writes_max:
            if writer.error is not None:
                return isinstance(writer.error, WriterFencedError)
            if self.in_flight >= self.settings.in_flight_max:
                self._room.clear()
                await self._wait_room()
                continue
            if interval_s > 0:
                await asyncio.sleep(interval_s)
            value = f"{self.family}-{self.count:06d}"
            self.count += 1
            op = self.history.invoke(name, "write", value=value)
            invoked = time.monotonic()
            try:
                future = writer.write_nowait(value.encode())
            except DlogError as exc:  # refused before buffering: certainly not written
                self.history.complete(op, name, "write", "fail", value=value, error=error_text(exc))
                return isinstance(exc, WriterFencedError)
            futures[future] = (op, value)
            future.add_done_callback(
                lambda done, op=op, value=value, invoked=invoked: self._on_done(op, name, value, invoked, done))
        return False

    async def _wait_room(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._room.wait(), 0.1)

    def _on_done(self, op: str, name: str, value: str, invoked: float, future: asyncio.Future[Any]) -> None:
        if self._in_flight.get(name, {}).pop(future, None) is None:
            return  # given up as orphaned already
        self._room.set()
        if future.cancelled():
            self.history.complete(op, name, "write", "unknown", value=value, error="cancelled")
            return
        error = future.exception()
        if error is not None:
            self.history.complete(op, name, "write", "unknown", value=value, error=error_text(error))
            return
        self.history.complete(op, name, "write", "ok", value=value, offset=offset_list(future.result()))
        self.acked.append((value, invoked, time.monotonic()))
        self.offsets.append(future.result())

    async def _close_session(self, writer: StreamWriter) -> None:
        """Close (seal when healthy); give up on write futures that never settle (a known bug)."""
        name = self.session_name
        self.opened.clear()
        op = self.history.invoke(name, "close_writer")
        try:
            await asyncio.wait_for(writer.close(), STOP_TIMEOUT_S)
            self.history.complete(op, name, "close_writer", "ok")
        except (TimeoutError, DlogError) as exc:
            self.history.complete(op, name, "close_writer", "fail", error=error_text(exc))
        futures = self._in_flight.get(name, {})
        deadline = time.monotonic() + ORPHAN_WAIT_S
        while futures and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        if futures:
            # A write whose future never settles would hang its caller (fixed bug, see
            # test_regressions.py::test_records_buffered_when_the_writer_fails_are_resolved):
            # a liveness failure; its outcome is unknown.
            self.orphaned += len(futures)
            self.history.record(name, "liveness", "fail",
                                what=f"{len(futures)} writes of {name} never completed after the writer "
                                     f"was closed (error: {writer.error!r}); their callers would hang")
            for op, value in list(futures.values()):
                self.history.complete(op, name, "write", "unknown", value=value,
                                      error="orphaned: never resolved after the writer closed")
            futures.clear()
            self._room.set()


# ---------------------------------------------------------------------------------- readers


class ReaderLoop:
    """A tailing reader: records every record; reopens at its position after an error."""

    def __init__(self, cluster: ClusterLike, settings: Settings, history: History, family: str, *,
                 start: Any = "earliest", lag_s: float = 0.0, subscription: str | None = None) -> None:
        self.cluster = cluster
        self.settings = settings
        self.history = history
        self.family = family
        self.start = start
        self.lag_s = lag_s
        self.subscription = subscription
        self.sessions = 0
        self.values: set[str] = set()
        self.records = 0
        self.errors: list[str] = []
        self.namespace: Namespace | None = None
        self.current: Any = None  # the open StreamReader
        self.closing = False  # inside StreamReader.close()
        self._stuck = 0  # errors in a row at one position
        self._stuck_at: tuple[str, int] | None = None

    @property
    def lagging(self) -> bool:
        return self.lag_s > 0

    async def run(self) -> None:
        namespace = self.namespace = await start_namespace(self.cluster, self.settings)
        start, skip_truncated = self.start, False
        self.sessions = 1
        name = f"{self.family}#{self.sessions}"
        try:
            while True:
                self.history.record(name, "open_reader", start=str(start), skip_truncated=skip_truncated,
                                    lagging=self.lagging)
                try:
                    reader = await namespace.open_reader(self.settings.stream, start, follow=True,
                                                         poll_timeout_ms=self.settings.poll_timeout_ms,
                                                         skip_truncated=skip_truncated)
                except TruncatedError as exc:
                    start, skip_truncated, name = self._skip(name, exc)
                    continue
                except DlogError as exc:
                    self._error(name, exc)
                    namespace = await self._renew_if_stuck(namespace, start)
                    await asyncio.sleep(self.settings.reopen_delay_s)
                    continue
                self.current = reader
                try:
                    await self._follow(namespace, reader, name)
                except TruncatedError as exc:
                    start, skip_truncated, name = self._skip(name, exc)
                except DlogError as exc:
                    self._error(name, exc)
                    start = reader.position or start
                    namespace = await self._renew_if_stuck(namespace, start)
                    await asyncio.sleep(self.settings.reopen_delay_s)
                finally:
                    self.closing = True
                    await reader.close()
                    self.closing = False
        finally:
            with contextlib.suppress(DlogError):
                await self.namespace.close()

    async def _follow(self, namespace: Namespace, reader: Any, name: str) -> None:
        async for record in reader:
            value = record.value.decode()
            self.history.read(name, record.offset, value)
            self.values.add(value)
            self.records += 1
            if self.lag_s:
                await asyncio.sleep(self.lag_s)
                if self.subscription and self.records % 20 == 0 and reader.position is not None:
                    with contextlib.suppress(DlogError):
                        await namespace.commit_subscription(self.settings.stream, self.subscription,
                                                            reader.position)

    async def _renew_if_stuck(self, namespace: Namespace, start: Any) -> Namespace:
        """After STUCK_ERRORS_MAX errors in a row at one position, reopen with a new namespace, as
        an application restarting its client would, and record it (`renewed`). The soak found
        readers stuck this way behind a stale cached ledger handle (fixed; test_regressions.py::
        test_a_reader_namespace_follows_ensemble_changes_of_a_segment_it_read_before), so a count
        above zero after a run deserves a look."""
        key = (str(start), self.records)
        self._stuck = self._stuck + 1 if key == self._stuck_at else 1
        self._stuck_at = key
        if self._stuck < STUCK_ERRORS_MAX:
            return namespace
        self._stuck = 0
        self.history.record(self.family, "renewed", what="reader stuck at one position: its namespace "
                            "was reopened", start=str(start))
        with contextlib.suppress(DlogError):
            await namespace.close()
        namespace = self.namespace = await start_namespace(self.cluster, self.settings)
        return namespace

    def _skip(self, name: str, error: DlogError) -> tuple[Any, bool, str]:
        """Truncated under the reader: a new session that skips to the earliest record."""
        self.history.record(name, "reader_error", error=error_text(error))
        self.errors.append(error_text(error))
        self.sessions += 1
        return "earliest", True, f"{self.family}#{self.sessions}"

    def _error(self, name: str, error: DlogError) -> None:
        self.history.record(name, "reader_error", error=error_text(error))
        self.errors.append(error_text(error))



def awaiting_frames(task: asyncio.Task[Any], depth_max: int = 40) -> list[Any]:
    """The frames of a suspended task, outermost first, following each coroutine's `cr_await`
    (Task.get_stack shows only the outermost one)."""
    frames, awaited = [], task.get_coro()
    while awaited is not None and len(frames) < depth_max:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
        if frame is None:
            break
        frames.append(frame)
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
    return frames



# ---------------------------------------------------------------------------------- writer processes


class WriterProcess:
    """tests/harness/faults/writer_process.py as a child process sharing the history file."""

    def __init__(self, cluster: ClusterLike, history: History, family: str = "p1", *, settings: Settings,
                 takeover: bool = False, session_timeout_s: float = 0.0, interval_s: float | None = None,
                 reopen: bool = True) -> None:
        import subprocess
        import sys

        from dlog_tools.cluster import LineReader, die_with_parent, project_root

        assert history.path is not None, "a writer process needs a history file"
        command = [sys.executable, "-m", "tests.harness.faults.writer_process", "--zk", cluster.zk_address,
                   "--root", cluster.zk_root, "--namespace", settings.namespace, "--stream", settings.stream,
                   "--history", str(history.path), "--family", family, "--writes-max", str(settings.writes_max),
                   "--interval", str(settings.write_interval_s if interval_s is None else interval_s)]
        if takeover:
            command.append("--takeover")
        if session_timeout_s:
            command += ["--session-timeout", str(session_timeout_s)]
        if not reopen:
            command.append("--no-reopen")
        self.family = family
        self.log_path = Path(history.path).with_name(f"{family}.log")
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log_file, text=True,
                                            cwd=project_root(), preexec_fn=die_with_parent)
        self.lines = LineReader(self.process)
        self.acked = 0
        self.ledger: int | None = None

    async def wait_acked(self, count: int, timeout_s: float = 30.0) -> None:
        """Wait until the process reports `count` acknowledgements (reads its stdout)."""
        deadline = time.monotonic() + timeout_s
        while self.acked < count:
            line = await asyncio.to_thread(self.lines.next_line, max(0.0, min(1.0, deadline - time.monotonic())))
            if line is not None:
                if line.startswith("acked "):
                    self.acked = int(line.split()[1])
                elif line.startswith("open "):
                    self.ledger = int(line.split()[2])
                continue
            if self.process.poll() is not None:
                raise AssertionError(f"writer process {self.family} exited ({self.process.returncode}) "
                                     f"after {self.acked} acks; see {self.log_path}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"writer process {self.family}: {self.acked} of {count} acks in {timeout_s} s")

    def signal(self, signum: int) -> None:
        import os

        if self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def kill(self) -> None:
        import signal as signals

        self.signal(signals.SIGKILL)
        self.process.wait(timeout=30)

    async def wait_exit(self, timeout_s: float) -> int | None:
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        return self.process.poll()

    def close(self) -> None:
        import signal as signals

        if self.process.poll() is None:
            self.signal(signals.SIGCONT)
            self.kill()
        if self.process.stdout is not None:
            self.process.stdout.close()
