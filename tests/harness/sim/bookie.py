"""A simulated bookie that answers like `bookkeeper/bookie/bookie.py`, with a journal that can lose its tail.

Same rules as the real request logic:
- an add checks the header against the request, the master key, and the fence (a recovery add
  passes a fence); an entry id already stored with other bytes is ENTRY_EXISTS; the piggybacked LAC
  raises the bookie's LAC; the answer goes out only once the journal record is fsynced (A2);
- a read of an unknown ledger is NO_LEDGER, of a missing entry NO_ENTRY; entry -1 asks only for the
  LAC; a fencing read checks the key, and of an unknown ledger creates it fenced; the first fence
  is answered only after its journal record is durable (A11);
- an explicit LAC is kept if higher, journaled, and raises the LAC;
- after a restart the LAC is max(explicit LAC, LAC carried by the highest stored entry).

Memory is what the bookie serves; `durable` is what the fsynced journal would replay. A crash keeps
a random prefix of the records written but not yet fsynced (never answered, so nobody relied on
them) and drops the rest. A wiped bookie is gone for good: the real bookie's cookie check refuses to
start on an empty disk, so it never rejoins under its old id with fewer entries than metadata says.

One difference is a switch: the real bookie answers a fencing read of a ledger already fenced *in
memory* at once, even while that fence's journal record is not yet fsynced, so after a power loss
a recoverer may count a fence that is gone (A11). `fence_answer_waits_for_journal` (default on)
makes such an answer wait until the fence is durable; off reproduces the real bookie (see
`test_simulation.py`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bookkeeper.errors import (
    BadRequestError,
    BookieUnavailableError,
    DlogError,
    EntryExistsError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bookkeeper.protocol.entry import ENTRY_HEADER, ENTRY_HEADER_BYTES

if TYPE_CHECKING:
    from .world import Network, World

FSYNC_MS_MIN = 1
FSYNC_MS_MAX = 4


@dataclass(frozen=True, slots=True)
class Request:
    client: str
    request_id: int
    kind: str  # "add" | "read" | "write_lac" | "add_batch" | "read_range"
    ledger_id: int
    entry_id: int = -1  # read_range: the first entry id
    packed_entry: bytes = b""
    master_key: bytes = b""
    recovery: bool = False
    fence: bool = False
    lac: int = -1
    entries: tuple[tuple[int, bytes], ...] = ()  # add_batch: (entry id, packed entry)
    last_entry_id: int = -1  # read_range
    stride: int = 1  # read_range

    def label(self) -> str:
        flags = "".join(flag for flag, on in ((" fence", self.fence), (" recovery", self.recovery)) if on)
        return f"{self.kind} e{self.entry_id}{flags} #{self.request_id}"


@dataclass(frozen=True, slots=True)
class Response:
    request_id: int
    bookie: str
    error: DlogError | None = None
    lac: int = -1
    packed_entry: bytes = b""
    errors: tuple[tuple[int, DlogError], ...] = ()  # add_batch: (position, error) of refused entries
    entries: tuple[tuple[int, bytes], ...] = ()  # read_range: (entry id, packed entry) held
    covered_last_entry_id: int = -1  # read_range

    def label(self) -> str:
        outcome = type(self.error).__name__ if self.error is not None else f"ok lac {self.lac}"
        return f"answer #{self.request_id} {outcome}"


@dataclass(slots=True)
class _Ledger:
    master_key: bytes
    fenced: bool = False
    explicit_lac: int = -1
    lac: int = -1
    entries: dict[int, bytes] = field(default_factory=dict)


class BookieRecorder:
    """What the checker learns from bookies (the simulation's history implements it)."""

    def add_accepted(self, bookie: str, entry_id: int, recovery: bool, now_ms: int) -> None: ...

    def add_durable(self, bookie: str, entry_id: int, now_ms: int) -> None: ...


class SimBookie:
    def __init__(self, bookie_id: str, world: World, network: Network, recorder: BookieRecorder,
                 clients: Callable[[], dict[str, Any]], *,
                 fence_answer_waits_for_journal: bool = True) -> None:
        self.bookie_id = bookie_id
        self.world = world
        self.network = network
        self.recorder = recorder
        self.clients = clients  # name -> client (with on_response / on_disconnect), all of them
        self.fence_answer_waits_for_journal = fence_answer_waits_for_journal
        self.status = "up"  # up | hung | crashed | wiped
        self._memory: dict[int, _Ledger] = {}
        self._durable: dict[int, _Ledger] = {}
        self._journal: list[tuple[tuple[Any, ...], Request | None, Response | None]] = []
        self._sync_scheduled = False
        self._generation = 0
        self._inbox: list[Request] = []

    # ------------------------------------------------------------------ life cycle (faults)

    @property
    def registered(self) -> bool:
        """Listed as writable in the metadata store (a hung process keeps its session a while)."""
        return self.status in ("up", "hung")

    def crash(self, kept: int | None = None) -> None:
        """Power loss: of the records not yet fsynced, a random prefix (or `kept` of them) survive."""
        if kept is None:
            kept = self.world.rng.randint(0, len(self._journal))  # a torn tail, never answered
        for record, _, _ in self._journal[:kept]:
            self._apply(self._durable, record)
        self.world.log(self.bookie_id, "crash", f"kept {kept}/{len(self._journal)} unsynced records")
        self._reset("crashed")

    def restart(self) -> None:
        if self.status != "crashed":
            return
        self.status = "up"
        self._memory = copy.deepcopy(self._durable)
        for ledger in self._memory.values():
            ledger.lac = max(ledger.explicit_lac, self._stored_lac(ledger))
        self.world.log(self.bookie_id, "restart")

    def wipe(self, *, rejoin: bool = False) -> None:
        """Lose the disk. `rejoin` restarts it empty under its old id, which the real cookie check
        forbids: only for showing what that check protects."""
        self._durable = {}
        self._reset("crashed" if rejoin else "wiped")

    def hang(self) -> None:
        if self.status == "up":
            self.status = "hung"

    def resume(self) -> None:
        if self.status != "hung":
            return
        self.status = "up"
        self.world.log(self.bookie_id, "resume", f"{len(self._inbox)} queued requests")
        inbox, self._inbox = self._inbox, []
        for request in inbox:
            self._handle(request)

    def _reset(self, status: str) -> None:
        self.status = status
        self._generation += 1  # fsyncs scheduled before this never happen
        self._journal = []
        self._sync_scheduled = False
        self._memory = {}
        self._inbox = []
        # every open connection to this bookie resets: its clients fail what they had pending
        for name, client in sorted(self.clients().items()):
            self.network.send(self.bookie_id, name, client.on_disconnect, self.bookie_id)

    @staticmethod
    def _stored_lac(ledger: _Ledger) -> int:
        if not ledger.entries:
            return -1
        packed_entry = ledger.entries[max(ledger.entries)]
        return ENTRY_HEADER.unpack_from(packed_entry)[2] if len(packed_entry) >= ENTRY_HEADER_BYTES else -1

    # ------------------------------------------------------------------ requests

    def receive(self, request: Request) -> None:
        if self.status in ("crashed", "wiped"):
            self._reply(request, BookieUnavailableError(f"bookie {self.bookie_id} refused the connection"))
        elif self.status == "hung":
            self._inbox.append(request)
        else:
            self._handle(request)

    def _handle(self, request: Request) -> None:
        if request.kind == "add":
            self._on_add(request)
        elif request.kind == "add_batch":
            self._on_add_batch(request)
        elif request.kind in ("read", "read_range"):
            self._on_read(request)
        else:
            self._on_write_lac(request)

    def _on_add(self, request: Request) -> None:
        accepted = self._accept(request, request.entry_id, request.packed_entry)
        if isinstance(accepted, DlogError):
            return self._reply(request, accepted)
        self._journal_append(accepted, request, Response(request.request_id, self.bookie_id))
        return None

    def _on_add_batch(self, request: Request) -> None:
        """An ADD_BATCH (bookkeeper/bookie/batching.py): each entry checked as one add, the accepted
        ones journaled, ONE answer (listing the refused) after the fsync that covers them all."""
        records, errors = [], []
        for position, (entry_id, packed_entry) in enumerate(request.entries):
            accepted = self._accept(request, entry_id, packed_entry)
            if isinstance(accepted, DlogError):
                errors.append((position, accepted))
            else:
                records.append(accepted)
        answer = Response(request.request_id, self.bookie_id, errors=tuple(errors))
        if not records:
            return self._send(request, answer)
        for record in records[:-1]:
            self._journal_append(record, None, None)
        self._journal_append(records[-1], request, answer)
        return None

    def _accept(self, request: Request, entry_id: int, packed_entry: bytes) -> tuple[Any, ...] | DlogError:
        """The checks of one add; stores an accepted entry and returns its journal record."""
        if len(packed_entry) < ENTRY_HEADER_BYTES:
            return BadRequestError("entry shorter than its header")
        ledger_id, header_entry_id, lac, _, _ = ENTRY_HEADER.unpack_from(packed_entry)
        if (ledger_id, header_entry_id) != (request.ledger_id, entry_id) or lac >= header_entry_id:
            return BadRequestError(f"bad header {ledger_id}:{header_entry_id} lac {lac}")
        ledger = self._memory.get(ledger_id)
        if ledger is None:
            ledger = self._create(ledger_id, request.master_key)
        elif ledger.master_key != request.master_key:
            return UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        elif ledger.fenced and not request.recovery:
            return LedgerFencedError(f"ledger {ledger_id} is fenced")
        stored = ledger.entries.get(entry_id)
        if stored is not None and stored != packed_entry:
            return EntryExistsError(f"entry {ledger_id}:{entry_id} differs")
        self.recorder.add_accepted(self.bookie_id, entry_id, request.recovery, self.world.now_ms)
        ledger.entries[entry_id] = packed_entry
        ledger.lac = max(ledger.lac, lac)
        return ("add", ledger_id, entry_id, packed_entry)

    def _on_read(self, request: Request) -> None:
        ledger = self._memory.get(request.ledger_id)
        if ledger is None and request.fence:
            # a fence must hold even where the writer's adds have not arrived yet
            ledger = self._create(request.ledger_id, request.master_key)
        if ledger is None:
            return self._reply(request, NoSuchLedgerError(f"no ledger {request.ledger_id}"))
        if request.fence:
            if ledger.master_key != request.master_key:
                return self._reply(request, UnauthorizedError(f"wrong key for ledger {request.ledger_id}"))
            if not ledger.fenced:
                ledger.fenced = True
                self._journal_append(("fence", request.ledger_id), request, None)
                return None
            if self.fence_answer_waits_for_journal and not self._fence_durable(request.ledger_id):
                self._journal_append(("noop",), request, None)  # answered once the fence is synced
                return None
        return self._answer_read(request)

    def _fence_durable(self, ledger_id: int) -> bool:
        durable = self._durable.get(ledger_id)
        return durable is not None and durable.fenced

    def _answer_read(self, request: Request) -> None:
        ledger = self._memory.get(request.ledger_id)
        if ledger is None:  # crashed in between; the client saw the disconnect
            return
        if request.kind == "read_range":
            return self._answer_range(request, ledger)
        if request.entry_id < 0:
            return self._reply(request, None, ledger.lac)
        packed_entry = ledger.entries.get(request.entry_id)
        if packed_entry is None:
            return self._reply(request, NoSuchEntryError(f"no entry {request.ledger_id}:{request.entry_id}"))
        return self._reply(request, None, ledger.lac, packed_entry)

    def _answer_range(self, request: Request, ledger: _Ledger) -> None:
        """A READ_RANGE: the entries of the stride held here; a byte limit is played by covering
        only part of the range now and then, so the client asks again for the rest."""
        wanted = range(request.entry_id, request.last_entry_id + 1, request.stride)
        covered = request.last_entry_id
        if len(wanted) > 1 and self.world.rng.random() < 0.2:
            covered = self.world.rng.choice(wanted[:-1])
        held = tuple((entry_id, ledger.entries[entry_id]) for entry_id in wanted
                     if entry_id <= covered and entry_id in ledger.entries)
        self._send(request, Response(request.request_id, self.bookie_id, lac=ledger.lac, entries=held,
                                     covered_last_entry_id=covered))

    def _on_write_lac(self, request: Request) -> None:
        ledger = self._memory.get(request.ledger_id)
        if ledger is None:
            return self._reply(request, NoSuchLedgerError(f"no ledger {request.ledger_id}"))
        if ledger.master_key != request.master_key:
            return self._reply(request, UnauthorizedError(f"wrong master key for ledger {request.ledger_id}"))
        ledger.explicit_lac = max(ledger.explicit_lac, request.lac)
        self._journal_append(("lac", request.ledger_id, request.lac), request,
                             Response(request.request_id, self.bookie_id))
        ledger.lac = max(ledger.lac, request.lac)
        return None

    def _create(self, ledger_id: int, master_key: bytes) -> _Ledger:
        ledger = _Ledger(master_key)
        self._memory[ledger_id] = ledger
        self._journal_append(("key", ledger_id, master_key), None, None)
        return ledger

    # ------------------------------------------------------------------ journal

    def _journal_append(self, record: tuple[Any, ...], request: Request | None,
                        response: Response | None) -> None:
        self._journal.append((record, request, response))
        if not self._sync_scheduled:
            self._sync_scheduled = True
            self.world.after(self.world.rng.randint(FSYNC_MS_MIN, FSYNC_MS_MAX), self._fsync,
                             self._generation)

    def _fsync(self, generation: int) -> None:
        if generation != self._generation:
            return
        if self.status == "hung":  # a stopped process does not sync either
            self.world.after(FSYNC_MS_MAX, self._fsync, generation)
            return
        batch, self._journal = self._journal, []
        self._sync_scheduled = False
        for record, _, _ in batch:
            self._apply(self._durable, record)
            if record[0] == "add":
                self.recorder.add_durable(self.bookie_id, record[2], self.world.now_ms)
        for record, request, response in batch:
            if request is None:
                continue
            if response is not None:
                self._send(request, response)
            else:  # a fencing read: answer it now that the fence is durable
                self._answer_read(request)

    @staticmethod
    def _apply(ledgers: dict[int, _Ledger], record: tuple[Any, ...]) -> None:
        kind = record[0]
        if kind == "noop":
            return
        ledger_id = record[1]
        if kind == "key":
            ledgers.setdefault(ledger_id, _Ledger(record[2]))
            return
        ledger = ledgers.get(ledger_id)
        if ledger is None:
            return
        if kind == "add":
            ledger.entries[record[2]] = record[3]
        elif kind == "fence":
            ledger.fenced = True
        elif kind == "lac":
            ledger.explicit_lac = max(ledger.explicit_lac, record[2])

    # ------------------------------------------------------------------ answers

    def _reply(self, request: Request, error: DlogError | None, lac: int = -1, packed_entry: bytes = b"") -> None:
        self._send(request, Response(request.request_id, self.bookie_id, error, lac, packed_entry))

    def _send(self, request: Request, response: Response) -> None:
        client = self.clients().get(request.client)
        if client is not None:
            self.network.send(self.bookie_id, request.client, client.on_response, response)

    def stored_entries(self, ledger_id: int) -> dict[int, bytes]:
        ledger = self._memory.get(ledger_id)
        return dict(ledger.entries) if ledger is not None else {}
