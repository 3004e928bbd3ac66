"""Schema evolution of a typed stream on a real cluster: records written under three schema
versions read back in one schema (the latest, or an earlier one asked for) through the Python
reader, `dlog read`, Parquet export and the tier's files; refused changes change nothing."""

from __future__ import annotations

import asyncio
import json
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bookkeeper.errors import ConfigError
from dlog import Namespace
from dlog.offload import Offloader
from dlog.segments.codec import RecordSetCodec
from dlog.segments.metadata import TierPolicy
from dlog.segments.schemas import field_id_of, schema_version, versions_of
from dlog_spark.segments import commit_batch
from dlog_spark.sink import DlogCommitMessage
from dlog_tools.cluster import LocalCluster
from tests.helpers import dlog_runner, one_error_line

V1 = "id:int32, name:string, note:string?"
V2 = "id:int32, full_name#2:string, note:string?, score:float64?"  # adds a nullable field, renames `name`
V3 = "id:int64, full_name:string, score:float64?"  # widens `id`, drops the nullable `note`
REPLICATION = {"ensemble": 1, "write_quorum": 1, "ack_quorum": 1}


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("schemas"), bookies=1, zk_root=f"/s-{uuid.uuid4().hex[:8]}",
                           zk_server=zk_server)
    cluster.start()
    yield cluster
    cluster.stop()


NAMESPACE = f"schemas{uuid.uuid4().hex[:6]}"  # the dlog root is shared by every cluster of the session


def namespace(cluster) -> Namespace:
    return Namespace(cluster.zk_address, NAMESPACE, bookkeeper_root=cluster.zk_root)


async def write(ns: Namespace, name: str, columns: dict) -> None:
    """One segment of records (the writer's close seals it)."""
    async with ns.open_writer(name) as writer:
        await writer.write_batch(pa.record_batch(columns))


async def three_versions(ns: Namespace, name: str) -> None:
    await ns.create_stream(name, schema=V1, **REPLICATION)
    await write(ns, name, {"id": pa.array([1, 2], pa.int32()), "name": ["a", "b"], "note": ["n1", None]})
    await ns.alter_stream(name, schema=V2)
    await write(ns, name, {"id": pa.array([3, 4], pa.int32()), "full_name": ["c", "d"], "note": [None, "n4"],
                           "score": [0.5, None]})
    await ns.alter_stream(name, schema=V3)
    await write(ns, name, {"id": pa.array([2**40, 6], pa.int64()), "full_name": ["e", "f"], "score": [1.5, 2.5]})


async def read_rows(ns: Namespace, name: str, rows_max: int = 100, **options) -> tuple[pa.Schema, list[dict]]:
    """The records (up to about `rows_max`) as one table's rows, and its schema."""
    batches = []
    async with ns.open_reader(name, follow=False, **options) as reader:
        while sum(batch.num_rows for batch in batches) < rows_max and (entry := await reader.next_entry()):
            batches.append(entry.batch)
    table = pa.Table.from_batches(batches)
    return table.schema, table.to_pylist()


LATEST = [
    {"id": 1, "full_name": "a", "score": None}, {"id": 2, "full_name": "b", "score": None},
    {"id": 3, "full_name": "c", "score": 0.5}, {"id": 4, "full_name": "d", "score": None},
    {"id": 2**40, "full_name": "e", "score": 1.5}, {"id": 6, "full_name": "f", "score": 2.5}]


