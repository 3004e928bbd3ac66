"""Simulated client processes: each is the shipped `bookkeeper.client.BookKeeper` (its pool, batcher,
connections, ledger handles and drivers), with its own metadata session and its own dial into the
simulated network, recording what its caller saw into the history.

- the writer creates the ledger (`create_ledger`: real placement), appends a stream of unique
  payloads keeping at most `depth` unanswered (`append_async`), then closes it;
- a recovery opens it with recovery (`open_ledger(recovery=True)`: fencing, recovery reads,
  write-back, close, with the client's own retries); each attempt is recorded, and when its machine
  counted the ledger fenced (the checker's A7 starts there), through `BookKeeper.recovery_driver`;
- a reader opens it without recovery, learns the LAC (or the closed end) and reads a range to it.
A client decides nothing about replication itself. One that is killed (the writer, as kill -9)
stops hearing anything: its connections and metadata session go dead, its pending adds' outcomes
are unknown.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from bookkeeper.client import BookKeeper
from bookkeeper.client.ledger import LedgerHandle, RecoveryDriver
from bookkeeper.errors import DlogError
from bookkeeper.protocol.effects import Effect, Finished
from bookkeeper.protocol.recovery import Phase
from bookkeeper.security.settings import SecuritySettings
from tests.harness.history.ledger import Operation

from .metastore import ClientStore
from .transport import Dialer

if TYPE_CHECKING:
    from .simulation import Simulation

TICK_S = 0.01
ADD_TIMEOUT_S = 0.3
READ_TIMEOUT_S = 0.25
SPECULATIVE_MS = 60
EXPLICIT_LAC_INTERVAL_MS = 40
PASSWORD = b"sim-password"


class SimClient:
    """One client process: a BookKeeper over the simulated network and metadata store."""

    def __init__(self, name: str, sim: Simulation, *, pending_adds_max: int = 10_000) -> None:
        self.name = name
        self.sim = sim
        self.world = sim.world
        self.history = sim.history
        self.alive = True
        self.done = False
        self.store = ClientStore(sim.store, name)
        self.dialer = Dialer(sim.network, name, sim.bookies)
        self.client = BookKeeper(store=self.store, rng=sim.rng, clock=sim.clock, dial=self.dialer,
                                 security=SecuritySettings(), add_timeout_s=ADD_TIMEOUT_S,
                                 read_timeout_s=READ_TIMEOUT_S, speculative_read_ms=SPECULATIVE_MS,
                                 explicit_lac_interval_ms=EXPLICIT_LAC_INTERVAL_MS, tick_interval_s=TICK_S,
                                 pending_adds_max=pending_adds_max)
        self.client.recovery_driver = _observed_recovery(self)  # type: ignore[misc]

    def start(self) -> None:
        self.world.loop.create_task(self._main(), name=self.name)

    async def _main(self) -> None:
        try:
            await self.client.start()
            await self.run()
        except Exception as exc:  # noqa: BLE001 - not one of dlog's errors: a bug, reported
            if self.alive:
                self.sim.bug(f"{self.name} raised {type(exc).__name__}: {exc}")
        finally:
            self.done = True
            self.sim.changed.set()

    async def run(self) -> None:
        raise NotImplementedError

    def die(self) -> None:
        """kill -9: nothing of this process is heard again."""
        self.alive = False
        self.done = True
        self.store.alive = False
        self.dialer.kill()
        self.sim.changed.set()

    def pause_ms(self, low: int, high: int) -> Any:
        return asyncio.sleep(self.world.rng.randint(low, high) / 1000)


def _observed_recovery(client: SimClient) -> type[RecoveryDriver]:
    """The client's recovery driver: the shipped one, recording each attempt and the moment its
    machine counted the ledger fenced."""

    class ObservedRecovery(RecoveryDriver):
        covered = False

        def run(self, effects: list[Effect]) -> None:
            super().run(effects)
            if (not self.covered and client.alive
                    and self.machine.phase in (Phase.READING, Phase.CLOSING)):
                self.covered = True
                client.world.log(client.name, "fencing covered")
                client.history.fencing_covered(client.name, client.world.now_ms, self.machine.metadata)

        async def recover(self) -> Finished:
            world = client.world
            final = isinstance(client, RecoveryClient) and client.final
            operation = client.history.invoke(client.name, "recover", world.now_ms, final=final)
            world.log(client.name, "recover from", self.machine.metadata.state.value)
            finished = await super().recover()
            if not client.alive:
                return finished
            if finished.error is None and finished.metadata is not None:
                world.log(client.name, "recovered, closed at", finished.metadata.last_entry_id)
                world.stats["recoveries ok"] += 1
                operation.finish("ok", world.now_ms, finished.metadata.last_entry_id)
            else:
                error = finished.error
                world.log(client.name, "recovery failed:", type(error).__name__, error)
                world.stats[f"recovery failed: {type(error).__name__}"] += 1
                operation.finish("fail", world.now_ms, error=error)
            return finished

    return ObservedRecovery


class WriterClient(SimClient):
    """Creates the ledger, appends unique payloads with a bounded pipeline, then closes it."""

    def __init__(self, name: str, sim: Simulation, payloads: list[bytes], depth: int, gap_ms_max: int) -> None:
        super().__init__(name, sim)
        self.payloads = payloads
        self.depth = depth
        self.gap_ms_max = gap_ms_max
        self.created: asyncio.Future[int] = sim.loop.create_future()
        self.handle: LedgerHandle | None = None
        self._unanswered: dict[int, None] = {}  # entry ids appended, not yet answered
        self._room = asyncio.Event()
        self._failed = False

    async def run(self) -> None:
        ensemble, write_quorum, ack_quorum = self.sim.scenario.shape
        handle = self.handle = await self.client.create_ledger(ensemble, write_quorum, ack_quorum,
                                                               password=PASSWORD)
        self.world.log(self.name, "created ledger on", list(handle.metadata.last_ensemble[1]))
        self.created.set_result(handle.ledger_id)
        self.sim.changed.set()
        for entry_id, payload in enumerate(self.payloads):
            while len(self._unanswered) >= self.depth and not self._failed:
                self._room.clear()
                await self._room.wait()
            if self._failed or not self.alive:
                return
            self.history.add_invoked(self.name, entry_id, payload, self.world.now_ms)
            try:
                future = handle.append_async(payload)
            except DlogError as exc:  # the ledger failed meanwhile: certainly not written
                self.history.adds[entry_id].finish("fail", self.world.now_ms, error=exc)
                return
            self.world.log(self.name, "append", entry_id)
            self._unanswered[entry_id] = None
            future.add_done_callback(lambda done, entry_id=entry_id: self._answered(entry_id, done))
            await self.pause_ms(0, self.gap_ms_max)
        await self._close(handle)

    def _answered(self, entry_id: int, future: asyncio.Future[int]) -> None:
        if future.cancelled():  # the run is over: its close, waiting for it, was cancelled
            return
        error = future.exception()  # retrieved even by a dead writer, or asyncio reports it lost
        if not self.alive:
            return
        self._unanswered.pop(entry_id, None)
        self._room.set()
        now_ms = self.world.now_ms
        if error is None:
            self.world.log(self.name, "acked", entry_id)
            self.history.add_acked(entry_id, now_ms, self.handle.metadata)  # type: ignore[union-attr]
            return
        if not self._failed:
            self._failed = True
            self.world.log(self.name, "failed from", entry_id, type(error).__name__)
            self.world.stats[f"writer failed: {type(error).__name__}"] += 1
        self.history.add_unknown(entry_id, now_ms, error)

    async def _close(self, handle: LedgerHandle) -> None:
        close: Operation = self.history.invoke(self.name, "close", self.world.now_ms)
        try:
            await handle.close()
        except DlogError as exc:
            if self.alive:
                self.world.log(self.name, "close failed:", type(exc).__name__)
                self.world.stats["writer close failed"] += 1
                close.finish("fail", self.world.now_ms, error=exc)
            return
        if self.alive:
            self.world.log(self.name, "closed at", handle.metadata.last_entry_id)
            self.world.stats["writer close ok"] += 1
            close.finish("ok", self.world.now_ms, handle.metadata.last_entry_id)

    def die(self) -> None:
        """kill -9 of the writer: what it had pending has an unknown outcome."""
        for entry_id in self._unanswered:
            self.history.add_unknown(entry_id, self.world.now_ms, DlogError("writer died"))
        if self.handle is not None:
            self.handle.stop_ticking()
        super().die()


class RecoveryClient(SimClient):
    """Opens the ledger with recovery (the client's own retries), `calls_max` times at most."""

    def __init__(self, name: str, sim: Simulation, *, calls_max: int = 1, final: bool = False) -> None:
        super().__init__(name, sim)
        self.calls_max = calls_max
        self.final = final

    async def run(self) -> None:
        for _ in range(self.calls_max):
            try:
                await self.client.open_ledger(self.sim.ledger_id, password=PASSWORD, recovery=True)
                return
            except DlogError as exc:
                if not type(exc).retryable:
                    return
            await self.pause_ms(20, 200)


class ReaderClient(SimClient):
    """Reads up to the LAC of an open ledger (as the client learns it), or a closed ledger to its end."""

    def __init__(self, name: str, sim: Simulation, *, final: bool = False, attempts_max: int = 1) -> None:
        super().__init__(name, sim)
        self.final = final
        self.attempts_max = attempts_max

    async def run(self) -> None:
        for _ in range(self.attempts_max):
            operation = self.history.invoke(self.name, "read", self.world.now_ms, final=self.final)
            try:
                await self._read(operation)
                return
            except DlogError as exc:
                if not self.alive:
                    return
                self.world.log(self.name, "read failed:", type(exc).__name__, exc)
                self.world.stats[f"read failed: {type(exc).__name__}"] += 1
                operation.finish("fail", self.world.now_ms, error=exc)
            await self.pause_ms(20, 100)

    async def _read(self, operation: Operation) -> None:
        handle = await self.client.open_ledger(self.sim.ledger_id, password=PASSWORD, recovery=False)
        if handle.is_closed:
            bound, bound_kind = handle.metadata.last_entry_id, "closed"
        else:
            bound, bound_kind = handle.last_add_confirmed, "lac"
            self.history.lac_learned(operation, bound)
        rng = self.world.rng
        first = 0 if self.final or bound < 0 or rng.random() < 0.6 else rng.randint(0, bound)
        operation.value = (first, bound, bound_kind)
        operation.result = []
        self.world.log(self.name, "reads", first, "..", bound, f"({bound_kind})")
        if bound >= first:
            entries = await handle.read(first, bound)
            operation.result = [(entry.entry_id, entry.payload) for entry in entries]
        self.world.log(self.name, "read done", len(operation.result), "entries")
        self.world.stats["reads ok"] += 1
        operation.finish("ok", self.world.now_ms)
