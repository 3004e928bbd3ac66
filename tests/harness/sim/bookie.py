"""A simulated bookie process: the real `BookieServer`, `ClientConnection` and `BookieCore`.

Its disk is `disk.py`'s: the in-memory journal (durable once fsynced, a torn tail at a power loss)
and write-cache storage. Life cycle, as the faults drive it:
- crash (power loss): the journal keeps what was fsynced and a random prefix of the group being
  fsynced; every connection resets; a restart builds a new core, server and storage and replays
  the durable records through the core's own `replay_record`;
- hang: the process stops: what arrives waits, nothing is fsynced or written until it resumes (its
  timers, of idle connections and long polls, run on: a hang lasts at most 1.2 s, well below them);
- wipe: the disk is lost for good (the real cookie check refuses to start on an empty disk, so it
  never rejoins under its old id with fewer entries than metadata says; the plant
  `wiped-bookie-rejoins` lets it).
What the checker learns from a bookie is read at the core's edges: an entry the core stored (the
storage port is called) while handling a plain add is "accepted" (A7 counts them after fencing),
and an add record whose group fsync returned is "durable" (A2 compares it with the ack).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from bookkeeper.bookie.adds import journaled_entries
from bookkeeper.bookie.bookie import BookieCore
from bookkeeper.bookie.connection import ClientConnection
from bookkeeper.bookie.limits import ServerLimits
from bookkeeper.bookie.server import BookieServer
from bookkeeper.protocol.batch import AddBatchRequest, ReadRangeRequest
from bookkeeper.protocol.entry import ENTRY_HEADER, ENTRY_HEADER_BYTES
from bookkeeper.protocol.wire import (
    AddRequest,
    BookieInfoResponse,
    BookieState,
    ReadRequest,
    WriteLacRequest,
)
from tests.harness.streamsim.loop import SimulatedClock

from .disk import MemoryJournal, MemoryStorage

if TYPE_CHECKING:
    from .transport import Link
    from .world import World


class BookieRecorder(Protocol):
    """What the checker learns from bookies (the simulation's history implements it)."""

    def add_accepted(self, bookie: str, entry_id: int, recovery: bool, now_ms: float) -> None: ...

    def add_durable(self, bookie: str, entry_id: int, now_ms: float) -> None: ...


class BookieProcess:
    def __init__(self, bookie_id: str, world: World, recorder: BookieRecorder, ledger_id: int) -> None:
        self.bookie_id = bookie_id
        self.world = world
        self.recorder = recorder
        self.ledger_id = ledger_id  # the simulated ledger, whose entries the checker follows
        self.status = "up"  # up | hung | crashed | wiped
        self.generation = 0  # one per process run: a connection belongs to one
        self.journal = MemoryJournal(world.loop, world.rng, self._durable)
        self.damaged: set[int] = set()  # entries of the ledger damaged on disk (survive restarts)
        self.durable_entries: set[int] = set()  # entries of the ledger on disk (fsynced)
        self._handling: Any = None  # the add request the core is handling now
        self._links: list[Link] = []
        self._inbox: list[tuple[Link, bytes]] = []  # arrived while hung
        self._outbox: list[tuple[Link, bytes]] = []  # written while hung
        self._start()

    def _start(self) -> None:
        self.storage = MemoryStorage(self._stored)
        self.core = BookieCore(self.journal, self.storage)  # type: ignore[arg-type]
        for record in self.journal.durable:  # replay (the storage records nothing while it runs)
            self.core.replay_record(record)
        for entry_id in sorted(self.damaged):
            self.storage.damage(self.ledger_id, entry_id)
        self.server = BookieServer(self.core, ServerLimits(), self._info, clock=SimulatedClock(self.world.loop))
        handlers = self.server.handlers
        for kind in (AddRequest, AddBatchRequest, ReadRequest, ReadRangeRequest, WriteLacRequest):
            handlers[kind] = self._watched(kind, handlers[kind])
        self._links = []

    def _info(self) -> BookieInfoResponse:
        return BookieInfoResponse(0, 2**40, 2**40, BookieState.WRITABLE, self.bookie_id)

    # ------------------------------------------------------------------ what the checker sees

    def _watched(self, kind: type, handler: Any) -> Any:
        world, bookie_id = self.world, self.bookie_id

        def handle(request: Any, reply: ClientConnection, *rest: Any) -> None:
            world.log(bookie_id, "<-", reply.peer.rpartition(":")[0], _describe(request))
            if kind is AddBatchRequest:
                world.stats["ADD_BATCH frames"] += 1
            elif kind is ReadRangeRequest:
                world.stats["READ_RANGE requests"] += 1
            elif kind is WriteLacRequest:
                world.stats["explicit LAC writes"] += 1
            self._handling = request if kind in (AddRequest, AddBatchRequest) else None
            try:
                handler(request, reply, *rest)
            finally:
                self._handling = None

        return handle

    def _stored(self, ledger_id: int, entries: list[tuple[int, bytes]]) -> None:
        request = self._handling
        if request is None or ledger_id != self.ledger_id:
            return  # replay, or another ledger
        recovery = _recovery_of(request, entries[0][1])
        now_ms = self.world.now_ms
        for entry_id, _ in entries:
            if recovery:
                self.world.stats["write-back adds"] += 1
            self.recorder.add_accepted(self.bookie_id, entry_id, recovery, now_ms)

    def _durable(self, records: list[bytes]) -> None:
        now_ms = self.world.now_ms
        for record in records:
            added = journaled_entries(record)
            if added is not None and added[0] == self.ledger_id:
                for entry_id, _ in added[1]:
                    self.durable_entries.add(entry_id)
                    self.damaged.discard(entry_id)  # written again: the new copy is on disk
                    self.recorder.add_durable(self.bookie_id, entry_id, now_ms)

    # ------------------------------------------------------------------ connections

    @property
    def accepting(self) -> bool:
        return self.status in ("up", "hung")

    @property
    def registered(self) -> bool:
        """Listed as writable in the metadata store (a hung process keeps its session a while)."""
        return self.status in ("up", "hung")

    def accept(self, link: Link) -> None:
        connection = ClientConnection(self.server, (link.client, 0))
        self.server.admit(connection)
        link.bookie_end.protocol = connection
        connection.connection_made(link.bookie_end)
        self._links.append(link)

    def serves(self, link: Link) -> bool:
        return self.status == "up" and link.generation == self.generation

    def deliver(self, link: Link, data: bytes) -> None:
        if link.generation != self.generation or not self.accepting:
            link.reset()  # a connection this process never had: the kernel answers with a reset
        elif self.status == "hung":
            self._inbox.append((link, data))
        else:
            link.bookie_end.receive(data)

    def hold_output(self, link: Link, data: bytes) -> None:
        if link.generation == self.generation and self.status == "hung":
            self._outbox.append((link, data))

    # ------------------------------------------------------------------ life cycle (faults)

    def crash(self, kept: int | None = None) -> None:
        """Power loss: of the group being fsynced, a random prefix (or `kept` records) survives."""
        kept, unsynced = self.journal.power_loss(kept)
        self.world.log(self.bookie_id, "crash", f"kept {kept}/{unsynced} unsynced records")
        self._reset("crashed")

    def restart(self) -> None:
        if self.status != "crashed":
            return
        self.status = "up"
        self._start()
        self.world.log(self.bookie_id, "restart", f"replayed {len(self.journal.durable)} records")

    def wipe(self, *, rejoin: bool = False) -> None:
        """Lose the disk. `rejoin` restarts it empty under its old id, which the real cookie check
        forbids: only for showing what that check protects."""
        self.journal.wipe()
        self.damaged.clear()
        self.durable_entries.clear()
        self._reset("crashed" if rejoin else "wiped")

    def hang(self) -> None:
        if self.status == "up":
            self.status = "hung"
            self.journal.pause()

    def resume(self) -> None:
        if self.status != "hung":
            return
        self.status = "up"
        self.world.log(self.bookie_id, "resume", f"{len(self._inbox)} writes waited")
        self.journal.resume()
        outbox, self._outbox = self._outbox, []
        for link, data in outbox:
            link.carry(link.bookie_end, data)
        inbox, self._inbox = self._inbox, []
        for link, data in inbox:  # in arrival order, each as its own event (as a socket read)
            self.world.loop.call_soon(self.deliver, link, data)

    def damage(self, entry_id: int) -> None:
        """A bit flips in an entry on disk: reading it fails its checksum from now on, across
        restarts, until a write of it is fsynced again."""
        self.damaged.add(entry_id)
        self.storage.damage(self.ledger_id, entry_id)

    def damageable_entry_ids(self) -> list[int]:
        """Entries of the ledger on disk and in storage (this process replayed or stored them)."""
        return sorted(self.durable_entries.intersection(self.storage.entry_ids(self.ledger_id)))

    def _reset(self, status: str) -> None:
        self.status = status
        self.generation += 1
        self._inbox, self._outbox = [], []
        links, self._links = self._links, []
        for link in links:  # every open connection resets: its clients fail what they had pending
            link.reset()


def _recovery_of(request: Any, first_entry: bytes) -> bool:
    if isinstance(request, AddRequest):
        return request.recovery
    for group in request.groups:
        if first_entry in group.entries:
            return bool(group.recovery)
    return False


def _describe(request: Any) -> str:
    kind = type(request).__name__.removesuffix("Request")
    if isinstance(request, AddBatchRequest):
        ids = [entry_id for group in request.groups for entry_id in _entry_ids(group.entries)]
        recovery = " recovery" if any(group.recovery for group in request.groups) else ""
        return f"ADD_BATCH {_span(ids)}{recovery}"
    if isinstance(request, AddRequest):
        return f"ADD e{request.entry_id}{' recovery' if request.recovery else ''}"
    if isinstance(request, ReadRangeRequest):
        fence = " fence" if request.fence else ""
        return f"READ_RANGE e{request.first_entry_id}..{request.last_entry_id}/{request.stride}{fence}"
    if isinstance(request, ReadRequest):
        return f"READ e{request.entry_id}{' fence' if request.fence else ''}"
    if isinstance(request, WriteLacRequest):
        return f"WRITE_LAC {request.lac}"
    return kind


def _entry_ids(entries: tuple[bytes, ...]) -> list[int]:
    return [ENTRY_HEADER.unpack_from(entry)[1] for entry in entries if len(entry) >= ENTRY_HEADER_BYTES]


def _span(ids: list[int]) -> str:
    if not ids:
        return "-"
    return f"e{ids[0]}" if len(ids) == 1 else f"e{ids[0]}..e{ids[-1]} ({len(ids)})"
