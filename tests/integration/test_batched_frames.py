"""Protocol version 2 on a real bookie process: entries of many ledgers appended together share
ADD_BATCH frames and survive kill -9 (the journal's group records replay), catch-up reads and
recovery go as READ_RANGE, and a version 1 client is still served in version 1."""

from __future__ import annotations

import asyncio
import signal
import socket
import struct

from bookkeeper.client import BookKeeper
from bookkeeper.protocol.entry import Digest, DigestType, master_key, pack_entry
from bookkeeper.protocol.wire import OpCode


def client_for(cluster) -> BookKeeper:  # type: ignore[no-untyped-def]
    return BookKeeper(zk=cluster.zk_address, root=cluster.zk_root)


def payload(ledger: int, index: int) -> bytes:
    return b"ledger-%d-entry-%06d" % (ledger, index) * 3


async def test_batched_appends_of_many_ledgers_survive_kill_9_and_read_back(cluster_factory):
    cluster = cluster_factory(bookies=1)
    async with client_for(cluster) as client:
        handles = [await client.create_ledger(1, 1, 1, password=b"pw") for _ in range(5)]
        frames_before = client.pool.add_frames_sent
        futures = [handle.append_batch([payload(number, i) for i in range(40)])
                   for number, handle in enumerate(handles)]
        futures += [handle.append_async(payload(number, 40)) for number, handle in enumerate(handles)]
        await asyncio.gather(*futures)
        assert client.pool.add_frames_sent - frames_before <= 2  # 205 entries of 5 ledgers, one turn
        ids = [handle.ledger_id for handle in handles]
    cluster.kill_bookie(0, signal.SIGKILL)  # nothing checkpointed: all comes back from the journal
    cluster.bookies[0].process.wait(10)  # type: ignore[union-attr]
    cluster.start_bookie(0)
    async with client_for(cluster) as client:
        for number, ledger_id in enumerate(ids):
            reader = await client.open_ledger(ledger_id, password=b"pw", recovery=True)  # fencing READ_RANGE
            assert reader.last_add_confirmed == 40
            entries = await reader.read(0, 40)
            assert [entry.payload for entry in entries] == [payload(number, i) for i in range(41)]


async def test_a_striped_ledger_reads_back_through_ranges(cluster_factory):
    cluster = cluster_factory(bookies=3)
    async with client_for(cluster) as client:
        handle = await client.create_ledger(3, 2, 2, password=b"pw")
        await handle.append_batch([payload(0, i) for i in range(300)])
        await handle.close()
        reader = await client.open_ledger(handle.ledger_id, password=b"pw", recovery=False)
        entries = await reader.read(0, 299)
        assert [entry.payload for entry in entries] == [payload(0, i) for i in range(300)]


def test_a_version_1_client_is_served_in_version_1(cluster_factory):
    cluster = cluster_factory(bookies=1)
    key, digest = master_key(b"pw"), Digest.for_ledger(DigestType.CRC32C, b"pw")
    entry = pack_entry(digest, 77, 0, -1, 5, b"hello")
    body = struct.pack(">qq32s", 77, 0, key) + entry
    add = struct.pack(">IBBHQ", 12 + len(body), 1, OpCode.ADD, 0, 5) + body
    read = struct.pack(">IBBHQqq", 28, 1, OpCode.READ, 0, 6, 77, 0)
    batch = struct.pack(">IBBHQ", 12, 1, OpCode.ADD_BATCH, 0, 7)  # not a version 1 opcode
    host, port = cluster.bookies[0].address.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(add)
        answers = _read_frames(sock, 1)
        sock.sendall(read + batch)
        answers += _read_frames(sock, 2)
    versions = [version for version, _, _, _, _ in answers]
    assert versions == [1, 1, 1]
    assert [(request_id, status) for _, _, status, request_id, _ in answers] == [(5, 0), (6, 0), (7, 100)]
    assert answers[1][4].endswith(entry) and b"version 2" in answers[2][4]


def _read_frames(sock: socket.socket, count: int) -> list[tuple[int, int, int, int, bytes]]:
    frames, data = [], b""
    while len(frames) < count:
        chunk = sock.recv(65536)
        assert chunk, "the bookie closed the connection"
        data += chunk
        while len(data) >= 4 and len(data) >= 4 + struct.unpack_from(">I", data)[0]:
            length = struct.unpack_from(">I", data)[0]
            version, opcode, status, request_id = struct.unpack_from(">BBHQ", data, 4)
            frames.append((version, opcode, status, request_id, data[16: 4 + length]))
            data = data[4 + length:]
    return frames
