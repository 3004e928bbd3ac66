"""Each fault of RELIABILITY.md's list, on real processes: write under load, inject the fault, heal,
read everything back with a fresh reader, and check the whole history (tests/harness/history)."""

from __future__ import annotations

import asyncio
import random
import shutil
import signal
import time

import aiohttp
import pytest

from bookkeeper.meta.zkensemble import ZooKeeperEnsemble
from bookkeeper.protocol.metadata import LedgerState
from dlog import WriterFencedError
from tests.harness.faults.faults import (
    CapabilityMissing,
    Nemesis,
    TmpfsDisk,
    damage_journal_tail,
    entry_log_records,
    flip_entry_log_bytes,
)
from tests.harness.faults.network import NetnsCluster, NetnsLab, netem_missing
from tests.harness.faults.workload import Settings, Workload, WriterProcess
from tests.helpers import eventually
from dlog_tools.cluster import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

SETTINGS = Settings(writes_max=6000)


async def check(workload: Workload, *, check_resume: bool = True) -> None:
    report = await workload.finish(check_resume=check_resume)
    assert report.ok, f"{report.summary()}\nhistory kept at {workload.history.path}"
    assert report.stats["ok"] > 0 and report.stats["final"] >= report.stats["ok"] - _removed_at_most(workload)


def _removed_at_most(workload: Workload) -> int:
    removed = [e for e in workload.history.events if e["f"] in ("removed", "truncated")
               or (e["f"] == "fault" and e.get("kind") == "delete_ledger")]
    return 10**9 if removed else 0


def ensemble_index(nemesis: Nemesis, ensemble: tuple[str, ...], position: int) -> int:
    return nemesis.index_of(ensemble[position])


async def bookie_state(cluster, index: int) -> str:
    """The bookie's own view of its state (its admin endpoint), or "down"."""
    bookie = cluster.bookies[index]
    if not bookie.running or bookie.http is None:
        return "down"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{bookie.http}/api/v1/bookie/state") as response:
                return (await response.json())["state"]
    except aiohttp.ClientError:
        return "down"


# ---------------------------------------------------------------------------------- bookies


async def test_kill_9_of_a_bookie_during_writes(local_cluster, history):
    cluster = local_cluster(bookies=4)
    nemesis = Nemesis(cluster, history)
    workload = await Workload(cluster, history, SETTINGS).start()
    await workload.wait_acked(300)
    victim = ensemble_index(nemesis, await workload.current_ensemble(), 0)
    nemesis.kill_bookie(victim)
    await workload.wait_acked(500)  # an ensemble change keeps the writer going (A9)
    nemesis.restart_bookie(victim)
    await workload.heal("bookie restarted")
    await check(workload)


async def test_kill_9_of_ack_quorum_bookies_at_once_then_restart(local_cluster, history):
    """Both bookies of a write set die together: writes stop (too few bookies for an ensemble),
    and after the restart every acknowledged record is still there (A2, A3)."""
    cluster = local_cluster(bookies=4)
    nemesis = Nemesis(cluster, history)
    workload = await Workload(cluster, history, SETTINGS).start()
    await workload.wait_acked(400)
    ensemble = await workload.current_ensemble()
    victims = [ensemble_index(nemesis, ensemble, 0), ensemble_index(nemesis, ensemble, 1)]
    for victim in victims:
        nemesis.kill_bookie(victim)
    await asyncio.sleep(3.0)  # the fault lasts a while: adds time out, the writer breaks
    for victim in victims:
        nemesis.restart_bookie(victim)
    await workload.heal("both bookies restarted")
    await check(workload)


async def test_paused_bookie_during_recovery(local_cluster, history):
    """The writer dies while a bookie of its ensemble is stopped (SIGSTOP): the new writer's
    recovery must not wait on the hung bookie (A8)."""
    cluster = local_cluster(bookies=4)
    nemesis = Nemesis(cluster, history)
    workload = await Workload(cluster, history, SETTINGS).start(writers=0)
    writer = WriterProcess(cluster, history, "p1", settings=SETTINGS)
    try:
        await writer.wait_acked(400)
        paused = ensemble_index(nemesis, await workload.current_ensemble(), 0)
        nemesis.pause_bookie(paused)
        writer.kill()
        started = time.monotonic()
        second = workload.add_writer("w1")
        await eventually(second.opened.is_set, 40, message="the new writer recovered the stream")
        recovery_s = time.monotonic() - started
        await workload.wait_acked(300)
        nemesis.resume_bookie(paused)
        await workload.heal("bookie resumed")
        await check(workload)
        assert recovery_s < 30, f"recovery waited {recovery_s:.1f} s on a stopped bookie"
    finally:
        writer.close()


