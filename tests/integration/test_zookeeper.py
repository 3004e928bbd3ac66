"""Proves the real ZooKeeper server harness and the asyncio kazoo adapter work against a real server:
start/stop/restart/pause of the process, CAS, multi atomicity, ephemerals, watches and bounded failures."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from bookkeeper.errors import MetadataError, MetadataExistsError, MetadataNotFoundError, MetadataVersionError
from bookkeeper.meta.zk import AsyncZooKeeper, CheckOp, CreateOp, DeleteOp, SetOp
from bookkeeper.meta.zkserver import EmbeddedZooKeeper, four_letter_word, pick_free_port
from tests.helpers import eventually

pytestmark = pytest.mark.timeout(60)

# Note: start/stop/restart run on the test's own thread on purpose. The server gets SIGKILL when
# the thread that started it exits, so starting it from asyncio.to_thread would be a trap.


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _reachable(client: AsyncZooKeeper, path: str = "/") -> bool:
    try:
        return await client.exists(path)
    except MetadataError:
        return False


# ------------------------------------------------------------------------------ the server process


def test_server_starts_and_answers_on_loopback_only(zk_server: EmbeddedZooKeeper) -> None:
    host, port = zk_server.address.split(":")
    assert host == "127.0.0.1" and int(port) == zk_server.port > 0
    assert zk_server.pid is not None and _process_exists(zk_server.pid)
    assert four_letter_word(host, zk_server.port, "ruok") == "imok"
    assert "Mode: standalone" in four_letter_word(host, zk_server.port, "srvr")
    assert "clientPortAddress=127.0.0.1\n" in (zk_server.data_dir / "zoo.cfg").read_text()


def test_stop_kills_only_our_pid_and_is_idempotent(tmp_path: Path) -> None:
    with EmbeddedZooKeeper(tmp_path / "a") as first, EmbeddedZooKeeper(tmp_path / "b") as second:
        first_pid = first.pid
        assert first_pid is not None
        first.stop()
        first.stop()
        assert first.pid is None and not _process_exists(first_pid)
        assert second.running and four_letter_word("127.0.0.1", second.port, "ruok") == "imok"


async def test_restart_keeps_data_and_port_and_clients_reconnect(tmp_path: Path) -> None:
    server = EmbeddedZooKeeper(tmp_path / "zk")
    server.start()
    client = AsyncZooKeeper(server.address, timeout_s=2.0)
    try:
        await client.start()
        states: list[str] = []
        client.add_state_listener(states.append)
        await client.create("/kept", b"payload")
        port = server.port
        server.restart()
        assert server.port == port
        await eventually(lambda: _reachable(client, "/kept"), timeout_s=20)
        assert await client.get("/kept") == (b"payload", 0)
        assert states[0] == "suspended" and states[-1] == "connected"
    finally:
        await client.close()
        server.stop()


async def test_pause_makes_operations_fail_in_time_and_resume_heals(tmp_path: Path) -> None:
    server = EmbeddedZooKeeper(tmp_path / "zk")
    server.start()
    client = AsyncZooKeeper(server.address, timeout_s=1.0)
    try:
        await client.start()
        server.pause()
        started = time.monotonic()
        with pytest.raises(MetadataError, match="no answer"):
            await client.exists("/")
        assert time.monotonic() - started < 1.0 + 1.0
        server.resume()
        await eventually(lambda: _reachable(client), timeout_s=20)
    finally:
        if server.paused:
            server.resume()
        await client.close()
        server.stop()


# ------------------------------------------------------------------------------ the asyncio client


async def test_create_get_set_compare_and_set(zk: AsyncZooKeeper, zk_root: str) -> None:
    path = f"{zk_root}/node"
    assert await zk.create(path, b"v0", makepath=True) == path
    assert await zk.get(path) == (b"v0", 0)
    assert await zk.set(path, b"v1", version=0) == 1
    with pytest.raises(MetadataVersionError):
        await zk.set(path, b"stale", version=0)
    assert await zk.get(path) == (b"v1", 1)


async def test_errors_map_to_the_dlog_tree(zk: AsyncZooKeeper, zk_root: str) -> None:
    await zk.ensure_path(f"{zk_root}/parent/child")
    with pytest.raises(MetadataNotFoundError):
        await zk.get(f"{zk_root}/missing")
    with pytest.raises(MetadataNotFoundError):
        await zk.children(f"{zk_root}/missing")
    with pytest.raises(MetadataExistsError):
        await zk.create(f"{zk_root}/parent")
    with pytest.raises(MetadataError, match="has children"):
        await zk.delete(f"{zk_root}/parent")
    assert await zk.get_or_none(f"{zk_root}/missing") is None
    await zk.delete(zk_root, recursive=True)
    assert not await zk.exists(zk_root)


async def test_sequence_nodes_come_back_in_creation_order(zk: AsyncZooKeeper, zk_root: str) -> None:
    await zk.ensure_path(zk_root)
    created = [await zk.create(f"{zk_root}/item-", sequence=True) for _ in range(3)]
    assert [f"{zk_root}/{name}" for name in await zk.children(zk_root)] == created


async def test_multi_is_all_or_nothing(zk: AsyncZooKeeper, zk_root: str) -> None:
    await zk.ensure_path(zk_root)
    with pytest.raises(MetadataVersionError):
        await zk.multi([CreateOp(f"{zk_root}/a", b"a"), CheckOp(zk_root, version=5)])
    assert not await zk.exists(f"{zk_root}/a")
    with pytest.raises(MetadataExistsError):
        await zk.multi([CreateOp(f"{zk_root}/b"), CreateOp(zk_root)])
    assert not await zk.exists(f"{zk_root}/b")

    await zk.multi([CreateOp(f"{zk_root}/a", b"a"), CheckOp(zk_root, version=0), SetOp(zk_root, b"r")])
    assert await zk.get(f"{zk_root}/a") == (b"a", 0)
    assert await zk.get(zk_root) == (b"r", 1)
    with pytest.raises(MetadataNotFoundError):
        await zk.multi([DeleteOp(f"{zk_root}/a"), DeleteOp(f"{zk_root}/missing")])
    assert await zk.exists(f"{zk_root}/a")


async def test_ephemeral_node_disappears_after_its_client_closes(zk_server: EmbeddedZooKeeper, zk: AsyncZooKeeper,
                                                                 zk_root: str) -> None:
    await zk.ensure_path(zk_root)
    owner = AsyncZooKeeper(zk_server.address)
    await owner.start()
    try:
        await owner.create(f"{zk_root}/alive", ephemeral=True)
        assert await zk.exists(f"{zk_root}/alive")
    finally:
        await owner.close()
    await eventually(lambda: _missing(zk, f"{zk_root}/alive"), timeout_s=10)


async def _missing(client: AsyncZooKeeper, path: str) -> bool:
    return not await client.exists(path)


async def test_children_watch_runs_on_the_loop_and_unsubscribes(zk: AsyncZooKeeper, zk_root: str) -> None:
    loop_thread = threading.get_ident()
    seen: list[list[str]] = []
    threads: set[int] = set()

    def changed(children: list[str]) -> None:
        threads.add(threading.get_ident())
        asyncio.get_running_loop()  # raises unless called on the event loop
        seen.append(children)

    unsubscribe = zk.watch_children(zk_root, changed)  # the node does not exist yet
    await eventually(lambda: seen == [[]])
    await zk.ensure_path(zk_root)
    await zk.create(f"{zk_root}/a")
    await eventually(lambda: seen and seen[-1] == ["a"])
    assert threads == {loop_thread}

    unsubscribe()
    later: list[list[str]] = []
    zk.watch_children(zk_root, later.append)
    await zk.create(f"{zk_root}/b")
    await eventually(lambda: later and later[-1] == ["a", "b"])
    assert seen[-1] == ["a"]


async def test_data_watch_sees_changes_and_deletion(zk: AsyncZooKeeper, zk_root: str) -> None:
    await zk.create(zk_root, b"one")
    seen: list[tuple[bytes | None, int]] = []
    zk.watch_data(zk_root, lambda data, version: seen.append((data, version)))
    await eventually(lambda: seen == [(b"one", 0)])
    await zk.set(zk_root, b"two")
    await eventually(lambda: seen[-1] == (b"two", 1))
    await zk.delete(zk_root)
    await eventually(lambda: seen[-1] == (None, -1))


async def test_connecting_to_a_dead_port_fails_within_the_timeout() -> None:
    client = AsyncZooKeeper(f"127.0.0.1:{pick_free_port()}", timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(MetadataError, match="cannot reach ZooKeeper"):
        await client.start()
    assert time.monotonic() - started < 1.0 + 1.5
    await client.close()


def test_ports_picked_one_after_another_are_all_different() -> None:
    """A cluster picks its bookies' ports before any of them binds: the same port twice made a
    bookie find its sibling's cookie and refuse to start (about once per suite run, by chance)."""
    ports = [pick_free_port() for _ in range(500)]  # by chance alone, a repeat is near certain
    assert len(set(ports)) == len(ports)
