"""Copying entries between bookies: read each from a good replica, verify it, add it to the target
with the recovery flag and the ledger's master key; paced by the rate limits and the copy window.

Theory of operation. Every copy is one entry id with its sources (the other members of its write
set, in order). The copier keeps at most `CopyWindow.window` entries in flight; each reads from its
first source that answers with an entry that verifies (the digest when the copier can check it,
else the header's ids), reserves its size from the pacer, sleeps what the pacer asks, and adds it
to the target. The add's latency feeds the window (R3: a slow target halves it). An entry that no
source can give fails the whole copy with `EntryUnavailableError`; a target that refuses fails it
with the target's error. Nothing here touches metadata: a copy that dies half way leaves extra
entries on the target, which the next attempt (reusing the target recorded in the mark) adds again
harmlessly (same bytes).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from bookkeeper.autorecovery.metrics import RecoveryMetrics
from bookkeeper.autorecovery.throttle import CopyWindow, Pacer
from bookkeeper.client.pool import BookiePool
from bookkeeper.clock import SYSTEM_CLOCK, Clock
from bookkeeper.errors import DlogError, LedgerRecoveryError
from bookkeeper.protocol.entry import Digest, DigestMismatchError, DigestType, peek_header, unpack_entry
from bookkeeper.protocol.wire import AddRequest, ReadRequest

PROGRESS_EVERY_ENTRIES = 256


class EntryUnavailableError(LedgerRecoveryError):
    """No source could give a good copy of an entry (every replica gone or damaged)."""

    code = 551
    retryable = True  # a source may come back


def verifier_for(digest_type: DigestType) -> Digest | None:
    """A digest check needing no password (CRC32C, or none); None for HMAC, which needs the
    ledger's password: then only the header's ids are checked."""
    if digest_type is DigestType.HMAC_SHA256:
        return None
    return Digest.for_ledger(digest_type, b"")


def verify(packed: bytes, ledger_id: int, entry_id: int, digest: Digest | None) -> None:
    """DigestMismatchError unless `packed` is entry `ledger_id:entry_id` and (when `digest` can tell)
    intact."""
    if digest is not None:
        unpack_entry(digest, packed, ledger_id, entry_id)
        return
    try:
        got = peek_header(packed)[:2]
    except struct.error as exc:  # shorter than a header
        raise DigestMismatchError(f"entry {ledger_id}:{entry_id} is malformed: {exc}") from exc
    if got != (ledger_id, entry_id):
        raise DigestMismatchError(f"asked for {ledger_id}:{entry_id}, got {got[0]}:{got[1]}")


@dataclass(frozen=True, slots=True)
class CopyResult:
    entries: int
    size_bytes: int


class EntryCopier:
    def __init__(self, pool: BookiePool, ledger_id: int, master_key: bytes, digest_type: DigestType,
                 pacer: Pacer, window: CopyWindow, metrics: RecoveryMetrics, *,
                 timeout_s: float = 10.0, clock: Clock = SYSTEM_CLOCK) -> None:
        self.pool = pool
        self.ledger_id = ledger_id
        self.master_key = master_key
        self.digest = verifier_for(digest_type)
        self.pacer = pacer
        self.window = window
        self.metrics = metrics
        self.timeout_s = timeout_s
        self.clock = clock
        self._pause_until = 0.0

    async def copy(self, jobs: Iterable[tuple[int, Sequence[str]]], target: str,
                   on_progress: Callable[[int], None] = lambda copied: None) -> CopyResult:
        """Copy every (entry id, sources) to `target`; returns what was copied."""
        in_flight: set[asyncio.Future[int]] = set()
        copied = size_bytes = 0
        try:
            for entry_id, sources in jobs:
                while len(in_flight) >= self.window.window:
                    done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        size_bytes += task.result()
                        copied += 1
                        if copied % PROGRESS_EVERY_ENTRIES == 0:
                            on_progress(copied)
                pause_s = self._pause_until - self.clock.monotonic_s()
                if pause_s > 0:
                    await asyncio.sleep(pause_s)
                in_flight.add(asyncio.ensure_future(self._copy_one(entry_id, sources, target)))
            for task in asyncio.as_completed(list(in_flight)):
                size_bytes += await task
                copied += 1
            in_flight.clear()
        finally:
            for task in in_flight:
                task.cancel()
            if in_flight:
                await asyncio.wait(in_flight)
        on_progress(copied)
        return CopyResult(copied, size_bytes)

    async def _copy_one(self, entry_id: int, sources: Sequence[str], target: str) -> int:
        packed = await self.read_good(entry_id, sources)
        wait_s = self.pacer.take(1, len(packed), self.clock.monotonic_s())
        if wait_s > 0:
            self.metrics.throttle_wait_s += wait_s
            await asyncio.sleep(wait_s)
        started = self.clock.monotonic_s()
        request = AddRequest(self.pool.next_request_id(), self.ledger_id, entry_id, self.master_key,
                             packed, recovery=True)
        async with asyncio.timeout(self.timeout_s):
            await self.pool.send(target, request)
        pause_s = self.window.on_answer((self.clock.monotonic_s() - started) * 1000)
        self.metrics.copy_window = self.window.window
        self.metrics.copy_slowdowns = self.window.slowdowns
        if pause_s:
            self._pause_until = max(self._pause_until, self.clock.monotonic_s() + pause_s)
        return len(packed)

    async def read_good(self, entry_id: int, sources: Sequence[str]) -> bytes:
        """The entry from the first source that gives a copy that verifies."""
        problems = []
        for source in sources:
            try:
                async with asyncio.timeout(self.timeout_s):
                    answer = await self.pool.send(source, ReadRequest(
                        self.pool.next_request_id(), self.ledger_id, entry_id))
                verify(answer.packed_entry, self.ledger_id, entry_id, self.digest)
                return answer.packed_entry
            except (TimeoutError, DlogError) as exc:
                problems.append(f"{source}: {type(exc).__name__} {exc}".strip())
        raise EntryUnavailableError(
            f"no good copy of entry {self.ledger_id}:{entry_id} on "
            f"{', '.join(sources) or 'any live bookie'} ({'; '.join(problems) or 'no source'})")
