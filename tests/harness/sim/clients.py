"""Simulated clients: drivers that run the REAL state machines by carrying out their effects.

They do what `bookkeeper/client/ledger.py` does over asyncio, over the simulated network instead:
one request id per request and at most one answer per request id (a duplicated answer is dropped,
as the connection's pending table would), a reset connection fails every request pending on it,
a metadata conflict is answered by reading the current metadata, a lost metadata reply is retried
with the same expected version. Clients decide nothing about replication themselves.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from bookkeeper.client.batcher import plan_range_reads
from bookkeeper.errors import (
    BookieUnavailableError,
    DlogError,
    MetadataError,
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
from bookkeeper.protocol.metadata import LedgerMetadata
from bookkeeper.protocol.reader import ReadOp
from bookkeeper.protocol.recovery import Phase, RecoveryOp
from bookkeeper.protocol.writer import LedgerWriter, WriterState

from .bookie import Request, Response
from tests.harness.history.ledger import Operation

if TYPE_CHECKING:
    from .simulation import Simulation

TICK_MS = 10
ADD_TIMEOUT_MS = 300
READ_TIMEOUT_MS = 250
SPECULATIVE_MS = 60
EXPLICIT_LAC_INTERVAL_MS = 40
LAC_PROBE_TIMEOUT_MS = 200
METADATA_RETRIES_MAX = 8
METADATA_RETRY_MS = 20


class Driver:
    def __init__(self, name: str, sim: Simulation) -> None:
        self.name = name
        self.sim = sim
        self.world = sim.world
        self.machine: Any = None
        self.alive = True  # False once this client process died: it ignores everything
        self.done = False
        self._request_ids = itertools.count(1)
        self._outstanding: dict[int, tuple[str, str, int]] = {}  # request id -> (bookie, kind, entry)
        self._generation = 0  # a new machine (recovery retry) ignores the old one's answers
        # batched frames, as bookkeeper/client/driver.py sends them: the adds and reads of one
        # run() to one bookie leave together (ADD_BATCH, READ_RANGE) at its end
        self.batched = sim.batched
        self._adds: dict[str, list[tuple[int, bytes, bool]]] = {}
        self._reads: dict[tuple[str, bool], list[int]] = {}

    # ------------------------------------------------------------------ bookie requests

    def send(self, bookie: str, kind: str, entry_id: Any, **fields: Any) -> None:
        """`entry_id` is a tuple of entry ids for the batched kinds (add_batch, read_range)."""
        request_id = next(self._request_ids)
        self._outstanding[request_id] = (bookie, kind, entry_id)
        if kind in ("add_batch", "read_range"):
            entry_id = fields.pop("first", -1)
        wire_kind = "read" if kind == "lac" else kind
        request = Request(self.name, request_id, wire_kind, self.sim.ledger_id, entry_id, **fields)
        self.sim.network.send(self.name, bookie, self.sim.bookies[bookie].receive, request)

    def on_response(self, response: Response) -> None:
        if not self.alive:
            return
        sent = self._outstanding.pop(response.request_id, None)
        if sent is None:
            return  # a duplicate, or answered already by a connection reset
        bookie, kind, entry_id = sent
        self.on_answer(bookie, kind, entry_id, response)

    def _send_batched(self) -> None:
        master_key = self.sim.master_key
        adds, self._adds = self._adds, {}
        for bookie, entries in adds.items():
            if len(entries) == 1:
                entry_id, packed_entry, recovery = entries[0]
                self.send(bookie, "add", entry_id, packed_entry=packed_entry, master_key=master_key,
                          recovery=recovery)
                continue
            self.world.stats["ADD_BATCH frames"] += 1
            self.send(bookie, "add_batch", tuple((entry_id, False) for entry_id, _, _ in entries),
                      entries=tuple((entry_id, packed) for entry_id, packed, _ in entries),
                      master_key=master_key, recovery=entries[0][2])
        reads, self._reads = self._reads, {}
        for (bookie, fence), entry_ids in reads.items():
            ranges, singles = plan_range_reads(entry_ids)
            for first, last, stride in ranges:
                self.world.stats["READ_RANGE requests"] += 1
                wanted = tuple((entry_id, fence) for entry_id in entry_ids if first <= entry_id <= last)
                self.send(bookie, "read_range", wanted, first=first, last_entry_id=last, stride=stride,
                          fence=fence, master_key=master_key if fence else b"")
            for entry_id in singles:
                self.send(bookie, "read", entry_id, fence=fence, master_key=master_key if fence else b"")

    def on_disconnect(self, bookie: str) -> None:
        if not self.alive:
            return
        for request_id, (target, kind, entry_id) in list(self._outstanding.items()):
            # an answer below may start a new attempt, which forgets the old requests
            if target == bookie and self._outstanding.pop(request_id, None) is not None:
                error = BookieUnavailableError(f"connection to {bookie} reset")
                self.on_answer(bookie, kind, entry_id, Response(request_id, bookie, error))

    def on_answer(self, bookie: str, kind: str, entry_id: Any, response: Response) -> None:
        machine, now_ms, error = self.machine, self.world.now_ms, response.error
        if kind == "add_batch":
            return self._batch_answered(bookie, entry_id, response)
        if kind == "read_range":
            return self._range_answered(bookie, entry_id, response)
        if kind == "add":
            self.run(machine.on_add_ok(bookie, entry_id, now_ms) if error is None
                     else machine.on_add_error(bookie, entry_id, error, now_ms))
        elif kind == "read":
            self.run(self.read_ok(bookie, entry_id, response) if error is None
                     else machine.on_read_error(bookie, entry_id, error, now_ms))

    def _batch_answered(self, bookie: str, entries: tuple[tuple[int, bool], ...], response: Response) -> None:
        machine, now_ms = self.machine, self.world.now_ms
        if response.error is not None:
            failures = [(entry_id, response.error) for entry_id, _ in entries]
        else:
            failures = [(entries[position][0], error) for position, error in response.errors]
        failed = {entry_id for entry_id, _ in failures}
        effects = machine.on_adds_ok(bookie, [entry_id for entry_id, _ in entries if entry_id not in failed],
                                     now_ms)
        for entry_id, error in failures:
            effects += machine.on_add_error(bookie, entry_id, error, now_ms)
        self.run(effects)

    def _range_answered(self, bookie: str, wanted: tuple[tuple[int, bool], ...], response: Response) -> None:
        """Each wanted entry's answer as a plain read would give it; the uncovered are asked again."""
        machine, now_ms = self.machine, self.world.now_ms
        effects: list[Effect] = []
        if response.error is not None:
            for entry_id, _ in wanted:
                effects += machine.on_read_error(bookie, entry_id, response.error, now_ms)
            return self.run(effects)
        got = dict(response.entries)
        for entry_id, fence in wanted:
            if entry_id in got:
                effects += self.read_ok(bookie, entry_id, Response(
                    response.request_id, bookie, None, response.lac, got[entry_id]))
            elif entry_id <= response.covered_last_entry_id:
                effects += machine.on_read_error(bookie, entry_id, NoSuchEntryError(
                    f"no entry {self.sim.ledger_id}:{entry_id} on {bookie}"), now_ms)
            else:
                self._reads.setdefault((bookie, fence), []).append(entry_id)
        return self.run(effects)

    def read_ok(self, bookie: str, entry_id: int, response: Response) -> list[Effect]:
        return self.machine.on_read_ok(bookie, entry_id, response.packed_entry, self.world.now_ms)

    # ------------------------------------------------------------------ effects

    def run(self, effects: list[Effect]) -> None:
        master_key = self.sim.master_key
        generation = self._generation
        for effect in effects:
            if isinstance(effect, SendAdd):
                if effect.recovery:
                    self.world.stats["write-back adds"] += 1
                if self.batched:
                    self._adds.setdefault(effect.bookie, []).append(
                        (effect.entry_id, effect.packed_entry, effect.recovery))
                    continue
                self.send(effect.bookie, "add", effect.entry_id, packed_entry=effect.packed_entry,
                          master_key=master_key, recovery=effect.recovery)
            elif isinstance(effect, SendRead) and self.batched and effect.entry_id >= 0:
                self._reads.setdefault((effect.bookie, effect.fence), []).append(effect.entry_id)
            elif isinstance(effect, SendRead):
                self.send(effect.bookie, "read", effect.entry_id, fence=effect.fence,
                          master_key=master_key if effect.fence else b"")
            elif isinstance(effect, SendWriteLac):
                self.world.stats["explicit LAC writes"] += 1
                self.send(effect.bookie, "write_lac", -1, lac=effect.lac, master_key=master_key)
            elif isinstance(effect, WriteMetadata):
                self.write_metadata(effect, self._generation, 0)
            else:
                self.outcome(effect)
        if self._adds or self._reads:
            if generation == self._generation and self.machine is not None:
                self._send_batched()
            else:  # the machine these were for failed or was replaced during this run
                self._adds, self._reads = {}, {}
        self.after_run()

    def outcome(self, effect: Effect) -> None:
        raise NotImplementedError

    def after_run(self) -> None:
        return None

    def write_metadata(self, effect: WriteMetadata, generation: int, attempt: int) -> None:
        def current() -> bool:
            return self.alive and generation == self._generation

        def written(version: int) -> None:
            if current():
                self.run(self.machine.on_metadata_written(effect.metadata, version, self.world.now_ms))

        def now_stored(metadata: LedgerMetadata, version: int) -> None:
            if current():
                self.run(self.machine.on_metadata_conflict(metadata, version, self.world.now_ms))

        def conflict() -> None:
            if current():
                self.sim.store.read(now_stored)

        def lost() -> None:
            if not current():
                return
            if attempt < METADATA_RETRIES_MAX:
                self.world.after(METADATA_RETRY_MS * (attempt + 1), self.write_metadata, effect,
                                 generation, attempt + 1)
            else:
                self.run(self.machine.on_metadata_failed(MetadataError("metadata store unreachable")))

        self.sim.store.write(self.name, effect.metadata, effect.expected_version, written, conflict, lost)

    # ------------------------------------------------------------------ time

    def start_ticking(self) -> None:
        self.world.after(TICK_MS, self._tick, self._generation)

    def _tick(self, generation: int) -> None:
        if not self.alive or self.done or generation != self._generation:
            return
        self.before_tick()
        self.run(self.machine.on_tick(self.world.now_ms))
        self.world.after(TICK_MS, self._tick, generation)

    def before_tick(self) -> None:
        return None

    def die(self) -> None:
        self.alive = False
        self.done = True