async def test_bookie_killed_during_recovery_write_back(local_cluster, history):
    """kill -9 of a bookie of the ledger being recovered, as soon as recovery has begun."""
    cluster = local_cluster(bookies=4)
    nemesis = Nemesis(cluster, history)
    settings = Settings(writes_max=6000, write_interval_s=0.0005, in_flight_max=400)
    workload = await Workload(cluster, history, settings).start(writers=0)
    writer = WriterProcess(cluster, history, "p1", settings=settings, interval_s=0.0)
    try:
        await writer.wait_acked(600)
        writer.kill()
        ledger_id = await workload.current_ledger()  # the dead writer's segment: to be recovered
        assert workload.control is not None
        client = workload.control.client
        second = workload.add_writer("w1")

        async def in_recovery() -> bool:
            metadata, _ = await client.ledger_metadata(ledger_id)
            return metadata.state is not LedgerState.OPEN

        await eventually(in_recovery, 30, interval_s=0.002, message=f"recovery of ledger {ledger_id} began")
        metadata, _ = await client.ledger_metadata(ledger_id)
        victim = ensemble_index(nemesis, metadata.last_ensemble[1], 0)
        nemesis.kill_bookie(victim)
        history.record("tester", "note", ledger_state_at_kill=metadata.state.value)
        await eventually(second.opened.is_set, 60, message="the new writer recovered the stream")
        await workload.wait_acked(300)
        nemesis.restart_bookie(victim)
        await workload.heal("bookie restarted")
        await check(workload)
    finally:
        writer.close()


# ---------------------------------------------------------------------------------- writers


async def test_kill_9_of_the_writer_then_a_second_writer_takes_over(local_cluster, history):
    cluster = local_cluster(bookies=3)
    workload = await Workload(cluster, history, SETTINGS).start(writers=0)
    writer = WriterProcess(cluster, history, "p1", settings=SETTINGS)
    try:
        await writer.wait_acked(500)
        writer.kill()
        workload.add_writer("w1")
        await workload.wait_acked(300)
        await workload.heal("writer replaced")
        await check(workload)
    finally:
        writer.close()


async def test_sigstop_of_a_writer_past_its_zookeeper_session_then_sigcont(local_cluster, history):
    """The stopped writer's session expires, so its lock goes and a new writer opens WITHOUT
    takeover; after SIGCONT nothing the old writer writes may succeed (L1: fencing, not the lock)."""
    cluster = local_cluster(bookies=4)
    workload = await Workload(cluster, history, SETTINGS).start(writers=0)
    writer = WriterProcess(cluster, history, "p1", settings=SETTINGS, session_timeout_s=2.0, reopen=False)
    try:
        await writer.wait_acked(400)
        writer.signal(signal.SIGSTOP)
        history.record("nemesis", "fault", kind="sigstop_writer")
        assert workload.control is not None
        lock_path = workload.control.store.lock_path(SETTINGS.stream)

        async def lock_free() -> bool:
            return not await workload.control.zk.children(lock_path)

        await eventually(lock_free, 30, message="the stopped writer's session expired and its lock went")
        second = workload.add_writer("w1", takeover=False)
        await eventually(second.opened.is_set, 30, message="a new writer took the free lock")
        await workload.wait_acked(300)
        writer.signal(signal.SIGCONT)
        history.record("nemesis", "resume", what="writer")
        assert await writer.wait_exit(30) == 0, "the old writer did not notice it was replaced"
        await workload.heal("old writer continued and was fenced")
        await check(workload)
    finally:
        writer.close()


async def test_a_second_writer_steals_a_live_stream(local_cluster, history):
    cluster = local_cluster(bookies=3)
    workload = await Workload(cluster, history, SETTINGS).start(writers=0)
    first = workload.add_writer("w1", reopen_on_fence=False)
    await workload.wait_acked(400)
    second = workload.add_writer("w2", reopen_on_fence=False)
    await eventually(second.opened.is_set, 30, message="the second writer took over")
    await eventually(lambda: first.writer is not None and first.writer.error is not None, 30,
                     message="the first writer learned it was fenced")
    assert isinstance(first.writer.error, WriterFencedError)
    await workload.wait_acked(300)
    await workload.heal("stream stolen")
    await check(workload)


