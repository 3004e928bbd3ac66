"""Thousands of malformed frames (seeded mutations of valid ones) against a plaintext bookie and
a TLS bookie: every one is answered or closes only its own connection, stored entries stay
byte-identical, and the bookie keeps serving."""

from __future__ import annotations

import random
import socket
import ssl
import struct

from bookkeeper.client.connection import BookieConnection, ConnectSecurity
from bookkeeper.protocol.entry import Digest, DigestType, master_key, pack_entry
from bookkeeper.protocol.wire import (
    AddRequest,
    AuthMechanism,
    AuthRequest,
    BookieInfoRequest,
    ReadLacRequest,
    ReadRequest,
    WriteLacRequest,
    encode_request,
)
from bookkeeper.security.tls import ClientTls

FRAMES = 3000
SEED = 14
OTHER_KEY = master_key(b"not the password")


def templates(ledger_ids: list[int]) -> list[bytes]:
    digest = Digest.for_ledger(DigestType.CRC32C, b"x")
    frames = []
    for ledger_id in ledger_ids:
        frames += [
            encode_request(AddRequest(1, ledger_id, 3, OTHER_KEY, pack_entry(digest, ledger_id, 3, 2, 9, b"y" * 9))),
            encode_request(ReadRequest(2, ledger_id, 0)),
            encode_request(ReadRequest(3, ledger_id, -1, True, OTHER_KEY)),
            encode_request(ReadRequest(4, ledger_id, 0, False, b"", True, 0, 50)),
            encode_request(ReadLacRequest(5, ledger_id)),
            encode_request(WriteLacRequest(6, ledger_id, OTHER_KEY, 1)),
        ]
    return frames + [encode_request(BookieInfoRequest(7)), encode_request(AuthRequest(8, 1, b"junk"))]


def mutate(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    kind = rng.randrange(5)
    if kind == 0:  # flip bytes anywhere after the length
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(4, len(data))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # a wrong body length, framed consistently
        body = data[16:]
        body = body[: rng.randrange(len(body) + 1)] + bytes(rng.randrange(40))
        data = bytearray(struct.pack(">I", 12 + len(body)) + data[4:16] + body)
    elif kind == 2:  # unknown opcode or flags
        data[5] = rng.choice([0, 7, 77, 255, data[5]])
        data[6:8] = struct.pack(">H", rng.choice([0, 0x8, 0xFFFF, 0x5]))
    elif kind == 3:  # a length that lies (kept small so only this connection waits)
        data[0:4] = struct.pack(">I", rng.choice([0, 5, 11, len(data) - 4 + rng.randrange(1, 8)]))
    else:  # random bytes of a random size
        data = bytearray(struct.pack(">I", rng.randrange(12, 200))) + rng.randbytes(rng.randrange(12, 200))
    return bytes(data)


def fuzz(address: str, wrap, rng: random.Random) -> int:
    """Send FRAMES mutated frames, reconnecting whenever the bookie closes; returns reconnects."""
    host, port = address.rsplit(":", 1)
    frames = templates([7, 8, 123_456])
    reconnects, sent = 0, 0
    while sent < FRAMES:
        with wrap(socket.create_connection((host, int(port)), timeout=5)) as sock:
            sock.settimeout(2)
            try:
                for _ in range(200):
                    sock.sendall(mutate(rng, rng.choice(frames)))
                    sent += 1
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(65536):
                    pass
            except (OSError, ssl.SSLError):
                pass
        reconnects += 1
    return reconnects


async def check_unchanged(address: str, security: ConnectSecurity, ledger_id: int, before: list[bytes]) -> None:
    connection = await BookieConnection.open(address, security=security)
    try:
        after = [(await connection.read(ledger_id, entry_id)).packed_entry for entry_id in range(len(before))]
        assert after == before
        assert (await connection.info()).bookie_id == address
    finally:
        await connection.close()


async def test_fuzzed_frames_against_a_plaintext_bookie(cluster_factory):
    cluster = cluster_factory(bookies=1, bookie_args=["--idle-timeout", "0.3"])
    address = cluster.bookies[0].address
    key, digest = master_key(b"pw"), Digest.for_ledger(DigestType.CRC32C, b"pw")
    connection = await BookieConnection.open(address)
    before = [pack_entry(digest, 7, entry_id, entry_id - 1, entry_id + 1, bytes([entry_id]) * 100)
              for entry_id in range(5)]
    for entry_id, entry in enumerate(before):
        await connection.add(7, entry_id, key, entry)
    await connection.close()
    fuzz(address, lambda sock: sock, random.Random(SEED))
    await check_unchanged(address, ConnectSecurity(), 7, before)


async def test_fuzzed_frames_against_a_tls_bookie(secure_cluster):
    from dlog import Namespace

    secure = secure_cluster.secure_dir
    settings = secure.client_settings("orders", ["produce:orders", "consume:orders"])
    async with Namespace(secure_cluster.zk_address, "orders", security=settings) as ns:
        await ns.create_stream("fuzzed", ensemble=1, write_quorum=1, ack_quorum=1, exist_ok=True)
        async with ns.open_writer("fuzzed") as writer:
            offsets = [await writer.write(bytes([i]) * 50) for i in range(5)]
    ledger_id = offsets[0].ledger_id
    ensemble = await _ensemble(secure_cluster, ledger_id)
    bookie = next(b for b in secure_cluster.bookies if b.bookie_id in ensemble)
    tls = ClientTls(str(secure.ca_file)).context()
    admin = ConnectSecurity(tls, secure.admin_token)
    connection = await BookieConnection.open(bookie.address, security=admin)
    before = [(await connection.read(ledger_id, entry_id)).packed_entry for entry_id in range(5)]
    await connection.close()
    token = secure.token("fuzzer", ["produce:orders", "consume:orders"])
    auth = encode_request(AuthRequest(1, AuthMechanism.TOKEN, token.encode()))

    def wrap(sock: socket.socket) -> ssl.SSLSocket:
        wrapped = tls.wrap_socket(sock, server_hostname="127.0.0.1")
        wrapped.sendall(auth)
        return wrapped

    fuzz(bookie.address, wrap, random.Random(SEED))
    await check_unchanged(bookie.address, admin, ledger_id, before)


async def _ensemble(cluster, ledger_id: int) -> list[str]:
    from bookkeeper.client import BookKeeper

    async with BookKeeper(cluster.zk_address, security=cluster.secure_dir.admin_settings()) as client:
        metadata, _ = await client.ledger_metadata(ledger_id)
    return list(metadata.ensembles[0][1])
