"""`dlog bench recovery`: how fast a lost disk comes back to full replication, and what that costs
a concurrent writer (RELIABILITY.md R3), on four bookie processes at E3/Qw2/Qa2.

    1. fill ledgers until one bookie (the victim) holds `size_bytes` of entries;
    2. a writer appends at `writer_rate` for `writer_seconds`: its latency without recovery;
    3. kill -9 the victim, wipe its directory and start an empty bookie in its place (a new id);
    4. once the victim's registration is gone (its ZooKeeper session expires), the same writer runs
       on a new ledger while auto-recovery (in every bookie, delay 0) re-replicates everything the
       victim held, until no ledger names it and nothing is marked;
    5. figures: the bytes and entries copied (the bookies' own counters) over the recovery time, the
       time from the loss to full replication, and the writer's percentiles in both runs.
Measured, never asserted.
"""

from __future__ import annotations

import asyncio
import shutil
from typing import TYPE_CHECKING, Any, cast

from bookkeeper.autorecovery.policy import bookies_named
from bookkeeper.autorecovery.store import RecoveryStore
from bookkeeper.client import BookKeeper
from bookkeeper.clock import monotonic_s, perf_s
from bookkeeper.errors import DlogError
from bookkeeper.protocol.quorum import write_set
from dlog_tools.bench.common import PASSWORD, bookie_args, event_payload, local_cluster, percentiles
from dlog_tools.cluster import LocalCluster

if TYPE_CHECKING:
    from bookkeeper.meta.zkstore import ZooKeeperMetadataStore

BOOKIES = 4
SESSION_S = 4
LEDGER_BYTES_MAX = 64 * 2**20  # a data ledger is closed at this size and the next one begun
FILL_IN_FLIGHT = 256
WRITER_IN_FLIGHT_MAX = 1000
WRITER_ENTRY_BYTES = 1024
RECOVERY_TIMEOUT_S = 3600.0
POLL_S = 0.25


def bench_recovery(size_bytes: int, entry_bytes: int, writer_rate: int, writer_seconds: float, *,
                   fsync: bool = True, rereplication_rate: int = 10_000,
                   rereplication_bandwidth: int = 64 * 2**20) -> dict[str, Any]:
    args = [*bookie_args(fsync), "--zk-session-timeout", str(SESSION_S), "--lost-bookie-recovery-delay",
            "0", "--rereplication-rate", str(rereplication_rate), "--rereplication-bandwidth",
            str(rereplication_bandwidth)]
    with local_cluster(BOOKIES, args) as cluster:
        result = asyncio.run(_run(cluster, size_bytes, entry_bytes, writer_rate, writer_seconds))
    return {"mode": "recovery", "fsync": fsync, "bookies": BOOKIES, "quorum": "E3/Qw2/Qa2",
            "rereplication_rate": rereplication_rate, "rereplication_bandwidth": rereplication_bandwidth,
            **result}


async def _run(cluster: LocalCluster, size_bytes: int, entry_bytes: int, writer_rate: int,
               writer_seconds: float) -> dict[str, Any]:
    victim = cluster.bookies[0].bookie_id or cluster.bookies[0].address
    async with BookKeeper(zk=cluster.zk_address, root=cluster.zk_root) as client:
        ledgers, held_entries, held_bytes = await _fill(client, victim, size_bytes, entry_bytes)
        baseline = await _writer(client, writer_rate, writer_seconds)
        copied_before = await asyncio.to_thread(_copied, cluster)
        lost_at = monotonic_s()
        cluster.kill_bookie(0)
        shutil.rmtree(cluster.bookies[0].data_dir)
        await asyncio.to_thread(cluster.replace_bookie, 0)
        while victim in {info.bookie_id for info in await client.store.bookies()}:
            await asyncio.sleep(POLL_S)
        detected_at = monotonic_s()
        stop = asyncio.Event()
        during = asyncio.ensure_future(_writer(client, writer_rate, RECOVERY_TIMEOUT_S, stop))
        try:
            zk = cast("ZooKeeperMetadataStore", client.store).zk  # BookKeeper's store when started without one
            await _until_replicated(client, RecoveryStore(zk, cluster.zk_root), ledgers, victim)
        finally:
            stop.set()
        done_at = monotonic_s()
        during_run = await during
    copied_after = await asyncio.to_thread(_copied, cluster)
    copied = [after - before for after, before in zip(copied_after, copied_before, strict=True)]
    recovery_s = max(done_at - detected_at, 1e-6)
    return {"victim_entries": held_entries, "victim_bytes": held_bytes, "data_ledgers": len(ledgers),
            "entries_copied": int(copied[0]), "bytes_copied": int(copied[1]),
            "detect_s": round(detected_at - lost_at, 2), "recovery_s": round(recovery_s, 2),
            "loss_to_full_replication_s": round(done_at - lost_at, 2),
            "mb_per_s": round(copied[1] / recovery_s / 1e6, 2),
            "entries_per_s": round(copied[0] / recovery_s),
            "writer_p99_ratio": round(during_run["p99_ms"] / max(baseline["p99_ms"], 1e-6), 2),
            "runs": [{"run": "writer without recovery", **baseline},
                     {"run": "writer during recovery", **during_run}]}


