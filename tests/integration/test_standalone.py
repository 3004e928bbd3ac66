"""`dlog standalone` starts ZooKeeper and N bookie processes, prints its ready line, stops cleanly on
SIGTERM, and keeps its data (and bookie identities) across a restart with the same --dir. A second
standalone on the same directory, or on a port another process holds, is refused in one line that
names the holder, and changes nothing."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bookkeeper.client.connection import BookieConnection
from bookkeeper.errors import PortInUseError
from bookkeeper.meta import zkserver
from bookkeeper.meta.zkserver import EmbeddedZooKeeper
from bookkeeper.protocol.entry import Digest, DigestType, master_key, pack_entry
from dlog_tools.cluster import LineReader, LocalCluster, free_port

READY = re.compile(r"^dlog standalone ready zk=(\S+) bookies=(\S+)")


def start_standalone(directory: Path, zk_port: int, bookies: int,
                     *options: str) -> tuple[subprocess.Popen, str, list[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "dlog_tools.cli", "standalone", "--dir", str(directory), "--bookies",
         str(bookies), "--zk-port", str(zk_port), "--ui-port", "-1", *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = LineReader(process).line_starting("dlog standalone ready", 90)
    if line is None:
        process.kill()
        with process.stdout, process.stderr:
            raise AssertionError(f"standalone not ready (status {process.wait()}): {process.stderr.read()}")
    match = READY.match(line)
    assert match, line
    addresses = [] if match.group(2) == "-" else match.group(2).split(",")
    return process, match.group(1), addresses


def run_standalone(directory: Path, bookies: int, zk_port: int | None = None) -> subprocess.CompletedProcess:
    """A standalone expected to refuse: it must exit on its own."""
    port = ["--zk-port", str(zk_port)] if zk_port is not None else []
    return subprocess.run([sys.executable, "-m", "dlog_tools.cli", "standalone", "--dir", str(directory),
                           "--bookies", str(bookies), "--ui-port", "-1", *port],
                          capture_output=True, text=True, timeout=90)


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def stop_standalone(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGTERM)
    status = process.wait(timeout=60)
    process.stdout.close()
    process.stderr.close()
    return status


def list_bookies(zk: str) -> list[dict]:
    result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "bookie", "list", "--json", "--zk", zk],
                            capture_output=True, text=True, timeout=60, check=True)
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_standalone_runs_stops_and_keeps_data(tmp_path):
    zk_port = free_port()
    process, zk, addresses = start_standalone(tmp_path / "sa", zk_port, bookies=2)
    try:
        assert zk == f"127.0.0.1:{zk_port}"
        assert sorted(item["address"] for item in list_bookies(zk)) == sorted(addresses)
        key, digest = master_key(b"pw"), Digest.for_ledger(DigestType.CRC32C, b"pw")
        packed = pack_entry(digest, 1, 0, -1, 5, b"hello")

        async def write() -> None:
            connection = await BookieConnection.open(addresses[0])
            await connection.add(1, 0, key, packed)
            await connection.close()

        asyncio.run(write())
    finally:
        assert stop_standalone(process) == 0
    pids_left = subprocess.run(["pgrep", "-f", str(tmp_path / "sa")], capture_output=True, text=True)
    assert pids_left.stdout.strip() == ""  # every bookie and ZooKeeper process ended

    process, zk, again = start_standalone(tmp_path / "sa", zk_port, bookies=2)
    try:
        assert again == addresses  # same identities: the cookies still match

        async def read() -> bytes:
            connection = await BookieConnection.open(addresses[0])
            response = await connection.read(1, 0)
            await connection.close()
            return response.packed_entry

        assert asyncio.run(read()) == packed
    finally:
        assert stop_standalone(process) == 0


def test_standalone_with_no_bookies_runs_zookeeper_alone(tmp_path):
    process, zk, addresses = start_standalone(tmp_path / "zk-only", free_port(), bookies=0)
    try:
        assert addresses == [] and list_bookies(zk) == []
    finally:
        assert stop_standalone(process) == 0


def test_a_new_bookie_whose_port_was_taken_moves_to_another(cluster_factory):
    cluster = cluster_factory(bookies=2, start=False)
    taken = cluster.bookies[1].port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as thief:
        thief.bind(("127.0.0.1", taken))
        thief.listen()
        cluster.start()
        moved = cluster.bookies[1]
        assert moved.running and moved.port != taken
        restarted = LocalCluster(cluster.directory, bookies=2, zk_root=cluster.zk_root, zk_server=cluster.zk)
        assert [bookie.port for bookie in restarted.bookies] == [b.port for b in cluster.bookies]


def test_pick_free_port_stays_out_of_the_ephemeral_range():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(port < low for port in ports)
    assert len(ports) > 1  # random, so parallel test processes do not all race for one port


def test_a_second_standalone_is_refused_and_changes_nothing(tmp_path):
    zk_port = free_port()
    first, zk, addresses = start_standalone(tmp_path / "a", zk_port, bookies=1)
    state = (tmp_path / "a" / "cluster.json").read_bytes()
    try:
        same_dir = one_line(run_standalone(tmp_path / "a", bookies=1, zk_port=zk_port))
        assert same_dir.startswith(f"dlog: directory {tmp_path / 'a'} is in use by pid {first.pid} ")
        other_dir = one_line(run_standalone(tmp_path / "b", bookies=1, zk_port=zk_port))
        assert other_dir.startswith(f"dlog: ZooKeeper port 127.0.0.1:{zk_port} is held by pid ")
        assert "ZooKeeperServerMain" in other_dir  # what holds it
        assert [item["address"] for item in list_bookies(zk)] == addresses  # none of b's joined
        assert not (tmp_path / "b" / "cluster.json").exists()
        assert (tmp_path / "a" / "cluster.json").read_bytes() == state
    finally:
        assert stop_standalone(first) == 0
    bookie_port = int(addresses[0].rsplit(":", 1)[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as thief:
        thief.bind(("127.0.0.1", bookie_port))
        thief.listen()
        refused = one_line(run_standalone(tmp_path / "a", bookies=1))  # its saved ZooKeeper port
    assert refused.startswith(f"dlog: bookie 0 port 127.0.0.1:{bookie_port} is held by pid {os.getpid()} ")
    assert (tmp_path / "a" / "cluster.json").read_bytes() == state  # a failed start rewrites nothing


def test_a_zookeeper_that_lost_its_port_after_the_check_is_refused(zk_server, tmp_path, monkeypatch):
    # as if another server took the port between our check and java's bind: that server answers
    # `ruok`, ours exits; the start must not mistake the other one for ours
    monkeypatch.setattr(zkserver, "check_port_free", lambda *arguments: None, raising=False)
    second = EmbeddedZooKeeper(tmp_path / "zk", port=zk_server.port)
    with pytest.raises(PortInUseError, match=f"held by pid {zk_server.pid} "):
        second.start(timeout_s=60)
    assert not second.running
