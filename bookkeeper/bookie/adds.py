"""The bookie's one ADD route: a single ADD and each group of an ADD_BATCH go through the same rules.

Theory of operation. A single ADD is a group of one entry; `_add_group` applies the rules, written
once:
- the group's (ledger-level) rules, once: the bookie is not read-only; the ledger id is >= 0; a
  ledger garbage collection dropped is NO_LEDGER (never created again); the master key matches;
  a fenced ledger takes only RECOVERY_ADD;
- each entry's rules: the header is whole and names the group's ledger (and, for a single ADD, the
  entry id the request names), the entry id is >= 0, the digest type is known and its digest whole,
  the piggybacked LAC is below the entry id; an entry id already stored (or accepted earlier in the
  group) must come with the same bytes, else ENTRY_EXISTS; a stored copy that cannot be read
  (damaged) is IO_ERROR for a plain add, and a RECOVERY_ADD rewrites it (auto-recovery's repair,
  R2: the new copy supersedes the unreadable one).
The accepted entries of a group go into the write cache in one call and into the journal as ONE
record (`RECORD_ADD_GROUP`): when every entry passed, the group's entries exactly as they came off
the wire, without a per-entry copy. A ledger's first accepted entry creates it here (and journals
its key). Every answer goes out from the callback of the request's last journal record, after the
fsync that covers it (A2); a request with nothing accepted is answered at once.
"""

from __future__ import annotations

import logging
import struct
from typing import cast

from bookkeeper.bookie.ports import CoreParts, Reply
from bookkeeper.errors import BookieIOError
from bookkeeper.protocol.batch import AddBatchRequest, AddFailure, AddGroup, encode_add_batch_response
from bookkeeper.protocol.entry import DIGEST_BYTES, ENTRY_HEADER, ENTRY_HEADER_BYTES
from bookkeeper.protocol.wire import AddRequest, OpCode, Status, encode_add_response

RECORD_ADD = 1  # ledger_id, entry_id, packed entry (written by versions before the one ADD route)
RECORD_ADD_GROUP = 5  # ledger_id, entry count, then `length u32 | packed entry` per entry
_ADD_RECORD = struct.Struct(">Bqq")
_GROUP_RECORD = struct.Struct(">BqI")
_LENGTH = struct.Struct(">I")
_DIGEST_BYTES = {int(kind): size for kind, size in DIGEST_BYTES.items()}
log = logging.getLogger(__name__)
Refusal = tuple[Status, str]


def group_record(ledger_id: int, entries: list[bytes]) -> bytes:
    """A journal record of several entries of one ledger (rebuilt when some were refused)."""
    parts = [_GROUP_RECORD.pack(RECORD_ADD_GROUP, ledger_id, len(entries))]
    for packed_entry in entries:
        parts.append(_LENGTH.pack(len(packed_entry)))
        parts.append(packed_entry)
    return b"".join(parts)


def replay_group_record(record: bytes) -> tuple[int, list[tuple[int, bytes]]]:
    """(ledger id, [(entry id, packed entry)]) of a RECORD_ADD_GROUP."""
    _, ledger_id, count = _GROUP_RECORD.unpack_from(record)
    offset, entries = _GROUP_RECORD.size, []
    for _ in range(count):
        (length,) = _LENGTH.unpack_from(record, offset)
        packed_entry = record[offset + 4: offset + 4 + length]
        offset += 4 + length
        entries.append((ENTRY_HEADER.unpack_from(packed_entry)[1], packed_entry))
    return ledger_id, entries


def journaled_entries(record: bytes) -> tuple[int, list[tuple[int, bytes]]] | None:
    """(ledger id, [(entry id, packed entry)]) of a journal record of adds; None for other records."""
    if record[0] == RECORD_ADD_GROUP:
        return replay_group_record(record)
    if record[0] == RECORD_ADD:
        _, ledger_id, entry_id = _ADD_RECORD.unpack_from(record)
        return ledger_id, [(entry_id, record[_ADD_RECORD.size:])]
    return None


