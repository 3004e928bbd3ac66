"""A seeded soak: writers and tailing readers on one stream while faults, drawn at random from the
seed, come and go; then everything heals, the stream is sealed and read back, and the history is
checked (tests/harness/history).

    python -m tests.harness.chaos --seed 1 --minutes 30          # the long soak
    python -m tests.harness.chaos --seed 7 --minutes 1 --rate 200  # what tests/faults/test_soak.py runs

The fault schedule (which fault, on which bookie, for how long, and the gaps) is a function of the
seed; the processes' timing is not, so a replay reproduces the schedule, not every interleaving.
Exit status 0 when the history has no anomaly, 1 when it has (the seed and the history file are
printed, and the run's directory is kept), 2 for bad arguments or a cluster that would not start.

Faults: kill -9 of a bookie, of two bookies of one write set at once, SIGSTOP of a bookie; a
writer process killed after it took the stream over; a second writer stealing the stream;
ZooKeeper paused (with and without a bookie dying meanwhile), restarted, a writer's session
expired; on bookie 0 only (so at most one replica is ever damaged): a torn or junk journal tail,
flipped bytes in its entry logs, a full disk; truncation plus retention under a lagging reader;
with network namespaces: a slow lossy link to a bookie, a partition from a bookie; with
`--zk-ensemble` (three ZooKeeper servers): kill -9 of the ZooKeeper leader, then its restart; a
bookie's disk lost for good (kill -9, wiped, an empty bookie started on another port), never
bookie 0, after which auto-recovery must bring every ledger back to full replication before the
next fault. At the end the history's replication check (tests/harness/replication.py) reads every
entry of every completed segment from each member of its write set.

Routine operations run in the background all along, as an operator's cron would: truncation and
retention beside the live writers and the slow (lagging) reader. They are no faults: a writer they
end, or a reader they leave behind, is an anomaly (L7).

The workload and the injectors are the fault tests' own (tests/faults/), run from this checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bookkeeper.errors import DlogError
from bookkeeper.meta.zkensemble import ZooKeeperEnsemble
from tests.harness.faults.autorecovery import RecoveryProcess
from tests.harness.faults.clients import STUCK_ERRORS_MAX
from tests.harness.faults.faults import (
    CapabilityMissing,
    Nemesis,
    TmpfsDisk,
    damage_journal_tail,
    flip_entry_log_bytes,
)
from tests.harness.faults.network import NetnsCluster, NetnsLab
from tests.harness.faults.workload import Settings, Workload, WriterProcess
from tests.harness.history import History, Report
from dlog_tools.cluster import LocalCluster

BOOKIES = 5
DAMAGEABLE = 0  # the one bookie whose disk faults may hit (one damaged replica at most)
HOLD_S = (1.0, 5.0)
GAP_S = (0.5, 3.0)
ROUTINE_GAP_S = (3.0, 8.0)  # between truncation-and-retention runs in the background
FINISH_RESERVE_S = 20.0  # time kept at the end for the last heal and the final read
TMPFS_BYTES = 256 * 2**20
RECOVERY_ARGS = ["--lost-bookie-recovery-delay", "3s", "--replica-check-interval", "1m",
                 "--replica-check-rate", "20000"]
BOOKIE_ARGS = ["--checkpoint-interval", "1", "--disk-check-interval", "0.3", "--disk-threshold", "0.9",
               "--disk-lwm", "0.8", "--gc-interval", "0"]
REPLICATION_BOUND_S = 120.0  # from a lost disk to full replication (a liveness failure past it)

log = logging.getLogger("chaos")


@dataclass
class Run:
    seed: int
    rng: random.Random
    directory: Path
    cluster: LocalCluster
    history: History
    nemesis: Nemesis
    workload: Workload
    lab: NetnsLab | None
    disk: TmpfsDisk | None
    started: float
    processes: list[WriterProcess]
    writer_families: int = 1
    ensemble: ZooKeeperEnsemble | None = None
    damaged_at_ms: int = 0  # when bookie 0's replicas were last damaged on purpose

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {text}", flush=True)

    async def hold(self) -> float:
        seconds = self.rng.uniform(*HOLD_S)
        await asyncio.sleep(seconds)
        return seconds


# ---------------------------------------------------------------------------------- faults


async def blocking(function: Callable[..., Any], *args: Any) -> Any:
    """Cluster operations block (a restart waits for the ready line): keep them off the loop, so
    the writers and readers keep running meanwhile."""
    return await asyncio.to_thread(function, *args)


async def ensemble_bookie(run: Run, position: int) -> int:
    try:
        ensemble = await asyncio.wait_for(run.workload.current_ensemble(), 10)
        return run.nemesis.index_of(ensemble[position % len(ensemble)])
    except (TimeoutError, AssertionError, DlogError, KeyError):  # no segment now: any bookie
        return run.rng.randrange(len(run.cluster.bookies))


async def restart_if_down(run: Run, index: int) -> None:
    if not run.cluster.bookies[index].running:
        await blocking(run.nemesis.restart_bookie, index)


async def fault_kill_bookie(run: Run) -> str:
    index = await ensemble_bookie(run, run.rng.randrange(3))
    await blocking(run.nemesis.kill_bookie, index)
    held = await run.hold()
    await blocking(run.nemesis.restart_bookie, index)
    return f"bookie {index} down {held:.1f} s"


async def fault_kill_ack_quorum(run: Run) -> str:
    first = await ensemble_bookie(run, 0)
    second = await ensemble_bookie(run, 1)
    victims = sorted({first, second})
    for index in victims:
        await blocking(run.nemesis.kill_bookie, index)
    held = await run.hold()
    for index in victims:
        await blocking(run.nemesis.restart_bookie, index)
    return f"bookies {victims} down together {held:.1f} s"


async def fault_pause_bookie(run: Run) -> str:
    index = await ensemble_bookie(run, run.rng.randrange(3))
    run.nemesis.pause_bookie(index)
    held = await run.hold()
    run.nemesis.resume_bookie(index)
    return f"bookie {index} stopped {held:.1f} s"


async def fault_kill_writer_process(run: Run) -> str:
    """A writer process takes the stream over and dies by kill -9 while it holds it; then the
    in-process writers may take it back (recovering the dead writer's segment)."""
    name = f"p{len(run.processes) + 1}"
    writers = list(run.workload.writers.values())
    for writer in writers:  # no fight meanwhile: the process keeps the stream until it dies
        writer.may_reopen.clear()
    try:
        process = WriterProcess(run.cluster, run.history, name, settings=run.workload.settings,
                                takeover=True, reopen=False)
        run.processes.append(process)
        run.nemesis.note("writer_process", writer=name)
        try:
            await process.wait_acked(run.rng.randrange(25, 200), timeout_s=30)
        except AssertionError as exc:
            run.say(f"  writer process {name}: {exc}")
        process.kill()
        run.nemesis.note("kill_writer", writer=name)
    finally:
        for writer in writers:
            writer.may_reopen.set()
    return f"writer process {name} took over, acked {process.acked}, killed"


async def fault_steal_stream(run: Run) -> str:
    run.writer_families += 1
    family = f"w{run.writer_families}"
    thief = run.workload.add_writer(family, reopen_on_fence=False, writes_max=run.rng.randrange(50, 500))
    run.nemesis.note("steal_stream", writer=family)
    held = await run.hold()
    thief.stop.set()
    return f"writer {family} stole the stream for {held:.1f} s"


async def fault_pause_zookeeper(run: Run) -> str:
    run.nemesis.pause_zookeeper()
    try:
        held = await run.hold()
    finally:
        run.nemesis.resume_zookeeper()
    return f"ZooKeeper stopped {held:.1f} s"


async def fault_pause_zookeeper_during_ensemble_change(run: Run) -> str:
    index = await ensemble_bookie(run, 0)
    run.nemesis.pause_zookeeper()
    try:
        await blocking(run.nemesis.kill_bookie, index)
        held = await run.hold()
    finally:
        run.nemesis.resume_zookeeper()
    await asyncio.sleep(run.rng.uniform(*HOLD_S))
    await blocking(run.nemesis.restart_bookie, index)
    return f"ZooKeeper stopped {held:.1f} s while bookie {index} died"


async def fault_restart_zookeeper(run: Run) -> str:
    await blocking(run.nemesis.restart_zookeeper)
    return "ZooKeeper restarted"


async def fault_expire_session(run: Run) -> str:
    live = [w for w in run.workload.writers.values() if w.namespace is not None and not w.stop.is_set()]
    if not live:
        return "no writer to expire"
    writer = run.rng.choice(live)
    if not await run.nemesis.expire_session(writer.namespace.zk, f"writer {writer.family}"):  # type: ignore[union-attr]
        return f"writer {writer.family} had no ZooKeeper session to expire (reconnecting)"
    return f"session of writer {writer.family} expired"


async def fault_damage_journal(run: Run) -> str:
    mode = run.rng.choice(["torn", "junk"])
    await blocking(run.nemesis.kill_bookie, DAMAGEABLE)
    damage = damage_journal_tail(run.cluster.bookies[DAMAGEABLE].data_dir, mode, run.rng)
    run.nemesis.note(f"{mode}_journal", bookie=DAMAGEABLE, **damage)
    await blocking(run.nemesis.restart_bookie, DAMAGEABLE)
    run.damaged_at_ms = int(time.time() * 1000)  # once back: a check begun while it was down skips it
    return f"{mode} journal tail on bookie {DAMAGEABLE} ({damage.get('bytes', 0)} bytes)"


async def fault_flip_bytes(run: Run) -> str:
    await blocking(run.nemesis.kill_bookie, DAMAGEABLE)
    damaged = flip_entry_log_bytes(run.cluster.bookies[DAMAGEABLE].data_dir, run.rng)
    run.nemesis.note("flipped_bytes", bookie=DAMAGEABLE, records=damaged)
    await blocking(run.nemesis.restart_bookie, DAMAGEABLE)
    run.damaged_at_ms = int(time.time() * 1000)  # once back: a check begun while it was down skips it
    return f"flipped a bit in {damaged} entry-log records of bookie {DAMAGEABLE}"


async def fault_full_disk(run: Run) -> str:
    assert run.disk is not None
    filled = await blocking(run.disk.fill, 128 * 1024)
    run.nemesis.note("full_disk", bookie=DAMAGEABLE, filler_bytes=filled)
    held = await run.hold()
    run.disk.unfill()
    await restart_if_down(run, DAMAGEABLE)
    return f"disk of bookie {DAMAGEABLE} full for {held:.1f} s"


async def fault_truncate_and_retain(run: Run) -> str:
    workload = run.workload
    namespace = workload.control
    offsets = [offset for writer in workload.writers.values() for offset in writer.offsets[-2000:-200]]
    if namespace is None or not offsets:
        return "nothing to truncate yet"
    cut = run.rng.choice(offsets)
    run.nemesis.note("truncate", before=[cut.ledger_id, cut.entry_id, cut.slot])
    # recorded before: a truncation that fails after its commit still removed the records below
    run.history.record("chaos", "truncated", before=[cut.ledger_id, cut.entry_id, cut.slot])
    try:
        await namespace.truncate(workload.settings.stream, before=cut)
        await namespace.set_retention(workload.settings.stream, size_bytes=run.rng.randrange(1, 200_000))
        removed = await namespace.apply_retention(workload.settings.stream)
        run.history.record("chaos", "removed", ledgers=[s.ledger_id for s in removed], why="retention")
    except DlogError as exc:  # a refused truncation (the stream moved meanwhile) is an outcome
        run.history.record("chaos", "truncate_failed", error=f"{type(exc).__name__}: {exc}")
        return f"truncation refused: {exc}"
    return f"truncated before {cut}, retention removed {len(removed)} segments"


async def fault_kill_zookeeper_leader(run: Run) -> str:
    assert run.ensemble is not None
    leader = await blocking(run.ensemble.leader)
    run.nemesis.note("kill_zookeeper_leader", member=leader)
    await blocking(run.ensemble.kill, leader)
    held = await run.hold()
    run.history.record("nemesis", "restart", zookeeper_member=leader)
    await blocking(run.ensemble.start_member, leader)
    return f"ZooKeeper leader (member {leader}) killed, back after {held:.1f} s"


async def fault_slow_link(run: Run) -> str:
    assert run.lab is not None
    index = await ensemble_bookie(run, run.rng.randrange(3))
    run.lab.slow_link(index, rate_kbit=run.rng.choice([256, 512, 1024]), queue_packets=run.rng.choice([20, 50]))
    run.nemesis.note("slow_link", bookie=index)
    held = await run.hold()
    run.lab.heal(index)
    return f"slow lossy link to bookie {index} for {held:.1f} s"


async def fault_partition(run: Run) -> str:
    assert run.lab is not None
    index = await ensemble_bookie(run, run.rng.randrange(3))
    run.lab.partition(index)
    run.nemesis.note("partition", bookie=index)
    held = await run.hold()
    run.lab.heal(index)
    return f"bookie {index} partitioned from the client for {held:.1f} s"


async def fault_lose_disk(run: Run) -> str:
    # bookie 0's damaged replicas must be written back first: a lost disk in the same write set
    # would leave no good copy of them
    if not await damage_repaired(run, REPLICATION_BOUND_S):
        return "bookie 0's damaged replicas were not repaired in time: no disk lost"
    index = await ensemble_bookie(run, run.rng.randrange(3))
    if index == DAMAGEABLE:  # its disk faults must stay the only damage to its replicas
        index = run.rng.choice([b.index for b in run.cluster.bookies if b.index != DAMAGEABLE])
    lost_at_ms = int(time.time() * 1000)
    lost, new = await blocking(run.nemesis.lose_disk, index)
    started = time.monotonic()
    # a second loss in a write set before this one is repaired would lose data with Qw = 2: the
    # next fault waits for full replication
    if not await fully_replicated(run, lost, lost_at_ms, REPLICATION_BOUND_S):
        run.history.record("nemesis", "liveness", "fail",
                           what=f"ledgers still name lost bookie {lost} {REPLICATION_BOUND_S} s after its loss")
        return f"disk of bookie {index} ({lost}) lost; NOT re-replicated within {REPLICATION_BOUND_S} s"
    return (f"disk of bookie {index} ({lost}) lost, {new} started empty; fully replicated after "
            f"{time.monotonic() - started:.1f} s")


async def damage_repaired(run: Run, timeout_s: float) -> bool:
    """Unless a replica check that began after bookie 0's last damage has finished and nothing is
    marked, run one and wait for it and for every repair it asks for (a liveness failure past
    `timeout_s`)."""
    from bookkeeper.autorecovery.store import RecoveryStore

    namespace = run.workload.control
    assert namespace is not None
    store = RecoveryStore(namespace.zk, run.cluster.zk_root)
    replicas = (await store.audit_state()).get("replicas", {})
    # a margin for the auditor to see bookie 0 registered again
    if (replicas.get("cursor", -1) < 0 and replicas.get("started_ms", 0) > run.damaged_at_ms + 5000
            and not await store.count_marks()):
        return True
    asked_ms = int(time.time() * 1000)
    await store.trigger_audit(True, asked_ms)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        with contextlib.suppress(DlogError):
            replicas = (await store.audit_state()).get("replicas", {})
            if replicas.get("finished_ms", 0) > asked_ms and not await store.count_marks():
                return True
    run.history.record("nemesis", "liveness", "fail",
                       what=f"a replica check and its repairs did not finish within {timeout_s} s")
    return False


async def fully_replicated(run: Run, lost: str, lost_at_ms: int, timeout_s: float) -> bool:
    """No mark left, an ensemble scan finished after the loss was noticed, and no ledger names it."""
    from bookkeeper.autorecovery.policy import bookies_named
    from bookkeeper.autorecovery.store import RecoveryStore

    namespace = run.workload.control
    assert namespace is not None
    store = RecoveryStore(namespace.zk, run.cluster.zk_root)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        try:
            scanned = (await store.audit_state()).get("ensembles", {}).get("finished_ms", 0)
            if scanned <= lost_at_ms or await store.count_marks():
                continue
            named = False
            for ledger_id in await namespace.client.list_ledgers():
                with contextlib.suppress(DlogError):
                    metadata, _ = await namespace.client.ledger_metadata(ledger_id)
                    named = named or lost in bookies_named(metadata)
            if not named:
                return True
        except DlogError:
            continue
    return False


FAULTS: dict[str, Callable[[Run], Any]] = {
    "kill_bookie": fault_kill_bookie,
    "kill_ack_quorum": fault_kill_ack_quorum,
    "pause_bookie": fault_pause_bookie,
    "kill_writer_process": fault_kill_writer_process,
    "steal_stream": fault_steal_stream,
    "pause_zookeeper": fault_pause_zookeeper,
    "pause_zookeeper_during_ensemble_change": fault_pause_zookeeper_during_ensemble_change,
    "restart_zookeeper": fault_restart_zookeeper,
    "expire_session": fault_expire_session,
    "damage_journal": fault_damage_journal,
    "flip_bytes": fault_flip_bytes,
    "full_disk": fault_full_disk,
    "truncate_and_retain": fault_truncate_and_retain,
    "kill_zookeeper_leader": fault_kill_zookeeper_leader,
    "slow_link": fault_slow_link,
    "partition": fault_partition,
    "lose_disk": fault_lose_disk,
}


def available_faults(run: Run, only: list[str] | None = None) -> list[str]:
    kinds = list(only or FAULTS)
    unavailable = set()
    if run.disk is None:
        unavailable.add("full_disk")
    if run.lab is None:
        unavailable |= {"slow_link", "partition"}
    if run.ensemble is None:
        unavailable.add("kill_zookeeper_leader")
    else:  # one server's pause or restart is not what an ensemble is about
        unavailable |= {"pause_zookeeper", "pause_zookeeper_during_ensemble_change", "restart_zookeeper"}
    return [kind for kind in kinds if kind not in unavailable]


# ---------------------------------------------------------------------------------- the run


def build_cluster(directory: Path, network: str,
                  ensemble: ZooKeeperEnsemble | None = None) -> tuple[LocalCluster, NetnsLab | None, TmpfsDisk | None]:
    lab = None
    if ensemble is not None:
        cluster = LocalCluster(directory / "cluster", bookies=BOOKIES, zk_root="/chaos",
                               bookie_args=[*BOOKIE_ARGS, *RECOVERY_ARGS], zk_server=ensemble)  # type: ignore[arg-type]
        return cluster, None, _tmpfs(cluster)
    if network in ("auto", "on"):
        try:
            lab = NetnsLab(BOOKIES).create()
        except CapabilityMissing as exc:
            if network == "on":
                raise
            print(f"chaos: no network faults: {exc}", flush=True)
    if lab is not None:
        # bookies in namespaces cannot reach each other: auto-recovery runs as its own process
        cluster: LocalCluster = NetnsCluster(directory / "cluster", lab, zk_root="/chaos",
                                             bookie_args=[*BOOKIE_ARGS, "--no-autorecovery"])
    else:
        cluster = LocalCluster(directory / "cluster", bookies=BOOKIES, zk_root="/chaos",
                               bookie_args=[*BOOKIE_ARGS, *RECOVERY_ARGS])
    return cluster, lab, _tmpfs(cluster)


def _tmpfs(cluster: LocalCluster) -> TmpfsDisk | None:
    disk: TmpfsDisk | None = TmpfsDisk(cluster.bookies[DAMAGEABLE].data_dir, TMPFS_BYTES)
    try:
        disk.mount()  # type: ignore[union-attr]
    except CapabilityMissing as exc:
        print(f"chaos: no full-disk fault: {exc}", flush=True)
        disk = None
    return disk


async def routine_operations(run: Run, stop: asyncio.Event) -> None:
    """Truncation and retention now and then, beside the live writers and the slow reader."""
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), run.rng.uniform(*ROUTINE_GAP_S))
        if not stop.is_set():
            what = await fault_truncate_and_retain(run)
            run.say(f"  routine: {what}")


