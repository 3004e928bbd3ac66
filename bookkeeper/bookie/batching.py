"""The bookie's batched requests (protocol version 2): ADD_BATCH and READ_RANGE.

Theory of operation. An ADD_BATCH is checked group by group (one ledger each): the ledger-level
rules (read-only, master key, fence) once per group, the entry-level rules (header ids, LAC below
the entry id, digest type, an id already stored with other bytes) per entry, as `on_add` does for
one. The accepted entries of a group go into the write cache in one call and into the journal as
ONE record (`RECORD_ADD_GROUP`): when every entry of the group passed, that record is the group's
entries exactly as they came off the wire, without a per-entry copy. The frame gets one answer,
from the callback of its last journal record, after the fsync that covers all of them (A2);
an ADD_BATCH with nothing accepted is answered at once.

A READ_RANGE reads `first, first + stride, ... <= last` (at most READ_RANGE_ENTRIES_MAX ids, past
the ledger's last stored entry nothing is looked up) until the byte limit, always returning the
first entry it holds. A damaged entry answers IO_ERROR when it is the first; later, the answer
stops before it, so the reader's next request starting there gets the IO_ERROR. With FENCE the
fence is made durable first, as for a fencing READ (A7, A11).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from bookkeeper.errors import BookieIOError
from bookkeeper.protocol.batch import (
    READ_RANGE_ENTRIES_MAX,
    AddBatchRequest,
    AddFailure,
    AddGroup,
    ReadRangeRequest,
    encode_add_batch_response,
    encode_read_range_response,
)
from bookkeeper.protocol.entry import DIGEST_BYTES, ENTRY_HEADER, ENTRY_HEADER_BYTES
from bookkeeper.protocol.wire import ENTRY_BYTES_MAX_DEFAULT, OpCode, Status

if TYPE_CHECKING:
    from bookkeeper.bookie.bookie import BookieCore, Reply

RECORD_ADD_GROUP = 5  # ledger_id, entry count, then `length u32 | packed entry` per entry
_GROUP_RECORD = struct.Struct(">BqI")
_LENGTH = struct.Struct(">I")
_RANGE_ENTRY_OVERHEAD_BYTES = 12  # entry id and length in the answer
_DIGEST_BYTES = {int(kind): size for kind, size in DIGEST_BYTES.items()}


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


class BatchHandlers:
    """Mixed into BookieCore: the handlers of ADD_BATCH and READ_RANGE."""

    read_range_bytes_max: int = ENTRY_BYTES_MAX_DEFAULT

    # ------------------------------------------------------------------ ADD_BATCH

    def on_add_batch(self: BookieCore, request: AddBatchRequest, reply: Reply,
                     refusals: dict[int, tuple[Status, str]] | None = None) -> None:
        """`refusals`: groups (by position) a secure bookie's guard refused (FORBIDDEN, NO_LEDGER),
        checked once per ledger of the frame; they are answered as refused entries."""
        failures: list[AddFailure] = []
        records: list[bytes] = []
        index = accepted = added_bytes = 0
        for position, group in enumerate(request.groups):
            count = len(group.entries)
            refusal = refusals.get(position) if refusals else None
            if refusal is None:
                refusal = self._group_refusal(group)
            if refusal is not None:
                failures += [AddFailure(index + position, *refusal) for position in range(count)]
            else:
                good, refused = self._add_group(group)
                failures += [AddFailure(index + position, status, message)
                             for position, status, message in refused]
                if good and not refused:  # the group's entries as framed: no per-entry copy
                    records.append(_GROUP_RECORD.pack(RECORD_ADD_GROUP, group.ledger_id, len(good))
                                   + group.section)
                elif good:
                    records.append(group_record(group.ledger_id, good))
                accepted += len(good)
                added_bytes += sum(map(len, good))
            index += count
        self.add_count += accepted
        self.add_bytes += added_bytes
        answer = (reply, encode_add_batch_response(request.request_id, index, failures))
        if not records:
            _answer_batch(answer)
            return
        journal = self.journal
        for record in records[:-1]:
            journal.append(record, _ignore, None)
        journal.append(records[-1], _answer_batch, answer)

    def _group_refusal(self: BookieCore, group: AddGroup) -> tuple[Status, str] | None:
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

    def _add_group(self: BookieCore, group: AddGroup) -> tuple[list[bytes], list[tuple[int, Status, str]]]:
        """Check each entry, store the good ones; returns (good entries, refused ones by position)."""
        ledger_id, storage = group.ledger_id, self.storage
        ledger = self._ledger(ledger_id) or self._create_ledger(ledger_id, group.master_key)
        last_stored = storage.last_entry_id(ledger_id)
        unpack, lac_max = ENTRY_HEADER.unpack_from, ledger.lac
        good: list[bytes] = []
        stored: list[tuple[int, bytes]] = []
        refused: list[tuple[int, Status, str]] = []
        for position, packed_entry in enumerate(group.entries):
            if len(packed_entry) < ENTRY_HEADER_BYTES:
                refused.append((position, Status.BAD_REQUEST, f"entry of {len(packed_entry)} bytes is "
                                f"shorter than the {ENTRY_HEADER_BYTES}-byte entry header"))
                continue
            header_ledger, entry_id, lac, _, digest_type = unpack(packed_entry)
            problem = _entry_problem(ledger_id, header_ledger, entry_id, lac, digest_type, len(packed_entry))
            if problem is None and entry_id <= last_stored:
                existing = storage.get_entry(ledger_id, entry_id)
                if existing is not None and existing != packed_entry:
                    problem = f"entry {ledger_id}:{entry_id} is stored with different bytes"
                    refused.append((position, Status.ENTRY_EXISTS, problem))
                    continue
            if problem is not None:
                refused.append((position, Status.BAD_REQUEST, problem))
                continue
            good.append(packed_entry)
            stored.append((entry_id, packed_entry))
            if lac > lac_max:
                lac_max = lac
        if stored:
            storage.add_entries(ledger_id, stored)
            if lac_max > ledger.lac:
                self._advance_lac(ledger_id, ledger, lac_max)
        return good, refused

    # ------------------------------------------------------------------ READ_RANGE

    def on_read_range(self: BookieCore, request: ReadRangeRequest, reply: Reply) -> None:
        ledger = self._ledger_to_read(request, OpCode.READ_RANGE, reply)  # fencing as a READ does
        if ledger is not None:
            self._answer_read_range(request, ledger.lac, reply)

    def _answer_read_range(self: BookieCore, request: ReadRangeRequest, lac: int, reply: Reply) -> None:
        ledger_id, stride = request.ledger_id, request.stride
        bytes_max = min(request.bytes_max or self.read_range_bytes_max, self.read_range_bytes_max)
        limit = min(request.last_entry_id, self.storage.last_entry_id(ledger_id))
        entries: list[tuple[int, bytes]] = []
        covered, total_bytes, looked = request.last_entry_id, 0, 0
        entry_id = request.first_entry_id
        while entry_id <= limit:
            if looked == READ_RANGE_ENTRIES_MAX:
                covered = entry_id - stride
                break
            looked += 1
            try:
                found = self._read_entry(ledger_id, entry_id)
            except BookieIOError as exc:
                if not entries:
                    self._fail(reply, request.request_id, OpCode.READ_RANGE, Status.IO_ERROR, str(exc))
                    return
                covered = entry_id - stride  # the reader's next range starts here and is told
                break
            if found is not None:
                size = len(found) + _RANGE_ENTRY_OVERHEAD_BYTES
                if entries and total_bytes + size > bytes_max:
                    covered = entry_id - stride
                    break
                entries.append((entry_id, found))
                total_bytes += size
            entry_id += stride
        self.read_count += len(entries)
        self.read_bytes += total_bytes
        reply.send(encode_read_range_response(request.request_id, ledger_id, lac, covered, entries))
        reply.request_done()


def _entry_problem(ledger_id: int, header_ledger: int, entry_id: int, lac: int, digest_type: int,
                   size: int) -> str | None:
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


def _answer_batch(argument: object) -> None:
    reply, frame = argument  # type: ignore[misc]
    reply.send(frame)
    reply.request_done()


def _ignore(_: object) -> None:
    return None
