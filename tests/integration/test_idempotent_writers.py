"""Named idempotent writers (`open_writer(name, producer_id=...)`) on a real cluster: resends
across writer sessions are answered, not written twice, also after retention removed the
producer's records; bad sequences are refused with nothing written; a writer process killed with
SIGKILL again and again (mid-roll, between the entry's acknowledgement and the application's)
loses and duplicates nothing once its restarts resend what they did not see acknowledged."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import uuid
from pathlib import Path

import pytest

from bookkeeper.errors import ConfigError
from dlog import DuplicateWrite, Namespace, SequenceError
from dlog.core.dedup import decode_stored
from dlog_tools.cluster import LocalCluster
from tests.helpers import dlog_runner, one_error_line

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(zk_server, tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("idem"), bookies=3, zk_root=f"/i-{uuid.uuid4().hex[:8]}",
                           zk_server=zk_server)
    cluster.start()
    yield cluster
    cluster.stop()


def connect(cluster: LocalCluster) -> Namespace:
    return Namespace(cluster.zk_address, f"ns{uuid.uuid4().hex[:6]}", bookkeeper_root=cluster.zk_root)


async def values_of(ns: Namespace, name: str) -> list[bytes]:
    values: list[bytes] = []
    async with ns.open_reader(name, follow=False, skip_truncated=True) as reader:
        while (batch := await reader.read_batch()) is not None:
            values += batch.column("value").to_pylist()
    return values


async def test_resends_across_sessions_are_answered_not_written(cluster):
    async with connect(cluster) as ns:
        await ns.create_stream("s")
        async with ns.open_writer("s", producer_id="app-1") as writer:
            assert writer.last_sequence is None
            first = await writer.write(b"a", sequence=10)
            await writer.write(b"b")  # numbered 11
            batch = await writer.write_batch([b"c", b"d", b"e"], sequence=[20, 25, 30])
            writer.offer(b"f")  # 31
            await writer.flush()
            assert writer.last_sequence == 31
        async with ns.open_writer("s", producer_id="app-1") as writer:
            assert writer.last_sequence == 31
            again = await writer.write(b"a", sequence=10)
            assert again == DuplicateWrite(10, 10, first.position, first.position)
            batch_again = await writer.write_batch([b"c", b"d", b"e"], sequence=[20, 25, 30])
            assert isinstance(batch_again, DuplicateWrite)
            assert batch_again.first_position == batch.first_position
            writer.offer(b"f", sequence=31)  # dropped, counted
            assert writer.duplicates == 3
            await writer.write(b"g")  # 32
            await writer.flush()
        async with ns.open_writer("s", producer_id="app-2") as other:  # producers are independent
            assert other.last_sequence is None
            await other.write(b"x", sequence=0)
        assert await values_of(ns, "s") == [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"x"]


async def test_bad_sequences_are_refused_with_nothing_written(cluster):
    async with connect(cluster) as ns:
        await ns.create_stream("s")
        async with ns.open_writer("s", producer_id="p") as writer:
            await writer.write_batch([b"a", b"b"], sequence=5)  # 5, 6
            assert isinstance(await writer.write(b"x", sequence=6), DuplicateWrite)  # at or below: a resend
            for bad in (lambda: writer.write_batch([b"x", b"y"], sequence=6),  # overlaps 6
                        lambda: writer.write_batch([b"x", b"y"], sequence=[9, 8]),  # not increasing
                        lambda: writer.write(b"x", sequence=-1)):
                with pytest.raises(SequenceError) as refused:
                    await bad()
                assert "\n" not in str(refused.value) and refused.value.code == 328
            with pytest.raises(ConfigError):  # a record refused at the call does not use its sequence
                writer.offer("not bytes", sequence=8)  # type: ignore[arg-type]
            writer.offer(b"c", sequence=8)
            with pytest.raises(SequenceError) as refused:  # 8 is buffered, not yet acknowledged
                writer.offer(b"x", sequence=7)
            assert refused.value.expected == 9
            await writer.flush()
        async with ns.open_writer("s") as plain:
            with pytest.raises(Exception, match="producer_id"):
                await plain.write(b"x", sequence=1)
        assert await values_of(ns, "s") == [b"a", b"b", b"c"]


async def test_a_resend_after_retention_removed_the_producers_records_is_still_a_duplicate(cluster):
    async with connect(cluster) as ns:
        await ns.create_stream("s", roll_records=2)
        async with ns.open_writer("s", producer_id="gone") as writer:
            await writer.write_batch([b"a", b"b"], sequence=1)
        async with ns.open_writer("s") as plain:  # another writer's records follow
            for value in (b"c", b"d", b"e"):
                await plain.write(value)
        listing = await ns.store.segments("s")
        last = listing.segments[-1]
        removed = await ns.truncate("s", f"{last.ledger_id}:0")  # every segment with the producer's records
        assert removed and await values_of(ns, "s") == [b"e"]
        stored = await ns.store.dedup_snapshot("s")
        assert stored is not None and b'"gone"' in decode_stored(stored[0])[1]
        async with ns.open_writer("s", producer_id="gone") as writer:
            assert writer.last_sequence == 2
            assert isinstance(await writer.write_batch([b"a", b"b"], sequence=1), DuplicateWrite)
        assert await values_of(ns, "s") == [b"e"]


PRODUCERS = ("p0", "p1", "p2")
RECORDS = 50_000  # per producer
BATCH = 250  # records per write_batch: one entry, so a batch is durable whole or not at all
KILLS = 20
RUN_S_MAX = 60.0  # one writer process's run


async def start_forker(cluster: LocalCluster, namespace: str) -> asyncio.subprocess.Process:
    """The process that forks the writer processes (idempotent_writer_process.py), once it is ready."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.integration.idempotent_writer_process", "--zk", cluster.zk_address,
        "--root", cluster.zk_root, "--namespace", namespace, "--stream", "s", "--count", str(RECORDS),
        "--batch", str(BATCH), cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    assert process.stdout is not None
    async with asyncio.timeout(RUN_S_MAX):
        assert (await process.stdout.readline()).strip() == b"ready"
    return process


