"""Asking the members of a fragment's write sets what they hold (CHECK_ENTRIES), and the verdicts.

Used by the auditor's replica check (find replicas that are absent, damaged or divergent, and mark
their ledgers) and by a worker's in-place repair (find them again, then write them back from a
good replica). Each request covers at most CHECK_ENTRIES_MAX entries; the caller paces them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass

from bookkeeper.autorecovery.policy import EntryVerdict, Fragment, ReplicaState, entry_verdict
from bookkeeper.client.pool import BookiePool
from bookkeeper.errors import DlogError, NoSuchLedgerError
from bookkeeper.protocol.quorum import write_set
from bookkeeper.protocol.wire import CHECK_ENTRIES_MAX, CheckEntriesRequest, EntryCheck

STATES = {EntryCheck.PRESENT: ReplicaState.OK, EntryCheck.ABSENT: ReplicaState.ABSENT,
          EntryCheck.DAMAGED: ReplicaState.DAMAGED}


@dataclass(frozen=True, slots=True)
class ChunkVerdicts:
    """Verdicts of entries first..first+count-1, and who was asked."""

    verdicts: dict[int, EntryVerdict]
    good: dict[int, list[str]]  # entry -> members whose copy is good (sources for a repair)
    asked: int  # replicas asked about (entries x members), for pacing and metrics


def chunks(fragment: Fragment, size: int = CHECK_ENTRIES_MAX) -> list[tuple[int, int]]:
    """(first, count) pieces of a closed fragment."""
    last = fragment.last_entry_id if fragment.last_entry_id is not None else fragment.first_entry_id - 1
    return [(first, min(size, last - first + 1)) for first in range(fragment.first_entry_id, last + 1, size)]


async def check_chunk(pool: BookiePool, ledger_id: int, fragment: Fragment, write_quorum: int,
                      first: int, count: int, live: Collection[str], timeout_s: float) -> ChunkVerdicts:
    """Ask every live member of the fragment about entries first..first+count-1."""
    members = [bookie for bookie in fragment.bookies if bookie in live]
    answers = await asyncio.gather(*(_ask(pool, bookie, ledger_id, first, count, timeout_s)
                                     for bookie in members))
    by_bookie = dict(zip(members, answers, strict=True))
    size = len(fragment.bookies)
    verdicts, good, asked = {}, {}, 0
    for offset in range(count):
        entry_id = first + offset
        holders = [fragment.bookies[p] for p in write_set(entry_id, size, write_quorum)]
        # a member not registered was not asked: it says nothing about its replica
        observations = {b: by_bookie[b][offset] if b in by_bookie else (ReplicaState.UNREACHABLE, 0)
                        for b in holders}
        asked += sum(1 for b in holders if b in by_bookie)
        verdict = entry_verdict(observations)
        verdicts[entry_id] = verdict
        good[entry_id] = [b for b, (state, _) in observations.items()
                          if state is ReplicaState.OK and b not in verdict.bad]
    return ChunkVerdicts(verdicts, good, asked)


async def _ask(pool: BookiePool, bookie: str, ledger_id: int, first: int, count: int,
               timeout_s: float) -> list[tuple[ReplicaState, int]]:
    request = CheckEntriesRequest(pool.next_request_id(), ledger_id, first, count)
    try:
        async with asyncio.timeout(timeout_s):
            answer = await pool.send(bookie, request)
    except NoSuchLedgerError:
        return [(ReplicaState.ABSENT, 0)] * count
    except (TimeoutError, DlogError):
        return [(ReplicaState.UNREACHABLE, 0)] * count
    return [(STATES[state], crc) for state, crc in answer.entries]
