"""Every kind of dlog command, pointed at no ZooKeeper or at a cluster with no bookies, prints one
line saying what is wrong and what to do, exits non-zero, and leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from tools.cluster import free_port


def dlog(*arguments: str, stdin: str = "", timeout_s: str = "1") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", *arguments], input=stdin,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DLOG_ZK_TIMEOUT_S": timeout_s})


@pytest.mark.parametrize("arguments", [
    ("stream", "list"), ("stream", "create", "s"), ("write", "s"), ("read", "s"),
    ("truncate", "s", "--before", "1:0"), ("retention", "apply"), ("export", "s", "--out", "/tmp/x.parquet"),
    ("ledger", "show", "1"), ("bookie", "list"),
])
def test_unreachable_zookeeper_is_one_line(arguments):
    nowhere = f"127.0.0.1:{free_port()}"
    result = dlog(*arguments, "--zk", nowhere, stdin="a\n")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0] == (f"dlog: cannot reach ZooKeeper at {nowhere} within 1.0s: is it running there? "
                        "(pass --zk HOST:PORT or set DLOG_ZK)")


def test_a_cluster_without_bookies_refuses_writes_and_changes_nothing(zk_server):
    root, namespace = f"/t-{uuid.uuid4().hex[:8]}", f"n{uuid.uuid4().hex[:6]}"
    common = ("--zk", zk_server.address, "--zk-root", root, "--namespace", namespace)
    assert dlog("stream", "create", "quiet", *common, timeout_s="10").returncode == 0
    result = dlog("write", "quiet", *common, stdin="hello\n", timeout_s="10")
    assert result.returncode == 1
    assert result.stderr.strip() == ("dlog: need 3 writable bookies, 0 available; start more bookies or "
                                     "lower the ensemble size")
    info = json.loads(dlog("stream", "info", "quiet", "--json", *common, timeout_s="10").stdout)
    assert info["segments"] == []  # no half-made segment left behind
