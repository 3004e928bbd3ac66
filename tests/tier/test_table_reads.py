"""Readers don't notice the tier, and the tier is a table (issue 24, items 3 and 4), on a stream
in every tiered state at once (tests/tier/layers.py): a follower from `earliest` reads every
record exactly once, in order, with its offset, position and headers, through offloaded
segments whose bookie copies are gone, offloaded ones still on the bookies, ledger-only ones and
the tail, whichever copy it prefers; `dlog read` and `dlog export` too; pyarrow.dataset and
DuckDB read the stream's tier directory as a hive-partitioned table holding exactly the
offloaded records; a truncation point inside an offloaded segment holds for readers of the tier."""

from __future__ import annotations

import asyncio
import json

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from bookkeeper.clock import monotonic_s
from dlog.offsets import Offset
from dlog.segments.codec import HEADERS_TYPE
from dlog.segments.tier import stream_table_uri
from dlog_tools.cli import main
from dlog_tools.export import export_stream
from tests.tier import layers
from tests.tier.conftest import connect
from tests.tier.layers import Row, rows_of_table

pytestmark = pytest.mark.timeout(240)


async def follow_rows(reader, wanted: int, typed: bool, rows: list[Row], timeout_s: float = 60.0) -> None:
    """Read entries into `rows` until it holds `wanted` rows (or fail at the deadline)."""
    deadline = monotonic_s() + timeout_s
    while len(rows) < wanted:
        assert monotonic_s() < deadline, f"the reader stopped at {len(rows)} of {wanted} records"
        entry = await reader.next_entry(timeout_s=1.0)
        if entry is None:
            continue
        batch = entry.batch
        count = batch.num_rows
        columns = {"ledger": pa.array([entry.ledger_id] * count, pa.int64()),
                   "entry": pa.array([entry.entry_id] * count, pa.int64()),
                   "slot": pa.array(range(entry.first_slot, entry.first_slot + count), pa.int32()),
                   "position": pa.array([None if entry.first_position is None else entry.first_position + i
                                         for i in range(count)], pa.int64())}
        for name in batch.schema.names:
            columns[name] = batch.column(name)
        rows += rows_of_table(pa.table(columns), typed)


@pytest.mark.parametrize("typed", [False, True], ids=["untyped", "typed"])
async def test_followers_read_offloaded_ledger_and_tailing_segments_once_in_order_whichever_copy_they_prefer(
        cluster, tmp_path, typed):
    async with connect(cluster) as ns, connect(cluster, ns.name) as tier_ns:
        layered = await layers.build(ns, "orders", f"file://{tmp_path}/tier", typed=typed)
        found: dict[str, list[Row]] = {"bookies": [], "tier": []}
        readers = {"bookies": await ns.open_reader("orders", "earliest", follow=True, headers=not typed),
                   "tier": await tier_ns.open_reader("orders", "earliest", follow=True, headers=not typed,
                                                     prefer="tier")}
        try:
            written = len(layered.rows)
            await asyncio.gather(*(follow_rows(readers[p], written, typed, found[p]) for p in readers))
            # the tail moves while they follow: more entries in segment 7, then a new segment 8
            await layers.append(layered, layered.writer, 25, 10)
            await layered.writer.close()
            async with ns.open_writer("orders") as writer:
                await layers.append(layered, writer, 15, 10)
            await asyncio.gather(*(follow_rows(readers[p], len(layered.rows), typed, found[p]) for p in readers))
        finally:
            for reader in readers.values():
                await reader.close()
        assert found["bookies"] == layered.rows  # every record once, in order, offsets and positions as written
        assert found["tier"] == layered.rows
        assert len({(r.ledger, r.entry, r.slot) for r in layered.rows}) == len(layered.rows) == 240
        # where each read: prefer=tier read all four offloaded segments from their files, the
        # default read only the two whose bookie copies are gone from theirs
        assert tier_ns.reads.tier_reads >= 4 and ns.reads.tier_reads >= 2