async def test_records_of_three_versions_read_in_one_schema(cluster, tmp_path):
    async with namespace(cluster) as ns:
        await three_versions(ns, "evolving")
        listing = await ns.store.segments("evolving")
        assert [segment.schema_version for segment in listing.segments] == [1, 2, 3]

        schema, rows = await read_rows(ns, "evolving")
        assert [(f.name, f.type, field_id_of(f)) for f in schema] == [
            ("id", pa.int64(), 1), ("full_name", pa.string(), 2), ("score", pa.float64(), 4)]
        assert rows == LATEST
        async with ns.open_reader("evolving", follow=False) as reader:  # record by record too
            records = [record async for record in reader]
        assert [record.fields for record in records] == LATEST

        # version 2 asked for: version 3's records without `note` read it as null (their ids fit int32)
        # version 2 asked for: `note` is back (null in version 3's records), `score` null in version 1's
        schema, rows = await read_rows(ns, "evolving", rows_max=4, schema_version=2)
        assert schema.names == ["id", "full_name", "note", "score"] and schema.field("id").type == pa.int32()
        assert rows == [{"id": 1, "full_name": "a", "note": "n1", "score": None},
                        {"id": 2, "full_name": "b", "note": None, "score": None},
                        {"id": 3, "full_name": "c", "note": None, "score": 0.5},
                        {"id": 4, "full_name": "d", "note": "n4", "score": None}]
        with pytest.raises(ConfigError, match="field 'id' \\(int64 -> int32\\)"):
            await read_rows(ns, "evolving", schema_version=1)  # 2**40 does not fit version 1's int32
        with pytest.raises(ConfigError, match="versions 1..3; there is no schema version 4"):
            await read_rows(ns, "evolving", schema_version=4)

        # the tier: each segment's file has its own version's columns; read back, it projects
        tier = tmp_path / "tier"
        tier.mkdir()
        await ns.set_tier("evolving", TierPolicy(uri=tier.as_uri(), delete_lag_ms=-1))
        report = await Offloader(ns).run("evolving", now=True)
        assert [o.sequence for o in report.offloaded] == [s.sequence for s in listing.segments], report.to_json()
        files = sorted(tier.rglob("*.parquet"))
        assert len(files) == 3
        assert [pq.read_schema(path).names[-3:] for path in files] == [
            ["id", "name", "note"], ["full_name", "note", "score"], ["id", "full_name", "score"]]
        assert all(field_id_of(field) is None for field in pq.read_schema(files[0]))  # Iceberg maps by name
        _, rows = await read_rows(ns, "evolving", prefer="tier")
        assert rows == LATEST


def test_the_command_line_creates_alters_reads_and_exports_in_one_schema(cluster, tmp_path):
    run = dlog_runner(cluster.zk_address, cluster.zk_root, NAMESPACE)
    run("stream", "create", "cli-typed", "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1",
        "--schema", V1, "--schema-compatibility", "full")
    spec = tmp_path / "v2.json"
    spec.write_text(json.dumps([{"name": "id", "type": "int32"}, {"name": "full_name", "type": "string", "id": 2},
                                {"name": "note", "type": "string", "nullable": True}]))
    refused = one_error_line(run("stream", "alter", "cli-typed", "--schema", "id:int64, name:string, note:string?",
                                 ok=False))
    assert "FORWARD" in refused and "field 'id' (id 1): int32 -> int64 narrows" in refused
    changed = run("stream", "alter", "cli-typed", "--schema", f"@{spec}").stdout
    assert "schema version 1 -> 2: id#1:int32, full_name#2:string, note#3:string?" in changed
    assert "schema        version 2 (FULL): id#1:int32, full_name#2:string, note#3:string?" in run(
        "stream", "info", "cli-typed").stdout


async def test_dlog_read_and_export_project_earlier_records(cluster, tmp_path):
    run = dlog_runner(cluster.zk_address, cluster.zk_root, NAMESPACE)
    async with namespace(cluster) as ns:
        await three_versions(ns, "read-me")
    lines = [json.loads(line) for line in run("read", "read-me", "--json").stdout.splitlines()]
    assert [{k: v for k, v in line.items() if k not in ("offset", "position")} for line in lines] == LATEST
    earlier = run("read", "read-me", "--schema-version", "2", "--max", "4").stdout.splitlines()
    assert [json.loads(line)["note"] for line in earlier] == ["n1", None, None, "n4"]
    out = tmp_path / "read-me.parquet"
    run("export", "read-me", "--out", str(out))
    table = pq.read_table(out)
    assert table.select(["id", "full_name", "score"]).to_pylist() == LATEST
    assert table.schema.field("id").type == pa.int64()
    assert [field_id_of(field) for field in table.schema][-3:] == [1, 2, 4]
    # version 1 cannot hold 2**40 in its int32 `id`: one line naming the field, and no file
    refused = one_error_line(run("export", "read-me", "--out", str(tmp_path / "v1.parquet"), "--schema-version", "1",
                                 ok=False))
    assert "field 'id' (int64 -> int32)" in refused and not list(tmp_path.glob("v1.parquet*"))


