"""No client can exhaust a bookie (S4), each case with raw sockets against a real bookie process:
unread answers, silent connections, dripped partial frames and long polls of closed connections
are bounded, the bookie's memory stays under its limits, and a second client keeps being served."""

from __future__ import annotations

import socket
import struct
import time
import urllib.request
from pathlib import Path

import pytest

from bookkeeper.protocol.entry import Digest, DigestType, master_key, pack_entry
from bookkeeper.protocol.wire import (
    AddRequest,
    BookieInfoRequest,
    ReadLacRequest,
    ReadRequest,
    ResponseDecoder,
    Status,
    encode_request,
)
from tests.helpers import eventually_blocking

KEY = master_key(b"pw")
DIGEST = Digest.for_ledger(DigestType.CRC32C, b"pw")
ENTRY_BYTES = 1 << 20
RSS_GROWTH_MAX_BYTES = 96 << 20  # far below what the attacks grew a bookie by before (1.7 GiB)
ATTACKER_HOST = "127.0.0.2"  # loopback too, but another host to the per-host cap


@pytest.fixture(scope="module")
def bookie(zk_server, tmp_path_factory):
    import uuid

    from dlog_tools.cluster import LocalCluster

    cluster = LocalCluster(tmp_path_factory.mktemp("exhaust"), bookies=1,
                           zk_root=f"/t-{uuid.uuid4().hex[:8]}", zk_server=zk_server,
                           bookie_args=["--max-unsent", "2MiB", "--unsent-timeout", "2",
                                        "--first-frame-timeout", "1.5", "--max-connections-per-host", "40",
                                        "--max-partial-bytes", "8MiB", "--max-long-polls", "20",
                                        "--idle-timeout", "30"])
    cluster.start()
    yield cluster.bookies[0]
    cluster.stop()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def connect(address: str, source: str = "127.0.0.1", rcvbuf: int | None = None) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect((host, int(port)))
    return sock


def exchange(address: str, frame: bytes) -> list:
    with connect(address) as sock:
        sock.sendall(frame)
        decoder, answers = ResponseDecoder(), []
        while not answers:
            chunk = sock.recv(65536)
            if not chunk:
                break
            decoder.receive_data(chunk)
            while (answer := decoder.next_message()) is not None:
                answers.append(answer)
        return answers


def served(address: str) -> bool:
    answers = exchange(address, encode_request(BookieInfoRequest(1)))
    return bool(answers) and answers[0].bookie_id == address


def closed_by_peer(sock: socket.socket, timeout_s: float) -> bool:
    sock.settimeout(timeout_s)
    try:
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def metric(bookie, name: str) -> float:
    text = urllib.request.urlopen(bookie.http + "/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def test_a_client_that_never_reads_its_answers_is_bounded_then_closed(bookie):
    ledger_id = 501
    entry = pack_entry(DIGEST, ledger_id, 0, -1, ENTRY_BYTES, b"e" * ENTRY_BYTES)
    assert exchange(bookie.address, encode_request(AddRequest(1, ledger_id, 0, KEY, entry)))[0].entry_id == 0
    before = rss_bytes(bookie.pid)
    attacker = connect(bookie.address, rcvbuf=4096)
    reads = b"".join(encode_request(ReadRequest(i, ledger_id, 0)) for i in range(2000))  # 2 GiB of answers
    attacker.settimeout(0.2)
    sent = 0
    deadline = time.monotonic() + 5
    while sent < len(reads) and time.monotonic() < deadline:  # the bookie stops reading: sends stall
        try:
            sent += attacker.send(reads[sent:])
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    assert served(bookie.address)  # another client is served meanwhile
    assert rss_bytes(bookie.pid) - before < RSS_GROWTH_MAX_BYTES
    # closed after --unsent-timeout (watched without reading, which would take the answers)
    eventually_blocking(lambda: metric(bookie, "dlog_bookie_connections_closed_unsent_total") >= 1, 15, 0.1)
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        for _ in range(100):
            attacker.send(encode_request(BookieInfoRequest(1)))
            time.sleep(0.01)
    attacker.close()
    assert served(bookie.address)


def connect_unless_reset(address: str, source: str) -> socket.socket | None:
    """A connection, or None when the peer reset it before connect() returned: a loaded machine can
    run the bookie's accept-and-refuse before this thread reads the handshake's outcome."""
    try:
        return connect(address, source=source)
    except ConnectionResetError:
        return None


def test_silent_connections_are_capped_per_host_and_closed(bookie):
    silent = [connect_unless_reset(bookie.address, ATTACKER_HOST) for _ in range(60)]
    try:
        assert served(bookie.address)  # another host is served at once
        assert all(sock is not None for sock in silent[:40])  # under the cap: accepted
        refused = sum(sock is None or closed_by_peer(sock, 0.3) for sock in silent[40:])
        assert refused == 20  # over the per-host cap of 40: refused at once
        assert all(closed_by_peer(sock, 10) for sock in silent[:40] if sock is not None)  # no frame within 1.5 s
    finally:
        for sock in silent:
            if sock is not None:
                sock.close()
    assert metric(bookie, 'dlog_bookie_connections_refused_total{cap="per_host"}') >= 20
    assert metric(bookie, "dlog_bookie_connections_closed_idle_total") >= 40
    log_text = (Path(bookie.data_dir) / "bookie.log").read_text()
    assert log_text.count("refusing connection") < 20  # rate-limited, not one line each


def test_dripped_partial_frames_are_capped_over_all_connections(bookie):
    before = rss_bytes(bookie.pid)
    header = struct.pack(">IBBHQ", 12 + 40 + ENTRY_BYTES, 1, 1, 0, 7)
    drippers = []
    try:
        for index in range(16):  # 16 x ~1 MiB partial frames against an 8 MiB cap
            sock = connect(bookie.address, source=ATTACKER_HOST)
            sock.sendall(header + b"\0" * (ENTRY_BYTES - 4096))
            drippers.append(sock)
        assert served(bookie.address)
        closed = sum(closed_by_peer(sock, 0.5) for sock in drippers)
        assert closed >= 8
        assert rss_bytes(bookie.pid) - before < RSS_GROWTH_MAX_BYTES
        assert metric(bookie, "dlog_bookie_partial_frame_bytes") <= 8 << 20
    finally:
        for sock in drippers:
            sock.close()
    assert metric(bookie, "dlog_bookie_connections_closed_partial_total") >= 8


def test_long_polls_of_a_closed_connection_stop_counting_at_once(bookie):
    ledger_id = 502
    entry = pack_entry(DIGEST, ledger_id, 0, -1, 1, b"x")
    exchange(bookie.address, encode_request(AddRequest(1, ledger_id, 0, KEY, entry)))
    polls = b"".join(encode_request(ReadLacRequest(i, ledger_id, True, 5, 60_000)) for i in range(20))
    with connect(bookie.address) as parked:
        parked.sendall(polls)
        eventually_blocking(lambda: metric(bookie, "dlog_bookie_long_polls") == 20, 10, 0.05)
        refused = exchange(bookie.address, encode_request(ReadLacRequest(99, ledger_id, True, 5, 60_000)))
        assert refused[0].status == Status.TOO_MANY_REQUESTS
    eventually_blocking(lambda: metric(bookie, "dlog_bookie_long_polls") == 0, 10, 0.05)
    with connect(bookie.address) as again:  # the waiter limit is free again, long before 60 s
        again.sendall(encode_request(ReadLacRequest(100, ledger_id, True, 5, 60_000)))
        eventually_blocking(lambda: metric(bookie, "dlog_bookie_long_polls") == 1, 10, 0.05)
