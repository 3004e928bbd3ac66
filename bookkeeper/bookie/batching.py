"""The bookie's READ_RANGE (protocol version 2; its ADD_BATCH goes the one ADD route, adds.py).

A READ_RANGE reads `first, first + stride, ... <= last` (at most READ_RANGE_ENTRIES_MAX ids, past
the ledger's last stored entry nothing is looked up) until the byte limit, always returning the
first entry it holds. A damaged entry answers IO_ERROR when it is the first; later, the answer
stops before it, so the reader's next request starting there gets the IO_ERROR. With FENCE the
fence is made durable first, as for a fencing READ (A7, A11).
"""

from __future__ import annotations

from bookkeeper.bookie.ports import CoreParts, Reply
from bookkeeper.errors import BookieIOError
from bookkeeper.protocol.batch import READ_RANGE_ENTRIES_MAX, ReadRangeRequest, encode_read_range_response
from bookkeeper.protocol.wire import ENTRY_BYTES_MAX_DEFAULT, OpCode, Status

_RANGE_ENTRY_OVERHEAD_BYTES = 12  # entry id and length in the answer


class BatchHandlers(CoreParts):
    """Mixed into BookieCore: the handler of READ_RANGE."""

    read_range_bytes_max: int = ENTRY_BYTES_MAX_DEFAULT

    # ------------------------------------------------------------------ READ_RANGE

    def on_read_range(self, request: ReadRangeRequest, reply: Reply) -> None:
        ledger = self._ledger_to_read(request, OpCode.READ_RANGE, reply)  # fencing as a READ does
        if ledger is not None:
            self._answer_read_range(request, ledger.lac, reply)

    def _answer_read_range(self, request: ReadRangeRequest, lac: int, reply: Reply) -> None:
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
