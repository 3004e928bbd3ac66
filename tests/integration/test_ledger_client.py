"""The ledger client on real bookie processes and a real ZooKeeper: ensemble change under kill -9
loses no acknowledged entry (A3, A9), recovery fences and seals (A6-A8, A10), a hung bookie does
not block recovery, passwords are checked (A12), and tailing readers see entries at once (A4)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from bookkeeper.client import BookKeeper
from bookkeeper.errors import ConfigError, LedgerFencedError, NoSuchEntryError, UnauthorizedError
from bookkeeper.protocol.metadata import LedgerState
from tests.helpers import eventually
from dlog_tools.cluster import LineReader


def client_for(cluster, **options) -> BookKeeper:
    return BookKeeper(zk=cluster.zk_address, root=cluster.zk_root, **options)


def payload(index: int) -> bytes:
    return f"entry-{index:06d}".encode() * 4


async def test_kill_9_of_a_bookie_during_appends_changes_ensemble_and_loses_nothing(cluster_factory):
    cluster = cluster_factory(bookies=4)
    async with client_for(cluster, add_timeout_s=2.0) as client:
        handle = await client.create_ledger(3, 2, 2, password=b"pw")
        first_ensemble = handle.metadata.last_ensemble[1]
        acked: dict[int, bytes] = {}

        async def append(index: int) -> None:
            entry_id = await handle.append(payload(index))
            acked[entry_id] = payload(index)

        await asyncio.gather(*(append(index) for index in range(300)))
        victim = next(bookie for bookie in cluster.bookies if bookie.address in first_ensemble)
        streaming = asyncio.gather(*(append(index) for index in range(300, 800)))
        await asyncio.sleep(0.01)
        cluster.kill_bookie(victim.index)  # some of those may be in flight; they may also all be done
        await asyncio.gather(streaming, *(append(index) for index in range(800, 1300)))  # these meet the dead bookie
        assert handle.metadata.last_ensemble[1] != first_ensemble  # a new fragment replaced it
        assert victim.address not in handle.metadata.last_ensemble[1]
        await handle.close()
        reader = await client.open_ledger(handle.ledger_id, password=b"pw", recovery=False)
        assert reader.is_closed and reader.last_add_confirmed == 1299
        entries = await reader.read(0, 1299)
        assert {entry.entry_id: entry.payload for entry in entries} == acked


async def test_kill_9_of_the_writer_then_recovery_keeps_every_acknowledged_entry(cluster_factory):
    cluster = cluster_factory(bookies=3)
    writer = subprocess.Popen([sys.executable, "-m", "tests.integration.writer_process", "--zk",
                               cluster.zk_address, "--root", cluster.zk_root],
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    ledger_id, acked = None, []
    lines = LineReader(writer)
    try:
        deadline = time.monotonic() + 60
        while len(acked) < 500 and time.monotonic() < deadline:
            line = lines.next_line(max(0.0, deadline - time.monotonic()))
            if line is None:
                break
            if line.startswith("ledger "):
                ledger_id = int(line.split()[1])
            elif line.startswith("acked "):
                acked.append(int(line.split()[1]))
    finally:
        os.kill(writer.pid, signal.SIGKILL)  # the writer dies without closing its ledger
        writer.wait(timeout=30)
        writer.stdout.close()
    assert ledger_id is not None and len(acked) >= 500
    async with client_for(cluster) as client:
        reader = await client.open_ledger(ledger_id, password=b"pw", recovery=True)
        assert reader.is_closed and reader.metadata.state is LedgerState.CLOSED
        assert reader.last_add_confirmed >= max(acked)
        entries = await reader.read(0, reader.last_add_confirmed)
        assert [entry.payload for entry in entries[: max(acked) + 1]] == \
            [f"entry-{index}".encode() for index in range(max(acked) + 1)]


async def test_recovery_fences_a_live_writer_and_two_recoveries_agree(cluster_factory):
    cluster = cluster_factory(bookies=3)
    async with client_for(cluster) as writer_client, client_for(cluster) as first, \
            client_for(cluster) as second:
        handle = await writer_client.create_ledger(3, 2, 2, password=b"pw")
        for index in range(50):
            await handle.append(payload(index))
        pending = [handle.append_async(payload(index)) for index in range(50, 80)]
        one, two = await asyncio.gather(
            first.open_ledger(handle.ledger_id, password=b"pw", recovery=True),
            second.open_ledger(handle.ledger_id, password=b"pw", recovery=True))
        assert one.last_add_confirmed == two.last_add_confirmed >= 49
        outcomes = await asyncio.gather(*pending, return_exceptions=True)
        acked = [outcome for outcome in outcomes if isinstance(outcome, int)]
        assert all(entry_id <= one.last_add_confirmed for entry_id in acked)
        with pytest.raises(LedgerFencedError):
            await handle.append(b"after recovery")  # the old writer can no longer add (A7)
        metadata, _ = await first.ledger_metadata(handle.ledger_id)
        assert metadata.state is LedgerState.CLOSED
        assert metadata.last_entry_id == one.last_add_confirmed


async def test_a_stopped_bookie_does_not_block_recovery(cluster_factory):
    cluster = cluster_factory(bookies=4)
    async with client_for(cluster) as client:
        handle = await client.create_ledger(3, 2, 2, password=b"pw")
        for index in range(100):
            await handle.append(payload(index))
        stopped = next(b for b in cluster.bookies if b.address in handle.metadata.last_ensemble[1])
        cluster.kill_bookie(stopped.index, signal.SIGSTOP)
        try:
            async with client_for(cluster, read_timeout_s=1.0, add_timeout_s=1.0) as recoverer:
                started = time.monotonic()
                reader = await recoverer.open_ledger(handle.ledger_id, password=b"pw", recovery=True)
                assert reader.last_add_confirmed >= 98
                assert time.monotonic() - started < 30
                entries = await reader.read(0, reader.last_add_confirmed)
                assert [e.payload for e in entries[:99]] == [payload(i) for i in range(99)]
        finally:
            cluster.kill_bookie(stopped.index, signal.SIGCONT)


async def test_wrong_password_is_refused(cluster_factory):
    cluster = cluster_factory(bookies=3)
    async with client_for(cluster) as client:
        handle = await client.create_ledger(3, 2, 2, password=b"right")
        await handle.append(b"x")
        await handle.close()
        with pytest.raises(UnauthorizedError):
            await client.open_ledger(handle.ledger_id, password=b"wrong", recovery=False)
        with pytest.raises(UnauthorizedError):
            await client.open_ledger(handle.ledger_id, password=b"wrong", recovery=True)
        with pytest.raises(ConfigError, match="ledger id"):
            await client.open_ledger(-3)


async def test_reads_stop_at_the_lac_and_tail_sees_new_entries_at_once(cluster_factory):
    cluster = cluster_factory(bookies=3)
    async with client_for(cluster) as client, client_for(cluster) as reader_client:
        handle = await client.create_ledger(3, 2, 2, password=b"pw")
        await handle.append(b"first")
        reader = await reader_client.open_ledger(handle.ledger_id, password=b"pw", recovery=False)
        await eventually(lambda: _lac_at_least(reader, 0), timeout_s=10)  # explicit LAC (A4)
        with pytest.raises(NoSuchEntryError, match="past its last add confirmed"):
            await reader.read(0, 5)
        seen: list[tuple[int, float]] = []

        async def follow() -> None:
            async for entry in reader.tail(0, poll_timeout_ms=20_000):
                seen.append((entry.entry_id, time.monotonic()))
                if entry.entry_id == 20:
                    return

        tail = asyncio.create_task(follow())
        delays = []
        for index in range(1, 21):
            sent = time.monotonic()
            await handle.append(f"e{index}".encode())
            await eventually(lambda: any(e == index for e, _ in seen), timeout_s=10)
            delays.append(next(t for e, t in seen if e == index) - sent)
        await tail
        # the poll timeout is 20 s: seeing each entry long before proves the long poll woke up
        assert max(delays) < 5.0, delays
        assert [e for e, _ in seen] == list(range(21))
        await handle.close()


async def _lac_at_least(reader, entry_id: int) -> bool:
    return await reader.read_lac() >= entry_id
