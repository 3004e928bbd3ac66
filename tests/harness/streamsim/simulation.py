"""One seeded run of the stream layer: writers, tailing readers, truncation, retention, a sink and
garbage collection on one stream, under faults, on simulated time; then the one checker.

Everything is drawn from ONE `random.Random(seed)` (the scenario, latencies, faults, the clients'
choices) and runs on a simulated-time event loop (loop.py), so a run is a function of its seed and
`python -m tests.harness.streamsim --seed S` replays it. The real `Namespace`, `StreamWriter`,
`StreamReader`, truncation, retention and the Spark sink's `commit_batch` run unchanged, on the
in-memory segment store (dlog.segments.memory: lost compare-and-sets, lost answers, delays,
sessions that expire) and modelled ledgers (ledgers.py).

In half of the runs an offloader copies completed segments to a tier (Parquet files in a
directory of the run's own) and, in most of those, deletes their bookie copies at once: readers,
the final read and the checker must not notice.

In half of the runs (serving.py) two servers own a stream of their own in turn, idempotent
producers retry into it, and the owner is killed now and then: the producer checks count
duplicates and losses per producer.

Phases: (1) faults come and go for `fault_phase_s` while every client runs; (2) heal: faults stop;
a write invoked after the heal must be acknowledged, and every tailing reader must return it, within
the bound; (3) the writers stop; sequential writes of an idle writer must each be quick (no timer
between a record and its entry); readers must catch up with every acknowledged record; the stream
is sealed by a takeover and read back whole; (4) the history is checked: L1-L6 and liveness.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bookkeeper.errors import DlogError
from dlog import Namespace, Offloader, TierPolicy
from dlog.core.writer import WriterState
from dlog.segments.memory import MemoryMetadata
from tests.harness.history import History, Report, check, offset_list

from .actors import PROBE_BOUND_S, PROBE_WRITES, Process, ReaderFamily, Sink, WriterFamily, error_text
from .ledgers import SimLedgers
from .loop import SimulatedClock, SimulatedTimeLoop
from .serving import ServingWorld

STREAM = "sim"
RESUME_BOUND_S = 10.0
GC_GRACE_S = 10.0
BURST_PROBE_RECORDS = 300
RUN_S_MAX = 600.0  # simulated seconds; a run that has not finished by then is a liveness failure
FAULT_KINDS = ("ledger_failure", "kill_writer", "session_expiry", "metadata_blips", "metadata_delay")
LEDGER_DELETION_SHARE = 0.3  # runs in which an operator deletes live writers' ledgers (ledger delete --force)
OFFLOAD_SHARE = 0.5  # runs with an offloader (tiered storage)


@dataclass(slots=True)
class Scenario:
    writers: int
    readers: list[tuple[int, float]]  # (read-ahead entries, seconds per record)
    roll_records: int
    roll_bytes: int
    roll_age_ms: int
    sequential_share: float
    batch_share: float
    burst_max: int
    write_gap_s: float
    padding_bytes: int
    retention_on_roll: bool
    truncation_every_s: float | None
    retention_every_s: float | None
    sink_every_s: float | None
    gc_every_s: float
    faults: tuple[str, ...]
    fault_phase_s: float
    ledger_deletions: bool = False
    offload_every_s: float | None = None  # an offloader runs (tiered storage)
    offload_deletes_copies: bool = False  # ... and deletes bookie copies right after each offload

    @classmethod
    def draw_for(cls, seed: int, rng: random.Random) -> Scenario:
        scenario = cls.draw(rng)
        # from a generator of its own, so every other draw (and the seeds that show each planted bug)
        # stays as it was before this fault existed
        scenario.ledger_deletions = random.Random(f"ledger deletions {seed}").random() < LEDGER_DELETION_SHARE
        tiering = random.Random(f"offload {seed}")  # as the ledger deletions: every other draw stays
        if tiering.random() < OFFLOAD_SHARE:
            scenario.offload_every_s = tiering.uniform(0.5, 3.0)
            scenario.offload_deletes_copies = tiering.random() < 0.7
        return scenario

    @classmethod
    def draw(cls, rng: random.Random) -> Scenario:
        def sometimes(low: float, high: float, chance: float = 0.7) -> float | None:
            return rng.uniform(low, high) if rng.random() < chance else None

        return cls(
            writers=rng.randint(1, 3),
            readers=[(rng.choice([1, 2, 4, 64]), rng.choice([0.0, 0.0, 0.001, 0.004, 0.01]))
                     for _ in range(rng.randint(1, 3))],
            roll_records=rng.choice([0, 30, 100, 400]), roll_bytes=rng.choice([0, 0, 4096, 32768]),
            roll_age_ms=rng.choice([2 * 3600 * 1000, 1500]),
            sequential_share=rng.choice([0.1, 0.3]), batch_share=rng.choice([0.1, 0.2]),
            burst_max=rng.choice([5, 20, 40, 150]), write_gap_s=rng.choice([0.05, 0.1]),
            padding_bytes=rng.choice([4, 40, 100]), retention_on_roll=rng.random() < 0.3,
            truncation_every_s=sometimes(0.5, 3.0), retention_every_s=sometimes(0.5, 3.0),
            sink_every_s=sometimes(0.5, 3.0, chance=0.4), gc_every_s=rng.uniform(0.5, 2.0),
            faults=tuple(kind for kind in FAULT_KINDS if rng.random() < 0.5),
            fault_phase_s=rng.uniform(2.0, 6.0))

    def describe(self) -> str:
        return (f"{self.writers} writer families, readers {self.readers}, roll every {self.roll_records} records / "
                f"{self.roll_bytes} bytes / {self.roll_age_ms} ms, retention on roll {self.retention_on_roll}, "
                f"offload every {_seconds(self.offload_every_s)}"
                f"{' (bookie copies deleted)' if self.offload_deletes_copies else ''}, "
                f"truncation every {_seconds(self.truncation_every_s)}, retention every "
                f"{_seconds(self.retention_every_s)}, sink every {_seconds(self.sink_every_s)}, faults "
                f"{list(self.faults) + (['delete_ledger'] if self.ledger_deletions else [])} for "
                f"{self.fault_phase_s:.1f} s")


@dataclass(slots=True)
class StreamRunResult:
    seed: int
    scenario: Scenario
    report: Report
    faults: Counter[str]
    simulated_s: float
    fingerprint: str
    writes_ok: int = 0
    anomalies: list[str] = field(default_factory=list)
    text: str = ""


class StreamSimulation:
    def __init__(self, seed: int) -> None:
        # the retries' jitter draws from a generator of the run's own, never the global one: a
        # thread of earlier code in the same process (a kazoo client reconnecting) drawing from the
        # global generator made a replay in a test process differ from one in a fresh process
        self.jitter = random.Random(seed)
        self.seed = seed
        self.rng = random.Random(seed)
        self.scenario = Scenario.draw_for(seed, self.rng)
        self.deletion_rng = random.Random(f"ledger deletion faults {seed}")
        self.loop = SimulatedTimeLoop()
        self.clock = SimulatedClock(self.loop)
        self.history = History(clock=self.loop.time, process_tag="sim")  # no pid: runs replay exactly
        self.faults: Counter[str] = Counter()
        self.faulting = True
        self.blips = 0.0  # probability of a store call failing, while a blip window is open
        self.delay_s = (0.0, 0.002)
        self.metadata = MemoryMetadata(faults=self._store_fault, delay=self._store_delay, clock=self.clock)
        self.ledgers = SimLedgers(self.rng, self.loop, on_fault=self._ledger_fault)
        self.writers: dict[str, WriterFamily] = {}
        self.readers: dict[str, ReaderFamily] = {}
        self.stream = STREAM
        self._tasks: list[asyncio.Task[Any]] = []
        self.graveyard: list[Any] = []  # what killed processes left, cancelled at the end
        self._last_version = -1
        self.serving = ServingWorld(self)  # servers and idempotent producers on a stream of their own
        self.tier_dir = tempfile.mkdtemp(prefix=f"dlog-streamsim-{seed}-")
        self.attempts = random.Random(f"offload attempts {seed}")  # the tier files' names

    # ------------------------------------------------------------------ the world

    async def new_process(self) -> Process:
        session, client = self.metadata.session(), self.ledgers.client()
        namespace = Namespace("simulated", "sim", store=session, client=client, clock=self.clock,
                              rng=self.jitter.random)
        await namespace.start()
        namespace.reads.blocking = _inline  # tier files read and written on the loop: runs replay exactly
        return Process(namespace, session, client)

    def _store_fault(self, operation: str, stream: str) -> str | None:
        if not self.blips or self.rng.random() >= self.blips:
            return None
        self.faults["metadata blips"] += 1
        return self.rng.choice(["unavailable", "lost_reply"])

    def _store_delay(self, operation: str) -> float:
        low, high = self.delay_s
        return self.rng.uniform(low, high)

    def _ledger_fault(self, kind: str, detail: dict[str, Any]) -> None:
        self.faults[kind] += 1
        self.history.record("nemesis", "fault", kind=kind, **detail)

    def note(self, kind: str, **detail: Any) -> None:
        self.faults[kind] += 1
        self.history.record("nemesis", "fault", kind=kind, **detail)

    def spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        task = self.loop.create_task(coroutine)
        self._tasks.append(task)
        return task

    # ------------------------------------------------------------------ the run

    def run(self) -> StreamRunResult:
        try:
            self.loop.run_until_complete(self._bounded())
        except RuntimeError as exc:  # the loop found a spin or a deadlock: a liveness failure
            self.history.record("sim", "liveness", "fail", what=str(exc))
        finally:
            self._cancel_everything()
            self.loop.close()
            shutil.rmtree(self.tier_dir, ignore_errors=True)
        report = check(self.history.events, resume_bound_s=RESUME_BOUND_S)
        result = StreamRunResult(self.seed, self.scenario, report, self.faults, self.loop.time(),
                                 _fingerprint(self.history.events), report.stats.get("ok", 0),
                                 report.messages())
        if report.anomalies:
            result.text = "\n".join([
                f"stream simulation seed {self.seed} broke {len(report.anomalies)} promise(s):",
                report.summary(), f"scenario: {self.scenario.describe()}",
                f"faults: {dict(sorted(self.faults.items()))}",
                f"replay: python -m tests.harness.streamsim --seed {self.seed}"])
        return result

    async def _bounded(self) -> None:
        try:
            async with asyncio.timeout(RUN_S_MAX):
                await self._main()
        except TimeoutError:
            self.history.record("sim", "liveness", "fail", what=f"the run did not finish in {RUN_S_MAX} simulated s")

    async def _main(self) -> None:
        scenario = self.scenario
        control = await self.new_process()
        tier = None
        if scenario.offload_every_s is not None:
            tier = TierPolicy(uri=f"file://{self.tier_dir}", delete_lag_ms=0 if scenario.offload_deletes_copies else -1)
        await control.namespace.create_stream(self.stream, roll_records=scenario.roll_records,
                                              roll_bytes=scenario.roll_bytes or None, roll_age_ms=scenario.roll_age_ms,
                                              tier=tier)
        self.history.record("sim", "stream_config", roll_bytes=scenario.roll_bytes)
        self.spawn(self._monitor())
        for index in range(scenario.writers):
            family = self.writers[f"w{index + 1}"] = WriterFamily(self, f"w{index + 1}", random.Random(self.rng.random()))
            self.spawn(family.run())
        for index, (read_ahead, lag_s) in enumerate(scenario.readers):
            reader = self.readers[f"r{index + 1}"] = ReaderFamily(
                self, f"r{index + 1}", random.Random(self.rng.random()), read_ahead_entries=read_ahead, lag_s=lag_s)
            self.spawn(reader.run())
        admins = [self.spawn(self._every(scenario.gc_every_s, self._gc))]
        for every, action in ((scenario.truncation_every_s, self._truncate), (scenario.retention_every_s, self._retain),
                              (scenario.sink_every_s, self._sink_commit), (scenario.offload_every_s, self._offload)):
            if every is not None:
                admins.append(self.spawn(self._every(every, action)))
        faults = self.spawn(self._inject_faults()) if scenario.faults else None
        if scenario.ledger_deletions:
            self.spawn(self._delete_ledgers())
        if self.serving.enabled:
            self.spawn(self.serving.run())
        await asyncio.sleep(scenario.fault_phase_s)
        await self._heal(faults)
        await self._stop_writers()
        if self.serving.enabled:
            await self.serving.finish()
        await self._probe()
        for task in admins:
            task.cancel()
        await self._catch_up()
        await self._seal()
        await self._final_read()

    # ------------------------------------------------------------------ routine operations

    async def _every(self, period_s: float, action: Any) -> None:
        process = await self.new_process()
        while True:
            await asyncio.sleep(self.rng.uniform(0.5, 1.5) * period_s)
            try:
                await action(process)
            except DlogError as exc:
                self.history.record("admin", "admin_error", action=action.__name__, error=error_text(exc))
            except Exception as exc:  # not one of dlog's errors: a crash in the library, for the checker
                self.history.record("admin", "bug", error=f"{action.__name__}: {error_text(exc)}")
                return

    async def _gc(self, process: Process) -> None:
        self.ledgers.collect_garbage(GC_GRACE_S)

    async def _truncate(self, process: Process) -> None:
        recent = self.rng.choice([(-400, -20), (-40, -2)])  # far behind the tail, or close to it
        acked = [offset for family in self.writers.values() for _, _, offset in family.acked[recent[0]:recent[1]]]
        if not acked:
            return
        cut = self.rng.choice(acked)
        before = offset_list(cut)
        self.note("truncate", before=before)
        self.history.record("admin", "truncated", before=before)  # before: a failed call may still have removed
        try:
            await process.namespace.truncate(self.stream, cut)
        except DlogError as exc:
            self.history.record("admin", "truncate_failed", error=error_text(exc))
            return
        self.history.record("admin", "truncation_done", before=before)

    async def _retain(self, process: Process) -> None:
        namespace = process.namespace
        self.note("retention")
        await namespace.set_retention(self.stream, size_bytes=self.rng.choice([1, 20_000]),
                                      keep_unconsumed=False)
        removed = await namespace.apply_retention(self.stream)
        ledgers = [segment.ledger_id for segment in removed]
        self.history.record("admin", "removed", ledgers=ledgers, why="retention")
        after = self.metadata.stream(self.stream).listing
        self.history.record("admin", "retention", removed=ledgers,
                            after=[[s.sequence, s.ledger_id, s.state.value] for s in after.segments])

    async def _offload(self, process: Process) -> None:
        offloader = Offloader(process.namespace, holder="offloader",
                              attempt_ids=lambda: f"{self.attempts.getrandbits(64):016x}")
        report = await offloader.run(self.stream, now=True)
        if report.offloaded or report.bookie_copies_deleted:
            self.note("offload", segments=[o.sequence for o in report.offloaded],
                      bookie_copies_deleted=report.bookie_copies_deleted)

    async def _sink_commit(self, process: Process) -> None:
        sink = getattr(self, "_sink", None) or Sink(self, random.Random(self.rng.random()))
        self._sink = sink
        await sink.commit_one(process)

    async def _monitor(self) -> None:
        while True:
            self.snapshot()
            await asyncio.sleep(0.05)

    def snapshot(self, final: bool = False) -> None:
        listing = self.metadata.stream(self.stream).listing
        if listing.version == self._last_version and not final:
            return
        self._last_version = listing.version
        snapshot: dict[str, Any] = {"version": listing.version, "max_sequence": listing.max_sequence,
                                    "segments": [{"node": f"{s.sequence:018d}", **self._segment_json(s)}
                                                 for s in listing.segments]}
        if final:
            snapshot["ledgers"] = {str(s.ledger_id): self._ledger_state(s.ledger_id) for s in listing.segments}
        self.history.record("monitor", "metadata", final=final, **snapshot)

    def _segment_json(self, segment: Any) -> dict[str, Any]:
        """A segment as recorded: its tier file named within the run's tier directory (which is a
        temporary directory of its own per run), so a replay records the same."""
        document = segment.to_json()
        prefix = f"file://{self.tier_dir}"
        if document.get("tier"):
            document["tier"] = {**document["tier"], "uri": document["tier"]["uri"].removeprefix(prefix)}
        document["offload_attempt"] = document["offload_attempt"].removeprefix(prefix)
        return document

    def _ledger_state(self, ledger_id: int) -> dict[str, Any]:
        ledger = self.ledgers.ledgers.get(ledger_id)
        if ledger is None or ledger.deleted_s is not None:
            return {"state": "missing"}
        return {"state": "CLOSED" if ledger.closed else "OPEN", "last_entry": ledger.last_entry}

    # ------------------------------------------------------------------ faults

    async def _inject_faults(self) -> None:
        while self.faulting:
            await asyncio.sleep(self.rng.uniform(0.2, 1.5))
            if not self.faulting:
                return
            kind = self.rng.choice(self.scenario.faults)
            await getattr(self, f"_fault_{kind}")()

    async def _fault_ledger_failure(self) -> None:
        self.ledgers.failure_probability = self.rng.choice([0.002, 0.02])
        await asyncio.sleep(self.rng.uniform(0.3, 2.0))
        self.ledgers.failure_probability = 0.0

    async def _fault_kill_writer(self) -> None:
        alive = [family for _, family in sorted(self.writers.items())
                 if family.process is not None and family.process.alive]
        if not alive:
            return
        family = self.rng.choice(alive)
        self.note("kill_writer", writer=family.family)
        session = family.process.session.session  # type: ignore[union-attr]
        family.kill()
        await asyncio.sleep(self.rng.uniform(0.3, 3.0))  # its ZooKeeper session times out
        self.metadata.expire(session)

    async def _fault_session_expiry(self) -> None:
        alive = [family for _, family in sorted(self.writers.items())
                 if family.process is not None and family.process.alive]
        if alive:
            family = self.rng.choice(alive)
            self.note("session_expiry", writer=family.family)
            self.metadata.expire(family.process.session.session)  # type: ignore[union-attr]

    async def _fault_metadata_blips(self) -> None:
        self.note("metadata_blip")
        self.blips = self.rng.choice([0.2, 0.5])
        await asyncio.sleep(self.rng.uniform(0.2, 1.5))
        self.blips = 0.0

    async def _fault_metadata_delay(self) -> None:
        self.note("metadata_delay")
        self.delay_s = (0.02, self.rng.choice([0.1, 0.5]))
        await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        self.delay_s = (0.0, 0.002)

    async def _delete_ledgers(self) -> None:
        """`dlog ledger delete --force` on the ledger a live writer is appending to, now and then:
        the writer must fail loudly, and never report as written what was in that ledger."""
        rng = self.deletion_rng
        while self.faulting:
            await asyncio.sleep(rng.uniform(0.5, 2.5))
            if not self.faulting:
                return
            writing = [family for _, family in sorted(self.writers.items())
                       if family.process is not None and family.process.alive and family.writer is not None
                       and family.writer.context.store is family.process.namespace.store  # not a killed one's
                       and family.writer.machine.state is WriterState.OPEN and family.writer.machine.segment]
            if not writing:
                continue
            family = rng.choice(writing)
            ledger_id = family.writer.machine.ledger_id
            ledger = self.ledgers.ledgers.get(ledger_id)
            if ledger is None or ledger.deleted_s is not None:
                continue  # already gone: a truncation after a takeover the writer has not noticed yet
            self.ledgers.delete(ledger_id)
            self.note("delete_ledger", ledger=ledger_id, writer=family.session_name)

    async def _heal(self, faults: asyncio.Task[Any] | None) -> None:
        self.faulting = False
        if faults is not None:
            faults.cancel()
        self.ledgers.failure_probability, self.blips, self.delay_s = 0.0, 0.0, (0.0, 0.002)
        healed = self.history.record("nemesis", "heal", what="every fault ends")["t"]
        probe = None
        while probe is None and self.loop.time() < healed + RESUME_BOUND_S:
            probe = next((value for family in self.writers.values() for value, invoked, _ in family.acked
                          if invoked >= healed), None)
            await asyncio.sleep(0.05)
        if probe is None:
            self.history.record("nemesis", "liveness", "fail",
                                what=f"no write invoked after the heal was acknowledged within {RESUME_BOUND_S} s")
            return
        while self.loop.time() < healed + 2 * RESUME_BOUND_S:
            if all(probe in reader.values for reader in self.readers.values()):
                return
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ the end

    async def _stop_writers(self) -> None:
        for family in self.writers.values():
            family.stop.set()
        tasks = [task for task in self._tasks if task.get_coro().__qualname__.startswith("WriterFamily.run")]
        done, pending = await asyncio.wait(tasks, timeout=60) if tasks else (set(), set())
        for task in pending:
            self.history.record("sim", "liveness", "fail", what="a writer family did not stop within 60 s")
            task.cancel()

    async def _probe(self) -> None:
        """An idle writer's sequential writes: each must be acknowledged at once (no timer)."""
        process = await self.new_process()
        family = WriterFamily(self, "probe", random.Random(self.rng.random()))
        family.process, family.probing = process, True
        writer = await family._open(flush_records=1000, buffer_bytes_max=1 << 20)  # noqa: SLF001
        if writer is None:
            return
        for _ in range(PROBE_WRITES):
            try:
                await family._sequential(writer)  # noqa: SLF001
            except DlogError:
                break
        family.probing = False
        try:  # then a burst while entries are in flight: big entries, unless the roll size bounds them
            await family._burst(writer, BURST_PROBE_RECORDS)  # noqa: SLF001
            await writer.flush()
        except DlogError:
            pass
        await family._close(writer, writer.error is not None)  # noqa: SLF001
        self.writers["probe"] = family
        self.history.record("sim", "probe_bound", bound_s=PROBE_BOUND_S)

    async def _catch_up(self) -> None:
        """Every reader must reach the last acknowledged record (however slow its consumer)."""
        # the newest acknowledged record, which nothing removes (truncation stays behind each writer's
        # last records, retention keeps the last completed segment); an older family's last record
        # may be gone with a retained-away segment, and waiting for it only ran the clock out
        newest = max(((invoked, value) for family in self.writers.values() for value, invoked, _ in family.acked),
                     default=None)
        last = [] if newest is None else [newest[1]]
        acked = sum(len(family.acked) for family in self.writers.values())
        # a slow consumer needs the time its backlog takes to consume; a stuck one never arrives
        backlog_s = max((reader.lag_s * max(0, acked - len(reader.values)) for reader in self.readers.values()),
                        default=0.0)
        deadline = self.loop.time() + 2 * RESUME_BOUND_S + 1.5 * backlog_s
        while self.loop.time() < deadline:
            if all(all(value in reader.values for value in last) for reader in self.readers.values()):
                break
            await asyncio.sleep(0.05)
        for family, reader in self.readers.items():
            self.history.record(f"{family}#stop", "reader_stop", family=family)
            reader.stop.set()

    async def _seal(self) -> None:
        process = await self.new_process()
        for _ in range(10):
            op = self.history.invoke("sealer", "open_writer", takeover=True)
            try:
                writer = await process.namespace.open_writer(self.stream, takeover=True, lock_timeout_s=0.3)
                self.history.complete(op, "sealer", "open_writer", "ok")
                await writer.close()
                return
            except DlogError as exc:
                self.history.complete(op, "sealer", "open_writer", "fail", error=error_text(exc))
                await asyncio.sleep(0.5)
        self.history.record("sealer", "liveness", "fail", what="the stream could not be sealed in 10 attempts")

    def _entry_sizes(self) -> None:
        """The largest entry of each ledger a stream writer wrote (not the sink's task ledgers)."""
        sizes = {str(ledger_id): max((len(payload) for payload in ledger.entries.values()), default=0)
                 for ledger_id, ledger in sorted(self.ledgers.ledgers.items())}
        self.history.record("sim", "entry_sizes", sizes=sizes)

    async def _final_read(self) -> None:
        process = await self.new_process()
        try:
            records = []
            # a deletion that raced a roll or close already committing leaves a completed segment
            # naming the deleted ledger: readers stop there unless they skip it, as an operator would
            skip = self.scenario.ledger_deletions
            async with await process.namespace.open_reader(self.stream, "earliest", follow=False,
                                                           skip_truncated=skip) as reader:
                async for record in reader:
                    records.append([offset_list(record.offset), record.value.decode(), record.position])
            self.history.record("final", "final", "ok", records=records)
        except DlogError as exc:
            self.history.record("final", "final", "fail", error=error_text(exc))
        self.snapshot(final=True)
        self._entry_sizes()

    def _cancel_everything(self) -> None:
        pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


async def _inline(function: Any, *args: Any) -> Any:
    return function(*args)


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def _fingerprint(events: list[dict[str, Any]]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for event in events:
        digest.update(repr(sorted((key, str(value)) for key, value in event.items())).encode())
    return digest.hexdigest()[:16]


def run(seed: int) -> StreamRunResult:
    return StreamSimulation(seed).run()