async def soak(run: Run, minutes: float, only: list[str] | None) -> Report:
    end = run.started + minutes * 60 - FINISH_RESERVE_S
    kinds = available_faults(run, only)
    if not kinds:
        raise CapabilityMissing(f"none of the faults {only} can be injected here")
    run.say(f"faults drawn from: {', '.join(kinds)}")
    await run.workload.wait_acked(50, timeout_s=60)
    routine_stop = asyncio.Event()
    routine = asyncio.ensure_future(routine_operations(run, routine_stop))
    try:
        await inject_until(run, kinds, end)
    finally:
        routine_stop.set()
        await routine
    run.say("time is up: heal everything, seal the stream, read it back")
    await heal_everything(run)
    await run.workload.heal("end of the soak")
    await damage_repaired(run, FINISH_RESERVE_S * 6)
    return await run.workload.finish()


async def inject_until(run: Run, kinds: list[str], end: float) -> None:
    while time.monotonic() < end:
        kind = run.rng.choice(kinds)
        run.say(f"{kind} ...")
        what = await FAULTS[kind](run)
        run.say(f"  {what}; healing")
        await run.workload.heal(kind)
        gap = run.rng.uniform(*GAP_S)
        await asyncio.sleep(max(0.0, min(gap, end - time.monotonic())))


