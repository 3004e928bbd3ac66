"""No client can exhaust a secure bookie (S4), each attack of issue 20 against a real TLS bookie that
requires tokens, run under an open-file limit: connections still in their TLS handshake count and are
capped from accept, never-reading tenants pipelining READ_RANGEs stay under the global unsent caps,
partial frames before AUTH cannot starve an authenticated 1 MB write, and bad unauthenticated
connections are logged at most once per 10 s per reason; an authenticated client is served meanwhile."""

from __future__ import annotations

import resource
import socket
import ssl
import struct
import sys
import time
import urllib.request
import uuid
from contextlib import ExitStack
from pathlib import Path

import pytest

from bookkeeper.client import BookKeeper
from bookkeeper.protocol.batch import ReadRangeRequest, encode_read_range_request
from bookkeeper.protocol.wire import AuthMechanism, AuthRequest, encode_request
from bookkeeper.security.tls import ClientTls
from tests.helpers import eventually
from tests.integration.test_bookie_exhaustion import closed_by_peer, rss_bytes
from dlog_tools.cluster import LocalCluster

pytestmark = pytest.mark.timeout(240)

OPEN_FILES_MAX = 700  # the bookie's open-file limit: it keeps 256 for itself, admits 444 connections
MiB = 1 << 20
RSS_GROWTH_MAX_BYTES = 96 * MiB
ENTRY_BYTES = MiB
LIMITS = ["--max-connections-per-host", "300", "--first-frame-timeout", "20", "--max-unsent", "2MiB",
          "--unsent-timeout", "5", "--max-global-unsent", "16MiB", "--max-unsent-connections", "8",
          "--max-partial-bytes", "8MiB", "--checkpoint-interval", "0.5", "--gc-interval", "0",
          "--no-autorecovery"]
# run the bookie under the limit: set it, then become the bookie (its parent-death signal survives exec)
UNDER_LIMIT = ("import os, resource, sys; limit = int(sys.argv[1]); "
               "resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)); os.execv(sys.argv[2], sys.argv[2:])")


