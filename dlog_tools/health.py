"""Cluster health from the shell: `dlog cluster check` and `dlog ping`.

`cluster_check` is BookKeeper's `simpletest`/`bookiesanity` for every bookie at once: for each
registered writable bookie it creates a ledger whose whole ensemble is that bookie (E=1, Qw=1,
Qa=1), appends a few entries, closes it, reads them back and compares, then deletes the ledger.
A bookie that failed a write would be replaced by an ensemble change, so the closed ledger's
ensembles are checked too: the entries must still be on that bookie. Read-only bookies refuse
writes by design and are only reported; a bookie with a cookie but no registration is down.

`ping` times round trips: ZooKeeper (an `exists` of the root, after the session is up) and each
registered bookie (GET_BOOKIE_INFO on one connection, after it is opened). It reports the
minimum and median of `count` round trips, as `ping` does, so one slow answer does not hide
the usual one.
"""

from __future__ import annotations

import asyncio
import os
import statistics
from typing import Any

from bookkeeper.clock import perf_s
from bookkeeper.errors import DlogError

CHECK_ENTRIES = 3
CHECK_ENTRY_BYTES = 1024
CHECK_TIMEOUT_S = 30.0  # per bookie, for its whole write-read-delete
BOOKIE_CONNECT_TIMEOUT_S = 5.0


async def cluster_check(client: Any, zk: Any, root: str, entries: int = CHECK_ENTRIES) -> list[dict[str, Any]]:
    """One row per bookie: its state and whether a write and read-back through it worked."""
    from bookkeeper.bookie.registration import list_bookies_and_down

    bookies = await list_bookies_and_down(zk, root)
    return list(await asyncio.gather(*(_check_bookie(client, info, entries) for info in bookies)))


async def _check_bookie(client: Any, info: dict[str, Any], entries: int) -> dict[str, Any]:
    row = {"bookie": info.get("id"), "address": info.get("address"), "state": info.get("state"),
           "write": None, "read": None, "write_ms": None, "read_ms": None, "ok": False, "note": None}
    if info.get("state") == "down":
        row["note"] = "down: it has a cookie but is not registered (stopped, crashed or cut off)"
        return row
    if info.get("state") != "writable":
        row["ok"] = True  # a read-only bookie refusing writes is what it should do
        row["note"] = "read-only: it refuses writes by design, so it was not written to"
        return row
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            await _write_and_read(client, str(info.get("id")), entries, row)
    except (TimeoutError, DlogError) as exc:
        row["note"] = f"{'timed out' if isinstance(exc, asyncio.TimeoutError) else exc}"
    row["ok"] = row["write"] == "ok" and row["read"] == "ok"
    return row


async def _write_and_read(client: Any, bookie_id: str, entries: int, row: dict[str, Any]) -> None:
    password = os.urandom(8).hex().encode()
    payloads = [os.urandom(CHECK_ENTRY_BYTES) for _ in range(entries)]
    started = perf_s()
    handle = await client.create_ledger(1, 1, 1, password=password, bookies=[bookie_id],
                                        custom={"purpose": "dlog cluster check"})
    closed = False
    try:
        for payload in payloads:
            await handle.append(payload)
        await handle.close()
        closed = True
        row["write_ms"] = round((perf_s() - started) * 1000, 1)
        ensembles = {bookie for _, ensemble in handle.metadata.ensembles for bookie in ensemble}
        if ensembles != {bookie_id}:
            row["write"] = "failed"
            row["note"] = f"its writes went to {', '.join(sorted(ensembles - {bookie_id}))} instead"
            return
        row["write"] = "ok"
        started = perf_s()
        reader = await client.open_ledger(handle.ledger_id, password=password, recovery=False)
        read = [entry.payload for entry in await reader.read(0, entries - 1)]
        row["read_ms"] = round((perf_s() - started) * 1000, 1)
        row["read"] = "ok" if read == payloads else "different bytes"
    finally:
        if not closed:
            handle.stop_ticking()  # a failed write leaves the handle open: nothing may outlive the check
        await client.delete_ledger(handle.ledger_id)


async def ping(zk_hosts: str, root: str, count: int, timeout_s: float) -> dict[str, Any]:
    """Round trips to ZooKeeper and to every registered bookie (see the module doc)."""
    from bookkeeper.bookie.registration import list_bookies
    from bookkeeper.client.bookkeeper import connect_security
    from bookkeeper.meta.acl import zk_options
    from bookkeeper.meta.zk import AsyncZooKeeper, refuse_unreachable
    from bookkeeper.security.settings import load_client_settings

    settings = load_client_settings()  # client.toml: a secure cluster's bookies need TLS and AUTH
    await refuse_unreachable(zk_hosts)
    zk = AsyncZooKeeper(zk_hosts, timeout_s=timeout_s, **zk_options(settings, root))
    started = perf_s()
    await zk.start()
    try:
        session_ms = (perf_s() - started) * 1000
        zk_trips = [await _timed(zk.exists(root)) for _ in range(count)]
        bookies = await list_bookies(zk, root)
    finally:
        await zk.close()
    security = connect_security(settings)
    results = await asyncio.gather(*(_ping_bookie(info, count, security) for info in bookies))
    return {"zookeeper": {"address": zk_hosts, "session_ms": round(session_ms, 2), **_summary(zk_trips)},
            "bookies": list(results)}


async def _ping_bookie(info: dict[str, Any], count: int, security: Any) -> dict[str, Any]:
    from bookkeeper.client.connection import BookieConnection

    row: dict[str, Any] = {"bookie": info.get("id"), "address": info.get("address"), "state": info.get("state")}
    try:
        started = perf_s()
        connection = await BookieConnection.open(str(info.get("address")), connect_timeout_s=BOOKIE_CONNECT_TIMEOUT_S,
                                                 security=security)
        row["connect_ms"] = round((perf_s() - started) * 1000, 2)
        try:
            trips = [await _timed(connection.info(), BOOKIE_CONNECT_TIMEOUT_S) for _ in range(count)]
        finally:
            await connection.close()
    except (TimeoutError, DlogError) as exc:
        return {**row, "error": str(exc) or "timed out"}
    return {**row, **_summary(trips), "error": None}


async def _timed(awaitable: Any, timeout_s: float | None = None) -> float:
    started = perf_s()
    async with asyncio.timeout(timeout_s):
        await awaitable
    return (perf_s() - started) * 1000


def _summary(trips_ms: list[float]) -> dict[str, Any]:
    return {"count": len(trips_ms), "min_ms": round(min(trips_ms), 3),
            "median_ms": round(statistics.median(trips_ms), 3), "max_ms": round(max(trips_ms), 3)}
