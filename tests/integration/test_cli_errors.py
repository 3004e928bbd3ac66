"""Every kind of dlog command, pointed at no ZooKeeper, at a bad address or at a cluster with no
bookies, prints one line saying what is wrong and what to do, exits non-zero, and leaves nothing
behind; a refused connection is said at once, and library messages name CLI flags."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from dlog_tools.cluster import free_port


def dlog(*arguments: str, stdin: str = "", timeout_s: str = "1") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlog_tools.cli", *arguments], input=stdin,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DLOG_ZK_TIMEOUT_S": timeout_s})


@pytest.mark.parametrize("arguments", [
    ("stream", "list"), ("stream", "create", "s"), ("write", "s"), ("read", "s"),
    ("truncate", "s", "--before", "1:0"), ("retention", "apply"),
    ("export", "s", "--out", "/tmp/x.parquet", "--force"), ("ledger", "show", "1"), ("bookie", "list"),
])
def test_unreachable_zookeeper_is_one_line_at_once(arguments):
    nowhere = f"127.0.0.1:{free_port()}"
    # a 30 s session timeout: only the connection's refusal, seen at once, can produce this line
    result = dlog(*arguments, "--zk", nowhere, stdin="a\n", timeout_s="30")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0] == (f"dlog: cannot reach ZooKeeper at {nowhere}: {nowhere} refused the connection; is it "
                        "running there? (pass --zk HOST:PORT or set DLOG_ZK)")


@pytest.mark.parametrize("address, words", [
    ("127.0.0.1:abc", "bad ZooKeeper address '127.0.0.1:abc': port 'abc' is not a number in 1..65535"),
    ("127.0.0.1:99999", "bad ZooKeeper address '127.0.0.1:99999': port '99999' is not a number in 1..65535"),
    ("", "the ZooKeeper address is empty; write host:port[,host:port...], e.g. 127.0.0.1:2181"),
    ("no-such-host.invalid:2181", "cannot resolve host 'no-such-host.invalid'"),
])
@pytest.mark.parametrize("command", [("stream", "list"), ("ledger", "list"), ("bookie", "list")])
def test_a_bad_zookeeper_address_is_one_line(address, words, command):
    result = dlog(*command, "--zk", address, timeout_s="30")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1 and words in lines[0], result.stderr


def test_messages_name_cli_flags_not_python_arguments(zk_server, cluster_factory):
    cluster = cluster_factory(bookies=1)
    common = ("--zk", cluster.zk_address, "--zk-root", cluster.zk_root, "--namespace", f"n{uuid.uuid4().hex[:6]}")
    dlog("stream", "create", "flags", "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1", *common,
         timeout_s="10")
    for batch in ("a\n", "b\n"):  # two runs, two segments
        assert dlog("write", "flags", *common, stdin=batch, timeout_s="10").returncode == 0
    first = json.loads(dlog("read", "flags", "--json", *common, timeout_s="10").stdout.splitlines()[0])
    second = json.loads(dlog("read", "flags", "--json", *common, timeout_s="10").stdout.splitlines()[1])
    assert dlog("truncate", "flags", "--before", second["offset"], *common, timeout_s="10").returncode == 0
    result = dlog("read", "flags", "--from", first["offset"], *common, timeout_s="10")
    assert result.returncode == 1
    assert result.stderr.strip().endswith("pass --skip-truncated to start at the earliest record"), result.stderr
    assert "skip_truncated" not in result.stderr


def test_a_cluster_without_bookies_refuses_writes_and_changes_nothing(zk_server):
    from kazoo.client import KazooClient

    root, namespace = f"/t-{uuid.uuid4().hex[:8]}", f"n{uuid.uuid4().hex[:6]}"
    common = ("--zk", zk_server.address, "--zk-root", root, "--namespace", namespace)
    refused = dlog("stream", "create", "quiet", *common, timeout_s="10")  # nothing at that root: a typo
    assert refused.returncode == 1 and refused.stderr.startswith(f"dlog: no bookies are registered under --zk-root "
                                                                 f"{root}: nothing is there"), refused.stderr
    zk = KazooClient(hosts=zk_server.address)
    zk.start(timeout=30)
    try:
        assert zk.exists(root) is None and zk.exists(f"/dlog/{namespace}") is None
        zk.ensure_path(f"{root}/available")  # a cluster whose bookies are all gone
    finally:
        zk.stop()
        zk.close()
    created = dlog("stream", "create", "quiet", *common, timeout_s="10")
    assert created.returncode == 0 and "no bookies are registered under --zk-root" in created.stderr
    result = dlog("write", "quiet", *common, stdin="hello\n", timeout_s="10")
    assert result.returncode == 1
    assert result.stderr.strip() == ("dlog: need 3 writable bookies, 0 available; start more bookies or "
                                     "lower the ensemble size")
    info = json.loads(dlog("stream", "info", "quiet", "--json", *common, timeout_s="10").stdout)
    assert info["segments"] == []  # no half-made segment left behind