async def test_two_concurrent_recoveries(local_cluster, history):
    """Two writers open the stream of a killed writer at the same moment: both recover the same
    in-progress segment; one segment list wins, and no acknowledged record is lost."""
    cluster = local_cluster(bookies=3)
    workload = await Workload(cluster, history, SETTINGS).start(writers=0)
    writer = WriterProcess(cluster, history, "p1", settings=SETTINGS)
    try:
        await writer.wait_acked(500)
        writer.kill()
        first = workload.add_writer("w1", reopen_on_fence=False)
        second = workload.add_writer("w2", reopen_on_fence=False)
        await eventually(lambda: first.opened.is_set() or second.opened.is_set(), 30,
                         message="a writer opened")
        await workload.wait_acked(300)
        await workload.heal("recoveries done")
        await check(workload)
        opens = [e for e in history.events if e["f"] == "open_writer" and e["process"].startswith(("w1", "w2"))]
        assert len([e for e in opens if e["type"] == "invoke"]) >= 2
    finally:
        writer.close()


# ---------------------------------------------------------------------------------- ZooKeeper


async def test_zookeeper_paused_during_an_ensemble_change(local_cluster, history):
    cluster = local_cluster(bookies=4, own_zk=True)
    nemesis = Nemesis(cluster, history)
    workload = await Workload(cluster, history, SETTINGS).start()
    await workload.wait_acked(300)
    victim = ensemble_index(nemesis, await workload.current_ensemble(), 0)
    nemesis.pause_zookeeper()
    try:
        nemesis.kill_bookie(victim)  # the ensemble change must write metadata: ZooKeeper is frozen
        await asyncio.sleep(4.0)  # the fault lasts: add timeout (2 s), then metadata retries
    finally:
        nemesis.resume_zookeeper()
    await workload.wait_acked(300)
    nemesis.restart_bookie(victim)
    await workload.heal("zookeeper resumed, bookie restarted")
    await check(workload)


async def test_zookeeper_restart_and_session_expiry(local_cluster, history):
    cluster = local_cluster(bookies=3, own_zk=True)
    nemesis = Nemesis(cluster, history)
    workload = await Workload(cluster, history, SETTINGS).start()
    await workload.wait_acked(300)
    nemesis.restart_zookeeper()
    await workload.wait_acked(300)
    writer = workload.writers["w1"]
    reader = workload.readers["r1"]
    assert writer.namespace is not None and reader.namespace is not None
    assert await nemesis.expire_session(writer.namespace.zk, "writer w1")
    assert await nemesis.expire_session(reader.namespace.zk, "reader r1")
    await workload.wait_acked(300)
    assert workload.control is not None
    await eventually(lambda: len(workload.control.client.writable_bookies()) == 3, 30,
                     message="every bookie registered again after the restart")
    await workload.heal("zookeeper back, sessions renewed")
    await check(workload)


async def test_the_zookeeper_leader_killed_in_a_three_server_ensemble(tmp_path, history):
    """kill -9 of the ZooKeeper leader, twice, under load: writers (rolling every 300 records) and
    tailing readers go on through each election; the old leader rejoins as a follower."""
    ensemble = ZooKeeperEnsemble(tmp_path / "zk")
    await asyncio.to_thread(ensemble.start)
    cluster = LocalCluster(tmp_path / "cluster", bookies=3, zk_root="/ensemble", zk_server=ensemble)  # type: ignore[arg-type]
    nemesis = Nemesis(cluster, history)
    try:
        await asyncio.to_thread(cluster.start)
        workload = await Workload(cluster, history, SETTINGS).start()
        await workload.wait_acked(300)
        for _ in range(2):
            leader = await asyncio.to_thread(ensemble.leader)
            nemesis.note("kill_zookeeper_leader", member=leader)
            await asyncio.to_thread(ensemble.kill, leader)
            await workload.wait_acked(300, timeout_s=60)  # through the election
            await asyncio.to_thread(ensemble.start_member, leader)
        await workload.heal("the old leader rejoined")
        await check(workload)
    finally:
        await asyncio.to_thread(cluster.stop)
        await asyncio.to_thread(ensemble.stop)


# ---------------------------------------------------------------------------------- disks


async def test_torn_and_junk_tailed_journals(local_cluster, history):
    cluster = local_cluster(bookies=4)
    nemesis = Nemesis(cluster, history)
    rng = random.Random(8)
    workload = await Workload(cluster, history, SETTINGS).start()
    await workload.wait_acked(400)
    for position, mode in ((0, "torn"), (1, "junk")):
        victim = ensemble_index(nemesis, await workload.current_ensemble(), position)
        nemesis.kill_bookie(victim)
        damage = damage_journal_tail(cluster.bookies[victim].data_dir, mode, rng)
        nemesis.note(f"{mode}_journal", bookie=victim, **damage)
        assert damage["records"] > 0, damage
        nemesis.restart_bookie(victim)  # must start: a damaged tail ends replay, it is no error
        await workload.wait_acked(300)
    await workload.heal("bookies restarted")
    await check(workload)


