"""Auto-recovery's ZooKeeper state on a real ZooKeeper: paged id scans skip what they have seen,
marks merge by compare-and-set, ledger locks exclude, the switch and the trigger are watched, and
the election (kazoo's Lock recipe) has exactly one leader that hands over when it leaves."""

from __future__ import annotations

import asyncio

import pytest

from bookkeeper.autorecovery.policy import Missing, Reason
from bookkeeper.autorecovery.store import RecoveryStore
from bookkeeper.errors import MetadataError, MetadataVersionError
from bookkeeper.meta import layout
from bookkeeper.meta.zk import AsyncZooKeeper
from bookkeeper.meta.zkstore import ZooKeeperMetadataStore, ledger_ids_page
from tests.helpers import eventually

IDS = [0, 1, 2, 9_999, 10_000, 123_456_789_012, 2**63 - 1]


async def test_paged_scans_return_every_id_once_in_order(zk, zk_root):
    base = f"{zk_root}/ids"
    for ledger_id in IDS:
        await zk.create(f"{base}/{layout.split_ledger_id(ledger_id)}", b"", makepath=True)
    await zk.create(f"{base}/junk", b"", makepath=True)  # not part of the layout: skipped
    for limit in (1, 2, 3, 100):
        seen, after = [], -1
        while page := await ledger_ids_page(zk, base, after, limit):
            assert len(page) <= limit
            seen += page
            after = page[-1]
        assert seen == IDS, limit
    assert await ledger_ids_page(zk, base, 10_000, 10) == IDS[5:]
    assert await ledger_ids_page(zk, f"{zk_root}/nothing", -1, 10) == []
    store = ZooKeeperMetadataStore(zk, zk_root)
    assert await store.list_ledgers_page(-1, 5) == []


async def test_marks_merge_unmark_only_what_was_repaired_and_wake_workers(zk, zk_root):
    store = RecoveryStore(zk, zk_root)
    await store.ensure_layout()
    woken: list[int] = []
    stop = store.watch_marks(lambda: woken.append(1))
    await eventually(lambda: woken)  # the watch reports once when armed
    woken.clear()
    assert await store.mark(7, [Missing("b1", Reason.LOST, 100)], 100)
    assert not await store.mark(7, [Missing("b1", Reason.DAMAGED, 200)], 200)  # already named
    assert await store.mark(7, [Missing("b2", Reason.DECOMMISSION, 300)], 300)
    assert await store.mark(12, [Missing("b1", Reason.LOST, 400)], 400)
    await eventually(lambda: woken)
    mark, version = await store.read_mark(7)
    assert [(m.bookie, m.reason, m.since_ms) for m in mark.missing] == [
        ("b1", Reason.LOST, 100), ("b2", Reason.DECOMMISSION, 300)]
    assert await store.count_marks() == 2 and [m.ledger_id for m in await store.marks()] == [7, 12]
    # a worker recorded its replacement; the auditor then adds a bookie: the worker's unmark of
    # the version it repaired must fail, so the new bookie is not forgotten
    version = await store.write_mark(mark.with_target(0, "b1", "b9"), version)
    await store.mark(7, [Missing("b3", Reason.LOST, 500)], 500)
    with pytest.raises(MetadataVersionError):
        await store.unmark(7, version)
    mark, version = await store.read_mark(7)
    assert mark.target_for(0, "b1") == "b9" and mark.bookies == ["b1", "b2", "b3"]
    await store.unmark(7, version)
    await store.unmark(7, version)  # gone already: fine
    assert await store.read_mark(7) is None and await store.count_marks() == 1
    stop()


async def test_a_ledger_lock_excludes_and_goes_with_the_session(zk, zk_server, zk_root):
    store = RecoveryStore(zk, zk_root)
    other_client = AsyncZooKeeper(zk_server.address)
    await other_client.start()
    other = RecoveryStore(other_client, zk_root)
    try:
        assert await store.try_lock(5, "worker-a")
        assert not await other.try_lock(5, "worker-b")
        assert await store.locks() == {5: "worker-a"}
        await store.unlock(5)
        assert await other.try_lock(5, "worker-b")
    finally:
        await other_client.close()  # its session ends: its ephemeral lock with it
    assert await store.try_lock(5, "worker-a")


