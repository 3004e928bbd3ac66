"""`dlog read` is a console consumer and `dlog subscription` manages consumer positions: --from a
time, --print-key/--print-timestamp, --to checked against the stream, stream positions in --json and
as --from/--to, Ctrl-C ends a follow quietly,
--subscription commits as it goes, and list/describe/reset/delete show exact lag in records and
bytes."""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
import sys
import time
import uuid

import pytest

import dlog
from tests.helpers import dlog_runner, eventually_blocking, one_error_line
from dlog_tools.cluster import LocalCluster

BASE_MS = 1_700_000_000_000  # records one minute apart from here


@pytest.fixture(scope="module")
def consumer(zk_server, tmp_path_factory):
    root, namespace = f"/t-{uuid.uuid4().hex[:8]}", f"ns{uuid.uuid4().hex[:6]}"
    cluster = LocalCluster(tmp_path_factory.mktemp("consumer"), bookies=1, zk_root=root, zk_server=zk_server)
    cluster.start()
    run = dlog_runner(zk_server.address, root, namespace)
    with dlog.connect(zk_server.address, namespace, bookkeeper_root=root) as ns:
        yield run, ns, ["--zk", zk_server.address, "--zk-root", root, "--namespace", namespace]
    cluster.stop()


def create(run, name: str) -> None:
    run("stream", "create", name, "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1")


def write_minutes(run, name: str, count: int, base_ms: int = BASE_MS) -> None:
    lines = [json.dumps({"key": f"k{i}", "value": f"v{i}", "timestamp": base_ms + i * 60_000}) for i in range(count)]
    run("write", name, "--format", "jsonl", stdin="\n".join(lines) + "\n")


def local_text(time_ms: int) -> str:
    return datetime.datetime.fromtimestamp(time_ms / 1000).strftime("%Y-%m-%dT%H:%M")


def test_read_from_a_time_with_keys_and_timestamps(consumer):
    run, _, _ = consumer
    create(run, "timed")
    write_minutes(run, "timed", 5)
    assert run("read", "timed", "--from", local_text(BASE_MS + 3 * 60_000)).stdout.splitlines() == ["v3", "v4"]
    lines = run("read", "timed", "--print-key", "--print-timestamp", "--max", "1").stdout.splitlines()
    assert lines == [f"{datetime.datetime.fromtimestamp(BASE_MS / 1000).astimezone().isoformat(sep=' ', timespec='milliseconds')}\tk0\tv0"]
    now_ms = int(time.time() * 1000)
    create(run, "recent")
    write_minutes(run, "recent", 4, base_ms=now_ms - 40 * 60_000)  # 40, 39, 38 and 37 minutes ago
    run("write", "recent", "--format", "jsonl", stdin=json.dumps({"value": "new", "timestamp": now_ms}) + "\n")
    assert run("read", "recent", "--from", "-15m").stdout.splitlines() == ["new"]
    assert "bad --from 'yesterday'" in one_error_line(run("read", "timed", "--from", "yesterday", ok=False))


def test_to_is_checked_against_the_stream_and_stops_in_stream_order(consumer):
    run, _, _ = consumer
    create(run, "bounded")
    write_minutes(run, "bounded", 3)
    write_minutes(run, "bounded", 3, base_ms=BASE_MS + 10 * 60_000)  # a second segment
    offsets = [json.loads(line)["offset"] for line in run("read", "bounded", "--json").stdout.splitlines()]
    assert run("read", "bounded", "--to", offsets[1]).stdout.splitlines() == ["v0", "v1"]
    ledger, entry, _ = offsets[1].split(":")
    past_slots = f"{ledger}:{entry}:99"  # beyond the entry's records: stops at the entry's end
    assert run("read", "bounded", "--to", past_slots).stdout.splitlines() == ["v0", "v1", "v2"]
    assert one_error_line(run("read", "bounded", "--from", offsets[4], "--to", offsets[1], ok=False)) == (
        f"dlog: --to {offsets[1]} is before --from {offsets[4]}: nothing would be read")
    assert "is not in stream 'bounded': no live segment has ledger 999" in one_error_line(
        run("read", "bounded", "--to", "999:0", ok=False))
    assert f"--to {ledger}:7:0 is past the end of its segment" in one_error_line(
        run("read", "bounded", "--to", f"{ledger}:7", ok=False))