async def test_full_disk(local_cluster, history):
    cluster = local_cluster(bookies=4, start=False,
                            bookie_args=["--disk-check-interval", "0.2", "--disk-threshold", "0.9",
                                         "--disk-lwm", "0.8"])
    disk = TmpfsDisk(cluster.bookies[0].data_dir, 64 * 2**20)
    try:
        disk.mount()
    except CapabilityMissing as exc:
        pytest.skip(str(exc))
    nemesis = Nemesis(cluster, history)
    try:
        cluster.start()
        workload = await Workload(cluster, history, SETTINGS).start()
        await workload.wait_acked(300)
        filled = disk.fill(leave_bytes=128 * 1024)
        nemesis.note("full_disk", bookie=0, filler_bytes=filled)
        async def noticed() -> bool:
            return await bookie_state(cluster, 0) in ("read_only", "down")

        await eventually(noticed, 20,
                         message="the bookie noticed its full disk (read-only, or stopped by a failed journal)")
        await workload.wait_acked(500)  # the other bookies carry the writes
        disk.unfill()
        history.record("nemesis", "resume", what="disk freed")
        if not cluster.bookies[0].running:  # a journal that hit ENOSPC stops its bookie
            nemesis.restart_bookie(0)
        async def writable() -> bool:
            return await bookie_state(cluster, 0) == "writable"

        await eventually(writable, 30, message="the bookie is writable again once the disk has room")
        await workload.heal("disk freed")
        await check(workload)
    finally:
        cluster.stop_bookie(0)
        log = cluster.bookies[0].data_dir / "bookie.log"
        if log.exists():  # the tmpfs goes with the unmount; keep its bookie's log
            shutil.copy(log, history.path.with_name("bookie-0-on-tmpfs.log"))
        disk.unmount()


async def test_flipped_bytes_in_one_replica(local_cluster, history):
    cluster = local_cluster(bookies=4, bookie_args=["--checkpoint-interval", "0.3"])
    nemesis = Nemesis(cluster, history)
    workload = await Workload(cluster, history, SETTINGS).start()
    await workload.wait_acked(1000)
    victim = ensemble_index(nemesis, await workload.current_ensemble(), 0)
    logs = cluster.bookies[victim].data_dir / "ledgers" / "entrylogs"
    await eventually(lambda: any(entry_log_records(path) for path in logs.glob("*.log")), 30,
                     message="a checkpoint moved entries into the victim's entry logs")
    nemesis.kill_bookie(victim)
    damaged = flip_entry_log_bytes(cluster.bookies[victim].data_dir, random.Random(12))
    nemesis.note("flipped_bytes", bookie=victim, records=damaged)
    assert damaged > 0
    nemesis.restart_bookie(victim)
    await workload.wait_acked(300)
    await workload.heal("bookie restarted with damaged entry logs")
    await check(workload)  # every read of a damaged copy fell back to a good one (A12 digests)


# ---------------------------------------------------------------------------------- data removal


async def test_deleting_a_ledger_under_a_live_writer(local_cluster, history):
    """An operator deletes the ledger the writer is appending to (`dlog ledger delete --force`), and
    GC reclaims it. The writer fails at once, naming the ledger (issue 20: it used to go on, bookies
    acknowledging adds to the deleted ledger, and close as if nothing happened): the checker counts a
    record acknowledged into that ledger as lost unless its writer said so, and always when it was
    acknowledged well after the deletion. The next writer drops the segment of the deleted ledger and
    the stream goes on."""
    cluster = local_cluster(bookies=3, bookie_args=["--gc-interval", "0", "--gc-grace", "0"])
    # no roll before the deletion: with the default 300-record segments, the writer could roll between
    # reading its in-progress ledger and deleting it, which then deleted a completed segment's ledger
    settings = Settings(writes_max=6000, roll_records=100_000)
    workload = await Workload(cluster, history, settings).start()
    await workload.wait_acked(300)
    ledger_id = await workload.current_ledger()
    assert workload.control is not None
    namespace = workload.control
    history.record("nemesis", "fault", kind="delete_ledger", ledger=ledger_id)
    await namespace.client.delete_ledger(ledger_id)
    async with aiohttp.ClientSession() as session:
        for bookie in cluster.bookies:
            async with session.post(f"{bookie.http}/api/v1/gc") as response:
                assert response.status == 200
    await workload.wait_acked(600, timeout_s=15)  # a new writer took over, past the deleted ledger
    listing = await namespace.store.segments(settings.stream)
    assert listing.by_ledger(ledger_id) is None  # its in-progress segment was dropped: no hole
    await workload.heal("a new writer took over from the one whose ledger was deleted")
    await check(workload)


