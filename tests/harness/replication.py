"""The replication check of the fault histories: after the faults heal and auto-recovery has
nothing left marked, every entry of every completed segment must be on each of the Qw live bookies
of its fragment's write set, byte-identical (RELIABILITY.md R1, R2).

`replication_problems` reads each entry from each member of its write set (bounded concurrency);
the workload records its verdict as one history event (process "replication", f "check", ok or
fail with the problems), which `tests.harness.history` reports as `under_replicated` anomalies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from bookkeeper.autorecovery.policy import fragments
from bookkeeper.autorecovery.store import RecoveryStore
from bookkeeper.errors import DlogError, NoSuchLedgerError
from bookkeeper.protocol.quorum import write_set
from bookkeeper.protocol.wire import ReadRequest

READS_IN_FLIGHT_MAX = 256
PROBLEMS_MAX = 50  # reported one by one; the rest are counted
POLL_S = 0.5


async def wait_fully_replicated(store: RecoveryStore, timeout_s: float) -> int:
    """Wait until no ledger is marked under-replicated; returns how many still are (0: all done)."""
    deadline = time.monotonic() + timeout_s
    while True:
        count = await store.count_marks()
        if count == 0 or time.monotonic() >= deadline:
            return count
        await asyncio.sleep(POLL_S)


async def replication_problems(client: Any, ledger_ids: Iterable[int]) -> list[str]:
    """Entries of these (closed) ledgers that are not on every live member of their write set, or
    differ between members; and fragments naming bookies that are not registered."""
    live = {info.bookie_id for info in await client.store.bookies()}
    problems: list[str] = []
    reads: list[tuple[int, int, list[str]]] = []
    for ledger_id in sorted(set(ledger_ids)):
        try:
            metadata, _ = await client.ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            continue  # removed on purpose (truncation, retention): the history checker judges that
        for fragment in fragments(metadata):
            if not fragment.is_closed:
                problems.append(f"ledger {ledger_id} is not closed (fragment {fragment.first_entry_id})")
                continue
            gone = sorted(set(fragment.bookies) - live)
            if gone:
                problems.append(f"ledger {ledger_id} fragment {fragment.first_entry_id} names "
                                f"{', '.join(gone)}, which {'is' if len(gone) == 1 else 'are'} not registered")
            for entry_id in range(fragment.first_entry_id, fragment.last_entry_id + 1):
                members = [fragment.bookies[p] for p in write_set(entry_id, metadata.ensemble_size,
                                                                   metadata.write_quorum)]
                reads.append((ledger_id, entry_id, members))
    semaphore = asyncio.Semaphore(READS_IN_FLIGHT_MAX)

    async def check(ledger_id: int, entry_id: int, members: list[str]) -> str | None:
        async with semaphore:
            copies = await asyncio.gather(*(_read(client, bookie, ledger_id, entry_id) for bookie in members))
        missing = [bookie for bookie, copy in zip(members, copies) if isinstance(copy, str)]
        if missing:
            return (f"entry {ledger_id}:{entry_id} is not readable from "
                    + "; ".join(f"{b} ({c})" for b, c in zip(members, copies) if isinstance(c, str)))
        if len(set(copies)) > 1:
            return f"entry {ledger_id}:{entry_id} differs between {', '.join(members)}"
        return None

    found = await asyncio.gather(*(check(*read) for read in reads))
    problems += [problem for problem in found if problem is not None]
    if len(problems) > PROBLEMS_MAX:
        problems = problems[:PROBLEMS_MAX] + [f"... and {len(problems) - PROBLEMS_MAX} more"]
    return problems


async def _read(client: Any, bookie: str, ledger_id: int, entry_id: int) -> bytes | str:
    pool = client.pool
    try:
        answer = await asyncio.wait_for(pool.send(bookie, ReadRequest(pool.next_request_id(), ledger_id,
                                                                       entry_id)), 10)
    except (TimeoutError, DlogError) as exc:
        return f"{type(exc).__name__}: {exc}"[:120]
    return bytes(answer.packed_entry)