async def heal_everything(run: Run) -> None:
    if run.ensemble is not None:
        for index, member in enumerate(run.ensemble.members):
            if not member.running:
                await blocking(run.ensemble.start_member, index)
    elif run.cluster.zk.paused:
        run.nemesis.resume_zookeeper()
    if run.lab is not None:
        run.lab.heal_all()
    if run.disk is not None:
        run.disk.unfill()
    for bookie in run.cluster.bookies:
        if bookie.running:
            run.cluster.kill_bookie(bookie.index, signal.SIGCONT)
        else:
            await blocking(run.nemesis.restart_bookie, bookie.index)


def figures(report: Report, nemesis: Nemesis) -> str:
    stats = report.stats
    faults = Counter(nemesis.counts)
    listed = ", ".join(f"{kind} {count}" for kind, count in sorted(faults.items()))
    return (f"operations: {stats['writes']} writes (ok {stats['ok']}, fail {stats['fail']}, unknown "
            f"{stats['unknown']}), {stats['reads']} records read by {stats['readers']} reader sessions, "
            f"{stats['writers']} writer sessions, {stats['segments']} segments, final read {stats['final']}\n"
            f"faults injected: {sum(faults.values())} ({listed})\n"
            f"readers that reopened their namespace after {STUCK_ERRORS_MAX} errors at one position: "
            f"{stats.get('renewed_readers', 0)}\n"
            f"anomalies: {len(report.anomalies)}")


