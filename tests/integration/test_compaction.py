"""Key compaction on a real cluster (issue 25, item 2): the compacted read is the latest value per
key of a full read with deletions applied, from any offset; offsets never change; the in-progress
segment and the producer dedup snapshot are left alone; a reader that started before a compaction
reads on unharmed, also once the replaced ledgers are garbage-collected, and a writer rolling
meanwhile fails nothing; the policy runner compacts a stream with compaction on; bad input is one
line; the benchmark reports."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import uuid

import pytest

from bookkeeper.errors import ConfigError, NoSuchLedgerError
from dlog import Offset
from dlog.compaction import Compactor
from dlog.core.errors import OffsetOutOfRangeError
from dlog.segments.port import StreamNotFoundError
from tests.tier import conftest as tier

pytestmark = pytest.mark.timeout(240)
# the tier tests' module-scoped cluster: 3 bookies whose garbage collection drops a deleted
# ledger at once (--gc-grace 0), so a reader's fallback from a collected ledger is really exercised
cluster = tier.cluster
connect, collect_garbage = tier.connect, tier.collect_garbage


async def write_segments(ns, name: str, segments: int, per_segment: int, rng: random.Random,
                         keys: int = 40, entry_records: int = 20) -> None:
    """`segments` completed segments (a writer's close seals its own); keys drawn from `keys`,
    one record in 11 a deletion marker (an empty value), one in 50 without a key."""
    for number in range(segments):
        async with ns.open_writer(name) as writer:
            for index in range(per_segment):
                roll = rng.random()
                key = None if roll < 0.02 else f"k{rng.randrange(keys)}".encode()
                value = b"" if 0.02 <= roll < 0.11 else f"s{number}-r{index}".encode()
                writer.write_nowait(value, key=key)
                if index % entry_records == entry_records - 1:
                    await writer.flush()  # entries of about `entry_records` records, so a segment has many
            await writer.flush()


async def read_from(ns, name: str, start="earliest", **options) -> list:
    async with ns.open_reader(name, start, follow=False, **options) as reader:
        return [record async for record in reader]


def table(records) -> dict[bytes, bytes]:
    """The latest value per key, deletion markers (empty values) applied."""
    latest: dict[bytes, bytes] = {}
    for record in records:
        if record.key is None:
            continue
        if record.value == b"":
            latest.pop(record.key, None)
        else:
            latest[record.key] = record.value
    return latest


def place(record) -> tuple:
    return (record.offset, record.position, record.key, record.value)


async def test_compacted_reads_equal_the_latest_value_per_key_from_every_sampled_offset(cluster):
    rng = random.Random(25)
    async with connect(cluster) as ns:
        await ns.create_stream("table", delete_retention_ms=3_600_000)
        await write_segments(ns, "table", 4, 400, rng)
        writer = await ns.open_writer("table")  # the in-progress segment, live through the compaction
        for index in range(150):
            writer.write_nowait(f"tail-{index}".encode(), key=f"k{index % 40}".encode())
        await writer.flush()
        before = await ns.store.segments("table")
        in_progress = before.in_progress
        assert in_progress is not None
        full = await read_from(ns, "table")
        assert len(full) == 4 * 400 + 150

        report = await Compactor(ns).run("table")
        assert report.segments == [1, 2, 3, 4] and report.records_read == 1600
        assert 0 < report.records_kept < 200  # at most one per key of 40 (deletion markers kept too)
        after = await ns.store.segments("table")
        assert [s.compacted is not None for s in after.segments] == [True] * 4 + [False]
        assert after.segments[-1] == in_progress  # the in-progress segment untouched
        for ledger_id in report.replaced_ledgers:  # the originals are gone
            with pytest.raises(NoSuchLedgerError):
                await ns.client.open_ledger(ledger_id, password=ns.password_of(await ns.config("table")))

        # offsets never change: each record read is the record of the full read at its offset
        by_offset = {record.offset: place(record) for record in full}
        compacted = await read_from(ns, "table", compacted=True)
        assert [place(r) for r in compacted] == [by_offset[r.offset] for r in compacted]
        assert [r.offset for r in compacted[-150:]] == [r.offset for r in full[-150:]]  # the tail, whole
        plain = await read_from(ns, "table")  # the originals are gone: a plain read reads the same
        assert [place(r) for r in plain] == [place(r) for r in compacted]

        # the compacted view from any offset: the latest value per key of a full read from there
        for index in [*range(0, len(full), 97), 1599, 1600, len(full) - 1]:
            start = full[index].offset
            got = await read_from(ns, "table", start, compacted=True)
            assert table(got) == table(full[index:]), f"compacted read from {start} (record {index})"
            assert all(r.offset in by_offset for r in got)
            # from its stream position: the same records (a position compacted away reads from the next kept)
            by_position = await read_from(ns, "table", full[index].position, compacted=True)
            assert [place(r) for r in by_position] == [place(r) for r in got], f"position {full[index].position}"

        # more segments, compacted again: one compaction ledger replaces the previous one
        await writer.close()
        await write_segments(ns, "table", 2, 300, rng)
        whole = await read_from(ns, "table")
        again = await Compactor(ns).run("table")
        assert again.segments == [1, 2, 3, 4, 5, 6, 7] and report.ledger_id in again.replaced_ledgers
        assert table(await read_from(ns, "table", compacted=True)) == table(whole) == table(full + whole[-600:])

        # deletion markers stay until their segment was first compacted delete-retention ago
        assert again.tombstones_kept > 0
        await ns.alter_stream("table", delete_retention_ms=0)
        dropped = await Compactor(ns).run("table")
        assert dropped.tombstones_kept == 0 and dropped.records_kept == again.records_kept - again.tombstones_kept
        final = await read_from(ns, "table", compacted=True)
        assert not [r for r in final if r.value == b""] and table(final) == table(whole)
        assert (await Compactor(ns).run("table")).skipped  # nothing left to do


async def test_a_reader_that_started_before_a_compaction_reads_on_unharmed(cluster):
    rng = random.Random(7)
    async with connect(cluster) as ns:
        await ns.create_stream("orders")
        await write_segments(ns, "orders", 3, 500, rng, entry_records=5)
        first = (await ns.store.segments("orders")).segments[0]
        assert first.last_entry >= 64  # more than a reader fetches at once
        full = await read_from(ns, "orders")
        by_offset = {record.offset: place(record) for record in full}
        order = {record.offset: index for index, record in enumerate(full)}
        async with ns.open_reader("orders", "earliest", follow=False, read_ahead_entries=2) as reader:
            got = []
            async for record in reader:  # into the first segment, its handle open
                got.append(record)
                if len(got) == 120:
                    break
            report = await Compactor(ns).run("orders")
            assert report.segments == [1, 2, 3]
            await collect_garbage(cluster)  # the replaced ledgers are really gone from the bookies
            async for record in reader:
                got.append(record)
        assert [place(r) for r in got] == [by_offset[r.offset] for r in got]  # every offset a real record's
        positions = [order[r.offset] for r in got]
        assert positions == sorted(set(positions))  # in stream order, none twice
        assert table(got) == table(full)  # and the latest value of every key reached
        # it went over from the first segment's original records to its compacted ones mid-way
        assert 120 < sum(1 for r in got if r.offset.ledger_id == first.ledger_id) < 500


async def test_compactions_beside_a_live_writer_that_rolls_fail_nothing(cluster):
    async with connect(cluster) as ns:
        await ns.create_stream("live", roll_records=40)
        written = []  # (offset, key, value) as acknowledged

        async def write() -> None:
            async with ns.open_writer("live") as writer:
                for index in range(600):
                    key, value = f"k{index % 25}".encode(), f"v{index}".encode()
                    written.append((writer.write_nowait(value, key=key), key, value))
                    if index % 10 == 9:
                        await writer.flush()  # entries of 10 records: a roll every 4 entries

        writing = asyncio.ensure_future(write())
        reports = []
        while not writing.done():  # compactions while the writer rolls (their swaps race its CAS)
            reports.append(await Compactor(ns).run("live"))
            await asyncio.sleep(0.05)
        await writing  # the writer never failed
        reports.append(await Compactor(ns).run("live"))
        assert sum(1 for report in reports if report.ledger_id is not None) >= 2
        acknowledged = {future.result(): (key, value) for future, key, value in written}
        got = await read_from(ns, "live", compacted=True)
        assert all(acknowledged[r.offset] == (r.key, r.value) for r in got)  # offsets unchanged
        expected = {}
        for _, key, value in written:
            expected[key] = value
        assert table(got) == expected


async def test_compaction_keeps_the_dedup_snapshot_and_refuses_bad_input(cluster):
    rng = random.Random(3)
    async with connect(cluster) as ns:
        await ns.create_stream("events")
        await write_segments(ns, "events", 2, 50, rng)
        await ns.store.store_dedup_snapshot("events", b"producers", None)
        await Compactor(ns).run("events")
        assert (await ns.store.dedup_snapshot("events"))[0] == b"producers"
        with pytest.raises(StreamNotFoundError):
            await Compactor(ns).run("nowhere")
        listing = await ns.store.segments("events")
        async with ns.open_writer("events") as writer:
            await writer.write(b"x", key=b"k")
            open_segment = (await ns.store.segments("events")).in_progress
            with pytest.raises(OffsetOutOfRangeError, match="beyond the compaction horizon"):
                await Compactor(ns).run("events", until=Offset(open_segment.ledger_id, 1))
        assert await ns.store.segments("events") != listing  # only the writer's segment came and went
        await ns.create_stream("aged", min_compaction_lag_ms=3_600_000)
        await write_segments(ns, "aged", 1, 10, rng)
        assert "nothing to compact" in (await Compactor(ns).run("aged")).skipped
        with pytest.raises(ConfigError, match="min compaction lag"):
            await ns.alter_stream("aged", min_compaction_lag_ms=-1)


async def test_the_policy_runner_compacts_a_stream_with_compaction_on(cluster):
    from dlog.policies import PolicyRunner

    rng = random.Random(11)
    async with connect(cluster) as ns:
        await ns.create_stream("on", compaction=True)
        await ns.create_stream("off")
        for name in ("on", "off"):
            await write_segments(ns, name, 2, 100, rng, keys=5)
        runner = PolicyRunner(ns, offload=False)
        await runner.run_round()
        assert runner.stats.compactions == 1
        assert all(s.compacted is not None for s in (await ns.store.segments("on")).segments)
        assert all(s.compacted is None for s in (await ns.store.segments("off")).segments)
        info = await ns.stream_info("on")
        assert [s["stored_on"] for s in info["segments"]] == ["compacted"] * 2
        assert not any(s["damaged"] for s in info["segments"]) and info["records"] <= 10


def test_the_commands(cluster, zk_server):
    """In this process (click's runner: the commands as a user types them, without an interpreter
    start each, which costs seconds on a loaded machine)."""
    from click.testing import CliRunner

    from dlog_tools.cli.app import main

    namespace = f"ns{uuid.uuid4().hex[:6]}"

    def run(*arguments: str, stdin: str = "", ok: bool = True):
        result = CliRunner().invoke(main, [*arguments, "--zk", zk_server.address, "--zk-root", cluster.zk_root,
                                           "--namespace", namespace], input=stdin)
        if ok:
            assert result.exit_code == 0, result.output
        return result

    created = json.loads(run("stream", "create", "kv", "--roll-records", "4", "--compaction", "on",
                             "--min-compaction-lag", "0s", "--delete-retention", "1h", "--json").stdout)
    assert (created["compaction"], created["min_compaction_lag_ms"], created["delete_retention_ms"]) == \
        (True, 0, 3_600_000)

    async def write() -> None:
        async with connect(cluster, namespace) as ns:
            for first, last in ((0, 6), (6, 10)):  # a segment per writer (its close seals it)
                async with ns.open_writer("kv") as writer:
                    for i in range(first, last):
                        await writer.write(f"v{i}".encode(), key=f"k{i % 3}".encode())

    asyncio.run(write())
    done = json.loads(run("compact", "kv", "--json").stdout)
    assert done["records_read"] == 10 and done["records_kept"] == 3  # k0, k1, k2: v9, v7, v8
    values = [json.loads(line)["value"] for line in run("read", "kv", "--compacted", "--json").stdout.splitlines()]
    assert values == ["v7", "v8", "v9"]  # in offset order
    assert "compaction    on, min lag 0ms, deletion markers kept 1h" in run("stream", "info", "kv").stdout
    altered = run("stream", "alter", "kv", "--compaction", "off", "--delete-retention", "0s")
    assert "compaction yes -> no" in altered.stdout and "delete_retention 1h -> " in altered.stdout
    for arguments, said in ((("compact", "nowhere"), "nowhere"),
                            (("compact", "kv", "--until", "999999:0"), "no live segment has ledger 999999"),
                            (("compact", "kv", "--until", "x"), "L:E")):
        failed = run(*arguments, ok=False)
        assert failed.exit_code != 0 and said in failed.stderr and len(failed.stderr.strip().splitlines()) == 1, \
            failed.output
        assert not failed.stdout


def test_bench_compaction_reports_the_rate_and_the_compacted_table_vs_the_replay():
    result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "bench", "compaction", "--records", "3000",
                             "--keys", "300", "--segments", "2", "--batch-records", "500", "--json"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    runs = {run["run"]: run for run in json.loads(result.stdout)["runs"]}
    assert runs["compact"]["records"] == 3000 and runs["compact"]["kept"] == 300 and runs["compact"]["segments"] == 2
    assert runs["table by replaying the stream"]["records"] == 3000
    compacted = runs["table from the compacted view"]
    assert compacted["records"] == 300 and compacted["keys"] == 300 and compacted["vs_replay"] > 0


async def test_a_named_producer_reopens_on_a_compacted_stream_and_its_resend_is_still_a_duplicate(cluster):
    """Idempotent writers beside compaction (issue 25 items 1 and 2): reopening a named producer
    replays the entries after the stored producer snapshot, which compaction may have emptied."""
    from dlog import DuplicateWrite
    async with connect(cluster) as ns:
        await ns.create_stream("named")
        async with ns.open_writer("named", producer_id="p") as writer:  # its close stores the snapshot
            await writer.write_batch([b"a", b"b"], sequence=1)
        async with ns.open_writer("named") as plain:  # two entries of the same keys: the first one empties
            for run in range(2):
                for index in range(5):
                    plain.write_nowait(b"v%d" % run, key=b"k%d" % index)
                await plain.flush()
        report = await Compactor(ns).run("named")
        assert report.segments == [1, 2]
        async with ns.open_writer("named", producer_id="p") as writer:
            assert writer.last_sequence == 2
            assert isinstance(await writer.write_batch([b"a", b"b"], sequence=1), DuplicateWrite)
