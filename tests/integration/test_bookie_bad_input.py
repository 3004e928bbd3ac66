"""Every bad frame and bad entry from RELIABILITY.md gets a clean error from a real bookie, changes
nothing, and other connections keep being served."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest

from bookkeeper.client.connection import BookieConnection
from bookkeeper.errors import (
    BadRequestError,
    EntryExistsError,
    EntryTooLargeError,
    LedgerFencedError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bookkeeper.protocol.entry import Digest, DigestType, master_key, pack_entry
from bookkeeper.protocol.wire import BookieInfoRequest, ErrorResponse, ResponseDecoder, Status, encode_request

KEY = master_key(b"pw")
DIGEST = Digest.for_ledger(DigestType.CRC32C, b"pw")


@pytest.fixture(scope="module")
def bookie_address(zk_server, tmp_path_factory):
    import uuid

    from dlog_tools.cluster import LocalCluster

    cluster = LocalCluster(tmp_path_factory.mktemp("bad-input"), bookies=1,
                           zk_root=f"/t-{uuid.uuid4().hex[:8]}", zk_server=zk_server,
                           bookie_args=["--max-entry-size", "1KiB", "--idle-timeout", "0.5",
                                        "--max-in-flight", "8"])
    cluster.start()
    yield cluster.bookies[0].address
    cluster.stop()


def raw_exchange(address: str, data: bytes, *, close_write: bool = True,
                 timeout_s: float = 10.0, answer_version: int = 1) -> tuple[list, bool]:
    """Send raw bytes; return the decoded answers and whether the bookie closed the connection."""
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        if data:
            sock.sendall(data)
        if close_write:
            sock.shutdown(socket.SHUT_WR)
        decoder = ResponseDecoder()
        answers, closed = [], False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                closed = True
                break
            if answer_version not in (1, 2):  # a refusal in a version no decoder speaks
                assert chunk[4] == answer_version
                chunk = chunk[:4] + b"\x02" + chunk[5:]
            decoder.receive_data(chunk)
            while (answer := decoder.next_message()) is not None:
                answers.append(answer)
            if answers and not close_write:
                break
        return answers, closed


def raw_frame(opcode: int, body: bytes, *, version: int = 1, request_id: int = 9,
              length: int | None = None) -> bytes:
    header = struct.pack(">BBHQ", version, opcode, 0, request_id)
    return struct.pack(">I", 12 + len(body) if length is None else length) + header + body


def assert_still_serving(address: str) -> None:
    answers, _ = raw_exchange(address, encode_request(BookieInfoRequest(1)))
    assert answers and answers[0].bookie_id == address


@pytest.mark.parametrize("data, status, closes", [
    (struct.pack(">I", 0) + b"\x00" * 12, Status.BAD_REQUEST, True),  # zero length
    (struct.pack(">I", 2**31 + 5) + b"\x00" * 12, Status.BAD_REQUEST, True),  # "negative" (i32)
    (struct.pack(">I", 50 * 2**20) + b"\x00" * 12, Status.BAD_REQUEST, True),  # oversized
    (raw_frame(5, b"", version=7), Status.BAD_VERSION, True),  # unknown version
    (raw_frame(77, b""), Status.BAD_REQUEST, False),  # unknown opcode
    (raw_frame(5, b"trailing garbage"), Status.BAD_REQUEST, False),  # body longer than the opcode's
    (raw_frame(2, b"\x00" * 3), Status.BAD_REQUEST, False),  # body shorter than the opcode's
])
def test_bad_frames_get_an_error_answer(bookie_address, data, status, closes):
    answers, closed = raw_exchange(bookie_address, data,
                                   answer_version=data[4] if status == Status.BAD_VERSION else 1)
    assert isinstance(answers[0], ErrorResponse) and answers[0].status == status
    assert answers[0].message  # says what was wrong
    if closes:
        assert closed
    assert_still_serving(bookie_address)


def test_truncated_frame_then_eof_is_dropped_quietly(bookie_address):
    frame = encode_request(BookieInfoRequest(3))
    answers, closed = raw_exchange(bookie_address, frame[: len(frame) - 4])
    assert answers == [] and closed
    assert_still_serving(bookie_address)


def test_a_stalled_partial_frame_is_closed_after_the_idle_timeout(bookie_address):
    frame = encode_request(BookieInfoRequest(3))
    started = time.monotonic()
    answers, closed = raw_exchange(bookie_address, frame[:6], close_write=False)
    waited_s = time.monotonic() - started
    assert closed or (answers and answers[0].status == Status.BAD_REQUEST)
    assert "idle" in answers[0].message
    assert waited_s < 5
    assert_still_serving(bookie_address)


def test_more_requests_than_allowed_in_flight_are_all_answered(bookie_address):
    """The bookie stops reading instead of queueing without bound; nothing is lost."""
    requests = b"".join(encode_request(BookieInfoRequest(i)) for i in range(5000))
    answers, _ = raw_exchange(bookie_address, requests)
    assert sorted(answer.request_id for answer in answers) == list(range(5000))


async def _expect(address: str, request_factory, error_type, words: str) -> None:
    connection = await BookieConnection.open(address)
    try:
        with pytest.raises(error_type) as caught:
            await request_factory(connection)
        assert words in str(caught.value)
    finally:
        await connection.close()


def entry(ledger_id: int, entry_id: int, data: bytes = b"x" * 10, lac: int | None = None) -> bytes:
    return pack_entry(DIGEST, ledger_id, entry_id, entry_id - 1 if lac is None else lac, 0, data)


async def test_bad_entries_are_refused_and_change_nothing(bookie_address):
    connection = await BookieConnection.open(bookie_address)
    await connection.add(100, 0, KEY, entry(100, 0))
    await connection.add(100, 1, KEY, entry(100, 1))
    cases = [
        # just over the 1 KiB entry limit but inside the frame limit: refused, connection kept
        (lambda c: c.add(100, 2, KEY, entry(100, 2, b"y" * 1100)), EntryTooLargeError, "maximum"),
        (lambda c: c.add(100, -1, KEY, entry(100, -1)), BadRequestError, ">= 0"),
        (lambda c: c.add(-5, 0, KEY, entry(-5, 0)), BadRequestError, ">= 0"),
        (lambda c: c.add(100, 1, KEY, entry(100, 1, b"different")), EntryExistsError, "different"),
        (lambda c: c.add(100, 2, KEY, entry(100, 3)), BadRequestError, "header says 100:3"),
        (lambda c: c.add(100, 2, KEY, entry(100, 2, lac=5)), BadRequestError, "LAC"),
        (lambda c: c.add(100, 2, KEY, b"short"), BadRequestError, "shorter"),
        (lambda c: c.add(100, 2, master_key(b"bad"), entry(100, 2)), UnauthorizedError, "master key"),
        (lambda c: c.read(999_999, 0), NoSuchLedgerError, "no ledger"),
    ]
    for request_factory, error_type, words in cases:
        await _expect(bookie_address, request_factory, error_type, words)
    # nothing changed: entry 1 still has its bytes, the LAC did not move, entry 2 was never stored
    assert (await connection.read(100, 1)).packed_entry == entry(100, 1)
    assert (await connection.read_lac(100)).lac == 0
    # digest mismatch is caught by the reader: a bookie stores what it was given, the reader checks
    await connection.read(100, -1, fence_key=KEY)
    await _expect(bookie_address, lambda c: c.add(100, 2, KEY, entry(100, 2)), LedgerFencedError,
                  "fenced")
    await connection.close()


async def test_long_poll_answers_when_the_lac_moves(bookie_address):
    connection = await BookieConnection.open(bookie_address)
    await connection.add(200, 0, KEY, entry(200, 0))
    waiting = asyncio.ensure_future(connection.read(200, 0, previous_lac=-1, timeout_ms=10_000))
    await asyncio.sleep(0)  # let the request leave; the bookie must hold it
    assert not waiting.done()
    started = time.monotonic()
    await connection.add(200, 1, KEY, entry(200, 1))  # carries LAC 0
    answer = await asyncio.wait_for(waiting, 5)
    assert answer.lac == 0 and answer.packed_entry == entry(200, 0)
    assert time.monotonic() - started < 2
    timed_out = await connection.read_lac(200, previous_lac=0, timeout_ms=100)
    assert timed_out.lac == 0  # no progress: answered at the timeout with the same LAC
    await connection.write_lac(200, KEY, 1)
    assert (await connection.read_lac(200, previous_lac=0, timeout_ms=5000)).lac == 1
    await connection.close()


async def test_a_long_poll_for_an_entry_this_bookie_lacks_answers_with_the_lac(bookie_address):
    """With E > Qw an entry is on some bookies only: a long poll that lands elsewhere must still
    hand over the LAC (the reader then reads the entry from its write set), not NO_ENTRY."""
    connection = await BookieConnection.open(bookie_address)
    await connection.add(201, 0, KEY, entry(201, 0))
    await connection.write_lac(201, KEY, 3)  # entries 1..3 went to the other bookies of their sets
    answer = await connection.read(201, 2, previous_lac=0, timeout_ms=5000)  # the LAC already moved
    assert answer.lac == 3 and answer.packed_entry == b""
    parked = asyncio.ensure_future(connection.read(201, 5, previous_lac=3, timeout_ms=10_000))
    await asyncio.sleep(0)
    assert not parked.done()
    await connection.write_lac(201, KEY, 5)
    answer = await asyncio.wait_for(parked, 5)
    assert answer.lac == 5 and answer.packed_entry == b""
    await connection.close()