async def _fill(client: BookKeeper, victim: str, size_bytes: int,
                entry_bytes: int) -> tuple[list[int], int, int]:
    """Ledgers until the victim holds `size_bytes` of entry payloads; returns (ledgers, entries and
    bytes the victim holds)."""
    ledgers: list[int] = []
    held_entries = held_bytes = 0
    payload = event_payload(0, entry_bytes)
    while held_bytes < size_bytes:
        handle = await client.create_ledger(3, 2, 2, password=PASSWORD)
        ledgers.append(handle.ledger_id)
        ensemble = handle.metadata.last_ensemble[1]
        position = ensemble.index(victim) if victim in ensemble else -1
        pending: set[asyncio.Future[int]] = set()
        written = 0
        while written < LEDGER_BYTES_MAX and held_bytes < size_bytes:
            if len(pending) >= FILL_IN_FLIGHT:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            entry_id = handle.machine.next_entry_id
            pending.add(handle.append_async(payload))
            written += entry_bytes
            if position in write_set(entry_id, 3, 2):
                held_entries += 1
                held_bytes += entry_bytes
        await asyncio.gather(*pending)
        await handle.close()
    return ledgers, held_entries, held_bytes


async def _writer(client: BookKeeper, rate: int, seconds: float,
                  stop: asyncio.Event | None = None) -> dict[str, Any]:
    """Appends offered at `rate` per second (open loop) to a new ledger; their latencies."""
    handle = await client.create_ledger(3, 2, 2, password=PASSWORD)
    payload = event_payload(1, WRITER_ENTRY_BYTES)
    latencies: list[float] = []
    pending: set[asyncio.Future[Any]] = set()
    started = monotonic_s()
    sent = 0
    while monotonic_s() - started < seconds and not (stop is not None and stop.is_set()):
        due = started + sent / rate
        if due > monotonic_s():
            await asyncio.sleep(due - monotonic_s())
        if len(pending) >= WRITER_IN_FLIGHT_MAX:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        pending.add(asyncio.ensure_future(_timed(handle.append_async(payload), latencies)))
        sent += 1
    await asyncio.gather(*pending)
    await handle.close()
    return {"appends": len(latencies), "rate": rate, **percentiles(latencies or [0.0])}


async def _timed(future: asyncio.Future[int], latencies: list[float]) -> None:
    started = perf_s()
    await future
    latencies.append(perf_s() - started)


async def _until_replicated(client: BookKeeper, store: RecoveryStore, ledgers: list[int], victim: str) -> None:
    deadline = monotonic_s() + RECOVERY_TIMEOUT_S
    remaining = list(ledgers)
    while monotonic_s() < deadline:
        await asyncio.sleep(POLL_S)
        try:
            if await store.count_marks():
                continue
            remaining = [ledger_id for ledger_id in remaining
                         if victim in bookies_named((await client.ledger_metadata(ledger_id))[0])]
        except DlogError:
            continue
        if not remaining:
            return
    raise DlogError(f"{len(remaining)} ledgers still name {victim} after {RECOVERY_TIMEOUT_S:.0f} s")


def _copied(cluster: LocalCluster) -> tuple[float, float]:
    """Entries and bytes every live bookie says it copied (re-replication counters)."""
    import urllib.request

    entries = size = 0.0
    for bookie in cluster.bookies:
        if not bookie.running or bookie.http is None:
            continue
        text = urllib.request.urlopen(bookie.http + "/metrics", timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith("dlog_autorecovery_entries_copied_total "):
                entries += float(line.split()[1])
            elif line.startswith("dlog_autorecovery_bytes_copied_total "):
                size += float(line.split()[1])
    return entries, size