class WriterClient(Driver):
    """Appends a stream of unique payloads with a bounded pipeline, then closes the ledger."""

    def __init__(self, name: str, sim: Simulation, payloads: list[bytes], depth: int,
                 gap_ms_max: int) -> None:
        super().__init__(name, sim)
        self.payloads = payloads
        self.depth = depth
        self.gap_ms_max = gap_ms_max
        self._next_index = 0
        self._close: Operation | None = None

    def start(self) -> None:
        store = self.sim.store
        self.machine = LedgerWriter(
            self.sim.ledger_id, store.current, store.version, self.sim.digest,
            available_bookies=self.sim.registered(), rng=self.world.rng, add_timeout_ms=ADD_TIMEOUT_MS,
            explicit_lac_interval_ms=EXPLICIT_LAC_INTERVAL_MS)
        self.start_ticking()
        self._append_next()

    def before_tick(self) -> None:
        self.machine.on_bookies_changed(self.sim.registered())

    def _append_next(self) -> None:
        writer: LedgerWriter = self.machine
        if not self.alive or self.done or writer.state in (WriterState.FAILED, WriterState.CLOSED):
            return
        if self._next_index >= len(self.payloads):
            self._maybe_close()
        elif writer.pending_count >= self.depth:  # the pipeline is full: look again in a moment
            self.world.after(1, self._append_next)
        else:
            payload = self.payloads[self._next_index]
            self._next_index += 1
            entry_id, effects = writer.append(payload, self.world.now_ms)
            self.sim.history.add_invoked(self.name, entry_id, payload, self.world.now_ms)
            self.world.log(self.name, "append", entry_id)
            self.run(effects)
            self.world.after(self.world.rng.randint(0, self.gap_ms_max), self._append_next)

    def _maybe_close(self) -> None:
        writer: LedgerWriter = self.machine
        if not self.alive or self.done or self._close is not None:
            return
        if writer.state is WriterState.OPEN and writer.pending_count == 0:
            self._close = self.sim.history.invoke(self.name, "close", self.world.now_ms)
            self.run(writer.close())
        else:
            self.world.after(TICK_MS, self._maybe_close)

    def outcome(self, effect: Effect) -> None:
        history, now_ms, writer = self.sim.history, self.world.now_ms, self.machine
        if isinstance(effect, CompleteAdds):
            self.world.log(self.name, "acked", effect.first_entry_id, "..", effect.last_entry_id)
            for entry_id in range(effect.first_entry_id, effect.last_entry_id + 1):
                history.add_acked(entry_id, now_ms, writer.metadata)
        elif isinstance(effect, FailAdds):
            self.world.log(self.name, "failed from", effect.first_entry_id, type(effect.error).__name__)
            self.world.stats[f"writer failed: {type(effect.error).__name__}"] += 1
            for entry_id in range(effect.first_entry_id, writer.next_entry_id):
                history.add_unknown(entry_id, now_ms, effect.error)
        elif isinstance(effect, Finished) and self._close is not None:
            self.world.log(self.name, "close", "ok" if effect.error is None else effect.error)
            self.world.stats["writer close " + ("ok" if effect.error is None else "failed")] += 1
            if effect.error is None and effect.metadata is not None:
                self._close.finish("ok", now_ms, effect.metadata.last_entry_id)
            else:
                self._close.finish("fail", now_ms, error=effect.error)

    def after_run(self) -> None:
        if self.machine.state in (WriterState.FAILED, WriterState.CLOSED):
            self.done = True

    def die(self) -> None:
        """kill -9 of the writer: what it had pending has an unknown outcome."""
        for entry_id in range(self.machine.lac + 1, self.machine.next_entry_id):
            self.sim.history.add_unknown(entry_id, self.world.now_ms, DlogError("writer died"))
        super().die()


