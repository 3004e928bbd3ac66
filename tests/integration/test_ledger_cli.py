"""`dlog ledger create|list|show|read|recover|delete` work as documented on real processes, and bad
ledger ids or passwords get one line and a non-zero exit."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from bookkeeper.client import BookKeeper
from dlog_tools.cluster import LocalCluster
from tests.helpers import local_clusters


def cli_on(cluster: LocalCluster) -> tuple[LocalCluster, Callable[..., subprocess.CompletedProcess]]:
    def run(*arguments: str, ok: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "ledger", *arguments, "--zk",
                                 cluster.zk_address, "--zk-root", cluster.zk_root],
                                capture_output=True, text=True, timeout=120)
        if ok:
            assert result.returncode == 0, result.stderr
        return result

    return cluster, run


@pytest.fixture
def ledger_cli(cluster_factory):
    return cli_on(cluster_factory(bookies=3))


@pytest.fixture(scope="module")
def refusing_cli(zk_server, tmp_path_factory):
    """One cluster for the refused commands (a cluster each took half of this file's time): each is
    refused before it changes anything, and none looks at what another's setup wrote."""
    with local_clusters(zk_server, tmp_path_factory.mktemp("ledger-cli"), "t", default_bookies=3) as make:
        yield cli_on(make())


async def open_ledger_with_entries(cluster, count: int) -> int:
    async with BookKeeper(zk=cluster.zk_address, root=cluster.zk_root) as client:
        handle = await client.create_ledger(3, 2, 2, password=b"pw")
        for index in range(count):
            await handle.append(f"entry {index}".encode())
        await asyncio.sleep(0)
        return handle.ledger_id  # left open: its writer "dies" with this client


def test_ledger_commands(ledger_cli):
    cluster, run = ledger_cli
    created = json.loads(run("create", "--ensemble", "2", "--write-quorum", "2", "--ack-quorum", "1",
                             "--json").stdout)
    show = json.loads(run("show", str(created["ledger_id"]), "--json").stdout)
    assert show["state"] == "CLOSED" and show["last_entry_id"] == -1
    assert (show["ensemble_size"], show["write_quorum"], show["ack_quorum"]) == (2, 2, 1)
    assert show["ensembles"][0]["bookies"] == created["ensemble"]
    assert show["ensembles"][0]["last_entry"] == -1  # an empty ledger's fragment holds nothing

    ledger_id = asyncio.run(open_ledger_with_entries(cluster, 5))
    opened = json.loads(run("show", str(ledger_id), "--json").stdout)
    assert opened["state"] == "OPEN" and opened["ensembles"][-1]["last_entry"] is None  # still written
    entries = [json.loads(line) for line in run("read", str(ledger_id), "--password", "pw", "--json")
               .stdout.splitlines()]
    assert [e["data"] for e in entries][:4] == [f"entry {i}" for i in range(4)]  # up to the LAC
    recovered = json.loads(run("recover", str(ledger_id), "--password", "pw", "--json").stdout)
    assert recovered == {"ledger_id": ledger_id, "state": "CLOSED", "last_entry_id": 4,
                         "length": recovered["length"]} and recovered["length"] > 0
    fragment = next(line for line in run("show", str(ledger_id)).stdout.splitlines() if line.startswith("fragment"))
    assert fragment.split()[1:3] == ["entries", "0-4:"]  # each fragment's entries and its ensemble
    entries = run("read", str(ledger_id), "--password", "pw", "--from", "3").stdout.splitlines()
    assert entries == ["3\tentry 3", "4\tentry 4"]
    assert json.loads(run("list", "--json").stdout)["ledgers"] == [created["ledger_id"], ledger_id]
    run("delete", str(ledger_id))
    assert json.loads(run("list", "--json").stdout)["ledgers"] == [created["ledger_id"]]


@pytest.mark.parametrize("arguments, words", [
    (("show", "-1"), "-1"),
    (("show", "abc"), "abc"),
    (("show", "424242"), "ledger 424242 does not exist"),
    (("delete", "424242"), "ledger 424242 does not exist"),
    (("create", "--ensemble", "2", "--write-quorum", "3"), "ensemble >= write quorum"),
])
def test_bad_ledger_input(refusing_cli, arguments, words):
    _, run = refusing_cli
    result = run(*arguments, ok=False)
    assert result.returncode != 0 and words in result.stderr and "Traceback" not in result.stderr


def test_wrong_password_is_one_line(refusing_cli):
    cluster, run = refusing_cli
    ledger_id = asyncio.run(open_ledger_with_entries(cluster, 1))
    result = run("recover", str(ledger_id), "--password", "nope", ok=False)
    assert result.returncode == 1 and "wrong password" in result.stderr
    assert json.loads(run("show", str(ledger_id), "--json").stdout)["state"] == "OPEN"  # untouched
