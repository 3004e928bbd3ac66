"""A real bookie process keeps acknowledged entries and fences across kill -9, survives a torn
journal, lets a recovery write-back repair a damaged entry (single ADD or ADD_BATCH alike), refuses
adds when read-only, returns disk space by GC and refuses a mismatched cookie."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from bookkeeper.client.connection import BookieConnection, EncodedRequest
from bookkeeper.errors import (
    BookieIOError,
    BookieReadOnlyError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bookkeeper.meta import layout
from bookkeeper.meta.zk import AsyncZooKeeper
from bookkeeper.protocol.batch import AddBatchResponse, encode_add_batch
from bookkeeper.protocol.entry import Digest, DigestType, master_key, pack_entry, unpack_entry
from bookkeeper.protocol.wire import Status
from tests.harness.faults.faults import entry_log_records, flip_entry_log_bytes
from tests.helpers import eventually

PASSWORD = b"secret"
KEY = master_key(PASSWORD)
DIGEST = Digest.for_ledger(DigestType.CRC32C, PASSWORD)


def payload(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    return (f"{ledger_id}:{entry_id}:".encode() * size)[:size]


async def append_all(connection: BookieConnection, ledger_id: int, count: int, *, start: int = 0,
                     size: int = 100) -> None:
    futures = [connection.add(ledger_id, entry_id, KEY,
                              pack_entry(DIGEST, ledger_id, entry_id, entry_id - 1, 0,
                                         payload(ledger_id, entry_id, size)))
               for entry_id in range(start, start + count)]
    await asyncio.gather(*futures)


async def read_all(connection: BookieConnection, ledger_id: int, count: int, size: int = 100) -> None:
    responses = await asyncio.gather(*(connection.read(ledger_id, entry_id)
                                       for entry_id in range(count)))
    for entry_id, response in enumerate(responses):
        entry = unpack_entry(DIGEST, response.packed_entry, ledger_id, entry_id)
        assert entry.payload == payload(ledger_id, entry_id, size)


async def test_acknowledged_entries_survive_kill_9(cluster_factory):
    cluster = cluster_factory(bookies=1, bookie_args=["--checkpoint-interval", "3600"])
    connection = await BookieConnection.open(cluster.bookies[0].address)
    await append_all(connection, 7, 2000)
    await connection.close()
    cluster.kill_bookie(0)  # SIGKILL right after the acknowledgements: only the journal has them
    cluster.start_bookie(0)
    connection = await BookieConnection.open(cluster.bookies[0].address)
    await read_all(connection, 7, 2000)
    assert (await connection.read_lac(7)).lac == 1998  # LAC piggybacked on the last entry
    await connection.close()


async def test_fence_survives_restart_and_blocks_plain_adds(cluster_factory):
    cluster = cluster_factory(bookies=1)
    connection = await BookieConnection.open(cluster.bookies[0].address)
    await append_all(connection, 3, 5)
    fenced = await connection.read(3, -1, fence_key=KEY)
    assert fenced.lac == 3 and fenced.packed_entry == b""
    await connection.close()
    cluster.kill_bookie(0)
    cluster.start_bookie(0)
    connection = await BookieConnection.open(cluster.bookies[0].address)
    with pytest.raises(LedgerFencedError):
        await append_all(connection, 3, 1, start=5)
    recovery_entry = pack_entry(DIGEST, 3, 5, 4, 0, payload(3, 5))
    await connection.add(3, 5, KEY, recovery_entry, recovery=True)  # recovery write-back passes
    assert (await connection.read(3, 5)).packed_entry == recovery_entry
    with pytest.raises(UnauthorizedError):
        await connection.read(3, -1, fence_key=master_key(b"wrong"))
    await connection.close()


def _journal_end(path: Path) -> int:
    """Offset just past the last non-zero byte: where preallocated zeros begin."""
    data = path.read_bytes()
    return len(data.rstrip(b"\x00"))


@pytest.mark.parametrize("damage", ["junk", "torn"])
async def test_torn_or_junk_journal_tail_replays_its_valid_prefix(cluster_factory, damage):
    cluster = cluster_factory(bookies=1, bookie_args=["--checkpoint-interval", "3600"])
    connection = await BookieConnection.open(cluster.bookies[0].address)
    await append_all(connection, 11, 500)
    await connection.close()
    cluster.kill_bookie(0)
    journals = sorted((cluster.bookies[0].data_dir / "journal").glob("*.journal"))
    newest = max(journals, key=_journal_end)  # the file that holds the adds
    end = _journal_end(newest)
    with open(newest, "r+b") as handle:
        if damage == "junk":
            handle.seek(end)
            handle.write(os.urandom(3000))  # garbage after the last record
        else:
            # a record that claims more bytes than were written: length, then a cut-off body
            handle.seek(end)
            handle.write((500).to_bytes(4, "big") + b"\x01\x02\x03\x04" + b"x" * 10)
    cluster.start_bookie(0)
    connection = await BookieConnection.open(cluster.bookies[0].address)
    await read_all(connection, 11, 500)
    with pytest.raises(NoSuchEntryError):
        await connection.read(11, 500)
    await append_all(connection, 11, 10, start=500)  # and it keeps accepting adds
    await connection.close()


def _in_an_entry_log(data_dir: Path, ledger_id: int, entry_id: int) -> bool:
    logs = data_dir / "ledgers" / "entrylogs"
    return any(record[2:] == (ledger_id, entry_id) for path in logs.glob("*.log")
               for record in entry_log_records(path))


async def test_a_recovery_write_back_repairs_a_damaged_entry_whether_single_or_batched(cluster_factory):
    """The one ADD route: on a stored entry that cannot be read, a plain add gets IO_ERROR and a
    recovery add rewrites it, in an ADD_BATCH as in a single ADD, and the connection goes on."""
    cluster = cluster_factory(bookies=1, bookie_args=["--checkpoint-interval", "0.2"])
    bookie = cluster.bookies[0]
    connection = await BookieConnection.open(bookie.address)
    await append_all(connection, 21, 4)
    await eventually(lambda: _in_an_entry_log(bookie.data_dir, 21, 3), timeout_s=20)
    # a later checkpoint must move the journal's mark past those adds too, or the restart would
    # replay the undamaged entries from the journal into the write cache
    await append_all(connection, 22, 1)
    await eventually(lambda: _in_an_entry_log(bookie.data_dir, 22, 0), timeout_s=20)
    await connection.close()
    cluster.kill_bookie(0)
    damaged = {(21, entry_id) for entry_id in range(4)}
    assert flip_entry_log_bytes(bookie.data_dir, random.Random(2), entries=damaged) == 4
    cluster.start_bookie(0)
    connection = await BookieConnection.open(bookie.address)

    def entry(entry_id: int) -> bytes:
        return pack_entry(DIGEST, 21, entry_id, entry_id - 1, 0, payload(21, entry_id))

    async def add_batch(entry_ids: list[int], recovery: bool) -> AddBatchResponse:
        request_id = connection.next_request_id()
        frame = encode_add_batch(request_id, [(21, KEY, recovery, [entry(e) for e in entry_ids])])
        return await connection.request(EncodedRequest(request_id, frame))  # type: ignore[arg-type]

    plain = await add_batch([0, 1], recovery=False)
    assert [(failure.index, failure.status) for failure in plain.failures] == [
        (0, Status.IO_ERROR), (1, Status.IO_ERROR)]
    with pytest.raises(BookieIOError):
        await connection.add(21, 2, KEY, entry(2))
    assert (await add_batch([0, 1], recovery=True)).failures == ()
    await connection.add(21, 2, KEY, entry(2), recovery=True)
    for entry_id in range(3):
        assert (await connection.read(21, entry_id)).packed_entry == entry(entry_id)
    with pytest.raises(BookieIOError):  # the one nobody wrote back is still damaged
        await connection.read(21, 3)
    await connection.close()
    log_text = (bookie.data_dir / "bookie.log").read_text()
    assert "Traceback" not in log_text and "rewritten by a recovery add" in log_text


async def test_read_only_bookie_refuses_adds_and_says_so(cluster_factory, zk_server):
    cluster = cluster_factory(bookies=1, bookie_args=["--disk-threshold", "0.0001",
                                                      "--disk-lwm", "0.00005"])
    connection = await BookieConnection.open(cluster.bookies[0].address)
    with pytest.raises(BookieReadOnlyError, match="disk usage"):
        await append_all(connection, 1, 1)
    info = await connection.info()
    assert info.state.name == "READ_ONLY"
    zk = AsyncZooKeeper(zk_server.address)
    await zk.start()
    data, _ = await zk.get(layout.bookie_path(cluster.zk_root, cluster.bookies[0].address))
    assert json.loads(data)["state"] == "read_only"
    await zk.close()
    await connection.close()


async def test_operator_read_only_switch_over_http(cluster_factory):
    cluster = cluster_factory(bookies=1)
    http = cluster.bookies[0].http
    connection = await BookieConnection.open(cluster.bookies[0].address)
    async with aiohttp.ClientSession() as session:
        async with session.put(f"{http}/api/v1/bookie/state", json={"read_only": True}) as response:
            assert response.status == 200 and (await response.json())["state"] == "read_only"
        with pytest.raises(BookieReadOnlyError, match="operator"):
            await append_all(connection, 1, 1)
        async with session.put(f"{http}/api/v1/bookie/state", json={"read_only": "yes"}) as response:
            assert response.status == 400 and "read_only" in (await response.json())["error"]
        async with session.put(f"{http}/api/v1/bookie/state", json={"read_only": False}) as response:
            assert (await response.json())["state"] == "writable"
        await append_all(connection, 1, 1)
    await connection.close()


async def test_gc_deletes_ledgers_without_metadata_and_returns_disk_space(cluster_factory, zk_server):
    cluster = cluster_factory(bookies=1, bookie_args=[
        "--entry-log-size", "1MiB", "--checkpoint-interval", "0.2", "--gc-interval", "0", "--gc-grace", "0"])
    bookie = cluster.bookies[0]
    entry_logs = bookie.data_dir / "ledgers" / "entrylogs"
    zk = AsyncZooKeeper(zk_server.address)
    await zk.start()
    connection = await BookieConnection.open(bookie.address)
    async with aiohttp.ClientSession() as session:
        async def flushed() -> bool:
            async with session.get(f"{bookie.http}/api/v1/bookie/info") as response:
                return (await response.json())["unflushed_bytes"] == 0

        for ledger_id in (21, 22):  # one after the other, so ledger 21 fills entry logs of its own
            await zk.create(layout.ledger_path(cluster.zk_root, ledger_id), b"{}", makepath=True)
            await append_all(connection, ledger_id, 600, size=8000)  # ~4.8 MB each
            await eventually(flushed, timeout_s=30)
        before = _disk_bytes(entry_logs)
        await zk.delete(layout.ledger_path(cluster.zk_root, 21))
        async with session.post(f"{bookie.http}/api/v1/gc") as response:
            report = await response.json()
        assert report["deleted_ledgers"] == [21]
        after = _disk_bytes(entry_logs)
        assert before - after > 3_500_000, (before, after)  # really freed on disk
        assert report["reclaimed_bytes"] > 3_500_000  # what the bookie reports (file bytes)
        async with session.get(f"{bookie.http}/api/v1/ledgers") as response:
            listed = [item["ledger_id"] for item in (await response.json())["ledgers"]]
        assert listed == [22]
        with pytest.raises(NoSuchLedgerError):
            await connection.read(21, 0)
    await read_all(connection, 22, 600, size=8000)  # the live ledger is intact
    await connection.close()
    await zk.close()


async def test_gc_never_drops_a_ledger_first_seen_within_its_grace_period(cluster_factory, zk_server):
    """Issue 11 item 10: a lookup that says "no such ledger" (a lagging ZooKeeper follower answers
    so for a ledger created a moment ago) must not delete acknowledged entries of a ledger the
    bookie has just begun to store; only once the grace period has passed may GC drop it."""
    cluster = cluster_factory(bookies=1, bookie_args=["--gc-interval", "0", "--gc-grace", "3"])
    bookie = cluster.bookies[0]
    zk = AsyncZooKeeper(zk_server.address)
    await zk.start()
    connection = await BookieConnection.open(bookie.address)
    try:
        await append_all(connection, 31, 5)  # no metadata node: the lookup says it is gone
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{bookie.http}/api/v1/gc") as response:
                report = await response.json()
            assert report["deleted_ledgers"] == [] and report["kept_by_grace"] == 1
            async with session.get(f"{bookie.http}/metrics") as response:
                assert "dlog_bookie_gc_ledgers_kept_by_grace 1.0" in await response.text()
            await read_all(connection, 31, 5)  # every entry is still there

            async def collected() -> bool:
                async with session.post(f"{bookie.http}/api/v1/gc") as answer:
                    return (await answer.json())["deleted_ledgers"] == [31]

            await eventually(collected, timeout_s=20, interval_s=0.5)  # after the grace: gone for good
    finally:
        await connection.close()
        await zk.close()


def _disk_bytes(directory: Path) -> int:
    """Bytes the files really occupy (allocated blocks), as du counts them."""
    return sum(path.stat().st_blocks * 512 for path in directory.iterdir() if path.is_file())


async def test_wiped_data_directory_refuses_to_start(cluster_factory):
    cluster = cluster_factory(bookies=1)
    cluster.stop_bookie(0)
    data_dir = cluster.bookies[0].data_dir
    (data_dir / "cookie.json").unlink()
    cluster.launch_bookie(0)
    status = cluster.bookies[0].process.wait(timeout=60)
    assert status != 0
    assert "cookie" in cluster.bookie_log_tail(0).lower()


async def test_http_admin_endpoints(cluster_factory):
    cluster = cluster_factory(bookies=1)
    http = cluster.bookies[0].http
    connection = await BookieConnection.open(cluster.bookies[0].address)
    await append_all(connection, 5, 10)
    await connection.close()
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{http}/health") as response:
            assert response.status == 200
        async with session.get(f"{http}/metrics") as response:
            text = await response.text()
        for name in ("dlog_bookie_add_entries_total 10.0", "dlog_bookie_journal_fsync_seconds_bucket",
                     "dlog_bookie_journal_group_records_bucket", "dlog_bookie_in_flight_requests",
                     "dlog_bookie_journal_inline_groups_total"):
            assert name in text, name
        async with session.get(f"{http}/api/v1/ledgers") as response:
            assert (await response.json())["ledgers"] == [
                {"ledger_id": 5, "fenced": False, "lac": 8, "last_entry_id": 9}]
        async with session.get(f"{http}/api/v1/ledgers?limit=0") as response:
            assert response.status == 400


def test_bookie_list_command_prints_one_json_object_per_bookie(cluster_factory, zk_server):
    cluster = cluster_factory(bookies=2)
    result = subprocess.run([sys.executable, "-m", "dlog_tools.cli", "bookie", "list", "--json",
                             "--zk", zk_server.address, "--zk-root", cluster.zk_root],
                            capture_output=True, text=True, timeout=60, check=True)
    listed = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted(item["address"] for item in listed) == sorted(b.address for b in cluster.bookies)
    for item in listed:
        assert item["state"] == "writable" and item["http"].startswith("http://127.0.0.1:")
        assert item["id"] == item["address"]
