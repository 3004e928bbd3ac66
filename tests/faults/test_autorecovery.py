"""Auto-recovery under a running writer (R1-R3): a disk lost for good comes back to full
replication by itself, a flipped replica is found by the replica check and written back, and a
bookie is decommissioned under load (or refused when an ensemble still needs it); each run ends
with the history checked, including that every entry is on every member of its write set."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from bookkeeper.autorecovery.policy import bookies_named
from bookkeeper.autorecovery.store import RecoveryStore
from bookkeeper.meta import layout
from tests.harness.faults.faults import Nemesis, flip_entry_log_bytes
from tests.harness.faults.workload import Settings, Workload
from tests.helpers import eventually

pytestmark = [pytest.mark.faults, pytest.mark.timeout(240)]

SESSION_S = 4  # a killed bookie's registration is gone after this
BOOKIE_ARGS = ["--zk-session-timeout", str(SESSION_S), "--lost-bookie-recovery-delay", "1s",
               "--open-ledger-grace", "5s", "--checkpoint-interval", "1"]
SETTINGS = Settings(writes_max=8000, replication_timeout_s=90)
REPAIR_BOUND_S = 60  # from the loss to full replication, on a busy 2-core machine


async def ledgers_naming(workload: Workload, bookie: str) -> list[int]:
    client = workload.control.client
    named = []
    for ledger_id in await client.list_ledgers():
        metadata, _ = await client.ledger_metadata(ledger_id)
        if bookie in bookies_named(metadata):
            named.append(ledger_id)
    return named


async def fully_replicated_without(workload: Workload, store: RecoveryStore, bookie: str) -> bool:
    return not await ledgers_naming(workload, bookie) and await store.count_marks() == 0


def dlog(cluster, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlog_tools.cli", *arguments, "--zk", cluster.zk_address,
                           "--zk-root", cluster.zk_root], capture_output=True, text=True, timeout=120)


async def test_a_lost_disk_is_re_replicated_then_a_bookie_is_decommissioned_under_load(local_cluster, history):
    cluster = local_cluster(bookies=4, bookie_args=BOOKIE_ARGS)
    nemesis = Nemesis(cluster, history)
    workload = await Workload(cluster, history, SETTINGS).start()
    store = RecoveryStore(workload.control.zk, cluster.zk_root)
    await workload.wait_acked(700)  # a few completed segments, and one in progress
    ensemble = await workload.current_ensemble()
    victim = nemesis.index_of(ensemble[0])
    assert await ledgers_naming(workload, ensemble[0])
    lost_at = time.monotonic()
    lost, new = await asyncio.to_thread(nemesis.lose_disk, victim)
    await workload.wait_acked(200)  # the writer changed ensemble and goes on
    await eventually(lambda: fully_replicated_without(workload, store, lost), REPAIR_BOUND_S,
                     interval_s=0.5, message=f"every ledger re-replicated away from {lost}")
    history.record("test", "repaired", seconds=round(time.monotonic() - lost_at, 1))

    # decommission a bookie of the writer's current ensemble while it writes
    retiring = (await workload.current_ensemble())[1]
    decommissioned = await asyncio.to_thread(dlog, cluster, "bookie", "decommission", retiring, "--json")
    assert decommissioned.returncode == 0, decommissioned.stderr
    assert json.loads(decommissioned.stdout)["bookie"] == retiring
    assert not await ledgers_naming(workload, retiring)
    assert not await workload.control.zk.exists(layout.cookie_path(cluster.zk_root, retiring))
    index = nemesis.index_of(retiring)
    await eventually(lambda: not cluster.bookies[index].running, 30, message="the retired bookie stops")
    assert not await workload.control.zk.exists(layout.bookie_path(cluster.zk_root, retiring))
    await workload.wait_acked(200)

    # three bookies left for E3 streams: retiring another is refused, and nothing changes
    other = (await workload.current_ensemble())[0]
    refused = await asyncio.to_thread(dlog, cluster, "bookie", "decommission", other)
    assert refused.returncode == 1 and "fewer than the ensemble size 3" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert await workload.control.zk.exists(layout.cookie_path(cluster.zk_root, other))

    await workload.heal("disk replaced, bookie retired")
    report = await workload.finish()
    assert report.ok, f"{report.summary()}\nhistory kept at {history.path}"
    check = [e for e in history.events if e["f"] == "check" and e["process"] == "replication"]
    assert check and check[-1]["type"] == "ok" and check[-1]["ledgers"] > 1


async def test_flipped_bytes_in_one_replica_are_found_by_the_replica_check_and_written_back(local_cluster, history):
    # the damaged bookie is back within the delay: nothing is lost, only one replica is bad
    args = [*BOOKIE_ARGS, "--lost-bookie-recovery-delay", "60s"]
    cluster = local_cluster(bookies=3, bookie_args=args)
    nemesis = Nemesis(cluster, history)
    workload = await Workload(cluster, history, SETTINGS).start()
    await workload.wait_acked(700)
    listing = await workload.control.store.segments(workload.settings.stream)
    completed = {s.ledger_id for s in listing.segments if s.state.value == "completed"}
    assert completed
    await asyncio.sleep(1.5)  # two checkpoints: the completed segments' entries are in entry logs
    nemesis.kill_bookie(0)
    damaged = flip_entry_log_bytes(cluster.bookies[0].data_dir, nemesis.rng, ledger_ids=completed)
    nemesis.note("flipped_bytes", bookie=0, records=damaged)
    assert damaged > 0
    await asyncio.to_thread(nemesis.restart_bookie, 0)
    store = RecoveryStore(workload.control.zk, cluster.zk_root)
    await store.trigger_audit(True, int(time.time() * 1000))
    bookie = cluster.bookies[0].bookie_id or cluster.bookies[0].address

    async def found_and_repaired() -> bool:
        state = (await store.audit_state()).get("replicas", {})
        return state.get("finished_ms", 0) > 0 and await store.count_marks() == 0

    await eventually(found_and_repaired, REPAIR_BOUND_S, interval_s=0.5,
                     message="replica check done and every mark repaired")
    rewritten = await asyncio.to_thread(_rewritten_total, cluster)
    assert rewritten >= 1, f"no bookie wrote a damaged replica back (bookie {bookie} had {damaged})"
    await workload.heal("replicas repaired")
    report = await workload.finish()
    assert report.ok, f"{report.summary()}\nhistory kept at {history.path}"


def _rewritten_total(cluster) -> float:
    import urllib.request

    total = 0.0
    for bookie in cluster.bookies:
        if not bookie.running or bookie.http is None:
            continue
        text = urllib.request.urlopen(bookie.http + "/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith("dlog_autorecovery_entries_rewritten_total "):
                total += float(line.split()[1])
    return total
