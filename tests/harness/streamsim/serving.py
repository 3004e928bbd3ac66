"""The serving tier in the stream simulator (issue 22 item 9): servers that own one stream in
turn, idempotent producers that retry, and server kills with takeovers.

Each server is a process of its own (a namespace on its own store session and ledger client)
that takes the stream as `dlog serve` does: the writer lock, then the producer dedup table
rebuilt (`dlog.server.owned.rebuild_dedup`: the stored snapshot, the entries after it), then an
`OwnedStream` whose `produce_idempotent` answers Kafka producers exactly as the Kafka API does.
A killed server is a process that died: nothing of it answers any more (entries it sent still
reach the ledger: durable, never acknowledged), its session expires later, and the other server
takes the stream over. Producers send numbered records in batches with Kafka's consecutive
sequences, one batch at a time, to whichever server owns the stream; a batch whose answer does
not come (a dead server, a lost reply) is sent again, the same sequences, maybe to the next owner.

A named native producer (`open_writer(name, producer_id=...)`, issue 25) writes a stream of its
own in the same world: its writer process is killed now and then (at any moment, or right after
a write is acknowledged and before the application hears of it), and each new writer resends,
in the same batches, everything the application did not see acknowledged; its facts are
`named_ack` and a `named_final` read, checked as the Kafka producers' are.

The world runs beside the rest of the simulation on the same simulated loop but with its own
random generator, store and ledgers: the other clients' draws, and the seeds that show each
planted bug, stay as they were. The history gets `producer_ack` facts (what each producer was
told) and a `served_final` read of the stream; `tests.harness.history.producers` counts the
duplicates and losses per producer.
"""

from __future__ import annotations

import asyncio
import collections
import random
from typing import TYPE_CHECKING, Any

from bookkeeper.errors import DlogError
from dlog import Namespace, SequenceError
from dlog.segments.memory import MemoryMetadata
from dlog.serve.kafka import ErrorCode, Record
from dlog.server.owned import OwnedStream, rebuild_dedup

from .actors import Process, error_text
from .ledgers import SimLedgers

if TYPE_CHECKING:
    from .simulation import StreamSimulation

SERVED = "served"
NAMED = "named"  # the named native producer's stream
NAMED_SHARE = 0.5  # runs with servers that also have the named producer (the others interleave as they did)
NAMED_KILL_AFTER_ACK_SHARE = 0.1  # acknowledged writes after which the writer process dies before telling
SERVING_SHARE = 0.5  # runs that have servers
ANSWER_WAIT_S = 1.0  # a producer sends again when its answer has not come by then
LOST_REPLY_SHARE = 0.1  # answers a producer never hears (it sends the batch again)
FINISH_S_MAX = 30.0


class SimServer:
    def __init__(self, world: ServingWorld, server_id: int) -> None:
        self.world, self.server_id = world, server_id
        self.process: Process | None = None
        self.owned: OwnedStream | None = None
        self.generation = 0
        self._version: int | None = None

    async def start(self) -> None:
        self.generation += 1
        self.process = await self.world.new_process()
        self.world.spawn(self._serve(self.generation))

    async def _serve(self, generation: int) -> None:
        """Take the stream whenever nobody holds it, as long as this process lives."""
        while self.generation == generation and self.process is not None and self.process.alive:
            if self.owned is None or self.owned.writer.error is not None:
                self.owned = None
                await self._take()
            await asyncio.sleep(0.1)

    async def _take(self) -> None:
        assert self.process is not None
        namespace = self.process.namespace
        try:
            writer = await namespace.open_writer(SERVED, lock_timeout_s=0.3, lock_holder={"server": self.server_id},
                                                 linger_ms=1.0)
        except DlogError:
            return  # held by the other server, or by a dead one whose session has not expired yet
        try:
            end = writer.segment.first_position if writer.segment is not None else None
            if end is None:
                end = (await namespace.position_bounds(SERVED))[1] or 0
            table, version, replayed = await rebuild_dedup(namespace, SERVED, end)
        except DlogError as exc:
            self.world.sim.history.record(f"server{self.server_id}", "served_take_failed", error=error_text(exc))
            try:
                await writer.close()  # releases the lock: the stream is not left held by a server not serving it
            except DlogError:
                pass
            return
        self._version = version
        world = self.world
        self.owned = OwnedStream(SERVED, writer, end, end, 1 << 20, table, world.replay_bytes_max, self._save)
        world.sim.history.record(f"server{self.server_id}", "served_take", end=end, replayed=replayed,
                                 producers=table.producer_count)

    def _save(self, owned: OwnedStream, data: bytes) -> None:
        self.world.spawn(self._store(owned, data))

    async def _store(self, owned: OwnedStream, data: bytes) -> None:
        stored = False
        try:
            if self.process is not None and self.process.alive and self.owned is owned and self._version is not None:
                self._version = await self.process.namespace.store.store_dedup_snapshot(SERVED, data, self._version)
                stored = True
        except DlogError:
            self._version = None  # another owner stored one: this one stops storing
        finally:
            owned.snapshot_saved(stored)

    def kill(self) -> Any:
        """The process dies; its session (what the caller expires later)."""
        process, self.process, self.owned = self.process, None, None
        self.generation += 1
        assert process is not None
        process.kill()
        return process.session.session


