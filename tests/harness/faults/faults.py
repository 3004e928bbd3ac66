"""Fault injection on real processes: bookies, ZooKeeper, writers, disks and the network.

Every injector acts only on what this process started (by pid, by a path it created, by a network
namespace it made) and every one has its heal. `Nemesis` records each fault and heal in the run's
history, so a soak's figures and a failing run's story come from the same file.

    bookies     kill -9, SIGSTOP/SIGCONT, restart (dlog_tools.cluster.LocalCluster)
    ZooKeeper   pause/resume (SIGSTOP), restart (EmbeddedZooKeeper), expiry of one client session
    disks       a small tmpfs as a bookie's data directory, filled up; flipped bytes in one
                replica's entry logs; a torn or junk-tailed journal
    network     in network.py: bookies in their own network namespaces; delay, loss, partitions

Where the machine lacks a capability (not root, no `ip`, mount refused) the helper raises
`CapabilityMissing` with the reason; tests turn that into a skip.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.harness.history import History
from dlog_tools.cluster import LocalCluster

COMMAND_TIMEOUT_S = 20.0


class CapabilityMissing(Exception):
    """This machine cannot inject the fault (the message says why)."""


def run(command: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise CapabilityMissing(f"{what} needs root (running as uid {os.geteuid()})")


# ---------------------------------------------------------------------------------- the nemesis


class Nemesis:
    """Injects faults into one cluster and records each in the history."""

    def __init__(self, cluster: LocalCluster, history: History, rng: random.Random | None = None) -> None:
        self.cluster = cluster
        self.history = history
        self.rng = rng or random.Random(0)
        self.counts: dict[str, int] = {}

    def note(self, kind: str, **detail: Any) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.history.record("nemesis", "fault", kind=kind, **detail)

    def index_of(self, bookie_id: str) -> int:
        for bookie in self.cluster.bookies:
            if bookie.address == bookie_id:
                return bookie.index
        raise KeyError(f"bookie {bookie_id} is not one of {[b.address for b in self.cluster.bookies]}")

    # bookies ---------------------------------------------------------------

    def kill_bookie(self, index: int) -> None:
        self.note("kill_bookie", bookie=index)
        self.cluster.kill_bookie(index, signal.SIGKILL)

    def pause_bookie(self, index: int) -> None:
        self.note("pause_bookie", bookie=index)
        self.cluster.kill_bookie(index, signal.SIGSTOP)

    def resume_bookie(self, index: int) -> None:
        self.history.record("nemesis", "resume", bookie=index)
        self.cluster.kill_bookie(index, signal.SIGCONT)

    def lose_disk(self, index: int, timeout_s: float = 60.0) -> tuple[str, str]:
        """Lose a bookie's disk for good: kill -9, wipe its data directory, and start an empty
        bookie elsewhere (a new port: a new identity). Returns (lost id, new id)."""
        bookie = self.cluster.bookies[index]
        lost = bookie.bookie_id or bookie.address
        self.cluster.kill_bookie(index, signal.SIGKILL)
        wipe_directory(bookie.data_dir)
        self.note("lose_disk", bookie=index, lost=lost)
        started = self.cluster.replace_bookie(index, timeout_s)
        new = started.bookie_id or started.address
        self.history.record("nemesis", "replaced", bookie=index, lost=lost, new=new)
        return lost, new

    def restart_bookie(self, index: int, timeout_s: float = 60.0) -> None:
        """Start a bookie that is down (after a kill or a crash) on its old port and data."""
        bookie = self.cluster.bookies[index]
        if bookie.running:
            self.cluster.kill_bookie(index, signal.SIGKILL)
        self.history.record("nemesis", "restart", bookie=index)
        self.cluster.start_bookie(index, timeout_s=timeout_s)

    # ZooKeeper -------------------------------------------------------------

    def pause_zookeeper(self) -> None:
        self.note("pause_zookeeper")
        self.cluster.zk.pause()

    def resume_zookeeper(self) -> None:
        self.history.record("nemesis", "resume", what="zookeeper")
        self.cluster.zk.resume()

    def restart_zookeeper(self) -> None:
        self.note("restart_zookeeper")
        self.cluster.zk.restart()

    async def expire_session(self, zk: Any, who: str) -> bool:
        """False when the client had no session to expire within the wait (nothing was done)."""
        if not await has_session(zk):
            return False
        self.note("expire_session", who=who)  # recorded before: the history explains what follows
        await expire_session(zk)
        return True


async def has_session(zk: Any, timeout_s: float = 10.0) -> bool:
    """Whether the client has a ZooKeeper session within `timeout_s` (a client that is reconnecting,
    ZooKeeper having just restarted, has none yet)."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout_s
    while zk._client.client_id is None:  # kazoo's (session id, password) once connected
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def expire_session(zk: Any, timeout_s: float = 10.0) -> None:
    """Expire the ZooKeeper session of an AsyncZooKeeper: a second client joins the same session
    (same id and password) and closes it, the standard way to expire a session on purpose."""
    import asyncio

    from kazoo.client import KazooClient

    if not await has_session(zk, timeout_s):
        raise RuntimeError(f"the client of {zk.hosts} has no session to expire")
    session_id, password = zk._client.client_id

    def hijack_and_close() -> None:
        other = KazooClient(hosts=zk.hosts, client_id=(session_id, password), timeout=timeout_s)
        other.start(timeout=timeout_s)
        other.stop()
        other.close()

    await asyncio.to_thread(hijack_and_close)


def signal_process(process: subprocess.Popen[Any], signum: int) -> None:
    """Signal a child we started, by its pid only."""
    if process.poll() is None:
        os.kill(process.pid, signum)


# ---------------------------------------------------------------------------------- disks