@pytest.mark.parametrize("typed", [False, True], ids=["untyped", "typed"])
async def test_the_tier_directory_reads_as_a_table_holding_exactly_the_offloaded_records(cluster, tmp_path, typed):
    async with connect(cluster) as ns:
        layered = await layers.build(ns, "clicks", f"file://{tmp_path}/tier", typed=typed)
        await layered.writer.close()
        sequences = (*layers.SEGMENTS_DELETED, *layers.SEGMENTS_BOTH)
        listing = await ns.store.segments("clicks")
        sequence_of = {s.ledger_id: s.sequence for s in listing.segments}
        expected = [row for row in layered.rows if sequence_of[row.ledger] in sequences]
        assert len(expected) == 120
        directory = stream_table_uri(f"file://{tmp_path}/tier", ns.name, "clicks").removeprefix("file://")

        dataset = ds.dataset(directory, format="parquet", partitioning="hive")
        table = dataset.to_table().sort_by([("segment", "ascending"), ("entry", "ascending"), ("slot", "ascending")])
        assert rows_of_table(table, typed) == expected
        assert [sequence_of[ledger] for ledger in table.column("ledger").to_pylist()] == \
            table.column("segment").to_pylist()  # the hive column is the segment's sequence

        with duckdb.connect() as db:
            relation = db.read_parquet(f"{directory}/**/*.parquet", hive_partitioning=True)
            found = relation.order("segment, entry, slot").to_arrow_table()
        assert rows_of_table(found, typed) == expected
        assert found.column("segment").to_pylist() == table.column("segment").to_pylist()


async def test_a_truncation_point_inside_an_offloaded_segment_holds_for_readers_of_the_tier(cluster, tmp_path):
    async with connect(cluster) as ns:
        layered = await layers.build(ns, "trunc", f"file://{tmp_path}/tier")
        await layered.writer.close()
        listing = await ns.store.segments("trunc")
        deleted, both = listing.by_sequence(2), listing.by_sequence(3)
        for segment in (deleted, both):  # inside a segment read only from the tier, then one still on bookies
            at = Offset(segment.ledger_id, 1, 3)
            await ns.truncate("trunc", at)
            first = next(i for i, r in enumerate(layered.rows) if (r.ledger, r.entry, r.slot) == (at.ledger_id, 1, 3))
            for prefer in ("bookies", "tier"):
                rows: list[Row] = []
                async with ns.open_reader("trunc", "earliest", follow=False, headers=True, prefer=prefer) as reader:
                    await follow_rows(reader, len(layered.rows) - first, False, rows)
                    assert await reader.next_entry(timeout_s=0.5) is None
                assert rows == layered.rows[first:], (segment.sequence, prefer)


async def test_dlog_read_and_dlog_export_give_the_whole_stream_across_the_tier(cluster, tmp_path):
    async with connect(cluster) as ns:
        layered = await layers.build(ns, "cli", f"file://{tmp_path}/tier")
        await layered.writer.close()
        expected = [Row(r.ledger, r.entry, r.slot, None, (*r.fields[:2], ("headers", None), r.fields[3]))
                    for r in layered.rows]  # an export has no headers nor positions
        for prefer in ("bookies", "tier"):
            exported = tmp_path / f"cli-{prefer}.parquet"
            await export_stream(ns, "cli", exported, "parquet", "earliest", None, progress=False, prefer=prefer)
            table = pq.read_table(exported)
            table = table.append_column("headers", pa.nulls(table.num_rows, HEADERS_TYPE))
            assert rows_of_table(table, False, position=False) == expected, prefer
    options = ["--zk", cluster.zk_address, "--zk-root", cluster.zk_root, "--namespace", ns.name]
    for prefer in ("bookies", "tier"):
        result = await asyncio.to_thread(CliRunner().invoke, main,
                                         ["read", "cli", "--json", "--headers", "--prefer", prefer, *options])
        assert result.exit_code == 0, result.output
        lines = [json.loads(line) for line in result.output.splitlines()]
        assert lines == [{"offset": str(Offset(r.ledger, r.entry, r.slot)), "position": r.position,
                          "key": None if f["key"] is None else f["key"].decode(), "value": f["value"].decode(),
                          "timestamp": f["timestamp_ms"],
                          "headers": None if f["headers"] is None else [[k, None if v is None else v.decode()]
                                                                        for k, v in f["headers"]]}
                         for r in layered.rows for f in [dict(r.fields)]]
    exported = tmp_path / "cli-command.parquet"
    result = await asyncio.to_thread(CliRunner().invoke, main, ["export", "cli", "--out", str(exported), "--json",
                                                                "--prefer", "tier", *options])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["records"] == len(layered.rows) == pq.read_table(exported).num_rows
    result = await asyncio.to_thread(CliRunner().invoke, main, ["read", "cli", "--prefer", "disk", *options])
    assert result.exit_code != 0 and "disk" in result.output and "Traceback" not in result.output