class RecoveryClient(Driver):
    """Opens the ledger with recovery; retries a retryable failure from a fresh metadata read."""

    def __init__(self, name: str, sim: Simulation, *, attempts_max: int, final: bool = False) -> None:
        super().__init__(name, sim)
        self.attempts_max = attempts_max
        self.final = final
        self.attempts = 0
        self._operation: Operation | None = None
        self._covered = False

    def start(self) -> None:
        if not self.alive:
            return
        self.attempts += 1
        self._generation += 1
        self._outstanding.clear()
        self._covered = False
        self._operation = self.sim.history.invoke(self.name, "recover", self.world.now_ms, final=self.final)
        generation = self._generation
        self.sim.store.read(lambda metadata, version: self._open(metadata, version, generation))

    def _open(self, metadata: LedgerMetadata, version: int, generation: int) -> None:
        if not self.alive or generation != self._generation:
            return
        self.machine = RecoveryOp(self.sim.ledger_id, metadata, version, self.sim.digest,
                                  available_bookies=self.sim.registered(), rng=self.world.rng,
                                  read_timeout_ms=READ_TIMEOUT_MS, add_timeout_ms=ADD_TIMEOUT_MS,
                                  window=self.world.rng.randint(1, 8))
        self.world.log(self.name, "recover from", metadata.state.value, f"v{version}")
        self.run(self.machine.start(self.world.now_ms))
        self.start_ticking()

    def read_ok(self, bookie: str, entry_id: int, response: Response) -> list[Effect]:
        return self.machine.on_read_ok(bookie, entry_id, response.lac, response.packed_entry, self.world.now_ms)

    def after_run(self) -> None:
        op = self.machine
        if not self._covered and op.phase in (Phase.READING, Phase.CLOSING):
            self._covered = True
            self.world.log(self.name, "fencing covered")
            self.sim.history.fencing_covered(self.name, self.world.now_ms, op.metadata)

    def outcome(self, effect: Effect) -> None:
        assert isinstance(effect, Finished) and self._operation is not None
        now_ms = self.world.now_ms
        if effect.error is None and effect.metadata is not None:
            self.world.log(self.name, "recovered, closed at", effect.metadata.last_entry_id)
            self.world.stats["recoveries ok"] += 1
            self._operation.finish("ok", now_ms, effect.metadata.last_entry_id)
            self.done = True
            return
        self.world.log(self.name, "recovery failed:", type(effect.error).__name__, effect.error)
        self.world.stats[f"recovery failed: {type(effect.error).__name__}"] += 1
        self._operation.finish("fail", now_ms, error=effect.error)
        self._generation += 1  # stop this attempt's ticks and answers
        self._outstanding.clear()
        if type(effect.error).retryable and self.attempts < self.attempts_max:
            self.world.after(self.world.rng.randint(20, 200), self.start)
        else:
            self.done = True