class SimProducer:
    def __init__(self, world: ServingWorld, number: int) -> None:
        self.world, self.number = world, number
        self.name = f"p{number}"
        self.sequence = 0
        self.acked = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        world, rng = self.world, self.world.rng
        while not self.stop.is_set():
            count = rng.randint(1, 5)
            values = [f"{self.name}-{self.sequence + index:06d}" for index in range(count)]
            records = [Record(1_700_000_000_000, None, value.encode()) for value in values]
            first, last = self.sequence, self.sequence + count - 1
            sends = 0
            while True:  # the same batch until it is answered
                sends += 1
                answer = await self._send(records, first, last)
                if answer is not None and answer[0] is ErrorCode.NONE and rng.random() >= LOST_REPLY_SHARE:
                    world.sim.history.record(self.name, "producer_ack", producer=self.name, sequence=first,
                                             values=values, offset=answer[1], sends=sends)
                    break
                if answer is not None and answer[0] not in (ErrorCode.NONE, ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                                            ErrorCode.REQUEST_TIMED_OUT):
                    world.sim.history.record(self.name, "producer_refused", producer=self.name, sequence=first,
                                             error=answer[0].name)
                await asyncio.sleep(rng.uniform(0.0, 0.05))
            self.sequence = last + 1
            self.acked += count
            await asyncio.sleep(rng.uniform(0.0, 0.05))

    async def _send(self, records: list[Record], first: int, last: int) -> tuple[ErrorCode, int] | None:
        """One attempt at the current owner: its answer, or None (no owner, no answer in time)."""
        world = self.world
        owners = [server for server in world.servers if server.owned is not None]
        if not owners:
            await asyncio.sleep(0.05)
            return None
        server = world.rng.choice(owners)
        owned = server.owned
        assert owned is not None
        if owned.check(records, f"kafka:{self.number}") is not None:
            return None
        try:
            async with asyncio.timeout(ANSWER_WAIT_S):
                return await owned.produce_idempotent(records, self.number, 0, first, last, lambda: None)
        except TimeoutError:
            return None  # a dead server, or a writer that ended: the outcome is unknown


class SimNamedWriter:
    """A named producer whose writer process is killed again and again; each new writer resends
    every batch the application has not seen acknowledged (the module docstring)."""

    def __init__(self, world: ServingWorld) -> None:
        self.world, self.name = world, "n1"
        self.rng = random.Random(f"named {world.sim.seed}")  # the servers' and producers' draws stay as they were
        self.enabled = self.rng.random() < NAMED_SHARE
        self.next_sequence = 0
        self.unacked: collections.deque[tuple[int, list[str], int]] = collections.deque()  # (first, values, sends)
        self.stop = asyncio.Event()
        self.kills = 0

    async def run(self) -> None:
        world, rng = self.world, self.rng
        while not (self.stop.is_set() and not self.unacked):
            process = await world.new_process()
            killer = None if self.stop.is_set() else world.sim.loop.call_later(rng.uniform(0.2, 2.0), process.kill)
            try:
                async with asyncio.timeout(ANSWER_WAIT_S * 5):
                    writer = await process.namespace.open_writer(NAMED, producer_id=self.name, takeover=True,
                                                                 lock_timeout_s=0.3)
                while process.alive and not (self.stop.is_set() and not self.unacked):
                    if not self.unacked:
                        count = rng.randint(1, 5)
                        values = [f"{self.name}-{self.next_sequence + index:06d}" for index in range(count)]
                        self.unacked.append((self.next_sequence, values, 0))
                        self.next_sequence += count
                    first, values, sends = self.unacked[0]
                    self.unacked[0] = (first, values, sends + 1)
                    async with asyncio.timeout(ANSWER_WAIT_S):
                        answer = await writer.write_batch([value.encode() for value in values], sequence=first)
                    if not self.stop.is_set() and rng.random() < NAMED_KILL_AFTER_ACK_SHARE:
                        break  # durable, but the application never hears of it: it resends it
                    world.sim.history.record(self.name, "named_ack", producer=self.name, sequence=first, values=values,
                                             offset=answer.first_position, sends=sends + 1)
                    self.unacked.popleft()
                    await asyncio.sleep(rng.uniform(0.0, 0.05))
                if process.alive and not self.unacked:
                    await writer.close()
                    return
            except SequenceError as exc:  # a resend refused: a bug (the checker reports it); not sent again
                world.sim.history.record(self.name, "producer_refused", producer=self.name,
                                         sequence=self.unacked.popleft()[0], error=error_text(exc))
            except (DlogError, TimeoutError):
                pass  # killed under a write, or the open failed: the next writer resends
            finally:
                if killer is not None:
                    killer.cancel()
            self.kills += 1
            world.sim.note("kill_named_writer", sends=sum(sends for _, _, sends in self.unacked))
            process.kill()
            await asyncio.sleep(rng.uniform(0.0, 0.2))