class _Accepted:
    """What one group left after the rules: the accepted entries and the refused ones by position."""

    __slots__ = ("entries", "refused", "record")

    def __init__(self) -> None:
        self.entries: list[bytes] = []
        self.refused: list[tuple[int, Status, str]] = []
        self.record = b""  # the journal record of the accepted entries (empty: none)


class AddHandlers(CoreParts):
    """Mixed into BookieCore: ADD and ADD_BATCH, one set of rules (see the module docstring)."""

    def on_add(self, request: AddRequest, reply: Reply) -> None:
        group = AddGroup(request.ledger_id, request.master_key, (request.packed_entry,), request.recovery)
        outcome = self._add_group(group, request.entry_id)
        if outcome.refused:
            _, status, message = outcome.refused[0]
            self._fail(reply, request.request_id, OpCode.ADD, status, message)
            return
        self.journal_adds([outcome.record], reply,
                          encode_add_response(request.request_id, request.ledger_id, request.entry_id))

    def on_add_batch(self, request: AddBatchRequest, reply: Reply,
                     refusals: dict[int, Refusal] | None = None) -> None:
        """`refusals`: groups (by position) a secure bookie's guard refused (FORBIDDEN, NO_LEDGER),
        checked once per ledger of the frame; they are answered as refused entries."""
        failures: list[AddFailure] = []
        records: list[bytes] = []
        index = 0
        for position, group in enumerate(request.groups):
            refusal = refusals.get(position) if refusals else None
            if refusal is not None:
                failures += [AddFailure(index + offset, *refusal) for offset in range(len(group.entries))]
            else:
                outcome = self._add_group(group)
                failures += [AddFailure(index + offset, status, message)
                             for offset, status, message in outcome.refused]
                if outcome.record:
                    records.append(outcome.record)
            index += len(group.entries)
        self.journal_adds(records, reply, encode_add_batch_response(request.request_id, index, failures))

    def journal_adds(self, records: list[bytes], reply: Reply, answer: bytes) -> None:
        """Journal the accepted adds of one request; its answer goes out after the fsync covering
        the last record (at once when nothing was accepted)."""
        if not records:
            reply.send(answer)
            reply.request_done()
            return
        journal = self.journal
        for record in records[:-1]:
            journal.append(record, _ignore, None)
        journal.append(records[-1], _answer, (reply, answer))

    def _add_group(self, group: AddGroup, request_entry_id: int | None = None) -> _Accepted:
        """Apply the rules to one group (a single ADD names its entry id); store the accepted
        entries and build their journal record."""
        outcome = _Accepted()
        ledger_id = group.ledger_id
        refusal = self._group_refusal(group)
        if refusal is not None:
            outcome.refused = [(position, *refusal) for position in range(len(group.entries))]
            return outcome
        last_stored = self.storage.last_entry_id(ledger_id)
        stored: dict[int, bytes] = {}
        lac_max = -1
        for position, packed_entry in enumerate(group.entries):
            if len(packed_entry) < ENTRY_HEADER_BYTES:
                outcome.refused.append((position, Status.BAD_REQUEST, (
                    f"entry of {len(packed_entry)} bytes is shorter than the {ENTRY_HEADER_BYTES}-byte "
                    "entry header")))
                continue
            header_ledger, entry_id, lac, _, digest_type = ENTRY_HEADER.unpack_from(packed_entry)
            problem = _header_problem(ledger_id, request_entry_id, header_ledger, entry_id, lac, digest_type,
                                      len(packed_entry))
            if problem is not None:
                outcome.refused.append((position, Status.BAD_REQUEST, problem))
                continue
            if entry_id <= last_stored or entry_id in stored:
                refusal = self._stored_refusal(group, entry_id, packed_entry, stored)
                if refusal is not None:
                    outcome.refused.append((position, *refusal))
                    continue
            stored[entry_id] = packed_entry
            outcome.entries.append(packed_entry)
            if lac > lac_max:
                lac_max = lac
        if not stored:
            return outcome
        ledger = self._ledger(ledger_id) or self._create_ledger(ledger_id, group.master_key)
        self.storage.add_entries(ledger_id, list(stored.items()))
        if lac_max > ledger.lac:
            self._advance_lac(ledger_id, ledger, lac_max)
        self.add_count += len(outcome.entries)
        self.add_bytes += sum(map(len, outcome.entries))
        if outcome.refused or not group.section:
            outcome.record = group_record(ledger_id, outcome.entries)
        else:  # the group's entries as framed: no per-entry copy
            outcome.record = _GROUP_RECORD.pack(RECORD_ADD_GROUP, ledger_id, len(outcome.entries)) + group.section
        return outcome

    def _group_refusal(self, group: AddGroup) -> Refusal | None:
        """Why every entry of the group is refused, if one reason covers them all."""
        if self.read_only:
            return Status.READ_ONLY, f"bookie is read-only ({self.read_only_reason})"
        if group.ledger_id < 0:
            return Status.BAD_REQUEST, f"ledger id must be >= 0, got {group.ledger_id}"
        ledger = self._ledger(group.ledger_id)
        if ledger is None:
            return self.deleted_refusal(group.ledger_id)
        if ledger.master_key != group.master_key:
            return Status.UNAUTHORIZED, f"wrong master key for ledger {group.ledger_id}"
        if ledger.fenced and not group.recovery:
            return Status.FENCED, f"ledger {group.ledger_id} is fenced; the outcome of adds to it is unknown"
        return None

    def _stored_refusal(self, group: AddGroup, entry_id: int, packed_entry: bytes,
                        accepted: dict[int, bytes]) -> Refusal | None:
        """An entry id stored here (or accepted earlier in the group) must come with the same
        bytes; a stored copy that cannot be read is IO_ERROR, unless a recovery add rewrites it."""
        ledger_id = group.ledger_id
        earlier = accepted.get(entry_id)
        if earlier is None:
            try:
                earlier = self.storage.get_entry(ledger_id, entry_id)
            except BookieIOError as exc:
                if not group.recovery:
                    return Status.IO_ERROR, str(exc)
                log.warning("entry %d:%d was unreadable here; rewritten by a recovery add", ledger_id, entry_id)
        if earlier is not None and earlier != packed_entry:
            return Status.ENTRY_EXISTS, f"entry {ledger_id}:{entry_id} is stored with different bytes"
        return None


def _header_problem(ledger_id: int, request_entry_id: int | None, header_ledger: int, entry_id: int,
                    lac: int, digest_type: int, size: int) -> str | None:
    if request_entry_id is not None and (header_ledger, entry_id) != (ledger_id, request_entry_id):
        return (f"entry header says {header_ledger}:{entry_id}, the request says "
                f"{ledger_id}:{request_entry_id}")
    if header_ledger != ledger_id:
        return f"entry header says ledger {header_ledger}, its group says {ledger_id}"
    if entry_id < 0:
        return f"entry id must be >= 0, got {entry_id}"
    digest_bytes = _DIGEST_BYTES.get(digest_type)
    if digest_bytes is None:
        return f"unknown digest type {digest_type}"
    if size < ENTRY_HEADER_BYTES + digest_bytes:
        return "entry is shorter than its digest"
    if lac >= entry_id:
        return f"entry {entry_id} carries LAC {lac}, which must be below it"
    return None


def _answer(argument: object) -> None:
    """Journal callback of the last record of an add: it is durable, send the answer."""
    reply, frame = cast("tuple[Reply, bytes]", argument)  # what journal_adds gave the journal
    reply.send(frame)
    reply.request_done()


def _ignore(_: object) -> None:
    return None
