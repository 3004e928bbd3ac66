"""`dlog bench limits`: what this machine can do without dlog: synced 4 KiB journal-style writes,
synced sequential MiB appends and a loopback TCP round trip."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bookkeeper.clock import perf_s
from dlog_tools.bench.common import mb_per_s, percentiles

JOURNAL_WRITE_BYTES = 4096
SEQUENTIAL_CHUNK_BYTES = 1 << 20


def _synced_writes(fd: int, count: int, write: Callable[[int], object]) -> tuple[float, list[float]]:
    """`count` times `write(index)` then fdatasync: total seconds and each write's latency."""
    latencies = []
    started = perf_s()
    for index in range(count):
        sent = perf_s()
        write(index)
        os.fdatasync(fd)
        latencies.append(perf_s() - sent)
    return perf_s() - started, latencies


def _journal_writes(path: Path, count: int, zero_filled: bool) -> dict[str, Any]:
    """4 KiB pwrite + fdatasync, one after another, into a preallocated file: the journal's
    floor when every group commit holds one small record."""
    block = os.urandom(JOURNAL_WRITE_BYTES)
    size = count * JOURNAL_WRITE_BYTES
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if zero_filled:
            zeros = bytes(SEQUENTIAL_CHUNK_BYTES)
            for offset in range(0, size, SEQUENTIAL_CHUNK_BYTES):
                os.pwrite(fd, zeros[: min(SEQUENTIAL_CHUNK_BYTES, size - offset)], offset)
        else:
            os.posix_fallocate(fd, 0, size)
        os.fsync(fd)
        elapsed_s, latencies = _synced_writes(fd, count, lambda index: os.pwrite(
            fd, block, index * JOURNAL_WRITE_BYTES))
    finally:
        os.close(fd)
        path.unlink()
    how = "zero-filled" if zero_filled else "fallocated"
    return {"run": f"4KiB+fdatasync, {how}", "operations": count,
            "per_s": round(count / elapsed_s), "mb_per_s": mb_per_s(size, elapsed_s), **percentiles(latencies)}


def _sequential_writes(path: Path, size: int) -> dict[str, Any]:
    """Appending 1 MiB writes, each followed by fdatasync: the disk's streaming bandwidth."""
    chunk = os.urandom(SEQUENTIAL_CHUNK_BYTES)
    count = max(1, size // SEQUENTIAL_CHUNK_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    try:
        elapsed_s, latencies = _synced_writes(fd, count, lambda _: os.write(fd, chunk))
    finally:
        os.close(fd)
        path.unlink()
    return {"run": "1MiB append+fdatasync", "operations": count, "per_s": round(count / elapsed_s),
            "mb_per_s": mb_per_s(count * SEQUENTIAL_CHUNK_BYTES, elapsed_s), **percentiles(latencies)}


def _loopback_round_trips(count: int, message_bytes: int = 64) -> dict[str, Any]:
    """Blocking TCP ping-pong over 127.0.0.1 with an echo server in a thread (TCP_NODELAY both
    ways): the floor under any request/response between our processes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := connection.recv(65536):
                connection.sendall(data)

    server = threading.Thread(target=echo, name="bench-echo", daemon=True)
    server.start()
    message = os.urandom(message_bytes)
    latencies = []
    with socket.create_connection(listener.getsockname()) as client:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = perf_s()
        for _ in range(count):
            sent = perf_s()
            client.sendall(message)
            received = 0
            while received < message_bytes:
                received += len(client.recv(message_bytes - received))
            latencies.append(perf_s() - sent)
        elapsed_s = perf_s() - started
    server.join(5)
    listener.close()
    return {"run": f"loopback TCP {message_bytes}B ping-pong", "operations": count,
            "per_s": round(count / elapsed_s), **percentiles(latencies)}


def bench_limits(directory: Path | None = None, journal_writes: int = 5000,
                 sequential_bytes: int = 256 << 20, round_trips: int = 20_000) -> dict[str, Any]:
    """What this machine can do at all, without dlog: small synced writes, synced streaming
    writes, loopback round trips. Files go to `directory` (default: the temporary directory,
    where the other modes put their bookies)."""
    with tempfile.TemporaryDirectory(prefix="dlog-limits-", dir=directory) as scratch:
        base = Path(scratch)
        runs = [_journal_writes(base / "journal-fallocate", journal_writes, zero_filled=False),
                _journal_writes(base / "journal-zeroed", journal_writes, zero_filled=True),
                _sequential_writes(base / "sequential", sequential_bytes),
                _loopback_round_trips(round_trips)]
        where = str(Path(scratch).parent.resolve())
    return {"mode": "limits", "fsync": True, "directory": where, "runs": runs}