class LimitedCluster(LocalCluster):
    def bookie_command(self, bookie):  # type: ignore[no-untyped-def]
        return [sys.executable, "-c", UNDER_LIMIT, str(OPEN_FILES_MAX), *super().bookie_command(bookie)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from dlog_tools.secure import create

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # the attacks below hold 800 sockets
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    directory = tmp_path_factory.mktemp("secure-exhaust")
    secure = create(directory / "secure")
    cluster = LimitedCluster(directory / "cluster", bookies=1, secure=secure, bookie_args=LIMITS,
                             zk_root=f"/t-{uuid.uuid4().hex[:8]}")
    cluster.start()
    cluster.secure_dir = secure  # type: ignore[attr-defined]
    yield cluster
    cluster.stop()


def tls_context(cluster) -> ssl.SSLContext:  # type: ignore[no-untyped-def]
    return ClientTls(str(cluster.secure_dir.ca_file)).context()


def metric(cluster, name: str) -> float:  # type: ignore[no-untyped-def]
    """The bookie's metric `name` (0 when it does not export it)."""
    bookie = cluster.bookies[0]
    with urllib.request.urlopen(bookie.http + "/metrics", timeout=5, context=tls_context(cluster)) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def plain(cluster, source: str, rcvbuf: int | None = None) -> socket.socket:  # type: ignore[no-untyped-def]
    """A TCP connection to the bookie from `source` (a loopback address), nothing sent."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((source, 0))
    sock.settimeout(5)
    try:
        sock.connect(("127.0.0.1", cluster.bookies[0].port))
    except OSError:
        sock.close()
        raise
    return sock


def handshaken(cluster, source: str, rcvbuf: int | None = None) -> ssl.SSLSocket:  # type: ignore[no-untyped-def]
    return tls_context(cluster).wrap_socket(plain(cluster, source, rcvbuf), server_hostname="127.0.0.1")


def auth_frame(token: str) -> bytes:
    return encode_request(AuthRequest(1, AuthMechanism.TOKEN, token.encode()))


def open_files(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def log_text(cluster) -> str:  # type: ignore[no-untyped-def]
    return (cluster.bookies[0].data_dir / "bookie.log").read_text()


async def admin_client(cluster) -> BookKeeper:  # type: ignore[no-untyped-def]
    """An authenticated client, connected to the bookie before any attack starts."""
    return await BookKeeper(cluster.zk_address, root=cluster.zk_root,
                            security=cluster.secure_dir.admin_settings()).start()


async def write_and_read(client: BookKeeper, entries: int, size: int) -> None:
    handle = await client.create_ledger(1, 1, 1, password=b"pw")
    payloads = [bytes([index]) * size for index in range(entries)]
    for payload in payloads:
        await handle.append(payload)
    await handle.close()
    reader = await client.open_ledger(handle.ledger_id, password=b"pw")
    assert [entry.payload for entry in await reader.read(0, entries - 1)] == payloads


async def test_connections_in_their_tls_handshake_count_and_are_capped_from_accept(cluster):
    bookie = cluster.bookies[0]
    client = await admin_client(cluster)
    rss_before, checkpoints_before = rss_bytes(bookie.pid), metric(cluster, "dlog_bookie_checkpoints_total")
    cap = metric(cluster, "dlog_bookie_connections_max")
    assert cap <= OPEN_FILES_MAX - 256  # the bookie's own files still open under the limit
    with ExitStack() as idle:
        refused = 0
        for source in ("127.0.0.2", "127.0.0.3"):  # 800 idle TCP connections: no TLS handshake ever
            for _ in range(400):
                try:
                    idle.enter_context(plain(cluster, source))
                except OSError:  # a full accept queue: the bookie cannot accept (EMFILE)
                    refused += 1
        await eventually(lambda: metric(cluster, "dlog_bookie_connections") >= cap, 10)
        assert metric(cluster, "dlog_bookie_connections") <= cap
        assert metric(cluster, "dlog_bookie_tls_handshakes") >= cap - 2  # all but the client's
        assert open_files(bookie.pid) < OPEN_FILES_MAX - 100
        # the authenticated client is served throughout, and the bookie's own files open
        for _ in range(3):
            await write_and_read(client, 4, 64 * 1024)
        await eventually(lambda: metric(cluster, "dlog_bookie_checkpoints_total") >= checkpoints_before + 2, 10)
        assert rss_bytes(bookie.pid) - rss_before < RSS_GROWTH_MAX_BYTES
    await client.close()
    assert "Too many open files" not in log_text(cluster)
    await eventually(lambda: metric(cluster, "dlog_bookie_connections") <= 2, 30)


async def test_over_the_caps_a_connection_is_refused_at_accept(cluster):
    with ExitStack() as idle:
        held = [idle.enter_context(plain(cluster, "127.0.0.4")) for _ in range(300)]
        extra = [idle.enter_context(plain(cluster, "127.0.0.4")) for _ in range(50)]
        assert all(closed_by_peer(sock, 2) for sock in extra)  # per host: refused at once, no handshake
        assert not any(closed_by_peer(sock, 0.01) for sock in held[:20])
        assert metric(cluster, 'dlog_bookie_connections_refused_total{cap="per_host"}') >= 50
    await eventually(lambda: metric(cluster, "dlog_bookie_connections") <= 2, 30)


async def test_never_reading_tenants_stay_under_the_global_unsent_caps(cluster):
    bookie = cluster.bookies[0]
    client = await admin_client(cluster)
    handle = await client.create_ledger(1, 1, 1, password=b"pw")
    for index in range(8):
        await handle.append(bytes([index]) * ENTRY_BYTES)
    reader = await client.open_ledger(handle.ledger_id, password=b"pw", recovery=False)
    token = cluster.secure_dir.admin_token
    reads = b"".join(encode_read_range_request(ReadRangeRequest(2 + i, handle.ledger_id, 0, 7, 1, 4 * MiB))
                     for i in range(200))  # 800 MiB of answers per connection
    rss_before = rss_bytes(bookie.pid)
    with ExitStack() as tenants:
        for _ in range(40):
            tenant = tenants.enter_context(handshaken(cluster, "127.0.0.5", rcvbuf=4096))
            tenant.sendall(auth_frame(token) + reads)
        deadline = time.monotonic() + 8
        peak_bytes = peak_rss = 0
        while time.monotonic() < deadline:  # they hold what they can; the bookie stays bounded
            peak_bytes = max(peak_bytes, metric(cluster, "dlog_bookie_unsent_bytes"))
            peak_rss = max(peak_rss, rss_bytes(bookie.pid) - rss_before)
            assert [entry.payload[0] for entry in await reader.read(0, 7)] == list(range(8))
            await handle.append(b"served")
        assert peak_bytes <= 16 * MiB + 8 * 5 * MiB  # the global cap, and 8 holders one answer past it
        assert peak_rss < RSS_GROWTH_MAX_BYTES
        assert metric(cluster, "dlog_bookie_connections_closed_unsent_total") >= 30
    await handle.close()
    await client.close()


async def test_partial_frames_before_auth_cannot_starve_an_authenticated_write(cluster):
    header = struct.pack(">IBBHQ", 12 + 40 + ENTRY_BYTES, 2, 1, 0, 7)  # an ADD of 1 MiB, never finished
    client = await admin_client(cluster)
    with ExitStack() as drippers:
        socks = []
        for _ in range(16):  # 16 MiB of partial frames against an 8 MiB budget, none authenticated
            sock = drippers.enter_context(handshaken(cluster, "127.0.0.6"))
            try:
                sock.sendall(header + b"\0" * (ENTRY_BYTES - 4096))
            except OSError:  # closed for it already
                pass
            socks.append(sock)

        def settled() -> bool:
            held = metric(cluster, "dlog_bookie_partial_frame_bytes")
            closed = metric(cluster, "dlog_bookie_connections_closed_partial_before_auth_total")
            return held >= 7 * MiB or closed >= 16
        await eventually(settled, 15)
        for _ in range(4):  # each a 1 MB entry: its frame is partial while it arrives
            await write_and_read(client, 1, ENTRY_BYTES)
    await client.close()


async def test_bad_unauthenticated_connections_are_logged_at_most_once_per_10_s_per_reason(cluster):
    before = len(log_text(cluster).splitlines())
    started = time.monotonic()
    for index in range(150):
        with handshaken(cluster, "127.0.0.7") as sock:  # a forged token
            sock.sendall(auth_frame("forged.token.x"))
            closed_by_peer(sock, 2)
        with handshaken(cluster, "127.0.0.7") as sock:  # a frame the codec refuses: no framing left
            sock.sendall(b"\xff" * 64)
            closed_by_peer(sock, 2)
        with plain(cluster, "127.0.0.7") as sock:  # plaintext on the TLS port
            sock.sendall(b"GET / HTTP/1.0\r\n\r\n" * (index % 3 + 1))
            closed_by_peer(sock, 2)
    windows = 1 + int((time.monotonic() - started) // 10)
    new_lines = log_text(cluster).splitlines()[before:]
    for words in ("AUTH from", "frame length", "TLS handshake"):  # 150 each
        assert sum(words in line for line in new_lines) <= 2 * windows, (words, new_lines)
    assert len(new_lines) <= 8 * windows, new_lines
