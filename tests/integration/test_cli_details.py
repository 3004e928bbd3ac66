"""The small things a first hour runs into, through the real commands: `retention set --age 0`,
counts in words ("1 record"), `truncate --before latest`, `stream info` without --json (settings,
live records only, uncut headers, subscriptions), `stream alter` of every setting, `ledger show`
without Python syntax, and bench tables that fit an 80-column terminal."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import uuid

import pytest

from tests.helpers import dlog_runner, one_error_line
from dlog_tools.cluster import LocalCluster


@pytest.fixture(scope="module")
def details(zk_server, tmp_path_factory):
    root, namespace = f"/t-{uuid.uuid4().hex[:8]}", f"ns{uuid.uuid4().hex[:6]}"
    cluster = LocalCluster(tmp_path_factory.mktemp("details"), bookies=1, zk_root=root, zk_server=zk_server)
    cluster.start()
    yield dlog_runner(zk_server.address, root, namespace)
    cluster.stop()


def create(run, name: str, *options: str) -> None:
    run("stream", "create", name, "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1", *options)


def test_retention_age_zero_means_off_and_counts_read_as_words(details):
    run = details
    create(run, "worded", "--retention-age", "7d")
    assert run("retention", "set", "worded", "--age", "0").stdout == (
        "worded: retention age off, size off, keeps what subscribers have not read\n")
    assert json.loads(run("stream", "info", "worded", "--json").stdout)["config"]["retention_age_ms"] == 0
    assert run("write", "worded", stdin="one\n").stdout.startswith("wrote 1 record to worded (")
    assert run("truncate", "worded", "--before", "latest").stdout.endswith(": removed 0 segments\n")


def test_truncate_before_latest_removes_every_record_so_far(details):
    run = details
    create(run, "emptied")
    for batch in ("a\nb\n", "c\n"):
        run("write", "emptied", stdin=batch)
    result = json.loads(run("truncate", "emptied", "--before", "latest", "--json").stdout)
    assert result["segments_removed"] == [1]
    assert run("read", "emptied").stdout == ""
    run("write", "emptied", stdin="d\n")
    assert run("read", "emptied").stdout == "d\n"  # the stream goes on


def test_stream_info_shows_settings_live_records_and_subscriptions(details):
    run = details
    create(run, "described", "--roll-records", "2", "--retention-size", "1GiB")
    for batch in ("a\nb\nc\n", "d\ne\n", "f\n"):
        run("write", "described", stdin=batch)
    segments = json.loads(run("stream", "info", "described", "--json").stdout)["segments"]
    run("truncate", "described", "--before", f"{segments[1]['ledger']}:0")  # the first segment: 3 records
    run("read", "described", "--subscription", "reports", "--max", "1")
    info = run("stream", "info", "described").stdout
    assert "  roll          after 256.0 MiB, 2h or 2 records, whichever comes first" in info
    assert "  retention     age off, size 1.0 GiB, keeps what subscribers have not read" in info
    assert "  records       3 records in 2 live segments (1 truncated)" in info  # truncated ones not counted
    assert "reports" in info and "subscriptions" in info
    header = next(line for line in info.splitlines() if "sequence" in line)
    assert "first_time" in header and "last_time" in header  # piped: nothing cut at 80 columns
    assert "ms" not in header


def test_stream_alter_changes_every_setting(details):
    run = details
    create(run, "altered")
    run("stream", "alter", "altered", "--roll-size", "64MiB", "--roll-age", "30m", "--roll-records", "1000",
        "--retention-age", "7d", "--retention-size", "10GiB", "--ignore-subscribers")
    config = json.loads(run("stream", "info", "altered", "--json").stdout)["config"]
    assert (config["roll_bytes"], config["roll_age_ms"], config["roll_records"], config["retention_age_ms"],
            config["retention_bytes"], config["retention_keeps_unconsumed"]) == (
        64 * 2**20, 30 * 60_000, 1000, 7 * 86_400_000, 10 * 2**30, False)
    assert run("stream", "alter", "altered", "--retention-age", "0").stdout == "altered: retention_age 7d -> off\n"
    assert "nothing to change" in one_error_line(run("stream", "alter", "altered", ok=False))
    assert "bad size" in run("stream", "alter", "altered", "--roll-size", "big", ok=False).stderr


def test_ledger_show_prints_no_python_syntax(details):
    run = details
    create(run, "shown")
    run("write", "shown", stdin="x\n")
    ledger = json.loads(run("stream", "info", "shown", "--json").stdout)["segments"][0]["ledger"]
    shown = run("ledger", "show", str(ledger), namespaced=False).stdout
    assert "{" not in shown and "[" not in shown and "(" not in shown, shown
    assert "custom          namespace=" in shown and "stream=shown" in shown
    assert "fragment        entries 0-0: 127.0.0.1:" in shown


def test_bench_tables_fit_an_80_column_terminal():
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    environment = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    process = subprocess.Popen([sys.executable, "-m", "dlog_tools.cli", "bench", "codec", "--records", "200",
                                "--batch-records", "100", "--repeat", "1"],
                               stdin=follower, stdout=follower, stderr=follower, env=environment)
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    assert process.wait(timeout=120) == 0, output.decode(errors="replace")
    lines = output.decode().splitlines()
    assert any("encode_records_per_s" in line for line in lines)
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
