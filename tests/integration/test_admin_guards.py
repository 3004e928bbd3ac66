"""Destructive admin commands refuse what would break a stream unless forced: `ledger delete` and
`ledger recover` of a stream's segment, `export --out` over a file or into a missing folder; a
segment whose ledger was deleted anyway shows as damaged in `stream info` and on the status page."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

import dlog
from tests.helpers import dlog_runner, one_error_line
from dlog_tools.cluster import LocalCluster
from dlog_tools.ui import Collector, UiOptions


@pytest.fixture(scope="module")
def guarded(zk_server, tmp_path_factory):
    root, namespace = f"/t-{uuid.uuid4().hex[:8]}", f"ns{uuid.uuid4().hex[:6]}"
    cluster = LocalCluster(tmp_path_factory.mktemp("guards"), bookies=3, zk_root=root, zk_server=zk_server)
    cluster.start()
    yield cluster, namespace, dlog_runner(zk_server.address, root, namespace)
    cluster.stop()


def segments(run, stream: str) -> list[dict]:
    return json.loads(run("stream", "info", stream, "--json").stdout)["segments"]


def test_ledger_delete_and_recover_refuse_a_streams_segment_unless_forced(guarded):
    cluster, namespace, run = guarded
    run("stream", "create", "kept")
    run("write", "kept", stdin="a\nb\nc\n")  # each run of `dlog write` seals its segment at exit
    run("write", "kept", stdin="d\n")
    first, second = segments(run, "kept")
    refused = one_error_line(run("ledger", "delete", str(first["ledger"]), ok=False, namespaced=False))
    assert refused == (f"dlog: ledger {first['ledger']} is segment 1 (completed) of stream 'kept' in namespace "
                       f"'{namespace}'; deleting it would lose that segment's records (use `dlog truncate` "
                       "or retention to remove old records); pass --force to do it anyway")
    assert run("read", "kept").stdout.splitlines() == ["a", "b", "c", "d"]  # nothing changed

    with dlog.connect(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        with ns.open_writer("kept") as writer:  # a live writer: its segment's ledger is open
            writer.write(b"e")
            live = segments(run, "kept")[-1]
            assert live["state"] == "in_progress" and live["records"] == 1
            refused = one_error_line(run("ledger", "recover", str(live["ledger"]), ok=False, namespaced=False))
            assert f"ledger {live['ledger']} is segment 3 (in_progress) of stream 'kept'" in refused
            assert "recovering it would fence that stream's writer" in refused
            writer.write(b"f")  # still the writer: nothing was fenced

    run("ledger", "delete", str(second["ledger"]), "--force", namespaced=False)
    damaged = [s for s in segments(run, "kept") if s["damaged"]]
    assert [(s["sequence"], s["damaged"]) for s in damaged] == [
        (2, f"ledger {second['ledger']} is missing: the segment's records are lost")]
    human = run("stream", "info", "kept").stdout
    assert f"DAMAGED       segment 2: ledger {second['ledger']} is missing" in human
    assert "DAMAGED" in next(line for line in human.splitlines() if f" {second['ledger']} " in line)

    async def page_segments() -> list[dict]:
        collector = Collector(UiOptions(cluster.zk_address, cluster.zk_root, namespaces=(namespace,)))
        try:
            snapshot = await collector.snapshot()
        finally:
            await collector.close()
        stream = next(n for n in snapshot["namespaces"] if n["name"] == namespace)["streams"][0]
        return stream["segments"]

    shown = {s["sequence"]: s for s in asyncio.run(page_segments())}
    assert shown[2]["damaged"] and "DAMAGED" in shown[2]["note"]
    assert not shown[1]["damaged"] and not shown[3]["damaged"]


def test_export_never_overwrites_nor_creates_folders_unless_forced(guarded, tmp_path):
    _, _, run = guarded
    run("stream", "create", "exported")
    run("write", "exported", stdin="x\ny\n")
    existing = tmp_path / "existing.parquet"
    existing.write_bytes(b"yesterday's export")
    refused = one_error_line(run("export", "exported", "--out", str(existing), ok=False))
    assert refused == (f"dlog: {existing} already exists; choose another --out or pass --force to "
                       "overwrite it")
    assert existing.read_bytes() == b"yesterday's export"
    nested = tmp_path / "no" / "such" / "folder" / "out.parquet"
    refused = one_error_line(run("export", "exported", "--out", str(nested), ok=False))
    assert refused == (f"dlog: folder {nested.parent} does not exist; create it first or pass --force "
                       "to create it")
    assert not (tmp_path / "no").exists()
    assert json.loads(run("export", "exported", "--out", str(nested), "--force", "--json").stdout)["records"] == 2
    assert json.loads(run("export", "exported", "--out", str(existing), "--force", "--json").stdout)["records"] == 2