async def test_truncation_and_retention_under_a_lagging_reader(local_cluster, history):
    cluster = local_cluster(bookies=3)
    settings = Settings(writes_max=6000, roll_records=200)
    workload = await Workload(cluster, history, settings).start(writers=1, readers=1)
    lagging = workload.add_reader("lag", lag_s=0.01, subscription="lagging")
    await workload.wait_acked(1500)
    assert workload.control is not None
    namespace = workload.control
    cut = workload.writers["w1"].offsets[700]
    history.record("tester", "truncated", before=[cut.ledger_id, cut.entry_id, cut.slot])
    await namespace.truncate(settings.stream, before=cut)
    await workload.wait_acked(500)
    listing = await namespace.store.segments(settings.stream)
    subscribed = (await namespace.subscriptions(settings.stream)).get("lagging")
    await namespace.set_retention(settings.stream, size_bytes=1)  # keep as little as allowed
    removed = await namespace.apply_retention(settings.stream)
    history.record("tester", "removed", ledgers=[s.ledger_id for s in removed], why="retention")
    live = [s for s in listing.segments if not s.is_truncated]
    if subscribed is not None:
        floor = listing.by_ledger(subscribed.ledger_id)
        if floor is not None:  # retention kept what the lagging subscriber has not read (L5)
            assert all(s.sequence < floor.sequence for s in removed), (removed, floor)
    assert all(not s.is_in_progress for s in removed) and (not live or removed[-1:] != live[-1:])
    await workload.wait_acked(300)
    await workload.heal("truncated and retained")
    await check(workload)
    assert lagging.records > 0


# ---------------------------------------------------------------------------------- network


@pytest.fixture
def netns_cluster(tmp_path):
    labs: list[NetnsLab] = []
    clusters: list[NetnsCluster] = []

    def make(bookies: int = 4) -> NetnsCluster:
        try:
            lab = NetnsLab(bookies).create()
        except CapabilityMissing as exc:
            pytest.skip(str(exc))
        labs.append(lab)
        cluster = NetnsCluster(tmp_path / "netns-cluster", lab, zk_root="/netns")
        clusters.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()
    for lab in labs:
        lab.close()


@pytest.mark.parametrize("shaping", ["netem", "slow_link"])
async def test_network_delay_and_loss_between_client_and_bookies(netns_cluster, history, shaping):
    """netem: fixed delay with jitter and random loss (skipped where the kernel has no netem);
    slow_link: a rate-limited link whose queue delays bursts and drops what overflows it."""
    if shaping == "netem" and (reason := netem_missing()) is not None:
        pytest.skip(reason)
    cluster = netns_cluster(bookies=4)
    lab = cluster.lab
    nemesis = Nemesis(cluster, history)
    workload = await Workload(cluster, history, SETTINGS).start()
    await workload.wait_acked(300)
    ensemble = await workload.current_ensemble()
    for index in (ensemble_index(nemesis, ensemble, 0), ensemble_index(nemesis, ensemble, 1)):
        if shaping == "netem":
            lab.netem(index, delay_ms=40, jitter_ms=20, loss_percent=5)
        else:
            lab.slow_link(index, rate_kbit=384, queue_packets=40)
        nemesis.note(shaping, bookie=index)
    await workload.wait_acked(400, timeout_s=60)
    lab.heal_all()
    await workload.heal("network healed")
    await check(workload)


async def test_network_partition_between_client_and_a_bookie(netns_cluster, history):
    cluster = netns_cluster(bookies=4)
    lab = cluster.lab
    nemesis = Nemesis(cluster, history)
    workload = await Workload(cluster, history, SETTINGS).start()
    await workload.wait_acked(300)
    victim = ensemble_index(nemesis, await workload.current_ensemble(), 0)
    lab.partition(victim)
    nemesis.note("partition", bookie=victim)
    await workload.wait_acked(400, timeout_s=60)
    lab.heal_all()
    await workload.heal("partition healed")
    await check(workload)
