"""Decommissioning a bookie: re-replicate everything it holds elsewhere, then retire its identity.

    1. refuse (with the reason) when the other writable bookies are fewer than an ensemble size in
       use: a ledger that names the bookie, or an open one (its writer changes ensemble);
    2. turn it read-only (its admin endpoint), so no new ledger or fragment is placed on it;
    3. mark every ledger whose fragments name it (reason DECOMMISSION: replaced although it still
       serves, and read from as a source), and wait while the workers repair them, scanning again
       until no ledger names it (one created just before step 2 is found and marked too);
    4. remove its cookie, then its registration: the bookie sees its cookie go and stops, and could
       never rejoin with that identity (its directory's cookie no longer matches ZooKeeper).

Every scan is paged and paced like the auditor's. A deadline bounds the wait; the ledgers still
naming the bookie are in the error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bookkeeper.autorecovery.policy import Missing, Reason, bookies_named, decommission_refusal
from bookkeeper.autorecovery.store import RecoveryStore
from bookkeeper.autorecovery.throttle import TokenBucket
from bookkeeper.client.bookkeeper import BookKeeper
from bookkeeper.clock import wall_ms
from bookkeeper.errors import DlogError, MetadataNotFoundError, NoSuchLedgerError
from bookkeeper.meta import layout
from bookkeeper.protocol.metadata import LedgerState

log = logging.getLogger(__name__)
SCAN_PAGE = 100
POLL_S = 1.0


class DecommissionRefusedError(DlogError):
    """Retiring the bookie would leave ledgers in use without enough bookies."""

    code = 554


class DecommissionTimeoutError(DlogError):
    """Ledgers still named the bookie when the deadline passed (the bookie was left in place)."""

    code = 555
    retryable = True


class UnknownBookieError(DlogError):
    code = 556


@dataclass(frozen=True, slots=True)
class Progress:
    remaining: int  # ledgers still naming the bookie
    seconds: float


async def ledgers_naming(client: BookKeeper, bookie: str, reads_per_s: float,
                         ids: list[int] | None = None) -> tuple[list[int], list[int]]:
    """(ledgers whose fragments name `bookie`, ensemble sizes they and every open ledger use).
    Scans every ledger, or only `ids`."""
    bucket = TokenBucket(reads_per_s)
    naming: list[int] = []
    sizes: list[int] = []

    async def visit(ledger_id: int) -> None:
        wait_s = bucket.take(1, client.clock.monotonic_s())
        if wait_s:
            await asyncio.sleep(wait_s)
        try:
            metadata, _ = await client.ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            return
        if bookie in bookies_named(metadata):
            naming.append(ledger_id)
            sizes.append(metadata.ensemble_size)
        elif metadata.state is not LedgerState.CLOSED:
            sizes.append(metadata.ensemble_size)

    if ids is not None:
        for ledger_id in ids:
            await visit(ledger_id)
        return naming, sizes
    after = -1
    while page := await client.store.list_ledgers_page(after, SCAN_PAGE):
        for ledger_id in page:
            await visit(ledger_id)
        after = page[-1]
    return naming, sizes


async def decommission(client: BookKeeper, store: RecoveryStore, bookie: str, *,
                       set_read_only: Callable[[str], Awaitable[None]], timeout_s: float,
                       reads_per_s: float = 200.0,
                       on_progress: Callable[[Progress], None] = lambda progress: None) -> dict[str, object]:
    """Run the steps above; returns a summary. `set_read_only(admin_url)` asks the bookie."""
    clock = client.clock
    started = clock.monotonic_s()
    registered = {info.bookie_id: info for info in await client.store.bookies()}
    if bookie not in registered and bookie not in await store.cookie_bookies():
        known = ", ".join(sorted(set(registered) | await store.cookie_bookies())) or "none"
        raise UnknownBookieError(f"no bookie {bookie!r} is registered or has a cookie (known: {known})")
    naming, sizes = await ledgers_naming(client, bookie, reads_per_s)
    writable = [bookie_id for bookie_id, info in registered.items() if info.writable]
    refusal = decommission_refusal(bookie, writable, sizes)
    if refusal is not None:
        raise DecommissionRefusedError(refusal)
    info = registered.get(bookie)
    if info is not None and info.http:
        await set_read_only(info.http)
    log.info("decommissioning %s: %d ledgers name it", bookie, len(naming))
    ledgers_total = len(naming)
    while True:
        for ledger_id in naming:
            await store.mark(ledger_id, [Missing(bookie, Reason.DECOMMISSION, wall_ms())], wall_ms())
        while naming:
            on_progress(Progress(len(naming), clock.monotonic_s() - started))
            if clock.monotonic_s() - started > timeout_s:
                raise DecommissionTimeoutError(
                    f"{len(naming)} ledgers still name {bookie} after {timeout_s:.0f} s "
                    f"({', '.join(map(str, naming[:20]))}{' ...' if len(naming) > 20 else ''}); "
                    "is auto-recovery enabled and running (`dlog autorecovery status`)? Run the "
                    "command again to go on waiting")
            await asyncio.sleep(POLL_S)
            naming, _ = await ledgers_naming(client, bookie, reads_per_s, naming)
        naming, _ = await ledgers_naming(client, bookie, reads_per_s)  # anything placed meanwhile
        if not naming:
            break
        ledgers_total += len(naming)
    on_progress(Progress(0, clock.monotonic_s() - started))
    await _retire(store, bookie)
    return {"bookie": bookie, "ledgers": ledgers_total, "seconds": round(clock.monotonic_s() - started, 1)}


async def _retire(store: RecoveryStore, bookie: str) -> None:
    for path in (layout.cookie_path(store.root, bookie), layout.bookie_path(store.root, bookie)):
        try:
            await store.zk.delete(path)
        except MetadataNotFoundError:
            pass
    log.info("decommissioned %s: cookie and registration removed", bookie)
