"""Auto-recovery with real bookie processes (R1, R3): a bookie back within the recovery delay
triggers nothing and one gone for good is replaced, an abandoned open ledger is fenced and closed
after its grace period, a worker killed mid-copy leaves metadata consistent and another finishes,
and operators see and steer it all from `dlog autorecovery` and the admin endpoint (whose bad bodies
get 400, never 500, on a bookie and on `dlog autorecovery`'s own endpoint)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from bookkeeper.autorecovery.policy import Missing, Reason, bookies_named, fragments
from bookkeeper.autorecovery.store import RecoveryStore
from bookkeeper.client import BookKeeper
from bookkeeper.errors import LedgerFencedError
from bookkeeper.protocol.metadata import LedgerState
from tests.harness.faults.autorecovery import RecoveryProcess
from tests.harness.replication import replication_problems
from tests.helpers import dlog_runner, eventually, one_error_line
from dlog_tools.cluster import project_root

pytestmark = pytest.mark.timeout(180)

SESSION_S = 4
RATE_BURST = 10  # entries a rate limit of 100/s lets through at once (a tenth of a second)
FAST = ["--zk-session-timeout", str(SESSION_S), "--checkpoint-interval", "1"]


def index_of(cluster, bookie_id: str) -> int:
    return next(b.index for b in cluster.bookies if (b.bookie_id or b.address) == bookie_id)


async def append(handle, count: int, size: int = 32) -> None:
    await asyncio.gather(*(handle.append_async(b"%06d" % i + b"x" * (size - 6)) for i in range(count)))


async def test_back_within_the_delay_triggers_nothing_gone_for_good_is_replaced(cluster_factory):
    delay_s = 10.0  # a restart under a loaded machine took 5.7 s: the delay must outlast it
    cluster = cluster_factory(bookies=4, bookie_args=[*FAST, "--lost-bookie-recovery-delay", f"{delay_s:.0f}s",
                                                      "--open-ledger-grace", "2s"])
    async with BookKeeper(zk=cluster.zk_address, root=cluster.zk_root) as bk:
        store = RecoveryStore(bk.store.zk, cluster.zk_root)
        closed = await bk.create_ledger(3, 2, 2, password=b"pw")
        await append(closed, 60)
        await closed.close()
        open_ = await bk.create_ledger(3, 2, 2, password=b"pw")  # its writer goes quiet, never closes
        await append(open_, 20)
        shared = [b for b in closed.metadata.ensembles[0][1] if b in open_.metadata.ensembles[0][1]]
        victim = shared[0]
        index = index_of(cluster, victim)
        _, version_before = await bk.ledger_metadata(closed.ledger_id)

        stopped = time.monotonic()
        cluster.stop_bookie(index)  # SIGTERM: its registration goes at once
        await asyncio.to_thread(cluster.start_bookie, index)
        assert time.monotonic() - stopped < delay_s, "the restart took longer than the delay"
        # nothing may happen through the whole delay: this wait is the point of the test
        await asyncio.sleep(delay_s + 1 - (time.monotonic() - stopped))
        asked_ms = int(time.time() * 1000)
        await store.trigger_audit(False, asked_ms)
        await eventually(lambda: _scanned_since(store, asked_ms), 20, message="an audit after the delay")
        assert await store.count_marks() == 0
        assert (await bk.ledger_metadata(closed.ledger_id))[1] == version_before

        cluster.kill_bookie(index)  # gone for good
        lost_at = time.monotonic()

        async def repaired() -> bool:
            if await store.count_marks():
                return False
            for ledger_id in (closed.ledger_id, open_.ledger_id):
                metadata, _ = await bk.ledger_metadata(ledger_id)
                if victim in bookies_named(metadata) or not metadata.is_closed:
                    return False
            return True

        await eventually(repaired, 60, interval_s=0.3, message=f"both ledgers repaired away from {victim}")
        assert time.monotonic() - lost_at >= SESSION_S + delay_s - 1
        metadata, _ = await bk.ledger_metadata(open_.ledger_id)
        assert metadata.state is LedgerState.CLOSED and metadata.last_entry_id == 19  # fenced and recovered
        with pytest.raises(LedgerFencedError):
            await open_.append(b"the quiet writer was fenced by the recovery")
        assert await replication_problems(bk, [closed.ledger_id, open_.ledger_id]) == []
        for ledger in (closed, open_):
            handle = await bk.open_ledger(ledger.ledger_id, password=b"pw")
            entries = await handle.read(0, handle.last_add_confirmed)
            assert [e.payload[:6] for e in entries] == [b"%06d" % i for i in range(len(entries))]
            assert len(entries) == (60 if ledger is closed else 20)


async def _none_marked(store: RecoveryStore) -> bool:
    return await store.count_marks() == 0


async def _scanned_since(store: RecoveryStore, since_ms: int) -> bool:
    return (await store.audit_state()).get("ensembles", {}).get("finished_ms", 0) >= since_ms


async def test_status_list_trigger_enable_and_disable_from_the_cli_and_the_admin_endpoint(cluster_factory):
    cluster = cluster_factory(bookies=3, bookie_args=FAST)
    run = dlog_runner(cluster.zk_address, cluster.zk_root)
    bookie_ids = {b.bookie_id or b.address for b in cluster.bookies}

    def status() -> dict:
        return json.loads(run("autorecovery", "status", "--json", namespaced=False).stdout)

    async with BookKeeper(zk=cluster.zk_address, root=cluster.zk_root) as bk:
        await eventually(lambda: RecoveryStore(bk.store.zk, cluster.zk_root).auditor(), 30)
    assert {"enabled": True, "underreplicated": 0}.items() <= status().items()
    assert status()["auditor"] in bookie_ids
    assert run("autorecovery", "disable", "--json", namespaced=False).stdout.strip() == '{"enabled": false}'
    assert status()["enabled"] is False
    async with BookKeeper(zk=cluster.zk_address, root=cluster.zk_root) as bk:
        handle = await bk.create_ledger(3, 2, 2)
        await handle.close()
        member = handle.metadata.ensembles[0][1][0]
        await RecoveryStore(bk.store.zk, cluster.zk_root).mark(
            handle.ledger_id, [Missing(member, Reason.LOST, 1)], 1)
        listed = run("autorecovery", "list-underreplicated", "--json", namespaced=False).stdout.splitlines()
        assert [json.loads(line)["ledger"] for line in listed] == [handle.ledger_id]
        assert json.loads(listed[0])["missing"] == [member]
        assert status()["underreplicated"] == 1
        url = cluster.bookies[0].http + "/api/v1/autorecovery"
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/status") as response:
                answer = await response.json()
                assert response.status == 200 and answer["underreplicated"] == 1 and not answer["enabled"]
                assert answer["local"]["identity"] == (cluster.bookies[0].bookie_id or cluster.bookies[0].address)
            async with http.get(url + "/list_underreplicated?limit=5") as response:
                assert (await response.json())["ledgers"][0]["missing"] == [member]
            for bad in ('{"replica_check": "yes"}', "[1]", "not json"):
                async with http.post(url + "/trigger_audit", data=bad) as response:
                    assert response.status == 400 and "replica_check" in (await response.json())["error"]
            async with http.get(url + "/list_underreplicated?limit=0") as response:
                assert response.status == 400
            async with http.post(url + "/enable") as response:
                assert (await response.json()) == {"enabled": True}
        # the worker finds that bookie registered, with its data: the mark is dropped, nothing copied
        store = RecoveryStore(bk.store.zk, cluster.zk_root)
        await eventually(lambda: _none_marked(store), 30)
        assert (await bk.ledger_metadata(handle.ledger_id))[0].ensembles == handle.metadata.ensembles
    triggered = run("autorecovery", "trigger-audit", "--replica-check", "--json", namespaced=False)
    assert json.loads(triggered.stdout) == {"triggered": True, "replica_check": True}
    refused = run("autorecovery", "list-underreplicated", "--limit", "0", ok=False, namespaced=False)
    assert "--limit" in refused.stderr and refused.returncode != 0


async def test_a_worker_killed_mid_copy_leaves_metadata_consistent_and_another_finishes(cluster_factory, tmp_path):
    cluster = cluster_factory(bookies=4, bookie_args=[*FAST, "--no-autorecovery"])
    slow = ["--zk-session-timeout", str(SESSION_S), "--lost-bookie-recovery-delay", "1s",
            "--rereplication-rate", "100"]
    workers = [RecoveryProcess(cluster, f"w{i}", tmp_path, *slow) for i in (1, 2)]
    try:
        async with BookKeeper(zk=cluster.zk_address, root=cluster.zk_root) as bk:
            store = RecoveryStore(bk.store.zk, cluster.zk_root)
            handle = await bk.create_ledger(3, 2, 2, password=b"pw")
            await append(handle, 900, size=256)
            await handle.close()
            lost = handle.metadata.ensembles[0][1][0]
            cluster.kill_bookie(index_of(cluster, lost))

            async def copying() -> tuple[str, str] | None:
                holder = (await store.locks()).get(handle.ledger_id)
                found = await store.read_mark(handle.ledger_id)
                if holder is None or found is None or not found[0].targets:
                    return None
                return holder, found[0].target_for(0, lost)

            holder, target = await eventually(copying, 40, interval_s=0.1)
            killed = next(w for w in workers if w.name == holder)
            other = next(w for w in workers if w is not killed)
            await eventually(lambda: killed.copied(handle.ledger_id), 10)
            assert not other.copied(handle.ledger_id)  # never two at once: the other waits for the lock
            killed.kill()
            killed_at = time.monotonic()
            metadata, _ = await bk.ledger_metadata(handle.ledger_id)
            assert metadata.ensembles == handle.metadata.ensembles  # the swap comes last: nothing half done

            async def finished() -> bool:
                metadata, _ = await bk.ledger_metadata(handle.ledger_id)
                return lost not in bookies_named(metadata) and await store.count_marks() == 0

            await eventually(finished, 60, interval_s=0.3, message="the other worker finishes the repair")
            # the rate limit holds: the other worker copied the position's entries at 100/s at most
            total = fragments(handle.metadata)[0].count_at(0, 2)
            assert time.monotonic() - killed_at >= (total - RATE_BURST) / 100
            assert other.copied(handle.ledger_id)
            metadata, _ = await bk.ledger_metadata(handle.ledger_id)
            assert target in metadata.ensembles[0][1]  # it reused the replacement the first one chose
            assert await replication_problems(bk, [handle.ledger_id]) == []
    finally:
        for worker in workers:
            worker.stop()


def test_bad_recovery_settings_get_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "bookie", "start", "--dir", str(tmp_path),
                             "--config", str(_toml(tmp_path, 'lost_bookie_recovery_delay = "soon"'))],
                            capture_output=True, text=True, timeout=60, cwd=project_root())
    assert "lost_bookie_recovery_delay" in one_error_line(result) and "bad duration 'soon'" in result.stderr


def _toml(directory: Path, line: str) -> Path:
    path = directory / "bad.toml"
    path.write_text(f"[bookie]\n{line}\n")
    return path


BAD_BODIES = [
    (b'{"replica_check": \xff\xfe}', "application/json", "UTF-8"),
    (b'{"replica_check": true}', "application/json; charset=klingon", "charset"),
    ('{"replica_check": true}'.encode("utf-16"), "application/json; charset=utf-16", "charset"),
    (b"[" * 5000 + b"]" * 5000, "application/json", "nested"),
    (b'{"replica_check": true, "pad": "' + b"x" * 100_000 + b'"}', "application/json", "over"),
]


async def test_the_autorecovery_process_answers_400_to_bad_bodies(zk_server, zk_root, tmp_path):
    from types import SimpleNamespace

    process = RecoveryProcess(SimpleNamespace(zk_address=zk_server.address, zk_root=zk_root), "ar", tmp_path,
                              "--http-port", "0")
    try:
        async with aiohttp.ClientSession() as http:
            url = process.http + "/api/v1/autorecovery/trigger_audit"
            for body, content_type, words in BAD_BODIES:
                async with http.post(url, data=body, headers={"Content-Type": content_type}) as response:
                    answer = await response.text()
                    assert response.status == 400, (words, response.status, answer)
                    assert words in json.loads(answer)["error"], (words, answer)
            async with http.post(url, json={"replica_check": True}) as response:
                assert response.status == 200
    finally:
        process.stop()
    assert "Traceback" not in process.log_text()