def test_json_shows_each_records_stream_position_and_from_and_to_take_positions(consumer):
    run, _, _ = consumer
    create(run, "positioned")
    write_minutes(run, "positioned", 3)
    write_minutes(run, "positioned", 3, base_ms=BASE_MS + 10 * 60_000)  # a second segment
    lines = [json.loads(line) for line in run("read", "positioned", "--json").stdout.splitlines()]
    assert [(line["value"], line["position"]) for line in lines] == [(f"v{i % 3}", i) for i in range(6)]
    assert run("read", "positioned", "--from", "2", "--to", "4").stdout.splitlines() == ["v2", "v0", "v1"]
    assert one_error_line(run("read", "positioned", "--from", "7", ok=False)) == (
        "dlog: position 7 of stream 'positioned' is in the future: the next record written gets position 6")
    assert one_error_line(run("read", "positioned", "--from", "4", "--to", "2", ok=False)) == (
        "dlog: --to 2 is before --from 4: nothing would be read")


def test_a_subscription_commits_as_it_reads_and_ctrl_c_ends_a_follow_quietly(consumer):
    run, ns, scope = consumer
    create(run, "followed")
    write_minutes(run, "followed", 2)
    reading = subprocess.Popen([sys.executable, "-m", "dlog_tools.cli", "read", "followed", "--follow",
                                "--subscription", "tail", "--commit-every", "1", *scope],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def committed() -> str | None:
            offset = ns.subscriptions("followed").get("tail")
            return None if offset is None else str(offset)

        last = [json.loads(line)["offset"] for line in run("read", "followed", "--json").stdout.splitlines()][-1]
        ledger, entry, slot = map(int, last.split(":"))
        eventually_blocking(lambda: committed() == f"{ledger}:{entry}:{slot + 1}", timeout_s=30,
                            message="committed while still following")
        reading.send_signal(signal.SIGINT)
        out, err = reading.communicate(timeout=60)
    finally:
        reading.kill()
    assert reading.returncode == 0 and "Aborted" not in err and err == "", err
    assert out.splitlines() == ["v0", "v1"]
    write_minutes(run, "followed", 3, base_ms=BASE_MS + 60 * 60_000)
    assert run("read", "followed", "--subscription", "tail").stdout.splitlines() == ["v0", "v1", "v2"]  # the new ones
    assert run("read", "followed", "--subscription", "tail").stdout == ""  # and it committed at the end


def test_subscription_list_describe_reset_and_delete_with_lag(consumer):
    run, ns, _ = consumer
    create(run, "lagged")
    write_minutes(run, "lagged", 4)
    write_minutes(run, "lagged", 6, base_ms=BASE_MS + 10 * 60_000)
    info = json.loads(run("stream", "info", "lagged", "--json").stdout)
    first, second = info["segments"]
    run("read", "lagged", "--subscription", "billing", "--max", "3")
    described = json.loads(run("subscription", "describe", "lagged", "billing", "--json").stdout)
    expected_bytes = round(first["bytes"] * 1 / 4) + second["bytes"]
    assert (described["lag_records"], described["lag_bytes"], described["segment"]) == (7, expected_bytes, 1)
    human = run("subscription", "describe", "lagged", "billing").stdout
    assert "lag         7 records" in human and "75% read" in human

    run("subscription", "reset", "lagged", "audit", "--to", "earliest")
    run("subscription", "reset", "lagged", "late", "--to", local_text(BASE_MS + 12 * 60_000))
    listed = {row["subscription"]: row for row in json.loads(run("subscription", "list", "--json").stdout)["subscriptions"]
              if row["stream"] == "lagged"}  # the namespace's other streams have subscriptions too
    assert {name: row["lag_records"] for name, row in listed.items()} == {"billing": 7, "audit": 10, "late": 4}
    assert run("read", "lagged", "--subscription", "late").stdout.splitlines() == ["v2", "v3", "v4", "v5"]
    assert listed["audit"]["lag_bytes"] == first["bytes"] + second["bytes"]
    table = run("subscription", "list", "lagged").stdout
    assert "billing" in table and "audit" in table

    reset = run("subscription", "reset", "lagged", "billing", "--to", "latest").stdout
    assert reset.startswith("subscription billing of stream lagged: ") and reset.rstrip().endswith(
        f"-> {second['ledger']}:{second['last_entry'] + 1}:0")
    assert json.loads(run("subscription", "describe", "lagged", "billing", "--json").stdout)["lag_records"] == 0
    run("subscription", "delete", "lagged", "billing")
    assert "billing" not in ns.subscriptions("lagged")
    assert one_error_line(run("subscription", "delete", "lagged", "billing", ok=False)) == (
        "dlog: stream 'lagged' has no subscription 'billing'")
    assert "has no subscription 'nobody'" in one_error_line(
        run("subscription", "describe", "lagged", "nobody", ok=False))
    assert "no live segment has ledger 999" in one_error_line(
        run("subscription", "reset", "lagged", "x", "--to", "999:0", ok=False))