def wipe_directory(path: Path) -> None:
    """Remove everything inside `path` (a mount point stays mounted, just empty)."""
    for child in Path(path).iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


class TmpfsDisk:
    """A small tmpfs mounted at `path` (a bookie's data directory): a disk that fills up."""

    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = Path(path)
        self.size_bytes = size_bytes
        self.mounted = False

    def mount(self) -> TmpfsDisk:
        require_root("mounting a tmpfs")
        self.path.mkdir(parents=True, exist_ok=True)
        result = run(["mount", "-t", "tmpfs", "-o", f"size={self.size_bytes}", "tmpfs", str(self.path)],
                     check=False)
        if result.returncode != 0:
            raise CapabilityMissing(f"mount -t tmpfs refused: {result.stderr.strip()}")
        self.mounted = True
        return self

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free

    def fill(self, leave_bytes: int = 64 * 1024) -> int:
        """Take all but `leave_bytes` of the free space with a filler file; returns its size."""
        size = max(0, self.free_bytes() - leave_bytes)
        with open(self.path / "filler", "wb") as file:
            chunk = b"\xaa" * 65536
            written = 0
            try:
                while written < size:
                    written += file.write(chunk[: min(len(chunk), size - written)])
                file.flush()
            except OSError:
                pass  # full already: that is the point
        return written

    def unfill(self) -> None:
        try:
            (self.path / "filler").unlink()
        except FileNotFoundError:
            pass

    def unmount(self) -> None:
        if not self.mounted:
            return
        for _ in range(50):
            if run(["umount", str(self.path)], check=False).returncode == 0:
                self.mounted = False
                return
            time.sleep(0.1)
        run(["umount", "-l", str(self.path)], check=False)  # busy: detach now, free when unused
        self.mounted = False


_LOG_HEADER = struct.Struct("<4sIQ")
_LOG_RECORD = struct.Struct("<IIQQ")  # size, crc, ledger id, entry id (bookkeeper/bookie/entrylog.py)


def entry_log_records(path: Path) -> list[tuple[int, int, int, int]]:
    """(data offset, data size, ledger id, entry id) of every whole record of one entry log."""
    data = path.read_bytes()
    records, offset = [], _LOG_HEADER.size
    while offset + _LOG_RECORD.size <= len(data):
        size, _, ledger_id, entry_id = _LOG_RECORD.unpack_from(data, offset)
        start = offset + _LOG_RECORD.size
        if size == 0 or start + size > len(data):
            break
        records.append((start, size, ledger_id, entry_id))
        offset = start + size
    return records


def flip_entry_log_bytes(data_dir: Path, rng: random.Random, ledger_ids: set[int] | None = None,
                         entries: set[tuple[int, int]] | None = None) -> int:
    """Flip one bit in the data of every entry-log record of one bookie (only of `ledger_ids`, or
    only the (ledger id, entry id) `entries`, if given); the bookie must not be running.
    Returns how many records were damaged."""
    damaged = 0
    for path in sorted((Path(data_dir) / "ledgers" / "entrylogs").glob("*.log")):
        records = [r for r in entry_log_records(path)
                   if (ledger_ids is None or r[2] in ledger_ids) and (entries is None or (r[2], r[3]) in entries)]
        if not records:
            continue
        with open(path, "r+b") as file:
            for start, size, _, _ in records:
                position = start + rng.randrange(size)
                file.seek(position)
                byte = file.read(1)[0]
                file.seek(position)
                file.write(bytes([byte ^ (1 << rng.randrange(8))]))
                damaged += 1
            file.flush()
            os.fsync(file.fileno())
    return damaged


_JOURNAL_HEADER_BYTES = 512
_JOURNAL_FRAME = struct.Struct("<II")  # length, crc32c (bookkeeper/bookie/journal.py)


def journal_records(path: Path) -> list[tuple[int, int]]:
    """(frame offset, record length) of each record of one journal file, up to the zero tail."""
    data = path.read_bytes()
    records, offset = [], _JOURNAL_HEADER_BYTES
    while offset + _JOURNAL_FRAME.size <= len(data):
        length, _ = _JOURNAL_FRAME.unpack_from(data, offset)
        end = offset + _JOURNAL_FRAME.size + length
        if length == 0 or end > len(data):
            break
        records.append((offset, length))
        offset = end
    return records


def damage_journal_tail(data_dir: Path, mode: str, rng: random.Random) -> dict[str, Any]:
    """Leave the newest journal file that holds records as a crash can (the bookie must be
    stopped), without touching any complete record (those were fsynced, maybe acknowledged):
    `torn` writes the first part of one more record (a frame promising more bytes than follow,
    as a write cut short by power loss); `junk` writes random bytes after the last record, where
    preallocated zeros were."""
    files = sorted((Path(data_dir) / "journal").glob("*.journal"))
    for path in reversed(files):
        records = journal_records(path)
        if not records:
            continue
        last_offset, last_length = records[-1]
        end = last_offset + _JOURNAL_FRAME.size + last_length
        if mode == "torn":
            length = rng.randrange(64, 4096)
            partial = bytes(rng.randrange(256) for _ in range(rng.randrange(1, length)))
            damage = _JOURNAL_FRAME.pack(length, rng.randrange(2**32)) + partial
        elif mode == "junk":
            damage = bytes(rng.randrange(1, 256) for _ in range(rng.randrange(16, 4096)))
        else:
            raise ValueError(f"mode must be 'torn' or 'junk', got {mode!r}")
        with open(path, "r+b") as file:
            file.seek(end)
            file.write(damage)
            file.flush()
            os.fsync(file.fileno())
        return {"file": path.name, "records": len(records), "at": end, "bytes": len(damage)}
    return {"file": None, "records": 0}