async def main_async(arguments: argparse.Namespace) -> int:
    seed, minutes = arguments.seed, arguments.minutes
    directory = Path(arguments.dir or tempfile.mkdtemp(prefix=f"dlog-chaos-{seed}-"))
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    history = History(directory / "history.jsonl")
    print(f"chaos: seed {seed}, {minutes} minutes, directory {directory}", flush=True)
    ensemble = ZooKeeperEnsemble(directory / "zookeeper") if arguments.zk_ensemble else None
    try:
        if ensemble is not None:
            await blocking(ensemble.start)
        cluster, lab, disk = build_cluster(directory, arguments.network, ensemble)
    except (CapabilityMissing, RuntimeError, DlogError) as exc:
        print(f"chaos: cannot build the cluster: {exc}", file=sys.stderr)
        if ensemble is not None:
            await blocking(ensemble.stop)
        return 2
    run: Run | None = None
    recovery: RecoveryProcess | None = None
    try:
        await blocking(cluster.start)
        if lab is not None:
            recovery = await blocking(lambda: RecoveryProcess(cluster, "autorecovery", directory, *RECOVERY_ARGS))
        print(f"chaos: {len(cluster.bookies)} bookies ({'own network namespaces' if lab else 'loopback'}), "
              f"ZooKeeper {cluster.zk_address}", flush=True)
        settings = Settings(stream="chaos", namespace="chaos", write_interval_s=1.0 / arguments.rate,
                            writes_max=int(arguments.rate * minutes * 60) + 1000, roll_records=500,
                            replication_timeout_s=REPLICATION_BOUND_S)
        workload = Workload(cluster, history, settings)
        run = Run(seed, rng, directory, cluster, history, Nemesis(cluster, history, rng), workload, lab, disk,
                  time.monotonic(), [], ensemble=ensemble)
        await workload.start(writers=1, readers=2)
        workload.add_reader("lag", lag_s=0.02, subscription="lagging")
        report = await soak(run, minutes, arguments.faults)
    finally:
        if run is not None:
            for process in run.processes:
                process.close()
            with contextlib.suppress(Exception):
                await run.workload.close()
        if recovery is not None:
            await blocking(recovery.stop)
        await blocking(cluster.stop)
        if ensemble is not None:
            await blocking(ensemble.stop)
        if disk is not None:
            disk.unmount()
        if lab is not None:
            lab.close()
        history.close()
    assert run is not None
    print(figures(report, run.nemesis), flush=True)
    if report.ok:
        print(f"chaos: seed {seed} passed", flush=True)
        if not arguments.keep and arguments.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
        return 0
    print(report.summary(), flush=True)
    print(f"chaos: seed {seed} FAILED with {len(report.anomalies)} anomalies; history kept at "
          f"{history.path}\nreplay the schedule: python -m tests.harness.chaos --seed {seed} --minutes {minutes}",
          flush=True)
    return 1


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def _seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def _fault_kinds(text: str) -> list[str]:
    kinds = [kind.strip() for kind in text.split(",") if kind.strip()]
    unknown = [kind for kind in kinds if kind not in FAULTS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown fault {', '.join(unknown) or repr(text)}; "
                                         f"choose from {', '.join(FAULTS)}")
    return kinds


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(prog="python -m tests.harness.chaos", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    result.add_argument("--seed", type=_seed, required=True, help="draws the fault schedule")
    result.add_argument("--minutes", type=_positive_float, required=True, help="how long faults are injected")
    result.add_argument("--rate", type=_positive_float, default=50.0, help="writes per second (default 50)")
    result.add_argument("--network", choices=("auto", "on", "off"), default="auto",
                        help="bookies in network namespaces for network faults (auto: when possible)")
    result.add_argument("--zk-ensemble", action="store_true",
                        help="three ZooKeeper servers (loopback, no network faults); adds kill_zookeeper_leader")
    result.add_argument("--faults", type=_fault_kinds, default=None,
                        help=f"only these faults, comma-separated (default all): {', '.join(FAULTS)}")
    result.add_argument("--dir", help="where the cluster and the history go (default: a new temporary one)")
    result.add_argument("--keep", action="store_true", help="keep the directory after a passing run")
    return result


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("kazoo", "bookkeeper", "dlog", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    arguments = parser().parse_args(argv)
    return asyncio.run(run_until_signalled(main_async(arguments)))


async def run_until_signalled(main: Any) -> int:
    """SIGTERM or SIGINT cancel the run, so its teardown (bookies, namespaces, mounts) still runs."""
    task = asyncio.ensure_future(main)
    loop = asyncio.get_running_loop()

    def interrupted() -> None:
        task.cancel()
        for signum in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut the teardown
            loop.add_signal_handler(signum, lambda: None)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, interrupted)
    try:
        return await task
    except asyncio.CancelledError:
        print("chaos: interrupted; the cluster was stopped and cleaned up", flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
