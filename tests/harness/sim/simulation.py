"""One seeded run: a cluster, a writer, recoveries and readers under faults, then a check of A2-A10.

The code under test is the code that ships: clients are `bookkeeper.client.BookKeeper` (driver,
pool, batcher, connection, the protocol machines; clients.py), bookies are the real
`BookieServer`/`ClientConnection`/`BookieCore` over in-memory journal and storage ports (bookie.py,
disk.py), all on one simulated-time asyncio loop, connected by a simulated network (transport.py,
world.py) and a simulated metadata store (metastore.py).

Everything is drawn from ONE `random.Random(seed)`: the scenario (cluster size, quorum shape,
workload, which faults are on), every latency, every fault, and the client's own choices
(placement, the machines, retry jitter). So `run(seed, steps)` is a pure function of its
arguments and any failure replays with `python -m tests.harness.sim --seed S --steps N`.

A run has three phases:
  1. faults: the writer creates the ledger and appends; recoveries (maybe two at once) and readers
     start at random times; faults are injected until every client is done or the loop has turned
     `steps` times;
  2. heal: every bookie that can come back does (a wiped one never does), partitions and stalls
     end, the network stops dropping; the writer gets a bounded time to finish;
  3. final: a recovery seals the ledger (or finds it closed) and a reader reads it to its end.
Then the one checker (tests/harness/history) looks for broken promises, and any exception that
escaped the shipped code (a callback's, a task's, one logged as an error) is a broken promise too;
a violation raises AssertionError naming the seed, the promises, the scenario and the last 40 events.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bookkeeper.meta.store import BookieInfo
from tests.harness.history import History, LedgerRecorder, check
from tests.harness.streamsim.loop import SimulatedClock, SimulatedTimeLoop

from .bookie import BookieProcess
from .clients import ReaderClient, RecoveryClient, SimClient, WriterClient
from .metastore import SimMetadataStore
from .world import Network, NetworkConfig, World

DEFAULT_STEPS = 60_000  # loop turns of the fault phase (a run's clients are usually done long before)
SHAPES = ((3, 3, 2), (3, 2, 2), (4, 3, 2), (5, 3, 2), (3, 3, 3), (4, 4, 3), (3, 2, 1), (2, 2, 2),
          (5, 4, 2), (4, 2, 1))
FAULT_KINDS = ("crash", "hang", "partition", "wipe", "damage", "zk_stall", "zk_reply_lost", "writer_crash")
HEAL_WAIT_MS = 5_000  # the writer's time to finish after the heal
FINAL_WAIT_MS = 30_000  # the final recovery's and reader's time
DOWN_BOOKIES_MAX = 2  # crashed or hung at the same time
POLL_MS = 100  # how often the run looks at the clock and the loop's turns (a client's end wakes it at once)
BOOKIE_PORT = 3181


@dataclass(slots=True)
class Scenario:
    bookie_count: int
    shape: tuple[int, int, int]  # ensemble, write quorum, ack quorum
    entry_count: int
    pipeline_depth: int
    append_gap_ms_max: int
    recovery_starts_ms: list[int]
    reader_starts_ms: list[int]
    faults: tuple[str, ...]
    fault_gap_ms: tuple[int, int]
    network: NetworkConfig

    @classmethod
    def draw(cls, rng: random.Random) -> Scenario:
        shape = rng.choice(SHAPES)
        entry_count = rng.randint(5, 60) if rng.random() < 0.8 else rng.randint(60, 150)
        gap_ms_max = rng.randint(0, 20)
        writing_ms = entry_count * (gap_ms_max // 2 + 8)
        recoveries = [] if rng.random() < 0.25 else [rng.randint(0, writing_ms + 200)]
        if recoveries and rng.random() < 0.35:  # a second recovery, concurrent with the first
            recoveries.append(recoveries[0] + rng.randint(0, 40))
        readers = sorted(rng.randint(0, writing_ms + 400) for _ in range(rng.randint(0, 3)))
        faults = () if rng.random() < 0.1 else tuple(
            kind for kind in FAULT_KINDS if rng.random() < (0.2 if kind == "writer_crash" else 0.5))
        if shape[2] < 2:
            faults = tuple(kind for kind in faults if kind not in ("wipe", "damage"))  # Qa - 1 = 0 may be lost
        network = NetworkConfig(
            drop_probability=rng.choice((0.0, 0.0, 0.002, 0.01)),
            duplicate_probability=rng.choice((0.0, 0.0, 0.01, 0.05)))
        return cls(bookie_count=shape[0] + rng.randint(1, 3), shape=shape, entry_count=entry_count,
                   pipeline_depth=rng.randint(1, 10), append_gap_ms_max=gap_ms_max,
                   recovery_starts_ms=recoveries, reader_starts_ms=readers, faults=faults,
                   fault_gap_ms=(rng.randint(10, 60), rng.randint(100, 400)), network=network)

    def describe(self) -> str:
        ensemble, write_quorum, ack_quorum = self.shape
        return (f"{self.bookie_count} bookies, E={ensemble} Qw={write_quorum} Qa={ack_quorum}, "
                f"{self.entry_count} entries (depth {self.pipeline_depth}), recoveries at "
                f"{self.recovery_starts_ms} ms, readers at {self.reader_starts_ms} ms, faults "
                f"{list(self.faults)}, drop {self.network.drop_probability}, duplicate "
                f"{self.network.duplicate_probability}")


@dataclass(slots=True)
class RunResult:
    seed: int
    steps: int
    scenario: Scenario
    entries_appended: int
    entries_acked: int
    last_entry_id: int
    faults: Counter[str]
    events: int  # loop turns
    simulated_ms: float
    fingerprint: str = ""  # of every event: two runs of one seed and steps must agree
    violations: list[str] = field(default_factory=list)
    report: str = ""


class Simulation:
    ledger_id = 1

    def __init__(self, seed: int, steps: int = DEFAULT_STEPS, *, wiped_bookies_rejoin: bool = False) -> None:
        self.seed = seed
        self.steps = steps
        self.wiped_bookies_rejoin = wiped_bookies_rejoin
        self.rng = random.Random(seed)
        self.loop = SimulatedTimeLoop()
        self.clock = SimulatedClock(self.loop)
        self.world = World(self.rng, self.loop)
        self.scenario = Scenario.draw(self.rng)
        self.network = Network(self.world, self.scenario.network)
        self.history = LedgerRecorder(History(clock=lambda: self.world.now_ms))
        self.store = SimMetadataStore(self.world, self.history.metadata_written)
        self.clients: dict[str, SimClient] = {}
        self.bookies = {bookie_id: BookieProcess(bookie_id, self.world, self.history, self.ledger_id)
                        for bookie_id in (f"b{index}:{BOOKIE_PORT}" for index in range(self.scenario.bookie_count))}
        self.faulting = True
        self.wiped = 0
        self.lossy: set[str] = set()  # bookies that lost data: wiped, or an entry damaged
        self.bugs: list[str] = []
        self.turns = 0
        self.changed = asyncio.Event()  # set when a client ends (or the writer created the ledger)

    def registered(self) -> list[str]:
        return [bookie_id for bookie_id, bookie in sorted(self.bookies.items()) if bookie.registered]

    def publish_bookies(self) -> None:
        """The registered bookies changed: what the store lists (and its watchers hear)."""
        self.store.set_bookies([BookieInfo(bookie_id, bookie_id) for bookie_id in self.registered()])

    def bug(self, message: str) -> None:
        self.world.log("BUG", message)
        self.bugs.append(f"bug: {message}")

    # ------------------------------------------------------------------ the run

    def run(self) -> RunResult:
        self.loop.set_exception_handler(self._loop_exception)
        logged = _ErrorLog(self)
        logging.getLogger("bookkeeper").addHandler(logged)
        try:
            self.loop.run_until_complete(self._main())
        except RuntimeError as exc:  # the loop found a spin or a deadlock
            self.bug(f"liveness: {exc}")
        finally:
            self.turns = self.loop.clock_selector.turns
            pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
            for task in pending:  # what the run leaves (a dead client's, a connection's sweeper)
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            logging.getLogger("bookkeeper").removeHandler(logged)
            self.loop.close()
        return self._result()

    async def _main(self) -> None:
        scenario, world = self.scenario, self.world
        self.publish_bookies()
        payloads = [f"{self.seed}:{index}:".encode() + bytes(self.rng.randint(0, 40))
                    for index in range(scenario.entry_count)]
        writer = WriterClient("writer", self, payloads, scenario.pipeline_depth, scenario.append_gap_ms_max)
        self._start(writer)
        await self._until(lambda: writer.created.done() or writer.done)
        if not writer.created.done():
            self.bug("the writer never created its ledger")
            return
        for index, start_ms in enumerate(scenario.recovery_starts_ms):
            world.after(start_ms, self._start, RecoveryClient(f"recovery{index}", self, calls_max=1))
        for index, start_ms in enumerate(scenario.reader_starts_ms):
            world.after(start_ms, self._start, ReaderClient(f"reader{index}", self))
        if scenario.faults:
            world.after(self.rng.randint(*scenario.fault_gap_ms), self._inject_fault)
        last_start_ms = max([0, *scenario.recovery_starts_ms, *scenario.reader_starts_ms])
        await self._until(lambda: world.now_ms > last_start_ms and all(
            client.done for client in self.clients.values()), turns_max=self.steps)
        self._heal()
        await self._until(lambda: writer.done, deadline_ms=world.now_ms + HEAL_WAIT_MS)
        final_recovery = RecoveryClient("final-recovery", self, calls_max=4, final=True)
        self._start(final_recovery)
        await self._until(lambda: final_recovery.done, deadline_ms=world.now_ms + FINAL_WAIT_MS)
        final_reader = ReaderClient("final-reader", self, final=True, attempts_max=5)
        self._start(final_reader)
        await self._until(lambda: final_reader.done, deadline_ms=world.now_ms + FINAL_WAIT_MS)

    def _start(self, client: SimClient) -> None:
        self.clients[client.name] = client
        client.start()

    async def _until(self, finished: Callable[[], bool], *, turns_max: int | None = None,
                     deadline_ms: float | None = None) -> None:
        world, selector = self.world, self.loop.clock_selector
        while not finished():
            if turns_max is not None and selector.turns >= turns_max:
                return
            wait_ms: float = POLL_MS
            if deadline_ms is not None:
                if world.now_ms >= deadline_ms:
                    return
                wait_ms = min(wait_ms, deadline_ms - world.now_ms)
            self.changed.clear()
            try:
                async with asyncio.timeout(wait_ms / 1000):
                    await self.changed.wait()
            except TimeoutError:
                pass

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """What asyncio would log: an exception out of a callback or a task nobody awaited."""
        error = context.get("exception")
        if error is None:
            self.bug(str(context.get("message")))
        else:  # not the message: it shows the callback's arguments, addresses included
            where = "a task" if "future" in context or "task" in context else "a callback"
            self.bug(f"{type(error).__name__} escaped {where}: {error}")

    def _result(self) -> RunResult:
        final = self.store.current
        self.history.finish_pending(self.world.now_ms)
        violations = check(self.history.history.events, final_ledger=final).messages() + self.bugs
        result = RunResult(self.seed, self.steps, self.scenario, len(self.history.adds),
                           len(self.history.ack_order), final.last_entry_id, self.world.faults,
                           self.turns, self.world.now_ms, self.world.fingerprint, violations)
        if violations:
            result.report = "\n".join([
                f"simulation seed {self.seed} (steps {self.steps}) broke {len(violations)} promise(s):",
                *(f"  - {violation}" for violation in violations[:20]),
                f"scenario: {self.scenario.describe()}",
                f"final metadata: {final.state.value} last entry {final.last_entry_id}, "
                f"fragments {[(first, list(bookies)) for first, bookies in final.ensembles]}",
                f"faults: {dict(sorted(self.world.faults.items()))}",
                f"replay: python -m tests.harness.sim --seed {self.seed} --steps {self.steps}",
                "last 40 events:", self.world.format_trace(40)])
        return result

    # ------------------------------------------------------------------ faults

    def _inject_fault(self) -> None:
        if not self.faulting:
            return
        kind = self.rng.choice(self.scenario.faults)
        getattr(self, f"_fault_{kind}")()
        self.world.after(self.rng.randint(*self.scenario.fault_gap_ms), self._inject_fault)

    def _pick_bookie(self, statuses: tuple[str, ...]) -> BookieProcess | None:
        candidates = [bookie for _, bookie in sorted(self.bookies.items()) if bookie.status in statuses]
        return self.rng.choice(candidates) if candidates else None

    def _down_count(self) -> int:
        return sum(1 for bookie in self.bookies.values() if bookie.status in ("crashed", "hung"))

    def _fault_crash(self) -> None:
        bookie = self._pick_bookie(("up", "hung"))
        if bookie is None or self._down_count() >= DOWN_BOOKIES_MAX:
            return
        self.world.fault("crash", bookie.bookie_id)
        bookie.crash()
        self.publish_bookies()
        self.world.after(self.rng.randint(30, 600), self._restart, bookie)

    def _restart(self, bookie: BookieProcess) -> None:
        bookie.restart()
        self.publish_bookies()

    def _fault_hang(self) -> None:
        bookie = self._pick_bookie(("up",))
        if bookie is None or self._down_count() >= DOWN_BOOKIES_MAX:
            return
        self.world.fault("hang", bookie.bookie_id)
        bookie.hang()
        self.world.after(self.rng.randint(50, 1200), bookie.resume)

    def _fault_partition(self) -> None:
        clients = [name for name, client in sorted(self.clients.items()) if not client.done]
        bookie = self._pick_bookie(("up", "hung", "crashed"))
        if not clients or bookie is None:
            return
        client = self.rng.choice(clients)
        self.world.fault("partition", client, "|", bookie.bookie_id)
        partition_id = self.network.partition(client, bookie.bookie_id)
        self.world.after(self.rng.randint(50, 1000), self.network.heal, client, bookie.bookie_id,
                         partition_id)

    def _may_lose(self, bookie: BookieProcess) -> bool:
        """A3 promises nothing beyond Qa - 1 bookies of a write set losing data; never let more
        than that many in the whole cluster lose any, so every write set stays within the promise."""
        ack_quorum = self.scenario.shape[2]
        return bookie.bookie_id in self.lossy or len(self.lossy) < ack_quorum - 1

    def _fault_wipe(self) -> None:
        # keep at least E bookies, or no recovery could ever find a full ensemble to write back to
        if len(self.bookies) - self.wiped - 1 < self.scenario.shape[0]:
            return
        bookie = self._pick_bookie(("up", "hung", "crashed"))
        if bookie is None or not self._may_lose(bookie):
            return
        self.wiped += 1
        self.lossy.add(bookie.bookie_id)
        self.world.fault("wipe", bookie.bookie_id)
        bookie.wipe(rejoin=self.wiped_bookies_rejoin)
        self.publish_bookies()
        if self.wiped_bookies_rejoin:
            self.world.after(self.rng.randint(30, 600), self._restart, bookie)

    def _fault_damage(self) -> None:
        """A bit flips in one stored entry of one bookie: reading it fails from now on (IO_ERROR),
        until a recovery write-back rewrites it."""
        bookie = self._pick_bookie(("up",))
        if bookie is None or not self._may_lose(bookie):
            return
        stored = bookie.damageable_entry_ids()
        if not stored:
            return
        entry_id = self.rng.choice(stored)
        self.lossy.add(bookie.bookie_id)
        self.world.fault("damage", bookie.bookie_id, f"e{entry_id}")
        bookie.damage(entry_id)

    def _fault_zk_stall(self) -> None:
        duration_ms = self.rng.randint(100, 1500)
        self.world.fault("zk_stall", f"{duration_ms} ms")
        self.store.stall(duration_ms)

    def _fault_zk_reply_lost(self) -> None:
        self.store.replies_to_lose += 1  # counted when a reply is actually lost

    def _fault_writer_crash(self) -> None:
        writer = self.clients.get("writer")
        if writer is None or writer.done or self.rng.random() < 0.7:
            return  # rare: most runs should see the writer's own end
        self.world.fault("writer_crash")
        writer.die()

    def _heal(self) -> None:
        self.faulting = False
        self.network.faulty = False
        self.network.heal_all()
        self.store.heal()
        for _, bookie in sorted(self.bookies.items()):
            bookie.restart()
            bookie.resume()
        self.publish_bookies()
        self.world.log("HEAL", "every fault ends")


class _ErrorLog(logging.Handler):
    """An error the shipped code logged (an exception it caught to keep going) is a bug."""

    def __init__(self, simulation: Simulation) -> None:
        super().__init__(logging.ERROR)
        self.simulation = simulation

    def emit(self, record: logging.LogRecord) -> None:
        self.simulation.bug(f"logged by {record.name}: {record.getMessage()}")


def run(seed: int, steps: int = DEFAULT_STEPS, *, raise_on_violation: bool = True,
        **options: bool) -> RunResult:
    """One run; raises AssertionError (seed, broken promises, last events) on a violation."""
    result = Simulation(seed, steps, **options).run()
    if result.violations and raise_on_violation:
        raise AssertionError(result.report)
    return result
