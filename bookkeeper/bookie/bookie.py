"""The bookie's request logic: validation, fencing, LAC tracking, long polls, journal records.

Theory of operation. Every mutation (an entry, a ledger's master key, a fence, an explicit LAC)
is first appended to the journal as one record; its answer goes out only from the journal's
callback, which runs after the fdatasync that covers the record (A2, A11). The entry is put into
ledger storage's write cache at once, so reads see it; readers never go past the LAC, and the LAC
only covers entries the writer saw acknowledged, so exposing an entry before its fsync returns
cannot make anyone rely on it.

A ledger that garbage collection dropped (its metadata was deleted) is remembered, the last
DELETED_LEDGERS_REMEMBERED_MAX of them, until a restart: a later ADD or fencing READ of it is
refused with NO_LEDGER instead of creating it afresh, so the writer of a ledger deleted under it
learns at its next add, not never.

The rules of ADD and ADD_BATCH are adds.py's, those of READ_RANGE batching.py's (mixed in: they
see the core as `CoreParts`, ports.py, and never import it). The journal and ledger storage are
ports (`JournalPort`, `StoragePort`, ports.py): journal.py and storage.py on a bookie, in-memory
ones with the same fsync and loss rules in the ledger simulator.

All methods run on the event-loop thread. Answers are delivered through a `Reply` (the
connection): `send(bytes)` queues a frame, and the connection writes everything queued in one
loop iteration with one system call, so one group commit becomes one write per connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import struct

import crc32c

from bookkeeper.bookie.adds import AddHandlers, journaled_entries
from bookkeeper.bookie.batching import BatchHandlers
from bookkeeper.bookie.ports import JournalPort, LedgerState, Reply, StoragePort, Waiter
from bookkeeper.bookie.storage import LedgerData
from bookkeeper.errors import BookieIOError, known
from bookkeeper.protocol import wire
from bookkeeper.protocol.batch import ReadRangeRequest
from bookkeeper.protocol.entry import DIGEST_BYTES, ENTRY_HEADER, ENTRY_HEADER_BYTES, DigestType
from bookkeeper.protocol.wire import (
    CheckEntriesRequest,
    CheckEntriesResponse,
    EntryCheck,
    ErrorResponse,
    OpCode,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Status,
    WriteLacRequest,
    WriteLacResponse,
    encode_response,
)

# journal record types (first byte of every record); those of adds are in adds.py (1, 5)
RECORD_KEY = 2  # ledger_id, master key: the ledger's first appearance on this bookie
RECORD_FENCE = 3  # ledger_id
RECORD_LAC = 4  # ledger_id, explicit lac
_KEY_RECORD = struct.Struct(f">Bq{wire.MASTER_KEY_BYTES}s")
_FENCE_RECORD = struct.Struct(">Bq")
_LAC_RECORD = struct.Struct(">Bqq")
log = logging.getLogger(__name__)
DELETED_LEDGERS_REMEMBERED_MAX = 10_000  # ledgers garbage collection dropped, refused afterwards


class BookieCore(AddHandlers, BatchHandlers):
    def __init__(self, journal: JournalPort, storage: StoragePort, *, long_poll_waiters_max: int = 10000,
                 long_poll_timeout_ms_max: int = 60_000) -> None:
        self.journal = journal
        self.storage = storage
        self.read_only = False
        self.read_only_reason = ""
        self.long_poll_waiters_max = long_poll_waiters_max
        self.long_poll_timeout_ms_max = long_poll_timeout_ms_max
        self._ledgers: dict[int, LedgerState] = {}
        self._deleted: dict[int, None] = {}  # collected ledgers, oldest first (insertion order)
        self._waiter_count = 0
        # each reply's parked long polls, so a closed connection's are dropped at once (S4)
        self._waiters_of: dict[Reply, dict[Waiter, int]] = {}
        # plain counters on the hot path; the metrics collector reads them when scraped
        self.add_count = 0
        self.add_bytes = 0
        self.read_count = 0
        self.read_bytes = 0
        self.fence_count = 0
        self.dropped_waiters = 0
        self.check_count = 0
        self.deleted_refusals = 0

    # ------------------------------------------------------------------ start-up

    def replay_record(self, record: bytes) -> None:
        """Apply one journal record during replay (before any request is served)."""
        kind = record[0]
        added = journaled_entries(record)
        if added is not None:
            self.storage.add_entries(*added)
        elif kind == RECORD_KEY:
            _, ledger_id, master_key = _KEY_RECORD.unpack(record)
            if self.storage.get_state(ledger_id) is None:
                self.storage.put_state(ledger_id, LedgerData(master_key))
        elif kind == RECORD_FENCE:
            _, ledger_id = _FENCE_RECORD.unpack(record)
            state = self.storage.get_state(ledger_id)
            if state is not None and not state.fenced:
                self.storage.put_state(ledger_id, _replace(state, fenced=True))
        elif kind == RECORD_LAC:
            _, ledger_id, lac = _LAC_RECORD.unpack(record)
            state = self.storage.get_state(ledger_id)
            if state is not None and lac > state.explicit_lac:
                self.storage.put_state(ledger_id, _replace(state, explicit_lac=lac))
        else:
            raise BookieIOError(f"journal record of unknown type {kind}")

    # ------------------------------------------------------------------ ledger lookup

    def has_ledger(self, ledger_id: int) -> bool:
        """Whether this bookie stores anything of the ledger (it was created here before)."""
        return ledger_id in self._ledgers or self.storage.get_state(ledger_id) is not None

    def _ledger(self, ledger_id: int) -> LedgerState | None:
        ledger = self._ledgers.get(ledger_id)
        if ledger is not None:
            return ledger
        state = self.storage.get_state(ledger_id)
        if state is None:
            return None
        ledger = LedgerState(state.master_key, state.fenced, state.explicit_lac,
                         max(state.explicit_lac, self._stored_lac(ledger_id)))
        self._ledgers[ledger_id] = ledger
        return ledger

    def _stored_lac(self, ledger_id: int) -> int:
        """The LAC piggybacked on the highest stored entry (after a restart)."""
        last_entry_id = self.storage.last_entry_id(ledger_id)
        if last_entry_id < 0:
            return -1
        try:
            packed = self.storage.get_entry(ledger_id, last_entry_id)
        except BookieIOError as exc:
            # the LAC is advisory: a damaged last entry answers IO_ERROR when it is read, but must
            # not fail every other request of the connection that asked about its ledger
            log.warning("ledger %d: cannot read entry %d for its LAC: %s", ledger_id, last_entry_id, exc)
            return -1
        if packed is None or len(packed) < ENTRY_HEADER_BYTES:
            return -1
        return ENTRY_HEADER.unpack_from(packed)[2]

    def forget_ledger(self, ledger_id: int) -> None:
        """Garbage collection removed the ledger: drop it, fail its long polls, and refuse adds to
        it from now on."""
        self._deleted[ledger_id] = None
        if len(self._deleted) > DELETED_LEDGERS_REMEMBERED_MAX:
            self._deleted.pop(next(iter(self._deleted)))
        ledger = self._ledgers.pop(ledger_id, None)
        if ledger is not None:
            for waiter in ledger.waiters:
                self._finish_waiter(waiter, ledger_id, None)
            ledger.waiters.clear()

    def deleted_refusal(self, ledger_id: int) -> tuple[Status, str] | None:
        """NO_LEDGER for a request that would create a ledger garbage collection dropped."""
        if ledger_id not in self._deleted:
            return None
        self.deleted_refusals += 1
        return Status.NO_LEDGER, (f"ledger {ledger_id} was deleted (its metadata is gone and garbage "
                                  "collection dropped it here): it takes no more adds")

    @property
    def deleted_remembered(self) -> int:
        return len(self._deleted)

    def ledger_summary(self, ledger_id: int) -> dict[str, int | bool] | None:
        ledger = self._ledger(ledger_id)
        if ledger is None:
            return None
        return {"ledger_id": ledger_id, "fenced": ledger.fenced, "lac": ledger.lac,
                "last_entry_id": self.storage.last_entry_id(ledger_id)}

    def _create_ledger(self, ledger_id: int, master_key: bytes) -> LedgerState:
        self.storage.put_state(ledger_id, LedgerData(master_key))
        self.journal.append(_KEY_RECORD.pack(RECORD_KEY, ledger_id, master_key), _ignore, None)
        ledger = LedgerState(master_key, False, -1, -1)
        self._ledgers[ledger_id] = ledger
        return ledger

    # ------------------------------------------------------------------ LAC and long polls

    def on_write_lac(self, request: WriteLacRequest, reply: Reply) -> None:
        ledger = self._ledger(request.ledger_id)
        if ledger is None:
            self._fail(reply, request.request_id, OpCode.WRITE_LAC, Status.NO_LEDGER,
                       f"no ledger {request.ledger_id} on this bookie")
            return
        if ledger.master_key != request.master_key:
            self._fail(reply, request.request_id, OpCode.WRITE_LAC, Status.UNAUTHORIZED,
                       f"wrong master key for ledger {request.ledger_id}")
            return
        if request.lac > ledger.explicit_lac:
            ledger.explicit_lac = request.lac
            state = known(self.storage.get_state(request.ledger_id), "a known ledger has a stored state")
            self.storage.put_state(request.ledger_id, _replace(state, explicit_lac=request.lac))
            # journaled lazily and answered at once: an explicit LAC is advisory (it only makes entries
            # the writer already saw acknowledged visible to readers sooner; recovery never relies on
            # it), so it must not cost an fsync of its own: it rides with the next group, where it
            # once took one per write of an idle writer, and the writer's next add waited behind it
            self.journal.append_lazy(_LAC_RECORD.pack(RECORD_LAC, request.ledger_id, request.lac))
        reply.send(encode_response(WriteLacResponse(request.request_id, request.ledger_id)))
        reply.request_done()
        if request.lac > ledger.lac:
            self._advance_lac(request.ledger_id, ledger, request.lac)

    def _advance_lac(self, ledger_id: int, ledger: LedgerState, lac: int) -> None:
        ledger.lac = lac
        if not ledger.waiters:
            return
        still_waiting = []
        for waiter in ledger.waiters:
            if lac > waiter.previous_lac:
                self._finish_waiter(waiter, ledger_id, ledger)
            else:
                still_waiting.append(waiter)
        ledger.waiters = still_waiting

    def _finish_waiter(self, waiter: Waiter, ledger_id: int, ledger: LedgerState | None) -> None:
        if waiter.timer is not None:
            waiter.timer.cancel()
        self._waiter_count -= 1
        self._unindex_waiter(waiter)
        if ledger is None:
            self._fail(waiter.reply, waiter.request_id, waiter.opcode, Status.NO_LEDGER,
                       f"ledger {ledger_id} was deleted")
            return
        waiter.reply.send(self._lac_answer(waiter.opcode, waiter.request_id, ledger_id,
                                           waiter.entry_id, ledger.lac))
        waiter.reply.request_done()

    def _lac_answer(self, opcode: int, request_id: int, ledger_id: int, entry_id: int,
                    lac: int) -> bytes:
        if opcode == OpCode.READ_LAC:
            return encode_response(ReadLacResponse(request_id, ledger_id, lac))
        return encode_response(ReadResponse(request_id, ledger_id, entry_id, lac,
                                            self._polled_entry(ledger_id, entry_id, lac)))

    def _polled_entry(self, ledger_id: int, entry_id: int, lac: int) -> bytes:
        """The entry a long poll asked for, if this bookie holds it intact; else none. Its answer
        is the LAC: an entry outside this bookie's write set (or damaged here) is the reader's
        to fetch with a plain read, never an error that would cost it the LAC."""
        if not 0 <= entry_id <= lac:
            return b""
        try:
            entry = self._read_entry(ledger_id, entry_id) or b""
        except BookieIOError as exc:
            log.warning("long poll of %d:%d answered without the entry: %s", ledger_id, entry_id, exc)
            return b""
        if entry:
            self.read_count += 1
            self.read_bytes += len(entry)
        return entry

    def _park(self, ledger_id: int, ledger: LedgerState, waiter: Waiter, timeout_ms: int) -> None:
        if self._waiter_count >= self.long_poll_waiters_max:
            self._fail(waiter.reply, waiter.request_id, waiter.opcode, Status.TOO_MANY_REQUESTS,
                       f"{self._waiter_count} long polls already wait (maximum "
                       f"{self.long_poll_waiters_max})")
            return
        timeout_s = min(timeout_ms, self.long_poll_timeout_ms_max) / 1000

        def expire() -> None:
            if waiter in ledger.waiters:
                ledger.waiters.remove(waiter)
                waiter.timer = None
                self._finish_waiter(waiter, ledger_id, ledger)

        waiter.timer = asyncio.get_running_loop().call_later(timeout_s, expire)
        ledger.waiters.append(waiter)
        self._waiter_count += 1
        self._waiters_of.setdefault(waiter.reply, {})[waiter] = ledger_id

    def _unindex_waiter(self, waiter: Waiter) -> None:
        parked = self._waiters_of.get(waiter.reply)
        if parked is not None:
            parked.pop(waiter, None)
            if not parked:
                del self._waiters_of[waiter.reply]

    def drop_waiters(self, reply: Reply) -> int:
        """The reply's connection closed: forget its long polls now instead of at their timeout,
        so they stop counting against `long_poll_waiters_max`. Returns how many were dropped."""
        parked = self._waiters_of.pop(reply, None)
        if not parked:
            return 0
        by_ledger: dict[int, set[Waiter]] = {}
        for waiter, ledger_id in parked.items():
            if waiter.timer is not None:
                waiter.timer.cancel()
            by_ledger.setdefault(ledger_id, set()).add(waiter)
        for ledger_id, gone in by_ledger.items():
            ledger = self._ledgers.get(ledger_id)
            if ledger is not None:
                ledger.waiters = [waiter for waiter in ledger.waiters if waiter not in gone]
        self._waiter_count -= len(parked)
        self.dropped_waiters += len(parked)
        return len(parked)

    @property
    def waiter_count(self) -> int:
        return self._waiter_count

    def on_read_lac(self, request: ReadLacRequest, reply: Reply) -> None:
        ledger = self._ledger(request.ledger_id)
        if ledger is None:
            self._fail(reply, request.request_id, OpCode.READ_LAC, Status.NO_LEDGER,
                       f"no ledger {request.ledger_id} on this bookie")
            return
        if request.long_poll and ledger.lac <= request.previous_lac:
            waiter = Waiter(request.previous_lac, -1, request.request_id, OpCode.READ_LAC, reply)
            self._park(request.ledger_id, ledger, waiter, request.timeout_ms)
            return
        reply.send(encode_response(ReadLacResponse(request.request_id, request.ledger_id,
                                                   ledger.lac)))
        reply.request_done()

    # ------------------------------------------------------------------ READ and fencing

    def on_read(self, request: ReadRequest, reply: Reply) -> None:
        ledger_id = request.ledger_id
        ledger = self._ledger_to_read(request, OpCode.READ, reply)
        if ledger is None:
            return
        if request.long_poll:
            if ledger.lac <= request.previous_lac:
                waiter = Waiter(request.previous_lac, request.entry_id, request.request_id,
                                 OpCode.READ, reply)
                self._park(ledger_id, ledger, waiter, request.timeout_ms)
                return
            reply.send(self._lac_answer(OpCode.READ, request.request_id, ledger_id, request.entry_id,
                                        ledger.lac))
            reply.request_done()
            return
        self._answer_read(request, ledger, reply)

    def _ledger_to_read(self, request: ReadRequest | ReadRangeRequest, opcode: OpCode,
                        reply: Reply) -> LedgerState | None:
        """The ledger a READ or READ_RANGE reads now; None when the request was answered (no such
        ledger, a fencing read with the wrong key) or waits for its fence to be durable."""
        ledger_id = request.ledger_id
        ledger = self._ledger(ledger_id)
        if ledger is None and request.fence and ledger_id >= 0 and ledger_id not in self._deleted:
            # a fence must hold even where the writer's adds have not arrived yet: otherwise a
            # slow add could still land here after recovery counted this bookie as answered
            ledger = self._create_ledger(ledger_id, request.master_key)
        if ledger is None:
            self._fail(reply, request.request_id, opcode, Status.NO_LEDGER, f"no ledger {ledger_id} on this bookie")
            return None
        if request.fence:
            if ledger.master_key != request.master_key:
                self._fail(reply, request.request_id, opcode, Status.UNAUTHORIZED,
                           f"wrong master key for ledger {ledger_id}")
                return None
            if not ledger.fenced:
                self._fence(ledger_id, ledger, request, reply)
                return None
            if ledger.fence_pending is not None:
                ledger.fence_pending.append((request, reply))
                return None
        return ledger

    def _fence(self, ledger_id: int, ledger: LedgerState, request: ReadRequest | ReadRangeRequest,
               reply: Reply) -> None:
        """Fence durably, then answer the read (A7, A11)."""
        ledger.fenced = True
        ledger.fence_pending = [(request, reply)]
        self.fence_count += 1
        state = known(self.storage.get_state(ledger_id), "a known ledger has a stored state")
        self.storage.put_state(ledger_id, _replace(state, fenced=True))

        def fenced(_: object) -> None:
            waiting, ledger.fence_pending = ledger.fence_pending or [], None
            for pending_request, pending_reply in waiting:
                if isinstance(pending_request, ReadRequest):
                    self._answer_read(pending_request, ledger, pending_reply)
                else:  # a fencing READ_RANGE (batching.py)
                    self._answer_read_range(pending_request, ledger.lac, pending_reply)

        self.journal.append(_FENCE_RECORD.pack(RECORD_FENCE, ledger_id), fenced, None)

    def _answer_read(self, request: ReadRequest, ledger: LedgerState, reply: Reply) -> None:
        entry = b""
        if request.entry_id >= 0:
            try:
                found = self._read_entry(request.ledger_id, request.entry_id)
            except BookieIOError as exc:
                self._fail(reply, request.request_id, OpCode.READ, Status.IO_ERROR, str(exc))
                return
            if found is None:
                self._fail(reply, request.request_id, OpCode.READ, Status.NO_ENTRY,
                           f"no entry {request.ledger_id}:{request.entry_id} on this bookie")
                return
            entry = found
            self.read_count += 1
            self.read_bytes += len(found)
        reply.send(encode_response(ReadResponse(request.request_id, request.ledger_id,
                                                request.entry_id, ledger.lac, entry)))
        reply.request_done()

    def _read_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self.storage.get_entry(ledger_id, entry_id)

    # ------------------------------------------------------------------ CHECK_ENTRIES

    def on_check_entries(self, request: CheckEntriesRequest, reply: Reply) -> None:
        """Presence and checksum of a range of entries, for a replica check (R2). Bounded by the
        codec (CHECK_ENTRIES_MAX entries); nothing is sent but 5 bytes per entry."""
        if self._ledger(request.ledger_id) is None:
            self._fail(reply, request.request_id, OpCode.CHECK_ENTRIES, Status.NO_LEDGER,
                       f"no ledger {request.ledger_id} on this bookie")
            return
        first = request.first_entry_id
        entries = tuple(self._check_entry(request.ledger_id, entry_id)
                        for entry_id in range(first, first + request.count))
        self.check_count += len(entries)
        reply.send(encode_response(CheckEntriesResponse(request.request_id, request.ledger_id,
                                                        first, entries)))
        reply.request_done()

    def _check_entry(self, ledger_id: int, entry_id: int) -> tuple[EntryCheck, int]:
        if entry_id < 0:
            return EntryCheck.ABSENT, 0
        try:
            stored = self._read_entry(ledger_id, entry_id)
        except BookieIOError:
            return EntryCheck.DAMAGED, 0
        if stored is None:
            return EntryCheck.ABSENT, 0
        if not _crc32c_digest_holds(stored):
            return EntryCheck.DAMAGED, 0
        return EntryCheck.PRESENT, crc32c.crc32c(stored)

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _fail(reply: Reply, request_id: int, opcode: int, status: Status, message: str) -> None:
        reply.send(encode_response(ErrorResponse(request_id, opcode, status, message)))
        reply.request_done()


def _crc32c_digest_holds(packed: bytes) -> bool:
    """An entry with a CRC32C digest is checked here; other digests need the ledger's password."""
    if len(packed) < ENTRY_HEADER_BYTES or packed[ENTRY_HEADER_BYTES - 1] != DigestType.CRC32C:
        return len(packed) >= ENTRY_HEADER_BYTES
    start = ENTRY_HEADER_BYTES + DIGEST_BYTES[DigestType.CRC32C]
    if len(packed) < start:
        return False
    expected = crc32c.crc32c(packed[start:], crc32c.crc32c(packed[:ENTRY_HEADER_BYTES]))
    return hmac.compare_digest(packed[ENTRY_HEADER_BYTES:start], expected.to_bytes(4, "big"))


def _ignore(_: object) -> None:
    return None


def _replace(state: LedgerData, **changes: object) -> LedgerData:
    return dataclasses.replace(state, **changes)  # type: ignore[arg-type]