class ReaderClient(Driver):
    """Reads up to the LAC of an open ledger (asking the last ensemble), or a closed ledger to its end."""

    def __init__(self, name: str, sim: Simulation, *, final: bool = False, attempts_max: int = 1) -> None:
        super().__init__(name, sim)
        self.final = final
        self.attempts_max = attempts_max
        self.attempts = 0
        self._operation: Operation | None = None
        self._metadata: LedgerMetadata | None = None
        self._lacs: dict[str, int | None] = {}
        self._probing = False
        self._first = 0

    def start(self) -> None:
        if not self.alive:
            return
        self.attempts += 1
        self._generation += 1
        self._outstanding.clear()
        self._operation = self.sim.history.invoke(self.name, "read", self.world.now_ms, final=self.final)
        generation = self._generation
        self.sim.store.read(lambda metadata, version: self._opened(metadata, generation))

    def _opened(self, metadata: LedgerMetadata, generation: int) -> None:
        if not self.alive or generation != self._generation:
            return
        self._metadata = metadata
        if metadata.is_closed:
            return self._read(metadata.last_entry_id, "closed")
        ensemble = metadata.last_ensemble[1]
        self._lacs = {bookie: None for bookie in ensemble}
        self._probing = True
        for bookie in ensemble:
            self.send(bookie, "lac", -1)
        self.world.after(LAC_PROBE_TIMEOUT_MS, self._lac_known, generation)
        return None

    def on_answer(self, bookie: str, kind: str, entry_id: int, response: Response) -> None:
        if kind != "lac":
            return super().on_answer(bookie, kind, entry_id, response)
        if response.error is None:
            self._lacs[bookie] = response.lac
        elif isinstance(response.error, NoSuchLedgerError):
            self._lacs[bookie] = -1  # as ReadHandle.read_lac: no add of this ledger reached it yet
        else:
            self._lacs.pop(bookie, None)
        if all(lac is not None for lac in self._lacs.values()):
            self._lac_known(self._generation)
        return None

    def _lac_known(self, generation: int) -> None:
        if not self.alive or generation != self._generation or not self._probing:
            return
        self._probing = False
        lacs = [lac for lac in self._lacs.values() if lac is not None]
        if not lacs:
            return self._failed(BookieUnavailableError("no bookie of the last ensemble told its LAC"))
        lac = max(lacs)
        return self._read(lac, "lac")

    def _read(self, bound: int, bound_kind: str) -> None:
        operation, metadata = self._operation, self._metadata
        assert operation is not None and metadata is not None
        rng = self.world.rng
        self._first = 0 if self.final or bound < 0 or rng.random() < 0.6 else rng.randint(0, bound)
        operation.value = (self._first, bound, bound_kind)
        operation.result = []
        if bound_kind == "lac":
            self.sim.history.lac_learned(operation, bound)
        self.world.log(self.name, "reads", self._first, "..", bound, f"({bound_kind})")
        if bound < self._first:
            operation.finish("ok", self.world.now_ms)
            self.done = True
            return
        self.machine = ReadOp(self.sim.ledger_id, metadata, self.sim.digest, self._first, bound,
                              speculative_ms=SPECULATIVE_MS, read_timeout_ms=READ_TIMEOUT_MS,
                              window=rng.randint(1, 16))
        self.run(self.machine.start(self.world.now_ms))
        self.start_ticking()

    def outcome(self, effect: Effect) -> None:
        operation = self._operation
        assert operation is not None
        if isinstance(effect, CompleteRead):
            operation.result.append((effect.entry_id, effect.payload))
            if effect.entry_id == operation.value[1]:  # the bound: the whole range was delivered
                self.world.log(self.name, "read done", len(operation.result), "entries")
                self.world.stats["reads ok"] += 1
                operation.finish("ok", self.world.now_ms)
                self.done = True
        elif isinstance(effect, FailRead):
            self._failed(effect.error)

    def _failed(self, error: DlogError) -> None:
        operation = self._operation
        assert operation is not None
        self.world.log(self.name, "read failed:", type(error).__name__, error)
        self.world.stats[f"read failed: {type(error).__name__}"] += 1
        operation.finish("fail", self.world.now_ms, error=error)
        self._generation += 1
        self._outstanding.clear()
        self.machine = None
        if self.attempts < self.attempts_max:
            self.world.after(self.world.rng.randint(20, 100), self.start)
        else:
            self.done = True