async def test_the_switch_and_the_trigger_are_watched(zk, zk_root):
    store = RecoveryStore(zk, zk_root)
    states: list[bool] = []
    triggers: list[object] = []
    stop_enabled = store.watch_enabled(states.append)
    stop_trigger = store.watch_trigger(triggers.append)
    await eventually(lambda: states == [True])
    await store.set_enabled(False)
    await store.set_enabled(False)  # twice: still just disabled
    assert not await store.enabled()
    await eventually(lambda: states == [True, False])
    await store.set_enabled(True)
    await eventually(lambda: states == [True, False, True])
    await store.trigger_audit(True, 123)
    await eventually(lambda: {"requested_ms": 123, "replica_check": True} in triggers)
    stop_enabled()
    stop_trigger()


async def test_one_auditor_at_a_time_and_the_next_takes_over(zk, zk_server, zk_root):
    clients = [AsyncZooKeeper(zk_server.address) for _ in range(2)]
    for client in clients:
        await client.start()
    try:
        first, second = (RecoveryStore(c, zk_root).election(f"auditor-{i}") for i, c in enumerate(clients))
        await asyncio.wait_for(first.wait_elected(), 10)
        waiting = asyncio.ensure_future(second.wait_elected())
        await eventually(lambda: RecoveryStore(zk, zk_root).auditor(), 10)
        assert await RecoveryStore(zk, zk_root).auditor() == "auditor-0"
        assert await first.contenders() == ["auditor-0", "auditor-1"]
        await asyncio.sleep(0.2)
        assert not waiting.done() and await first.still_held()
        await clients[0].close()  # the leader's session ends
        await asyncio.wait_for(waiting, 20)
        assert await second.still_held() and await RecoveryStore(zk, zk_root).auditor() == "auditor-1"
        await second.cancel()
        assert await RecoveryStore(zk, zk_root).auditor() is None
    finally:
        for client in clients:
            await client.close()


async def test_the_auditor_leads_on_through_zookeeper_restarts(tmp_path):
    """Its session survives a restart: the auditor must go on with its own election node, not queue
    behind it (found by the soak: no auditor, no replica checks, for the rest of the run)."""
    from bookkeeper.autorecovery.service import AutoRecovery
    from bookkeeper.autorecovery.settings import RecoverySettings
    from bookkeeper.meta.zkserver import EmbeddedZooKeeper

    server = EmbeddedZooKeeper(tmp_path / "zk")
    server.start()
    client = AsyncZooKeeper(server.address, session_timeout_s=10)
    recovery = None
    try:
        await client.start()
        recovery = await AutoRecovery(client, "/ar", RecoverySettings(workers=False), "a1").start()
        store = recovery.store
        await eventually(lambda: recovery.auditor.leading, 20)
        for restart in range(2):
            await asyncio.to_thread(server.restart)
            await eventually(lambda: client.connected, 20)
            asked_ms = 10**12 + restart  # later than any wall-clock trigger handled before
            await eventually(lambda: _trigger(store, asked_ms), 20, interval_s=0.2)

            async def answered() -> bool:
                finished = (await store.audit_state()).get("ensembles", {}).get("finished_ms", 0)
                return (await store.audit_state()).get("trigger_handled_ms") == asked_ms and finished > 0

            await eventually(answered, 30, message="the auditor answered a trigger after the restart")
            assert await store.election("probe").contenders() == ["a1"]  # one node: its own, leading
            assert recovery.auditor.leading
    finally:
        if recovery is not None:
            await recovery.stop()
        await client.close()
        server.stop()


async def _trigger(store: RecoveryStore, asked_ms: int) -> bool:
    try:
        await store.trigger_audit(False, asked_ms)
    except MetadataError:
        return False
    return True
