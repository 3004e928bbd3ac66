"""The workload of the fault scenarios and the soak: writers and tailing readers on one stream, every
operation recorded in a `tests.harness.history.History`; then heal, seal, read everything back, check.

    workload = Workload(cluster, history, Settings())
    await workload.start()                 # stream, metadata monitor, writer w1, readers r1 r2
    ... inject a fault ...
    await workload.heal()                  # writes and tailing reads must resume within a bound
    report = await workload.finish()       # stop, seal with a takeover, full read, check
    assert report.ok, report.summary()

The writers and readers are in clients.py; a metadata monitor here snapshots the segment list.
Every loop is bounded: in-flight writes (`in_flight_max`), writes per family (`writes_max`),
waits (deadlines), retries (delays). Nothing here sleeps to wait for a condition it could poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from bookkeeper.errors import DlogError
from dlog import Namespace
from tests.harness.history import (
    History,
    Report,
    check,
    load,
    offset_list,
    snapshot_stream_metadata,
)

from .clients import (  # noqa: F401
    ORPHAN_WAIT_S,
    POLL_S,
    STOP_TIMEOUT_S,
    ClusterLike,
    ReaderLoop,
    Settings,
    WriterLoop,
    WriterProcess,
    awaiting_frames,
    error_text,
    start_namespace,
)

log = logging.getLogger(__name__)

MONITOR_INTERVAL_S = 0.25
SEAL_ATTEMPTS_MAX = 10
FINAL_TIMEOUT_S = 120.0
READER_STOP_S = 5.0


# ---------------------------------------------------------------------------------- the workload


@dataclass
class Workload:
    cluster: ClusterLike
    history: History
    settings: Settings = field(default_factory=Settings)
    writers: dict[str, WriterLoop] = field(default_factory=dict)
    readers: dict[str, ReaderLoop] = field(default_factory=dict)
    control: Namespace | None = None
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _monitor_stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self, writers: int = 1, readers: int | None = None, **stream_options: Any) -> Workload:
        self.control = await start_namespace(self.cluster, self.settings)
        settings = self.settings
        await self.control.create_stream(settings.stream, ensemble=settings.ensemble,
                                         write_quorum=settings.write_quorum, ack_quorum=settings.ack_quorum,
                                         roll_records=settings.roll_records, **stream_options)
        self._spawn("monitor", self._monitor())
        for index in range(writers):
            self.add_writer(f"w{index + 1}")
        for index in range(settings.readers if readers is None else readers):
            self.add_reader(f"r{index + 1}")
        return self

    def _spawn(self, name: str, coroutine: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks[name] = task
        return task

    def add_writer(self, family: str, **options: Any) -> WriterLoop:
        loop = WriterLoop(self.cluster, self.settings, self.history, family, **options)
        self.writers[family] = loop
        self._spawn(f"writer {family}", loop.run())
        return loop

    def add_reader(self, family: str, **options: Any) -> ReaderLoop:
        loop = ReaderLoop(self.cluster, self.settings, self.history, family, **options)
        self.readers[family] = loop
        self._spawn(f"reader {family}", loop.run())
        return loop

    # ------------------------------------------------------------------ waiting

    def acked_count(self) -> int:
        return sum(len(writer.acked) for writer in self.writers.values())

    async def wait_for(self, predicate: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            self._raise_crashed()
            if time.monotonic() >= deadline:
                raise AssertionError(f"within {timeout_s} s: {what}")
            await asyncio.sleep(POLL_S)

    async def wait_acked(self, count: int, timeout_s: float = 30.0) -> None:
        """Wait until this process's writers have `count` more acknowledgements than now."""
        target = self.acked_count() + count
        await self.wait_for(lambda: self.acked_count() >= target, timeout_s,
                            f"{count} more acknowledged writes (have {self.acked_count()})")

    def _raise_crashed(self) -> None:
        for name, task in self._tasks.items():
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise AssertionError(f"workload task {name} crashed") from task.exception()

    async def current_ledger(self) -> int:
        """The ledger of the stream's in-progress segment (waits for one to exist)."""
        assert self.control is not None
        deadline = time.monotonic() + 30
        while True:
            listing = await self.control.store.segments(self.settings.stream)
            if listing.in_progress is not None:
                return listing.in_progress.ledger_id
            if time.monotonic() >= deadline:
                raise AssertionError("the stream has no in-progress segment")
            await asyncio.sleep(POLL_S)

    async def current_ensemble(self) -> tuple[str, ...]:
        """Bookie ids of the last fragment of the in-progress segment's ledger."""
        assert self.control is not None
        metadata, _ = await self.control.client.ledger_metadata(await self.current_ledger())
        return metadata.last_ensemble[1]

    # ------------------------------------------------------------------ heal and finish

    async def heal(self, what: str = "faults healed") -> None:
        """Mark the heal; then a write invoked after it must be acknowledged, and every reader
        family must return it, within `resume_bound_s` (recorded as a liveness failure if not)."""
        healed = self.history.record("nemesis", "heal", what=what)["t"]
        bound = self.settings.resume_bound_s
        live = [w for w in self.writers.values() if not w.stop.is_set() and w.count < w.writes_max]
        if not live:
            return
        deadline = healed + bound
        probe = None
        while probe is None and time.monotonic() < deadline:
            self._raise_crashed()
            probe = next((value for writer in live for value, invoked, _ in writer.acked
                          if invoked >= healed), None)
            await asyncio.sleep(POLL_S)
        if probe is None:
            self.history.record("nemesis", "liveness", "fail",
                                what=f"no write invoked after the heal ({what}) was acknowledged within {bound} s")
            return
        while time.monotonic() < deadline + bound:
            if all(probe in reader.values for reader in self.readers.values() if not reader.lagging):
                return
            await asyncio.sleep(POLL_S)
        behind = [family for family, reader in self.readers.items()
                  if probe not in reader.values and not reader.lagging]
        self.history.record("nemesis", "liveness", "fail",
                            what=f"tailing readers {behind} did not return {probe!r} after the heal ({what})")

    async def stop_writers(self) -> None:
        for writer in self.writers.values():
            writer.stop.set()
        for family in list(self.writers):
            task = self._tasks.get(f"writer {family}")
            if task is not None:
                try:
                    await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT_S + ORPHAN_WAIT_S + 5)
                except TimeoutError:
                    task.cancel()
                    self.history.record(family, "liveness", "fail", what=f"writer {family} did not stop")

    async def stop_readers(self) -> None:
        for family, loop in list(self.readers.items()):
            if not loop.lagging:  # a tailing reader must have kept up (the checker's reader_behind)
                self.history.record(f"{family}#stop", "reader_stop", family=family)
            task = self._tasks.pop(f"reader {family}", None)
            if task is None:
                continue
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=READER_STOP_S)
            if not done and loop.closing and loop.current is not None:
                # StreamReader.close() hung (fixed bug, see test_regressions.py::
                # test_closing_a_reader_stops_it_even_when_its_wait_just_ended): a liveness failure
                self.history.record(family, "liveness", "fail", what="StreamReader.close() hung: its "
                                    f"effect tasks did not stop when cancelled ({loop.current.tasks_running} left)")
            await self._bounded(task, f"reader {family} to stop", READER_STOP_S)

    async def _bounded(self, task: asyncio.Task[Any], what: str, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Wait for a task; if it hangs, record where (a liveness failure) and go on."""
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            frames = " -> ".join(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}:"
                                 f"{frame.f_lineno}" for frame in awaiting_frames(task))
            self.history.record("workload", "liveness", "fail",
                                what=f"{what}: still running after {timeout_s} s, at {frames}")
            log.warning("%s: stuck at %s", what, frames)

    async def seal(self) -> None:
        """Take the stream over and close it, so every segment is completed (L1)."""
        assert self.control is not None
        for attempt in range(SEAL_ATTEMPTS_MAX):
            op = self.history.invoke("sealer", "open_writer", takeover=True)
            try:
                writer = await self.control.open_writer(self.settings.stream, takeover=True,
                                                        lock_timeout_s=self.settings.lock_timeout_s)
                self.history.complete(op, "sealer", "open_writer", "ok")
                await writer.close()
                return
            except DlogError as exc:
                self.history.complete(op, "sealer", "open_writer", "fail", error=error_text(exc))
                await asyncio.sleep(0.5)
        self.history.record("sealer", "liveness", "fail",
                            what=f"the stream could not be sealed in {SEAL_ATTEMPTS_MAX} attempts")

    async def final_read(self) -> None:
        """A fresh namespace reads the whole stream; its records and the metadata join the history."""
        namespace = await start_namespace(self.cluster, self.settings)
        try:
            records = []
            async with await namespace.open_reader(self.settings.stream, "earliest", follow=False) as reader:
                async for record in reader:
                    records.append([offset_list(record.offset), record.value.decode()])
            self.history.record("final", "final", "ok", records=records)
        except DlogError as exc:
            self.history.record("final", "final", "fail", error=error_text(exc))
        finally:
            await self.snapshot(namespace, final=True)
            if self.settings.replication_timeout_s is not None:
                await self.check_replication(namespace, self.settings.replication_timeout_s)
            await namespace.close()

    async def check_replication(self, namespace: Namespace, timeout_s: float) -> None:
        """Once nothing is marked under-replicated (within `timeout_s`), every entry of every
        completed segment must be on each live bookie of its write set, byte-identical."""
        from bookkeeper.autorecovery.store import RecoveryStore
        from tests.harness.replication import replication_problems, wait_fully_replicated

        try:
            marked = await wait_fully_replicated(RecoveryStore(namespace.zk, self.cluster.zk_root), timeout_s)
            listing = await namespace.store.segments(self.settings.stream)
            ledgers = [s.ledger_id for s in listing.segments if s.state.value == "completed"]
            problems = await replication_problems(namespace.client, ledgers)
        except DlogError as exc:
            marked, ledgers, problems = -1, [], [f"the replication check failed: {error_text(exc)}"]
        if marked:
            problems.insert(0, f"{marked} ledgers were still marked under-replicated after {timeout_s} s")
        self.history.record("replication", "check", "fail" if problems else "ok", problems=problems,
                            ledgers=len(ledgers))

    async def snapshot(self, namespace: Namespace, final: bool = False) -> dict[str, Any]:
        path = namespace.store.segments_path(self.settings.stream)
        snapshot = await snapshot_stream_metadata(namespace.zk, path, namespace.client if final else None)
        self.history.record("monitor", "metadata", final=final, **snapshot)
        return snapshot

    async def _monitor(self) -> None:
        assert self.control is not None
        path = self.control.store.segments_path(self.settings.stream)
        last_version = None
        while not self._monitor_stop.is_set():
            try:
                snapshot = await snapshot_stream_metadata(self.control.zk, path)
            except (DlogError, RuntimeError):
                snapshot = None
            if snapshot is not None and snapshot["version"] != last_version:
                last_version = snapshot["version"]
                self.history.record("monitor", "metadata", **snapshot)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._monitor_stop.wait(), MONITOR_INTERVAL_S)

    async def finish(self, *, check_resume: bool = True) -> Report:
        """Stop everyone, seal, read back, check the whole history (this and other processes')."""
        try:
            await self.stop_writers()
            await self.stop_readers()
            self._monitor_stop.set()
            monitor = self._tasks.pop("monitor", None)
            if monitor is not None:
                await self._bounded(monitor, "the metadata monitor to stop")
            await self._bounded(asyncio.ensure_future(self.seal()), "sealing the stream", FINAL_TIMEOUT_S)
            await self._bounded(asyncio.ensure_future(self.final_read()), "the final read", FINAL_TIMEOUT_S)
        finally:
            await self.close()
        events = load(self.history.path) if self.history.path is not None else self.history.events
        return check(events, resume_bound_s=self.settings.resume_bound_s if check_resume else None)

    async def close(self) -> None:
        for writer in self.writers.values():
            writer.stop.set()
        self._monitor_stop.set()
        for task in self._tasks.values():
            if not task.done():
                task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=STOP_TIMEOUT_S)
        self._tasks.clear()
        if self.control is not None:
            with contextlib.suppress(DlogError):
                await self.control.close()
            self.control = None