async def run_writer(forker: asyncio.subprocess.Process, producer: str, start: int, rng: random.Random,
                     kill: str | None) -> tuple[int, int | None, bool]:
    """One writer process writing from `start` on: (its resume point, the last sequence it
    acknowledged to us, whether it finished). `kill`: "timer" SIGKILLs it at a random moment after
    it opened (some land mid-roll: rolls are frequent), "after-ack" makes it kill itself right
    after a write is acknowledged and before it tells us; None lets it finish."""
    assert forker.stdin is not None and forker.stdout is not None
    die_after = rng.randint(1, 8) if kill == "after-ack" else 0
    resume, acked, finished, expected, pid = None, None, False, start, None
    killer: asyncio.TimerHandle | None = None
    forker.stdin.write(f"go {producer} {start} {die_after}\n".encode())
    await forker.stdin.drain()
    try:
        async with asyncio.timeout(RUN_S_MAX):
            while raw := await forker.stdout.readline():
                line = raw.decode().split() or [""]
                if line[0] == "pid":
                    pid = int(line[1])
                elif line[0] == "resume":
                    resume = int(line[1])
                    if kill == "timer":
                        killer = asyncio.get_running_loop().call_later(rng.uniform(0.0, 0.4), os.kill, pid,
                                                                       signal.SIGKILL)
                elif line[0] == "acked" and line[-1] == "ok":  # not cut by the kill
                    first, last = int(line[1]), int(line[2])
                    assert first == expected, f"{producer}: acknowledged {first}, expected {expected}"
                    acked, expected = last, last + 1
                elif line[0] == "done":
                    finished = True
                elif line[0] == "exit":
                    break
    finally:
        if killer is not None:
            killer.cancel()
    assert resume is not None or kill is not None, f"{producer}: the writer never opened"
    assert kill is not None or finished, f"{producer}: the writer stopped early"
    return -1 if resume is None else resume, acked, finished


async def test_writers_killed_20_times_resend_without_duplicates_or_losses(cluster):
    rng = random.Random(25)
    namespace = f"ns{uuid.uuid4().hex[:6]}"
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        await ns.create_stream("s", roll_bytes=32 << 10)  # a roll every few batches
    acknowledged = dict.fromkeys(PRODUCERS, -1)  # the application's view: the last sequence it saw acknowledged
    finished: set[str] = set()
    forker = await start_forker(cluster, namespace)
    resent_durable = 0
    for run in range(KILLS + 2 * len(PRODUCERS)):  # bounded: 20 killed runs, then each producer finishes
        unfinished = [p for p in PRODUCERS if p not in finished]
        if not unfinished:
            break
        producer = unfinished[run % len(unfinished)]
        kill = None if run >= KILLS else ("after-ack" if run % 2 else "timer")
        start = acknowledged[producer] + 1  # everything not seen acknowledged is sent again
        resume, acked, done = await run_writer(forker, producer, start, rng, kill)
        assert resume == -1 or resume >= acknowledged[producer], f"{producer}: acknowledged records were lost"
        resent_durable += resume > acknowledged[producer]  # durable, not seen acknowledged: its resend is a duplicate
        if acked is not None:
            acknowledged[producer] = acked
        if done:
            finished.add(producer)
    forker.kill()
    await forker.wait()
    assert finished == set(PRODUCERS)
    assert resent_durable >= KILLS // 4  # the after-ack kills: the case that would write twice
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        values = await values_of(ns, "s")
    written: dict[str, list[int]] = {producer: [] for producer in PRODUCERS}
    for value in values:
        producer, sequence = value.decode().split(":")
        written[producer].append(int(sequence))
    for producer in PRODUCERS:  # every record once, in order
        assert written[producer] == list(range(RECORDS)), f"{producer}: duplicates or losses"


async def test_dlog_write_with_a_producer_id_writes_only_what_an_earlier_run_did_not(cluster):
    namespace = f"ns{uuid.uuid4().hex[:6]}"
    run = dlog_runner(cluster.zk_address, cluster.zk_root, namespace)
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        await ns.create_stream("s")
    first = run("write", "s", "--producer-id", "importer", "--json", stdin="a\nb\n")
    assert json.loads(first.stdout)["count"] == 2
    again = run("write", "s", "--producer-id", "importer", stdin="a\nb\nc\n")  # the input again, and more
    assert "wrote 1 record" in again.stdout and "2 records already in s, not written again" in again.stdout
    bad = run("write", "s", "--producer-id", "no spaces", stdin="x\n", ok=False)
    assert bad.returncode != 0 and "bad producer id" in one_error_line(bad)
    async with Namespace(cluster.zk_address, namespace, bookkeeper_root=cluster.zk_root) as ns:
        assert await values_of(ns, "s") == [b"a", b"b", b"c"]
