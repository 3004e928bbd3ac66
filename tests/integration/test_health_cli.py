"""Cluster health from the shell on real bookie processes: `bookie list` shows read-only and down
bookies, `cluster check` writes and reads back through every writable bookie and fails naming a
down one, and `ping` reports round trips to ZooKeeper and every bookie."""

from __future__ import annotations

import asyncio
import json

from tests.helpers import dlog_runner, eventually_blocking, one_error_line


def states(run) -> dict[str, str]:
    return {item["id"]: item["state"] for item in map(json.loads, run("bookie", "list", "--json").stdout.splitlines())}


async def set_read_only(http: str, read_only: bool) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.put(f"{http}/api/v1/bookie/state", json={"read_only": read_only}) as response:
            assert response.status == 200, await response.text()


def test_bookie_list_cluster_check_and_ping(cluster_factory):
    cluster = cluster_factory(bookies=3)
    run = dlog_runner(cluster.zk_address, cluster.zk_root)
    ids = [bookie.address for bookie in cluster.bookies]
    assert states(run) == {bookie_id: "writable" for bookie_id in ids}

    checked = json.loads(run("cluster", "check", "--json").stdout)
    assert checked["ok"] and [(row["bookie"], row["write"], row["read"]) for row in checked["bookies"]] == \
        sorted((bookie_id, "ok", "ok") for bookie_id in ids)
    assert "cluster check passed: 3 bookies wrote and read back 3 entries each" in run("cluster", "check").stdout
    assert json.loads(run("ledger", "list", "--json", namespaced=False).stdout)["ledgers"] == []  # cleaned up

    pinged = json.loads(run("ping", "--count", "2", "--json").stdout)
    assert pinged["zookeeper"]["count"] == 2
    assert 0 < pinged["zookeeper"]["min_ms"] <= pinged["zookeeper"]["median_ms"]
    assert sorted(row["bookie"] for row in pinged["bookies"]) == sorted(ids)
    assert all(row["error"] is None and 0 < row["min_ms"] <= row["median_ms"] for row in pinged["bookies"])

    asyncio.run(set_read_only(cluster.bookies[1].http, True))
    eventually_blocking(lambda: states(run)[ids[1]] == "read_only", timeout_s=30)
    checked = json.loads(run("cluster", "check", "--json").stdout)
    read_only = next(row for row in checked["bookies"] if row["bookie"] == ids[1])
    assert checked["ok"] and read_only["write"] is None and read_only["note"].startswith("read-only")

    cluster.stop_bookie(2)
    eventually_blocking(lambda: states(run)[ids[2]] == "down", timeout_s=30)
    assert "down" in run("bookie", "list").stdout
    refused = run("cluster", "check", ok=False)
    assert refused.returncode == 1 and f"{ids[2]} down: it has a cookie but is not registered" in refused.stderr
    assert one_error_line(refused).startswith("dlog: cluster check failed for 1 bookie: ")
    assert run("ping").returncode == 0  # a down bookie is not registered: nothing to ping