class ServingWorld:
    def __init__(self, sim: StreamSimulation) -> None:
        self.sim = sim
        self.rng = random.Random(f"serving {sim.seed}")
        self.enabled = self.rng.random() < SERVING_SHARE
        self.metadata = MemoryMetadata(clock=sim.clock)
        self.ledgers = SimLedgers(random.Random(f"serving ledgers {sim.seed}"), sim.loop)
        self.replay_bytes_max = self.rng.choice([200, 2_000, 1 << 20])
        self.servers = [SimServer(self, server_id) for server_id in (1, 2)]
        self.producers = [SimProducer(self, number) for number in range(1, self.rng.randint(2, 3) + 1)]
        self.named = SimNamedWriter(self)
        self.killing = True
        self.kills = 0
        self._tasks: list[asyncio.Task[Any]] = []

    async def new_process(self) -> Process:
        session, client = self.metadata.session(), self.ledgers.client()
        namespace = Namespace("simulated", "served", store=session, client=client, clock=self.sim.clock,
                              rng=self.rng.random)
        await namespace.start()
        return Process(namespace, session, client)

    def spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        task = self.sim.loop.create_task(coroutine)
        self._tasks.append(task)
        return task

    async def run(self) -> None:
        control = await self.new_process()
        await control.namespace.create_stream(SERVED, roll_records=self.rng.choice([0, 50, 200]))
        for server in self.servers:
            await server.start()
        for producer in self.producers:
            self.spawn(producer.run())
        if self.named.enabled:
            await control.namespace.create_stream(NAMED, roll_records=self.named.rng.choice([0, 7, 40]))
            self.spawn(self.named.run())
        while self.killing:
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))
            owners = [server for server in self.servers if server.owned is not None]
            if not self.killing or not owners:
                continue
            victim = self.rng.choice(owners)
            self.kills += 1
            self.sim.note("kill_server", server=victim.server_id)
            session = victim.kill()
            await asyncio.sleep(self.rng.uniform(0.3, 1.5))  # its ZooKeeper session times out
            self.metadata.expire(session)
            await victim.start()  # restarted: it may take the stream back later

    async def finish(self) -> None:
        """Stop killing and producing (each producer's last batch answered), then read the stream."""
        self.killing = False
        for producer in self.producers:
            producer.stop.set()
        self.named.stop.set()
        tasks = [task for task in self._tasks if task.get_coro().__qualname__.startswith(("SimProducer.run",
                                                                                          "SimNamedWriter.run"))]
        _, pending = await asyncio.wait(tasks, timeout=FINISH_S_MAX) if tasks else (set(), set())
        history = self.sim.history
        for task in pending:
            history.record("serving", "liveness", "fail", what="a producer's batch was not answered within "
                                                                  f"{FINISH_S_MAX} s of the heal")
            task.cancel()
        reader_process = await self.new_process()
        for stream, fact in ((SERVED, "served_final"), (NAMED, "named_final"))[:2 if self.named.enabled else 1]:
            try:
                records = []
                async with await reader_process.namespace.open_reader(stream, "earliest", follow=False) as reader:
                    async for record in reader:
                        records.append([record.position, (record.value or b"").decode()])
                history.record("serving", fact, "ok", records=records, kills=self.kills)
            except DlogError as exc:
                history.record("serving", fact, "fail", error=error_text(exc))

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