REFUSED = [
    ("BACKWARD", "id:float64, name:string, note:string?", "int32 -> float64 is lossy"),
    ("BACKWARD", "id:int16, name:string, note:string?", "int32 -> int16 narrows"),
    ("BACKWARD", "id:int32, name:string, note:string", "nullable -> required"),
    ("BACKWARD", "id:int32, name:binary, note:string?", "string -> binary changes the type"),
    ("BACKWARD", "id:int32, name:string, note:string?, n:int64", "is new and required without a default"),
    ("FORWARD", "id:int32, note:string?", "field 'name' (id 2) is required and the new schema drops it"),
]


async def test_each_refused_change_is_refused_with_its_rule_and_nothing_changes(cluster):
    async with namespace(cluster) as ns:
        await ns.create_stream("strict", schema=V1, **REPLICATION)
        before = await ns.config("strict")
        for mode, spec, rule in REFUSED:
            with pytest.raises(ConfigError) as refused:
                await ns.alter_stream("strict", schema=spec, schema_compatibility=mode)
            assert rule in str(refused.value) and "(rule: " in str(refused.value), str(refused.value)
            assert await ns.config("strict") == before
        with pytest.raises(ConfigError, match="untyped"):
            await ns.create_stream("plain", **REPLICATION)
            await ns.alter_stream("plain", schema=V1)


async def test_a_writer_keeps_its_version_and_a_following_reader_learns_new_ones(cluster):
    async with namespace(cluster) as ns:
        await ns.create_stream("live", schema=V1, **REPLICATION)
        async with ns.open_reader("live") as reader:  # follows; knows only version 1
            async with ns.open_writer("live") as old_writer:
                await ns.alter_stream("live", schema=V2)
                # opened before the change: still writes version 1 (its segment says so)
                await old_writer.write_batch(pa.record_batch({"id": pa.array([1], pa.int32()), "name": ["a"],
                                                              "note": ["n"]}))
            await write(ns, "live", {"id": pa.array([2], pa.int32()), "full_name": ["b"],
                                     "note": pa.array([None], pa.string()), "score": [0.5]})
            entries = [await reader.next_entry(timeout_s=30) for _ in range(2)]
        assert [segment.schema_version for segment in (await ns.store.segments("live")).segments] == [1, 2]
        # the reader opened in version 1: version 2's record comes in it (`full_name` as `name`, no `score`)
        assert [entry.batch.to_pylist() for entry in entries] == [
            [{"id": 1, "name": "a", "note": "n"}], [{"id": 2, "name": "b", "note": None}]]


async def test_two_schema_changes_at_once_are_two_versions(cluster):
    async with namespace(cluster) as ns:
        await ns.create_stream("racing", schema="id:int32", **REPLICATION)
        await asyncio.gather(ns.alter_stream("racing", schema="id:int32, a:string?"),
                             ns.alter_stream("racing", schema="id:int32, b:string?"))
        versions = versions_of(await ns.config("racing"))
    # both read version 1; the compare-and-set made the second re-plan on top of the first
    assert sorted(version.names for version in versions) == [["id"], ["id", "a"], ["id", "b"]]
    assert sorted(field_id_of(version.field(1)) for version in versions[1:]) == [2, 3]  # no id given twice


async def test_a_spark_sink_commit_records_the_version_its_task_wrote(cluster):
    async with namespace(cluster) as ns:
        await ns.create_stream("sunk", schema=V1, **REPLICATION)
        config = await ns.config("sunk")
        # a write task that started before the change: its ledger holds version 1 records
        handle = await ns.client.create_ledger(1, 1, 1, password=ns.password_of(config), custom={"stream": "sunk"})
        batch = pa.record_batch({"id": pa.array([7], pa.int32()), "name": ["g"], "note": pa.array([None], pa.string())},
                                schema=versions_of(config)[0])
        payload = RecordSetCodec(versions_of(config)[0]).encode(batch, 0)
        await handle.append_async(payload)
        await handle.close()
        message = DlogCommitMessage("sunk", handle.ledger_id, last_entry=handle.last_add_confirmed, records=1,
                                    bytes=len(payload), schema_version=schema_version(config))
        await ns.alter_stream("sunk", schema=V2)
        assert await commit_batch(ns, "sunk", [message], 0, "schema-test")
        assert [s.schema_version for s in (await ns.store.segments("sunk")).segments] == [1]
        _, rows = await read_rows(ns, "sunk")
    assert rows == [{"id": 7, "full_name": "g", "note": None, "score": None}]
