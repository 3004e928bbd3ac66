"""The stream commands work as documented against real processes: create, list, info, write, read,
truncate, retention, export, delete; bad input gets one line and a non-zero exit, changing nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlog_tools.cluster import LocalCluster


@pytest.fixture(scope="module")
def cli(zk_server, tmp_path_factory):
    root = f"/t-{uuid.uuid4().hex[:8]}"
    cluster = LocalCluster(tmp_path_factory.mktemp("cli"), bookies=3, zk_root=root, zk_server=zk_server)
    cluster.start()
    namespace = f"ns{uuid.uuid4().hex[:6]}"

    def run(*arguments: str, stdin: str = "", ok: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", *arguments, "--zk", zk_server.address,
                                 "--zk-root", root, "--namespace", namespace],
                                input=stdin, capture_output=True, text=True, timeout=120)
        if ok:
            assert result.returncode == 0, result.stderr
        return result

    yield run
    cluster.stop()


def json_lines(result) -> list:
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_create_write_read_info(cli):
    cli("stream", "create", "orders", "--roll-records", "4")
    assert json.loads(cli("stream", "list", "--json").stdout) == {"streams": ["orders"]}
    written = json.loads(cli("write", "orders", "--json", stdin="a\nb\nc\nd\ne\nf\n").stdout)
    assert written["count"] == 6 and written["first"].endswith(":0:0")
    jsonl = "\n".join(json.dumps({"key": f"k{i}", "value": f"v{i}", "timestamp": 1_700_000_000_000 + i})
                      for i in range(3))
    assert json.loads(cli("write", "orders", "--format", "jsonl", "--json", stdin=jsonl).stdout)["count"] == 3
    records = json_lines(cli("read", "orders", "--json"))
    assert [r["value"] for r in records] == ["a", "b", "c", "d", "e", "f", "v0", "v1", "v2"]
    assert records[6]["key"] == "k0" and records[6]["timestamp"] == 1_700_000_000_000
    assert records[0]["offset"] == written["first"]
    assert cli("read", "orders", "--max", "2").stdout.splitlines() == ["a", "b"]
    third = records[2]["offset"]
    assert cli("read", "orders", "--from", third, "--max", "1").stdout.strip() == "c"
    info = json.loads(cli("stream", "info", "orders", "--json").stdout)
    assert info["name"] == "orders"
    segment = info["segments"][0]
    assert set(segment) >= {"sequence", "ledger", "state", "first_entry", "last_entry", "records", "bytes"}
    assert sum(s["records"] for s in info["segments"]) == 9
    assert {s["state"] for s in info["segments"]} <= {"completed", "in_progress", "truncated"}


def test_record_headers_are_written_and_read_back(cli):
    cli("stream", "create", "traced")
    cli("write", "traced", stdin="plain\n")
    cli("write", "traced", "--header", "trace=abc", "-H", "empty=", "-H", "trace=def", stdin="x\ny\n")
    records = json_lines(cli("read", "traced", "--json", "--headers"))
    assert [r["headers"] for r in records] == [None, *[[["trace", "abc"], ["empty", ""], ["trace", "def"]]] * 2]
    assert "headers" not in json_lines(cli("read", "traced", "--json"))[1]  # only when asked
    failed = cli("write", "traced", "--header", "novalue", stdin="z\n", ok=False)
    assert "bad --header 'novalue': write KEY=VALUE" in failed.stderr


def test_truncate_retention_and_export(cli, tmp_path):
    cli("stream", "create", "events", "--roll-records", "5")
    for batch in range(4):
        cli("write", "events", stdin="".join(f"e{batch}-{i}\n" for i in range(5)))
    records = json_lines(cli("read", "events", "--json"))
    cut = records[7]["offset"]
    result = json.loads(cli("truncate", "events", "--before", cut, "--json").stdout)
    assert len(result["segments_removed"]) == 1
    assert [r["value"] for r in json_lines(cli("read", "events", "--json"))][0] == "e1-2"
    info = json.loads(cli("stream", "info", "events", "--json").stdout)
    live = [s["sequence"] for s in info["segments"] if s["state"] != "truncated"]
    assert len(live) == 3 and info["segments"][0]["state"] == "truncated"  # a tombstone
    cli("retention", "set", "events", "--size", "1")  # keep as little as possible
    plan = json.loads(cli("retention", "apply", "events", "--dry-run", "--json").stdout)
    assert plan["dry_run"] and [s["sequence"] for s in plan["segments"]] == live[:2]  # never the last
    assert len(json_lines(cli("read", "events", "--json"))) == 13  # a dry run removes nothing
    applied = json.loads(cli("retention", "apply", "events", "--json").stdout)
    assert [s["sequence"] for s in applied["segments"]] == live[:2]
    assert [r["value"] for r in json_lines(cli("read", "events", "--json"))] == [f"e3-{i}" for i in range(5)]
    parquet_path, arrow_path = tmp_path / "events.parquet", tmp_path / "events.arrow"
    exported = json.loads(cli("export", "events", "--out", str(parquet_path), "--json").stdout)
    assert exported["records"] == 5
    table = pq.read_table(parquet_path)
    assert table.column("value").to_pylist() == [f"e3-{i}".encode() for i in range(5)]
    assert table.column_names[:3] == ["ledger", "entry", "slot"]
    cli("export", "events", "--out", str(arrow_path), "--format", "arrow")
    with pa.ipc.open_file(str(arrow_path)) as arrow_file:
        assert arrow_file.read_all().num_rows == 5
    deleted = json.loads(cli("stream", "delete", "events", "--json").stdout)
    assert deleted["deleted"] == "events"
    assert "events" not in json.loads(cli("stream", "list", "--json").stdout)["streams"]


@pytest.mark.parametrize("arguments, words", [
    (("stream", "create", "bad//name"), "bad//name"),
    (("stream", "create", "ok-name", "--roll-size", "12 parsecs"), "bad size '12 parsecs'"),
    (("stream", "create", "ok-name", "--roll-age", "soon"), "bad duration 'soon'"),
    (("stream", "create", "ok-name", "--ensemble", "2", "--write-quorum", "3"), "write quorum"),
    (("read", "nope"), "stream 'nope' does not exist"),
    (("read", "orders2", "--from", "1:x"), "bad offset '1:x'"),
    (("truncate", "orders2", "--before", "-1:0"), "bad offset"),
    (("retention", "set", "orders2"), "nothing to set"),
])
def test_bad_input_gets_one_line_and_changes_nothing(cli, arguments, words):
    before = cli("stream", "list", "--json").stdout
    result = cli(*arguments, ok=False)
    assert result.returncode != 0
    assert words in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert cli("stream", "list", "--json").stdout == before
