"""Reading a range of entries: failover inside the write set, speculative reads, digest checks.

Theory of operation. Each entry is asked of the first bookie of its write set (A1 order, with
bookies known to be down moved last). A bad answer (error, digest mismatch, or no answer within
`read_timeout_ms`) moves on to the next bookie; an answer slower than `speculative_ms` sends a
second request to the next bookie without giving up on the first, and the first valid answer
wins. An entry fails only when every bookie of its write set failed: with "no such entry" if all
of them said so, otherwise with the last error. At most `window` entries are in flight; results
are handed out in entry order so a caller can stream them.

The caller bounds the range by the LAC (A4) or by a closed ledger's last entry (A5); this machine
never reads past `last_entry_id`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bookkeeper.errors import (
    DlogError,
    NoSuchEntryError,
    NoSuchLedgerError,
    RequestTimeoutError,
    invariant,
)
from bookkeeper.protocol.effects import CompleteRead, Effect, FailRead, SendRead
from bookkeeper.protocol.entry import Digest, DigestMismatchError, unpack_entry
from bookkeeper.protocol.metadata import LedgerMetadata
from bookkeeper.protocol.quorum import write_set
from bookkeeper.protocol.ticks import discount_stall


@dataclass(slots=True, eq=False)
class _EntryRead:
    entry_id: int
    candidates: list[str]
    next_index: int = 0
    outstanding: dict[str, int] = field(default_factory=dict)  # bookie -> sent at (ms)
    errors: list[DlogError] = field(default_factory=list)
    result: CompleteRead | FailRead | None = None


class ReadOp:
    def __init__(self, ledger_id: int, metadata: LedgerMetadata, digest: Digest, first_entry_id: int,
                 last_entry_id: int, *, speculative_ms: int = 2000, read_timeout_ms: int = 5000,
                 window: int = 256, down: frozenset[str] = frozenset()) -> None:
        invariant(first_entry_id >= 0, f"first entry id {first_entry_id} is negative")
        self.ledger_id = ledger_id
        self.metadata = metadata
        self.digest = digest
        self.first_entry_id = first_entry_id
        self.last_entry_id = last_entry_id
        self.speculative_ms = speculative_ms
        self.read_timeout_ms = read_timeout_ms
        self.window = window
        self.down = down
        self._reads: dict[int, _EntryRead] = {}
        self._next_to_start = first_entry_id
        self._next_to_deliver = first_entry_id

    @property
    def done(self) -> bool:
        return self._next_to_deliver > self.last_entry_id

    def _candidates(self, entry_id: int) -> list[str]:
        ensemble = self.metadata.ensemble_for(entry_id)
        bookies = [ensemble[position] for position in
                   write_set(entry_id, self.metadata.ensemble_size, self.metadata.write_quorum)]
        return [b for b in bookies if b not in self.down] + [b for b in bookies if b in self.down]

    def start(self, now_ms: int) -> list[Effect]:
        effects: list[Effect] = []
        while (self._next_to_start <= self.last_entry_id
               and self._next_to_start - self._next_to_deliver < self.window):
            read = _EntryRead(self._next_to_start, self._candidates(self._next_to_start))
            self._reads[read.entry_id] = read
            self._next_to_start += 1
            effects += self._try_next(read, now_ms)
        return effects

    def _try_next(self, read: _EntryRead, now_ms: int) -> list[Effect]:
        if read.next_index >= len(read.candidates):
            if not read.outstanding and read.result is None:
                read.result = FailRead(read.entry_id, self._final_error(read))
            return []
        bookie = read.candidates[read.next_index]
        read.next_index += 1
        read.outstanding[bookie] = now_ms
        return [SendRead(bookie, read.entry_id)]

    def _final_error(self, read: _EntryRead) -> DlogError:
        if read.errors and all(isinstance(e, (NoSuchEntryError, NoSuchLedgerError)) for e in read.errors):
            return NoSuchEntryError(f"entry {self.ledger_id}:{read.entry_id} is on none of "
                                    f"{', '.join(read.candidates)}")
        # "no such entry" only when every bookie said so: a caller may take it for the end of the
        # ledger, so a replica that failed its digest check or did not answer must show instead
        others = [e for e in read.errors if not isinstance(e, (NoSuchEntryError, NoSuchLedgerError))]
        invariant(bool(others), f"entry {self.ledger_id}:{read.entry_id} failed without an error")
        return others[-1]

    def on_read_ok(self, bookie: str, entry_id: int, packed_entry: bytes, now_ms: int) -> list[Effect]:
        read = self._reads.get(entry_id)
        if read is None or read.outstanding.pop(bookie, None) is None or read.result is not None:
            return []
        try:
            entry = unpack_entry(self.digest, packed_entry, self.ledger_id, entry_id)
        except DigestMismatchError as exc:
            read.errors.append(exc)
            return self._try_next(read, now_ms) + self._deliver(now_ms)
        read.result = CompleteRead(entry_id, entry.lac, entry.payload, entry.length)
        return self._deliver(now_ms)

    def on_read_error(self, bookie: str, entry_id: int, error: DlogError, now_ms: int) -> list[Effect]:
        read = self._reads.get(entry_id)
        if read is None or read.outstanding.pop(bookie, None) is None or read.result is not None:
            return []
        read.errors.append(error)
        return self._try_next(read, now_ms) + self._deliver(now_ms)

    def on_tick(self, now_ms: int, stalled_since_ms: int | None = None) -> list[Effect]:
        effects: list[Effect] = []
        if stalled_since_ms is not None:  # this process did not run: its stall is not the bookies' (ticks.py)
            for read in self._reads.values():
                discount_stall(read.outstanding, stalled_since_ms, now_ms)
        for read in list(self._reads.values()):
            if read.result is not None:
                continue
            for bookie, sent_ms in list(read.outstanding.items()):
                if now_ms - sent_ms >= self.read_timeout_ms:
                    del read.outstanding[bookie]
                    read.errors.append(RequestTimeoutError(
                        f"bookie {bookie} did not answer a read of {self.ledger_id}:{read.entry_id} "
                        f"within {self.read_timeout_ms} ms"))
                    effects += self._try_next(read, now_ms)
            newest_ms = max(read.outstanding.values(), default=None)
            if newest_ms is not None and now_ms - newest_ms >= self.speculative_ms:
                effects += self._try_next(read, now_ms)
        return effects + self._deliver(now_ms)

    def _deliver(self, now_ms: int | None = None) -> list[Effect]:
        """Hand out finished entries in order; start more within the window."""
        effects: list[Effect] = []
        while True:
            read = self._reads.get(self._next_to_deliver)
            if read is None or read.result is None:
                break
            del self._reads[read.entry_id]
            effects.append(read.result)
            self._next_to_deliver += 1
            if isinstance(read.result, FailRead):
                # an entry in the middle failed: stop here, the caller decides what it means
                self.last_entry_id = read.entry_id
                self._reads.clear()
                break
        if now_ms is not None and not self.done:
            effects += self.start(now_ms)
        return effects
